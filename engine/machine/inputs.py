"""Inputs to the machine: facts that happened outside it, in the past tense."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .shapes import Answer, ClientInput, ErrorInfo


@dataclass(frozen=True)
class ClientSubmitted:
    """A client input (SPEC §13 ClientInput), already validated at the edge.

    `agent_config`, `decider` and `llm_routes` describe the agent as the project
    file declares it; they matter only when this input creates the session.
    """

    input: ClientInput
    agent_id: str
    identity: dict[str, Any]
    agent_config: dict[str, Any] | None
    decider: str = "engine"
    llm_routes: dict[str, dict[str, Any]] | None = None
    # When set, the session must belong to this subject (`{issuer, id}`): a scoped
    # API key. Checked here, with the session, so no other writer can slip between.
    owner: dict[str, Any] | None = None
    # A child session's first input (SPEC §9): who spawned it, and its ancestry.
    ancestry: list[str] | None = None
    # The agent's Slack slash commands ("/oncall"): a `client.action` named after one
    # proposes recording the command as the user's message (SPEC §14).
    slash_commands: tuple[str, ...] = ()
    # The client's W3C `traceparent` (checked at the edge): the turn joins its trace; its
    # `tracestate` goes with it to the turn's workers.
    traceparent: str | None = None
    tracestate: str | None = None


@dataclass(frozen=True)
class LlmCallSettled:
    """An engine-run model call attempt ended: a response, or an error."""

    call_id: str
    attempt: int
    response: dict[str, Any] | None = None
    error: ErrorInfo | None = None
    retryable: bool = False
    retry_after: float | None = None


@dataclass(frozen=True)
class TimerFired:
    """A backoff timer for `call_id` elapsed; `attempt` is the one it schedules."""

    call_id: str
    attempt: int


@dataclass(frozen=True)
class CallLost:
    """The engine that ran this attempt is gone (restart, lease moved)."""

    call_id: str
    attempt: int


@dataclass(frozen=True)
class DecisionAnswered:
    """The worker answered the live decision (a DecisionResponse, parsed at the edge)."""

    decision_id: str
    attempt: int
    response: Answer


@dataclass(frozen=True)
class DecisionDeferred:
    """The worker answered the live decision's attempt with an empty body: it will send
    its DecisionResponse later (`DecisionSubmitted`)."""

    decision_id: str
    attempt: int


@dataclass(frozen=True)
class DecisionSubmitted:
    """A worker's DecisionResponse for a waiting decision, sent separately
    (`POST /api/machine/workers/submit`, upstream's shape)."""

    decision_id: str
    response: Answer


@dataclass(frozen=True)
class DecisionFailed:
    """One delivery attempt of the live decision failed."""

    decision_id: str
    attempt: int
    error: ErrorInfo
    retryable: bool = True


@dataclass(frozen=True)
class DecisionTimerFired:
    """The backoff before the decision's next attempt elapsed."""

    decision_id: str
    attempt: int


@dataclass(frozen=True)
class DecisionDeadline:
    """The live decision's attempt ran past its deadline with no answer recorded."""

    decision_id: str
    attempt: int


@dataclass(frozen=True)
class ExecuteAnswered:
    """The worker answered a call's `tool.execute` / `llm.execute`.

    For `llm.execute` the shell has already normalised a vendor-format result.
    """

    call_id: str
    attempt: int
    response: Answer


@dataclass(frozen=True)
class ExecuteFailed:
    """A call's execute delivery failed (worker unreachable, invalid answer)."""

    call_id: str
    attempt: int
    error: ErrorInfo
    retryable: bool = True


@dataclass(frozen=True)
class CallAnswered:
    """A call kind's runner ended an attempt: its result, or an ErrorInfo `error`.

    The one answer every kind of the step's table (kinds.py) may give, so a new kind needs no
    input of its own; the kind's `settle` rule says what the answer means.
    """

    call_id: str
    attempt: int
    result: Any = None
    error: ErrorInfo | None = None
    retryable: bool = False
    retry_after: float | None = None


@dataclass(frozen=True)
class CallDeadline:
    """A call attempt's run deadline passed with no result recorded."""

    call_id: str
    attempt: int


@dataclass(frozen=True)
class QueueDeadline:
    """A queued turn's queue timeout passed: if it is still waiting, it fails."""

    turn_id: str


@dataclass(frozen=True)
class InterruptDeadline:
    """An open interrupt's `expiresAt` passed: if it is still open, it expires."""

    interrupt_id: str


@dataclass(frozen=True)
class CallSettled:
    """An async or client tool call ended from outside (the settle API)."""

    call_id: str
    attempt: int | None
    result: Any = None
    content: list[dict[str, Any]] | None = None
    error: str | None = None
    retryable: bool = False
    # The id the tool message is recorded under: a client that already shows the
    # result (an AG-UI tool message) keeps its id, so its next view matches the tree.
    message_id: str | None = None
    # A scoped API key's settle: only a client tool's call (one the client was asked to
    # run) may be answered; a worker's async call is the worker's backend's to answer.
    client_only: bool = False


@dataclass(frozen=True)
class InterruptRequested:
    """A client asked to pause the running turn (SPEC §8, the API's interrupt endpoint)."""

    reason: str
    payload: Any = None
    interrupt_id: str | None = None


@dataclass(frozen=True)
class CancelRequested:
    """A client asked to end the running turn now (the API's cancel endpoint)."""

    reason: str | None = None


@dataclass(frozen=True)
class ChildSpawned:
    """A parent's `subagent.spawn` arrived at the child session.

    The receiving engine fills in the child agent's file config (`agent_config`,
    `decider`, `llm_routes`), as it does for a client's first input.
    """

    parent_session: str
    call_id: str
    agent_id: str
    message: dict[str, Any]
    ancestry: list[str]
    agent_config: dict[str, Any] | None = None
    decider: str = "engine"
    llm_routes: dict[str, dict[str, Any]] | None = None
    attempt: int = 1  # the parent call's attempt: a retried spawn is a turn of its own
    # The parent call attempt's span (set by the shell when tracing): the child's turn
    # joins the parent's trace under the call that runs it.
    traceparent: str | None = None


@dataclass(frozen=True)
class SubagentFinished:
    """A child's turn for the parent's `call_id` ended."""

    child_session: str
    call_id: str
    agent_id: str
    ok: bool
    result: str | None = None
    error: ErrorInfo | None = None
    usage: dict[str, int] | None = None
    cost: str = "0"
    attempt: int = 1  # the parent call's attempt this turn ran for


@dataclass(frozen=True)
class SubagentStarted:
    """The child session began the turn that runs the parent's `call_id`."""

    child_session: str
    call_id: str
    attempt: int = 1


@dataclass(frozen=True)
class ChildCancelled:
    """The parent's call ended (its turn ended, it timed out): the child's turn for
    `call_id` stops, or never starts. Only turns of attempts up to `attempt` (all, when
    None): a retry's spawn may arrive first."""

    parent_session: str
    call_id: str
    attempt: int | None = None


@dataclass(frozen=True)
class InputRejected:
    """The engine could not apply an input (`kind`) however often it tried: a bug.

    The input is kept in the dead-letter stream; the session records why, and the
    running turn fails, so nothing waits for an answer that cannot come.
    """

    kind: str
    error: ErrorInfo


@dataclass(frozen=True)
class MessageDelivered:
    """Another session's `message.send` arrived; `message.id` makes it idempotent."""

    from_session: str
    message: dict[str, Any]


Input = (
    ClientSubmitted
    | LlmCallSettled
    | TimerFired
    | CallLost
    | DecisionAnswered
    | DecisionFailed
    | DecisionDeferred
    | DecisionSubmitted
    | DecisionTimerFired
    | DecisionDeadline
    | ExecuteAnswered
    | ExecuteFailed
    | CallAnswered
    | CallDeadline
    | QueueDeadline
    | InterruptDeadline
    | CallSettled
    | InterruptRequested
    | CancelRequested
    | InputRejected
    | MessageDelivered
    | ChildSpawned
    | SubagentStarted
    | SubagentFinished
    | ChildCancelled
)

# Each input's name where it is stored: work streams, timers, the outbox, dead letters.
# Written by `input_to_json`, read back by `input_from_json`. Named here rather than by the
# class, so renaming a class changes no stored data; an item stored by a version before
# these names (its class's name) still reads.
WIRE_NAMES: dict[type, str] = {
    ClientSubmitted: "client.submitted",
    LlmCallSettled: "llm.settled",
    TimerFired: "timer.fired",
    CallLost: "call.lost",
    DecisionAnswered: "decision.answered",
    DecisionFailed: "decision.failed",
    DecisionDeferred: "decision.deferred",
    DecisionSubmitted: "decision.submitted",
    DecisionTimerFired: "decision.timer_fired",
    DecisionDeadline: "decision.deadline",
    ExecuteAnswered: "execute.answered",
    ExecuteFailed: "execute.failed",
    CallAnswered: "call.answered",
    CallDeadline: "call.deadline",
    QueueDeadline: "queue.deadline",
    InterruptDeadline: "interrupt.deadline",
    CallSettled: "call.settled",
    InterruptRequested: "interrupt.requested",
    CancelRequested: "cancel.requested",
    InputRejected: "input.rejected",
    MessageDelivered: "message.delivered",
    ChildSpawned: "child.spawned",
    SubagentStarted: "subagent.started",
    SubagentFinished: "subagent.finished",
    ChildCancelled: "child.cancelled",
}
_KINDS: dict[str, type] = {c.__name__: c for c in WIRE_NAMES} | {
    name: c for c, name in WIRE_NAMES.items()
}


def input_to_json(inp: Input) -> dict[str, Any]:
    """An input as the work stream carries it, tagged with its wire name (`WIRE_NAMES`)."""
    return {"kind": WIRE_NAMES[type(inp)], **inp.__dict__}


def input_from_json(d: dict[str, Any]) -> Input:
    """The input `input_to_json` wrote; an unknown kind is a ValueError."""
    fields = dict(d)
    kind = _KINDS.get(fields.pop("kind", ""))
    if kind is None:
        raise ValueError(f"unknown input kind {d.get('kind')!r}")
    inp: Input = kind(**fields)
    return inp
