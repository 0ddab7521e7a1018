"""deliver() against a real TestWorker over HTTP: answers, streams, garbage, failures."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from engine.effects.delivery import (
    DecisionFailure,
    Delivery,
    deliver,
    sign,
    sign_timestamped,
    verify,
    verify_timestamped,
)
from engine.effects.http_pool import new_session
from engine.effects.worker import CheckedMessages, Unsendable, _check_outgoing
from engine.protocol import (
    DecisionRequest,
    DecisionResponse,
    LlmExecuteTrigger,
    MessageTree,
    SessionStartTrigger,
    WorkerIdentity,
    to_wire,
)
from tests.workers import (
    Decide,
    Hang,
    Json,
    Reply,
    Stream,
    TestWorker,
    WorkerFactory,
)
from tests.workers import test_worker as test_worker  # the fixture

LIMIT = 8 * 1024 * 1024


def decision_request(trigger: Any = None) -> dict[str, Any]:
    """A minimal schema-valid DecisionRequest, as the engine would send it."""
    request = DecisionRequest(
        session_id="s1",
        decision_id="d1",
        agent_id="helper",
        identity=WorkerIdentity(metadata={}),
        trigger=trigger or SessionStartTrigger(),
        proposed=DecisionResponse(),
        state=None,
        calls=[],
        pending_calls=0,
        messages=[],
        message_tree=MessageTree(nodes=[]),
        ancestry=[],
        attempts=1,
    )
    return to_wire(request)


BODY = json.dumps(decision_request()).encode()
STREAMED_BODY = json.dumps(
    decision_request(
        LlmExecuteTrigger(id="c1", request={"model": "m", "messages": []}, stream=True, attempt=1)
    )
).encode()
LLM_RESULT = {"actions": [{"type": "llm.result", "id": "c1", "response": {"model": "m"}}]}


def answer(value: Any) -> Decide:
    async def decide(request: dict[str, Any]) -> Any:
        return value

    return decide


def to(worker: TestWorker, body: bytes = BODY, **kw: Any) -> Delivery:
    return Delivery(url=worker.url, body=body, secret=kw.pop("secret", None), timeout=5.0, **kw)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with new_session() as session:
        yield session


async def failure(http: aiohttp.ClientSession, d: Delivery, **kw: Any) -> DecisionFailure:
    with pytest.raises(DecisionFailure) as caught:
        await deliver(http, d, **kw)
    return caught.value


# --- JSON answers ------------------------------------------------------------------------


async def test_json_answer_is_parsed_and_the_body_arrives_byte_for_byte(
    http: aiohttp.ClientSession, test_worker: WorkerFactory
) -> None:
    decision = {
        "messages": [{"role": "assistant", "content": "hi"}],
        "actions": [{"type": "done", "data": {"ok": True}}],
        "state": {"step": 2},
    }
    worker = await test_worker(answer(decision))
    body = json.dumps(decision_request(), indent=3, sort_keys=True).encode()  # unusual bytes

    assert await deliver(http, to(worker, body)) == decision
    assert worker.raw_bodies == [body]
    assert worker.requests == [decision_request()]


async def test_default_worker_echoes_proposed(
    http: aiohttp.ClientSession, test_worker: WorkerFactory
) -> None:
    request = decision_request()
    request["proposed"] = {"actions": [{"type": "llm.call"}]}
    worker = await test_worker()
    assert await deliver(http, to(worker, json.dumps(request).encode())) == request["proposed"]


@pytest.mark.parametrize("empty", [None, {}], ids=["null", "object"])
async def test_null_and_empty_object_are_the_empty_decision(
    http: aiohttp.ClientSession, test_worker: WorkerFactory, empty: Any
) -> None:
    worker = await test_worker(answer(Json(empty)))
    assert await deliver(http, to(worker)) == {}


async def test_headers_and_a_fresh_traceparent_per_attempt(
    http: aiohttp.ClientSession, test_worker: WorkerFactory
) -> None:
    worker = await test_worker()
    await deliver(http, to(worker))
    await deliver(http, to(worker))

    traces = []
    for headers in worker.headers:
        assert headers["Content-Type"] == "application/json"
        assert headers["Accept"] == "text/event-stream, application/json"
        assert "X-Substructure-Signature" not in headers
        match = re.fullmatch(r"00-([0-9a-f]{32})-([0-9a-f]{16})-01", headers["traceparent"])
        assert match, headers["traceparent"]
        assert match[1] != "0" * 32 and match[2] != "0" * 16
        traces.append(match[1])
    assert traces[0] != traces[1]


# --- signatures --------------------------------------------------------------------------


def test_sign_matches_the_rfc_4231_vector_and_verify_is_exact() -> None:
    # RFC 4231, test case 2 (HMAC-SHA-256).
    expected = "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    assert sign("Jefe", b"what do ya want for nothing?") == expected
    assert verify("Jefe", b"what do ya want for nothing?", expected)
    assert not verify("Jefe", b"what do ya want for nothing!", expected)
    assert not verify("Jefe", b"what do ya want for nothing?", expected.upper())
    assert not verify("Jefe", b"what do ya want for nothing?", None)
    assert not verify("Jefe", b"what do ya want for nothing?", "sha256=é")


async def test_signed_request_passes_the_workers_own_check(
    http: aiohttp.ClientSession, test_worker: WorkerFactory
) -> None:
    worker = await test_worker(answer({"state": 1}), secret="s3cret")
    assert await deliver(http, to(worker, secret="s3cret")) == {"state": 1}
    assert worker.headers[0]["X-Substructure-Signature"] == sign("s3cret", BODY)
    stamped = worker.headers[0]["X-Subs-Signature"]  # t=<unix>,v1=<hex of "t." + body>
    sent_at = int(stamped.removeprefix("t=").partition(",")[0])
    assert abs(time.time() - sent_at) < 60
    assert stamped == sign_timestamped("s3cret", BODY, sent_at)
    assert verify_timestamped("s3cret", BODY, stamped, time.time())
    assert not verify_timestamped("s3cret", BODY, stamped, sent_at + 301)  # a replay
    assert len(worker.requests) == 1


@pytest.mark.parametrize("secret", ["wrong", None], ids=["wrong-secret", "unsigned"])
async def test_bad_signature_is_refused_with_401(
    http: aiohttp.ClientSession, test_worker: WorkerFactory, secret: str | None
) -> None:
    worker = await test_worker(answer({"state": 1}), secret="s3cret")
    failed = await failure(http, to(worker, secret=secret))
    assert failed.code == "worker_unreachable"
    assert failed.retryable
    assert failed.message.startswith("worker answered 401: ")
    assert "X-Substructure-Signature" in failed.message
    assert failed.detail["status"] == 401
    assert worker.requests == [] and len(worker.raw_bodies) == 1


# --- event streams -----------------------------------------------------------------------


async def test_stream_delivers_deltas_in_order_then_returns_the_result(
    http: aiohttp.ClientSession, test_worker: WorkerFactory
) -> None:
    vendor_event = {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "text_delta", "text": "Hel"},
    }
    stream = Stream(
        [
            ("llm.token.delta", {"text": "He"}),
            ("ping", {"type": "ping"}),  # unknown events are skipped
            ("llm.token.delta", vendor_event),
            ("llm.token.delta", {"text": "lo", "finish_reason": "stop"}),
            ("decision.result", LLM_RESULT),
            ("llm.token.delta", {"text": "after the result"}),
            ("decision.result", {"state": "second result"}),
        ]
    )
    worker = await test_worker(answer(stream))
    deltas: list[dict[str, Any]] = []

    async def on_delta(delta: dict[str, Any]) -> None:
        deltas.append(delta)

    assert await deliver(http, to(worker, STREAMED_BODY), on_delta) == LLM_RESULT
    assert deltas == [{"text": "He"}, vendor_event, {"text": "lo", "finish_reason": "stop"}]


async def test_stream_without_a_delta_callback(
    http: aiohttp.ClientSession, test_worker: WorkerFactory
) -> None:
    stream = Stream([("llm.token.delta", {"text": "x"}), ("decision.result", LLM_RESULT)])
    worker = await test_worker(answer(stream))
    assert await deliver(http, to(worker, STREAMED_BODY)) == LLM_RESULT


async def test_a_streamed_empty_decision_is_an_answer(
    http: aiohttp.ClientSession, test_worker: WorkerFactory
) -> None:
    worker = await test_worker(answer(Stream([("decision.result", {})])))
    assert await deliver(http, to(worker, STREAMED_BODY)) == {}


async def test_a_stream_that_is_not_utf8_is_refused(
    http: aiohttp.ClientSession, test_worker: WorkerFactory
) -> None:
    body = b'event: llm.token.delta\ndata: {"text":"\xff"}\n\n'
    worker = await test_worker(answer(Reply(200, body, "text/event-stream")))
    failed = await failure(http, to(worker, STREAMED_BODY))
    assert failed.code == "invalid_response" and "not UTF-8" in failed.message


@pytest.mark.parametrize(
    ("space", "newline"),
    [(False, "\n"), (True, "\r\n"), (False, "\r")],
    ids=["nospace", "crlf", "cr"],
)
async def test_stream_framing_variants(
    http: aiohttp.ClientSession, test_worker: WorkerFactory, space: bool, newline: str
) -> None:
    frames = [("llm.token.delta", {"text": "a b"}), ("decision.result", LLM_RESULT)]
    worker = await test_worker(answer(Stream(frames, space=space, newline=newline)))
    deltas: list[dict[str, Any]] = []

    async def on_delta(delta: dict[str, Any]) -> None:
        deltas.append(delta)

    assert await deliver(http, to(worker, STREAMED_BODY), on_delta) == LLM_RESULT
    assert deltas == [{"text": "a b"}]


async def test_multiline_data_is_joined(
    http: aiohttp.ClientSession, test_worker: WorkerFactory
) -> None:
    result = json.dumps(LLM_RESULT, indent=2)  # several `data:` lines
    worker = await test_worker(answer(Stream([("decision.result", result)])))
    assert await deliver(http, to(worker, STREAMED_BODY)) == LLM_RESULT


@pytest.mark.parametrize(
    ("data", "retryable"),
    [({"message": "vendor down"}, True), ({"message": "bad key", "retryable": False}, False)],
    ids=["default-retryable", "not-retryable"],
)
async def test_decision_error_frame_is_a_handler_error(
    http: aiohttp.ClientSession, test_worker: WorkerFactory, data: dict[str, Any], retryable: bool
) -> None:
    stream = Stream([("llm.token.delta", {"text": "x"}), ("decision.error", data)])
    worker = await test_worker(answer(stream))
    failed = await failure(http, to(worker, STREAMED_BODY))
    assert failed.code == "handler_error"
    assert failed.retryable is retryable
    assert data["message"] in failed.message


async def test_malformed_decision_error_is_an_invalid_response(
    http: aiohttp.ClientSession, test_worker: WorkerFactory
) -> None:
    worker = await test_worker(answer(Stream([("decision.error", {"error": "oops"})])))
    failed = await failure(http, to(worker, STREAMED_BODY))
    assert failed.code == "invalid_response"
    assert failed.message.startswith("decision.error: ")


async def test_stream_ending_without_result_is_an_invalid_response(
    http: aiohttp.ClientSession, test_worker: WorkerFactory
) -> None:
    worker = await test_worker(answer(Stream([("llm.token.delta", {"text": "x"})])))
    deltas: list[dict[str, Any]] = []

    async def on_delta(delta: dict[str, Any]) -> None:
        deltas.append(delta)

    failed = await failure(http, to(worker, STREAMED_BODY), on_delta=on_delta)
    assert (failed.code, failed.retryable) == ("invalid_response", True)
    assert failed.message == "the stream ended without decision.result"
    assert deltas == [{"text": "x"}]


@pytest.mark.parametrize(
    ("event", "data", "message"),
    [
        ("llm.token.delta", "{not json", "llm.token.delta: the data is not JSON: '{not json'"),
        ("llm.token.delta", "[1, 2]", "llm.token.delta: the data is not a JSON object"),
        ("decision.result", "", "decision.result: the data is not JSON: the data is empty"),
        ("decision.error", "oops", "decision.error: the data is not JSON: 'oops'"),
    ],
)
async def test_bad_frame_data_names_the_event(
    http: aiohttp.ClientSession, test_worker: WorkerFactory, event: str, data: str, message: str
) -> None:
    worker = await test_worker(answer(Stream([(event, data)], invalid=True)))
    failed = await failure(http, to(worker, STREAMED_BODY))
    assert (failed.code, failed.message) == ("invalid_response", message)


async def test_invalid_streamed_result_names_the_param(
    http: aiohttp.ClientSession, test_worker: WorkerFactory
) -> None:
    bad = {"actions": [{"type": "llm.reslt", "response": {}}]}
    worker = await test_worker(answer(Stream([("decision.result", bad)], invalid=True)))
    failed = await failure(http, to(worker, STREAMED_BODY))
    assert failed.code == "invalid_response"
    assert failed.message.startswith("decision.result: invalid decision response: actions.0.type")
    assert failed.param == "actions.0.type"


# --- garbage -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (
            Reply(200, b"<html>Bad Gateway</html>", "text/html"),
            "the answer is not JSON: '<html>Bad Gateway</html>'",
        ),
        (Reply(200, b""), "the answer is not JSON: the body is empty"),
        (
            Json([{"type": "done"}], invalid=True),
            "invalid decision response: expected a JSON object, got array",
        ),
        (
            Json("done", invalid=True),
            "invalid decision response: expected a JSON object, got string",
        ),
    ],
    ids=["html", "empty", "array", "string"],
)
async def test_a_body_that_is_not_a_json_object(
    http: aiohttp.ClientSession, test_worker: WorkerFactory, reply: Any, message: str
) -> None:
    worker = await test_worker(answer(reply))
    failed = await failure(http, to(worker))
    assert (failed.code, failed.message, failed.retryable) == ("invalid_response", message, True)


async def test_long_garbage_is_cut_in_the_message(
    http: aiohttp.ClientSession, test_worker: WorkerFactory
) -> None:
    worker = await test_worker(answer(Reply(200, b"y" * 5000, "text/plain")))
    failed = await failure(http, to(worker))
    assert failed.message == "the answer is not JSON: " + repr("y" * 200) + "…"


@pytest.mark.parametrize(
    ("decision", "param", "says"),
    [
        ({"actions": [{"type": "tool.cal", "name": "x"}]}, "actions.0.type", "unknown type"),
        ({"actions": [{"type": "done"}], "bogus": 1}, "bogus", "unknown field"),
        ({"messages": [{"content": "hi"}]}, "messages.0.role", "required field is missing"),
    ],
    ids=["action-type", "extra-field", "missing-field"],
)
async def test_an_invalid_decision_names_the_param(
    http: aiohttp.ClientSession,
    test_worker: WorkerFactory,
    decision: dict[str, Any],
    param: str,
    says: str,
) -> None:
    worker = await test_worker(answer(Json(decision, invalid=True)))
    failed = await failure(http, to(worker))
    assert failed.code == "invalid_response"
    assert (failed.param, failed.detail["param"]) == (param, param)
    assert f"{param}: {says}" in failed.message


@pytest.mark.parametrize(
    "reply",
    [
        Reply(200, b"x" * (10 * 1024 * 1024)),
        Reply(200, b"x" * (10 * 1024 * 1024), chunked=True),
        Stream([("llm.token.delta", "x" * (10 * 1024 * 1024))], invalid=True),
    ],
    ids=["content-length", "chunked", "one-huge-frame"],
)
async def test_ten_megabytes_of_junk_is_refused_quickly(
    http: aiohttp.ClientSession, test_worker: WorkerFactory, reply: Any
) -> None:
    worker = await test_worker(answer(reply))
    started = time.monotonic()
    failed = await failure(http, to(worker, STREAMED_BODY))
    assert time.monotonic() - started < 2
    assert failed.code == "invalid_response"
    assert f"larger than the limit of {LIMIT} bytes" in failed.message
    assert failed.detail == {"limit": LIMIT}


async def test_body_limit_counts_decoded_bytes_without_content_length(
    http: aiohttp.ClientSession, test_worker: WorkerFactory
) -> None:
    body = json.dumps({"state": "z" * 2000}).encode()
    worker = await test_worker(answer(Reply(200, body, chunked=True)))
    failed = await failure(http, to(worker, max_body=1000))
    assert failed.message == "the answer is larger than the limit of 1000 bytes"
    assert await deliver(http, to(worker, max_body=len(body))) == {"state": "z" * 2000}


async def test_a_long_stream_of_small_frames_is_not_cut_by_the_limit(
    http: aiohttp.ClientSession, test_worker: WorkerFactory
) -> None:
    frames = [("llm.token.delta", {"text": "token "}) for _ in range(200)]
    worker = await test_worker(answer(Stream([*frames, ("decision.result", LLM_RESULT)])))
    seen = 0

    async def on_delta(delta: dict[str, Any]) -> None:
        nonlocal seen
        seen += 1

    d = to(worker, STREAMED_BODY, max_body=1000)  # far less than the whole stream
    assert await deliver(http, d, on_delta) == LLM_RESULT
    assert seen == 200


# --- unreachable -------------------------------------------------------------------------


async def test_server_error_status(http: aiohttp.ClientSession, test_worker: WorkerFactory) -> None:
    worker = await test_worker(answer(Reply(500, b"Traceback: KeyError 'trigger'", "text/plain")))
    failed = await failure(http, to(worker))
    assert (failed.code, failed.retryable) == ("worker_unreachable", True)
    assert failed.message == "worker answered 500: \"Traceback: KeyError 'trigger'\""
    assert failed.detail == {"status": 500}


async def test_connection_refused(http: aiohttp.ClientSession) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    d = Delivery(url=f"http://127.0.0.1:{port}/", body=BODY, secret=None, timeout=5.0)
    failed = await failure(http, d)
    assert (failed.code, failed.retryable) == ("worker_unreachable", True)
    assert failed.message.startswith("cannot reach the worker: ConnectError")


async def test_a_worker_that_never_answers_times_out(
    http: aiohttp.ClientSession, test_worker: WorkerFactory
) -> None:
    worker = await test_worker(answer(Hang()))
    started = time.monotonic()
    failed = await failure(http, Delivery(url=worker.url, body=BODY, secret=None, timeout=0.3))
    assert 0.3 <= time.monotonic() - started < 1.3
    assert (failed.code, failed.retryable) == ("worker_unreachable", True)
    assert failed.message == "no answer within 0.3 s"


async def test_a_stream_that_stalls_times_out(
    http: aiohttp.ClientSession, test_worker: WorkerFactory
) -> None:
    worker = await test_worker(answer(Stream([("llm.token.delta", {"text": "x"})], hang=True)))
    deltas: list[dict[str, Any]] = []

    async def on_delta(delta: dict[str, Any]) -> None:
        deltas.append(delta)

    started = time.monotonic()
    d = Delivery(url=worker.url, body=STREAMED_BODY, secret=None, timeout=0.3)
    failed = await failure(http, d, on_delta=on_delta)
    assert time.monotonic() - started < 1.3
    assert failed.message == "no answer within 0.3 s"
    assert deltas == [{"text": "x"}]


async def test_cancelling_an_attempt_is_not_a_failure(
    http: aiohttp.ClientSession, test_worker: WorkerFactory
) -> None:
    worker = await test_worker(answer(Hang()))
    attempt = asyncio.create_task(deliver(http, to(worker)))
    await worker.wait_for(1)
    attempt.cancel()
    with pytest.raises(asyncio.CancelledError):
        await attempt


# --- the connection ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "reply",
    [
        Json({"state": 1}),
        Stream([("llm.token.delta", {"text": "x"}), ("decision.result", LLM_RESULT)]),
        # The body ends a moment after the result: read to its end, not abandoned.
        Stream([("decision.result", LLM_RESULT)], end_delay=0.02),
        Stream([("decision.result", LLM_RESULT), ("llm.token.delta", {"text": "after"})]),
    ],
    ids=["json", "stream", "slow-end", "frames-after-the-result"],
)
async def test_sequential_deliveries_reuse_one_connection(
    http: aiohttp.ClientSession, test_worker: WorkerFactory, reply: Any
) -> None:
    worker = await test_worker(answer(reply))
    for _ in range(5):
        await deliver(http, to(worker, STREAMED_BODY))
    assert len(worker.peers) == 5
    assert len(set(worker.peers)) == 1, worker.peers


async def test_a_stream_held_open_after_its_result_is_answered_and_let_go(
    http: aiohttp.ClientSession, test_worker: WorkerFactory
) -> None:
    worker = await test_worker(answer(Stream([("decision.result", LLM_RESULT)], hang=True)))
    started = time.monotonic()
    assert await deliver(http, to(worker, STREAMED_BODY)) == LLM_RESULT
    assert time.monotonic() - started < 1.3  # the drain gives up; the deadline is 5 s
    assert await deliver(http, to(worker, STREAMED_BODY)) == LLM_RESULT
    assert len(set(worker.peers)) == 2  # the held connection was closed, not reused


# --- the test worker itself --------------------------------------------------------------


async def test_the_test_worker_records_what_a_strict_worker_would_reject(
    http: aiohttp.ClientSession,
) -> None:
    unmarked_invalid = {"actions": [{"type": "nope"}]}
    async with TestWorker(answer(unmarked_invalid)) as worker:
        d = Delivery(url=worker.url, body=b'{"session_id": "s1"}', secret=None, timeout=5.0)
        failed = await failure(http, d)
        async with http.post(worker.url, data=BODY) as response:  # none of the delivery headers
            await response.read()
    assert failed.param == "actions.0.type"
    assert "$: 'decision_id' is a required property" in worker.schema_errors
    assert [e.split(" is ")[0] for e in worker.schema_errors if e.startswith("header")] == [
        "header Content-Type",
        "header Accept",
        "header traceparent",
    ]
    assert worker.response_schema_errors != []


def test_outgoing_requests_are_checked_and_each_recorded_message_once() -> None:
    """The engine never sends an invalid request (it names where it is wrong); a recorded
    message, the same dict in `messages` and `message_tree`, is checked once."""
    checked = CheckedMessages()
    good = {"id": "m1", "role": "user", "content": "hi"}
    request = decision_request()
    request["messages"] = [good]
    request["message_tree"] = {"nodes": [{"message": good, "parent_id": None}], "head_id": "m1"}
    _check_outgoing(request, checked)
    assert list(checked._held.values()) == [good]

    bad = {"id": "m2", "role": "nobody", "content": "hi"}
    request["message_tree"]["nodes"].append({"message": bad, "parent_id": "m1"})
    with pytest.raises(Unsendable, match=r"invalid at message_tree\.nodes\.1\.message\.role"):
        _check_outgoing(request, checked)
    request["messages"] = [good, bad]
    with pytest.raises(Unsendable, match=r"invalid at messages\.1\.role"):
        _check_outgoing(request, checked)
    request["pending_calls"] = -1
    with pytest.raises(Unsendable, match=r"invalid at pending_calls"):
        _check_outgoing(request, checked)


def test_checked_messages_hold_at_most_their_limit_oldest_out_first() -> None:
    checked = CheckedMessages(limit=2)
    messages = [{"id": f"m{i}", "role": "user", "content": "hi"} for i in range(3)]
    for i, message in enumerate(messages):
        checked.check(f"messages.{i}.", message)
    assert list(checked._held.values()) == messages[1:]
