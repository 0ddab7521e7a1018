"""The LLM provider layer against a scripted vendor over real HTTP, plus its pure parts."""

from __future__ import annotations

import dataclasses
import json
import logging
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import jsonschema
import pytest
from multidict import CIMultiDict

from engine.effects.http_pool import new_session
from engine.effects.llm import LlmTarget, ProviderError, anthropic, complete, openai, prices
from engine.errors import SubsError
from tests.fakes.llm_vendor import (
    CutStream,
    FakeVendor,
    HttpError,
    InStreamError,
    Raw,
    Text,
    ToolCalls,
)

VENDORS = ["openai", "openrouter", "anthropic"]
KEY_ENVS = {
    "openai": "OPENAI_API_KEY",
    "openrouter": "OPENROUTER_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
}
PATHS = {
    "openai": "/v1/chat/completions",
    "openrouter": "/api/v1/chat/completions",
    "anthropic": "/v1/messages",
}
CALL_ID_PREFIX = {"openai": "call_", "openrouter": "call_", "anthropic": "toolu_"}
VENDOR_NAMES = {"openai": "OpenAI", "openrouter": "OpenRouter", "anthropic": "Anthropic"}

_SCHEMA = json.loads(
    (Path(__file__).resolve().parents[1] / "spec" / "protocol.schema.json").read_text()
)


def _validator(name: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator({"$ref": f"#/$defs/{name}", "$defs": _SCHEMA["$defs"]})


RESPONSE_SCHEMA = _validator("LlmResponse")
DELTA_SCHEMA = _validator("StreamDelta")
REQUEST_SCHEMA = _validator("LlmRequest")


@pytest.fixture
async def http():
    async with new_session(connect_timeout=5, read_timeout=5) as session:
        yield session


def target(fake: FakeVendor, kind: str, key: str | None = "test-key") -> LlmTarget:
    base = {
        "openai": fake.openai_base,
        "openrouter": fake.openrouter_base,
        "anthropic": fake.anthropic_base,
    }[kind]()
    return LlmTarget(kind, base, key, KEY_ENVS[kind])


def ask(text: str = "Say something.", model: str = "test-model", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}], **extra}


async def call(
    http: aiohttp.ClientSession,
    fake: FakeVendor,
    kind: str,
    *,
    stream: bool,
    request: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    deltas: list[dict[str, Any]] = []

    async def on_delta(delta: dict[str, Any]) -> None:
        DELTA_SCHEMA.validate(delta)
        deltas.append(delta)

    request = request or ask()
    REQUEST_SCHEMA.validate(request)
    response = await complete(http, target(fake, kind), request, stream=stream, on_delta=on_delta)
    RESPONSE_SCHEMA.validate(response)
    return response, deltas


async def failure(
    http: aiohttp.ClientSession, fake: FakeVendor, kind: str, *, stream: bool
) -> tuple[ProviderError, list[dict[str, Any]]]:
    deltas: list[dict[str, Any]] = []

    async def on_delta(delta: dict[str, Any]) -> None:
        deltas.append(delta)

    with pytest.raises(ProviderError) as caught:
        await complete(http, target(fake, kind), ask(), stream=stream, on_delta=on_delta)
    return caught.value, deltas


def assert_one_sentence(error: ProviderError) -> None:
    assert "\n" not in error.message and "{" not in error.message and "<" not in error.message


both = pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
each_vendor = pytest.mark.parametrize("kind", VENDORS)


# --- answers --------------------------------------------------------------------------


@each_vendor
@both
async def test_text_reply(vendor, http, kind, stream):
    text = "The quick brown fox jumps over the lazy dog."
    vendor.push(Text(text))
    response, deltas = await call(http, vendor, kind, stream=stream)

    assert response["content"] == text
    assert response["finish_reason"] == "stop"
    assert response["tool_calls"] == []
    assert response["model"] == "test-model"
    if stream:
        pieces = [d["text"] for d in deltas if "text" in d]
        assert len(pieces) > 1
        assert "".join(pieces) == text
        assert deltas[-1] == {"finish_reason": "stop"}
    else:
        assert deltas == []

    [sent] = vendor.requests
    assert sent.path == PATHS[kind]
    if kind == "anthropic":
        assert sent.headers["x-api-key"] == "test-key"
        assert sent.headers["anthropic-version"] == "2023-06-01"
        assert "authorization" not in sent.headers
    else:
        assert sent.headers["authorization"] == "Bearer test-key"
        assert sent.body.get("stream_options") == ({"include_usage": True} if stream else None)
    assert bool(sent.body.get("stream")) is stream


@each_vendor
async def test_text_in_a_given_number_of_chunks(vendor, http, kind):
    vendor.push(Text("abcdefghijkl", chunks=3))
    response, deltas = await call(http, vendor, kind, stream=True)
    assert [d["text"] for d in deltas if "text" in d] == ["abcd", "efgh", "ijkl"]
    assert response["content"] == "abcdefghijkl"


@each_vendor
@both
async def test_two_parallel_tool_calls(vendor, http, kind, stream):
    weather = {"location": "San Francisco, CA", "units": "celsius"}
    search = {"query": 'naïve "quoted" text', "limit": 3, "filters": {"tags": ["a", "b"]}}
    vendor.push(ToolCalls([("get_weather", weather), ("search", search)]))
    response, deltas = await call(http, vendor, kind, stream=stream)

    assert response["finish_reason"] == "tool_calls"
    assert response["content"] is None
    first, second = response["tool_calls"]
    assert (first["function"]["name"], second["function"]["name"]) == ("get_weather", "search")
    assert json.loads(first["function"]["arguments"]) == weather
    assert json.loads(second["function"]["arguments"]) == search
    assert first["id"] != second["id"]
    assert all(c["id"].startswith(CALL_ID_PREFIX[kind]) for c in response["tool_calls"])
    assert all(c["type"] == "function" for c in response["tool_calls"])

    if stream:
        names: dict[str, str] = {}
        arguments: dict[str, str] = {}
        for delta in deltas:
            for piece in delta.get("tool_calls", ()):
                if "name" in piece:
                    names[piece["id"]] = piece["name"]
                arguments[piece["id"]] = arguments.get(piece["id"], "") + piece.get("arguments", "")
        assert names == {first["id"]: "get_weather", second["id"]: "search"}
        assert arguments == {
            first["id"]: first["function"]["arguments"],
            second["id"]: second["function"]["arguments"],
        }


@each_vendor
@both
async def test_text_before_tool_calls(vendor, http, kind, stream):
    vendor.push(ToolCalls([("lookup", {"id": 7})], text="Let me check."))
    response, _ = await call(http, vendor, kind, stream=stream)
    assert response["content"] == "Let me check."
    assert [c["function"]["name"] for c in response["tool_calls"]] == ["lookup"]
    assert json.loads(response["tool_calls"][0]["function"]["arguments"]) == {"id": 7}


@pytest.mark.parametrize("kind", ["openrouter", "anthropic"])
@both
async def test_reasoning(vendor, http, kind, stream):
    vendor.push(Text("Paris.", reasoning="The capital of France is Paris."))
    response, deltas = await call(http, vendor, kind, stream=stream)
    assert response["content"] == "Paris."
    reasoning = response["reasoning"]
    assert reasoning["provider"] == kind
    assert reasoning["text"] == "The capital of France is Paris."
    if kind == "anthropic":
        [block] = reasoning["blocks"]
        assert block["type"] == "thinking" and block["thinking"] == reasoning["text"]
        assert block["signature"].startswith("EqQB")
    if stream:
        assert "".join(d.get("reasoning", "") for d in deltas) == reasoning["text"]


# --- usage and cost -------------------------------------------------------------------


# 114 characters of message text: the fake bills 114 // 4 + 1 = 29 uncached tokens.
USAGE_REQUEST = {
    "model": "test-model",
    "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "x" * 100},
    ],
}


@each_vendor
@both
async def test_usage_adds_up(vendor, http, kind, stream):
    vendor.push(Text("one two three", cache_read=40, cache_write=6))
    response, _ = await call(http, vendor, kind, stream=stream, request=USAGE_REQUEST)
    usage = response["usage"]
    cache_write = 0 if kind == "openai" else 6  # OpenAI reports no cache writes
    assert usage["uncached_input"] == 29
    assert usage["cache_read"] == 40
    assert usage["cache_write"] == cache_write
    assert usage["input"] == 29 + 40 + cache_write
    assert usage["input"] == usage["uncached_input"] + usage["cache_read"] + usage["cache_write"]
    assert usage["output"] == 3
    assert usage["total"] == usage["input"] + 3
    raw = usage["provider"]
    if kind == "anthropic":
        assert raw["input_tokens"] == 29 and raw["cache_read_input_tokens"] == 40
    else:
        assert raw["prompt_tokens"] == usage["input"]
        assert raw["prompt_tokens_details"]["cached_tokens"] == 40


@both
async def test_openrouter_reported_cost(vendor, http, stream):
    vendor.push(Text("Hi there.", cost="0.00000735"))
    response, _ = await call(http, vendor, "openrouter", stream=stream)
    assert response["cost"] == "0.00000735"


# 396 characters → 100 uncached tokens; 5 words out; 1000 read and 200 written from cache.
PRICED = {"model": "", "messages": [{"role": "user", "content": "y" * 396}]}


@pytest.mark.parametrize(
    ("kind", "model", "expected"),
    [
        # 100 * 1 + 1000 * 0.10 + 200 * 1.25 + 5 * 5 = 475 USD per million
        ("anthropic", "claude-haiku-4-5-20251001", "0.000475"),
        # 100 * 0.15 + 1000 * 0.075 + 5 * 0.60 = 93 USD per million (no cache writes)
        ("openai", "gpt-4o-mini-2024-07-18", "0.000093"),
        ("anthropic", "claude-unknown-9", "0"),
        ("openai", "o-unknown", "0"),
    ],
)
@both
async def test_cost_from_price_table(vendor, http, kind, model, expected, stream):
    vendor.push(Text("a b c d e", cache_read=1000, cache_write=200))
    request = {**PRICED, "model": model}
    response, _ = await call(http, vendor, kind, stream=stream, request=request)
    assert response["cost"] == expected
    assert response["cost"] == prices.cost(model, response["usage"])


# --- errors ---------------------------------------------------------------------------


@each_vendor
@both
async def test_rate_limited_honours_retry_after(vendor, http, kind, stream):
    vendor.push(HttpError(429, retry_after=2.5))
    error, _ = await failure(http, vendor, kind, stream=stream)
    assert (error.code, error.retryable, error.vendor_status) == ("rate_limited", True, 429)
    assert error.retry_after == 2.5
    assert error.message.startswith(f"{VENDOR_NAMES[kind]} returned HTTP 429")
    assert_one_sentence(error)


@each_vendor
@both
@pytest.mark.parametrize("status", [408, 409, 500, 502, 503])
async def test_retryable_statuses(vendor, http, kind, stream, status):
    vendor.push(HttpError(status))
    error, _ = await failure(http, vendor, kind, stream=stream)
    assert (error.code, error.retryable, error.vendor_status) == ("provider_error", True, status)
    assert error.retry_after is None


@both
async def test_anthropic_overloaded(vendor, http, stream):
    vendor.push(HttpError(529, retry_after=1))
    error, _ = await failure(http, vendor, "anthropic", stream=stream)
    assert (error.code, error.retryable, error.vendor_status) == ("provider_error", True, 529)
    assert error.retry_after == 1
    assert error.message == "Anthropic returned HTTP 529: Overloaded"


@each_vendor
@pytest.mark.parametrize("status", [400, 401, 403, 404])
async def test_final_statuses(vendor, http, kind, status):
    vendor.push(HttpError(status))
    error, _ = await failure(http, vendor, kind, stream=False)
    assert error.retryable is False
    assert error.vendor_status == status
    assert error.code == ("refused" if (kind, status) == ("openrouter", 403) else "provider_error")


@pytest.mark.parametrize(
    ("kind", "status", "body"),
    [
        (
            "openai",
            429,
            {
                "error": {
                    "message": "You exceeded your current quota, please check your plan.",
                    "type": "insufficient_quota",
                    "param": None,
                    "code": "insufficient_quota",
                }
            },
        ),
        (
            "anthropic",
            429,
            {
                "type": "error",
                "error": {
                    "type": "rate_limit_error",
                    "message": "You have reached your specified workspace API usage limits.",
                    "details": {"error_code": "enforced_spend_limit_reached"},
                },
            },
        ),
        ("openrouter", 402, None),
        ("anthropic", 402, None),
    ],
)
async def test_budget_exceeded_is_final(vendor, http, kind, status, body):
    vendor.push(HttpError(status, body=body))
    error, _ = await failure(http, vendor, kind, stream=True)
    assert (error.code, error.retryable, error.vendor_status) == ("budget_exceeded", False, status)


@each_vendor
@pytest.mark.parametrize("abort", [True, False], ids=["connection-closed", "body-ended"])
async def test_cut_stream_is_retryable_not_a_reply(vendor, http, kind, abort):
    vendor.push(CutStream(after_chunks=5, abort=abort))
    error, deltas = await failure(http, vendor, kind, stream=True)
    assert (error.code, error.retryable) == ("provider_error", True)
    assert any("text" in d for d in deltas)  # it did start
    assert not any("finish_reason" in d for d in deltas)
    assert_one_sentence(error)


@each_vendor
async def test_in_stream_error_is_retryable(vendor, http, kind):
    vendor.push(InStreamError(after_chunks=3))
    error, _ = await failure(http, vendor, kind, stream=True)
    assert (error.code, error.retryable) == ("provider_error", True)
    assert error.message.startswith(f"{VENDOR_NAMES[kind]} reported an error mid-answer")


@each_vendor
@pytest.mark.parametrize("key", [None, ""])
async def test_missing_key_sends_nothing(vendor, http, kind, key):
    with pytest.raises(ProviderError) as caught:
        await complete(http, target(vendor, kind, key), ask(), stream=True)
    error = caught.value
    assert isinstance(error, SubsError)
    assert error.message == f"{KEY_ENVS[kind]} is not set."
    assert (error.code, error.retryable, error.param) == ("provider_error", False, KEY_ENVS[kind])
    assert vendor.requests == []


@each_vendor
@both
async def test_a_server_that_takes_no_key_gets_none(vendor, http, kind, stream):
    vendor.push(Text("Hello from a local model."))
    local = dataclasses.replace(target(vendor, kind, None), api_key_env=None)
    response = await complete(http, local, ask(), stream=stream)
    assert response["content"] == "Hello from a local model."
    [sent] = vendor.requests
    assert not {"authorization", "x-api-key"} & sent.headers.keys(), sent.headers
    if kind == "anthropic":
        assert sent.headers["anthropic-version"]


@each_vendor
async def test_connection_refused_is_retryable(http, kind):
    async with FakeVendor() as gone:
        where = dataclasses.replace(target(gone, kind), block="mine")
    with pytest.raises(ProviderError) as caught:
        await complete(http, where, ask(), stream=False)
    assert (caught.value.code, caught.value.retryable) == ("provider_error", True)
    # A wrong base_url is the usual cause: the message names the block and the URL.
    assert caught.value.message.startswith(
        f"The connection to {VENDOR_NAMES[kind]} failed ([llm.mine] base_url {where.base_url}): "
    )


async def test_a_tcp_connect_gives_up_in_seconds():
    """An address nothing answers at (no refusal either) used to take 30 s a try."""
    async with new_session() as session:
        assert session.timeout.sock_connect is not None and session.timeout.sock_connect <= 5


@each_vendor
@both
async def test_read_timeout_is_retryable(vendor, kind, stream):
    vendor.push(Text("a slow answer", chunk_delay=2))
    async with new_session(read_timeout=0.05) as slow:
        with pytest.raises(ProviderError) as caught:
            await complete(slow, target(vendor, kind), ask(), stream=stream)
    assert caught.value.retryable is True
    assert caught.value.message == f"{VENDOR_NAMES[kind]} did not answer in time (ReadTimeout)."


@each_vendor
@pytest.mark.parametrize(
    ("stream", "raw"),
    [
        (False, Raw(b"<html><body>Bad gateway</body></html>", content_type="text/html")),
        (False, Raw(b'{"choices": [')),
        (True, Raw(b"data: {not json\n\n", content_type="text/event-stream")),
        (True, Raw(b'{"id": "x"}')),  # a JSON body where a stream was asked for
    ],
)
async def test_malformed_answers_are_invalid_responses(vendor, http, kind, stream, raw):
    vendor.push(raw)
    error, _ = await failure(http, vendor, kind, stream=stream)
    assert error.code == "invalid_response"
    assert_one_sentence(error)


async def test_an_empty_script_answers_500_and_default_replies(vendor, http):
    error, _ = await failure(http, vendor, "openai", stream=False)
    assert (error.vendor_status, error.retryable) == (500, True)
    assert "script ran out" in error.message

    vendor.default = Text("again")
    for _ in range(2):
        response, _ = await call(http, vendor, "anthropic", stream=True)
        assert response["content"] == "again"
    await vendor.wait_for_requests(3)


@each_vendor
@both
@pytest.mark.parametrize("end_delay", [0, 0.02], ids=["prompt-end", "late-end"])
async def test_sequential_calls_reuse_one_connection(vendor, http, kind, stream, end_delay):
    """An OpenAI stream is read past `[DONE]` to the body's end (however late it comes),
    so its connection is reused rather than closed; so is every other answer."""
    vendor.default = Text("Reused connections are cheaper.", end_delay=end_delay)
    for _ in range(5):
        response, _ = await call(http, vendor, kind, stream=stream)
        assert response["content"] == "Reused connections are cheaper."
    assert len(vendor.requests) == 5
    assert vendor.connections == 1, [r.peer for r in vendor.requests]


@each_vendor
async def test_an_error_answer_leaves_its_connection_reusable(vendor, http, kind):
    vendor.push(HttpError(503), Text("after the error"))
    await failure(http, vendor, kind, stream=True)
    response, _ = await call(http, vendor, kind, stream=True)
    assert response["content"] == "after the error"
    assert vendor.connections == 1


# --- recorded vendor streams, replayed byte for byte ----------------------------------

OPENAI_RECORDED_STREAM = (
    b'data: {"id":"chatcmpl-BvzoWhZJbwLOqU99BTljeM8ve29kc","object":"chat.completion.chunk",'
    b'"created":1753162008,"model":"gpt-4.1-nano-2025-04-14","service_tier":"default",'
    b'"system_fingerprint":null,"choices":[{"index":0,"delta":{"role":"assistant","content":"",'
    b'"refusal":null},"logprobs":null,"finish_reason":null}],"usage":null}\n\n'
    b'data: {"id":"chatcmpl-BvzoWhZJbwLOqU99BTljeM8ve29kc","object":"chat.completion.chunk",'
    b'"created":1753162008,"model":"gpt-4.1-nano-2025-04-14","service_tier":"default",'
    b'"system_fingerprint":null,"choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,'
    b'"finish_reason":null}],"usage":null}\n\n'
    b'data: {"id":"chatcmpl-BvzoWhZJbwLOqU99BTljeM8ve29kc","object":"chat.completion.chunk",'
    b'"created":1753162008,"model":"gpt-4.1-nano-2025-04-14","service_tier":"default",'
    b'"system_fingerprint":null,"choices":[{"index":0,"delta":{},"logprobs":null,'
    b'"finish_reason":"stop"}],"usage":null}\n\n'
    b'data: {"id":"chatcmpl-BvzoWhZJbwLOqU99BTljeM8ve29kc","object":"chat.completion.chunk",'
    b'"created":1753162008,"model":"gpt-4.1-nano-2025-04-14","service_tier":"default",'
    b'"system_fingerprint":null,"choices":[],"usage":{"prompt_tokens":19,"completion_tokens":9,'
    b'"total_tokens":28,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},'
    b'"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,'
    b'"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}}\n\n'
    b"data: [DONE]\n\n"
)

ANTHROPIC_RECORDED_STREAM = (
    b"event: message_start\n"
    b'data: {"type":"message_start","message":{"id":"msg_019Q1hrJbZG26Fb9BQhrkHEr",'
    b'"type":"message","role":"assistant","model":"claude-sonnet-4-20250514","content":[],"stop_reason":null,'
    b'"stop_sequence":null,"usage":{"input_tokens":377,"cache_creation_input_tokens":0,'
    b'"cache_read_input_tokens":0,"output_tokens":1,"service_tier":"standard"}}}\n\n'
    b"event: content_block_start\n"
    b'data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}\n\n'
    b"event: ping\n"
    b'data: {"type": "ping"}\n\n'
    b"event: content_block_delta\n"
    b'data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"I"}}\n\n'
    b"event: content_block_stop\n"
    b'data: {"type":"content_block_stop","index":0}\n\n'
    b"event: content_block_start\n"
    b'data: {"type":"content_block_start","index":1,"content_block":{"type":"tool_use",'
    b'"id":"toolu_01NRLabsLyVHZPKxbKvkfSMn","name":"get_weather","caller":{"type":"direct"},'
    b'"input":{}}}\n\n'
    b"event: content_block_delta\n"
    b'data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta",'
    b'"partial_json":""}}\n\n'
    b"event: content_block_delta\n"
    b'data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta",'
    b'"partial_json":"{\\"locati"}}\n\n'
    b"event: content_block_stop\n"
    b'data: {"type":"content_block_stop","index":1}\n\n'
    b"event: message_delta\n"
    b'data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},'
    b'"usage":{"output_tokens":65}}\n\n'
    b"event: message_stop\n"
    b'data: {"type":"message_stop"}\n\n'
)

OPENROUTER_RECORDED_ERROR = (
    b": OPENROUTER PROCESSING\n\n"
    b'data: {"id":"cmpl-abc123","object":"chat.completion.chunk","created":1234567890,'
    b'"model":"gpt-3.5-turbo","provider":"openai","error":{"code":"server_error",'
    b'"message":"Provider disconnected unexpectedly"},"choices":[{"index":0,'
    b'"delta":{"content":""},"finish_reason":"error"}]}\n\n'
)


async def test_recorded_openai_stream(vendor, http):
    vendor.push(Raw(OPENAI_RECORDED_STREAM, content_type="text/event-stream; charset=utf-8"))
    response, deltas = await call(http, vendor, "openai", stream=True)
    assert deltas == [{"text": "Hello"}, {"finish_reason": "stop"}]
    assert response["content"] == "Hello"
    assert response["model"] == "gpt-4.1-nano-2025-04-14"
    usage = response["usage"]
    assert (usage["input"], usage["uncached_input"], usage["output"], usage["total"]) == (
        19,
        19,
        9,
        28,
    )
    # gpt-4.1-nano: 19 * 0.10 + 9 * 0.40 = 5.5 USD per million
    assert response["cost"] == "0.0000055"


async def test_recorded_anthropic_stream(vendor, http):
    vendor.push(Raw(ANTHROPIC_RECORDED_STREAM, content_type="text/event-stream; charset=utf-8"))
    response, deltas = await call(http, vendor, "anthropic", stream=True)
    assert response["content"] == "I"
    assert response["finish_reason"] == "tool_calls"
    [tool_call] = response["tool_calls"]
    assert tool_call["id"] == "toolu_01NRLabsLyVHZPKxbKvkfSMn"
    # The fixture's input is cut mid-JSON; it stays raw for tool validation to report.
    assert tool_call["function"] == {"name": "get_weather", "arguments": '{"locati'}
    # message_delta repeats only output_tokens: input comes from message_start.
    usage = response["usage"]
    assert (usage["input"], usage["output"], usage["total"]) == (377, 65, 442)
    assert deltas[0] == {"text": "I"}
    assert deltas[-1] == {"finish_reason": "tool_calls"}


async def test_recorded_openrouter_error_chunk(vendor, http):
    vendor.push(Raw(OPENROUTER_RECORDED_ERROR, content_type="text/event-stream"))
    error, _ = await failure(http, vendor, "openrouter", stream=True)
    assert error.retryable is True
    assert error.message == (
        "OpenRouter reported an error mid-answer: Provider disconnected unexpectedly"
    )


# --- the fake itself: byte layout and hang-ups -----------------------------------------


async def _raw_stream(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> bytes:
    async with http.post(url, json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        return await response.read()


async def test_fake_openai_bytes(vendor, http):
    vendor.push(Text("Hello world"), Text("Hello world"))
    url = vendor.openai_base() + "/chat/completions"
    plain = await _raw_stream(http, url, {**ask(), "stream": True})
    assert b"\r" not in plain
    assert plain.endswith(b"data: [DONE]\n\n")
    frames = plain.split(b"\n\n")[:-2]
    chunks = [json.loads(frame.removeprefix(b"data: ")) for frame in frames]
    assert all(frame.startswith(b"data: {") for frame in frames)
    assert all("usage" not in chunk for chunk in chunks)
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    assert len({chunk["id"] for chunk in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "", "refusal": None}

    with_usage = await _raw_stream(
        http, url, {**ask(), "stream": True, "stream_options": {"include_usage": True}}
    )
    chunks = [json.loads(f.removeprefix(b"data: ")) for f in with_usage.split(b"\n\n")[:-2]]
    assert all(chunk["usage"] is None for chunk in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] > 0


async def test_fake_openrouter_bytes(vendor, http):
    vendor.push(Text("Hello world", cost="0.00000735"))
    url = vendor.openrouter_base() + "/chat/completions"
    raw = await _raw_stream(http, url, {**ask(), "stream": True})
    assert raw.startswith(b": OPENROUTER PROCESSING\n\ndata: {")
    assert raw.endswith(b"data: [DONE]\n\n")
    assert b'"cost":0.00000735,' in raw
    chunks = [json.loads(f.removeprefix(b"data: ")) for f in raw.split(b"\n\n")[1:-2]]
    assert all(chunk["id"].startswith("gen-") and chunk["provider"] for chunk in chunks)
    finish = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert finish[0]["choices"][0]["native_finish_reason"] == "stop"


async def test_fake_anthropic_bytes(vendor, http):
    vendor.push(Text("Hello world", cache_read=12))
    raw = await _raw_stream(http, vendor.url + "/v1/messages", {**ask(), "stream": True})
    assert b"\r" not in raw
    assert b'event: ping\ndata: {"type": "ping"}\n\n' in raw
    frames = raw.split(b"\n\n")[:-1]
    names = []
    for frame in frames:
        event, data = frame.split(b"\n")
        name = event.removeprefix(b"event: ").decode()
        assert json.loads(data.removeprefix(b"data: "))["type"] == name
        names.append(name)
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    start = json.loads(frames[0].split(b"\n")[1].removeprefix(b"data: "))
    assert start["message"]["usage"]["cache_read_input_tokens"] == 12


async def test_fake_survives_a_client_hanging_up(vendor, http, caplog):
    caplog.set_level(logging.DEBUG, logger="aiohttp")
    vendor.push(Text("one two three four five six seven eight", chunk_delay=0.01))

    class HangUp(Exception):
        pass

    async def on_delta(delta: dict[str, Any]) -> None:
        raise HangUp

    with pytest.raises(HangUp):
        await complete(http, target(vendor, "openai"), ask(), stream=True, on_delta=on_delta)

    vendor.push(Text("still here"))
    response, _ = await call(http, vendor, "openai", stream=True)
    assert response["content"] == "still here"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


# --- pure conversions -----------------------------------------------------------------

CONVERSATION: dict[str, Any] = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "reasoning": {
                "provider": "anthropic",
                "text": "One city.",
                "blocks": [{"type": "thinking", "thinking": "One city.", "signature": "sig"}],
            },
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
                },
                {"id": "c2", "type": "function", "function": {"name": "ping", "arguments": ""}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "18C"},
        {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "pong"}]},
        {"role": "user", "content": [{"type": "text", "text": "Thanks."}]},
    ],
    "tools": [
        {
            "name": "weather",
            "description": "Weather by city",
            "input": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
        {"name": "ping", "description": "No arguments"},
        {"name": "hidden", "description": "Deferred", "defer": True},
    ],
    "temperature": 0.2,
    "max_completion_tokens": 100,
}
WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}
NO_ARGUMENTS = {"type": "object", "properties": {}}


def test_conversation_fixture_is_schema_valid():
    REQUEST_SCHEMA.validate(CONVERSATION)


def test_openai_build_request():
    body = openai.build_request(CONVERSATION, stream=True)
    assert body == {
        "model": "m",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": CONVERSATION["messages"][2]["tool_calls"],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "18C"},
            {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "pong"}]},
            {"role": "user", "content": [{"type": "text", "text": "Thanks."}]},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "weather",
                    "description": "Weather by city",
                    "parameters": WEATHER_SCHEMA,
                },
            },
            {
                "type": "function",
                "function": {
                    "name": "ping",
                    "description": "No arguments",
                    "parameters": NO_ARGUMENTS,
                },
            },
        ],
        "temperature": 0.2,
        "max_completion_tokens": 100,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    assert "stream" not in openai.build_request(CONVERSATION, stream=False)


@pytest.mark.parametrize(
    "arguments",
    ["[1]", '{"a": ', '{"a":' * 3000 + "1" + "}" * 3000],
    ids=["not an object", "not JSON", "3000 deep"],
)
def test_anthropic_sends_arguments_the_model_botched_as_an_empty_input(arguments: str):
    """Still in the history after their call failed: every later request must build."""
    call = {"id": "c1", "type": "function", "function": {"name": "ping", "arguments": arguments}}
    history = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "Error: arguments refused"},
    ]
    body = anthropic.build_request(ask(messages=history), stream=False)
    assert body["messages"][1]["content"] == [
        {"type": "tool_use", "id": "c1", "name": "ping", "input": {}}
    ]


def test_openai_and_openrouter_reasoning_config():
    request = ask(reasoning={"effort": "high", "max_tokens": None})
    assert openai.build_request(request, stream=False)["reasoning_effort"] == "high"
    routed = openai.build_request(request, stream=False, provider="openrouter")
    assert routed["reasoning"] == {"effort": "high"}
    assert "reasoning_effort" not in routed


def test_anthropic_build_request():
    body = anthropic.build_request(CONVERSATION, stream=False)
    assert body == {
        "model": "m",
        "max_tokens": 100,
        "system": "You are terse.",
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "One city.", "signature": "sig"},
                    {"type": "tool_use", "id": "c1", "name": "weather", "input": {"city": "Paris"}},
                    {"type": "tool_use", "id": "c2", "name": "ping", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "c1", "content": "18C"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "c2",
                        "content": [{"type": "text", "text": "pong"}],
                    },
                ],
            },
            {"role": "user", "content": [{"type": "text", "text": "Thanks."}]},
        ],
        "tools": [
            {"name": "weather", "description": "Weather by city", "input_schema": WEATHER_SCHEMA},
            {"name": "ping", "description": "No arguments", "input_schema": NO_ARGUMENTS},
        ],
        "temperature": 0.2,
    }
    assert anthropic.build_request(CONVERSATION, stream=True)["stream"] is True


def test_anthropic_defaults_and_foreign_reasoning():
    request = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "One."},
            {"role": "system", "content": [{"type": "text", "text": "Two."}]},
            {"role": "user", "content": "Hi"},
            {
                "role": "assistant",
                "content": "Calling.",
                "reasoning": {"provider": "openrouter", "text": "hmm", "blocks": [{"x": 1}]},
                "tool_calls": [
                    {"id": "t", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
        ],
    }
    body = anthropic.build_request(request, stream=False)
    assert body["max_tokens"] == anthropic.DEFAULT_MAX_TOKENS == 8192
    assert body["system"] == [{"type": "text", "text": "One."}, {"type": "text", "text": "Two."}]
    assert body["messages"][1]["content"] == [
        {"type": "text", "text": "Calling."},
        {"type": "tool_use", "id": "t", "name": "f", "input": {}},
    ]
    assert "tools" not in body and "temperature" not in body


def test_anthropic_thinking_budget():
    body = anthropic.build_request(ask(reasoning={"effort": "low"}), stream=False)
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert body["max_tokens"] > 2048
    body = anthropic.build_request(ask(reasoning={"enabled": False}), stream=False)
    assert "thinking" not in body


def test_stored_content_parts_must_be_resolved_first():
    request = ask()
    request["messages"][0]["content"] = [{"type": "blob", "uri": "blob:1"}]
    for build in (openai.build_request, anthropic.build_request):
        with pytest.raises(ProviderError, match="'blob'"):
            build(request, stream=False)


def test_anthropic_images_and_files():
    request = ask()
    request["messages"][0]["content"] = [
        {"type": "image_url", "image_url": {"url": "https://example.test/cat.png"}},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0K"}},
        {
            "type": "file",
            "file": {"filename": "a.pdf", "file_data": "data:application/pdf;base64,JVBE"},
        },
    ]
    content = anthropic.build_request(request, stream=False)["messages"][0]["content"]
    assert content == [
        {"type": "image", "source": {"type": "url", "url": "https://example.test/cat.png"}},
        {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0K"},
        },
        {
            "type": "document",
            "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBE"},
        },
    ]


# Recorded non-streaming bodies (notes/engine-facts.md §3.1, §3.2).
OPENAI_RECORDED_BODY = {
    "choices": [
        {
            "finish_reason": "tool_calls",
            "index": 0,
            "logprobs": None,
            "message": {
                "annotations": [],
                "content": None,
                "refusal": None,
                "role": "assistant",
                "tool_calls": [
                    {
                        "function": {
                            "arguments": '{"location": "Boston"}',
                            "name": "get_current_weather",
                        },
                        "id": "call_26LsX7EjeYJZFKQVtq7cZKmC",
                        "type": "function",
                    }
                ],
            },
        }
    ],
    "created": 1753162009,
    "id": "chatcmpl-recorded",
    "model": "gpt-4.1-nano-2025-04-14",
    "object": "chat.completion",
    "service_tier": "default",
    "system_fingerprint": None,
    "usage": {
        "completion_tokens": 46,
        "completion_tokens_details": {"reasoning_tokens": 0},
        "prompt_tokens": 81,
        "prompt_tokens_details": {"audio_tokens": 0, "cached_tokens": 0},
        "total_tokens": 127,
    },
}

ANTHROPIC_RECORDED_BODY = {
    "id": "msg_recorded",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-5-20250929",
    "content": [
        {"type": "text", "text": "Checking."},
        {
            "type": "tool_use",
            "id": "toolu_recorded",
            "name": "get_weather",
            "input": {"location": "SF"},
        },
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {
        "input_tokens": 2,
        "cache_creation_input_tokens": 120,
        "cache_read_input_tokens": 151464,
        "output_tokens": 317,
        "cache_creation": {"ephemeral_1h_input_tokens": 120, "ephemeral_5m_input_tokens": 0},
        "service_tier": "standard",
    },
}


def test_openai_parse_recorded_body():
    response = openai.parse_response(OPENAI_RECORDED_BODY)
    RESPONSE_SCHEMA.validate(response)
    assert response["content"] is None
    assert response["finish_reason"] == "tool_calls"
    assert response["tool_calls"] == [
        {
            "id": "call_26LsX7EjeYJZFKQVtq7cZKmC",
            "type": "function",
            "function": {"name": "get_current_weather", "arguments": '{"location": "Boston"}'},
        }
    ]
    assert {k: v for k, v in response["usage"].items() if k != "provider"} == {
        "input": 81,
        "output": 46,
        "uncached_input": 81,
        "cache_read": 0,
        "cache_write": 0,
        "total": 127,
    }
    assert response["usage"]["provider"] == OPENAI_RECORDED_BODY["usage"]


def test_anthropic_parse_recorded_body():
    response = anthropic.parse_response(ANTHROPIC_RECORDED_BODY)
    RESPONSE_SCHEMA.validate(response)
    assert response["content"] == "Checking."
    assert response["finish_reason"] == "tool_calls"
    assert response["tool_calls"] == [
        {
            "id": "toolu_recorded",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"location":"SF"}'},
        }
    ]
    assert {k: v for k, v in response["usage"].items() if k != "provider"} == {
        "input": 151586,
        "output": 317,
        "uncached_input": 2,
        "cache_read": 151464,
        "cache_write": 120,
        "total": 151903,
    }
    # claude-sonnet-4-5: 2 * 3 + 151464 * 0.30 + 120 * 3.75 + 317 * 15 = 50650.2 per million
    assert response["cost"] == "0.0506502"


@pytest.mark.parametrize(
    ("stop_reason", "finish_reason"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("tool_use", "tool_calls"),
        ("refusal", "content_filter"),
        ("pause_turn", "pause_turn"),
    ],
)
def test_anthropic_finish_reasons(stop_reason, finish_reason):
    body = {**ANTHROPIC_RECORDED_BODY, "stop_reason": stop_reason}
    assert anthropic.parse_response(body)["finish_reason"] == finish_reason


def test_anthropic_stream_ignores_pings_and_unknown_events():
    accumulator = anthropic.StreamAccumulator()
    events = [
        {"type": "message_start", "message": {"model": "m", "usage": {"input_tokens": 5}}},
        {"type": "ping"},
        {"type": "brand_new_event", "payload": 1},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "ok"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "new_delta", "x": 1}},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn"},
            "usage": {"output_tokens": 2},
        },
    ]
    deltas = [delta for event in events for delta in accumulator.feed(event)]
    assert deltas == [{"text": "ok"}, {"finish_reason": "stop"}]
    with pytest.raises(ProviderError, match="before message_stop") as caught:
        accumulator.finish()
    assert caught.value.retryable
    accumulator.feed({"type": "message_stop"})
    assert accumulator.finish()["usage"]["total"] == 7


def test_openai_stream_without_finish_reason_is_retryable():
    accumulator = openai.StreamAccumulator()
    chunk = {"model": "m", "choices": [{"index": 0, "delta": {"content": "Hel"}}]}
    assert accumulator.feed(chunk) == [{"text": "Hel"}]
    with pytest.raises(ProviderError, match="before a finish reason") as caught:
        accumulator.finish()
    assert caught.value.retryable


@pytest.mark.parametrize(
    "chunk",
    [
        {"error": {"message": "The server had an error.", "type": "server_error", "code": None}},
        {"model": "m", "choices": [{"index": 0, "delta": {}, "finish_reason": "error"}]},
    ],
    ids=["error-object", "finish-error"],
)
def test_openai_in_stream_error_chunk(chunk):
    accumulator = openai.StreamAccumulator()
    accumulator.feed({"model": "m", "choices": [{"index": 0, "delta": {"content": "a"}}]})
    assert accumulator.feed(chunk) == []
    with pytest.raises(ProviderError, match="reported an error mid-answer") as caught:
        accumulator.finish()
    assert (caught.value.code, caught.value.retryable) == ("provider_error", True)


def test_openai_error_in_a_whole_body():
    body = {"error": {"code": 429, "message": "Rate limit exceeded"}, "choices": []}
    with pytest.raises(ProviderError) as caught:
        openai.parse_response(body, provider="openrouter")
    assert (caught.value.code, caught.value.retryable) == ("rate_limited", True)
    with pytest.raises(ProviderError) as caught:
        openai.parse_response({"id": "x", "choices": []})
    assert caught.value.code == "invalid_response"


# --- pure error tables ----------------------------------------------------------------


def test_retry_after_headers():
    headers = CIMultiDict({"Retry-After": "7", "retry-after-ms": "1500"})
    assert openai.parse_error(429, headers, b"{}").retry_after == 1.5
    assert openai.parse_error(429, CIMultiDict({"retry-after": "7"}), b"").retry_after == 7
    dated = CIMultiDict({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"})
    assert anthropic.parse_error(429, dated, b"").retry_after == 0.0
    assert anthropic.parse_error(429, CIMultiDict({"retry-after": "soon"}), b"").retry_after is None


def test_error_messages_never_carry_documents():
    html = b"<html><head><title>502</title></head><body>" + b"x" * 5000 + b"</body></html>"
    error = openai.parse_error(502, CIMultiDict(), html, provider="openrouter")
    assert error.message == "OpenRouter returned HTTP 502"
    long = json.dumps({"error": {"message": "word " * 500}}).encode()
    error = openai.parse_error(400, CIMultiDict(), long)
    assert len(error.message) < 300 and error.message.endswith("…")


def test_anthropic_error_types_decide():
    body = json.dumps(
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    )
    error = anthropic.parse_error(529, CIMultiDict(), body.encode())
    assert (error.code, error.retryable) == ("provider_error", True)
    body = json.dumps(
        {"type": "error", "error": {"type": "invalid_request_error", "message": "no"}}
    )
    assert anthropic.parse_error(400, CIMultiDict(), body.encode()).retryable is False


# --- prices ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "key"),
    [
        ("claude-haiku-4-5-20251001", "claude-haiku-4-5"),
        ("anthropic/claude-sonnet-4-5", "claude-sonnet-4-5"),
        ("anthropic/claude-sonnet-4.5", "claude-sonnet-4-5"),
        ("claude-opus-4-1-20250805", "claude-opus-4-1"),
        ("gpt-4o-mini", "gpt-4o-mini"),
        ("openai/gpt-4o-2024-08-06", "gpt-4o"),
        ("gpt-4.1-mini-2025-04-14", "gpt-4.1-mini"),
        ("gpt-4.1", "gpt-4.1"),
        ("gpt-4.10", None),
        ("claude-3-haiku", None),
        ("mystery", None),
    ],
)
def test_price_lookup_by_prefix(model, key):
    assert prices.price_for(model) == (prices.PRICES[key] if key else None)


@pytest.mark.parametrize(
    ("amount", "text"),
    [
        (7.35e-06, "0.00000735"),
        (0, "0"),
        (0.0, "0"),
        (Decimal("1E+2"), "100"),
        (Decimal("0.000475000"), "0.000475"),
        (1.5, "1.5"),
    ],
)
def test_usd_is_a_plain_decimal(amount, text):
    assert prices.usd(amount) == text
