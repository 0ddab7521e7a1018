"""Wire types of the worker/client protocol, mirroring spec/protocol.schema.json.

Field names, required-ness and enums follow the schema exactly, so what we send
validates and whatever a schema-valid worker or client sends parses. Models are
strict and closed (`extra="forbid"`) like the schema, so a typo is an error that
names its field. Optional fields default to `None`; `to_wire` leaves out a field
that was never set, and a `None` where the schema does not allow `null`.

Why one module: it mirrors one schema file, one model or enum per `$defs` entry (over a
hundred), and tests/test_protocol.py finds each here by its schema name to hold fields,
required-ness, nulls and enums to it; the models nest across the schema's sections (a
decision request holds a trigger, messages, content, the agent config), so no split
would follow a line the schema draws.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    StringConstraints,
    Tag,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
)
from pydantic.fields import FieldInfo

from engine.errors import ErrorCode, ProtocolError, SubsError

__all__ = [
    "AgentConfig",
    "AgentTool",
    "AttachmentContent",
    "AudioContent",
    "AudioData",
    "BlobContent",
    "ClientAction",
    "ClientActionTrigger",
    "ClientAppend",
    "ClientContext",
    "ClientInput",
    "ClientInterruptResume",
    "ClientMessage",
    "ClientMessages",
    "ClientMessagesTrigger",
    "ClientToolError",
    "ClientToolResult",
    "ConnectorSyncAction",
    "Content",
    "ContentPart",
    "ContentPartWire",
    "DecisionAction",
    "DecisionRequest",
    "DecisionResponse",
    "DecisionTrigger",
    "DoneAction",
    "DraftMessage",
    "Effect",
    "EffectKind",
    "EffectStatus",
    "ErrorCode",
    "ErrorInfo",
    "Event",
    "EventPayload",
    "FailAction",
    "FileData",
    "FilePart",
    "Handler",
    "ImageContent",
    "ImageUrl",
    "ImageUrlPart",
    "InputAudioPart",
    "InterruptAction",
    "InterruptOption",
    "InterruptPayload",
    "InterruptResolution",
    "InterruptResolveAction",
    "InterruptResponder",
    "InterruptResumedTrigger",
    "LinkContent",
    "LlmCallAction",
    "LlmErrorAction",
    "LlmExecuteTrigger",
    "LlmFinishedTrigger",
    "LlmFormat",
    "LlmRequest",
    "LlmResponse",
    "LlmResultAction",
    "LlmTool",
    "Message",
    "MessageSendAction",
    "MessageTree",
    "MessageTreeNode",
    "ProtocolError",
    "Reasoning",
    "ReasoningConfig",
    "ReasoningEffort",
    "ReasoningProvider",
    "ResourceContent",
    "ResourceContents",
    "ResourceLinkContent",
    "ResponseImage",
    "ResumeStatus",
    "RetryConfig",
    "RetryOverride",
    "RetryPolicy",
    "Role",
    "SessionStartTrigger",
    "SpawnMode",
    "StoredContent",
    "StoredResult",
    "StreamDelta",
    "Subagent",
    "SubagentFinishedTrigger",
    "SubagentMode",
    "SubagentSpawnAction",
    "SubagentTools",
    "Subject",
    "SubsError",
    "TextContent",
    "TokenDelta",
    "ToolCall",
    "ToolCallAction",
    "ToolCallChunk",
    "ToolCallFunction",
    "ToolContent",
    "ToolErrorAction",
    "ToolExecuteTrigger",
    "ToolFinishedTrigger",
    "ToolInput",
    "ToolInputInvalid",
    "ToolInputMalformed",
    "ToolInputValid",
    "ToolResultAction",
    "TurnFinishedTrigger",
    "Usage",
    "VideoUrl",
    "VideoUrlPart",
    "WireModel",
    "WorkerIdentity",
    "WorkerRef",
    "parse_client_input",
    "parse_decision_response",
    "to_json",
    "to_wire",
]

T = TypeVar("T")


class _WireNull:
    """Marks a field whose schema type includes `null`, so an explicit null survives a dump."""


_WIRE_NULL = _WireNull()

Nullable = Annotated[T | None, _WIRE_NULL]
"""Optional, and `null` is a legal wire value (schema `["x", "null"]`)."""

UInt = Annotated[int, Field(ge=0)]
Cost = Annotated[str, StringConstraints(pattern=r"^-?\d+(\.\d+)?$")]


def _rfc3339(value: str) -> str:
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"not an RFC 3339 timestamp: {value!r}") from None
    if parsed.tzinfo is None:
        raise ValueError(f"RFC 3339 timestamp needs a UTC offset: {value!r}")
    return value


Timestamp = Annotated[str, AfterValidator(_rfc3339)]

# --- enums -------------------------------------------------------------------

Role = Literal["system", "user", "assistant", "tool"]
ReasoningEffort = Literal["xhigh", "high", "medium", "low", "minimal", "none"]
ReasoningProvider = Literal["anthropic", "openai", "openrouter"]
LlmFormat = Literal["openai", "anthropic"]
Handler = Literal["server", "worker", "client"]
EffectKind = Literal["tool_call", "subagent", "llm_call", "connector_sync", "decision", "turn_end"]
EffectStatus = Literal["pending", "completed", "failed", "retry_scheduled", "queued", "running"]
SpawnMode = Literal["blocking", "detached", "wait"]
SubagentMode = Literal["blocking", "detached", "any"]
ResumeStatus = Literal["resolved", "cancelled"]


# --- base --------------------------------------------------------------------


def _null_allowed(field: FieldInfo) -> bool:
    return field.annotation is Any or _WIRE_NULL in field.metadata


class WireModel(BaseModel):
    """Strict, closed base whose dump leaves out unset optional fields and illegal nulls."""

    model_config = ConfigDict(extra="forbid", strict=True)

    # Our own fields the schema lacks: kept in state, left out of `to_wire`.
    _wire_extensions: ClassVar[tuple[str, ...]] = ()
    # (name, null allowed) for each optional field; computed once per class.
    _wire_optional: ClassVar[tuple[tuple[str, bool], ...]] = ()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls._wire_optional = tuple(
            (name, _null_allowed(field))
            for name, field in cls.model_fields.items()
            if not field.is_required() and field.default is None
        )

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> Any:
        data = handler(self)
        fields_set = self.model_fields_set
        for name, null_allowed in self._wire_optional:
            if name in data and (
                name not in fields_set or (data[name] is None and not null_allowed)
            ):
                del data[name]
        if self._wire_extensions and info.context and info.context.get("wire"):
            for name in self._wire_extensions:
                data.pop(name, None)
        return data


def to_wire(model: BaseModel) -> dict[str, Any]:
    """JSON-ready dict exactly as the schema allows it: what we send a worker or client."""
    return model.model_dump(mode="json", context={"wire": True})


def to_json(model: BaseModel) -> dict[str, Any]:
    """JSON-ready dict for our own state: `to_wire` plus our extensions (AgentConfig's)."""
    return model.model_dump(mode="json")


# --- errors, usage, identity -------------------------------------------------


class ErrorInfo(WireModel):
    """SPEC §5: a failure as a worker or client reads it; `code` is a closed set."""

    message: str
    code: ErrorCode
    param: Nullable[str] = None
    detail: Any = None


class Usage(WireModel):
    """Token counts of a call or a turn."""

    input: UInt
    output: UInt
    uncached_input: UInt
    cache_read: UInt
    cache_write: UInt
    total: UInt
    provider: Any = None


class Subject(WireModel):
    """Who a session belongs to: an id within its issuer."""

    issuer: str
    id: str


class WorkerIdentity(WireModel):
    """The session's identity as a worker receives it."""

    metadata: dict[str, str]
    subject: Nullable[Subject] = None
    visibility: Literal["shared", "private"] | None = None


class WorkerRef(WireModel):
    """The worker a request comes from or goes to."""

    id: str
    url: Nullable[str] = None


# --- content -----------------------------------------------------------------


class TextContent(WireModel):
    """A text block: the same shape in MCP results, stored results and messages."""

    type: Literal["text"] = "text"
    text: str


class BlobContent(WireModel):
    """A content part stored elsewhere, by URI."""

    type: Literal["blob"] = "blob"
    uri: str


class LinkContent(WireModel):
    """A content part that is a link, not its bytes."""

    type: Literal["link"] = "link"
    uri: str
    mimeType: Nullable[str] = None
    name: Nullable[str] = None


class AttachmentContent(WireModel):
    """The schema's `attachment` block (an Attachment plus `type`); unused for now."""

    type: Literal["attachment"] = "attachment"
    id: str
    mime: str
    size: UInt
    uri: str


class ImageUrl(WireModel):
    """An image part's URL (or data: URL), as OpenAI's chat format spells it."""

    url: str


class FileData(WireModel):
    """A file part's name and base64 data."""

    filename: str
    file_data: str


class AudioData(WireModel):
    """An audio part's base64 data and format."""

    data: str
    format: str


class VideoUrl(WireModel):
    """A video part's URL."""

    url: str


class ImageUrlPart(WireModel):
    """An image in a message's content."""

    type: Literal["image_url"] = "image_url"
    image_url: ImageUrl


class FilePart(WireModel):
    """A file in a message's content."""

    type: Literal["file"] = "file"
    file: FileData


class InputAudioPart(WireModel):
    """Audio in a message's content."""

    type: Literal["input_audio"] = "input_audio"
    input_audio: AudioData


class VideoUrlPart(WireModel):
    """A video in a message's content."""

    type: Literal["video_url"] = "video_url"
    video_url: VideoUrl


StoredContent = Annotated[
    TextContent | BlobContent | LinkContent | AttachmentContent, Field(discriminator="type")
]
ContentPart = Annotated[
    TextContent | ImageUrlPart | FilePart | InputAudioPart | VideoUrlPart,
    Field(discriminator="type"),
]
ContentPartWire = Annotated[
    TextContent
    | BlobContent
    | LinkContent
    | AttachmentContent
    | ImageUrlPart
    | FilePart
    | InputAudioPart
    | VideoUrlPart,
    Field(discriminator="type"),
]


def _content_kind(value: Any) -> str | None:
    if isinstance(value, str):
        return "str"
    if isinstance(value, list):
        return "list"
    return None


Content = Annotated[
    Annotated[str, Tag("str")] | Annotated[list[ContentPartWire], Tag("list")],
    Discriminator(
        _content_kind,
        custom_error_type="content_type",
        custom_error_message="Input should be a string or an array of content parts",
    ),
]


class ResourceContents(WireModel):
    """An MCP embedded resource's contents: text or a blob, by URI."""

    uri: str
    blob: Nullable[str] = None
    mimeType: Nullable[str] = None
    text: Nullable[str] = None


class ImageContent(WireModel):
    """An MCP tool result's image, inline."""

    type: Literal["image"] = "image"
    data: str
    mimeType: str


class AudioContent(WireModel):
    """An MCP tool result's audio, inline."""

    type: Literal["audio"] = "audio"
    data: str
    mimeType: str


class ResourceContent(WireModel):
    """An MCP tool result's embedded resource."""

    type: Literal["resource"] = "resource"
    resource: ResourceContents


class ResourceLinkContent(WireModel):
    """An MCP tool result's link to a resource it does not embed."""

    type: Literal["resource_link"] = "resource_link"
    uri: str
    mimeType: Nullable[str] = None
    name: Nullable[str] = None


ToolContent = Annotated[
    TextContent | ImageContent | AudioContent | ResourceContent | ResourceLinkContent,
    Field(discriminator="type"),
]


class StoredResult(WireModel):
    """A settled tool result as the engine keeps it: MCP's CallToolResult shape."""

    content: list[StoredContent] | None = None
    isError: bool | None = None
    structuredContent: Any = None


# --- messages ----------------------------------------------------------------


class ToolCallFunction(WireModel):
    """The function a tool call names, its arguments as JSON text."""

    name: str
    arguments: str


class ToolCall(WireModel):
    """A tool call in an assistant message."""

    id: str
    type: str
    function: ToolCallFunction


class ToolCallChunk(WireModel):
    """A piece of a tool call as it streams."""

    id: str
    arguments: Nullable[str] = None
    name: Nullable[str] = None


class Reasoning(WireModel):
    """A model's reasoning, kept in its vendor's form to send back to that vendor."""

    provider: ReasoningProvider
    text: Nullable[str] = None
    blocks: list[Any] | None = None


class ReasoningConfig(WireModel):
    """How much a model should reason, and whether to return it."""

    effort: Nullable[ReasoningEffort] = None
    enabled: Nullable[bool] = None
    exclude: Nullable[bool] = None
    max_tokens: Nullable[UInt] = None


class Message(WireModel):
    """A recorded message: it has an id."""

    id: str
    role: Role
    content: Nullable[Content] = None
    name: Nullable[str] = None
    reasoning: Nullable[Reasoning] = None
    tool_call_id: Nullable[str] = None
    tool_calls: list[ToolCall] | None = None


class DraftMessage(WireModel):
    """A message as written on the wire; `id` is absent until it is recorded."""

    role: Role
    id: Nullable[str] = None
    content: Nullable[Content] = None
    name: Nullable[str] = None
    reasoning: Nullable[Reasoning] = None
    tool_call_id: Nullable[str] = None
    tool_calls: Nullable[list[ToolCall]] = None


class MessageTreeNode(WireModel):
    """One message of the tree and its parent."""

    message: Message
    parent_id: Nullable[str] = None


class MessageTree(WireModel):
    """Every message of a session, branches included, and the head of the active path."""

    nodes: list[MessageTreeNode]
    head_id: Nullable[str] = None


# --- LLM ---------------------------------------------------------------------


class LlmTool(WireModel):
    """A tool as a model is offered it: name, description, input schema."""

    name: str
    description: str
    input: Any = None
    output: Any = None
    defer: bool | None = None


class LlmRequest(WireModel):
    """The neutral request a worker-run LLM call receives when no `format` is set."""

    model: str
    messages: list[DraftMessage]
    max_completion_tokens: Nullable[UInt] = None
    reasoning: Nullable[ReasoningConfig] = None
    temperature: Nullable[float] = None
    tools: Nullable[list[LlmTool]] = None


class ResponseImage(WireModel):
    """An image a model answered with."""

    url: str


class LlmResponse(WireModel):
    """The neutral response a worker returns in `llm.result` when no `format` is set."""

    model: str
    content: Nullable[str] = None
    cost: Nullable[Cost] = None
    finish_reason: Nullable[str] = None
    images: list[ResponseImage] | None = None
    reasoning: Nullable[Reasoning] = None
    tool_calls: list[ToolCall] | None = None
    usage: Nullable[Usage] = None


class StreamDelta(WireModel):
    """One neutral `llm.token.delta` frame of a worker's streamed LLM answer."""

    text: Nullable[str] = None
    reasoning: Nullable[str] = None
    tool_calls: list[ToolCallChunk] | None = None
    finish_reason: Nullable[str] = None


class TokenDelta(WireModel):
    """One streamed piece of a model call, as readers of a session receive it."""

    tenant_id: str
    root_session_id: str
    session_id: str
    agent_id: str
    call_id: str
    attempt: UInt
    seq: UInt
    tool_calls: list[ToolCallChunk]
    text: Nullable[str] = None
    reasoning: Nullable[str] = None
    finish_reason: Nullable[str] = None
    turn_id: Nullable[str] = None


# --- agent config ------------------------------------------------------------


class RetryOverride(WireModel):
    """Retry settings that override the defaults for one kind of call."""

    queue_timeout_secs: Nullable[UInt] = None
    run_timeout_secs: Nullable[UInt] = None
    total_timeout_secs: Nullable[UInt] = None
    max_attempts: Nullable[UInt] = None
    backoff_base_secs: Nullable[UInt] = None
    backoff_max_secs: Nullable[UInt] = None


class RetryPolicy(WireModel):
    """A whole retry policy: attempts, backoff and timeouts."""

    max_attempts: UInt
    backoff_base_secs: UInt
    backoff_max_secs: UInt
    queue_timeout_secs: Nullable[UInt] = None
    run_timeout_secs: Nullable[UInt] = None
    total_timeout_secs: Nullable[UInt] = None


class RetryConfig(WireModel):
    """An agent's retry overrides, by kind of call."""

    default: Nullable[RetryOverride] = None
    llm: Nullable[RetryOverride] = None
    tool: Nullable[RetryOverride] = None
    subagent: Nullable[RetryOverride] = None
    connector: Nullable[RetryOverride] = None


class AgentTool(WireModel):
    """A tool the agent declares, and who runs it."""

    name: str
    description: str | None = None
    handler: Nullable[Handler] = None
    input: Any = None
    output: Any = None
    defer: Nullable[bool] = None


class Subagent(WireModel):
    """An agent this agent may spawn, and how."""

    id: str
    description: str | None = None
    mode: Nullable[SubagentMode] = None
    prefix: Nullable[bool] = None
    defer: Nullable[bool] = None


class SubagentTools(WireModel):
    """How subagents are offered to the model as tools."""

    strategy: Literal["per_agent", "single"] | None = None
    wait: Nullable[bool] = None


class BudgetPrice(WireModel):
    """The model's prices the engine estimates a call's cost with (USD / 1M tokens): input,
    and the cache-read price of the input the vendor's prompt cache holds."""

    input: str
    cache_read: str | None = None


class TurnBudget(WireModel):
    """Ours (issue #28): what one turn of the agent may spend (engine/machine/budgets.py)."""

    max_cost_usd: float | None = Field(default=None, ge=0)
    max_model_calls: int | None = Field(default=None, ge=0)
    max_tool_calls: int | None = Field(default=None, ge=0)
    max_tokens: int | None = Field(default=None, ge=0)
    on_exceeded: Literal["fail", "ask"] | None = None
    price: BudgetPrice | None = None


class SessionBudget(WireModel):
    """Ours (issue #28): what the session may spend over its life."""

    max_cost_usd: float | None = Field(default=None, ge=0)
    on_exceeded: Literal["fail", "ask"] | None = None
    price: BudgetPrice | None = None  # when the agent has no per-turn budget to carry it


class AgentConfig(WireModel):
    """An agent config from the file or a worker.

    `handler`, `format` and `stream` are not in the schema but seed 002's workers
    send them; we keep them in state and leave them out of `to_wire`.
    MCP, plugin, attachment and deferral settings are carried, not interpreted.
    """

    _wire_extensions: ClassVar[tuple[str, ...]] = (
        "handler",
        "format",
        "stream",
        "budget",
        "session_budget",
    )

    model: str
    llm: Nullable[str] = None
    system: Nullable[str] = None
    effort: Nullable[ReasoningEffort] = None
    tools: list[AgentTool] | None = None
    subagents: list[Subagent] | None = None
    subagent_tools: Nullable[SubagentTools] = None
    max_subagent_depth: Nullable[UInt] = None
    retry: Nullable[RetryConfig] = None
    defer_tools: Nullable[bool | dict[str, Any]] = None
    mcp: list[dict[str, Any]] | None = None
    mcp_announce: Literal["auto", "never"] | None = None
    plugins: list[dict[str, Any]] | None = None
    attachments: Nullable[dict[str, Any]] = None
    handler: Literal["server", "worker"] | None = None
    format: LlmFormat | None = None
    stream: bool | None = None
    budget: TurnBudget | None = None  # ours: engine/machine/budgets.py
    session_budget: SessionBudget | None = None

    @field_validator("format")
    @classmethod
    def _format_needs_worker(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and info.data.get("handler") != "worker":
            raise ValueError('format requires handler "worker"')
        return value


# --- tool input, effects, client context -------------------------------------


class ToolInputValid(WireModel):
    """Tool arguments that parsed and fit the tool's input schema."""

    status: Literal["valid"] = "valid"
    value: Any


class ToolInputInvalid(WireModel):
    """Tool arguments that parsed but break the input schema, and how."""

    status: Literal["invalid"] = "invalid"
    value: Any
    error: str


class ToolInputMalformed(WireModel):
    """Tool arguments that are not JSON at all."""

    status: Literal["malformed"] = "malformed"
    error: str


ToolInput = Annotated[
    ToolInputValid | ToolInputInvalid | ToolInputMalformed, Field(discriminator="status")
]


class Effect(WireModel):
    """A call still open, as each decision request lists it."""

    id: str
    kind: EffectKind
    status: EffectStatus
    attempt: UInt
    agent_id: Nullable[str] = None
    anchor: Nullable[str] = None
    arguments: Nullable[str] = None
    deadline: Nullable[Timestamp] = None
    handler: Nullable[Handler] = None
    name: Nullable[str] = None
    session_id: Nullable[str] = None
    stream: Nullable[bool] = None


class ClientContext(WireModel):
    """What the client sent with its input for the worker (AG-UI's context)."""

    context: list[Any] | None = None
    forwarded_props: Any = None
    state: Any = None
    tools: list[AgentTool] | None = None


# --- interrupts --------------------------------------------------------------


class InterruptOption(WireModel):
    """One answer a prompt offers."""

    label: str
    value: Any
    style: Nullable[str] = None


class InterruptPayload(WireModel):
    """AG-UI interrupt payload; `metadata.options` holds `InterruptOption`s."""

    message: Nullable[str] = None
    toolCallId: Nullable[str] = None
    expiresAt: Nullable[str] = None
    responseSchema: Any = None
    metadata: Any = None

    @field_validator("expiresAt")
    @classmethod
    def _a_time(cls, value: str | None) -> str | None:
        """The engine enforces it (engine/machine/interrupts.py): it must name a time."""
        if value is not None:
            try:
                datetime.fromisoformat(value)
            except ValueError:
                raise ValueError(
                    f"not an RFC 3339 time ({value!r}), such as 2026-12-06T04:30:00Z"
                ) from None
        return value


class InterruptResponder(WireModel):
    """Who answered an interrupt, and where."""

    channel: str
    user: Nullable[str] = None
    label: Nullable[str] = None
    style: Nullable[str] = None


class InterruptResolution(WireModel):
    """How an interrupt ended, for the worker."""

    status: ResumeStatus
    payload: Any = None
    responder: Nullable[InterruptResponder] = None


# --- triggers ----------------------------------------------------------------


class SessionStartTrigger(WireModel):
    """A session's first decision: the worker may set the agent config."""

    type: Literal["session.start"] = "session.start"


class ClientMessagesTrigger(WireModel):
    """New client messages to answer; `new_from` is where they start."""

    type: Literal["client.messages"] = "client.messages"
    messages: list[DraftMessage]
    new_from: UInt
    client: ClientContext


class ClientActionTrigger(WireModel):
    """A named client action (a button, a slash command) to handle."""

    type: Literal["client.action"] = "client.action"
    name: str
    args: Any = None


class ToolExecuteTrigger(WireModel):
    """The worker is asked to run one of its tools."""

    type: Literal["tool.execute"] = "tool.execute"
    id: str
    name: str
    arguments: str
    input: ToolInput
    attempt: UInt
    deadline: Nullable[Timestamp] = None


class ToolFinishedTrigger(WireModel):
    """A tool call ended: what to do next."""

    type: Literal["tool.finished"] = "tool.finished"
    id: str
    ok: bool
    name: str
    result: Nullable[StoredResult] = None
    error: Nullable[ErrorInfo] = None


class LlmExecuteTrigger(WireModel):
    """The worker is asked to make a model call itself."""

    type: Literal["llm.execute"] = "llm.execute"
    id: str
    request: Any
    stream: bool
    attempt: UInt
    format: Nullable[LlmFormat] = None
    deadline: Nullable[Timestamp] = None


class LlmFinishedTrigger(WireModel):
    """A model call ended: what to do next."""

    type: Literal["llm.finished"] = "llm.finished"
    id: str
    ok: bool
    truncated: bool
    refused: bool | None = None
    message: Nullable[DraftMessage] = None
    usage: Nullable[Usage] = None
    cost: Nullable[Cost] = None
    error: Nullable[ErrorInfo] = None


class SubagentFinishedTrigger(WireModel):
    """A child session's run ended: what to do next."""

    type: Literal["subagent.finished"] = "subagent.finished"
    id: str
    ok: bool
    session_id: str
    agent_id: str
    result: Nullable[str] = None
    error: Nullable[ErrorInfo] = None


class InterruptResumedTrigger(WireModel):
    """A paused turn was answered: what to do next."""

    type: Literal["interrupt.resumed"] = "interrupt.resumed"
    interrupt_id: str
    payload: Any = None


class TurnFinishedTrigger(WireModel):
    """The turn's work is done (its cost so far); the engine proposes `done`."""

    type: Literal["turn.finished"] = "turn.finished"
    turn_id: str
    data: Any = None
    cost: Nullable[Cost] = None
    usage: Usage | None = None


DecisionTrigger = Annotated[
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


# --- actions -----------------------------------------------------------------


class LlmCallAction(WireModel):
    """Make a model call, with per-call overrides."""

    type: Literal["llm.call"] = "llm.call"
    id: Nullable[str] = None
    llm: Nullable[str] = None
    model: Nullable[str] = None
    messages: Nullable[list[DraftMessage]] = None
    tools: Nullable[list[LlmTool]] = None
    temperature: Nullable[float] = None
    max_completion_tokens: Nullable[UInt] = None
    reasoning: Nullable[ReasoningConfig] = None
    stream: Nullable[bool] = None
    retry: Nullable[RetryOverride] = None


class ToolCallAction(WireModel):
    """Call a tool."""

    type: Literal["tool.call"] = "tool.call"
    name: str
    arguments: Any
    id: Nullable[str] = None
    retry: Nullable[RetryOverride] = None


class ToolResultAction(WireModel):
    """Settle a tool call with its result."""

    type: Literal["tool.result"] = "tool.result"
    id: Nullable[str] = None
    attempt: Nullable[UInt] = None
    result: Any = None
    content: Nullable[list[ToolContent]] = None
    structured_content: Any = None
    is_error: bool | None = None


class _SettleError(WireModel):
    """Fields shared by `tool.error` and `llm.error`; no `retryable` means terminal."""

    error: str
    id: Nullable[str] = None
    attempt: Nullable[UInt] = None
    retryable: bool | None = None
    code: Nullable[ErrorCode] = None
    detail: Any = None


class ToolErrorAction(_SettleError):
    """Settle a tool call as failed."""

    type: Literal["tool.error"] = "tool.error"


class LlmErrorAction(_SettleError):
    """The worker's failure of a model call it was asked to make (`llm.execute`)."""

    type: Literal["llm.error"] = "llm.error"


class LlmResultAction(WireModel):
    """`response` is an `LlmResponse`, or the vendor's own when the call had a `format`."""

    type: Literal["llm.result"] = "llm.result"
    response: Any
    id: Nullable[str] = None
    attempt: Nullable[UInt] = None


class SubagentSpawnAction(WireModel):
    """Run a child session for a tool call."""

    type: Literal["subagent.spawn"] = "subagent.spawn"
    agent_id: str
    tool_call_id: str
    session_id: Nullable[str] = None
    message: Nullable[DraftMessage] = None
    mode: Nullable[SpawnMode] = None
    retry: Nullable[RetryOverride] = None


class MessageSendAction(WireModel):
    """Send a message to another session."""

    type: Literal["message.send"] = "message.send"
    session_id: str
    message: DraftMessage


class InterruptAction(WireModel):
    """Pause the turn on a question."""

    type: Literal["interrupt"] = "interrupt"
    reason: str
    interrupt_id: Nullable[str] = None
    payload: Any = None


class InterruptResolveAction(WireModel):
    """Resume an open interrupt from the worker's side (a prompt button's action)."""

    type: Literal["interrupt.resolve"] = "interrupt.resolve"
    interrupt_id: str
    payload: Any = None


class ConnectorSyncAction(WireModel):
    """Fetch a connection's tool list again."""

    type: Literal["connector.sync"] = "connector.sync"
    path: str


class DoneAction(WireModel):
    """Complete the turn."""

    type: Literal["done"] = "done"
    data: Any = None


class FailAction(WireModel):
    """Fail the turn with this error."""

    type: Literal["fail"] = "fail"
    error: ErrorInfo


DecisionAction = Annotated[
    LlmCallAction
    | ToolCallAction
    | ToolResultAction
    | ToolErrorAction
    | LlmResultAction
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


# --- decisions ---------------------------------------------------------------


class DecisionResponse(WireModel):
    """A worker's answer, and the engine's own proposal. Empty writes nothing."""

    messages: list[DraftMessage] | None = None
    actions: list[DecisionAction] | None = None
    state: Any = None
    agent: Nullable[AgentConfig] = None
    channels: dict[str, Any] | None = None


class DecisionRequest(WireModel):
    """What a worker is sent for a decision: the trigger, the session, what is proposed."""

    session_id: str
    decision_id: str
    agent_id: str
    identity: WorkerIdentity
    trigger: DecisionTrigger
    proposed: DecisionResponse
    state: Any
    calls: list[Effect]
    pending_calls: UInt
    messages: list[Message]
    message_tree: MessageTree
    ancestry: list[str]
    attempts: UInt
    agent: Nullable[AgentConfig] = None
    deadline: Nullable[Timestamp] = None
    turn_id: Nullable[str] = None
    worker: Nullable[WorkerRef] = None


# --- client input ------------------------------------------------------------


class ClientMessage(WireModel):
    """A client's one message: starts (or queues) a turn."""

    type: Literal["client.message"] = "client.message"
    agent_id: str
    message: DraftMessage
    queue: bool | None = None
    stream: bool | None = None
    turn_id: Nullable[str] = None


class ClientMessages(WireModel):
    """A client's full view, matched by message id: the first new one branches (SPEC §10)."""

    type: Literal["client.messages"] = "client.messages"
    agent_id: str
    messages: list[DraftMessage]
    client: ClientContext | None = None
    stream: bool | None = None
    turn_id: Nullable[str] = None


class ClientAppend(WireModel):
    """Messages added at the head, never branching; ids already recorded are dropped."""

    type: Literal["client.append"] = "client.append"
    agent_id: str
    messages: list[DraftMessage]
    client: ClientContext | None = None
    queue: bool | None = None
    stream: bool | None = None
    turn_id: Nullable[str] = None


class ClientAction(WireModel):
    """A named action from the client (a button, a command): starts a turn."""

    type: Literal["client.action"] = "client.action"
    agent_id: str
    name: str
    args: Any = None
    turn_id: Nullable[str] = None


class ClientInterruptResume(WireModel):
    """A client's answer to an open interrupt."""

    type: Literal["interrupt.resume"] = "interrupt.resume"
    interrupt_id: str
    payload: Any = None


class ClientToolResult(WireModel):
    """A client's result for a client tool call."""

    type: Literal["tool.result"] = "tool.result"
    id: str
    attempt: Nullable[UInt] = None
    result: Any = None
    content: Nullable[list[ToolContent]] = None
    structured_content: Any = None
    is_error: bool | None = None


class ClientToolError(WireModel):
    """A client's failure for a client tool call."""

    type: Literal["tool.error"] = "tool.error"
    id: str
    error: str
    retryable: bool
    attempt: Nullable[UInt] = None


ClientInput = Annotated[
    ClientMessage
    | ClientMessages
    | ClientAppend
    | ClientAction
    | ClientInterruptResume
    | ClientToolResult
    | ClientToolError,
    Field(discriminator="type"),
]


# --- our event envelope (SPEC §13) --------------------------------------------


class EventPayload(WireModel):
    """`{type, ...}`: the fields beside `type` depend on the event type."""

    model_config = ConfigDict(extra="allow")

    type: str


class Event(WireModel):
    """SPEC §13: an event as clients read it: the session, its seq and time, its payload."""

    session_id: str
    seq: Annotated[int, Field(ge=1)]
    occurred_at: Timestamp
    payload: EventPayload
    turn_id: str | None = None


# --- parsing -----------------------------------------------------------------

_CLIENT_INPUT: TypeAdapter[ClientInput] = TypeAdapter(ClientInput)
_TAG_KEYS = ("type", "status")
_GONE = object()


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _path(loc: tuple[int | str, ...], data: Any) -> list[str]:
    """Follow a pydantic error location through the input, dropping union tags.

    Pydantic inserts the chosen variant (`'tool.call'`, `'list'`) into `loc`; the
    input shows which elements are real keys and which are those tags.
    """
    parts: list[str] = []
    node: Any = data
    tag_used = False
    for item in loc:
        if isinstance(node, dict):
            if not tag_used and any(node.get(k) == item for k in _TAG_KEYS):
                tag_used = True
                continue
            parts.append(str(item))
            node = node.get(item, _GONE) if isinstance(item, str) else _GONE
        elif isinstance(node, list):
            if isinstance(item, str):
                continue
            parts.append(str(item))
            node = node[item] if 0 <= item < len(node) else _GONE
        elif node is _GONE:
            parts.append(str(item))
        else:
            continue  # a scalar has no children: the rest are variant tags
        tag_used = False
    return parts


def _describe(error: Any, data: Any) -> tuple[str, str]:
    """(dotted param, sentence) for one pydantic error."""
    parts = _path(error["loc"], data)
    kind = error["type"]
    ctx = error.get("ctx") or {}
    value = error.get("input")
    if kind == "missing":
        text = "required field is missing"
    elif kind == "extra_forbidden":
        text = "unknown field"
    elif kind in ("union_tag_invalid", "union_tag_not_found"):
        field = str(ctx.get("discriminator", "")).strip("'")
        parts.append(field)
        if kind == "union_tag_not_found":
            text = f"missing '{field}'"
        else:
            text = f"unknown {field} {ctx.get('tag')!r}; expected one of {ctx.get('expected_tags')}"
    elif kind == "value_error":
        text = str(ctx.get("error", error["msg"]))
    elif kind in ("model_type", "model_attributes_type", "dict_type"):
        text = f"expected a JSON object, got {_json_type(value)}"
    elif kind == "list_type":
        text = f"expected an array, got {_json_type(value)}"
    else:
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        text = f"{error['msg']} (got {shown})"
    return ".".join(parts), text


def _protocol_error(what: str, exc: ValidationError, data: Any) -> ProtocolError:
    described = [_describe(error, data) for error in exc.errors()]
    lines = [f"{param}: {text}" if param else text for param, text in described[:3]]
    more = len(described) - 3
    if more > 0:
        lines.append(f"and {more} more")
    return ProtocolError(f"invalid {what}: " + "; ".join(lines), param=described[0][0] or None)


def parse_decision_response(data: Any) -> DecisionResponse:
    """Validate a worker's decoded JSON answer; `None` and `{}` are the empty decision.

    Raises ProtocolError naming the first bad field as a dotted path (`actions.0.type`).
    """
    if data is None:
        return DecisionResponse()
    if not isinstance(data, dict):
        raise ProtocolError(
            f"invalid decision response: expected a JSON object, got {_json_type(data)}"
        )
    try:
        return DecisionResponse.model_validate(data)
    except ValidationError as exc:
        raise _protocol_error("decision response", exc, data) from None


def parse_client_input(data: Any) -> ClientInput:
    """Validate a client's decoded `input`: the schema, then what each message's role needs
    (`ROLE_NEEDS`). Raises ProtocolError naming the bad field (`messages.1.content`)."""
    if not isinstance(data, dict):
        raise ProtocolError(f"invalid client input: expected a JSON object, got {_json_type(data)}")
    try:
        parsed = _CLIENT_INPUT.validate_python(data)
    except ValidationError as exc:
        raise _protocol_error("client input", exc, data) from None
    for where, message in _messages_of(parsed):
        for name in ROLE_NEEDS[message.role]:
            if getattr(message, name) is None:
                param = f"{where}.{name}"
                why = f"a {message.role} message needs {name} ({_NEEDED[name]})"
                raise ProtocolError(f"invalid client input: {param}: {why}", param=param)
    return parsed


# What a client's message must hold for its role, beyond the schema (which requires only
# `role`, as a model's reply may hold neither text nor tool calls): a user or system
# message is its content, a tool message answers one call. Stored messages are read
# leniently still (engine/messages.py): older versions took them without.
ROLE_NEEDS: dict[str, tuple[str, ...]] = {
    "system": ("content",),
    "user": ("content",),
    "assistant": (),
    "tool": ("tool_call_id", "content"),
}
_NEEDED = {
    "content": "a string or an array of content parts, not null",
    "tool_call_id": "the id of the tool call it answers",
}


def _messages_of(inp: ClientInput) -> list[tuple[str, DraftMessage]]:
    """The messages an input carries, each with its path in the input."""
    if isinstance(inp, ClientMessage):
        return [("message", inp.message)]
    if isinstance(inp, ClientMessages | ClientAppend):
        return [(f"messages.{i}", m) for i, m in enumerate(inp.messages)]
    return []
