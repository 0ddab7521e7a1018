"""The engine's state cache lets go (issue 27): bounded by count and estimated bytes,
least recently used out first, empty once every session is deleted; a miss refolds."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.client import Client
from engine.config import parse_project
from engine.machine import SessionState, state_to_json
from engine.runtime.cache import StateCache, estimate
from engine.runtime.engine import Engine
from engine.store.snapshots import Mark, load_state
from tests.engine_helpers import ENV, make_project, turn_ended, wait_for_event
from tests.fakes.llm_vendor import Text


def _state(sid: str) -> SessionState:
    return SessionState(session_id=sid, agent_id="a", decider="engine", created_at=0)


SIDS = [f"s{n}" for n in range(12)]
touch = st.tuples(st.just("touch"), st.sampled_from(SIDS), st.integers(0, 40_000))
delete = st.tuples(st.just("delete"), st.sampled_from(SIDS), st.just(0))


@settings(max_examples=300, deadline=None)
@given(
    ops=st.lists(st.one_of(touch, delete), max_size=80),
    max_sessions=st.integers(1, 8),
    max_kb=st.integers(8, 200),
)
def test_the_cache_never_exceeds_its_bound_and_empties_when_every_session_is_deleted(
    ops, max_sessions, max_kb
):
    cache = StateCache(max_kb * 1024, max_sessions)
    recent: list[str] = []  # most recently used last, as the cache should order them
    for op, sid, size in ops:
        if op == "touch":
            cache.put(sid, _state(sid), Mark(size, 0), size)
            if sid in recent:
                recent.remove(sid)
            if estimate(size) <= cache.max_bytes:
                recent.append(sid)
        else:
            cache.drop(sid)
            if sid in recent:
                recent.remove(sid)
        assert len(cache) <= max_sessions
        assert cache.bytes <= cache.max_bytes
        assert cache.bytes >= 0
        # What is cached is the most recently used tail of what was touched.
        cached = [s for s in recent if s in cache]
        assert cached == recent[len(recent) - len(cached) :]
        for s in cached:
            assert cache.get(s) is not None
            recent.remove(s)
            recent.append(s)
    for sid in SIDS:
        cache.drop(sid)
    assert len(cache) == 0 and cache.bytes == 0


async def test_an_engine_with_a_small_cache_refolds_on_a_miss_and_forgets_deleted_sessions(
    redis, vendor, tmp_path
):
    """Three sessions through a cache of two: the evicted one is read again from Redis
    (its next turn runs on its whole history); deleting them all leaves the cache empty."""
    project = make_project(tmp_path, vendor.url)
    path = tmp_path / "subs.toml"
    path.write_text(path.read_text() + "\n[serve]\nstate_cache_sessions = 2\n")
    project = parse_project(path.read_text(), str(path), env={})
    eng = Engine(project, redis, env=ENV, lease_ms=3000)
    await eng.start()
    try:
        client = Client(eng.store)
        vendor.push(*(Text(f"r{n}") for n in range(4)))
        sids = []
        for n in range(3):
            msg = {"role": "user", "content": f"m{n}"}
            reply = await client.submit(
                {"type": "client.message", "agent_id": "ops_openai", "message": msg}
            )
            sids.append(reply["session_id"])
            await wait_for_event(client, reply["session_id"], turn_ended(reply["turn_id"]))
        assert len(eng.applier.cache) == 2 and sids[0] not in eng.applier.cache
        msg = {"role": "user", "content": "again"}
        reply = await client.submit(
            {"type": "client.message", "agent_id": "ops_openai", "message": msg}, session_id=sids[0]
        )
        await wait_for_event(client, sids[0], turn_ended(reply["turn_id"]))
        state = await load_state(eng.store, sids[0])
        assert state is not None and sids[0] in eng.applier.cache
        assert state_to_json(eng.applier.cache.get(sids[0])) == state_to_json(state)
        assert len(state.turns) == 2  # the miss refolded its first turn too
        for sid in sids:
            await client.delete(sid)
        assert len(eng.applier.cache) == 0 and eng.applier.cache.bytes == 0
    finally:
        await eng.stop()
