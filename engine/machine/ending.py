"""How a turn ends (SPEC §2, §10): completed, failed, or dropped from the queue before it
ran; what it still has open closed, each call with an event of its own; its parent told.

The bottom of the rules: these only record what ended. What follows (the next queued
turn, a parent's answer applied) is `advance`'s (step.py) or another session's.
"""

from __future__ import annotations

from typing import Any

from . import events as ev
from .core import Step
from .effects import Deliver
from .inputs import SubagentFinished
from .shapes import ErrorInfo
from .state import ZERO_USAGE, Call, Turn


def open_calls(st: Step) -> list[Call]:
    """The running turn's calls still open."""
    turn = st.s.turn
    return [c for c in st.s.calls.values() if turn is not None and c.turn_id == turn.id]


def busy(st: Step) -> bool:
    """Anything still in flight or waiting in this turn."""
    s = st.s
    return bool(open_calls(st) or s.decision or s.pending or s.interrupts or s.held)


def end_turn(st: Step, data: Any) -> None:
    """Complete the turn, closing whatever it left open first."""
    turn = st.s.turn
    assert turn is not None
    close_open_calls(st)
    payload: ev.TurnCompleted = {
        "type": ev.TURN_COMPLETED,
        "turn_id": turn.id,
        "cost": turn.cost,
        "usage": turn.usage,
    }
    if data is not None:
        payload["data"] = data
    st.emit(payload)
    tell_parent(st, turn, ok=True, error=None)


def fail_turn(st: Step, error: ErrorInfo) -> None:
    """Fail the turn with `error`, closing whatever it left open first."""
    turn = st.s.turn
    assert turn is not None
    close_open_calls(st)
    st.emit(
        {
            "type": ev.TURN_FAILED,
            "turn_id": turn.id,
            "error": error,
            "cost": turn.cost,
            "usage": turn.usage,
        }
    )
    tell_parent(st, turn, ok=False, error=error)


def drop_queued(st: Step, turn_id: str, error: ErrorInfo) -> None:
    """A queued turn ends before it starts: `turn.failed` under its own id."""
    st.emit(
        {
            "type": ev.TURN_FAILED,
            "turn_id": turn_id,
            "error": error,
            "cost": "0",
            "usage": dict(ZERO_USAGE),
        },
        turn_id,
    )


def close_open_calls(st: Step) -> None:
    """A turn that ends closes what it still has open, each with an event of its own;
    the kind of each says whom its early end must be told (a subagent call: its child)."""
    for call in open_calls(st):
        kind = st.kinds.of(call.kind, call.handler)
        if kind is not None and kind.stop is not None:
            kind.stop(st, call)
        st.emit(
            {
                "type": ev.call_event(call.kind, "errored"),
                "id": call.id,
                "attempt": call.attempt,
                "error": {
                    "message": "the turn ended before the call finished",
                    "code": "internal",
                    "detail": {"reason": "turn_ended"},
                },
                "retryable": False,
                "final": True,
            }
        )


def tell_parent(st: Step, turn: Turn, *, ok: bool, error: ErrorInfo | None) -> None:
    """A child's turn ended: its parent's call gets the last reply, usage and cost."""
    if turn.parent is None:
        return
    head = st.s.nodes.get(st.s.head_id or "")
    reply = head.message if head is not None and head.message["role"] == "assistant" else {}
    content = reply.get("content")
    finished = SubagentFinished(
        child_session=st.session_id,
        call_id=turn.parent["call_id"],
        agent_id=st.s.agent_id,
        ok=ok,
        result=content if isinstance(content, str) else None,
        error=error,
        usage=turn.usage,
        cost=turn.cost,
        attempt=turn.parent.get("attempt", 1),
    )
    st.out.effects.append(Deliver(turn.parent["session_id"], finished))
