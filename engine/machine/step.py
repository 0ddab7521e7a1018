"""The transition function: `step(state, session_id, input, now, ids, kinds) -> Transition`.

Pure: no I/O, no clock, no randomness; `now` (epoch ms) and `ids` are
injected, and `kinds` is the table of call kinds the session runs by (built once by
the engine, engine/runtime/engine.py). Every change to the state is an event applied
through `evolve`, so the new state is by construction the fold of the log.

An input the session refuses raises `MachineError` before any event is
emitted, leaving the state untouched. Completions that arrive late (a stale
attempt, a call that already closed) are ignored with a recorded reason in
`Transition.ignored`: that is the normal shape of at-least-once delivery.

A step runs the input's handler, then `advance`. A handler records what happened (the
events) and, where something must follow, a fact (core.py `Fact`); it never calls
"what next". `advance` then looks at the facts and the state and does what comes next,
until nothing does. The rules import one way, each module only those below it
(tests/test_import_rules.py holds it):

    step.py              handlers of the session's own inputs, `advance`, `step`
    decisions.py         applying a decision: a worker's checked answer, the engine's proposal
    between_sessions.py  messages between sessions; the child's side of a subagent call
    resuming.py          resuming an interrupt, and what follows it
    turns.py             submitting, starting and queueing turns
    connectors.py        MCP: syncing a turn's connections; their two call kinds
    settling.py          a call's attempt settled: a runner's, a client's or the API's answer
    requesting.py        a model or tool call recorded and sent, or held for approval
    subagents.py         subagent calls, and their call kind
    calls.py             a call's attempts: sent, a model's reply, failed, retried, late, lost
    tool_messages.py     a tool call's end as the model reads it; the re-prompt
    asking.py            asking for a decision: the slot, its queue, its attempts
    ending.py            a turn ending (completed, failed, dropped); its parent told
    interrupts.py        raising an interrupt
and below them what the rules read: core.py (`Step`, `CallKind`, `Kinds`), kinds.py
(the built-in kinds), connections.py and spawns.py (the config read), tools.py,
tree.py, retry.py, state.py, evolve.py, events.py, inputs.py, effects.py, and shapes.py
(the triggers, actions and answers they pass, typed).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import (
    asking,
    between_sessions,
    calls,
    decisions,
    ending,
    interrupts,
    resuming,
    settling,
    subagents,
    turns,
)
from . import events as ev
from .connectors import hold
from .core import Fact, Ids, Kinds, MachineError, Opening, Proposal, Step, Transition
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
    DecisionDeferred,
    DecisionFailed,
    DecisionSubmitted,
    DecisionTimerFired,
    ExecuteAnswered,
    ExecuteFailed,
    Input,
    InputRejected,
    InterruptDeadline,
    InterruptRequested,
    LlmCallSettled,
    MessageDelivered,
    QueueDeadline,
    SubagentFinished,
    SubagentStarted,
    TimerFired,
)
from .interrupts import may_resume, raise_interrupt
from .policies import Bucket, Unread
from .retry import Fault
from .shapes import ErrorInfo, Raise, is_turn_start
from .state import SessionState
from .turns import TURN_STARTS

# -- the session's own inputs ----------------------------------------------------------


def _subject_is(identity: dict[str, Any], owner: dict[str, Any]) -> bool:
    """Whether the session's subject has every field of `owner`: a scoped key names its
    `{issuer, id}`, the Slack bot only `{issuer: "slack"}` (any asker, but no API key)."""
    subject = identity.get("subject")
    return isinstance(subject, dict) and all(subject.get(k) == v for k, v in owner.items())


def client_submitted(st: Step, inp: ClientSubmitted) -> None:
    """A client's input: checked against the owner, then handled by its type."""
    body = inp.input
    s = st.state
    if inp.owner is not None and s is not None and not _subject_is(s.identity, inp.owner):
        raise MachineError(
            f"session {st.session_id} belongs to another owner", code="forbidden", status=403
        )
    if is_turn_start(body):
        turns.submit_turn(st, inp, body)
    elif body["type"] == "tool.result" or body["type"] == "tool.error":
        settling.client_settles_tool(st, body)
    elif body["type"] == "interrupt.resume":
        iid = body["interrupt_id"]
        interrupt = s.interrupts.get(iid) if s is not None else None
        privilege = "frontend" if inp.owner is not None else "operator"
        if interrupt is not None and not may_resume(interrupt, privilege):
            raise MachineError(
                f"interrupt {iid!r} was raised in a turn a more privileged key started: "
                "resume it with a key of that privilege",
                code="forbidden",
                status=403,
            )
        expired = interrupt is not None and interrupts.expired(interrupt, st.now)
        resumed = resuming.resume_interrupt(st, iid, body.get("payload"))
        st.out.reply = {"session_id": st.session_id, "resumed": resumed}
        if expired:
            st.out.reply["expired"] = True
    else:
        kind = body["type"]
        raise MachineError(f"unsupported input type {kind!r}", code="invalid_input", status=422)


def interrupt_requested(st: Step, inp: InterruptRequested) -> None:
    """A client pauses the running turn; refused when none runs."""
    if st.s.turn is None:
        raise MachineError(
            f"session {st.session_id} has no running turn to interrupt", code="no_turn"
        )
    action: Raise = {
        "interrupt_id": inp.interrupt_id,
        "reason": inp.reason,
        "payload": inp.payload,
    }
    before = set(st.s.interrupts)
    raise_interrupt(st, action, "client")
    new = set(st.s.interrupts) - before
    st.out.reply = {
        "session_id": st.session_id,
        "interrupt_id": next(iter(new)) if new else inp.interrupt_id,
    }


def cancel_requested(st: Step, inp: CancelRequested) -> None:
    """A client ends the running turn as failed; refused when none runs."""
    turn = st.s.turn
    if turn is None:
        raise MachineError(
            f"session {st.session_id} has no running turn to cancel", code="no_turn_running"
        )
    # The protocol's error codes are a closed set a worker may validate against (a
    # cancelled child's error reaches its parent's worker): the client's own doing
    # is `handler_error`, and `detail.cancelled` says which.
    error: ErrorInfo = {
        "message": "cancelled by the client",
        "code": "handler_error",
        "detail": {"cancelled": True},
    }
    if inp.reason:
        error["message"] += f": {inp.reason}"
        error["detail"]["reason"] = inp.reason
    ending.fail_turn(st, error)
    st.out.reply = {"session_id": st.session_id, "turn_id": turn.id}


def input_rejected(st: Step, inp: InputRejected) -> None:
    """An input the engine could not apply: recorded, and its turn failed."""
    st.emit({"type": ev.INPUT_REJECTED, "input_kind": inp.kind, "error": inp.error})
    if st.s.turn is not None:
        ending.fail_turn(st, inp.error)


_HANDLERS: dict[type, Callable[[Step, Any], None]] = {
    ClientSubmitted: client_submitted,
    LlmCallSettled: calls.llm_settled,
    TimerFired: calls.timer_fired,
    CallLost: calls.call_lost,
    DecisionAnswered: decisions.decision_answered,
    DecisionFailed: asking.decision_failed_input,
    DecisionDeferred: decisions.decision_deferred,
    DecisionSubmitted: decisions.decision_submitted,
    DecisionTimerFired: asking.decision_timer_fired,
    DecisionDeadline: asking.decision_deadline,
    ExecuteAnswered: decisions.execute_answered,
    ExecuteFailed: decisions.execute_failed,
    CallAnswered: settling.call_answered,
    CallDeadline: calls.call_deadline,
    QueueDeadline: turns.queue_deadline,
    InterruptDeadline: resuming.interrupt_deadline,
    CallSettled: settling.api_settles_call,
    InterruptRequested: interrupt_requested,
    CancelRequested: cancel_requested,
    InputRejected: input_rejected,
    MessageDelivered: between_sessions.message_delivered,
    ChildSpawned: between_sessions.child_spawned,
    SubagentStarted: subagents.subagent_started,
    SubagentFinished: subagents.subagent_finished,
    ChildCancelled: between_sessions.child_cancelled,
}


# -- what comes next --------------------------------------------------------------------


def advance(st: Step) -> None:
    """Do what the recorded facts and the state call for next, until nothing does.

    First the facts, oldest first, each followed through before the next (what one
    leads to comes before the facts recorded after it, as a call would have it); then,
    once none is left, one thing the state calls for, and the facts that records:
    the free decision slot to the oldest waiting trigger, a turn with nothing left in
    flight ended (a worker asked one last time first), the next queued turn started.
    """
    facts = st.take_facts()
    while True:
        if facts:
            follow(st, facts.pop(0))
            facts[:0] = st.take_facts()
            continue
        s = st.state
        if s is None:
            return
        if s.turn is None:
            if not s.queue:
                return
            turns.start_queued(st)
        elif s.decision is None and s.pending:
            asking.dispatch_pending(st)
        elif not ending.busy(st):
            if st.by_worker and st.finished != s.turn.id:
                asking.finish_with_worker(st, None)
            else:
                ending.end_turn(st, None)
        else:
            return
        facts = st.take_facts()


def follow(st: Step, fact: Fact) -> None:
    """What one recorded fact leads to."""
    if isinstance(fact, Proposal):
        decisions.apply_decision(st, fact.proposed, fact.trigger)
    elif isinstance(fact, Opening):
        agent = st.s.agent if st.s.agent is not None else fact.start_config
        if not hold(st, agent, fact.trigger, fact.proposed, force=fact.force):
            asking.decide(st, fact.trigger, fact.proposed)
    else:
        call = st.s.calls.get(fact.call_id)
        if call is not None:  # else its turn ended, and closed it, first
            unroutable = Fault.UNROUTABLE
            calls.call_failed(st, call, unroutable.error(fact.reason), unroutable.retryable, None)


def step(
    state: SessionState | None,
    session_id: str,
    inp: Input,
    now: int,
    ids: Ids,
    kinds: Kinds,
    *,
    buckets: tuple[Bucket, ...] | Unread = (),
) -> Transition:
    """Apply one input by the rules of `kinds`. Mutates `state` (when it emits) and returns
    the transition. `buckets`: the session's budget-policy buckets as read before the step
    (policies.py), a model call they do not allow is not made; or `UNREAD`: each model call
    is let through and its check left in `policy_checks` (budgets.first_over).

    Raises:
        MachineError: the input is refused; nothing was emitted.
    """
    handler = _HANDLERS.get(type(inp))
    if handler is None:
        raise TypeError(f"unknown input {type(inp).__name__}")
    if state is None:
        if isinstance(inp, ClientSubmitted) and inp.input["type"] not in TURN_STARTS:
            raise MachineError(
                f"session {session_id!r} does not exist", code="unknown_session", status=404
            )
        if isinstance(inp, CallSettled | DecisionSubmitted | InterruptRequested | CancelRequested):
            raise MachineError(
                f"session {session_id!r} does not exist", code="unknown_session", status=404
            )
        if not isinstance(inp, ClientSubmitted | ChildSpawned):
            return Transition(state=None, ignored=f"session {session_id!r} does not exist")
    before = armed(state, kinds)
    st = Step(state, session_id, now, ids, kinds)
    st.buckets = buckets
    handler(st, inp)
    advance(st)
    if st.out.events:
        after = armed(st.out.state, kinds)
        st.out.effects += timer_changes(before, after)
        st.out.dues = tuple(due for due, _ in after.values())
    return st.out
