"""Worker-decided agents through the real engine: real HTTP worker, real Redis, fake vendor."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from engine.client import Client, ClientError
from engine.config import parse_project
from engine.effects.runner import EngineConfigError
from engine.runtime.engine import Engine
from tests.engine_helpers import (
    ENV,
    assert_consistent,
    on_both_redis,
    payloads,
    turn_ended,
    wait_for_event,
)
from tests.fakes.llm_vendor import Text, ToolCalls
from tests.workers import Json, Reply, echo_proposed

SECRET = "worker-secret-for-tests"
LOOKUP = (
    '{ name = "lookup", description = "Look a thing up", input = { type = "object", '
    'properties = { q = { type = "string" } }, required = ["q"] } }'
)


def worker_project(
    tmp_path: Path, vendor_url: str, worker_url: str, *, retry: str = "", blocks: str = ""
):
    """The worker agent `helper`; `retry` adds keys to its block, `blocks` tables after it."""
    text = textwrap.dedent(
        f"""\
        [llm.openai]
        type = "openai"
        base_url = "{vendor_url}/v1"

        [agent.helper]
        llm = "openai"
        model = "gpt-4.1-mini"
        system = "You help."
        worker = "{worker_url}"
        signing_secret_env = "HELPER_SECRET"
        tools = [{LOOKUP}]
        retry = {{ default = {{ backoff_base_secs = 0, max_attempts = 3 }} }}
        {retry}
        """
    )
    text += blocks
    path = tmp_path / "subs.toml"
    path.write_text(text)
    return parse_project(text, str(path), env={})


async def start_engine(redis, project, secret: str = SECRET) -> Engine:
    engine = Engine(project, redis, env={**ENV, "HELPER_SECRET": secret}, lease_ms=3000)
    await engine.start()
    return engine


def say(text: str, **extra) -> dict:
    message = {"role": "user", "content": text}
    return {"type": "client.message", "agent_id": "helper", "message": message, **extra}


async def run_turn(engine: Engine, text: str, sid: str | None = None) -> tuple[str, dict]:
    client = Client(engine.store)
    reply = await client.submit(say(text), session_id=sid)
    end = await wait_for_event(client, reply["session_id"], turn_ended(reply["turn_id"]))
    return reply["session_id"], end


@on_both_redis
async def test_a_worker_that_echoes_proposals_is_a_complete_agent(
    redis, vendor, test_worker, tmp_path
):
    worker = await test_worker(echo_proposed, secret=SECRET)
    vendor.push(ToolCalls([("lookup", {"q": "disk"})]), Text("Disk is at 91%."))

    async def decide(request):
        if request["trigger"]["type"] == "tool.execute":
            assert request["trigger"]["input"] == {"status": "valid", "value": {"q": "disk"}}
            return {"actions": [{"type": "tool.result", "result": {"disk": "91%"}}]}
        return request["proposed"]

    worker.decide = decide
    engine = await start_engine(redis, worker_project(tmp_path, vendor.url, worker.url))
    try:
        sid, end = await run_turn(engine, "how full is the disk?")
        assert end["payload"]["type"] == "turn.completed"
        events = await assert_consistent(engine.store, sid)
    finally:
        await engine.stop()
    triggers = [r["trigger"]["type"] for r in worker.requests]
    assert triggers == [
        "session.start",
        "client.messages",
        "llm.finished",
        "tool.execute",
        "tool.finished",
        "llm.finished",
        "turn.finished",
    ]
    roles = [p["message"]["role"] for p in payloads(events, "message.new")]
    assert roles == ["user", "assistant", "tool", "assistant"]
    tool_msg = payloads(events, "message.new")[2]["message"]
    assert tool_msg["content"] == '{"disk":"91%"}'
    # Each request carried the conversation so far; the last one the whole of it.
    assert len(worker.requests[-1]["messages"]) == 4


async def test_a_wrong_signature_fails_the_turn_cleanly(redis, vendor, test_worker, tmp_path):
    worker = await test_worker(echo_proposed, secret=SECRET)
    engine = await start_engine(
        redis, worker_project(tmp_path, vendor.url, worker.url), secret="wrong"
    )
    try:
        sid, end = await run_turn(engine, "hi")
        assert end["payload"]["type"] == "turn.failed"
        error = end["payload"]["error"]
        assert error["code"] == "worker_unreachable" and "401" in error["message"]
        events = await assert_consistent(engine.store, sid)
    finally:
        await engine.stop()
    errored = payloads(events, "decision.errored")
    assert [e["attempt"] for e in errored] == [1, 2, 3] and errored[-1]["final"]
    assert worker.requests == []  # none got past the signature check


@pytest.mark.parametrize(
    ("garbage", "reason"),
    [
        (Reply(200, b"<html>oops</html>", "text/html"), "not JSON"),
        (Json({"actions": [{"type": "llm.cal"}]}, invalid=True), "actions.0.type"),
        (Json({"actions": [{"type": "tool.result", "id": "nope", "result": 1}]}), "not open"),
        (
            Json(
                {
                    "actions": [
                        {"type": "llm.result", "id": "x", "attempt": 7, "response": {"model": "m"}}
                    ]
                }
            ),
            "not open",
        ),
        (Reply(200, b"[" * (10 * 1024 * 1024), "application/json"), "limit"),
    ],
)
async def test_garbage_is_a_failed_attempt_and_the_next_one_recovers(
    redis, vendor, test_worker, tmp_path, garbage, reason
):
    answers = [garbage]

    async def decide(request):
        if request["trigger"]["type"] == "client.messages" and answers:
            return answers.pop()
        return request["proposed"]

    worker = await test_worker(decide, secret=SECRET)
    vendor.push(Text("fine"))
    engine = await start_engine(redis, worker_project(tmp_path, vendor.url, worker.url))
    try:
        sid, end = await run_turn(engine, "hi")
        assert end["payload"]["type"] == "turn.completed"
        events = await assert_consistent(engine.store, sid)
    finally:
        await engine.stop()
    (errored,) = payloads(events, "decision.errored")
    assert errored["error"]["code"] == "invalid_response" and reason in errored["error"]["message"]
    assert not errored["final"]
    retried = [r for r in worker.requests if r["trigger"]["type"] == "client.messages"]
    assert [r["attempts"] for r in retried] == [1, 2]
    assert retried[0]["decision_id"] == retried[1]["decision_id"]
    assert [p["message"]["role"] for p in payloads(events, "message.new")] == ["user", "assistant"]


async def test_an_async_tool_waits_for_a_settle_across_an_engine_restart(
    redis, vendor, test_worker, tmp_path
):
    async def decide(request):
        if request["trigger"]["type"] == "tool.execute":
            return {}  # async: we'll settle it later
        return request["proposed"]

    worker = await test_worker(decide, secret=SECRET)
    vendor.push(ToolCalls([("lookup", {"q": "slow"})]), Text("Got it."))
    project = worker_project(tmp_path, vendor.url, worker.url)
    engine = await start_engine(redis, project)
    client = Client(engine.store)
    reply = await client.submit(say("look it up"))
    sid = reply["session_id"]
    waiting = await wait_for_event(
        client, sid, lambda e: e["payload"]["type"] == "tool.call.waiting"
    )
    call_id = waiting["payload"]["id"]
    await engine.stop()

    engine = await start_engine(redis, project)
    try:
        client = Client(engine.store)
        with pytest.raises(ClientError) as err:
            await client.settle(sid, call_id, attempt=2, result="x")
        assert err.value.status == 409 and "attempt" in str(err.value)
        with pytest.raises(ClientError) as err:
            await client.settle(sid, "nope", result="x")
        assert err.value.code == "call_not_open"
        await client.settle(sid, call_id, attempt=1, result={"answer": 42})
        end = await wait_for_event(client, sid, turn_ended(reply["turn_id"]))
        assert end["payload"]["type"] == "turn.completed"
        await assert_consistent(engine.store, sid)
    finally:
        await engine.stop()
    assert [r["trigger"]["type"] for r in worker.requests].count("tool.execute") == 1


async def test_interrupt_pauses_until_resumed(redis, vendor, test_worker, tmp_path):
    async def decide(request):
        if request["trigger"]["type"] == "client.messages":
            payload = {
                "message": "Restart prod?",
                "metadata": {"options": [{"label": "Yes", "value": "yes", "style": "primary"}]},
            }
            return {
                **request["proposed"],
                "actions": [
                    {
                        "type": "interrupt",
                        "interrupt_id": "ok-1",
                        "reason": "approval",
                        "payload": payload,
                    }
                ],
            }
        return request["proposed"]

    worker = await test_worker(decide, secret=SECRET)
    vendor.push(Text("Restarted."))
    engine = await start_engine(redis, worker_project(tmp_path, vendor.url, worker.url))
    try:
        client = Client(engine.store)
        reply = await client.submit(say("restart prod"))
        sid = reply["session_id"]
        paused = await wait_for_event(
            client, sid, lambda e: e["payload"]["type"] == "session.interrupted"
        )
        assert paused["payload"]["payload"]["message"] == "Restart prod?"
        with pytest.raises(ClientError) as err:
            await client.submit(say("hello?", queue=True), session_id=sid)
        assert err.value.code == "session_interrupted" and "ok-1" in str(err.value)
        resumed = await client.submit(
            {"type": "interrupt.resume", "interrupt_id": "ok-1", "payload": {"value": "yes"}},
            session_id=sid,
        )
        assert resumed["resumed"] is True
        again = await client.submit(
            {"type": "interrupt.resume", "interrupt_id": "ok-1"}, session_id=sid
        )
        assert again["resumed"] is False
        end = await wait_for_event(client, sid, turn_ended(reply["turn_id"]))
        assert end["payload"]["type"] == "turn.completed"
        await assert_consistent(engine.store, sid)
    finally:
        await engine.stop()
    resumed_req = next(r for r in worker.requests if r["trigger"]["type"] == "interrupt.resumed")
    assert resumed_req["trigger"]["payload"] == {"value": "yes"}


@on_both_redis
async def test_message_send_reaches_the_other_session_once(redis, vendor, test_worker, tmp_path):
    async def decide(request):
        if request["trigger"]["type"] == "client.messages" and request["session_id"] == "from":
            return {
                **request["proposed"],
                "actions": [
                    {
                        "type": "message.send",
                        "session_id": "to",
                        "message": {"role": "user", "content": "handoff"},
                    },
                    {"type": "done"},
                ],
            }
        return request["proposed"]

    worker = await test_worker(decide, secret=SECRET)
    vendor.default = Text("ack")
    engine = await start_engine(redis, worker_project(tmp_path, vendor.url, worker.url))
    try:
        client = Client(engine.store)
        first = await client.submit(say("start"), session_id="to")
        await wait_for_event(client, "to", turn_ended(first["turn_id"]))
        await run_turn(engine, "send it", sid="from")
        end = await wait_for_event(
            client,
            "to",
            lambda e: (
                e["payload"]["type"] == "turn.completed" and e.get("turn_id") != first["turn_id"]
            ),
        )
        assert end
        events = await assert_consistent(engine.store, "to")
    finally:
        await engine.stop()
    users = [
        p["message"]["content"]
        for p in payloads(events, "message.new")
        if p["message"]["role"] == "user"
    ]
    assert users == ["start", "handoff"]


async def test_a_named_but_empty_signing_secret_is_a_startup_error(redis, vendor, tmp_path):
    project = worker_project(tmp_path, vendor.url, "http://127.0.0.1:9")
    with pytest.raises(EngineConfigError) as err:
        Engine(project, redis, env={"HELPER_SECRET": ""})
    assert "HELPER_SECRET" in str(err.value) and "agent.helper" in str(err.value)


@pytest.mark.parametrize("answer", ["approve", "decline", None])
async def test_a_worker_hears_an_mcp_approval_it_did_not_raise_resumed(
    redis, vendor, test_worker, tmp_path, answer
):
    """The engine's own interrupt (an MCP tool under `approve = "destructive"`) is on the
    worker's branch: resumed, the worker gets `interrupt.resumed` with the person's answer
    and nothing proposed (SPEC §8: "the worker then gets `interrupt.resumed`"), then the
    call's `tool.finished` as for any tool: ok when approved, the decline's error when not.
    Unanswered (`answer` None), the prompt expires and the worker hears that instead."""
    from tests.test_mcp import stdio_block

    calls_log = tmp_path / "calls.log"
    worker = await test_worker(echo_proposed, secret=SECRET)
    vendor.push(ToolCalls([("clock__secret_rotate", {})]), Text("Done."))
    project = worker_project(
        tmp_path,
        vendor.url,
        worker.url,
        retry='mcp = [{ id = "mcp.clock", approve = "destructive" }]',
        blocks=stdio_block(MCP_CALLS_LOG=str(calls_log))
        + ('approve_timeout = "800ms"\n' if answer is None else ""),
    )
    engine = await start_engine(redis, project)
    try:
        client = Client(engine.store)
        reply = await client.submit(say("rotate the secret"))
        sid = reply["session_id"]
        raised = await wait_for_event(
            client, sid, lambda e: e["payload"]["type"] == "session.interrupted", timeout=60
        )
        assert raised["payload"]["origin"] == "approval"
        iid = raised["payload"]["interrupt_id"]
        if answer is not None:
            await client.submit(
                {"type": "interrupt.resume", "interrupt_id": iid, "payload": {"value": answer}},
                session_id=sid,
            )
        end = await wait_for_event(client, sid, turn_ended(reply["turn_id"]), timeout=60)
        assert end["payload"]["type"] == "turn.completed"
        await assert_consistent(engine.store, sid)
    finally:
        await engine.stop()
    triggers = [r["trigger"] for r in worker.requests]
    assert [t["type"] for t in triggers] == [
        "session.start",
        "client.messages",
        "llm.finished",
        "interrupt.resumed",
        "tool.finished",
        "llm.finished",
        "turn.finished",
    ]
    resumed = worker.requests[3]
    # Expired, it resumes with the engine's own declined answer (interrupts.EXPIRED).
    said = {"value": answer} if answer else {"status": "cancelled", "reason": "expired"}
    assert resumed["trigger"] == {"type": "interrupt.resumed", "interrupt_id": iid, "payload": said}
    assert resumed["proposed"] == {}  # the engine sends or declines the call itself
    finished = triggers[4]
    assert finished["name"] == "clock__secret_rotate"
    sent = calls_log.exists() and "secret_rotate" in calls_log.read_text()
    if answer == "approve":
        assert finished["ok"] is True and sent
    else:
        assert finished["ok"] is False and not sent
        why = "a person declined it" if answer else "nobody approved it before the prompt expired"
        assert why in finished["error"]["message"]


@pytest.mark.parametrize("answer", ["approve", "decline"])
async def test_a_worker_hears_a_budget_raise_it_did_not_ask_for_resumed(
    redis, vendor, test_worker, tmp_path, answer
):
    """The engine's budget ask (the agent's `budget`, `on_exceeded = "ask"`) is on
    the worker's branch: approved, the worker gets `interrupt.resumed` with nothing
    proposed and the engine sends the held model call; declined, the turn fails over
    budget and the worker is not asked anything more."""

    async def decide(request):
        if request["trigger"]["type"] == "tool.execute":
            return {"actions": [{"type": "tool.result", "result": {"disk": "91%"}}]}
        return request["proposed"]

    worker = await test_worker(decide, secret=SECRET)
    vendor.push(ToolCalls([("lookup", {"q": "disk"})]), Text("Disk is at 91%."))
    budget = 'budget = { max_model_calls = 1, on_exceeded = "ask" }'
    project = worker_project(tmp_path, vendor.url, worker.url, retry=budget)
    engine = await start_engine(redis, project)
    try:
        client = Client(engine.store)
        reply = await client.submit(say("how full is the disk?"))
        sid = reply["session_id"]
        raised = await wait_for_event(
            client, sid, lambda e: e["payload"]["type"] == "session.interrupted"
        )
        assert raised["payload"]["origin"] == "budget"
        iid = raised["payload"]["interrupt_id"]
        await client.submit(
            {"type": "interrupt.resume", "interrupt_id": iid, "payload": {"value": answer}},
            session_id=sid,
        )
        end = await wait_for_event(client, sid, turn_ended(reply["turn_id"]))
        await assert_consistent(engine.store, sid)
    finally:
        await engine.stop()
    triggers = [r["trigger"] for r in worker.requests]
    asked = ["session.start", "client.messages", "llm.finished", "tool.execute", "tool.finished"]
    if answer == "approve":
        assert end["payload"]["type"] == "turn.completed"
        assert [t["type"] for t in triggers] == [
            *asked,
            "interrupt.resumed",
            "llm.finished",
            "turn.finished",
        ]
        resumed = worker.requests[len(asked)]
        assert resumed["trigger"] == {
            "type": "interrupt.resumed",
            "interrupt_id": iid,
            "payload": {"value": "approve"},
        }
        assert resumed["proposed"] == {}  # the engine sends the held call itself
    else:
        assert end["payload"]["type"] == "turn.failed"
        assert end["payload"]["error"]["code"] == "budget_exceeded"
        assert [t["type"] for t in triggers] == asked
