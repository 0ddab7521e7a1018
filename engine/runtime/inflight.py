"""What a crash would leave unanswered: the requests a session has out with its engine.

Every commit records whether the session has one (`has_inflight`: the partition's set
of sessions with requests out), and the next owner of a dead engine's partition reads
that set and sends each again (`lost_work`). Pure: the kinds table says which calls
are requests of this engine's.
"""

from __future__ import annotations

from engine.machine import Call, CallLost, Kinds, SessionState


def lost_work(state: SessionState | None, kinds: Kinds) -> list[CallLost]:
    """What a dead engine had out for this session: to be sent again."""
    if state is None:
        return []
    lost = [
        CallLost(c.id, c.attempt)
        for c in state.calls.values()
        if c.status == "running" and _in_flight(c, kinds)
    ]
    if state.decision is not None and state.decision.status == "running":
        lost.append(CallLost(state.decision.id, state.decision.attempt))
    return lost


def has_inflight(state: SessionState | None, kinds: Kinds) -> bool:
    """Whether a crash would leave one of this session's requests unanswered (every step
    asks: `lost_work`'s answer, without building it)."""
    if state is None:
        return False
    if state.decision is not None and state.decision.status == "running":
        return True
    return any(c.status == "running" and _in_flight(c, kinds) for c in state.calls.values())


def _in_flight(call: Call, kinds: Kinds) -> bool:
    """Whether the call's attempt is a request of this engine's (its kind says, kinds.py)."""
    kind = kinds.of(call.kind, call.handler)
    return kind is not None and kind.in_flight
