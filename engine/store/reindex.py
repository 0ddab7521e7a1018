"""Indexing sessions the commit did not index: those written before the listing indexes
existed (once, at the first engine start or listing on this version), and a session
restored from an archive.

Each session is indexed as read at its seq (engine/store/lua/ix_build.lua): one a commit
moved in between is read again, and one a commit of this version already indexed is
left as it is, so two processes doing it at once agree.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import cast

from engine.machine import Kinds, default_kinds
from engine.machine.deadlines import wake_ms
from engine.machine.evolve import at_ms
from engine.store.index import scopes_of
from engine.store.keys import LEGACY_SESSIONS, META
from engine.store.snapshots import load_states
from engine.store.store import Store

log = logging.getLogger("subs.store")

DONE_FIELD = "indexes"  # in the meta hash: "1" once every older session is indexed
BATCH = 200


async def index_sessions(store: Store, session_ids: Sequence[str], kinds: Kinds) -> int:
    """Index these sessions where they are not yet; how many were indexed now."""
    pending = list(session_ids)
    done = 0
    for _ in range(5):  # a session that keeps moving is indexed by its own next commit
        if not pending:
            break
        async with store.redis.pipeline(transaction=False) as pipe:
            for sid in pending:
                pipe.hget(store.snap_key(sid), "ix")
            flags = await pipe.execute()
        pending = [sid for sid, flag in zip(pending, flags, strict=True) if not flag]
        if not pending:
            break
        states = await load_states(store, pending)
        lasts = await store.last_events(pending)
        again = []
        for sid, state, last in zip(pending, states, lasts, strict=True):
            if state is None:
                continue  # gone since it was listed
            written = await store.index_session(
                sid,
                state.seq,
                created_ms=state.created_at,
                last_ms=at_ms(last) if last else state.created_at,
                wake_ms=wake_ms(state, kinds),
                scopes=scopes_of(state.agent_id, not state.ancestry),
            )
            if written:
                done += 1
            else:
                again.append(sid)
        pending = again
    return done


async def ensure_indexes(store: Store, kinds: Kinds | None = None) -> None:
    """Index every session an older version wrote, once per store: a no-op (one HGET)
    after it has run to the end."""
    if await store.redis.hget(META, DONE_FIELD) == b"1":
        return
    kinds = kinds or default_kinds()
    keys = [store.sessions_key(p) for p in range(store.partitions)] + [LEGACY_SESSIONS]
    total = 0
    for key in keys:
        offset = 0
        while True:
            members = cast(list[bytes], await store.redis.zrange(key, offset, offset + BATCH - 1))
            if not members:
                break
            total += await index_sessions(store, [m.decode() for m in members], kinds)
            offset += len(members)
    if total:
        log.info("indexed %d sessions an older version wrote, for the admin list", total)
    await store.redis.hset(META, DONE_FIELD, "1")
