"""Our wire models against the protocol JSON Schema: what we send validates, what a
schema-valid worker or client sends parses and dumps back unchanged."""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

import pytest
from jsonschema import Draft202012Validator
from pydantic import BaseModel, ValidationError
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from engine import protocol
from engine.errors import SubsError
from engine.protocol import (
    AgentConfig,
    AgentTool,
    ClientActionTrigger,
    ClientContext,
    ClientInput,
    ClientMessagesTrigger,
    DecisionAction,
    DecisionRequest,
    DecisionResponse,
    DecisionTrigger,
    DoneAction,
    DraftMessage,
    Effect,
    ErrorInfo,
    Event,
    EventPayload,
    ImageUrl,
    ImageUrlPart,
    InterruptOption,
    InterruptPayload,
    InterruptResolution,
    InterruptResponder,
    InterruptResumedTrigger,
    LinkContent,
    LlmCallAction,
    LlmExecuteTrigger,
    LlmFinishedTrigger,
    LlmRequest,
    LlmResponse,
    LlmResultAction,
    LlmTool,
    Message,
    MessageTree,
    MessageTreeNode,
    ProtocolError,
    Reasoning,
    ReasoningConfig,
    RetryConfig,
    RetryOverride,
    SessionStartTrigger,
    StoredResult,
    StreamDelta,
    Subagent,
    SubagentFinishedTrigger,
    Subject,
    TextContent,
    TokenDelta,
    ToolCall,
    ToolCallAction,
    ToolCallFunction,
    ToolErrorAction,
    ToolExecuteTrigger,
    ToolFinishedTrigger,
    ToolInputInvalid,
    ToolInputMalformed,
    ToolInputValid,
    TurnFinishedTrigger,
    Usage,
    WorkerIdentity,
    WorkerRef,
    parse_client_input,
    parse_decision_response,
    to_json,
    to_wire,
)

SCHEMA_PATH = Path(__file__).parents[1] / "spec" / "protocol.schema.json"
SCHEMA = json.loads(SCHEMA_PATH.read_text())
_REGISTRY = Registry().with_resource("urn:subs:protocol", DRAFT202012.create_resource(SCHEMA))
_VALIDATORS: dict[str, Draft202012Validator] = {}
EXTENSIONS = {"handler", "format", "stream"}


def validator(entry: str) -> Draft202012Validator:
    """A validator for one top-level wire entry point (`decision_request`, ...)."""
    if entry not in _VALIDATORS:
        _VALIDATORS[entry] = Draft202012Validator(
            {"$ref": f"urn:subs:protocol#/properties/{entry}"},
            registry=_REGISTRY,
            format_checker=Draft202012Validator.FORMAT_CHECKER,
        )
    return _VALIDATORS[entry]


def schema_errors(entry: str, instance: Any) -> list[str]:
    return [error.message for error in validator(entry).iter_errors(instance)]


def schema_tags(definition: str, key: str = "type") -> set[str]:
    return {variant["properties"][key]["const"] for variant in SCHEMA["$defs"][definition]["oneOf"]}


def model_tags(union: Any, key: str = "type") -> set[str]:
    members = get_args(get_args(union)[0])
    return {member.model_fields[key].default for member in members}


def assert_round_trip(entry: str, data: dict[str, Any], parse: Callable[[Any], BaseModel]) -> None:
    """json -> model -> json is the identity, and so is model -> json -> model."""
    assert schema_errors(entry, data) == []
    model = parse(copy.deepcopy(data))
    assert to_wire(model) == data
    again = parse(to_wire(model))
    assert again == model
    assert to_wire(again) == data


# --- a realistic session, built through our models ----------------------------

NOW = "2026-07-17T12:00:00Z"
DEADLINE = "2026-07-17T12:02:00+00:00"

IDENTITY = WorkerIdentity(
    subject=Subject(issuer="slack", id="U024BE7LH"),
    metadata={"slack_channel": "C0123", "slack_thread_ts": "1752753600.000100", "slack_team": "T1"},
    visibility="shared",
)

WORKER_AGENT = AgentConfig(
    model="claude-haiku-4-5-20251001",
    llm="byo",
    system="You are the on-call assistant.",
    effort="low",
    tools=[
        AgentTool(
            name="get_time",
            description="The current time in a time zone.",
            input={"type": "object", "properties": {"tz": {"type": "string"}}},
        ),
        AgentTool(name="confirm", description="Ask a person", handler="client"),
    ],
    subagents=[Subagent(id="researcher", description="Looks things up.")],
    max_subagent_depth=5,
    retry=RetryConfig(tool=RetryOverride(max_attempts=3)),
    handler="worker",
    format="anthropic",
    stream=True,
)

TOOL_CALL = ToolCall(
    id="call_1",
    type="function",
    function=ToolCallFunction(name="get_time", arguments='{"tz": "UTC"}'),
)
REASONING = Reasoning(
    provider="anthropic",
    text="The user wants the time.",
    blocks=[{"type": "thinking", "thinking": "The user wants the time.", "signature": "c2ln"}],
)
USAGE = Usage(
    input=1200,
    output=40,
    uncached_input=200,
    cache_read=1000,
    cache_write=0,
    total=1240,
    provider={"input_tokens": 200, "cache_read_input_tokens": 1000, "output_tokens": 40},
)
USER = Message(id="m1", role="user", content="What time is it in UTC?")
ASSISTANT = Message(
    id="m2", role="assistant", content=None, tool_calls=[TOOL_CALL], reasoning=REASONING
)
TOOL_REPLY = Message(
    id="m3", role="tool", tool_call_id="call_1", content=[TextContent(text="12:00")]
)
MESSAGES = [USER, ASSISTANT, TOOL_REPLY]
TREE = MessageTree(
    nodes=[
        MessageTreeNode(message=USER, parent_id=None),
        MessageTreeNode(message=ASSISTANT, parent_id="m1"),
        MessageTreeNode(message=TOOL_REPLY, parent_id="m2"),
    ],
    head_id="m3",
)
OPEN_CALL = Effect(
    id="call_1",
    kind="tool_call",
    status="running",
    attempt=1,
    name="get_time",
    arguments='{"tz": "UTC"}',
    handler="worker",
    anchor="m2",
    deadline=DEADLINE,
)
ASSISTANT_DRAFT = DraftMessage(
    id="m2", role="assistant", content=None, tool_calls=[TOOL_CALL], reasoning=REASONING
)
REPROMPT = DecisionResponse(actions=[LlmCallAction()])


def decision_request(trigger: Any, proposed: DecisionResponse, **overrides: Any) -> DecisionRequest:
    fields: dict[str, Any] = {
        "session_id": "slack:oncall:C0123:1752753600.000100",
        "decision_id": "dec_01J2Z6",
        "agent_id": "oncall",
        "identity": IDENTITY,
        "trigger": trigger,
        "proposed": proposed,
        "state": {"step": 2, "notes": ["paged"]},
        "agent": WORKER_AGENT,
        "calls": [],
        "pending_calls": 0,
        "messages": MESSAGES,
        "message_tree": TREE,
        "ancestry": [],
        "attempts": 0,
        "deadline": DEADLINE,
        "turn_id": "turn_01",
    }
    fields.update(overrides)
    return DecisionRequest(**fields)


def _requests() -> dict[str, DecisionRequest]:
    neutral_request = LlmRequest(
        model="claude-haiku-4-5-20251001",
        messages=[
            DraftMessage(role="system", content="You are the on-call assistant."),
            DraftMessage(id="m1", role="user", content="What time is it in UTC?"),
        ],
        tools=[LlmTool(name="get_time", description="The current time.", input={"type": "object"})],
        temperature=0.2,
        max_completion_tokens=1024,
        reasoning=ReasoningConfig(effort="low"),
    )
    anthropic_body = {
        "model": "claude-haiku-4-5-20251001",
        "max_tokens": 1024,
        "system": "You are the on-call assistant.",
        "messages": [{"role": "user", "content": "What time is it in UTC?"}],
    }
    client_tools = [AgentTool(name="pick_color", description="Browser picker", handler="client")]
    with_client_tools = WORKER_AGENT.model_copy(
        update={"tools": [*(WORKER_AGENT.tools or []), *client_tools]}
    )
    return {
        "session.start": decision_request(
            SessionStartTrigger(),
            DecisionResponse(),
            agent=None,
            messages=[],
            message_tree=MessageTree(nodes=[]),
            state=None,
        ),
        "client.messages": decision_request(
            ClientMessagesTrigger(
                messages=[
                    DraftMessage(id="m1", role="user", content="What time is it in UTC?"),
                    DraftMessage(
                        role="user",
                        content=[
                            TextContent(text="And this graph?"),
                            ImageUrlPart(image_url=ImageUrl(url="https://example.com/g.png")),
                        ],
                    ),
                ],
                new_from=1,
                client=ClientContext(tools=client_tools, state={"tab": "ops"}, context=[]),
            ),
            DecisionResponse(
                messages=[DraftMessage(role="user", content="And this graph?")],
                actions=[LlmCallAction()],
                agent=with_client_tools,
            ),
        ),
        "client.action": decision_request(
            ClientActionTrigger(
                name="oncall",
                args={"text": "ack INC-42", "user_id": "U024BE7LH", "channel_id": "C0123"},
            ),
            DecisionResponse(),
        ),
        "tool.execute": decision_request(
            ToolExecuteTrigger(
                id="call_1",
                name="get_time",
                arguments='{"tz": "UTC"}',
                input=ToolInputValid(value={"tz": "UTC"}),
                attempt=1,
                deadline=DEADLINE,
            ),
            DecisionResponse(),
            calls=[OPEN_CALL],
            pending_calls=1,
            messages=MESSAGES[:2],
        ),
        "tool.execute/invalid": decision_request(
            ToolExecuteTrigger(
                id="call_1",
                name="get_time",
                arguments='{"tz": 5}',
                input=ToolInputInvalid(value={"tz": 5}, error="5 is not of type 'string'"),
                attempt=1,
            ),
            DecisionResponse(
                actions=[ToolErrorAction(error="invalid arguments: 5 is not of type 'string'")]
            ),
            calls=[OPEN_CALL],
            pending_calls=1,
        ),
        "tool.execute/malformed": decision_request(
            ToolExecuteTrigger(
                id="call_1",
                name="get_time",
                arguments='{"tz": ',
                input=ToolInputMalformed(error="unexpected end of JSON"),
                attempt=2,
                deadline=None,
            ),
            DecisionResponse(actions=[ToolErrorAction(error="arguments are not a JSON object")]),
            calls=[OPEN_CALL],
            pending_calls=1,
            attempts=1,
        ),
        "tool.finished": decision_request(
            ToolFinishedTrigger(
                id="call_1",
                ok=True,
                name="get_time",
                result=StoredResult(
                    content=[
                        TextContent(text="12:00"),
                        LinkContent(uri="https://time.example/utc", mimeType="text/html"),
                    ],
                    structuredContent={"time": "12:00"},
                    isError=False,
                ),
            ),
            DecisionResponse(
                messages=[
                    DraftMessage(
                        role="tool", tool_call_id="call_1", content=[TextContent(text="12:00")]
                    )
                ],
                actions=[LlmCallAction()],
            ),
        ),
        "tool.finished/error": decision_request(
            ToolFinishedTrigger(
                id="call_1",
                ok=False,
                name="get_time",
                result=None,
                error=ErrorInfo(message="the clock is down", code="handler_error", detail=None),
            ),
            REPROMPT,
        ),
        "llm.execute": decision_request(
            LlmExecuteTrigger(
                id="m2", request=neutral_request, stream=True, attempt=1, deadline=DEADLINE
            ),
            DecisionResponse(),
            calls=[Effect(id="m2", kind="llm_call", status="running", attempt=1, stream=True)],
        ),
        "llm.execute/anthropic": decision_request(
            LlmExecuteTrigger(
                id="m2", request=anthropic_body, format="anthropic", stream=True, attempt=1
            ),
            DecisionResponse(),
        ),
        "llm.finished": decision_request(
            LlmFinishedTrigger(
                id="m2",
                ok=True,
                truncated=False,
                refused=False,
                message=ASSISTANT_DRAFT,
                usage=USAGE,
                cost="0.0012",
            ),
            DecisionResponse(
                messages=[ASSISTANT_DRAFT],
                actions=[ToolCallAction(id="call_1", name="get_time", arguments={"tz": "UTC"})],
            ),
        ),
        "subagent.finished": decision_request(
            SubagentFinishedTrigger(
                id="call_9",
                ok=True,
                session_id="child_7f3a",
                agent_id="researcher",
                result="Found 3 open incidents.",
            ),
            DecisionResponse(
                messages=[
                    DraftMessage(
                        role="tool",
                        tool_call_id="call_9",
                        content='{"session": "child_7f3a", "result": "Found 3 open incidents."}',
                    )
                ],
                actions=[LlmCallAction()],
            ),
            ancestry=["parent_session"],
            worker=WorkerRef(id="oncall", url="http://127.0.0.1:4444"),
        ),
        "interrupt.resumed": decision_request(
            InterruptResumedTrigger(
                interrupt_id="int_1",
                payload=InterruptResolution(
                    status="resolved",
                    payload="approve",
                    responder=InterruptResponder(
                        channel="slack", user="U024BE7LH", label="Approve", style="primary"
                    ),
                ),
            ),
            REPROMPT,
        ),
        "turn.finished": decision_request(
            TurnFinishedTrigger(
                turn_id="turn_01",
                data={"answer": "It is 12:00 UTC."},
                cost="0.0031",
                usage=USAGE,
            ),
            DecisionResponse(actions=[DoneAction(data={"answer": "It is 12:00 UTC."})]),
        ),
    }


REQUESTS = _requests()


def test_every_trigger_type_has_a_request() -> None:
    kinds = {name.split("/")[0] for name in REQUESTS}
    assert kinds == schema_tags("DecisionTrigger") == model_tags(DecisionTrigger)


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_decision_request_validates(name: str) -> None:
    request = REQUESTS[name]
    wire = to_wire(request)
    assert schema_errors("decision_request", wire) == []
    assert wire["trigger"]["type"] == name.split("/")[0]
    if name == "llm.execute":  # a model inside an `Any` field is dumped like any other
        request = LlmRequest.model_validate(wire["trigger"]["request"])
        assert to_wire(request) == wire["trigger"]["request"]
        assert "tool_calls" not in wire["trigger"]["request"]["messages"][0]
    # What we send must also be what we would accept back.
    assert to_wire(DecisionRequest.model_validate(wire)) == wire


def test_worker_agent_extensions_are_kept_but_never_sent() -> None:
    request = REQUESTS["client.messages"]
    assert request.agent is not None
    assert (request.agent.handler, request.agent.format, request.agent.stream) == (
        "worker",
        "anthropic",
        True,
    )
    wire = to_wire(request)
    assert EXTENSIONS.isdisjoint(wire["agent"])
    assert EXTENSIONS.isdisjoint(wire["proposed"]["agent"])
    assert wire["agent"]["model"] == "claude-haiku-4-5-20251001"
    kept = to_json(request)
    assert {k: kept["agent"][k] for k in EXTENSIONS} == {
        "handler": "worker",
        "format": "anthropic",
        "stream": True,
    }
    assert schema_errors("decision_request", wire) == []


def test_none_is_omitted_only_where_the_schema_forbids_null() -> None:
    recorded = Message(id="m9", role="assistant", content="hi", tool_calls=None)
    assert to_wire(recorded) == {"id": "m9", "role": "assistant", "content": "hi"}
    draft = DraftMessage(role="assistant", content=None, tool_calls=None)
    assert to_wire(draft) == {"role": "assistant", "content": None, "tool_calls": None}
    assert to_wire(DraftMessage(role="user")) == {"role": "user"}
    wire = to_wire(LlmFinishedTrigger(id="m2", ok=True, truncated=False, refused=None))
    assert wire == {"type": "llm.finished", "id": "m2", "ok": True, "truncated": False}


def _resolve(prop: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in prop:
        prop = SCHEMA["$defs"][prop["$ref"].rsplit("/", 1)[1]]
    return prop


def _allows_null(prop: dict[str, Any]) -> bool:
    prop = _resolve(prop)
    for key in ("anyOf", "oneOf"):
        if key in prop:
            return any(_allows_null(p) for p in prop[key])
    kind = prop.get("type")
    if kind is None:
        return "const" not in prop and "enum" not in prop  # `{}` accepts anything
    return "null" in (kind if isinstance(kind, list) else [kind])


def _object_defs() -> list[tuple[str, dict[str, Any], type[BaseModel]]]:
    """(label, schema object, our model) for every object type the schema defines."""
    pairs = []
    for name, definition in SCHEMA["$defs"].items():
        model = getattr(protocol, name, None)
        if "properties" in definition and isinstance(model, type):
            pairs.append((name, definition, model))
    unions = {
        "DecisionTrigger": "type",
        "DecisionAction": "type",
        "ClientInput": "type",
        "ToolInput": "status",
        "ToolContent": "type",
        "StoredContent": "type",
        "ContentPart": "type",
    }
    for name, key in unions.items():
        members = {
            m.model_fields[key].default: m for m in get_args(get_args(getattr(protocol, name))[0])
        }
        for variant in SCHEMA["$defs"][name]["oneOf"]:
            tag = variant["properties"][key]["const"]
            if "$ref" not in variant:  # the attachment variant is unsatisfiable, see below
                pairs.append((f"{name}[{tag}]", variant, members[tag]))
    return pairs


OBJECT_DEFS = _object_defs()


@pytest.mark.parametrize(
    ("label", "definition", "model"), OBJECT_DEFS, ids=[p[0] for p in OBJECT_DEFS]
)
def test_model_mirrors_schema_object(
    label: str, definition: dict[str, Any], model: type[BaseModel]
) -> None:
    """Same field names, same required set, and `null` allowed on exactly the same fields."""
    fields = dict(model.model_fields)
    if model is AgentConfig:
        for name in AgentConfig._wire_extensions:  # ours: handler, format, stream, budgets
            del fields[name]
    assert set(definition["properties"]) == set(fields)
    # A variant's tag has a default in our model, so it is always sent: required on the wire.
    required = {
        name for name, field in fields.items() if field.is_required() or field.default is not None
    }
    assert required == set(definition.get("required", []))
    optional = set(fields) - required
    nullable = {name for name in optional if _allows_null(definition["properties"][name])}
    assert nullable == {name for name in optional if protocol._null_allowed(fields[name])}


def _schema_values(name: str) -> set[str]:
    definition = SCHEMA["$defs"][name]
    values = set(definition.get("enum", []))
    for variant in definition.get("oneOf", []):
        values |= set(variant.get("enum", []))
        if "const" in variant:
            values.add(variant["const"])
    return values


@pytest.mark.parametrize(
    "name",
    [
        "ErrorCode",
        "Role",
        "ReasoningEffort",
        "ReasoningProvider",
        "LlmFormat",
        "Handler",
        "EffectKind",
        "EffectStatus",
        "SpawnMode",
        "SubagentMode",
        "ResumeStatus",
    ],
)
def test_enum_mirrors_schema(name: str) -> None:
    assert set(get_args(getattr(protocol, name))) == _schema_values(name)


def test_attachment_block_is_unsatisfiable_in_the_schema() -> None:
    """Recorded so we notice a fix: `$ref: Attachment` + `additionalProperties: false`
    rejects every attachment block, so we never send one."""
    block = {"type": "attachment", "id": "a1", "mime": "text/plain", "size": 2, "uri": "blob://a1"}
    resolved = Draft202012Validator(
        {"$ref": "urn:subs:protocol#/$defs/StoredContent"}, registry=_REGISTRY
    )
    assert not resolved.is_valid(block)


# --- decision responses --------------------------------------------------------

SEED_SESSION_START = {
    "agent": {
        "model": "claude-haiku-4-5-20251001",
        "stream": True,
        "handler": "worker",
        "format": "anthropic",
    }
}
ANTHROPIC_FINAL_MESSAGE = {
    "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
    "type": "message",
    "role": "assistant",
    "model": "claude-haiku-4-5-20251001",
    "content": [{"type": "text", "text": "It is 12:00 UTC."}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 25, "output_tokens": 9},
}
SEED_STREAM_RESULT = {"actions": [{"type": "llm.result", "response": ANTHROPIC_FINAL_MESSAGE}]}
NEUTRAL_RESPONSE = {
    "model": "claude-haiku-4-5-20251001",
    "content": None,
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_time", "arguments": '{"tz": "UTC"}'},
        }
    ],
    "reasoning": {"provider": "anthropic", "text": "Look it up.", "blocks": []},
    "finish_reason": "tool_calls",
    "usage": to_wire(USAGE),
    "cost": "0.0012",
    "images": [{"url": "https://example.com/out.png"}],
}
DRAFT = {"role": "user", "content": "Found 3 open incidents."}

ACTIONS: dict[str, dict[str, Any]] = {
    "llm.call": {
        "type": "llm.call",
        "id": "m4",
        "llm": "openrouter",
        "model": "anthropic/claude-sonnet-4-5",
        "messages": [{"role": "system", "content": "Be brief."}, DRAFT],
        "tools": [
            {
                "name": "get_time",
                "description": "The time.",
                "defer": False,
                "input": {"type": "object"},
                "output": {"type": "string"},
            }
        ],
        "temperature": 0.5,
        "max_completion_tokens": 512,
        "reasoning": {"effort": "high", "enabled": True, "exclude": False, "max_tokens": 2048},
        "stream": True,
        "retry": {"max_attempts": 2, "run_timeout_secs": 60},
    },
    "tool.call": {
        "type": "tool.call",
        "id": "call_2",
        "name": "get_time",
        "arguments": {"tz": "CET"},
        "retry": {"max_attempts": 1},
    },
    "tool.result": {
        "type": "tool.result",
        "id": "call_1",
        "attempt": 1,
        "content": [
            {"type": "text", "text": "12:00"},
            {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"},
            {"type": "audio", "data": "UklGRg==", "mimeType": "audio/wav"},
            {
                "type": "resource",
                "resource": {"uri": "file:///t.txt", "text": "12:00", "mimeType": "text/plain"},
            },
            {"type": "resource_link", "uri": "https://time.example", "name": "clock"},
        ],
        "structured_content": {"time": "12:00"},
        "is_error": False,
    },
    "tool.error": {
        "type": "tool.error",
        "error": "clock offline",
        "retryable": True,
        "code": "handler_error",
        "detail": {"status": 503},
    },
    "llm.result": {"type": "llm.result", "id": "m2", "attempt": 1, "response": NEUTRAL_RESPONSE},
    "llm.error": {
        "type": "llm.error",
        "error": "upstream 529",
        "retryable": True,
        "code": "provider_error",
    },
    "subagent.spawn": {
        "type": "subagent.spawn",
        "agent_id": "researcher",
        "tool_call_id": "call_9",
        "session_id": "child_7f3a",
        "message": DRAFT,
        "mode": "blocking",
        "retry": {"max_attempts": 3},
    },
    "message.send": {"type": "message.send", "session_id": "other_session", "message": DRAFT},
    "interrupt": {
        "type": "interrupt",
        "interrupt_id": "int_1",
        "reason": "needs approval",
        "payload": {
            "message": "Restart **api-7**?",
            "toolCallId": "call_1",
            "expiresAt": "2026-07-17T13:00:00Z",
            "metadata": {
                "options": [
                    {"label": "Approve", "value": "approve", "style": "primary"},
                    {"label": "Deny", "value": "deny", "style": "danger"},
                ]
            },
        },
    },
    "interrupt.resolve": {
        "type": "interrupt.resolve",
        "interrupt_id": "int_1",
        "payload": {"choice": "approve"},
    },
    "connector.sync": {"type": "connector.sync", "path": "mcp.github"},
    "done": {"type": "done", "data": {"answer": "It is 12:00 UTC."}},
    "fail": {
        "type": "fail",
        "error": {
            "message": "no llm block",
            "code": "unroutable",
            "param": "agent.llm",
            "detail": {"blocks": ["byo"]},
        },
    },
}


def test_every_action_type_has_an_example() -> None:
    assert set(ACTIONS) == schema_tags("DecisionAction") == model_tags(DecisionAction)


@pytest.mark.parametrize("kind", sorted(ACTIONS))
def test_action_round_trip(kind: str) -> None:
    assert_round_trip("decision_response", {"actions": [ACTIONS[kind]]}, parse_decision_response)


def test_full_response_round_trip() -> None:
    response = {
        "messages": [
            DRAFT,
            {
                "id": "m5",
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "See the file"},
                    {"type": "file", "file": {"filename": "a.txt", "file_data": "aGk="}},
                    {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
                    {"type": "video_url", "video_url": {"url": "https://example.com/v.mp4"}},
                    {"type": "blob", "uri": "blob://1"},
                    {"type": "link", "uri": "https://example.com", "mimeType": None, "name": "x"},
                ],
            },
        ],
        "actions": [ACTIONS["tool.call"], ACTIONS["done"]],
        "state": {"step": 3},
        "agent": {
            "model": "gpt-5",
            "llm": "openai",
            "system": None,
            "effort": "minimal",
            "subagent_tools": {"strategy": "single", "wait": True},
            "defer_tools": {"strategy": "search", "max_matches": 5},
            "mcp": [{"id": "github", "approve": "destructive"}],
            "mcp_announce": "auto",
            "plugins": [{"id": "ops"}],
            "attachments": {"tools": ["read"]},
        },
        "channels": {"slack": {"status": "Looking it up..."}},
    }
    assert_round_trip("decision_response", response, parse_decision_response)


def test_explicit_nulls_survive_a_round_trip() -> None:
    response = {
        "actions": [
            {
                "type": "llm.call",
                "id": None,
                "model": None,
                "messages": None,
                "tools": None,
                "retry": None,
            },
            {"type": "interrupt.resolve", "interrupt_id": "int_1", "payload": None},
        ],
        "state": None,
        "agent": None,
    }
    assert_round_trip("decision_response", response, parse_decision_response)


@pytest.mark.parametrize("empty", [None, {}])
def test_empty_decision(empty: Any) -> None:
    response = parse_decision_response(empty)
    assert response == DecisionResponse()
    assert response.model_fields_set == set()
    assert to_wire(response) == {}


def test_seed_session_start_agent() -> None:
    """Seed 002's config carries three fields the schema lacks; nothing else is wrong."""
    errors = schema_errors("decision_response", SEED_SESSION_START)
    assert errors, "the schema should reject handler/format/stream"
    stripped = {"agent": {"model": "claude-haiku-4-5-20251001"}}
    assert schema_errors("decision_response", stripped) == []
    for key in EXTENSIONS:
        only = copy.deepcopy(stripped)
        only["agent"][key] = SEED_SESSION_START["agent"][key]
        assert schema_errors("decision_response", only), key

    response = parse_decision_response(copy.deepcopy(SEED_SESSION_START))
    assert response.agent is not None
    assert response.agent.handler == "worker"
    assert response.agent.format == "anthropic"
    assert response.agent.stream is True
    assert to_json(response) == SEED_SESSION_START
    assert to_wire(response) == stripped
    assert parse_decision_response(to_json(response)) == response


def test_seed_streamed_decision_result() -> None:
    assert_round_trip("decision_response", SEED_STREAM_RESULT, parse_decision_response)
    actions = parse_decision_response(SEED_STREAM_RESULT).actions
    assert actions and isinstance(actions[0], LlmResultAction)
    assert actions[0].response == ANTHROPIC_FINAL_MESSAGE  # vendor-native, passed through


def test_neutral_llm_response_round_trip() -> None:
    actions = parse_decision_response({"actions": [ACTIONS["llm.result"]]}).actions
    assert actions and isinstance(actions[0], LlmResultAction)
    response = LlmResponse.model_validate(actions[0].response)
    assert to_wire(response) == NEUTRAL_RESPONSE
    assert response.usage == USAGE


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_echoing_proposed_is_accepted(name: str) -> None:
    """Seed 002's `return c.json(proposed)`: our own proposal must parse back unchanged."""
    proposed = to_wire(REQUESTS[name])["proposed"]
    assert_round_trip("decision_response", proposed, parse_decision_response)


# --- client input and the smaller entry points -----------------------------------

CLIENT_INPUTS: dict[str, dict[str, Any]] = {
    "client.message": {
        "type": "client.message",
        "agent_id": "oncall",
        "message": DRAFT,
        "queue": True,
        "stream": True,
        "turn_id": "turn_02",
    },
    "client.messages": {
        "type": "client.messages",
        "agent_id": "oncall",
        "messages": [{"id": "m1", **DRAFT}, {"role": "user", "content": "more"}],
        "client": {
            "tools": [{"name": "pick_color", "description": "Pick", "handler": "client"}],
            "state": {"tab": "ops"},
            "context": [{"k": "v"}],
            "forwarded_props": {"x": 1},
        },
        "stream": False,
        "turn_id": None,
    },
    "client.append": {
        "type": "client.append",
        "agent_id": "oncall",
        "messages": [
            {"id": "slack:1752753600.000200", "role": "user", "content": "<@U1>: is api-7 down?"}
        ],
        "queue": False,
    },
    "client.action": {
        "type": "client.action",
        "agent_id": "oncall",
        "name": "oncall",
        "args": {"text": "ack INC-42", "user_id": "U1"},
    },
    "interrupt.resume": {
        "type": "interrupt.resume",
        "interrupt_id": "int_1",
        "payload": {"status": "resolved", "payload": "approve"},
    },
    "tool.result": {
        "type": "tool.result",
        "id": "call_3",
        "attempt": 1,
        "content": [{"type": "text", "text": "blue"}],
        "is_error": False,
    },
    "tool.error": {
        "type": "tool.error",
        "id": "call_3",
        "error": "user closed the tab",
        "retryable": False,
        "attempt": None,
    },
}


def test_every_client_input_type_has_an_example() -> None:
    assert set(CLIENT_INPUTS) == schema_tags("ClientInput") == model_tags(ClientInput)


@pytest.mark.parametrize("kind", sorted(CLIENT_INPUTS))
def test_client_input_round_trip(kind: str) -> None:
    assert_round_trip("client_input", CLIENT_INPUTS[kind], parse_client_input)
    assert parse_client_input(CLIENT_INPUTS[kind]).type == kind


@pytest.mark.parametrize(
    ("entry", "model", "data"),
    [
        ("stream_delta", StreamDelta, {"text": "It is ", "reasoning": None}),
        (
            "stream_delta",
            StreamDelta,
            {"tool_calls": [{"id": "call_1", "name": "get_time", "arguments": '{"tz'}]},
        ),
        ("stream_delta", StreamDelta, {"finish_reason": "stop"}),
        (
            "token_delta",
            TokenDelta,
            {
                "tenant_id": "local",
                "root_session_id": "s1",
                "session_id": "child_1",
                "agent_id": "researcher",
                "call_id": "m2",
                "attempt": 1,
                "seq": 7,
                "tool_calls": [],
                "text": "12:",
                "turn_id": "turn_01",
            },
        ),
        ("interrupt_payload", InterruptPayload, ACTIONS["interrupt"]["payload"]),
        (
            "interrupt_payload",
            InterruptPayload,
            {
                "message": None,
                "responseSchema": {"type": "object", "properties": {"ok": {"type": "boolean"}}},
            },
        ),
        (
            "interrupt_resolution",
            InterruptResolution,
            {
                "status": "resolved",
                "payload": "approve",
                "responder": {
                    "channel": "slack",
                    "user": "U1",
                    "label": "Approve",
                    "style": "primary",
                },
            },
        ),
        ("interrupt_resolution", InterruptResolution, {"status": "cancelled"}),
    ],
)
def test_small_entry_points_round_trip(entry: str, model: type[BaseModel], data: Any) -> None:
    assert_round_trip(entry, data, model.model_validate)


def test_interrupt_options_parse() -> None:
    payload = InterruptPayload.model_validate(ACTIONS["interrupt"]["payload"])
    options = [InterruptOption.model_validate(o) for o in payload.metadata["options"]]
    assert [(o.label, o.value, o.style) for o in options] == [
        ("Approve", "approve", "primary"),
        ("Deny", "deny", "danger"),
    ]


# --- bad answers ---------------------------------------------------------------

BAD_RESPONSES = [
    ("not an object", "ok", None, "expected a JSON object, got string"),
    ("array", [{"type": "done"}], None, "expected a JSON object, got array"),
    ("unknown action", {"actions": [{"type": "llm.cal"}]}, "actions.0.type", "'llm.cal'"),
    (
        "seed 000 spelling",
        {"actions": [{"type": "sub_agent.spawn", "agent_id": "r", "tool_call_id": "c"}]},
        "actions.0.type",
        "unknown type 'sub_agent.spawn'",
    ),
    ("no type", {"actions": [{"name": "get_time"}]}, "actions.0.type", "missing 'type'"),
    ("action not object", {"actions": ["done"]}, "actions.0", "expected a JSON object"),
    ("actions not array", {"actions": {"type": "done"}}, "actions", "expected an array"),
    (
        "missing field",
        {"actions": [{"type": "done"}, {"type": "tool.call", "arguments": {}}]},
        "actions.1.name",
        "required field is missing",
    ),
    ("extra field", {"actions": [{"type": "done", "dta": 1}]}, "actions.0.dta", "unknown field"),
    ("extra top-level", {"action": []}, "action", "unknown field"),
    (
        "wrong type",
        {"actions": [{"type": "tool.error", "error": "x", "retryable": "yes"}]},
        "actions.0.retryable",
        "valid boolean",
    ),
    (
        "string number",
        {"actions": [{"type": "tool.result", "attempt": "2"}]},
        "actions.0.attempt",
        "valid integer",
    ),
    (
        "negative",
        {"actions": [{"type": "tool.result", "attempt": -1}]},
        "actions.0.attempt",
        "greater than or equal to 0",
    ),
    ("bad enum", {"messages": [{"role": "robot", "content": "hi"}]}, "messages.0.role", "'robot'"),
    (
        "bad code",
        {"actions": [{"type": "fail", "error": {"message": "x", "code": "oops"}}]},
        "actions.0.error.code",
        "'oops'",
    ),
    (
        "nested part",
        {
            "actions": [
                {
                    "type": "message.send",
                    "session_id": "s",
                    "message": {"role": "user", "content": [{"type": "text"}]},
                }
            ]
        },
        "actions.0.message.content.0.text",
        "required field is missing",
    ),
    (
        "bad content",
        {"messages": [{"role": "user", "content": 5}]},
        "messages.0.content",
        "string or an array of content parts",
    ),
    ("agent without model", {"agent": {"llm": "byo"}}, "agent.model", "required field"),
    ("agent typo", {"agent": {"model": "m", "modle": "x"}}, "agent.modle", "unknown field"),
    (
        "format without worker",
        {"agent": {"model": "m", "format": "openai"}},
        "agent.format",
        'requires handler "worker"',
    ),
    (
        "nested tool content",
        {
            "actions": [
                {"type": "llm.result", "response": {}},
                {"type": "tool.result", "content": [{"type": "image"}]},
            ]
        },
        "actions.1.content.0.data",
        "required field is missing",
    ),
]


@pytest.mark.parametrize(
    ("data", "param", "fragment"),
    [case[1:] for case in BAD_RESPONSES],
    ids=[case[0] for case in BAD_RESPONSES],
)
def test_bad_worker_answer(data: Any, param: str | None, fragment: str) -> None:
    assert schema_errors("decision_response", data), "the schema should reject it too"
    with pytest.raises(ProtocolError) as caught:
        parse_decision_response(data)
    error = caught.value
    assert isinstance(error, SubsError)
    assert error.code == "invalid_response"
    assert error.retryable is False
    assert error.param == param
    assert fragment in error.message
    assert error.message.startswith("invalid decision response: ")
    if param:
        assert f"{param}: " in error.message


BAD_INPUTS = [
    ("not an object", None, None, "expected a JSON object, got null"),
    ("unknown type", {"type": "client.mesage", "agent_id": "a"}, "type", "'client.mesage'"),
    ("no message", {"type": "client.message", "agent_id": "a"}, "message", "required"),
    (
        "extra",
        {"type": "interrupt.resume", "interrupt_id": "i", "resume": 1},
        "resume",
        "unknown field",
    ),
    (
        "queue on messages",
        {"type": "client.messages", "agent_id": "a", "messages": [], "queue": True},
        "queue",
        "unknown field",
    ),
    ("no retryable", {"type": "tool.error", "id": "c", "error": "x"}, "retryable", "required"),
    (
        "bad role",
        {"type": "client.append", "agent_id": "a", "messages": [{"role": "user"}, {"role": "bot"}]},
        "messages.1.role",
        "'bot'",
    ),
]


@pytest.mark.parametrize(
    ("data", "param", "fragment"),
    [case[1:] for case in BAD_INPUTS],
    ids=[case[0] for case in BAD_INPUTS],
)
def test_bad_client_input(data: Any, param: str | None, fragment: str) -> None:
    assert schema_errors("client_input", data), "the schema should reject it too"
    with pytest.raises(ProtocolError) as caught:
        parse_client_input(data)
    assert caught.value.param == param
    assert fragment in caught.value.message


def _one(message: dict[str, Any]) -> dict[str, Any]:
    return {"type": "client.message", "agent_id": "a", "message": message}


# Schema-valid (it requires only `role`), refused by what each role needs (ROLE_NEEDS).
ROLE_REFUSED = [
    ("user, no content", _one({"role": "user"}), "message.content"),
    ("user, content null", _one({"role": "user", "content": None}), "message.content"),
    ("system, no content", _one({"role": "system", "name": "x"}), "message.content"),
    (
        "tool, no tool_call_id",
        {"type": "client.append", "agent_id": "a", "messages": [{"role": "tool", "content": "y"}]},
        "messages.0.tool_call_id",
    ),
    (
        "tool in a view, no content",
        {
            "type": "client.messages",
            "agent_id": "a",
            "messages": [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "c"}],
        },
        "messages.1.content",
    ),
]


@pytest.mark.parametrize(
    ("data", "param"), [case[1:] for case in ROLE_REFUSED], ids=[case[0] for case in ROLE_REFUSED]
)
def test_a_message_without_what_its_role_needs_is_refused(data: Any, param: str) -> None:
    assert not schema_errors("client_input", data), "the schema alone accepts it"
    with pytest.raises(ProtocolError) as caught:
        parse_client_input(data)
    assert caught.value.param == param
    assert caught.value.message.startswith(f"invalid client input: {param}: a ")


def test_what_each_role_may_leave_out_still_parses() -> None:
    """An assistant message may hold neither text nor tool calls (an empty reply, as the
    engine records it), and content may be an empty string or parts without text."""
    view = [
        {"id": "m1", "role": "user", "content": ""},
        {"id": "m2", "role": "assistant"},
        {"id": "m3", "role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]},
    ]
    parse_client_input({"type": "client.messages", "agent_id": "a", "messages": view})


# --- our event envelope -------------------------------------------------------------


def test_event_envelope() -> None:
    event = Event(
        session_id="s1",
        seq=1,
        occurred_at=NOW,
        payload=EventPayload(type="message.new", message=USER, parent_id=None),
    )
    assert to_wire(event) == {
        "session_id": "s1",
        "seq": 1,
        "occurred_at": NOW,
        "payload": {"type": "message.new", "message": to_wire(USER), "parent_id": None},
    }
    stored = Event.model_validate(to_wire(event) | {"turn_id": "turn_01"})
    assert stored.turn_id == "turn_01"
    assert stored.payload.model_extra == {"message": to_wire(USER), "parent_id": None}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("seq", 0),
        ("occurred_at", "yesterday"),
        ("occurred_at", "2026-07-17T12:00:00"),
        ("payload", {"message": "no type"}),
    ],
)
def test_event_envelope_rejects(field: str, value: Any) -> None:
    data = {"session_id": "s1", "seq": 1, "occurred_at": NOW, "payload": {"type": "x"}}
    data[field] = value
    with pytest.raises(ValidationError) as caught:
        Event.model_validate(data)
    assert caught.value.errors()[0]["loc"][0] == field


@pytest.mark.parametrize(
    ("name", "sha256"),
    [
        (
            "protocol.schema.json",
            "c770b66d1f18b947c99844e9c87b1f7d6efe8cb9be02a04cc02434a40d7c0a51",
        ),
        ("worker.openapi.json", "1f54af856a24eb307bc56ea39d8609f10baef6b9fb5f3bd05e6a818c4d0ce756"),
    ],
)
def test_the_wire_contract_is_the_original_engines_unchanged(name: str, sha256: str) -> None:
    """Workers written for the original engine validate against these files: a new enum
    value or field here (an error code, say) is a request such a worker refuses. Extend
    the protocol only where the schema leaves room (`detail`, `metadata`)."""
    digest = hashlib.sha256((SCHEMA_PATH.parent / name).read_bytes()).hexdigest()
    assert digest == sha256, f"spec/{name} differs from the original engine's"
