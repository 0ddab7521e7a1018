"""The shapes the rules hand each other and the log keeps: triggers, actions, answers,
client inputs, retry policies, and the small records the state holds (who submitted a
turn, an open interrupt, a queued turn, a child session, a synced connection). ErrorInfo
is the error model's (engine/errors.py), re-exported here.

Each is a `TypedDict` of the JSON as it is stored: a trigger or an answer *is* the dict
a rule builds, the log records and a worker request is built from, so nothing is
converted on the hot path and a log already in Redis keeps its shape. The wire forms
(what a worker is sent and may answer) are the pydantic models of engine/protocol.py,
checked at the edge; these are the engine's own records of them, which differ where
the engine keeps less (a stored `client.messages` names where its transcript ends; a
stored `tool.execute` only which call and attempt) — request.py spells the wire form out.

`type` is a `Literal` on every trigger and action, so a rule that compares it narrows
the union (mypy's tagged unions). A field marked `NotRequired` is one a rule leaves out,
or one an older version did not write. events.py's records use these, so the conftest's
check of every emitted event holds them to what the rules really write.

Why one module: some forty small records and no logic beyond the three checks that
tell a union's members apart; read side by side they are the protocol as the machine
keeps it, and split they would be three files that always change together.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypeGuard

from pydantic import ConfigDict, with_config
from typing_extensions import TypedDict  # pydantic reads typing's only from 3.12

from ..errors import ErrorInfo as ErrorInfo  # one definition, beside the error model

_STRICT = ConfigDict(extra="forbid", strict=True)

JSON = dict[str, Any]  # JSON whose shape is someone else's: a message, a config, a result


# -- who asked --------------------------------------------------------------


@with_config(_STRICT)
class Subject(TypedDict):
    """Whom a session or a turn was submitted as (an API key's owner, a Slack user)."""

    issuer: str | None
    id: str


@with_config(_STRICT)
class Submitter(TypedDict):
    """A turn's `by` (interrupts.py): the caller's privilege, and the subject it named."""

    privilege: str  # frontend | machine | operator | system
    subject: NotRequired[Subject]


@with_config(_STRICT)
class ParentRef(TypedDict):
    """The parent's call a child's turn runs for."""

    session_id: str
    call_id: str
    attempt: NotRequired[int]


# -- client inputs (SPEC §13 ClientInput): what a client submits -----------------------------


@with_config(_STRICT)
class _Starts(TypedDict):
    """What every input that starts a turn may carry: the client's fields, and the
    engine's own (`parent`: a child's turn; `traceparent`/`tracestate`: the trace it joins)."""

    agent_id: str
    turn_id: NotRequired[str | None]
    stream: NotRequired[bool | None]
    parent: NotRequired[ParentRef]
    traceparent: NotRequired[str]
    tracestate: NotRequired[str]


@with_config(_STRICT)
class MessageInput(_Starts):
    """`client.message`: one new message."""

    type: Literal["client.message"]
    message: JSON
    queue: NotRequired[bool | None]


@with_config(_STRICT)
class ViewInput(_Starts):
    """`client.messages`: the client's whole view of the conversation."""

    type: Literal["client.messages"]
    messages: list[JSON]
    client: NotRequired[JSON | None]  # the ClientContext


@with_config(_STRICT)
class AppendInput(_Starts):
    """`client.append`: messages added after what is recorded."""

    type: Literal["client.append"]
    messages: list[JSON]
    client: NotRequired[JSON | None]
    queue: NotRequired[bool | None]


@with_config(_STRICT)
class ActionInput(_Starts):
    """`client.action`: a named action (a button, a slash command)."""

    type: Literal["client.action"]
    name: str
    args: NotRequired[Any]


@with_config(_STRICT)
class ResumeInput(TypedDict):
    """`interrupt.resume`: an answer to an open interrupt."""

    type: Literal["interrupt.resume"]
    interrupt_id: str
    payload: NotRequired[Any]


@with_config(_STRICT)
class ToolResultInput(TypedDict):
    """`tool.result`: a client tool's result."""

    type: Literal["tool.result"]
    id: str
    attempt: NotRequired[int | None]
    result: NotRequired[Any]
    content: NotRequired[list[JSON] | None]
    structured_content: NotRequired[Any]
    is_error: NotRequired[bool | None]


@with_config(_STRICT)
class ToolErrorInput(TypedDict):
    """`tool.error`: a client tool's failure."""

    type: Literal["tool.error"]
    id: str
    error: str
    retryable: NotRequired[bool]
    attempt: NotRequired[int | None]


TurnStart = MessageInput | ViewInput | AppendInput | ActionInput
ClientInput = TurnStart | ResumeInput | ToolResultInput | ToolErrorInput


def is_turn_start(body: ClientInput) -> TypeGuard[TurnStart]:
    """Whether a client input starts a turn (or queues one)."""
    return body["type"] in ("client.message", "client.messages", "client.append", "client.action")


# -- retry policies (retry.py) -------------------------------------------------------------


@with_config(_STRICT)
class RetryPolicy(TypedDict):
    """A resolved policy (SPEC §11), as a call or a decision records it: whole seconds, as
    the wire's RetryPolicy has them. A kind that brings its own may leave a timeout out
    (then it has none)."""

    max_attempts: int
    backoff_base_secs: int
    backoff_max_secs: int
    queue_timeout_secs: NotRequired[int | None]
    run_timeout_secs: NotRequired[int | None]
    total_timeout_secs: NotRequired[int | None]


PolicyKey = Literal[
    "max_attempts",
    "backoff_base_secs",
    "backoff_max_secs",
    "queue_timeout_secs",
    "run_timeout_secs",
    "total_timeout_secs",
]
POLICY_KEYS: tuple[PolicyKey, ...] = (
    "queue_timeout_secs",
    "run_timeout_secs",
    "total_timeout_secs",
    "max_attempts",
    "backoff_base_secs",
    "backoff_max_secs",
)


# -- triggers: what a decision is asked about (SPEC §4) -----------------------------------


@with_config(_STRICT)
class SessionStart(TypedDict):
    """A session's first decision."""

    type: Literal["session.start"]


@with_config(_STRICT)
class ClientMessages(TypedDict):
    """New client messages. Recorded as the recorded path's end (`path_to`) and the new
    messages; a client's own view (`client.messages`) is recorded whole, with no `path_to`."""

    type: Literal["client.messages"]
    messages: list[JSON]
    new_from: int
    client: JSON  # the ClientContext
    path_to: NotRequired[str | None]


@with_config(_STRICT)
class ClientAction(TypedDict):
    """A named client action (a button, a slash command)."""

    type: Literal["client.action"]
    name: str
    args: NotRequired[Any]


@with_config(_STRICT)
class ToolExecute(TypedDict):
    """A worker tool call's attempt, as an answer to it is checked against."""

    type: Literal["tool.execute"]
    id: str
    attempt: int


@with_config(_STRICT)
class LlmExecute(TypedDict):
    """A worker-run model call's attempt, likewise."""

    type: Literal["llm.execute"]
    id: str
    attempt: int


@with_config(_STRICT)
class ToolFinished(TypedDict):
    """A tool call ended."""

    type: Literal["tool.finished"]
    id: str
    ok: bool
    name: str | None
    result: NotRequired[JSON]  # the MCP-shaped result
    error: NotRequired[ErrorInfo]


@with_config(_STRICT)
class LlmFinished(TypedDict):
    """A model call ended."""

    type: Literal["llm.finished"]
    id: str
    ok: bool
    truncated: bool
    refused: NotRequired[bool]
    message: NotRequired[JSON]
    cost: NotRequired[str]
    usage: NotRequired[JSON]
    error: NotRequired[ErrorInfo]


@with_config(_STRICT)
class SubagentFinished(TypedDict):
    """A child's run answered its tool call."""

    type: Literal["subagent.finished"]
    id: str  # the tool call
    ok: bool
    session_id: str  # the child
    agent_id: str
    result: NotRequired[str | None]
    error: NotRequired[ErrorInfo | None]


@with_config(_STRICT)
class InterruptResumed(TypedDict):
    """A paused turn was answered (whoever raised the interrupt)."""

    type: Literal["interrupt.resumed"]
    interrupt_id: str
    payload: NotRequired[Any]


@with_config(_STRICT)
class TurnFinished(TypedDict):
    """The turn has nothing left in flight: the worker is asked one last time."""

    type: Literal["turn.finished"]
    turn_id: str
    cost: str
    usage: JSON
    data: NotRequired[Any]


Trigger = (
    SessionStart
    | ClientMessages
    | ClientAction
    | ToolExecute
    | LlmExecute
    | ToolFinished
    | LlmFinished
    | SubagentFinished
    | InterruptResumed
    | TurnFinished
)
Execute = ToolExecute | LlmExecute


# -- actions: what a decision does (SPEC §5) ---------------------------------------------


@with_config(_STRICT)
class LlmCall(TypedDict):
    """Call the model; every field overrides the agent's config for this call."""

    type: Literal["llm.call"]
    id: NotRequired[str | None]
    llm: NotRequired[str | None]
    model: NotRequired[str | None]
    messages: NotRequired[list[JSON] | None]
    tools: NotRequired[list[JSON] | None]
    temperature: NotRequired[float | None]
    max_completion_tokens: NotRequired[int | None]
    reasoning: NotRequired[JSON | None]
    stream: NotRequired[bool | None]
    retry: NotRequired[JSON | None]


@with_config(_STRICT)
class ToolCall(TypedDict):
    """Call a tool by name (the name decides where it runs)."""

    type: Literal["tool.call"]
    name: str
    arguments: Any  # JSON text as the model wrote it, or a worker's JSON value
    id: NotRequired[str | None]
    retry: NotRequired[JSON | None]


@with_config(_STRICT)
class ToolResult(TypedDict):
    """Settle a worker tool call with its result."""

    type: Literal["tool.result"]
    id: NotRequired[str | None]
    attempt: NotRequired[int | None]
    result: NotRequired[Any]
    content: NotRequired[list[JSON] | None]
    structured_content: NotRequired[Any]
    is_error: NotRequired[bool | None]


@with_config(_STRICT)
class ToolError(TypedDict):
    """Settle a worker tool call as failed; no `retryable` means for good."""

    type: Literal["tool.error"]
    error: str
    id: NotRequired[str | None]
    attempt: NotRequired[int | None]
    retryable: NotRequired[bool | None]
    code: NotRequired[str | None]
    detail: NotRequired[Any]


@with_config(_STRICT)
class LlmResult(TypedDict):
    """Settle a worker-run model call with its response."""

    type: Literal["llm.result"]
    response: Any
    id: NotRequired[str | None]
    attempt: NotRequired[int | None]


@with_config(_STRICT)
class LlmError(TypedDict):
    """Settle a worker-run model call as failed."""

    type: Literal["llm.error"]
    error: str
    id: NotRequired[str | None]
    attempt: NotRequired[int | None]
    retryable: NotRequired[bool | None]
    code: NotRequired[str | None]
    detail: NotRequired[Any]


@with_config(_STRICT)
class SubagentSpawn(TypedDict):
    """Run a child session for a tool call."""

    type: Literal["subagent.spawn"]
    agent_id: str
    tool_call_id: str
    session_id: NotRequired[str | None]
    message: NotRequired[JSON | None]
    mode: NotRequired[str | None]
    retry: NotRequired[JSON | None]


@with_config(_STRICT)
class MessageSend(TypedDict):
    """Send a message to another session."""

    type: Literal["message.send"]
    session_id: str
    message: JSON


@with_config(_STRICT)
class Raise(TypedDict):
    """What an interrupt is raised with, by whoever raises it (interrupts.py)."""

    reason: str
    interrupt_id: NotRequired[str | None]
    payload: NotRequired[Any]


@with_config(_STRICT)
class Interrupt(Raise):
    """Pause the turn on a question (a worker's action)."""

    type: Literal["interrupt"]


@with_config(_STRICT)
class InterruptResolve(TypedDict):
    """Resume an open interrupt from the worker's side."""

    type: Literal["interrupt.resolve"]
    interrupt_id: str
    payload: NotRequired[Any]


@with_config(_STRICT)
class ConnectorSync(TypedDict):
    """Fetch a connection's tool list afresh."""

    type: Literal["connector.sync"]
    path: str


@with_config(_STRICT)
class Done(TypedDict):
    """Complete the turn."""

    type: Literal["done"]
    data: NotRequired[Any]


@with_config(_STRICT)
class Fail(TypedDict):
    """Fail the turn with this error."""

    type: Literal["fail"]
    error: ErrorInfo


Action = (
    LlmCall
    | ToolCall
    | ToolResult
    | ToolError
    | LlmResult
    | LlmError
    | SubagentSpawn
    | MessageSend
    | Interrupt
    | InterruptResolve
    | ConnectorSync
    | Done
    | Fail
)
Settle = ToolResult | ToolError | LlmResult | LlmError  # an action that ends a worker call
SETTLES: dict[str, str] = {
    "tool.result": "tool",
    "tool.error": "tool",
    "llm.result": "llm",
    "llm.error": "llm",
}  # each settling action, and the kind of call it ends


def is_settle(action: Action) -> TypeGuard[Settle]:
    """Whether `action` ends one of the worker's calls."""
    return action["type"] in SETTLES


def is_execute(trigger: Trigger) -> TypeGuard[Execute]:
    """Whether `trigger` asks the worker to run one of its calls."""
    return trigger["type"] in ("tool.execute", "llm.execute")


@with_config(_STRICT)
class Answer(TypedDict, total=False):
    """A decision: a worker's checked DecisionResponse, or the engine's own proposal.
    Empty writes nothing."""

    messages: list[JSON] | None
    actions: list[Action] | None
    state: Any
    agent: JSON | None
    channels: JSON | None


@with_config(_STRICT)
class Asked(TypedDict):
    """A trigger waiting for the decision slot (`pending`) or for its turn's connections
    (`held`), with the engine's proposal for it."""

    trigger: Trigger
    proposed: Answer


# -- what the state keeps ------------------------------------------------------------------


@with_config(_STRICT)
class OpenInterrupt(TypedDict):
    """An interrupt not yet resumed (`SessionState.interrupts`)."""

    interrupt_id: str
    origin: str  # client | worker | connector | approval | budget
    reason: str
    payload: Any
    by: NotRequired[Submitter]


@with_config(_STRICT)
class ChildOutcome(TypedDict):
    """How a detached child's run ended, kept for a later `wait` call."""

    ok: bool
    result: str | None
    error: ErrorInfo | None


@with_config(_STRICT)
class Child(TypedDict):
    """A child session of this one (`SessionState.children`), by its id."""

    agent_id: str
    call_id: str | None  # the call it is busy with; None: free for another
    mode: NotRequired[str]  # "detached" (absent: blocking)
    detached: NotRequired[str | None]  # the call a detached run goes on for
    last: NotRequired[ChildOutcome]  # a detached run's outcome, for `wait`


@with_config(_STRICT)
class Synced(TypedDict):
    """A connection's tool list as last synced (`SessionState.connectors`), by path."""

    tools: list[JSON]  # {name, description?, input?, annotations?}
    prefix: NotRequired[str]
    off: NotRequired[str]  # why the connection cannot run here (it offers nothing)
    approve_timeout_ms: NotRequired[int]
    error: NotRequired[ErrorInfo]  # the sync failed for good


@with_config(_STRICT)
class Queued(TypedDict):
    """A turn waiting behind the running one (`SessionState.queue`)."""

    turn_id: str
    input: TurnStart  # the client input, started as is
    deadline_ms: NotRequired[int]
    by: NotRequired[Submitter]
