"""Budget-policy usage across a SIGKILL of `subs serve` (issue #28 item 2): real processes on
one real Redis, the fake vendor. The usage survives the kill, and a charge the dead process
left in its outbox after applying it (killed between the bucket and the outbox's delete) is
applied again by the next process and counted once."""

from __future__ import annotations

import json
import signal
import textwrap
from pathlib import Path

import pytest

from engine.client import Client
from engine.config import parse_project
from engine.machine.evolve import at_ms
from engine.machine.policies import Charge, buckets_for, context_of
from engine.store.buckets import charge_message, seen_key, use_key
from engine.store.store import Store
from tests.engine_helpers import (
    assert_consistent,
    payloads,
    poll_until,
    project_toml,
    turn_ended,
    wait_for_event,
)
from tests.fakes.llm_vendor import FakeVendor, Text, ToolCalls

POLICY = """
[[budgets]]
name = "openai-hourly"
group_by = ["agent"]
match = { agent = "ops_openai" }
dimension = "total_tokens"
limit = 500
window = "1h"
"""


@pytest.fixture
def config(tmp_path: Path, vendor: FakeVendor) -> Path:
    """project_toml's agents with a per-agent token policy on ops_openai."""
    path = tmp_path / "subs.toml"
    retry = "retry = { llm = { backoff_base_secs = 0 } }"
    path.write_text(project_toml(vendor.url, retry=retry) + textwrap.dedent(POLICY))
    return path


def say(text: str) -> dict:
    return {
        "type": "client.message",
        "agent_id": "ops_openai",
        "message": {"role": "user", "content": text},
    }


async def units(redis, bucket_id: str) -> int:
    fields = await redis.hgetall(use_key(bucket_id))
    return sum(int(v) for k, v in fields.items() if not k.startswith(b"_"))


async def test_usage_survives_a_sigkill_and_a_charge_left_in_the_outbox_counts_once(
    redis, vendor, serve_processes, config
):
    # The first call asks the person (a client tool), the second answers at length (400
    # output tokens): the two fit in the 500-token bucket, and leave it spent.
    vendor.push(
        ToolCalls([("confirm", {"question": "restart the db?"})], text="Checking."),
        Text("word " * 400),
    )
    first = await serve_processes()
    store = await Store.open(redis)
    client = Client(store)
    identity = {"subject": {"issuer": "cli", "id": "alice"}, "metadata": {}}
    reply = await client.submit(say("the db is down"), identity=identity)
    sid, turn_id = reply["session_id"], reply["turn_id"]
    dispatched = await wait_for_event(
        client, sid, lambda e: e["payload"]["type"] == "tool.call.dispatched"
    )
    project = parse_project(config.read_text(), str(config), env={})
    [ref] = buckets_for(project.budgets, context_of(sid, "ops_openai", identity))
    await poll_until(lambda: redis.zcard(seen_key(ref.id)), 10, "the first call charged")

    first.kill()
    assert await first.stop() == -signal.SIGKILL

    # As if the dead process had been killed after the bucket counted the call but before
    # it dropped the charge from its partition's outbox: the entry is there again.
    events = await store.read_log(sid)
    [done] = [e for e in events if e["payload"]["type"] == "llm.call.completed"]
    p = done["payload"]
    charge = Charge(f"{sid}/{p['id']}/{p['attempt']}", at_ms(done), ((ref, p["usage"]["total"]),))
    outbox = store.outbox_key(store.partition_of(sid))
    await redis.xadd(outbox, {"m": json.dumps(charge_message(charge))})
    before = await units(redis, ref.id)
    assert before == p["usage"]["total"]

    await serve_processes()
    # The new owner relays its partition's outbox on taking it: the charge again, ignored.
    await poll_until(lambda: _empty(redis, outbox), 20, "the outbox relayed")
    assert await units(redis, ref.id) == before
    tool = dispatched["payload"]["id"]
    await client.submit({"type": "tool.result", "id": tool, "result": "yes"}, session_id=sid)
    end = await wait_for_event(client, sid, turn_ended(turn_id), timeout=30)
    assert end["payload"]["type"] == "turn.completed"
    total = end["payload"]["usage"]["total"]
    await poll_until(lambda: _equals(units(redis, ref.id), total), 10, "the second call charged")
    assert await redis.zcard(seen_key(ref.id)) == 2
    await assert_consistent(store, sid)

    # The bucket outlived the process that filled it: the next turn is refused.
    sent = len(vendor.requests)
    reply = await client.submit(say("and now?"), identity=identity)
    end = await wait_for_event(client, reply["session_id"], turn_ended(reply["turn_id"]))
    assert end["payload"]["type"] == "turn.failed"
    assert end["payload"]["error"]["detail"]["policy"] == "openai-hourly"
    assert len(vendor.requests) == sent
    assert payloads(await store.read_log(reply["session_id"]), "llm.call.requested") == []


async def _empty(redis, key: str) -> bool:
    return await redis.xlen(key) == 0


async def _equals(value, expected) -> bool:
    return await value == expected
