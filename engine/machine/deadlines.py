"""Deadline timers, derived from the state: every attempt in flight has one.

A call or decision attempt that is out (running, or an async tool waiting) is
armed with the timer its kind names (kinds.py: at its run deadline, with or
without grace; a subagent call: at its queue deadline until its child starts, then
at its total timeout), and so is every queued turn with a queue timeout;
the commit that starts the attempt also starts the timer, and the commit that
ends it cancels it; so is every open interrupt whose payload names an `expiresAt`.
Deriving the set from
the state before and after a step, rather than starting timers rule by rule,
means no path that dispatches an attempt can forget one: if the shell loses the
effect (a crash, a Redis restart, an exception), the timer still ends it.
"""

from __future__ import annotations

from .core import Kinds
from .effects import CancelTimer, StartTimer
from .inputs import CallDeadline, DecisionDeadline, InterruptDeadline, QueueDeadline
from .interrupts import expires_ms
from .kinds import BACKSTOP_GRACE_MS
from .state import SessionState

Deadline = CallDeadline | DecisionDeadline | QueueDeadline | InterruptDeadline
Armed = dict[tuple[str, str, int], tuple[int, Deadline]]


def armed(state: SessionState | None, kinds: Kinds) -> Armed:
    """The deadline timer each attempt in flight should have: key -> (due, input)."""
    out: Armed = {}
    if state is None:
        return out
    for call in state.calls.values():
        if call.status not in ("running", "waiting"):
            continue
        kind = kinds.of(call.kind, call.handler)
        due = None if kind is None else kind.deadline(call)
        if due is not None:
            out[("call", call.id, call.attempt)] = (due, CallDeadline(call.id, call.attempt))
    for queued in state.queue:
        due = queued.get("deadline_ms")
        if due is not None:
            out[("queue", queued["turn_id"], 0)] = (due, QueueDeadline(queued["turn_id"]))
    for iid, interrupt in state.interrupts.items():
        due = expires_ms(interrupt)
        if due is not None:
            out[("interrupt", iid, 0)] = (due, InterruptDeadline(iid))
    d = state.decision
    if d is not None and d.status in ("running", "waiting") and d.deadline is not None:
        out[("decision", d.id, d.attempt)] = (
            d.deadline + BACKSTOP_GRACE_MS,
            DecisionDeadline(d.id, d.attempt),
        )
    return out


def timer_changes(before: Armed, after: Armed) -> list[StartTimer | CancelTimer]:
    """Start the timers of attempts that went out; cancel those of attempts that ended."""
    changes: list[StartTimer | CancelTimer] = [
        CancelTimer(due, inp) for key, (due, inp) in before.items() if after.get(key) != (due, inp)
    ]
    changes += [
        StartTimer(due, inp) for key, (due, inp) in after.items() if before.get(key) != (due, inp)
    ]
    return changes


def wake_ms(state: SessionState | None, kinds: Kinds) -> int | None:
    """When the engine next wakes the session by itself (its earliest armed deadline:
    a call's, a decision's, a queued turn's, an interrupt's expiry); None when nothing
    is armed. What the admin list shows and sorts as `wake_at`."""
    dues = [due for due, _ in armed(state, kinds).values()]
    return min(dues) if dues else None
