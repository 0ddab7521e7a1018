"""Engine runs recorded only as golden logs (see record.py), for the event kinds the
suite's own tests do not leave in a log: worker state and channels, a backoff timer, a
branch, a child whose turn fails, connectors, one of them off. Not collected by the
suite (no `test_` file name)."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

from engine.client import Client
from engine.config import parse_project
from engine.runtime.engine import Engine
from tests.engine_helpers import ENV, assert_consistent, payloads, turn_ended, wait_for_event
from tests.fakes.llm_vendor import HttpError, Text, ToolCalls

SECRET = "worker-secret-for-tests"
MCP_SERVER = str(Path(__file__).parents[1] / "mcp_server.py")


async def _engine(redis, tmp_path: Path, text: str) -> Engine:
    project = parse_project(textwrap.dedent(text), str(tmp_path / "subs.toml"), env={})
    engine = Engine(project, redis, env={**ENV, "HELPER_SECRET": SECRET}, lease_ms=3000)
    await engine.start()
    return engine


async def _one_turn(engine: Engine, agent: str, text: str) -> list[dict[str, Any]]:
    """One message to `agent` whose turn completes; its session's log. Stops the engine."""
    try:
        client = Client(engine.store)
        message = {"role": "user", "content": text}
        reply = await client.submit(
            {"type": "client.message", "agent_id": agent, "message": message}
        )
        sid = reply["session_id"]
        end = await wait_for_event(client, sid, turn_ended(reply["turn_id"]), timeout=30)
        assert end["payload"]["type"] == "turn.completed"
        return await assert_consistent(engine.store, sid)
    finally:
        await engine.stop()


async def test_worker_state_channels_a_backoff_and_a_branch(redis, vendor, test_worker, tmp_path):
    async def decide(request):
        if request["trigger"]["type"] == "client.messages":
            n = len(request["trigger"]["messages"])
            return {**request["proposed"], "state": {"n": n}, "channels": {"slack": "working"}}
        return request["proposed"]

    worker = await test_worker(decide, secret=SECRET)
    vendor.push(HttpError(529), Text("first answer"), Text("second answer"))
    engine = await _engine(
        redis,
        tmp_path,
        f"""\
        [llm.openai]
        type = "openai"
        base_url = "{vendor.url}/v1"

        [agent.helper]
        llm = "openai"
        model = "gpt-4.1-mini"
        system = "You help."
        worker = "{worker.url}"
        signing_secret_env = "HELPER_SECRET"
        retry = {{ llm = {{ backoff_base_secs = 1, backoff_max_secs = 1 }} }}
        """,
    )
    try:
        client = Client(engine.store)
        question = {"id": "u1", "role": "user", "content": "hi"}
        first = await client.submit(
            {"type": "client.message", "agent_id": "helper", "message": question}
        )
        sid = first["session_id"]
        await wait_for_event(client, sid, turn_ended(first["turn_id"]))
        # The view without the reply: a regenerate, on a branch of its own.
        again = await client.submit(
            {"type": "client.messages", "agent_id": "helper", "messages": [question]},
            session_id=sid,
        )
        end = await wait_for_event(client, sid, turn_ended(again["turn_id"]))
        assert end["payload"]["type"] == "turn.completed"
        events = await assert_consistent(engine.store, sid)
    finally:
        await engine.stop()
    for kind in ("call.retry_scheduled", "head.moved", "worker.state.updated", "channels.updated"):
        assert payloads(events, kind), kind


async def test_a_child_whose_turn_fails(redis, vendor, tmp_path):
    def model(body: dict):
        if body["messages"][0]["content"] == "You check.":
            return HttpError(400)
        if body["messages"][-1]["role"] == "tool":
            return Text("The checker failed.")
        return ToolCalls([("checker", {"message": "check it"})])

    vendor.responder = model
    engine = await _engine(
        redis,
        tmp_path,
        f"""\
        [llm.openai]
        type = "openai"
        base_url = "{vendor.url}/v1"

        [agent.lead]
        llm = "openai"
        model = "gpt-4.1-mini"
        system = "You lead."
        subagents = ["agent.checker"]

        [agent.checker]
        llm = "openai"
        model = "gpt-4.1-mini"
        system = "You check."
        description = "Checks things."
        """,
    )
    events = await _one_turn(engine, "lead", "go")
    assert payloads(events, "subagent.errored")


async def test_connectors_a_sync_a_call_and_a_server_that_is_not_installed(redis, vendor, tmp_path):
    vendor.push(ToolCalls([("clock__echo", {"text": "hi"})]), Text("It echoed."))
    engine = await _engine(
        redis,
        tmp_path,
        f"""\
        [llm.openai]
        type = "openai"
        base_url = "{vendor.url}/v1"

        [mcp.clock]
        command = [{json.dumps(sys.executable)}, {json.dumps(MCP_SERVER)}]

        [mcp.gone]
        command = ["no-such-mcp-server"]

        [agent.oncall]
        llm = "openai"
        model = "gpt-4.1-mini"
        system = "You help."
        mcp = ["mcp.clock", "mcp.gone"]
        """,
    )
    events = await _one_turn(engine, "oncall", "echo hi")
    for kind in ("decision.held", "connector.synced", "connector.sync.errored"):
        assert payloads(events, kind), kind


async def test_an_off_connection_over_two_turns(redis, vendor, tmp_path):
    """`mcp.changes` names a variable that is unset: its sync is answered `off` (recorded
    once, with the reason), then the unchanged form on the next turn."""
    vendor.push(Text("Without the changes."), Text("Still without them."))
    engine = await _engine(
        redis,
        tmp_path,
        f"""\
        [llm.openai]
        type = "openai"
        base_url = "{vendor.url}/v1"

        [mcp.clock]
        command = [{json.dumps(sys.executable)}, {json.dumps(MCP_SERVER)}]

        [mcp.changes]
        command = [{json.dumps(sys.executable)}, {json.dumps(MCP_SERVER)}]
        cwd = "${{CHANGES_REPO}}"

        [agent.oncall]
        llm = "openai"
        model = "gpt-4.1-mini"
        system = "You help."
        mcp = ["mcp.clock", "mcp.changes"]
        """,
    )
    try:
        client = Client(engine.store)
        sid = None
        for text in ("what changed?", "and now?"):
            message = {"role": "user", "content": text}
            reply = await client.submit(
                {"type": "client.message", "agent_id": "oncall", "message": message},
                session_id=sid,
            )
            sid = reply["session_id"]
            end = await wait_for_event(client, sid, turn_ended(reply["turn_id"]), timeout=30)
            assert end["payload"]["type"] == "turn.completed"
        events = await assert_consistent(engine.store, sid)
    finally:
        await engine.stop()
    offs = [p for p in payloads(events, "connector.synced") if p.get("off")]
    assert [p["path"] for p in offs] == ["mcp.changes"]
    assert not payloads(events, "connector.sync.errored")


async def test_a_turn_waits_on_a_per_submit_client_tool(redis, vendor, tmp_path):
    """Left waiting for the client: the fold keeps the turn's per-submit tools."""
    vendor.push(ToolCalls([("pick_color", {})], text="Let me ask."))
    engine = await _engine(
        redis,
        tmp_path,
        f"""\
        [llm.openai]
        type = "openai"
        base_url = "{vendor.url}/v1"

        [agent.chat]
        llm = "openai"
        model = "gpt-4.1-mini"
        """,
    )
    try:
        client = Client(engine.store)
        tool = {"name": "pick_color", "description": "Pick", "input": {"type": "object"}}
        reply = await client.submit(
            {
                "type": "client.append",
                "agent_id": "chat",
                "messages": [{"id": "u1", "role": "user", "content": "pick one"}],
                "client": {"tools": [tool]},
            }
        )
        sid = reply["session_id"]
        await wait_for_event(client, sid, lambda e: e["payload"]["type"] == "tool.call.dispatched")
        await assert_consistent(engine.store, sid)
    finally:
        await engine.stop()
