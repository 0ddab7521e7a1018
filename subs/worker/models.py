"""The worker protocol's wire types, held equal to spec/protocol.schema.json.

Field names, required-ness and enums are the schema's (tests/test_worker_sdk.py fails
if they drift). What a worker sends (the response, its actions) is closed, so a typo
is an error naming its field; what it receives is open, so a field a newer engine adds
does not break an older worker. Deep structures (messages, agent configs, effects) stay
plain JSON: the engine checks them, and a worker mostly passes them through.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)

__all__ = [
    "Action",
    "ClientActionTrigger",
    "ClientMessagesTrigger",
    "ConnectorSyncAction",
    "DecisionRequest",
    "DecisionResponse",
    "DoneAction",
    "ErrorCode",
    "ErrorInfo",
    "FailAction",
    "InterruptAction",
    "InterruptResolveAction",
    "InterruptResumedTrigger",
    "LlmCallAction",
    "LlmErrorAction",
    "LlmExecuteTrigger",
    "LlmFinishedTrigger",
    "LlmResultAction",
    "MessageSendAction",
    "SessionStartTrigger",
    "StreamDelta",
    "SubagentFinishedTrigger",
    "SubagentSpawnAction",
    "ToolCallAction",
    "ToolErrorAction",
    "ToolExecuteTrigger",
    "ToolFinishedTrigger",
    "ToolInput",
    "ToolResultAction",
    "Trigger",
    "TurnFinishedTrigger",
    "WorkerIdentity",
]

ErrorCode = Literal[
    "provider_error",
    "rate_limited",
    "refused",
    "budget_exceeded",
    "deadline_exceeded",
    "invalid_response",
    "handler_error",
    "worker_unreachable",
    "unroutable",
    "internal",
]
SpawnMode = Literal["blocking", "detached", "wait"]
LlmFormat = Literal["openai", "anthropic"]
Json = Any  # any JSON value; the schema's `{}`


class _Sent(BaseModel):
    """A type the worker sends: closed, and written without the members left unset.

    A member set to `None` is written as `null` only where the schema allows JSON
    null there (`_nullable`); elsewhere it is left out, as an unset one is.
    """

    model_config = ConfigDict(extra="forbid")
    _nullable: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _wire(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        return {
            k: v
            for k, v in data.items()
            if k in self.model_fields_set or k == "type"
            if v is not None or k in self._nullable
        }


class _Received(BaseModel):
    """A type the worker receives: open, so a member a newer engine adds is kept."""

    model_config = ConfigDict(extra="allow")


# --- what the worker receives ---------------------------------------------------------


class ToolInput(_Received):
    """What the engine made of a tool call's arguments: `valid` (with `value`),
    `invalid` (`value` and `error`) or `malformed` (`error`)."""

    status: Literal["valid", "invalid", "malformed"]
    value: Json = None
    error: str | None = None


class ErrorInfo(_Sent):
    """Why something failed: one sentence and a code (and the input to fix)."""

    _nullable = frozenset({"param", "detail"})
    message: str
    code: ErrorCode
    param: str | None = None
    detail: Json = None


class ReceivedError(_Received):
    """An `ErrorInfo` as a trigger carries it."""

    message: str
    code: str
    param: str | None = None
    detail: Json = None


class Subject(_Received):
    """Who, as the source that authenticated them named them."""

    issuer: str
    id: str


class WorkerIdentity(_Received):
    """Who the session belongs to."""

    metadata: dict[str, str]
    subject: Subject | None = None
    visibility: Literal["shared", "private"] | None = None


class SessionStartTrigger(_Received):
    """A new session: answer with the agent config (or accept the file's)."""

    type: Literal["session.start"]


class ClientMessagesTrigger(_Received):
    """New messages from a client; `messages[new_from:]` are the new ones."""

    type: Literal["client.messages"]
    messages: list[dict[str, Any]]
    new_from: int
    client: dict[str, Any]


class ClientActionTrigger(_Received):
    """A named action from a client (a Slack `/command`)."""

    type: Literal["client.action"]
    name: str
    args: Json = None


class ToolExecuteTrigger(_Received):
    """Run one of the agent's worker tools; answer `tool.result` or `tool.error`,
    or an empty answer to settle it later."""

    type: Literal["tool.execute"]
    id: str
    name: str
    arguments: str
    input: ToolInput
    attempt: int
    deadline: str | None = None


class ToolFinishedTrigger(_Received):
    """A tool call ended."""

    type: Literal["tool.finished"]
    id: str
    ok: bool
    name: str
    result: Json = None
    error: ReceivedError | None = None


class LlmExecuteTrigger(_Received):
    """Run a model call for the engine; answer `llm.result` / `llm.error` or a stream."""

    type: Literal["llm.execute"]
    id: str
    request: Json
    stream: bool
    attempt: int
    format: LlmFormat | None = None
    deadline: str | None = None


class LlmFinishedTrigger(_Received):
    """A model call ended."""

    type: Literal["llm.finished"]
    id: str
    ok: bool
    truncated: bool
    refused: bool = False
    message: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    cost: str | None = None
    error: ReceivedError | None = None


class SubagentFinishedTrigger(_Received):
    """A child session a tool call started has ended."""

    type: Literal["subagent.finished"]
    id: str
    ok: bool
    session_id: str
    agent_id: str
    result: str | None = None
    error: ReceivedError | None = None


class InterruptResumedTrigger(_Received):
    """A human answered an interrupt (or it expired)."""

    type: Literal["interrupt.resumed"]
    interrupt_id: str
    payload: Json = None


class TurnFinishedTrigger(_Received):
    """The turn is over; until this is answered the session stays busy."""

    type: Literal["turn.finished"]
    turn_id: str
    cost: str | None = None
    usage: dict[str, Any] | None = None
    data: Json = None


Trigger = Annotated[
    SessionStartTrigger
    | ClientMessagesTrigger
    | ClientActionTrigger
    | ToolExecuteTrigger
    | ToolFinishedTrigger
    | LlmExecuteTrigger
    | LlmFinishedTrigger
    | SubagentFinishedTrigger
    | InterruptResumedTrigger
    | TurnFinishedTrigger,
    Field(discriminator="type"),
]

# --- what the worker sends ------------------------------------------------------------


class LlmCallAction(_Sent):
    """Ask the model, with the agent's config unless a member says otherwise."""

    _nullable = frozenset(
        {
            "id",
            "llm",
            "max_completion_tokens",
            "messages",
            "model",
            "reasoning",
            "retry",
            "stream",
            "temperature",
            "tools",
        }
    )
    type: Literal["llm.call"] = "llm.call"
    id: str | None = None
    model: str | None = None
    llm: str | None = None
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    temperature: float | None = None
    max_completion_tokens: int | None = None
    reasoning: dict[str, Any] | None = None
    stream: bool | None = None
    retry: dict[str, Any] | None = None


class ToolCallAction(_Sent):
    """Run a tool (the name says where)."""

    _nullable = frozenset({"id", "retry", "arguments"})
    type: Literal["tool.call"] = "tool.call"
    name: str
    arguments: Json
    id: str | None = None
    retry: dict[str, Any] | None = None


class ToolResultAction(_Sent):
    """The outcome of a `tool.execute` (`id`, `attempt` default to the trigger's)."""

    _nullable = frozenset({"id", "attempt", "content", "result", "structured_content"})
    type: Literal["tool.result"] = "tool.result"
    result: Json = None
    id: str | None = None
    attempt: int | None = None
    content: list[Any] | None = None
    structured_content: Json = None
    is_error: bool | None = None


class ToolErrorAction(_Sent):
    """A `tool.execute` failed."""

    _nullable = frozenset({"id", "attempt", "code", "detail"})
    type: Literal["tool.error"] = "tool.error"
    error: str
    retryable: bool | None = None
    code: ErrorCode | None = None
    detail: Json = None
    id: str | None = None
    attempt: int | None = None


class LlmResultAction(_Sent):
    """The outcome of an `llm.execute`: an `LlmResponse` (or the vendor's own)."""

    _nullable = frozenset({"id", "attempt", "response"})
    type: Literal["llm.result"] = "llm.result"
    response: Json
    id: str | None = None
    attempt: int | None = None


class LlmErrorAction(_Sent):
    """An `llm.execute` failed."""

    _nullable = frozenset({"id", "attempt", "code", "detail"})
    type: Literal["llm.error"] = "llm.error"
    error: str
    retryable: bool | None = None
    code: ErrorCode | None = None
    detail: Json = None
    id: str | None = None
    attempt: int | None = None


class SubagentSpawnAction(_Sent):
    """Start a child session."""

    _nullable = frozenset({"message", "mode", "retry", "session_id"})
    type: Literal["subagent.spawn"] = "subagent.spawn"
    agent_id: str
    tool_call_id: str
    session_id: str | None = None
    message: dict[str, Any] | None = None
    mode: SpawnMode | None = None
    retry: dict[str, Any] | None = None


class MessageSendAction(_Sent):
    """Post a message into another session."""

    type: Literal["message.send"] = "message.send"
    session_id: str
    message: dict[str, Any]


class InterruptAction(_Sent):
    """Pause for a human."""

    _nullable = frozenset({"interrupt_id", "payload"})
    type: Literal["interrupt"] = "interrupt"
    reason: str
    interrupt_id: str | None = None
    payload: Json = None


class InterruptResolveAction(_Sent):
    """Resume an interrupt."""

    _nullable = frozenset({"payload"})
    type: Literal["interrupt.resolve"] = "interrupt.resolve"
    interrupt_id: str
    payload: Json = None


class ConnectorSyncAction(_Sent):
    """Fetch an MCP connection's tools afresh (`mcp.<id>`)."""

    type: Literal["connector.sync"] = "connector.sync"
    path: str


class DoneAction(_Sent):
    """End the turn."""

    _nullable = frozenset({"data"})
    type: Literal["done"] = "done"
    data: Json = None


class FailAction(_Sent):
    """End the turn as failed."""

    type: Literal["fail"] = "fail"
    error: ErrorInfo


Action = Annotated[
    LlmCallAction
    | ToolCallAction
    | ToolResultAction
    | LlmResultAction
    | ToolErrorAction
    | LlmErrorAction
    | SubagentSpawnAction
    | MessageSendAction
    | InterruptAction
    | InterruptResolveAction
    | ConnectorSyncAction
    | DoneAction
    | FailAction,
    Field(discriminator="type"),
]


class DecisionResponse(_Sent):
    """A worker's answer; every member is optional, and `{}` writes nothing (for a
    `tool.execute`: the call stays open, to be settled later)."""

    messages: list[dict[str, Any]] | None = None
    actions: list[Action] | None = None
    state: Json = None
    agent: dict[str, Any] | None = None
    channels: dict[str, Any] | None = None

    def to_wire(self) -> dict[str, Any]:
        """The JSON object to send."""
        return self.model_dump(mode="json")


class StreamDelta(_Sent):
    """One `llm.token.delta` frame of a streamed answer."""

    _nullable = frozenset({"finish_reason", "reasoning", "text"})
    text: str | None = None
    reasoning: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    finish_reason: str | None = None


class DecisionRequest(_Received):
    """What the engine asks: `trigger` says what happened, `proposed` what it would do."""

    session_id: str
    decision_id: str
    agent_id: str
    identity: WorkerIdentity
    trigger: Trigger
    proposed: DecisionResponse
    state: Json
    calls: list[dict[str, Any]]
    pending_calls: int
    messages: list[dict[str, Any]]
    message_tree: dict[str, Any]
    ancestry: list[str]
    attempts: int
    turn_id: str | None = None
    agent: dict[str, Any] | None = None
    worker: Json = None
    deadline: str | None = None
