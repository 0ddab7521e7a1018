"""The transition function: `step(state, session_id, input, now, ids) -> Transition`.

Pure: no I/O, no clock, no randomness; `now` (epoch ms) and `ids` are
injected. Every change to the state is an event applied through `evolve`,
so the new state is by construction the fold of the log.

An input the session refuses raises `MachineError` before any event is
emitted, leaving the state untouched. Completions that arrive late (a stale
attempt, a call that already closed) are ignored with a recorded reason in
`Transition.ignored`: that is the normal shape of at-least-once delivery.

The rules are plain functions of a `Step` (core.py), one module per concern
(turns.py, calls.py, decisions.py), calling each other through their modules:
each says what it uses, and mypy checks every call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import calls, decisions, turns
from . import events as ev
from .core import Ids, Kinds, MachineError, Step, Transition
from .deadlines import armed, timer_changes
from .inputs import (
    CallAnswered,
    CallDeadline,
    CallLost,
    CallSettled,
    CancelRequested,
    ChildCancelled,
    ChildSpawned,
    ClientSubmitted,
    DecisionAnswered,
    DecisionDeadline,
    DecisionFailed,
    DecisionTimerFired,
    ExecuteAnswered,
    ExecuteFailed,
    Input,
    InputRejected,
    InterruptRequested,
    LlmCallSettled,
    MessageDelivered,
    QueueDeadline,
    SubagentFinished,
    SubagentStarted,
    TimerFired,
)
from .state import SessionState
from .turns import TURN_STARTS


def client_submitted(st: Step, inp: ClientSubmitted) -> None:
    body = inp.input
    kind = body["type"]
    s = st.state
    if inp.owner is not None and s is not None and s.identity.get("subject") != inp.owner:
        raise MachineError("forbidden", f"session {st.session_id} belongs to another owner", 403)
    if kind in TURN_STARTS:
        turns.submit_turn(st, inp)
    elif kind in ("tool.result", "tool.error"):
        calls.client_settles_tool(st, body)
    elif kind == "interrupt.resume":
        resumed = turns.resume_interrupt(st, body["interrupt_id"], body.get("payload"))
        st.out.reply = {"session_id": st.session_id, "resumed": resumed}
        turns.settle_turn(st)
    else:
        raise MachineError("invalid_input", f"unsupported input type {kind!r}", status=422)


def interrupt_requested(st: Step, inp: InterruptRequested) -> None:
    if st.s.turn is None:
        raise MachineError("no_turn", f"session {st.session_id} has no running turn to interrupt")
    action = {"interrupt_id": inp.interrupt_id, "reason": inp.reason, "payload": inp.payload}
    before = set(st.s.interrupts)
    turns.raise_interrupt(st, action, "client")
    new = set(st.s.interrupts) - before
    st.out.reply = {
        "session_id": st.session_id,
        "interrupt_id": next(iter(new)) if new else inp.interrupt_id,
    }


def cancel_requested(st: Step, inp: CancelRequested) -> None:
    turn = st.s.turn
    if turn is None:
        raise MachineError(
            "no_turn_running", f"session {st.session_id} has no running turn to cancel"
        )
    # The protocol's error codes are a closed set a worker may validate against (a
    # cancelled child's error reaches its parent's worker): the client's own doing
    # is `handler_error`, and `detail.cancelled` says which.
    error: dict[str, Any] = {
        "message": "cancelled by the client",
        "code": "handler_error",
        "detail": {"cancelled": True},
    }
    if inp.reason:
        error["message"] += f": {inp.reason}"
        error["detail"]["reason"] = inp.reason
    turns.fail_turn(st, error)
    st.out.reply = {"session_id": st.session_id, "turn_id": turn.id}


def input_rejected(st: Step, inp: InputRejected) -> None:
    st.emit({"type": ev.INPUT_REJECTED, "input_kind": inp.kind, "error": inp.error})
    if st.s.turn is not None:
        turns.fail_turn(st, inp.error)


_DISPATCH: dict[type, Callable[[Step, Any], None]] = {
    ClientSubmitted: client_submitted,
    LlmCallSettled: calls.llm_settled,
    TimerFired: calls.timer_fired,
    CallLost: calls.call_lost,
    DecisionAnswered: decisions.decision_answered,
    DecisionFailed: decisions.decision_failed_input,
    DecisionTimerFired: decisions.decision_timer_fired,
    DecisionDeadline: decisions.decision_deadline,
    ExecuteAnswered: decisions.execute_answered,
    ExecuteFailed: decisions.execute_failed,
    CallAnswered: calls.call_answered,
    CallDeadline: calls.call_deadline,
    QueueDeadline: turns.queue_deadline,
    CallSettled: calls.api_settles_call,
    InterruptRequested: interrupt_requested,
    CancelRequested: cancel_requested,
    InputRejected: input_rejected,
    MessageDelivered: turns.message_delivered,
    ChildSpawned: turns.child_spawned,
    SubagentStarted: calls.subagent_started,
    SubagentFinished: calls.subagent_finished,
    ChildCancelled: turns.child_cancelled,
}


def step(
    state: SessionState | None, session_id: str, inp: Input, now: int, ids: Ids, kinds: Kinds
) -> Transition:
    """Apply one input by the rules of `kinds`. Mutates `state` (when it emits) and returns
    the transition.

    Raises:
        MachineError: the input is refused; nothing was emitted.
    """
    handler = _DISPATCH.get(type(inp))
    if handler is None:
        raise TypeError(f"unknown input {type(inp).__name__}")
    if state is None:
        if isinstance(inp, ClientSubmitted) and inp.input["type"] not in TURN_STARTS:
            raise MachineError("unknown_session", f"session {session_id!r} does not exist", 404)
        if isinstance(inp, CallSettled | InterruptRequested | CancelRequested):
            raise MachineError("unknown_session", f"session {session_id!r} does not exist", 404)
        if not isinstance(inp, ClientSubmitted | ChildSpawned):
            return Transition(state=None, ignored=f"session {session_id!r} does not exist")
    before = armed(state, kinds)
    st = Step(state, session_id, now, ids, kinds)
    handler(st, inp)
    if st.out.events:
        st.out.effects += timer_changes(before, armed(st.out.state, kinds))
    return st.out
