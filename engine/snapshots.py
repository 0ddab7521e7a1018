"""When a session's full snapshot is rewritten, and how a reader catches it up.

Rewriting the whole state at every step made a step's cost grow with the session's
history. A step now writes its events and moves the snapshot's `seq`; the full
state is rewritten once the events written since the last one weigh as much as
the state itself (and at least `SNAPSHOT_MIN_BYTES`), the rule Redis uses to
rewrite its AOF. Bytes written per step stay within about twice the step's own
events whatever the history, and a reader folds at most one snapshot's worth of
events onto the state it loads.
"""

from __future__ import annotations

from dataclasses import dataclass

from .machine import SessionState, evolve, state_from_json
from .store import Snapshot, Store

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
    return Mark(snap.state_bytes, snap.tail_bytes)


def state_of(snap: Snapshot) -> SessionState:
    """The session as of `snap.seq`: the stored state with the log's tail folded on."""
    state = state_from_json(snap.state)
    for event in snap.tail:
        state = evolve(state, event)
    return state


async def load_state(store: Store, session_id: str) -> SessionState | None:
    snap = await store.load_snapshot(session_id)
    return None if snap is None else state_of(snap)
