"""What `[[budgets]]` policies cost a step (engine/runtime/budgets.py, store/buckets.py):
only a step that starts a model call reads the session's buckets, and such a step is
refused exactly as when they were read before it; a settled call is charged to all its
buckets in one round trip. A real redis-server (its MONITOR shows every command the
engine sends), the fake vendor over loopback, the engine in this process."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from engine.client import Client
from engine.machine.policies import BucketRef, BudgetPolicy, Charge
from engine.store.buckets import charge_message, use_key
from engine.store.store import STORE_FAULTS, Store
from tests.engine_helpers import (
    assert_consistent,
    on_both_redis,
    payloads,
    poll_until,
    turn_ended,
    wait_for_event,
)
from tests.fakes.llm_vendor import Text, ToolCalls
from tests.test_budget_policies import Clock, bucket_units, ref_of, start

HOUR_MS = 3_600_000
LIMIT = 100_000
PER_AGENT = f"""\
[[budgets]]
name = "openai-hourly"
group_by = ["agent"]
match = {{ agent = "ops_openai" }}
dimension = "total_tokens"
limit = {LIMIT}
window = "1h"
"""
ALICE = {"subject": {"issuer": "cli", "id": "alice"}, "metadata": {}}
ASK = ToolCalls([("confirm", {"question": "go on?"})], text="Let me ask.")


class BucketReads:
    """Every command a client (not a script) sends to a budget bucket's keys, but the
    charge script's EVALSHA: the buckets' reads, as the server's MONITOR shows them."""

    def __init__(self, redis: Any) -> None:
        self.redis = redis
        self.reads: list[str] = []
        self._marks: dict[str, asyncio.Event] = {}
        self._n = 0

    @contextlib.asynccontextmanager
    async def watching(self) -> AsyncIterator[BucketReads]:
        started = asyncio.Event()
        task = asyncio.create_task(self._watch(started))
        try:
            await asyncio.wait_for(started.wait(), 10)
            await self.count()  # MONITOR is on: the first mark came through it
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _watch(self, started: asyncio.Event) -> None:
        async with self.redis.monitor() as monitor:
            started.set()
            async for info in monitor.listen():
                command = info["command"]
                words = command.split()
                if words and words[0] == "ECHO" and words[-1] in self._marks:
                    self._marks[words[-1]].set()
                elif info["client_type"] != "lua" and "{bud:" in command and words[0] != "EVALSHA":
                    self.reads.append(command)

    async def count(self) -> int:
        """The bucket reads the server ran before now (an ECHO sent now has come back
        through MONITOR, and the server runs commands in one order)."""
        self._n += 1
        mark = f"policy-reads-mark-{self._n}"
        self._marks[mark] = seen = asyncio.Event()
        await self.redis.echo(mark)
        await asyncio.wait_for(seen.wait(), 10)
        return len(self.reads)


async def ask_then_answer(
    client: Client, sid: str | None = None
) -> tuple[str, str, dict[str, Any]]:
    """A turn whose model asks the client's tool `confirm`: its session, turn and the
    tool's call, once requested."""
    body = {"type": "client.message", "agent_id": "ops_openai"}
    body["message"] = {"role": "user", "content": "restart the api?"}
    reply = await client.submit(body, session_id=sid, identity=ALICE)
    sid, turn_id = reply["session_id"], reply["turn_id"]
    requested = await wait_for_event(
        client, sid, lambda e: e["payload"]["type"] == "tool.call.requested"
    )
    return sid, turn_id, requested["payload"]


async def answer(client: Client, sid: str, call_id: str) -> None:
    await client.submit(
        {"type": "tool.result", "id": call_id, "result": "yes"}, session_id=sid, identity=ALICE
    )


async def test_only_a_step_that_starts_a_model_call_reads_the_buckets(redis, vendor, tmp_path):
    vendor.push(ASK, Text("Restarted."))
    engine = await start(redis, vendor, tmp_path, PER_AGENT, Clock())
    try:
        client = Client(engine.store)
        async with BucketReads(redis).watching() as reads:
            sid, turn_id, call = await ask_then_answer(client)
            # The submit started the model call: one read. The model's answer (the tool
            # asked, the call charged) started none: no read.
            assert await reads.count() == 1, reads.reads
            await answer(client, sid, call["id"])  # the model is asked again: a read
            end = await wait_for_event(client, sid, turn_ended(turn_id))
            assert end["payload"]["type"] == "turn.completed", end["payload"]
            assert await reads.count() == 2, reads.reads  # the last answer ended the turn
            assert all(r.startswith("HGETALL subs:{bud:") for r in reads.reads), reads.reads
        events = await assert_consistent(engine.store, sid)
        assert len(payloads(events, "llm.call.requested")) == 2
        ref = ref_of(engine, sid, "ops_openai")
        used = sum(p["usage"]["total"] for p in payloads(events, "llm.call.completed"))
        await poll_until(lambda: _equals(bucket_units(redis, ref), used), 10, "both charged")
    finally:
        await engine.stop()


async def test_a_session_in_no_bucket_reads_none_and_records_as_without_policies(
    redis, vendor, tmp_path
):
    """The policy matches another agent: this one's steps read no bucket, and its model
    call is recorded as with no policy at all (no estimate made for a bucket)."""
    vendor.push(Text("Hello."))
    engine = await start(redis, vendor, tmp_path, PER_AGENT, Clock())
    try:
        client = Client(engine.store)
        async with BucketReads(redis).watching() as reads:
            body = {"type": "client.message", "agent_id": "ops_anthropic"}
            body["message"] = {"role": "user", "content": "hi"}
            reply = await client.submit(body, identity=ALICE)
            sid = reply["session_id"]
            end = await wait_for_event(client, sid, turn_ended(reply["turn_id"]))
            assert end["payload"]["type"] == "turn.completed", end["payload"]
            assert await reads.count() == 0, reads.reads
        [requested] = payloads(await assert_consistent(engine.store, sid), "llm.call.requested")
        assert "estimate" not in requested
    finally:
        await engine.stop()


@on_both_redis
async def test_a_step_that_settles_a_tool_then_calls_the_model_is_refused_as_before(
    redis, vendor, tmp_path
):
    """The step answering the tool changes the state, then starts a model call that the
    bucket, spent meanwhile, does not allow: the call is not made and the turn fails with
    the bucket's figures, and the log holds that step once, run again from the stored
    state (the first pass, which let the call through, is not what is committed)."""
    vendor.push(ASK, Text("never sent"))
    engine = await start(redis, vendor, tmp_path, PER_AGENT, Clock())
    try:
        client = Client(engine.store)
        sid, turn_id, call = await ask_then_answer(client)
        ref = ref_of(engine, sid, "ops_openai")
        [first] = payloads(await client.events(sid), "llm.call.completed")
        used = first["usage"]["total"]
        await poll_until(lambda: _equals(bucket_units(redis, ref), used), 10, "the call charged")
        await top_up(engine.store, ref, LIMIT - used)  # another session spent the rest
        sent = len(vendor.requests)
        await answer(client, sid, call["id"])
        end = await wait_for_event(client, sid, turn_ended(turn_id))
        assert end["payload"]["type"] == "turn.failed", end["payload"]
        error = end["payload"]["error"]
        assert error["code"] == "budget_exceeded"
        detail = error["detail"]
        assert (detail["policy"], detail["group"]) == ("openai-hourly", "agent=ops_openai")
        assert (detail["allowed"], detail["spent"]) == (str(LIMIT), str(LIMIT))
        assert len(vendor.requests) == sent  # the call never reached the vendor
        events = await assert_consistent(engine.store, sid)
        assert len(payloads(events, "llm.call.requested")) == 1  # the first call only
        assert [p["id"] for p in payloads(events, "tool.call.completed")] == [call["id"]]
        assert payloads(events, "turn.failed") == [end["payload"]]
    finally:
        await engine.stop()


@on_both_redis
async def test_one_charge_reaches_every_bucket_and_counts_once(redis):
    """Three buckets (on a Cluster, in three slots) charged by one outbox entry, in one
    pipeline; applied again, none counts it; a server that lost its scripts (restarted)
    is given the script again."""
    store = await Store.open(redis)
    policy = BudgetPolicy("p", ("user",), "total_tokens", "100", "1h", HOUR_MS, "reject")
    refs = [BucketRef(policy, f"user=u{n}") for n in range(3)]
    now = 1_800_000_000_000
    charge = _charge("ses_1/llm_1/1", now, refs, 7)
    await redis.script_flush()
    assert await store.charge(charge, now) == 3
    assert await store.charge(charge, now + 1000) == 0
    await redis.script_flush()
    assert await store.charge({**charge, "id": "ses_1/llm_1/2"}, now) == 3
    uses = await store.read_buckets(refs, now)
    assert [u.used for u in uses] == ["14", "14", "14"]
    listed = await store.list_buckets(now)
    assert sorted(u.group for u in listed) == ["user=u0", "user=u1", "user=u2"]


@pytest.mark.parametrize("redis_url", ["cluster"], indirect=True)
async def test_a_master_without_the_script_is_given_it_and_each_bucket_counts_once(
    redis, redis_cluster
):
    """On a Cluster one master may lack the charge script (a replica just promoted)
    while the others run it: those charges are sent again, and each bucket counts the
    charge once, however the write was split."""
    store = await Store.open(redis)
    policy = BudgetPolicy("p", ("user",), "total_tokens", "100", "1h", HOUR_MS, "reject")
    by_port: dict[int, BucketRef] = {}
    n = 0
    while len(by_port) < 3:  # a bucket on each master
        ref = BucketRef(policy, f"user=u{n}")
        by_port.setdefault(redis.get_node_from_key(use_key(ref.id)).port, ref)
        n += 1
    refs = list(by_port.values())
    now = 1_800_000_000_000
    warm = _charge("ses_1/llm_0/1", now, refs, 1)
    assert await store.charge(warm, now) == 3  # every master has the script now
    lost = redis_cluster.masters()[1]
    with lost.client() as c:
        c.script_flush()
    charge = _charge("ses_1/llm_1/1", now, refs, 7)
    assert await store.charge(charge, now) == 3
    assert await store.charge(charge, now) == 0
    assert [u.used for u in await store.read_buckets(refs, now)] == ["8", "8", "8"]


async def test_connections_kept_for_the_buckets_are_dropped_when_their_server_goes(redis):
    """The store keeps a few connections for bucket reads and charges between calls (one
    server). When Redis drops its clients (a restart), the first write fails as a fault
    its caller waits out, and every kept connection goes with it: the next one works."""
    store = await Store.open(redis)
    policy = BudgetPolicy("p", ("user",), "total_tokens", "100", "1h", HOUR_MS, "reject")
    refs = [BucketRef(policy, "user=u0")]
    now = 1_800_000_000_000
    charge = _charge("ses_1/llm_1/1", now, refs, 7)
    assert await store.charge(charge, now) == 1
    reads = await asyncio.gather(*(store.read_buckets(refs, now) for _ in range(4)))
    assert [r[0].used for r in reads] == ["7"] * 4  # four at once: four connections kept
    await redis.client_kill_filter(_type="normal", skipme=True)
    with pytest.raises(STORE_FAULTS):
        await store.read_buckets(refs, now)
    assert (await store.read_buckets(refs, now))[0].used == "7"
    assert await store.charge({**charge, "id": "ses_1/llm_2/1"}, now) == 1


def _charge(charge_id: str, at_ms: int, refs: list[BucketRef], amount: int) -> dict[str, Any]:
    """A charge of `amount` to each of `refs`, as the commit writes it to the outbox."""
    charge = Charge(charge_id, at_ms, tuple((ref, amount) for ref in refs))
    return charge_message(charge)["charge"]


async def top_up(store: Store, ref: BucketRef, amount: int) -> None:
    at = int(Clock().now * 1000)
    assert await store.charge(_charge("ses_other/llm_9/1", at, [ref], amount), at) == 1


async def _equals(value: Any, expected: Any) -> bool:
    return await value == expected
