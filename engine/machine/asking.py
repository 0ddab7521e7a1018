"""Asking for a decision (SPEC §3-§5): who decides, the session's one decision slot, its
queue, and the attempts of the decision in it.

For an engine-decided agent a trigger's proposal is the decision: recorded as a fact
(`Proposal`) that `advance` (step.py) applies. For a worker, the trigger takes the
session's one decision slot (or waits for it in `pending`); the worker's answer is
checked and applied by decisions.py. A decision that fails is tried again under the
"decision" policy, or fails its turn.
"""

from __future__ import annotations

from typing import Any

from . import events as ev
from . import retry
from .core import Proposal, Step, iso
from .effects import RunDecision, StartTimer
from .ending import fail_turn
from .inputs import CallLost, DecisionDeadline, DecisionFailed, DecisionTimerFired
from .retry import Fault, run_deadline
from .shapes import Answer, Done, ErrorInfo, Trigger, TurnFinished
from .state import Decision

# -- who decides -----------------------------------------------------------------


def decide(st: Step, trigger: Trigger, proposed: Answer) -> None:
    """`trigger` calls for a decision, `proposed` is the engine's proposal for it."""
    if not st.by_worker:
        st.record(Proposal(trigger, proposed))
        st.out.decided.append(trigger["type"])
    elif st.s.decision is not None or st.s.pending:
        st.emit({"type": ev.DECISION_QUEUED, "trigger": trigger, "proposed": proposed})
    else:
        dispatch_decision(st, trigger, proposed, from_queue=False)


def dispatch_decision(st: Step, trigger: Trigger, proposed: Answer, *, from_queue: bool) -> None:
    """Send `trigger` to the worker as a new decision, attempt 1, under the decision policy."""
    decision_id = st.ids("dec")
    # Before session.start is answered, the file's config (its proposal) sets the policy.
    agent = st.s.agent if st.s.agent is not None else proposed.get("agent")
    policy = st.kinds.policy("decision", agent)
    deadline = run_deadline(policy, st.now)
    st.emit(
        {
            "type": ev.DECISION_DISPATCHED,
            "decision_id": decision_id,
            "trigger": trigger,
            "proposed": proposed,
            "attempt": 1,
            "deadline_ms": deadline,
            "retry": policy,
            "from_queue": from_queue,
        }
    )
    st.out.effects.append(RunDecision(decision_id, 1, deadline))


def redispatch(st: Step, decision: Decision, attempt: int) -> None:
    """Send the live decision again as attempt `attempt`, under a new run deadline."""
    deadline = run_deadline(decision.retry, st.now)
    st.emit(
        {
            "type": ev.DECISION_DISPATCHED,
            "decision_id": decision.id,
            "attempt": attempt,
            "deadline_ms": deadline,
        }
    )
    st.out.effects.append(RunDecision(decision.id, attempt, deadline))


def dispatch_pending(st: Step) -> None:
    """Give the free decision slot to the oldest waiting trigger."""
    nxt = st.s.pending[0]
    dispatch_decision(st, nxt["trigger"], nxt["proposed"], from_queue=True)


def finish_with_worker(st: Step, data: Any) -> None:
    """Ask the worker one last time, with `turn.finished`: the turn has nothing in flight."""
    turn = st.s.turn
    assert turn is not None
    trigger: TurnFinished = {
        "type": "turn.finished",
        "turn_id": turn.id,
        "cost": turn.cost,
        "usage": turn.usage,
    }
    done: Done = {"type": "done"}
    if data is not None:
        trigger["data"] = data
        done["data"] = data
    decide(st, trigger, {"actions": [done]})


# -- the decision's attempts -------------------------------------------------------


def live_decision(st: Step, decision_id: str, attempt: int) -> Decision | None:
    """The decision an answer is for, if it is still the one waited on; else ignored."""
    d = st.s.decision
    if d is None or d.id != decision_id:
        st.ignore(f"decision {decision_id!r} is not live (answered already?)")
        return None
    if d.status not in ("running", "waiting") or d.attempt != attempt:
        st.ignore(f"decision {decision_id!r} attempt {attempt} was replaced (now {d.attempt})")
        return None
    return d


def decision_failed_input(st: Step, inp: DecisionFailed) -> None:
    """A delivery of the live decision failed: retry or fail the turn."""
    d = live_decision(st, inp.decision_id, inp.attempt)
    if d is not None:
        decision_failed(st, d, inp.error, inp.retryable)


def decision_lost(st: Step, inp: CallLost) -> None:
    """The engine waiting on the decision stopped: retry at once."""
    d = live_decision(st, inp.call_id, inp.attempt)
    if d is not None:
        lost = Fault.LOST
        error = lost.error("the engine waiting for this decision stopped")
        decision_failed(st, d, error, lost.retryable, at_once=True)


def decision_failed(
    st: Step, d: Decision, error: ErrorInfo, retryable: bool, *, at_once: bool = False
) -> None:
    """Retry the delivery under the decision policy, or fail the turn cleanly."""
    nxt = retry.after_failure(
        d.retry, d.attempt, d.started_at, st.now, retryable=retryable, at_once=at_once
    )
    st.emit(
        {
            "type": ev.DECISION_ERRORED,
            "decision_id": d.id,
            "attempt": d.attempt,
            "error": error,
            "retryable": retryable,
            "final": nxt.final,
        }
    )
    if nxt.final:
        if st.s.turn is not None:
            fail_turn(st, error)
        return
    next_attempt = d.attempt + 1
    if nxt.due <= st.now:
        redispatch(st, d, next_attempt)
        return
    st.emit(
        {
            "type": ev.CALL_RETRY_SCHEDULED,
            "kind": "decision",
            "id": d.id,
            "attempt": next_attempt,
            "due_at": iso(nxt.due),
        }
    )
    st.out.effects.append(StartTimer(nxt.due, DecisionTimerFired(d.id, next_attempt)))


def decision_deadline(st: Step, inp: DecisionDeadline) -> None:
    """The worker did not answer in time: a failed attempt like any other."""
    d = live_decision(st, inp.decision_id, inp.attempt)
    if d is not None:
        late = Fault.DEADLINE
        error = late.error(
            f"the worker did not answer decision {d.id!r} (attempt {d.attempt}) before its deadline"
        )
        decision_failed(st, d, error, late.retryable)


def decision_timer_fired(st: Step, inp: DecisionTimerFired) -> None:
    """A backoff ended: send the decision's next attempt, unless the timer is stale."""
    d = st.s.decision
    if d is None or d.id != inp.decision_id or d.status != "retry_scheduled":
        st.ignore(f"timer for decision {inp.decision_id!r} is stale")
        return
    if inp.attempt != d.attempt + 1:
        st.ignore(f"timer for decision {inp.decision_id!r} attempt {inp.attempt} is stale")
        return
    redispatch(st, d, inp.attempt)
