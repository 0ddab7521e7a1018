"""The engine in process: real redis-server, real HTTP to the fake vendor."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest

from engine.client import Client, ClientError
from engine.runtime.engine import Engine
from engine.store.store import GROUP
from tests.engine_helpers import (
    assert_consistent,
    make_project,
    on_both_redis,
    payloads,
    turn_ended,
    wait_for_event,
)
from tests.fakes.llm_vendor import HttpError, Text, ToolCalls


def say(agent: str, text: str, **extra) -> dict:
    return {
        "type": "client.message",
        "agent_id": agent,
        "message": {"role": "user", "content": text},
        **extra,
    }


@on_both_redis
@pytest.mark.parametrize("agent", ["ops_openai", "ops_anthropic"])
async def test_client_tool_round_trip_streamed(engine, vendor, agent):
    vendor.push(
        ToolCalls([("confirm", {"question": "restart the db?"})], text="Checking."),
        Text("Restarted the primary database.", chunks=5),
    )
    client = Client(engine.store)
    reply = await client.submit(say(agent, "the db is down"), identity={"issuer": "cli"})
    sid, turn_id = reply["session_id"], reply["turn_id"]
    assert reply["queued"] is False

    dispatched = await wait_for_event(
        client, sid, lambda e: e["payload"]["type"] == "tool.call.dispatched"
    )
    call_id = dispatched["payload"]["id"]
    await client.submit({"type": "tool.result", "id": call_id, "result": "yes"}, session_id=sid)
    deltas: list[dict] = []
    end = await wait_for_event(client, sid, turn_ended(turn_id), deltas=deltas)
    assert end["payload"]["type"] == "turn.completed"

    events = await assert_consistent(engine.store, sid)
    messages = [p["message"] for p in payloads(events, "message.new")]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[1]["tool_calls"][0]["function"]["name"] == "confirm"
    assert messages[2]["content"] == "yes"
    assert messages[3]["content"] == "Restarted the primary database."
    final_call = payloads(events, "llm.call.completed")[-1]["id"]
    streamed = "".join(d.get("text") or "" for d in deltas if d["call_id"] == final_call)
    assert streamed == "Restarted the primary database."
    assert len([d for d in deltas if d["call_id"] == final_call and d.get("text")]) > 1
    # The second request carried the tool result back to the vendor.
    assert len(vendor.requests) == 2
    assert "yes" in str(vendor.requests[1].body)
    usage = end["payload"]["usage"]
    assert usage["total"] == usage["input"] + usage["output"] > 0


async def test_retryable_vendor_errors_are_retried_then_the_turn_completes(engine, vendor):
    vendor.push(HttpError(429, retry_after=0), HttpError(529), Text("fine now"))
    client = Client(engine.store)
    reply = await client.submit(say("ops_anthropic", "hello"))
    end = await wait_for_event(client, reply["session_id"], turn_ended(reply["turn_id"]))
    assert end["payload"]["type"] == "turn.completed"
    events = await assert_consistent(engine.store, reply["session_id"])
    attempts = [p["attempt"] for p in payloads(events, "llm.call.dispatched")]
    assert attempts == [1, 2, 3]
    errored = payloads(events, "llm.call.errored")
    assert [e["error"]["code"] for e in errored] == ["rate_limited", "provider_error"]


async def test_missing_api_key_fails_the_turn_naming_the_variable(redis, vendor, tmp_path):
    project = make_project(tmp_path, vendor.url)
    eng = Engine(project, redis, env={}, lease_ms=3000)
    await eng.start()
    try:
        client = Client(eng.store)
        reply = await client.submit(say("ops_openai", "hello"))
        end = await wait_for_event(client, reply["session_id"], turn_ended(reply["turn_id"]))
        assert end["payload"]["type"] == "turn.failed"
        assert "OPENAI_API_KEY" in end["payload"]["error"]["message"]
        assert vendor.requests == []
    finally:
        await eng.stop()


@on_both_redis
async def test_busy_session_refuses_queues_and_dedupes(engine, vendor):
    vendor.push(Text("one", chunk_delay=0.05, chunks=4), Text("two"), Text("three"))
    client = Client(engine.store)
    first = await client.submit(say("ops_openai", "1", turn_id="T1"))
    sid = first["session_id"]
    with pytest.raises(ClientError) as err:
        await client.submit(say("ops_openai", "x"), session_id=sid)
    assert err.value.status == 409 and err.value.code == "turn_already_active"
    assert err.value.detail["turn_id"] == "T1"
    q = await client.submit(say("ops_openai", "2", queue=True), session_id=sid)
    assert q["queued"] is True
    again = await client.submit(say("ops_openai", "1", turn_id="T1"), session_id=sid)
    assert again["turn_id"] == "T1" and again.get("existing")
    await wait_for_event(client, sid, turn_ended(q["turn_id"]))
    events = await assert_consistent(engine.store, sid)
    users = [p["message"]["content"] for p in payloads(events, "message.new")]
    assert users == ["1", "one", "2", "two"]
    assert len(vendor.requests) == 2


async def test_unknown_agent_and_session_are_refused(engine):
    client = Client(engine.store)
    with pytest.raises(ClientError) as err:
        await client.submit(say("nobody", "hi"))
    assert err.value.status == 404 and "ops_openai" in str(err.value)
    with pytest.raises(ClientError) as err:
        await client.submit({"type": "tool.result", "id": "c1", "result": "x"}, session_id="nope")
    assert err.value.status == 404


async def test_an_input_the_engine_cannot_apply_is_refused_not_left_pending(engine, vendor):
    """A work item no engine can read (a newer client's, say) is answered with an error and
    acked, so it is not handed from owner to owner forever; the session goes on."""
    client = Client(engine.store)
    store = engine.store
    sid = "ses_poison"
    reply_to = store.reply_key(sid, "poison")
    await store.enqueue(sid, {"kind": "from-the-future", "what": 1}, reply_to)
    answer = await store.redis.blpop([reply_to], timeout=10)
    assert answer is not None
    reply = json.loads(answer[1])
    assert (reply["ok"], reply["code"], reply["status"]) == (False, "internal", 500)
    assert "could not apply an input (from-the-future)" in reply["error"]
    assert "dead-letter" in reply["error"]
    pending = await store.redis.xpending(store.work_key(store.partition_of(sid)), GROUP)
    assert pending["pending"] == 0
    (letter,) = await store.dead_letters()
    assert letter["session_id"] == sid and letter["input"]["kind"] == "from-the-future"
    assert "unknown input kind" in letter["reason"]
    vendor.push(Text("Still here."))
    started = await client.submit(say("ops_openai", "hello?"), session_id=sid)
    end = await wait_for_event(client, sid, turn_ended(started["turn_id"]))
    assert end["payload"]["type"] == "turn.completed"


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("half a pair \ud83d", "lone UTF-16 surrogate"),
        (float("nan"), "NaN is not a JSON number"),
    ],
)
async def test_a_client_input_that_cannot_be_stored_is_refused_at_the_edge(
    engine, content, problem
):
    client = Client(engine.store)
    with pytest.raises(ClientError) as err:
        await client.submit(say("ops_openai", content))
    assert err.value.status == 400 and problem in err.value.message
    assert "message.content" in err.value.message
    work = [await engine.redis.xlen(engine.store.work_key(p)) for p in range(16)]
    assert sum(work) == 0


async def test_a_poison_input_fails_the_running_turn_and_the_queued_one_runs(engine, vendor):
    """An input whose transition keeps raising is dead-lettered; the turn it was part of
    fails with `internal` (recorded as `input.rejected`), and the session goes on."""
    vendor.push(Text("slow", chunk_delay=0.2, chunks=5), Text("next"))
    client = Client(engine.store)
    first = await client.submit(say("ops_openai", "1"))
    sid = first["session_id"]
    queued = await client.submit(say("ops_openai", "2", queue=True), session_id=sid)
    await engine.store.enqueue(sid, {"kind": "TimerFired", "call_id": 5}, None)  # no attempt
    end = await wait_for_event(client, sid, turn_ended(first["turn_id"]))
    assert end["payload"]["type"] == "turn.failed"
    assert end["payload"]["error"]["code"] == "internal"
    assert "dead-letter" in end["payload"]["error"]["message"]
    end = await wait_for_event(client, sid, turn_ended(queued["turn_id"]))
    assert end["payload"]["type"] == "turn.completed"
    events = await assert_consistent(engine.store, sid)
    (rejected,) = payloads(events, "input.rejected")
    assert rejected["input_kind"] == "TimerFired" and "TypeError" in rejected["error"]["message"]
    (letter,) = await engine.store.dead_letters()
    assert letter["session_id"] == sid and letter["input"] == {"kind": "TimerFired", "call_id": 5}


async def test_a_task_that_loses_a_cancel_is_cancelled_again() -> None:
    """What Python 3.11's wait_for can do to a cancel (the serve that never exited)."""
    from engine.runtime.cancelling import cancel_and_wait

    never, waiting = asyncio.Event(), asyncio.Event()
    swallowed = []

    async def deaf_once() -> None:
        try:
            waiting.set()
            await never.wait()
        except asyncio.CancelledError:
            swallowed.append(True)  # lost, as if it had landed on a finished wait_for
        await never.wait()

    task = asyncio.create_task(deaf_once())
    await waiting.wait()
    await cancel_and_wait([task], patience=None)
    assert task.cancelled() and swallowed == [True]


async def test_a_submit_written_twice_to_redis_runs_one_turn(engine, vendor, monkeypatch):
    """redis-py sends a command again after a connection lost on the way back: the work
    entry can land twice. The turn id the client mints makes the second one a no-op."""
    vendor.push(Text("Once."), Text("Never."))
    store = engine.store
    written = store.request  # the submit's XADD, then its wait for the answer

    async def twice(session_id, inp, reply_to, timeout):
        await store.enqueue(session_id, inp, reply_to)  # the same entry, written once more
        return await written(session_id, inp, reply_to, timeout)

    monkeypatch.setattr(store, "request", twice)
    client = Client(store)
    reply = await client.submit(say("ops_openai", "hello", queue=True))  # as Slack sends
    assert reply["turn_id"].startswith("turn_")
    sid = reply["session_id"]
    await wait_for_event(client, sid, turn_ended(reply["turn_id"]))
    monkeypatch.undo()
    follow = await client.submit(say("ops_openai", "and now?"), session_id=sid)
    await wait_for_event(client, sid, turn_ended(follow["turn_id"]))
    events = await assert_consistent(store, sid)
    started = [e["turn_id"] for e in events if e["payload"]["type"] == "turn.started"]
    assert started == [reply["turn_id"], follow["turn_id"]]
    users = [p["message"]["content"] for p in payloads(events, "message.new")]
    assert users.count("hello") == 1


@pytest.mark.parametrize("which", [0, 1], ids=["reader", "processor"])
async def test_a_partition_whose_reader_or_processor_ended_is_taken_afresh(
    engine, vendor, caplog, which
):
    """Nothing should end a partition's work reader or processor while the engine runs;
    if something does (a bug's exception: here the task is cancelled from outside, as
    one), the next lease round says so and takes the partition afresh, so the sessions in
    it are read and applied again instead of waiting forever."""
    client = Client(engine.store)
    vendor.push(Text("first"))
    reply = await client.submit(say("ops_openai", "one"))
    sid = reply["session_id"]
    await wait_for_event(client, sid, turn_ended(reply["turn_id"]))
    p = engine.store.partition_of(sid)
    part = engine.owned[p]
    task = part.tasks[which]
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    vendor.push(Text("second"))
    again = await client.submit(say("ops_openai", "two"), session_id=sid)
    end = await wait_for_event(client, sid, turn_ended(again["turn_id"]))
    assert end["payload"]["type"] == "turn.completed"
    assert engine.owned[p] is not part  # a fresh partition, new tasks
    said = [
        r.getMessage() for r in caplog.records if "taking the partition afresh" in r.getMessage()
    ]
    assert said == [f"partition {p}: its task {task.get_name()} ended; taking the partition afresh"]
    await assert_consistent(engine.store, sid)
