"""The transition function: `step(state, session_id, input, now, ids) -> Transition`.

Pure: no I/O, no clock, no randomness; `now` (epoch ms) and `ids` are
injected. Every change to the state is an event applied through `evolve`,
so the new state is by construction the fold of the log.

An input the session refuses raises `MachineError` before any event is
emitted, leaving the state untouched. Completions that arrive late (a stale
attempt, a call that already closed) are ignored with a recorded reason in
`Transition.ignored`: that is the normal shape of at-least-once delivery.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .calls import CallRules
from .core import Ids, MachineError, Transition
from .deadlines import armed, timer_changes
from .decisions import DecisionRules
from .inputs import (
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
    SubagentFinished,
    SubagentStarted,
    TimerFired,
)
from .state import SessionState
from .turns import TURN_STARTS, TurnRules


class _Step(TurnRules, CallRules, DecisionRules):
    def client_submitted(self, inp: ClientSubmitted) -> None:
        body = inp.input
        kind = body["type"]
        s = self.state
        if inp.owner is not None and s is not None and s.identity.get("subject") != inp.owner:
            raise MachineError(
                "forbidden", f"session {self.session_id} belongs to another owner", 403
            )
        if kind in TURN_STARTS:
            self.submit_turn(inp)
        elif kind in ("tool.result", "tool.error"):
            self.client_settles_tool(body)
        elif kind == "interrupt.resume":
            resumed = self.resume_interrupt(body["interrupt_id"], body.get("payload"))
            self.out.reply = {"session_id": self.session_id, "resumed": resumed}
            self.settle_turn()
        else:
            raise MachineError("invalid_input", f"unsupported input type {kind!r}", status=422)

    def interrupt_requested(self, inp: InterruptRequested) -> None:
        if self.s.turn is None:
            raise MachineError(
                "no_turn", f"session {self.session_id} has no running turn to interrupt"
            )
        action = {"interrupt_id": inp.interrupt_id, "reason": inp.reason, "payload": inp.payload}
        before = set(self.s.interrupts)
        self.raise_interrupt(action, "client")
        new = set(self.s.interrupts) - before
        self.out.reply = {
            "session_id": self.session_id,
            "interrupt_id": next(iter(new)) if new else inp.interrupt_id,
        }

    def cancel_requested(self, inp: CancelRequested) -> None:
        turn = self.s.turn
        if turn is None:
            raise MachineError(
                "no_turn_running", f"session {self.session_id} has no running turn to cancel"
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
        self.fail_turn(error)
        self.out.reply = {"session_id": self.session_id, "turn_id": turn.id}

    def input_rejected(self, inp: InputRejected) -> None:
        self.emit({"type": "input.rejected", "input_kind": inp.kind, "error": inp.error})
        if self.s.turn is not None:
            self.fail_turn(inp.error)


_DISPATCH: dict[type, Callable[[_Step, Any], None]] = {
    ClientSubmitted: _Step.client_submitted,
    LlmCallSettled: _Step.llm_settled,
    TimerFired: _Step.timer_fired,
    CallLost: _Step.call_lost,
    DecisionAnswered: _Step.decision_answered,
    DecisionFailed: _Step.decision_failed_input,
    DecisionTimerFired: _Step.decision_timer_fired,
    DecisionDeadline: _Step.decision_deadline,
    ExecuteAnswered: _Step.execute_answered,
    ExecuteFailed: _Step.execute_failed,
    CallDeadline: _Step.call_deadline,
    CallSettled: _Step.api_settles_call,
    InterruptRequested: _Step.interrupt_requested,
    CancelRequested: _Step.cancel_requested,
    InputRejected: _Step.input_rejected,
    MessageDelivered: _Step.message_delivered,
    ChildSpawned: _Step.child_spawned,
    SubagentStarted: _Step.subagent_started,
    SubagentFinished: _Step.subagent_finished,
    ChildCancelled: _Step.child_cancelled,
}


def step(state: SessionState | None, session_id: str, inp: Input, now: int, ids: Ids) -> Transition:
    """Apply one input. Mutates `state` (when it emits) and returns the transition.

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
    before = armed(state)
    st = _Step(state, session_id, now, ids)
    handler(st, inp)
    if st.out.events:
        st.out.effects += timer_changes(before, armed(st.out.state))
    return st.out
