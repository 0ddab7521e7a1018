"""Deadline timers, derived from the state: every attempt in flight has one.

A call or decision attempt that is out (running, or an async tool waiting) is
armed with a timer at its run deadline (a subagent call: at its total timeout);
the commit that starts the attempt also starts the timer, and the commit that
ends it cancels it. Deriving the set from
the state before and after a step, rather than starting timers rule by rule,
means no path that dispatches an attempt can forget one: if the shell loses the
effect (a crash, a Redis restart, an exception), the timer still ends it.
"""

from __future__ import annotations

from .effects import CancelTimer, StartTimer
from .inputs import CallDeadline, DecisionDeadline
from .state import SessionState

# The shell enforces an engine-run attempt's deadline itself and reports it with the
# better message; the timer is the backstop for a shell that lost the attempt. A
# worker tool's timer is its only deadline (it may be waiting, async), so no grace.
BACKSTOP_GRACE_MS = 1000

Armed = dict[tuple[str, str, int], tuple[int, CallDeadline | DecisionDeadline]]


def armed(state: SessionState | None) -> Armed:
    """The deadline timer each attempt in flight should have: key -> (due, input)."""
    out: Armed = {}
    if state is None:
        return out
    for call in state.calls.values():
        if call.status not in ("running", "waiting"):
            continue
        if call.handler == "subagent":
            # A child session's turn ends by its own deadlines; this bounds the whole run.
            total = call.retry.get("total_timeout_secs")
            if total is not None:
                due = call.started_at + int(total * 1000)
                out[("call", call.id, call.attempt)] = (due, CallDeadline(call.id, call.attempt))
            continue
        if call.deadline is None or call.handler not in ("server", "worker"):
            continue
        grace = 0 if (call.handler, call.kind) == ("worker", "tool") else BACKSTOP_GRACE_MS
        out[("call", call.id, call.attempt)] = (
            call.deadline + grace,
            CallDeadline(call.id, call.attempt),
        )
    d = state.decision
    if d is not None and d.status == "running" and d.deadline is not None:
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
