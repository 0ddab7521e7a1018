"""Decisions (SPEC §3-§5): who decides, the one live decision, applying an answer.

For an engine-decided agent a trigger's proposal is applied at once. For a
worker, the trigger takes the session's one decision slot (or waits for it),
and the worker's answer is checked against the session before any of it is
applied: an answer that names a call that is not open, or an attempt a retry
replaced, is a failed attempt with a precise reason, never a half-applied one.
"""

from __future__ import annotations

from typing import Any

from . import calls, connectors, retry, turns
from . import events as ev
from .core import Step, iso
from .effects import RunDecision, StartTimer
from .inputs import (
    CallLost,
    DecisionAnswered,
    DecisionDeadline,
    DecisionFailed,
    DecisionTimerFired,
    ExecuteAnswered,
    ExecuteFailed,
)
from .retry import Fault, run_deadline
from .state import Call, Decision
from .tools import tool_result_of
from .tree import id_clash

_SETTLES = {"tool.result": "tool", "tool.error": "tool", "llm.result": "llm", "llm.error": "llm"}


# -- who decides -----------------------------------------------------------------


def decide(st: Step, trigger: dict[str, Any], proposed: dict[str, Any]) -> None:
    if not st.by_worker:
        apply_decision(st, proposed, trigger)
    elif st.s.decision is not None or st.s.pending:
        st.emit({"type": ev.DECISION_QUEUED, "trigger": trigger, "proposed": proposed})
    else:
        dispatch_decision(st, trigger, proposed, from_queue=False)


def dispatch_decision(
    st: Step, trigger: dict[str, Any], proposed: dict[str, Any], *, from_queue: bool
) -> None:
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


def advance(st: Step) -> None:
    """Give the free decision slot to the oldest waiting trigger."""
    s = st.s
    if s.turn is not None and s.decision is None and s.pending:
        nxt = s.pending[0]
        dispatch_decision(st, nxt["trigger"], nxt["proposed"], from_queue=True)


# -- answers ---------------------------------------------------------------------


def live_decision(st: Step, decision_id: str, attempt: int) -> Decision | None:
    d = st.s.decision
    if d is None or d.id != decision_id:
        st.ignore(f"decision {decision_id!r} is not live (answered already?)")
        return None
    if d.status != "running" or d.attempt != attempt:
        st.ignore(f"decision {decision_id!r} attempt {attempt} was replaced (now {d.attempt})")
        return None
    return d


def decision_answered(st: Step, inp: DecisionAnswered) -> None:
    d = live_decision(st, inp.decision_id, inp.attempt)
    if d is None:
        return
    problem = check_response(st, inp.response, d.trigger)
    if problem is not None:
        invalid = Fault.INVALID_RESPONSE
        decision_failed(st, d, invalid.error(problem), invalid.retryable)
        return
    st.emit({"type": ev.DECISION_COMPLETED, "decision_id": d.id, "attempt": d.attempt})
    apply_decision(st, inp.response, d.trigger)
    if d.trigger["type"] == "turn.finished" and st.s.turn is not None and not turns.busy(st):
        turns.end_turn(st, None)  # asked once more and still nothing to do: the turn is over
    after_decision(st)


def after_decision(st: Step) -> None:
    if st.s.turn is not None:
        advance(st)
        turns.settle_turn(st)


def decision_failed_input(st: Step, inp: DecisionFailed) -> None:
    d = live_decision(st, inp.decision_id, inp.attempt)
    if d is not None:
        decision_failed(st, d, inp.error, inp.retryable)


def decision_lost(st: Step, inp: CallLost) -> None:
    d = live_decision(st, inp.call_id, inp.attempt)
    if d is not None:
        lost = Fault.LOST
        error = lost.error("the engine waiting for this decision stopped")
        decision_failed(st, d, error, lost.retryable, at_once=True)


def decision_failed(
    st: Step, d: Decision, error: dict[str, Any], retryable: bool, *, at_once: bool = False
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
            turns.fail_turn(st, error)
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
    d = live_decision(st, inp.decision_id, inp.attempt)
    if d is not None:
        late = Fault.DEADLINE
        error = late.error(
            f"the worker did not answer decision {d.id!r} (attempt {d.attempt}) before its deadline"
        )
        decision_failed(st, d, error, late.retryable)


def decision_timer_fired(st: Step, inp: DecisionTimerFired) -> None:
    d = st.s.decision
    if d is None or d.id != inp.decision_id or d.status != "retry_scheduled":
        st.ignore(f"timer for decision {inp.decision_id!r} is stale")
        return
    if inp.attempt != d.attempt + 1:
        st.ignore(f"timer for decision {inp.decision_id!r} attempt {inp.attempt} is stale")
        return
    redispatch(st, d, inp.attempt)


# -- a call's own execute ----------------------------------------------------------


def execute_answered(st: Step, inp: ExecuteAnswered) -> None:
    call = calls.live_call(st, inp.call_id, inp.attempt, None)
    if call is None:
        return
    if call.status == "waiting":
        st.ignore(f"call {call.id!r} was already answered (it is async)")
        return
    trigger = {"type": f"{call.kind}.execute", "id": call.id, "attempt": call.attempt}
    problem = check_response(st, inp.response, trigger)
    if problem is None and call.kind == "llm" and not _ends(inp.response, call.id):
        problem = "llm.execute must be answered with llm.result or llm.error"
    if problem is not None:
        invalid = Fault.INVALID_RESPONSE
        calls.delivery_failed(st, call, invalid.error(problem), invalid.retryable)
        after_decision(st)
        return
    apply_decision(st, inp.response, trigger)
    still = st.s.calls.get(call.id)
    if still is not None and still.status == "running" and still.attempt == inp.attempt:
        # An empty answer leaves the call open: an async tool, settled later.
        st.emit({"type": ev.TOOL_CALL_WAITING, "id": call.id, "attempt": call.attempt})
    after_decision(st)


def execute_failed(st: Step, inp: ExecuteFailed) -> None:
    call = calls.live_call(st, inp.call_id, inp.attempt, None)
    if call is None:
        return
    calls.delivery_failed(st, call, inp.error, inp.retryable)
    after_decision(st)


# -- checking and applying ---------------------------------------------------------


def check_response(st: Step, resp: dict[str, Any], trigger: dict[str, Any]) -> str | None:
    """Why this answer cannot be applied to the session as it is, or None."""
    clash = id_clash(resp.get("messages") or [], st.s.nodes)
    if clash is not None:
        return clash
    ended: set[str] = set()
    for i, action in enumerate(resp.get("actions") or ()):
        kind = action["type"]
        if kind == "connector.sync" and action["path"] not in _paths(st):
            known = ", ".join(_paths(st)) or "none"
            return f"actions.{i}.path: the agent names no connection {action['path']!r} ({known})"
        call_kind = _SETTLES.get(kind)
        if call_kind is None:
            continue
        answers = trigger["type"] == f"{call_kind}.execute"
        call_id = action.get("id") or (trigger["id"] if answers else None)
        if call_id is None:
            return f"actions.{i}.id: {kind} must name the call it ends"
        call = st.s.calls.get(call_id)
        if (
            call is None
            or call.kind != call_kind
            or call.handler != "worker"
            or call.status not in ("running", "waiting")
        ):
            return f"actions.{i}: {kind} for call {call_id!r}, which is not open on the worker"
        attempt = action.get("attempt")
        if attempt is None:
            attempt = trigger["attempt"] if answers and call_id == trigger["id"] else call.attempt
        if attempt != call.attempt:
            return (
                f"actions.{i}.attempt: call {call_id!r} is at attempt {call.attempt}, not {attempt}"
            )
        if call_id in ended:
            return f"actions.{i}: call {call_id!r} is ended twice"
        ended.add(call_id)
    return None


def apply_decision(st: Step, resp: dict[str, Any], trigger: dict[str, Any]) -> None:
    if resp.get("messages"):
        turns.record_messages(st, resp["messages"])
    if resp.get("state") is not None:
        anchor = st.s.head_id
        st.emit({"type": ev.WORKER_STATE_UPDATED, "state": resp["state"], "anchor": anchor})
    if resp.get("agent") is not None:
        st.emit({"type": ev.AGENT_UPDATED, "agent": resp["agent"], "anchor": st.s.head_id})
    if resp.get("channels"):
        st.emit({"type": ev.CHANNELS_UPDATED, "channels": resp["channels"]})
    unrunnable: list[tuple[Call, str]] = []
    for action in resp.get("actions") or ():
        if st.s.turn is None:
            break  # `done`/`fail` ended the turn: later actions have no turn to act in.
        apply_action(st, action, trigger, unrunnable)
    # Fail the calls nothing can run only once all of the decision's calls are
    # open, so the re-prompt waits for every one of them.
    for call, reason in unrunnable:
        unroutable = Fault.UNROUTABLE
        calls.call_failed(st, call, unroutable.error(reason), unroutable.retryable, None)


def apply_action(
    st: Step, action: dict[str, Any], trigger: dict[str, Any], unrunnable: list[tuple[Call, str]]
) -> None:
    kind = action["type"]
    if kind == "llm.call":
        if not st.s.interrupts:  # a paused branch makes no new model call
            calls.start_llm_call(st, action)
    elif kind == "tool.call":
        calls.start_tool_call(st, action, unrunnable)
    elif kind == "subagent.spawn":
        calls.start_subagent(st, action, unrunnable)
    elif kind in _SETTLES:
        settle_from_worker(st, action, trigger)
    elif kind == "interrupt":
        turns.raise_interrupt(st, action, "worker")
    elif kind == "interrupt.resolve":
        turns.resume_interrupt(st, action["interrupt_id"], action.get("payload"))
    elif kind == "message.send":
        turns.send_message(st, action)
    elif kind == "connector.sync":
        connectors.start_sync(st, action["path"], force=True)
    elif kind == "done":
        if st.by_worker and trigger["type"] != "turn.finished":
            turns.finish_with_worker(st, action.get("data"))
        else:
            turns.end_turn(st, action.get("data"))
    elif kind == "fail":
        turns.fail_turn(st, action["error"])
    else:
        raise ValueError(f"unchecked action {kind!r}")  # check_response lets none through


def settle_from_worker(st: Step, action: dict[str, Any], trigger: dict[str, Any]) -> None:
    call = st.s.calls[action.get("id") or trigger["id"]]
    kind = action["type"]
    if kind == "tool.result":
        result = tool_result_of(
            action.get("result"),
            action.get("content"),
            action.get("structured_content"),
            bool(action.get("is_error")),
        )
        calls.settle_tool(st, call, result, None, False)
    elif kind == "tool.error":
        calls.settle_tool(st, call, None, action["error"], bool(action.get("retryable")))
    elif kind == "llm.result":
        calls.llm_completed(st, call, action["response"])
    else:
        error = {"message": action["error"], "code": action.get("code") or "handler_error"}
        calls.call_failed(st, call, error, bool(action.get("retryable")), None)


def _paths(st: Step) -> list[str]:
    return [e["id"] for e in connectors.entries(st.s.agent)]


def _ends(resp: dict[str, Any], call_id: str) -> bool:
    return any(
        a["type"] in ("llm.result", "llm.error") and (a.get("id") or call_id) == call_id
        for a in resp.get("actions") or ()
    )
