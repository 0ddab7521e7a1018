"""Decisions (SPEC §3-§5): applying one, the worker's checked answer or the engine's own.

A worker's answer is checked against the session before any of it is applied: an answer
that names a call that is not open, or an attempt a retry replaced, is a failed attempt
with a precise reason, never a half-applied one. The engine's proposal (an engine-decided
agent) is applied the same way, by `advance` (step.py). Asking for a decision, and the
decision's own attempts, are asking.py's.
"""

from __future__ import annotations

from . import events as ev
from .asking import decision_failed, finish_with_worker, live_decision
from .between_sessions import send_message
from .calls import call_failed, delivery_failed, live_call, llm_completed, unanswered_call
from .connections import entries
from .connectors import start_sync
from .core import CannotRun, MachineError, Step
from .ending import end_turn, fail_turn
from .inputs import (
    DecisionAnswered,
    DecisionDeferred,
    DecisionSubmitted,
    ExecuteAnswered,
    ExecuteFailed,
)
from .interrupts import raise_interrupt
from .request import with_engine_keys
from .requesting import start_llm_call, start_tool_call
from .resuming import resume_interrupt
from .retry import Fault
from .settling import settle_tool_as_said
from .shapes import (
    SETTLES,
    Action,
    Answer,
    ErrorInfo,
    Execute,
    Settle,
    Trigger,
    is_execute,
    is_settle,
)
from .state import Call
from .subagents import start_subagent
from .tree import id_clash
from .turns import record_messages

# -- answers ---------------------------------------------------------------------


def decision_answered(st: Step, inp: DecisionAnswered) -> None:
    """The worker answered the live decision: apply it, or fail the attempt if it is invalid."""
    d = live_decision(st, inp.decision_id, inp.attempt)
    if d is None:
        return
    problem = check_response(st, inp.response, d.trigger)
    if problem is not None:
        invalid = Fault.INVALID_RESPONSE
        decision_failed(st, d, invalid.error(problem), invalid.retryable)
        return
    st.emit({"type": ev.DECISION_COMPLETED, "decision_id": d.id, "attempt": d.attempt})
    if d.trigger["type"] == "turn.finished":
        st.finished = d.trigger["turn_id"]  # asked once more: with nothing to do, it is over
    apply_decision(st, inp.response, d.trigger, proposed=d.proposed)


def decision_deferred(st: Step, inp: DecisionDeferred) -> None:
    """The worker will decide later: the decision waits, under the deadline its attempt
    was dispatched with (deadlines.py keeps the timer armed), as an async tool waits."""
    d = live_decision(st, inp.decision_id, inp.attempt)
    if d is None:
        return
    if d.status == "waiting":
        st.ignore(f"decision {d.id!r} is already waiting")
        return
    st.emit({"type": ev.DECISION_WAITING, "decision_id": d.id, "attempt": d.attempt})


def decision_submitted(st: Step, inp: DecisionSubmitted) -> None:
    """A waiting decision's answer, sent separately (workers/submit). Refused, changing
    nothing, when that decision is not the one waiting (answered already, never asked,
    timed out and asked again) or the answer does not fit its trigger."""
    d = st.s.decision
    if d is None or d.id != inp.decision_id or d.status != "waiting":
        raise MachineError(
            f"decision {inp.decision_id!r} is not pending (answered already, replaced by a "
            "retry, or never sent as a deferred decision)",
            code="decision_not_pending",
            status=409,
        )
    problem = check_response(st, inp.response, d.trigger)
    if problem is not None:
        raise MachineError(f"actions: {problem}", code="invalid_input", status=422)
    st.emit({"type": ev.DECISION_COMPLETED, "decision_id": d.id, "attempt": d.attempt})
    if d.trigger["type"] == "turn.finished":
        st.finished = d.trigger["turn_id"]
    apply_decision(st, inp.response, d.trigger, proposed=d.proposed)


def execute_answered(st: Step, inp: ExecuteAnswered) -> None:
    """The worker ran a call it was asked to execute: settle the call."""
    call = unanswered_call(st, inp.call_id, inp.attempt)
    if call is None:
        return
    trigger: Execute = (
        {"type": "llm.execute", "id": call.id, "attempt": call.attempt}
        if call.kind == "llm"
        else {"type": "tool.execute", "id": call.id, "attempt": call.attempt}
    )
    problem = check_response(st, inp.response, trigger)
    if problem is None and call.kind == "llm" and not _ends(inp.response, call.id):
        problem = "llm.execute must be answered with llm.result or llm.error"
    if problem is not None:
        invalid = Fault.INVALID_RESPONSE
        delivery_failed(st, call, invalid.error(problem), invalid.retryable)
        return
    apply_decision(st, inp.response, trigger)
    still = st.s.calls.get(call.id)
    if still is not None and still.status == "running" and still.attempt == inp.attempt:
        # An empty answer leaves the call open: an async tool, settled later.
        st.emit({"type": ev.TOOL_CALL_WAITING, "id": call.id, "attempt": call.attempt})


def execute_failed(st: Step, inp: ExecuteFailed) -> None:
    """Delivering a call to the worker failed: retry or fail it."""
    call = live_call(st, inp.call_id, inp.attempt, None)
    if call is None:
        return
    delivery_failed(st, call, inp.error, inp.retryable)


# -- checking and applying ---------------------------------------------------------


def check_response(st: Step, resp: Answer, trigger: Trigger) -> str | None:
    """Why this answer cannot be applied to the session as it is, or None."""
    clash = id_clash(resp.get("messages") or [], st.s.nodes)
    if clash is not None:
        return clash
    ended: set[str] = set()
    execute = trigger if is_execute(trigger) else None
    for i, action in enumerate(resp.get("actions") or ()):
        if action["type"] == "connector.sync" and action["path"] not in _paths(st):
            known = ", ".join(_paths(st)) or "none"
            return f"actions.{i}.path: the agent names no connection {action['path']!r} ({known})"
        if not is_settle(action):
            continue
        kind = action["type"]
        call_kind = SETTLES[kind]
        answers = execute is not None and execute["type"] == f"{call_kind}.execute"
        call_id = action.get("id") or (execute["id"] if execute is not None and answers else None)
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
            same = execute is not None and answers and call_id == execute["id"]
            attempt = execute["attempt"] if execute is not None and same else call.attempt
        if attempt != call.attempt:
            return (
                f"actions.{i}.attempt: call {call_id!r} is at attempt {call.attempt}, not {attempt}"
            )
        if call_id in ended:
            return f"actions.{i}: call {call_id!r} is ended twice"
        ended.add(call_id)
    return None


def apply_decision(
    st: Step, resp: Answer, trigger: Trigger, *, proposed: Answer | None = None
) -> None:
    """Record a valid decision: its messages and state first, then its actions. An agent
    config keeps the engine-only keys, which the worker was never sent, of the config in
    force (while the session has none, of the one `proposed` with it: at `session.start`,
    the file's)."""
    messages = resp.get("messages")
    if messages:
        record_messages(st, messages)
    if resp.get("state") is not None:
        anchor = st.s.head_id
        st.emit({"type": ev.WORKER_STATE_UPDATED, "state": resp["state"], "anchor": anchor})
    agent = resp.get("agent")
    if agent is not None:
        basis = st.s.agent or (proposed or {}).get("agent")
        agent = with_engine_keys(basis, agent)
        st.emit({"type": ev.AGENT_UPDATED, "agent": agent, "anchor": st.s.head_id})
    channels = resp.get("channels")
    if channels:
        st.emit({"type": ev.CHANNELS_UPDATED, "channels": channels})
    unrunnable: list[tuple[Call, str]] = []
    for action in resp.get("actions") or ():
        if st.s.turn is None:
            break  # `done`/`fail` ended the turn: later actions have no turn to act in.
        apply_action(st, action, trigger, unrunnable)
    # The calls nothing can run fail once all of the decision's calls are open, so
    # the re-prompt waits for every one of them (`advance` fails them, in order).
    for call, reason in unrunnable:
        st.record(CannotRun(call.id, reason))


def apply_action(
    st: Step, action: Action, trigger: Trigger, unrunnable: list[tuple[Call, str]]
) -> None:
    """One action of a decision, by its type."""
    if action["type"] == "llm.call":
        if not st.s.interrupts:  # a paused branch makes no new model call
            start_llm_call(st, action)
    elif action["type"] == "tool.call":
        start_tool_call(st, action, unrunnable)
    elif action["type"] == "subagent.spawn":
        start_subagent(st, action, unrunnable)
    elif is_settle(action):
        settle_from_worker(st, action, trigger)
    elif action["type"] == "interrupt":
        raise_interrupt(st, action, "worker")
    elif action["type"] == "interrupt.resolve":
        resume_interrupt(st, action["interrupt_id"], action.get("payload"))
    elif action["type"] == "message.send":
        send_message(st, action)
    elif action["type"] == "connector.sync":
        start_sync(st, action["path"], force=True)
    elif action["type"] == "done":
        if st.by_worker and trigger["type"] != "turn.finished":
            finish_with_worker(st, action.get("data"))
        else:
            end_turn(st, action.get("data"))
    elif action["type"] == "fail":
        fail_turn(st, action["error"])
    else:  # check_response lets none through
        raise ValueError(f"unchecked action {action['type']!r}")


def settle_from_worker(st: Step, action: Settle, trigger: Trigger) -> None:
    """A decision that settles one of its trigger's calls itself (check_response made
    sure it names the call, or answers the `*.execute` trigger that does)."""
    execute = trigger if is_execute(trigger) else None
    call_id = action.get("id") or (execute["id"] if execute is not None else "")
    call = st.s.calls[call_id]
    if action["type"] == "tool.result" or action["type"] == "tool.error":
        settle_tool_as_said(st, call, action)
    elif action["type"] == "llm.result":
        llm_completed(st, call, action["response"])
    else:
        error: ErrorInfo = {
            "message": action["error"],
            "code": action.get("code") or "handler_error",
        }
        call_failed(st, call, error, bool(action.get("retryable")), None)


def _paths(st: Step) -> list[str]:
    return [e["id"] for e in entries(st.s.agent)]


def _ends(resp: Answer, call_id: str) -> bool:
    return any(
        a["type"] in ("llm.result", "llm.error") and (a.get("id") or call_id) == call_id
        for a in resp.get("actions") or ()
    )
