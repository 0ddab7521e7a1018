"""Engines as separate OS processes on one real Redis: crash recovery and shared partitions."""

from __future__ import annotations

import asyncio
import signal
from collections import Counter

from engine.client import Client
from engine.store.store import Store
from tests.engine_helpers import (
    LEASE_MS,
    assert_consistent,
    on_both_redis,
    payloads,
    poll_until,
    turn_ended,
    wait_for_event,
)
from tests.fakes.llm_vendor import Text


async def lease_owners(redis, store: Store) -> dict[int, str]:
    owners = {}
    for p in range(store.partitions):
        value = await redis.get(store.lease_key(p))
        if value:
            owners[p] = value.decode().rsplit(":", 1)[0]
    return owners


def say(text: str, **extra) -> dict:
    message = {"role": "user", "content": text}
    return {"type": "client.message", "agent_id": "ops_openai", "message": message, **extra}


@on_both_redis
async def test_sigkill_mid_stream_then_a_new_engine_completes_the_turn(
    redis, vendor, serve_processes
):
    slow = " ".join(f"word{i}" for i in range(60))
    vendor.push(Text(slow, chunk_delay=0.05), Text("The final answer.", chunks=3))
    first = await serve_processes()
    store = await Store.open(redis)
    client = Client(store)
    reply = await client.submit(say("why is it paging?"))
    sid, turn_id = reply["session_id"], reply["turn_id"]

    # Kill the engine while the model's answer is half-way through streaming.
    async def streaming() -> bool:
        return len(await redis.xrange(store.delta_key(sid))) >= 5

    await poll_until(streaming, 20, "the first deltas")
    first.kill()
    assert await first.stop() == -signal.SIGKILL

    await serve_processes()
    end = await wait_for_event(client, sid, turn_ended(turn_id), timeout=30)
    assert end["payload"]["type"] == "turn.completed"

    events = await assert_consistent(store, sid)
    turn_events = [e for e in events if e.get("turn_id") == turn_id]
    replies = [
        p["message"]
        for p in payloads(turn_events, "message.new")
        if p["message"]["role"] == "assistant"
    ]
    assert [r["content"] for r in replies] == ["The final answer."]
    assert [p["attempt"] for p in payloads(events, "llm.call.dispatched")] == [1, 2]
    lost = payloads(events, "llm.call.errored")
    assert len(lost) == 1 and lost[0]["attempt"] == 1 and not lost[0]["final"]
    assert len(vendor.requests) == 2


@on_both_redis
async def test_two_engines_share_partitions_and_take_over_a_dead_ones(
    redis, vendor, serve_processes
):
    vendor.default = Text("ok")
    a = await serve_processes()
    b = await serve_processes()
    store = await Store.open(redis)

    async def balanced() -> dict[int, str] | None:
        owners = await lease_owners(redis, store)
        counts = Counter(owners.values())
        fair = store.partitions // 2
        if len(owners) == store.partitions and counts[a.owner] == counts[b.owner] == fair:
            return owners
        return None

    owners = await poll_until(balanced, 15, "both engines to own half the partitions")

    # Sessions on both engines; each session's inputs are applied in the order sent.
    client = Client(store)
    sessions = [f"order-{i}" for i in range(8)]
    assert {owners[store.partition_of(s)] for s in sessions} == {a.owner, b.owner}
    last: dict[str, str] = {}
    for sid in sessions:
        await client.submit(say(f"{sid} 0"), session_id=sid)
        for n in range(1, 4):
            queued = await client.submit(say(f"{sid} {n}", queue=True), session_id=sid)
            last[sid] = queued["turn_id"]
    for sid in sessions:
        await wait_for_event(client, sid, turn_ended(last[sid]))
        events = await assert_consistent(store, sid)
        users = [
            p["message"]["content"]
            for p in payloads(events, "message.new")
            if p["message"]["role"] == "user"
        ]
        assert users == [f"{sid} {n}" for n in range(4)]

    # Kill one: its partitions move to the survivor within the lease time (plus a renew round).
    a.kill()
    killed_at = asyncio.get_running_loop().time()

    async def all_on_b() -> bool:
        owners = await lease_owners(redis, store)
        return len(owners) == store.partitions and set(owners.values()) == {b.owner}

    await poll_until(all_on_b, 10, "the survivor to own every partition")
    moved_after = asyncio.get_running_loop().time() - killed_at
    assert moved_after < LEASE_MS / 1000 + 2.0, moved_after

    # A session that lived on the dead engine still works.
    orphan = next(s for s in sessions if owners[store.partition_of(s)] == a.owner)
    reply = await client.submit(say("still there?"), session_id=orphan)
    end = await wait_for_event(client, orphan, turn_ended(reply["turn_id"]))
    assert end["payload"]["type"] == "turn.completed"
    await assert_consistent(store, orphan)
