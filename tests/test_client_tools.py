"""Per-submit client tools (SPEC §6 `client.tools`) through the real engine and HTTP API:
real redis-server, the fake vendor, real ports."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine.api import ApiKeys, make_app
from engine.client import Client
from engine.config import Project, parse_project
from engine.machine import LlmCallSettled, MachineError, RunLlmCall
from engine.runtime.engine import Engine
from engine.store.store import Store
from tests.api_helpers import INPUT, serve
from tests.engine_helpers import ENV, assert_consistent, payloads, turn_ended, wait_for_event
from tests.fakes.llm_vendor import Text, ToolCalls
from tests.machine_helpers import Session, text_reply
from tests.test_machine_connectors import CLOCK_TOOLS, effects, synced
from tests.test_machine_connectors import agent as connector_agent
from tests.test_machine_connectors import offered as offered_names
from tests.workers import echo_proposed

CONFIRM = '{ name = "confirm", description = "Ask the person", handler = "client" }'
PICK = {
    "name": "pick_color",
    "description": "Let the user pick a colour in the page",
    "input": {"type": "object", "properties": {"hint": {"type": "string"}}},
    "handler": "worker",  # forced to "client": a client cannot route a tool elsewhere
}


def tools_project(tmp_path: Path, vendor_url: str, worker_url: str = "") -> Project:
    worker = f'worker = "{worker_url}"' if worker_url else ""
    text = textwrap.dedent(
        f"""\
        [llm.openai]
        type = "openai"
        base_url = "{vendor_url}/v1"

        [agent.ops]
        llm = "openai"
        model = "gpt-4.1-mini"
        system = "You are terse."
        tools = [{CONFIRM}]
        subagents = ["agent.helper"]
        retry = {{ llm = {{ backoff_base_secs = 0 }} }}

        [agent.helper]
        llm = "openai"
        model = "gpt-4.1-mini"
        description = "Helps"
        {worker}
        """
    )
    path = tmp_path / "subs.toml"
    path.write_text(text)
    return parse_project(text, str(path), env={})


async def start_engine(redis, project: Project) -> Engine:
    engine = Engine(project, redis, env=ENV, lease_ms=3000)
    await engine.start()
    return engine


@pytest.fixture
async def engine(redis, vendor, tmp_path):
    eng = await start_engine(redis, tools_project(tmp_path, vendor.url))
    yield eng
    await eng.stop()


@pytest.fixture
async def http(redis, engine):
    """The API on its own store connection, so it outlives an engine restart."""
    app = make_app(
        Client(await Store.open(redis)), await Store.open(redis), keys=ApiKeys.from_env({})
    )
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        yield client


def append(text: str, tools: list[dict[str, Any]], agent: str = "ops") -> dict[str, Any]:
    message = {"role": "user", "content": text}
    return {
        "type": "client.append",
        "agent_id": agent,
        "messages": [message],
        "client": {"tools": tools},
    }


def offered(request_body: dict[str, Any]) -> list[str]:
    """The tool names one OpenAI request offered the model."""
    return [t["function"]["name"] for t in request_body.get("tools") or ()]


async def post(
    http: httpx.AsyncClient, inp: dict[str, Any], sid: str | None = None
) -> httpx.Response:
    body: dict[str, Any] = {"input": inp}
    if sid is not None:
        body["session_id"] = sid
    return await http.post(INPUT, json=body)


async def wait_for_client_call(client: Client, sid: str) -> dict[str, Any]:
    event = await wait_for_event(
        client, sid, lambda e: e["payload"]["type"] == "tool.call.requested"
    )
    return event["payload"]


async def test_a_per_submit_tool_is_offered_that_turn_only_and_waits_for_the_client(
    engine, vendor, http
):
    vendor.push(
        ToolCalls([("pick_color", {"hint": "warm"})], text="Let me ask."),
        Text("Red it is."),
        Text("Hello again."),
    )
    resp = await post(http, append("pick a colour", [PICK]))
    assert resp.status_code == 202, resp.text
    sid, turn_id = resp.json()["session_id"], resp.json()["turn_id"]
    client = Client(engine.store)
    requested = await wait_for_client_call(client, sid)
    assert requested["name"] == "pick_color" and requested["handler"] == "client"
    view = (await http.get(f"/api/client/sessions/{sid}")).json()
    assert view["status"] == "running"  # waiting for the client, nothing in flight
    assert len(vendor.requests) == 1

    resp = await post(http, {"type": "tool.result", "id": requested["id"], "result": "red"}, sid)
    assert resp.status_code == 202, resp.text
    end = await wait_for_event(client, sid, turn_ended(turn_id))
    assert end["payload"]["type"] == "turn.completed"

    resp = await post(
        http,
        {"type": "client.message", "agent_id": "ops", "message": {"role": "user", "content": "hi"}},
        sid,
    )
    second = resp.json()["turn_id"]
    await wait_for_event(client, sid, turn_ended(second))
    bodies = [r.body for r in vendor.requests]
    assert [offered(b) for b in bodies] == [
        ["confirm", "helper", "pick_color"],
        ["confirm", "helper", "pick_color"],  # the re-prompt in the same turn
        ["confirm", "helper"],  # the next turn: gone
    ]
    schema = next(t for t in bodies[0]["tools"] if t["function"]["name"] == "pick_color")
    assert schema["function"]["parameters"] == PICK["input"]
    assert "red" in str(bodies[1]["messages"])

    events = await assert_consistent(engine.store, sid)
    started = payloads(events, "turn.started")
    assert started[0]["client_tools"] == [{**PICK, "handler": "client"}]
    assert "client_tools" not in started[1]


@pytest.mark.parametrize(
    ("tools", "index", "name"),
    [
        ([PICK, {"name": "confirm", "description": "mine"}], 1, "confirm"),  # the agent's
        ([{"name": "helper", "description": "mine"}], 0, "helper"),  # a subagent's
        ([PICK, PICK], 1, "pick_color"),  # twice in one input
    ],
)
async def test_a_per_submit_tool_that_clashes_is_a_422_naming_it(
    engine, vendor, http, tools, index, name
):
    resp = await post(http, append("hi", tools), "ses-clash")
    assert resp.status_code == 422, resp.text
    body = resp.json()
    assert body["code"] == "invalid_input"
    assert body["param"] == f"input.client.tools.{index}.name"
    assert repr(name) in body["error"]
    # Refused before anything was committed: the session was never created.
    assert (await http.get("/api/client/sessions/ses-clash")).status_code == 404
    assert vendor.requests == []


async def test_a_per_submit_tool_survives_an_engine_restart_mid_wait(
    redis, vendor, tmp_path, http, engine
):
    vendor.push(ToolCalls([("pick_color", {})]), Text("Green, then."))
    resp = await post(http, append("pick a colour", [PICK]))
    sid, turn_id = resp.json()["session_id"], resp.json()["turn_id"]
    requested = await wait_for_client_call(Client(engine.store), sid)
    await engine.stop()

    again = await start_engine(redis, tools_project(tmp_path, vendor.url))
    try:
        resp = await post(
            http, {"type": "tool.result", "id": requested["id"], "result": "green"}, sid
        )
        assert resp.status_code == 202, resp.text
        client = Client(again.store)
        end = await wait_for_event(client, sid, turn_ended(turn_id))
        assert end["payload"]["type"] == "turn.completed"
        # The restarted engine folded the turn's tools from the log: still offered.
        assert offered(vendor.requests[1].body) == ["confirm", "helper", "pick_color"]
        await assert_consistent(again.store, sid)
    finally:
        await again.stop()


async def test_a_worker_gets_the_tools_in_its_client_messages_trigger(
    redis, vendor, tmp_path, test_worker
):
    worker = await test_worker(echo_proposed)
    vendor.push(ToolCalls([("pick_color", {})]), Text("Done."))
    engine = await start_engine(redis, tools_project(tmp_path, vendor.url, worker.url))
    try:
        client = Client(engine.store)
        reply = await client.submit(append("pick one", [PICK], agent="helper"))
        sid = reply["session_id"]
        requested = await wait_for_client_call(client, sid)
        await client.submit(
            {"type": "tool.result", "id": requested["id"], "result": "blue"}, session_id=sid
        )
        await wait_for_event(client, sid, turn_ended(reply["turn_id"]))
        trigger = next(
            r["trigger"] for r in worker.requests if r["trigger"]["type"] == "client.messages"
        )
        assert trigger["client"]["tools"] == [{**PICK, "handler": "client"}]
        assert offered(vendor.requests[0].body) == ["pick_color"]
        assert worker.schema_errors == []
    finally:
        await engine.stop()


# --- beside a connection's tools (the pure machine) --------------------------------------


def test_a_per_submit_tool_follows_a_connections_tools_and_may_not_take_their_names():
    s = Session(agent=connector_agent("mcp.clock"))
    t = synced(s, s.say("time?"), {"mcp.clock": CLOCK_TOOLS})
    [llm] = effects(t, RunLlmCall)
    s.apply(LlmCallSettled(llm.call_id, 1, response=text_reply("noon")))
    assert s.state is not None and s.state.turn is None

    def submit(name: str) -> Any:
        tool = {"name": name, "description": "mine", "input": {"type": "object"}}
        message = {"role": "user", "content": "pick"}
        body = {"type": "client.append", "agent_id": "a", "messages": [message]}
        return s.client({**body, "client": {"tools": [tool]}})

    with pytest.raises(MachineError) as refused:
        submit("clock__now")
    assert refused.value.status == 422
    assert refused.value.detail["param"] == "input.client.tools.0.name"
    assert "'clock__now'" in refused.value.message
    t = synced(s, submit("pick_color"), {"mcp.clock": CLOCK_TOOLS})
    assert offered_names(s, t)[-2:] == ["clock__confirm", "pick_color"]
    s.check_fold()
