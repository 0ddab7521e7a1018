"""The event catalogue: every kind of fact a session's log records, and its fields.

One source for everything that writes or reads events: the machine's rules emit
these records, `evolve` folds them, the API, the bot's renderer and the CLI read
them. Each record is a `TypedDict` describing the stored JSON exactly (a record
*is* the payload dict, so nothing is converted on the hot path and a log already
in Redis keeps its shape); mypy checks every field a rule writes or a reader
reads, and `parse` checks a stored payload against its record.

A field marked `NotRequired` is one an event may lack: either the rule leaves it
out, or a log written by an older version lacks it and `evolve` folds it anyway.
A new kind is added here (constant, record, `EVENTS` entry) and to `evolve`'s
table; a test holds the two in step. Changing how an existing kind folds means a
new `FOLD_VERSION` (see `state.state_to_json`).

Wire format: SPEC.md §12 (the envelope `{session_id, seq, occurred_at, turn_id?,
payload}`); payload `type` is the kind.

Why one module: it is the one catalogue of what a log may hold, some forty kinds each
with a constant, a record and an `EVENTS` entry, and no logic beyond `parse`;
tests/test_events.py holds the constants, `EVENTS` and evolve's table to one another
and the golden logs cover every kind, so the list stays whole in the one place a reader
or a test looks for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any, Final, NotRequired

from pydantic import ConfigDict, TypeAdapter, with_config
from typing_extensions import TypedDict  # pydantic reads typing's only from 3.12

from .shapes import JSON, Answer, ErrorInfo, ParentRef, RetryPolicy, Submitter, Trigger, TurnStart

# -- the kinds -------------------------------------------------------------------------

SESSION_CREATED: Final = "session.created"
AGENT_UPDATED: Final = "agent.updated"
WORKER_STATE_UPDATED: Final = "worker.state.updated"
CHANNELS_UPDATED: Final = "channels.updated"
MESSAGE_NEW: Final = "message.new"
MESSAGE_SENT: Final = "message.sent"
HEAD_MOVED: Final = "head.moved"
INPUT_REJECTED: Final = "input.rejected"
TURN_QUEUED: Final = "turn.queued"
TURN_STARTED: Final = "turn.started"
TURN_COMPLETED: Final = "turn.completed"
TURN_FAILED: Final = "turn.failed"
LLM_CALL_REQUESTED: Final = "llm.call.requested"
LLM_CALL_DISPATCHED: Final = "llm.call.dispatched"
LLM_CALL_COMPLETED: Final = "llm.call.completed"
LLM_CALL_ERRORED: Final = "llm.call.errored"
TOOL_CALL_REQUESTED: Final = "tool.call.requested"
TOOL_CALL_DISPATCHED: Final = "tool.call.dispatched"
TOOL_CALL_WAITING: Final = "tool.call.waiting"
TOOL_CALL_COMPLETED: Final = "tool.call.completed"
TOOL_CALL_ERRORED: Final = "tool.call.errored"
CALL_RETRY_SCHEDULED: Final = "call.retry_scheduled"
DECISION_QUEUED: Final = "decision.queued"
DECISION_DISPATCHED: Final = "decision.dispatched"
DECISION_COMPLETED: Final = "decision.completed"
# The worker answered a decision request with an empty body: it decides later, through
# `POST /api/machine/workers/submit`, before the attempt's recorded deadline.
DECISION_WAITING: Final = "decision.waiting"
DECISION_ERRORED: Final = "decision.errored"
SESSION_INTERRUPTED: Final = "session.interrupted"
SESSION_INTERRUPT_RESUMED: Final = "session.interrupt_resumed"
SUBAGENT_REQUESTED: Final = "subagent.requested"
SUBAGENT_STARTED: Final = "subagent.started"
SUBAGENT_COMPLETED: Final = "subagent.completed"
SUBAGENT_ERRORED: Final = "subagent.errored"
DECISION_HELD: Final = "decision.held"
DECISION_RELEASED: Final = "decision.released"
CONNECTOR_SYNC_REQUESTED: Final = "connector.sync.requested"
CONNECTOR_SYNC_DISPATCHED: Final = "connector.sync.dispatched"
CONNECTOR_SYNCED: Final = "connector.synced"
CONNECTOR_SYNC_ERRORED: Final = "connector.sync.errored"

TURN_ENDS: Final = frozenset({TURN_COMPLETED, TURN_FAILED})
CALL_ENDS: Final = frozenset(
    {LLM_CALL_COMPLETED, LLM_CALL_ERRORED, TOOL_CALL_COMPLETED, TOOL_CALL_ERRORED}
)

_STRICT = ConfigDict(extra="forbid", strict=True)

# -- the records -----------------------------------------------------------------------

Usage = dict[str, Any]  # the neutral counts (SPEC §7), a call's with its vendor's raw `provider`


@with_config(_STRICT)
class Envelope(TypedDict):
    """One stored event: the payload with where and when it happened."""

    session_id: str
    seq: int
    occurred_at: str  # RFC 3339, UTC, milliseconds
    turn_id: NotRequired[str]
    payload: JSON


@with_config(_STRICT)
class SessionCreated(TypedDict):
    """The session's first event: its agent, who decides, and whom it belongs to."""

    type: str
    agent_id: str
    decider: str  # engine | worker
    identity: NotRequired[JSON]
    llm_routes: NotRequired[dict[str, JSON]]  # model block -> {type, format}
    ancestry: NotRequired[list[str]]  # parent sessions, root first


@with_config(_STRICT)
class AgentUpdated(TypedDict):
    """The agent config a `session.start` answer set, at the head it was written at."""

    type: str
    agent: JSON
    anchor: NotRequired[str | None]  # the head it was written at


@with_config(_STRICT)
class WorkerStateUpdated(TypedDict):
    """The worker's own state, kept for it at the head it was written at."""

    type: str
    state: Any
    anchor: NotRequired[str | None]


@with_config(_STRICT)
class ChannelsUpdated(TypedDict):
    """Informs clients; folds to nothing."""

    type: str
    channels: JSON


@with_config(_STRICT)
class MessageNew(TypedDict):
    """A message added to the tree, under `parent_id` (the head, unless it branches)."""

    type: str
    message: JSON  # carries its `id`
    parent_id: NotRequired[str | None]


@with_config(_STRICT)
class MessageSent(TypedDict):
    """A `message.send` to another session; folds to nothing."""

    type: str
    to: str
    message: JSON


@with_config(_STRICT)
class HeadMoved(TypedDict):
    """The active path ends elsewhere (a client resent an earlier view): state is read along it."""

    type: str
    head_id: str | None


@with_config(_STRICT)
class InputRejected(TypedDict):
    """An input the engine could not apply; folds to nothing (a turn.failed may follow)."""

    type: str
    input_kind: str
    error: ErrorInfo


@with_config(_STRICT)
class TurnQueued(TypedDict):
    """A turn waits behind the running one; its input starts it later."""

    type: str
    turn_id: str
    input: TurnStart  # the client input, started as is when the turn's time comes
    deadline_ms: NotRequired[int]  # when it has waited too long (its queue timeout)
    by: NotRequired[Submitter]  # who submitted it: {privilege, subject?} (interrupts.py)


@with_config(_STRICT)
class TurnStarted(TypedDict):
    """A turn began; its calls and decisions belong to it until it ends."""

    type: str
    turn_id: str
    parent: NotRequired[ParentRef]  # {session_id, call_id} when a parent's call runs it
    # The client's per-submit tools (`client.tools`, handler "client"): offered this turn only.
    client_tools: NotRequired[list[JSON]]
    # Who submitted it: {privilege: operator|frontend, subject?: {issuer, id}} (interrupts.py).
    by: NotRequired[Submitter]
    # The W3C trace context the client submitted with it: the turn's trace joins it.
    traceparent: NotRequired[str]
    tracestate: NotRequired[str]  # the vendor-specific part beside it, passed on untouched


@with_config(_STRICT)
class TurnCompleted(TypedDict):
    """The turn ended well; its usage and cost are final."""

    type: str
    turn_id: str
    cost: str
    usage: Usage
    data: NotRequired[Any]


@with_config(_STRICT)
class TurnFailed(TypedDict):
    """The turn ended with `error`; its usage and cost are final all the same."""

    type: str
    turn_id: str
    error: ErrorInfo
    cost: str
    usage: Usage


@with_config(_STRICT)
class LlmCallRequested(TypedDict):
    """A model call opens: who runs it, from which head, under which retry policy."""

    type: str
    id: str
    handler: str  # server | worker
    anchor: str | None
    params: JSON  # the action's overrides (+ `format` for a worker)
    retry: RetryPolicy  # the resolved policy (retry.py)
    # Under a budget: the input estimate {tokens, cost, cached?} it was checked with
    # (budgets.py; `cached`: tokens priced at the cache-read rate).
    estimate: NotRequired[JSON]


@with_config(_STRICT)
class ToolCallRequested(TypedDict):
    """A tool call opens, with the model's arguments and who runs it."""

    type: str
    id: str
    name: str
    arguments: str  # JSON text, as the model wrote it
    handler: str  # client | worker | subagent | server | another kind's (kinds.py)
    retry: RetryPolicy
    params: NotRequired[JSON]  # a connector tool's {connector, tool} (handler server)


@with_config(_STRICT)
class ConnectorSyncRequested(TypedDict):
    """A connection's tool list is fetched (a `connector` call: connectors.py)."""

    type: str
    id: str
    name: str  # the connection, `mcp.<id>`
    handler: str  # server
    retry: RetryPolicy
    params: NotRequired[JSON]  # {force: true}: fetched from the server, not a cache


@with_config(_STRICT)
class ConnectorSynced(TypedDict):
    """The connection's tools as the server listed them: the session's list from now on.
    Without `tools` the list is the one recorded before (a list is recorded when it changes).
    With `off`, the connection cannot start on this engine (why, in words): no tools, and
    not a failure (a note for the person, recorded once while it stays off)."""

    type: str
    id: str
    path: str
    tools: NotRequired[list[JSON]]  # {name, description?, input?, annotations?}
    prefix: NotRequired[str]  # the model sees `<prefix>__<name>`; absent: the raw names
    off: NotRequired[str]  # why the connection is off (`tools` is then empty)
    # How long a call of it may wait for approval (`[mcp.<id>] approve_timeout`); absent:
    # APPROVE_TIMEOUT_MS (requesting.py).
    approve_timeout_ms: NotRequired[int]


@with_config(_STRICT)
class DecisionHeld(TypedDict):
    """A turn's first decision waits for its connections' tool lists."""

    type: str
    trigger: Trigger
    proposed: Answer


@with_config(_STRICT)
class DecisionReleased(TypedDict):
    """The held first decision goes out: its connections' tool lists are in."""

    type: str


@with_config(_STRICT)
class CallDispatched(TypedDict):
    """`llm.call.dispatched` / `tool.call.dispatched`: attempt `attempt` is out."""

    type: str
    id: str
    attempt: int
    deadline_ms: int | None


@with_config(_STRICT)
class LlmCallCompleted(TypedDict):
    """A model call's attempt answered: its usage and cost roll into the turn."""

    type: str
    id: str
    attempt: int
    usage: Usage | None
    cost: str
    finish_reason: str | None
    model: str | None


@with_config(_STRICT)
class ToolCallWaiting(TypedDict):
    """An async worker tool: answered empty, settled later through the API."""

    type: str
    id: str
    attempt: int


@with_config(_STRICT)
class ToolCallCompleted(TypedDict):
    """A tool call's result, which closes the call."""

    type: str
    id: str
    result: JSON  # MCP content blocks


@with_config(_STRICT)
class CallErrored(TypedDict):
    """`llm.call.errored` / `tool.call.errored`: `final` closes the call."""

    type: str
    id: str
    attempt: int
    error: ErrorInfo
    retryable: bool
    final: bool


@with_config(_STRICT)
class RetryScheduled(TypedDict):
    """A backoff timer waits before `attempt`; `kind: decision` for a decision's."""

    type: str
    id: str
    attempt: int
    due_at: str
    kind: NotRequired[str]


@with_config(_STRICT)
class DecisionQueued(TypedDict):
    """A trigger waits for the session's one decision slot."""

    type: str
    trigger: Trigger
    proposed: Answer


@with_config(_STRICT)
class DecisionDispatched(TypedDict):
    """Attempt 1 opens the decision and carries what it is about; later ones only retry."""

    type: str
    decision_id: str
    attempt: int
    deadline_ms: int | None
    trigger: NotRequired[Trigger]
    proposed: NotRequired[Answer]
    retry: NotRequired[RetryPolicy]
    from_queue: NotRequired[bool]


@with_config(_STRICT)
class DecisionWaiting(TypedDict):
    """The worker will answer the live decision later (workers/submit); its deadline holds."""

    type: str
    decision_id: str
    attempt: int


@with_config(_STRICT)
class DecisionCompleted(TypedDict):
    """The worker's answer to the live decision was applied; the slot is free."""

    type: str
    decision_id: str
    attempt: int


@with_config(_STRICT)
class DecisionErrored(TypedDict):
    """An attempt of the live decision failed; `final` closes it."""

    type: str
    decision_id: str
    attempt: int
    error: ErrorInfo
    retryable: bool
    final: bool


@with_config(_STRICT)
class SessionInterrupted(TypedDict):
    """The turn pauses on a question until it is resumed."""

    type: str
    interrupt_id: str
    origin: str  # client | worker | connector | approval | budget
    reason: str
    payload: Any
    by: NotRequired[Submitter]  # the running turn's `by`: who may answer it (interrupts.py)


@with_config(_STRICT)
class SessionInterruptResumed(TypedDict):
    """An open interrupt was answered; the turn goes on."""

    type: str
    interrupt_id: str
    payload: NotRequired[Any]
    expired: NotRequired[bool]  # its `expiresAt` passed: the engine resolved it (declined)


@with_config(_STRICT)
class SubagentRequested(TypedDict):
    """A tool call spawns a child session running `agent_id`."""

    type: str
    id: str  # the child session
    tool_call_id: str
    agent_id: str
    mode: NotRequired[str]  # "detached" (absent: blocking)


@with_config(_STRICT)
class SubagentStarted(TypedDict):
    """The child's turn for the call started (its queue wait is over)."""

    type: str
    id: str
    tool_call_id: str


@with_config(_STRICT)
class SubagentEnded(TypedDict):
    """`subagent.completed` / `subagent.errored`: the child's usage and cost roll in.

    `detached`: a detached child's turn ended after its call was answered; its `result`
    is kept for a later `wait` call."""

    type: str
    id: str
    tool_call_id: str
    usage: Usage | None
    cost: str
    error: NotRequired[ErrorInfo | None]
    detached: NotRequired[bool]
    result: NotRequired[str | None]


Payload = (
    SessionCreated
    | AgentUpdated
    | WorkerStateUpdated
    | ChannelsUpdated
    | MessageNew
    | MessageSent
    | HeadMoved
    | InputRejected
    | TurnQueued
    | TurnStarted
    | TurnCompleted
    | TurnFailed
    | LlmCallRequested
    | ToolCallRequested
    | CallDispatched
    | LlmCallCompleted
    | ToolCallWaiting
    | ToolCallCompleted
    | CallErrored
    | RetryScheduled
    | DecisionQueued
    | DecisionDispatched
    | DecisionCompleted
    | DecisionWaiting
    | DecisionErrored
    | SessionInterrupted
    | SessionInterruptResumed
    | SubagentRequested
    | SubagentStarted
    | SubagentEnded
    | DecisionHeld
    | DecisionReleased
    | ConnectorSyncRequested
    | ConnectorSynced
)
"""Any event's payload: what `Step.emit` takes, so mypy checks each rule's fields."""

EVENTS: Final[Mapping[str, type]] = {
    SESSION_CREATED: SessionCreated,
    AGENT_UPDATED: AgentUpdated,
    WORKER_STATE_UPDATED: WorkerStateUpdated,
    CHANNELS_UPDATED: ChannelsUpdated,
    MESSAGE_NEW: MessageNew,
    MESSAGE_SENT: MessageSent,
    HEAD_MOVED: HeadMoved,
    INPUT_REJECTED: InputRejected,
    TURN_QUEUED: TurnQueued,
    TURN_STARTED: TurnStarted,
    TURN_COMPLETED: TurnCompleted,
    TURN_FAILED: TurnFailed,
    LLM_CALL_REQUESTED: LlmCallRequested,
    LLM_CALL_DISPATCHED: CallDispatched,
    LLM_CALL_COMPLETED: LlmCallCompleted,
    LLM_CALL_ERRORED: CallErrored,
    TOOL_CALL_REQUESTED: ToolCallRequested,
    TOOL_CALL_DISPATCHED: CallDispatched,
    TOOL_CALL_WAITING: ToolCallWaiting,
    TOOL_CALL_COMPLETED: ToolCallCompleted,
    TOOL_CALL_ERRORED: CallErrored,
    CALL_RETRY_SCHEDULED: RetryScheduled,
    DECISION_QUEUED: DecisionQueued,
    DECISION_DISPATCHED: DecisionDispatched,
    DECISION_COMPLETED: DecisionCompleted,
    DECISION_WAITING: DecisionWaiting,
    DECISION_ERRORED: DecisionErrored,
    SESSION_INTERRUPTED: SessionInterrupted,
    SESSION_INTERRUPT_RESUMED: SessionInterruptResumed,
    SUBAGENT_REQUESTED: SubagentRequested,
    SUBAGENT_STARTED: SubagentStarted,
    SUBAGENT_COMPLETED: SubagentEnded,
    SUBAGENT_ERRORED: SubagentEnded,
    DECISION_HELD: DecisionHeld,
    DECISION_RELEASED: DecisionReleased,
    CONNECTOR_SYNC_REQUESTED: ConnectorSyncRequested,
    CONNECTOR_SYNC_DISPATCHED: CallDispatched,
    CONNECTOR_SYNCED: ConnectorSynced,
    CONNECTOR_SYNC_ERRORED: CallErrored,
}
"""Every kind a log may hold, with the record its payload follows."""

# The kinds a turn's call can be in: "<kind>.call.<what>" for each call kind.
CALL_EVENTS: Final[Mapping[tuple[str, str], str]] = {
    ("llm", "dispatched"): LLM_CALL_DISPATCHED,
    ("llm", "errored"): LLM_CALL_ERRORED,
    ("tool", "dispatched"): TOOL_CALL_DISPATCHED,
    ("tool", "errored"): TOOL_CALL_ERRORED,
    ("connector", "dispatched"): CONNECTOR_SYNC_DISPATCHED,
    ("connector", "errored"): CONNECTOR_SYNC_ERRORED,
}


def call_event(call_kind: str, what: str) -> str:
    """The kind of a call's `dispatched` / `errored` event (`llm.call.errored`, ...)."""
    return CALL_EVENTS[(call_kind, what)]


@cache
def _adapter(record: type) -> TypeAdapter[Any]:
    return TypeAdapter(record)


def parse(payload: Mapping[str, Any]) -> Any:
    """Check a payload against its kind's record; returns it unchanged.

    Raises:
        ValueError: an unknown kind, or a missing, unknown or mistyped field
            (pydantic's `ValidationError` is a `ValueError`).
    """
    kind = payload.get("type")
    record = EVENTS.get(kind) if isinstance(kind, str) else None
    if record is None:
        raise ValueError(f"unknown event type {kind!r}")
    _adapter(record).validate_python(payload)
    return payload


def parse_event(event: Mapping[str, Any]) -> Any:
    """Check a stored event: its envelope, then its payload."""
    _adapter(Envelope).validate_python(event, strict=True)
    return parse(event["payload"])
