"""Subagents through the real engine (SPEC §9): children are sessions of their own."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import textwrap
from collections import Counter
from pathlib import Path

from engine.client import Client
from engine.config import parse_project
from engine.runtime.engine import Engine
from engine.store.store import Store
from tests.engine_helpers import (
    ENV,
    EngineProcess,
    assert_consistent,
    on_both_redis,
    payloads,
    poll_until,
    turn_ended,
    wait_for_event,
)
from tests.fakes.llm_vendor import Text, ToolCalls

SECRET = "child-secret"


def system_of(body: dict) -> str:
    first = body["messages"][0]
    return first["content"] if first["role"] == "system" else ""


def last_role(body: dict) -> str:
    return body["messages"][-1]["role"]


@on_both_redis
async def test_a_parent_delegates_to_a_worker_child_and_an_engine_child_at_once(
    redis, vendor, test_worker, tmp_path: Path
):
    worker = await test_worker(secret=SECRET)  # echoes every proposal

    def model(body: dict):
        system = system_of(body)
        if system == "You lead.":
            if last_role(body) == "tool":
                return Text("Both children answered.")
            return ToolCalls(
                [("researcher", {"message": "find it"}), ("checker", {"message": "check it"})]
            )
        return Text("researched" if system == "You research." else "checked")

    vendor.responder = model
    text = textwrap.dedent(
        f"""\
        [llm.openai]
        type = "openai"
        base_url = "{vendor.url}/v1"

        [agent.lead]
        llm = "openai"
        model = "gpt-4.1-mini"
        system = "You lead."
        subagents = ["agent.researcher", "agent.checker"]

        [agent.researcher]
        llm = "openai"
        model = "gpt-4.1-mini"
        system = "You research."
        description = "Finds things out."
        worker = "{worker.url}"
        signing_secret_env = "CHILD_SECRET"

        [agent.checker]
        llm = "openai"
        model = "gpt-4.1-mini"
        system = "You check."
        description = "Checks things."
        """
    )
    project = parse_project(text, str(tmp_path / "subs.toml"), env={})
    engine = Engine(project, redis, env={**ENV, "CHILD_SECRET": SECRET}, lease_ms=3000)
    await engine.start()
    try:
        client = Client(engine.store)
        reply = await client.submit(
            {
                "type": "client.message",
                "agent_id": "lead",
                "message": {"role": "user", "content": "go"},
            }
        )
        sid = reply["session_id"]
        end = await wait_for_event(client, sid, turn_ended(reply["turn_id"]), timeout=30)
        assert end["payload"]["type"] == "turn.completed"
        events = await assert_consistent(engine.store, sid)
        requested = payloads(events, "subagent.requested")
        children = {p["agent_id"]: p["id"] for p in requested}
        started = {p["id"] for p in payloads(events, "subagent.started")}
        assert started == set(children.values())
        assert set(children) == {"researcher", "checker"}
        for child in children.values():
            child_events = await assert_consistent(engine.store, child)
            assert child_events[-1]["payload"]["type"] == "turn.completed"
    finally:
        await engine.stop()

    # The parent's model was offered one tool per child, described by the child.
    first = vendor.requests[0].body
    offered = {t["function"]["name"]: t["function"]["description"] for t in first["tools"]}
    assert offered == {"researcher": "Finds things out.", "checker": "Checks things."}
    # Both results reached the model together, in one re-prompt.
    final = next(
        r.body
        for r in vendor.requests
        if system_of(r.body) == "You lead." and last_role(r.body) == "tool"
    )
    results = [json.loads(m["content"]) for m in final["messages"] if m["role"] == "tool"]
    assert sorted(r["result"] for r in results) == ["checked", "researched"]
    assert {r["session"] for r in results} == set(children.values())
    # The worker-decided child's requests carry its ancestry.
    assert worker.requests and all(r["ancestry"] == [sid] for r in worker.requests)
    # Cost rolls up: the parent's turn counts its own calls and both children's.
    calls = len(vendor.requests)
    assert calls == 4
    usage = end["payload"]["usage"]
    child_usage = [p["usage"]["total"] for p in payloads(events, "subagent.completed")]
    own = [p["usage"]["total"] for p in payloads(events, "llm.call.completed")]
    assert usage["total"] == sum(own) + sum(child_usage)


async def test_a_chain_deeper_than_the_limit_stops_at_five(redis, vendor, tmp_path: Path):
    depth = 7
    names = [f"a{i}" for i in range(1, depth + 1)]

    def model(body: dict):
        me = system_of(body).removeprefix("You are ")
        if last_role(body) == "tool":
            return Text(f"{me} done")
        nxt = f"a{int(me[1:]) + 1}"
        return ToolCalls([(nxt, {"message": "deeper"})])

    vendor.responder = model
    blocks = [f'[llm.openai]\ntype = "openai"\nbase_url = "{vendor.url}/v1"\n']
    for i, name in enumerate(names):
        sub = f'subagents = ["agent.{names[i + 1]}"]\n' if i + 1 < depth else ""
        blocks.append(
            f'[agent.{name}]\nllm = "openai"\nmodel = "gpt-4.1-mini"\n'
            f'system = "You are {name}"\n{sub}'
        )
    project = parse_project("\n".join(blocks), str(tmp_path / "subs.toml"), env={})
    engine = Engine(project, redis, env=ENV, lease_ms=3000)
    await engine.start()
    try:
        client = Client(engine.store)
        message = {"role": "user", "content": "go"}
        reply = await client.submit(
            {"type": "client.message", "agent_id": "a1", "message": message}
        )
        sid = reply["session_id"]
        end = await wait_for_event(client, sid, turn_ended(reply["turn_id"]), timeout=30)
        assert end["payload"]["type"] == "turn.completed"
        chain = [sid]
        while True:
            events = await assert_consistent(engine.store, chain[-1])
            spawned = payloads(events, "subagent.requested")
            if not spawned:
                break
            chain.append(spawned[0]["id"])
    finally:
        await engine.stop()
    assert len(chain) == 6  # the root and five levels of children
    errors = [p["error"]["message"] for p in payloads(events, "tool.call.errored")]
    assert errors == ["subagent depth limit reached (max_subagent_depth = 5)"]
    # At the limit the tool is not even offered to the model.
    deepest = [r.body for r in vendor.requests if system_of(r.body) == "You are a6"]
    assert deepest and all(not r.get("tools") for r in deepest)


async def test_sigkill_between_the_spawn_and_the_childs_first_step(
    redis, redis_url, vendor, tmp_path
):
    """The parent's engine dies right after committing the spawn, while the child's engine
    is frozen: after a restart exactly one child runs, once, and the parent finishes."""
    config = tmp_path / "subs.toml"
    config.write_text(
        f'[llm.openai]\ntype = "openai"\nbase_url = "{vendor.url}/v1"\n'
        '[agent.lead]\nllm = "openai"\nmodel = "m"\nsystem = "You lead."\n'
        'subagents = ["agent.helper"]\n'
        '[agent.helper]\nllm = "openai"\nmodel = "m"\nsystem = "You help."\n'
    )
    lease = {"SUBS_LEASE_MS": "4000"}  # long enough to kill A before B's leases lapse
    a = await EngineProcess(config, redis_url, lease).start()
    b = await EngineProcess(config, redis_url, lease).start()
    store = await Store.open(redis)

    async def balanced() -> dict[int, str] | None:
        owners = {}
        for p in range(store.partitions):
            value = await redis.get(store.lease_key(p))
            if value:
                owners[p] = value.decode().rsplit(":", 1)[0]
        return owners if sorted(Counter(owners.values()).values()) == [8, 8] else None

    owners = await poll_until(balanced, 20, "both engines to own half the partitions")
    parent = next(f"p{i}" for i in range(999) if owners[store.partition_of(f"p{i}")] == a.owner)
    call_id = next(
        f"call_{i}"
        for i in range(999)
        if owners[store.partition_of(f"{parent}~call_{i}")] == b.owner
    )
    child = f"{parent}~{call_id}"

    def model(body: dict):
        if system_of(body) == "You help.":
            return Text("helped")
        if last_role(body) == "tool":
            return Text("lead done")
        return ToolCalls([("helper", {"message": "please"})], ids=[call_id])

    vendor.responder = model
    try:
        assert b.proc is not None and a.proc is not None
        os.kill(b.proc.pid, signal.SIGSTOP)
        client = Client(store)
        message = {"role": "user", "content": "go"}
        reply = await client.submit(
            {"type": "client.message", "agent_id": "lead", "message": message}, session_id=parent
        )
        await wait_for_event(client, parent, lambda e: e["payload"]["type"] == "subagent.requested")
        assert await store.load_snapshot(child) is None  # its engine is frozen
        a.kill()
        assert await a.stop() == -signal.SIGKILL
        b.kill()  # SIGKILL ends a stopped process too: it may be reaped before a SIGCONT
        with contextlib.suppress(ProcessLookupError):
            os.kill(b.proc.pid, signal.SIGCONT)
        await b.stop()

        c = await EngineProcess(config, redis_url, lease).start()
        try:
            end = await wait_for_event(client, parent, turn_ended(reply["turn_id"]), timeout=30)
        finally:
            await c.stop()
    finally:
        for proc in (a, b):
            if proc.proc is not None and proc.proc.returncode is None:
                proc.proc.kill()
                await proc.proc.wait()
    assert end["payload"]["type"] == "turn.completed"
    parent_events = await assert_consistent(store, parent)
    assert len(payloads(parent_events, "subagent.requested")) == 1
    assert len(payloads(parent_events, "subagent.completed")) == 1
    child_events = await assert_consistent(store, child)
    assert len(payloads(child_events, "session.created")) == 1
    assert [p["turn_id"] for p in payloads(child_events, "turn.started")] == [
        f"sub~{parent}~{call_id}"
    ]
    assert sum(system_of(r.body) == "You help." for r in vendor.requests) == 1


async def test_a_detached_child_runs_on_its_own_and_a_wait_call_collects_its_answer(
    redis, vendor, tmp_path: Path
):
    """SPEC §9 spawn modes: the model starts the helper detached (answered once the child's
    turn has started), then waits for it; the child's end is recorded on the parent's log
    and starts no parent turn of its own."""
    parent = "lead-detached"
    child = f"{parent}~c1"

    def model(body: dict):
        if system_of(body) == "You help.":
            return Text("found it", chunk_delay=0.05, chunks=3)
        last = body["messages"][-1]
        if last["role"] == "user":
            return ToolCalls([("helper", {"message": "look", "mode": "detached"})], ids=["c1"])
        answer = json.loads(last["content"])
        if answer.get("status") == "started":
            return ToolCalls(
                [("helper", {"session": answer["session"], "mode": "wait"})], ids=["w1"]
            )
        return Text(f"the helper says: {answer['result']}")

    vendor.responder = model
    text = textwrap.dedent(
        f"""\
        [llm.openai]
        type = "openai"
        base_url = "{vendor.url}/v1"

        [agent.lead]
        llm = "openai"
        model = "m"
        system = "You lead."
        subagents = [{{ id = "agent.helper", mode = "detached" }}]

        [agent.helper]
        llm = "openai"
        model = "m"
        system = "You help."
        """
    )
    project = parse_project(text, str(tmp_path / "subs.toml"), env={})
    engine = Engine(project, redis, env=ENV, lease_ms=3000)
    await engine.start()
    try:
        client = Client(engine.store)
        message = {"role": "user", "content": "go"}
        reply = await client.submit(
            {"type": "client.message", "agent_id": "lead", "message": message}, session_id=parent
        )
        end = await wait_for_event(client, parent, turn_ended(reply["turn_id"]), timeout=30)
        assert end["payload"]["type"] == "turn.completed"
        events = await assert_consistent(engine.store, parent)
        child_events = await assert_consistent(engine.store, child)
    finally:
        await engine.stop()
    (requested,) = payloads(events, "subagent.requested")
    assert requested["mode"] == "detached" and requested["id"] == child
    results = [
        json.loads(m["content"][0]["text"])
        for m in [p["result"] for p in payloads(events, "tool.call.completed")]
    ]
    assert results == [
        {"session": child, "status": "started"},
        {"session": child, "result": "found it"},
    ]
    (ended,) = payloads(events, "subagent.completed")
    assert ended["detached"] and ended["result"] == "found it" and ended["tool_call_id"] == "c1"
    assert len(payloads(events, "turn.started")) == 1  # the child's end started no turn
    final = [p for p in payloads(events, "message.new") if p["message"]["role"] == "assistant"]
    assert final[-1]["message"]["content"] == "the helper says: found it"
    assert [p["turn_id"] for p in payloads(child_events, "turn.started")] == [f"sub~{parent}~c1"]
    # The parent's model was offered the choice its config leaves: detached or wait.
    offered = vendor.requests[0].body["tools"][0]["function"]["parameters"]
    assert offered["properties"]["mode"]["enum"] == ["detached", "wait"]
