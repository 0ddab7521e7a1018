"""When a session's full snapshot is rewritten, and how a reader catches it up.

Rewriting the whole state at every step made a step's cost grow with the session's
history. A step now writes its events and moves the snapshot's `seq`; the full
state is rewritten once the events written since the last one weigh as much as
the state itself (and at least `SNAPSHOT_MIN_BYTES`), the rule Redis uses to
rewrite its AOF. Bytes written per step stay within about twice the step's own
events whatever the history, and a reader folds at most one snapshot's worth of
events onto the state it loads.

A snapshot is a cache of the fold, valid only for the version of the fold that wrote
it (`FOLD_VERSION`): one written by another version is ignored and the log folded
again (`load`), and the next commit rewrites it.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.machine import FOLD_VERSION, SessionState, evolve, fold, state_from_json
from engine.store.store import Snapshot, Store

SNAPSHOT_MIN_BYTES = 64 * 1024


@dataclass(frozen=True)
class Mark:
    """What a session's stored snapshot looks like: its size, and the log written since."""

    state_bytes: int
    tail_bytes: int

    def after(self, written: int, min_bytes: int) -> Mark | None:
        """The mark once `written` more bytes of events are logged; None: time to rewrite."""
        tail = self.tail_bytes + written
        if tail >= max(min_bytes, self.state_bytes):
            return None
        return Mark(self.state_bytes, tail)


def mark_of(snap: Snapshot) -> Mark:
    """The snapshot's sizes, to decide when the next one is due."""
    return Mark(snap.state_bytes, snap.tail_bytes)


def current(snap: Snapshot) -> bool:
    """Whether this version's fold wrote the snapshot's state."""
    return snap.state.get("fold_version") == FOLD_VERSION


def state_of(snap: Snapshot) -> SessionState:
    """The session as of `snap.seq`: the stored state with the log's tail folded on.
    Only for a `current` snapshot (`load` checks)."""
    state = state_from_json(snap.state)
    for event in snap.tail:
        state = evolve(state, event)
    return state


async def load(store: Store, session_id: str, snap: Snapshot) -> SessionState:
    """The session as of `snap.seq`; from the log's first `snap.seq` events when the
    snapshot was written by another version of the fold."""
    if current(snap):
        return state_of(snap)
    state = fold(await store.read_log(session_id, count=snap.seq))
    if state is None or state.seq != snap.seq:
        raise ValueError(f"session {session_id!r}: the log does not reach its snapshot's seq")
    return state


async def load_state(store: Store, session_id: str) -> SessionState | None:
    """The session's current state from Redis; None for no session."""
    snap = await store.load_snapshot(session_id)
    return None if snap is None else await load(store, session_id, snap)


async def load_states(store: Store, session_ids: list[str]) -> list[SessionState | None]:
    """`load_state` for a page of sessions, in a few round trips rather than a few each."""
    snaps = await store.load_snapshots(session_ids)
    return [
        None if snap is None else await load(store, sid, snap)
        for sid, snap in zip(session_ids, snaps, strict=True)
    ]
