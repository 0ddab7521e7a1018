"""Queue timeouts through the real engine (SPEC §11): the recorded deadline's timer fires
on a real redis-server, and what waited too long fails with `queue_timeout`."""

from __future__ import annotations

from pathlib import Path

from engine.client import Client
from engine.config import parse_project
from engine.machine.evolve import at_ms
from engine.runtime.engine import Engine
from tests.engine_helpers import ENV, assert_consistent, payloads, turn_ended, wait_for_event
from tests.fakes.llm_vendor import Text, ToolCalls


def say(agent: str, text: str, **extra) -> dict:
    return {
        "type": "client.message",
        "agent_id": agent,
        "message": {"role": "user", "content": text},
        **extra,
    }


def system_of(body: dict) -> str:
    first = body["messages"][0]
    return first["content"] if first["role"] == "system" else ""


def project(tmp_path: Path, vendor_url: str) -> str:
    return (
        f'[llm.openai]\ntype = "openai"\nbase_url = "{vendor_url}/v1"\n'
        '[agent.lead]\nllm = "openai"\nmodel = "m"\nsystem = "You lead."\n'
        'subagents = ["agent.helper"]\n'
        'tools = [{ name = "confirm", description = "Ask a person", handler = "client" }]\n'
        "retry = { default = { queue_timeout_secs = 1 }, subagent = { queue_timeout_secs = 1,"
        " max_attempts = 2, backoff_base_secs = 0 } }\n"
        '[agent.helper]\nllm = "openai"\nmodel = "m"\nsystem = "You help."\n'
        'tools = [{ name = "confirm", description = "Ask a person", handler = "client" }]\n'
    )


async def test_a_queued_turn_past_its_queue_timeout_fails_and_the_running_one_goes_on(
    redis, vendor, tmp_path
):
    vendor.push(ToolCalls([("confirm", {})], ids=["ask"]), Text("confirmed"))
    path = tmp_path / "subs.toml"
    proj = parse_project(project(tmp_path, vendor.url), str(path), env={})
    engine = Engine(proj, redis, env=ENV, lease_ms=3000)
    await engine.start()
    try:
        client = Client(engine.store)
        first = await client.submit(say("lead", "one"))
        sid = first["session_id"]
        # The turn waits on its client tool: anything sent now queues behind it.
        await wait_for_event(client, sid, lambda e: e["payload"]["type"] == "tool.call.dispatched")
        queued = await client.submit(say("lead", "two", queue=True), session_id=sid)
        assert queued["queued"] is True
        end = await wait_for_event(client, sid, turn_ended(queued["turn_id"]), timeout=15)
        error = end["payload"]["error"]
        assert end["payload"]["type"] == "turn.failed"
        assert error["code"] == "deadline_exceeded"
        assert error["detail"]["reason"] == "queue_timeout"
        # The first turn runs on: its tool is answered and it completes.
        await client.submit({"type": "tool.result", "id": "ask", "result": "yes"}, session_id=sid)
        done = await wait_for_event(client, sid, turn_ended(first["turn_id"]))
        assert done["payload"]["type"] == "turn.completed"
        events = await assert_consistent(engine.store, sid)
    finally:
        await engine.stop()
    (queued_at,) = [at_ms(e) for e in events if e["payload"]["type"] == "turn.queued"]
    waited = at_ms(end) - queued_at
    assert 1000 <= waited < 10_000, waited
    users = [p["message"].get("content") for p in payloads(events, "message.new")]
    assert "two" not in users  # it never ran
    assert len(vendor.requests) == 2  # the queued turn made no model call


async def test_a_subagent_whose_child_stays_busy_fails_its_start_twice_then_the_parent_goes_on(
    redis, vendor, tmp_path
):
    parent, call_id = "lead-1", "c1"
    child = f"{parent}~{call_id}"

    def model(body: dict):
        if system_of(body) == "You help.":
            return ToolCalls([("confirm", {})], ids=["hold"])  # the child's client keeps it busy
        if body["messages"][-1]["role"] == "tool":
            return Text("the helper was busy")
        return ToolCalls([("helper", {"message": "please"})], ids=[call_id])

    vendor.responder = model
    path = tmp_path / "subs.toml"
    proj = parse_project(project(tmp_path, vendor.url), str(path), env={})
    engine = Engine(proj, redis, env=ENV, lease_ms=3000)
    await engine.start()
    try:
        client = Client(engine.store)
        await client.submit(say("helper", "hold on"), session_id=child)
        await wait_for_event(
            client, child, lambda e: e["payload"]["type"] == "tool.call.dispatched"
        )
        started = await client.submit(say("lead", "delegate"), session_id=parent)
        end = await wait_for_event(client, parent, turn_ended(started["turn_id"]), timeout=20)
        assert end["payload"]["type"] == "turn.completed"
        parent_events = await assert_consistent(engine.store, parent)
        child_events = await assert_consistent(engine.store, child)
    finally:
        await engine.stop()
    errored = payloads(parent_events, "tool.call.errored")
    assert [(p["attempt"], p["final"]) for p in errored] == [(1, False), (2, True)]
    assert {p["error"]["detail"]["reason"] for p in errored} == {"queue_timeout"}
    assert not payloads(parent_events, "subagent.started")
    # Each attempt queued a turn of its own in the child; each was dropped, unrun.
    spawned = [f"sub~{parent}~{call_id}", f"sub~{parent}~{call_id}~2"]
    assert [p["turn_id"] for p in payloads(child_events, "turn.queued")] == spawned
    assert [p["turn_id"] for p in payloads(child_events, "turn.failed")] == spawned
    assert len(payloads(child_events, "turn.started")) == 1  # the client's own turn only
    helper_calls = [r for r in vendor.requests if system_of(r.body) == "You help."]
    assert len(helper_calls) == 1  # only the client's own turn called the model
