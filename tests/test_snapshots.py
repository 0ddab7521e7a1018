"""Snapshots rewritten now and then, the log's tail folded on load (engine/store/snapshots.py)."""

from __future__ import annotations

import json

import pytest

from engine.client import Client
from engine.machine import FOLD_VERSION, fold, state_to_json
from engine.runtime.engine import Engine
from engine.store.snapshots import Mark, load_state
from tests.engine_helpers import ENV, assert_consistent, make_project, turn_ended, wait_for_event
from tests.fakes.llm_vendor import Text


def test_a_snapshot_is_due_once_the_tail_weighs_as_much_as_the_state() -> None:
    mark = Mark(state_bytes=1000, tail_bytes=0)
    mark = mark.after(600, min_bytes=100)
    assert mark == Mark(1000, 600)
    assert mark.after(399, min_bytes=100) == Mark(1000, 999)
    assert mark.after(400, min_bytes=100) is None


def test_a_small_state_waits_for_the_floor() -> None:
    assert Mark(10, 0).after(50, min_bytes=100) == Mark(10, 50)
    assert Mark(10, 50).after(50, min_bytes=100) is None


@pytest.fixture
async def engine(redis, vendor, tmp_path):
    eng = Engine(make_project(tmp_path, vendor.url), redis, env=ENV, lease_ms=3000)
    await eng.start()
    yield eng
    await eng.stop()


async def run_turns(client: Client, vendor, sid: str | None, turns: int) -> str:
    for n in range(turns):
        vendor.push(Text(f"answer {n}", chunks=2))
        msg = {"role": "user", "content": f"question {n}"}
        reply = await client.submit(
            {"type": "client.message", "agent_id": "ops_openai", "message": msg},
            session_id=sid,
        )
        sid = reply["session_id"]
        await wait_for_event(client, sid, turn_ended(reply["turn_id"]))
    assert sid is not None
    return sid


async def test_a_long_session_rewrites_its_snapshot_now_and_then(engine, vendor, redis) -> None:
    engine.applier.snapshot_min_bytes = 2048
    client = Client(engine.store)
    written: list[int] = []  # the snapshot's `at` after each turn
    sid = await run_turns(client, vendor, None, 1)
    for _ in range(24):
        await run_turns(client, vendor, sid, 1)
        written.append(int(await redis.hget(engine.store.snap_key(sid), "at")))
        await assert_consistent(engine.store, sid)
    rewrites = len(set(written))
    assert 2 <= rewrites < 24, written  # neither never nor at every step
    # An engine that never saw the session (a cold cache) folds the tail and goes on.
    engine.applier.forget(engine.store.partition_of(sid))
    await run_turns(client, vendor, sid, 2)
    await assert_consistent(engine.store, sid)


async def test_a_snapshot_written_before_tails_existed_still_loads(engine, vendor, redis) -> None:
    """A hash with `seq` and `state` and no `at` (an older engine's) is the state at `seq`;
    the next step that does not rewrite it records where it stands."""
    client = Client(engine.store)
    sid = await run_turns(client, vendor, None, 2)
    key = engine.store.snap_key(sid)
    events = await engine.store.read_log(sid)
    folded = fold(json.loads(json.dumps(events)))
    assert folded is not None
    await redis.hset(key, mapping={"seq": len(events), "state": json.dumps(state_to_json(folded))})
    await redis.hdel(key, "at")
    engine.applier.forget(engine.store.partition_of(sid))
    state = await load_state(engine.store, sid)
    assert state is not None and state_to_json(state) == state_to_json(folded)
    await run_turns(client, vendor, sid, 1)
    assert int(await redis.hget(key, "at")) == len(events)
    await assert_consistent(engine.store, sid)


@pytest.mark.parametrize("version", [None, FOLD_VERSION - 1, FOLD_VERSION + 1])
async def test_a_snapshot_another_fold_version_wrote_is_refolded_from_the_log(
    engine, vendor, redis, version
) -> None:
    """Its state is not trusted (here it is wrong on purpose): readers and the engine fold
    the log, and the next commit rewrites the snapshot under this version."""
    client = Client(engine.store)
    sid = await run_turns(client, vendor, None, 2)
    key = engine.store.snap_key(sid)
    events = await engine.store.read_log(sid)
    folded = fold(json.loads(json.dumps(events)))
    assert folded is not None
    stale = state_to_json(folded)
    stale["cost"], stale["turns"] = "999", {}
    if version is None:
        del stale["fold_version"]
    else:
        stale["fold_version"] = version
    await redis.hset(
        key, mapping={"seq": len(events), "state": json.dumps(stale), "at": len(events)}
    )
    engine.applier.forget(engine.store.partition_of(sid))
    state = await load_state(engine.store, sid)
    assert state is not None and state_to_json(state) == state_to_json(folded)
    await run_turns(client, vendor, sid, 1)
    snapshot = json.loads(await redis.hget(key, "state"))
    assert snapshot["fold_version"] == FOLD_VERSION and snapshot["cost"] != "999"
    await assert_consistent(engine.store, sid)
