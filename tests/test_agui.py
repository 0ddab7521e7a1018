"""The AG-UI channel against the real engine: real redis-server, real HTTP, the fake
vendor and a real worker. Every event it emits is checked against `ag_ui.core`."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx
import pytest
from aiohttp import web

from engine.api import ApiKeys, make_app
from engine.client import Client
from engine.machine.tree import path_to
from engine.store.snapshots import load_state
from engine.store.store import Store
from tests.agui_helpers import (
    PICK,
    frames,
    run,
    run_input,
    run_path,
    squeeze,
    types,
    user,
)
from tests.api_helpers import ALICE, BOB, ROOT, auth
from tests.engine_helpers import payloads
from tests.fakes.llm_vendor import HttpError, Text, ToolCalls

TEXT = ["TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END"]
TOOL_CALL = ["TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END"]


async def session_path(engine, sid: str) -> list[dict[str, Any]]:
    state = await load_state(engine.store, sid)
    assert state is not None
    return path_to(state.nodes, state.head_id)


async def test_a_text_reply_streams_in_order_under_the_stored_ids(agui_engine, agui_http, vendor):
    vendor.push(Text("The primary is back up.", chunks=4))
    events = await run(agui_http, "chat", run_input("th-text", "run-1", [user("u1", "db?")]))
    assert squeeze(types(events)) == [
        "RUN_STARTED",
        *TEXT,
        "RUN_FINISHED",
    ]
    started, finished = events[0], events[-1]
    assert started == {
        "type": "RUN_STARTED",
        "threadId": "th-text",
        "runId": "run-1",
        "protocolVersion": "1.0",
    }
    assert finished["threadId"] == "th-text" and finished["runId"] == "run-1"
    usage = finished["usage"][0]
    assert usage["totalTokens"] == usage["inputTokens"] + usage["outputTokens"] > 0
    contents = [e for e in events if e["type"] == "TEXT_MESSAGE_CONTENT"]
    assert len(contents) > 1
    assert "".join(e["delta"] for e in contents) == "The primary is back up."
    path = await session_path(agui_engine, "th-text")
    assert [m["id"] for m in path] == ["u1", events[1]["messageId"]]
    assert {e["messageId"] for e in events[1:-1]} == {path[1]["id"]}


async def test_a_thread_is_a_session_and_a_run_id_is_its_turn(agui_engine, agui_http, vendor):
    vendor.push(Text("One."), Text("Two."))
    first = await run(agui_http, "chat", run_input("th-2", "run-a", [user("u1", "1?")]))
    reply_id = first[1]["messageId"]
    view = [user("u1", "1?"), {"id": reply_id, "role": "assistant", "content": "One."}]
    # The same run again: the same turn, replayed, not a second one.
    again = await run(agui_http, "chat", run_input("th-2", "run-a", [user("u1", "1?")]))
    assert squeeze(types(again)) == squeeze(types(first))
    assert again[1]["messageId"] == reply_id
    # A second run on the thread continues the session.
    second = await run(agui_http, "chat", run_input("th-2", "run-b", [*view, user("u2", "2?")]))
    assert second[-1]["type"] == "RUN_FINISHED"
    path = await session_path(agui_engine, "th-2")
    assert [m["id"] for m in path] == ["u1", reply_id, "u2", second[1]["messageId"]]
    events = await agui_engine.store.read_log("th-2")
    assert [p["turn_id"] for p in payloads(events, "turn.started")] == ["run-a", "run-b"]
    assert len(vendor.requests) == 2


async def test_a_frontend_tool_ends_the_run_and_the_next_run_resumes_the_turn(
    agui_engine, agui_http, vendor
):
    vendor.push(
        ToolCalls([("pick_color", {"hint": "warm"})], text="Let me ask."),
        Text("Red it is."),
    )
    body = run_input("th-tool", "run-1", [user("u1", "pick a colour")], tools=[PICK])
    first = await run(agui_http, "chat", body)
    assert squeeze(types(first)) == [
        "RUN_STARTED",
        *TEXT,
        *TOOL_CALL,
        "RUN_FINISHED",
    ]
    start = next(e for e in first if e["type"] == "TOOL_CALL_START")
    call_id, reply_id = start["toolCallId"], first[1]["messageId"]
    assert start["toolCallName"] == "pick_color" and start["parentMessageId"] == reply_id
    assert first[-1]["outcome"] == {"type": "success", "pendingToolCallIds": [call_id]}
    assert len(vendor.requests) == 1  # the turn waits for the page
    # A page that reconnects learns what the thread waits for.
    resp = await agui_http.post(
        run_path("chat", "connect"), json={"threadId": "th-tool"}, headers=auth(ROOT)
    )
    connected = frames(resp.content)
    assert connected[-1]["outcome"] == {"type": "success", "pendingToolCallIds": [call_id]}

    arguments = "".join(e["delta"] for e in first if e["type"] == "TOOL_CALL_ARGS")
    view = [
        user("u1", "pick a colour"),
        {
            "id": reply_id,
            "role": "assistant",
            "content": "Let me ask.",
            "toolCalls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "pick_color", "arguments": arguments},
                }
            ],
        },
        {"id": "tool-1", "role": "tool", "toolCallId": call_id, "content": "red"},
    ]
    second = await run(agui_http, "chat", run_input("th-tool", "run-2", view, tools=[PICK]))
    assert squeeze(types(second)) == [
        "RUN_STARTED",
        *TEXT,
        "RUN_FINISHED",
    ]
    assert second[-1]["runId"] == "run-2" and "outcome" not in second[-1]
    path = await session_path(agui_engine, "th-tool")
    assert [m["id"] for m in path] == ["u1", reply_id, "tool-1", second[1]["messageId"]]
    assert path[2]["content"] == "red"
    events = await agui_engine.store.read_log("th-tool")
    assert len(payloads(events, "turn.started")) == 1  # one turn across the two runs
    assert "red" in str(vendor.requests[1].body["messages"])


async def test_a_subagent_tool_call_streams_its_result(agui_engine, agui_http, vendor):
    vendor.push(
        ToolCalls([("helper", {"message": "what is up?"})]),
        Text("All good."),  # the child's answer
        Text("The helper says all good."),
    )
    events = await run(agui_http, "chat", run_input("th-sub", "run-1", [user("u1", "ask")]))
    assert squeeze(types(events)) == [
        "RUN_STARTED",
        *TOOL_CALL,
        "TOOL_CALL_RESULT",
        *TEXT,
        "RUN_FINISHED",
    ]
    path = await session_path(agui_engine, "th-sub")
    start, result = events[1], events[4]
    assert start["parentMessageId"] == path[1]["id"]
    assert result["messageId"] == path[2]["id"] and result["toolCallId"] == start["toolCallId"]
    assert "All good." in result["content"] and result["role"] == "tool"


async def test_a_worker_decided_turn_with_a_worker_tool(
    agui_engine, agui_http, agui_worker, vendor
):
    async def decide(request: dict[str, Any]) -> Any:
        if request["trigger"]["type"] == "tool.execute":
            return {"actions": [{"type": "tool.result", "result": {"disk": "91%"}}]}
        return request["proposed"]

    agui_worker.decide = decide
    vendor.push(ToolCalls([("lookup", {"q": "disk"})], text="Looking."), Text("Disk at 91%."))
    events = await run(agui_http, "planner", run_input("th-w", "run-1", [user("u1", "disk?")]))
    assert squeeze(types(events)) == [
        "RUN_STARTED",
        *TEXT,
        *TOOL_CALL,
        "TOOL_CALL_RESULT",
        *TEXT,
        "RUN_FINISHED",
    ]
    result = next(e for e in events if e["type"] == "TOOL_CALL_RESULT")
    assert "91%" in result["content"]
    assert agui_worker.schema_errors == []


async def test_a_failing_turn_ends_in_run_error(agui_engine, agui_http, vendor):
    vendor.push(HttpError(400))
    events = await run(agui_http, "chat", run_input("th-err", "run-1", [user("u1", "hi")]))
    assert types(events) == ["RUN_STARTED", "RUN_ERROR"]
    assert events[1]["code"] == "provider_error" and events[1]["message"]


async def test_reasoning_streams_before_the_text(agui_engine, agui_http, vendor):
    vendor.push(Text("Yes.", reasoning="Let me think about it."))
    events = await run(agui_http, "thinker", run_input("th-r", "run-1", [user("u1", "ok?")]))
    assert squeeze(types(events)) == [
        "RUN_STARTED",
        "REASONING_START",
        "REASONING_MESSAGE_START",
        "REASONING_MESSAGE_CONTENT",
        "REASONING_MESSAGE_END",
        "REASONING_END",
        *TEXT,
        "RUN_FINISHED",
    ]
    thought = "".join(e["delta"] for e in events if e["type"] == "REASONING_MESSAGE_CONTENT")
    assert thought == "Let me think about it."


async def test_connect_replays_the_thread_as_a_snapshot(agui_engine, agui_http, vendor):
    vendor.push(Text("Hello."))
    await run(agui_http, "chat", run_input("th-c", "run-1", [user("u1", "hi")]))
    resp = await agui_http.post(
        run_path("chat", "connect"), json={"threadId": "th-c"}, headers=auth(ROOT)
    )
    assert resp.status_code == 200, resp.text
    events = frames(resp.content)
    assert types(events) == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_FINISHED"]
    path = await session_path(agui_engine, "th-c")
    assert events[1]["messages"] == [
        {"id": "u1", "role": "user", "content": "hi"},
        {"id": path[1]["id"], "role": "assistant", "content": "Hello."},
    ]


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"runId": "r", "messages": []}, 422, "threadId"),
        ({"threadId": "t", "runId": "r", "messages": [{"role": "user"}]}, 422, "messages.0"),
        ({"threadId": "", "runId": "r", "messages": []}, 422, "threadId"),
    ],
)
async def test_bad_input_is_an_http_error_before_any_stream(
    agui_engine, agui_http, body, status, param
):
    resp = await agui_http.post(run_path("chat"), json=body, headers=auth(ROOT))
    assert resp.status_code == status, resp.text
    assert resp.headers["Content-Type"].startswith("application/json")
    assert resp.json()["param"].startswith(param)


async def test_refusals_before_the_stream(agui_engine, agui_http, vendor):
    body = run_input("th-own", "run-1", [user("u1", "hi")])
    resp = await agui_http.post(run_path("nobody"), json=body, headers=auth(ROOT))
    assert resp.status_code == 404 and "nobody" in resp.json()["error"]
    resp = await agui_http.post(run_path("chat"), json=body)
    assert resp.status_code == 401
    clash = run_input("th-own", "run-1", [user("u1", "hi")], tools=[{**PICK, "name": "helper"}])
    resp = await agui_http.post(run_path("chat"), json=clash, headers=auth(ALICE))
    assert resp.status_code == 422 and "'helper'" in resp.json()["error"]
    vendor.push(Text("Hi Alice."))
    await run(agui_http, "chat", body, key=ALICE)
    later = run_input("th-own", "run-2", [user("u1", "hi"), user("u2", "mine?")])
    resp = await agui_http.post(run_path("chat"), json=later, headers=auth(BOB))
    assert resp.status_code == 403
    resp = await agui_http.post(run_path("thinker"), json=later, headers=auth(ALICE))
    assert resp.status_code == 409 and resp.json()["code"] == "agent_mismatch"


# --- the chat page -----------------------------------------------------------------------


async def test_the_chat_page_is_served_with_its_types_and_a_strict_csp(agui_engine, agui_http):
    page = await agui_http.get("/console/chat/chat")  # no key: the files hold no data
    assert page.status_code == 200
    assert page.headers["Content-Type"] == "text/html; charset=utf-8"
    csp = page.headers["Content-Security-Policy"]
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    assert directives["default-src"] == "'none'"
    assert directives["script-src"] == "'self'" and directives["style-src"] == "'self'"
    assert directives["connect-src"] == "'self'"
    assert "unsafe" not in csp
    assert page.headers["X-Content-Type-Options"] == "nosniff"
    html = page.text
    scripts = re.findall(r"<script([^>]*)>(.*?)</script>", html, re.S)
    assert scripts == [(' type="module" src="/console/chat/assets/chat.js"', "")]
    assert not re.search(r"\s(style|on\w+)\s*=", html)  # no inline style or handler
    for name, kind in [
        ("chat.js", "text/javascript"),
        ("agui.js", "text/javascript"),
        ("chat.css", "text/css"),
    ]:
        asset = await agui_http.get(f"/console/chat/assets/{name}")
        assert asset.status_code == 200, name
        assert asset.headers["Content-Type"] == f"{kind}; charset=utf-8"
        assert asset.headers["Content-Security-Policy"] == csp
        assert asset.headers["X-Content-Type-Options"] == "nosniff"
    chat = (await agui_http.get("/console/chat/assets/chat.js")).text
    assert 'from "./agui.js"' in chat and "/api/channels/ag-ui/agents/" in chat
    missing = await agui_http.get("/console/chat/assets/secret.py")
    assert missing.status_code == 404 and missing.json()["code"] == "not_found"
    assert (await agui_http.get("/api/admin/sessions")).status_code == 401  # still closed


@pytest.mark.parametrize(
    ("path", "status", "problem"),
    [
        ("/console/chat", 200, "Which agent?"),
        ("/console/chat/", 200, "Which agent?"),
        ("/console/chat/nobody", 404, "No agent named &#x27;nobody&#x27;"),
        (
            "/console/chat/%3Cimg%20src%3Dx%3E",
            404,
            "No agent named &#x27;&lt;img src=x&gt;&#x27;",
        ),
    ],
)
async def test_a_chat_address_with_no_agent_is_a_page_listing_the_agents(
    agui_http, path, status, problem
):
    """Typed into a browser: an HTML page under the chat page's CSP that says what is
    wrong and links every agent's chat (and the console), never a JSON 404."""
    page = await agui_http.get(path)
    chat = await agui_http.get("/console/chat/chat")
    assert page.status_code == status
    assert page.headers["Content-Type"] == "text/html; charset=utf-8"
    assert page.headers["Content-Security-Policy"] == chat.headers["Content-Security-Policy"]
    assert page.headers["X-Content-Type-Options"] == "nosniff"
    html = page.text
    assert f'<h2 id="problem">{problem}</h2>' in html
    links = re.findall(r'<a[^>]* href="([^"]+)"', html)
    assert links == [
        "/console",
        "/console/chat/chat",
        "/console/chat/helper",
        "/console/chat/planner",
        "/console/chat/thinker",
    ]
    assert "<script" not in html and "<img" not in html
    assert not re.search(r"\s(style|on\w+)\s*=", html)


async def test_api_paths_still_answer_json_404s(agui_http):
    for path in ("/api/nothing", "/console/chat/assets/secret.py", "/console/chat/chat/more"):
        resp = await agui_http.get(path, headers=auth(ROOT))
        assert resp.status_code == 404, path
        assert resp.json()["code"] == "not_found", path
    body = run_input("th-missing", "run-1", [user("u1", "hi")])
    resp = await agui_http.post(run_path("nobody"), json=body, headers=auth(ROOT))
    assert resp.status_code == 404 and resp.json()["code"] == "unknown_agent"


async def test_a_run_open_at_shutdown_ends_with_run_error(agui_engine, redis, vendor):
    """Stopping the server ends each open run at once, saying why, not at a timeout."""
    vendor.push(Text("slow words " * 20, chunk_delay=0.5))
    store = await Store.open(redis)
    app = make_app(Client(store), store, keys=ApiKeys.from_env({}), heartbeat=1.0)
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=30)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    body = run_input("th-stop", "run-1", [user("u1", "talk slowly")])
    raw = b""
    stopping: asyncio.Task[None] | None = None
    try:
        async with (
            httpx.AsyncClient(base_url=url, timeout=20) as http,
            http.stream("POST", run_path("chat"), json=body) as resp,
        ):
            chunks = resp.aiter_bytes()
            async for chunk in chunks:
                raw += chunk
                if b"TEXT_MESSAGE_CONTENT" in raw:
                    break
            stopping = asyncio.create_task(runner.cleanup())
            async with asyncio.timeout(10):  # well inside the 30 s shutdown timeout
                async for chunk in chunks:
                    raw += chunk
    finally:
        await asyncio.wait_for(stopping or runner.cleanup(), 10)
    events = frames(raw)
    assert events[0]["type"] == "RUN_STARTED" and events[-1]["type"] == "RUN_ERROR"
    assert "shutting down" in events[-1]["message"]
    assert types(events)[-2] == "TEXT_MESSAGE_END"  # what was open was closed first


async def test_an_interrupt_ends_the_run_and_a_resume_entry_continues_the_turn(
    agui_engine, agui_http, agui_worker, vendor
):
    async def decide(request: dict[str, Any]) -> Any:
        if request["trigger"]["type"] == "client.messages":
            ask = {"message": "Restart checkout?", "metadata": {"options": []}}
            interrupt = {"type": "interrupt", "interrupt_id": "int-1", "reason": "approval"}
            return {**request["proposed"], "actions": [{**interrupt, "payload": ask}]}
        return request["proposed"]

    agui_worker.decide = decide
    vendor.push(Text("Restarted."))
    view = [user("u1", "checkout is down")]
    first = await run(agui_http, "planner", run_input("th-int", "run-1", view))
    assert types(first) == ["RUN_STARTED", "RUN_FINISHED"]
    assert first[-1]["outcome"] == {
        "type": "interrupt",
        "interrupts": [
            {
                "id": "int-1",
                "reason": "approval",
                "message": "Restart checkout?",
                "metadata": {"options": []},
            }
        ],
    }
    resume = [{"interruptId": "int-1", "status": "resolved", "payload": {"ok": True}}]
    second = await run(agui_http, "planner", run_input("th-int", "run-2", view, resume=resume))
    assert squeeze(types(second)) == [
        "RUN_STARTED",
        *TEXT,
        "RUN_FINISHED",
    ]
    resumed = next(r for r in agui_worker.requests if r["trigger"]["type"] == "interrupt.resumed")
    assert resumed["trigger"]["payload"] == {"status": "resolved", "payload": {"ok": True}}
    events = await agui_engine.store.read_log("th-int")
    assert len(payloads(events, "turn.started")) == 1
