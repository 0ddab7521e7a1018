"""One delivery attempt of a decision request to a user's worker (SPEC §3, §7).

The worker answers with a JSON DecisionResponse or an event stream of token deltas
ending in `decision.result`. Whatever goes wrong on the worker's side or on the way
is one `DecisionFailure` whose message says what it was; the retry policy (§11)
belongs to the caller.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from engine.effects.http_pool import drain, failure_name, failure_text
from engine.errors import ProtocolError, SubsError
from engine.jsonedge import JsonEdgeError, loads_checked
from engine.protocol import parse_decision_response, to_json
from engine.sse import Event, SseDecoder

__all__ = [
    "DecisionFailure",
    "Delivery",
    "deliver",
    "sign",
    "sign_timestamped",
    "verify",
    "verify_timestamped",
]

SIGNATURE_HEADER = "X-Substructure-Signature"  # the original engine's: workers written for it
# `t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>." + body>`: a captured request is refused
# by a worker once `t` is more than REPLAY_WINDOW seconds away from its clock.
TIMESTAMPED_HEADER = "X-Subs-Signature"
REPLAY_WINDOW = 300
_EXCERPT = 200
_ERROR_BODY = 1024  # bytes of a non-2xx body worth reading for its excerpt

OnDelta = Callable[[dict[str, Any]], Awaitable[None]]


class DecisionFailure(SubsError):
    """One failed delivery attempt.

    `code` is `worker_unreachable` (connection error, timeout, non-2xx status),
    `invalid_response` (an answer that is not a DecisionResponse, a stream without
    `decision.result`) or `handler_error` (the worker's own `decision.error`).
    Every failure is retryable except a `decision.error` saying `retryable: false`.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str,
        retryable: bool = True,
        param: str | None = None,
        detail: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message, code=code, retryable=retryable, param=param, detail=detail)


@dataclass(frozen=True)
class Delivery:
    """What one attempt sends, and where; `body` is sent and signed byte for byte."""

    url: str
    body: bytes
    secret: str | None
    timeout: float
    traceparent: str | None = None  # the attempt's span (engine/telemetry); None: a fresh one
    tracestate: str | None = None  # the client's, passed on untouched with its trace
    max_body: int = 8 * 1024 * 1024


def sign(secret: str, body: bytes) -> str:
    """The `X-Substructure-Signature` value: `sha256=` + hex HMAC-SHA256 of the raw body."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify(secret: str, body: bytes, header: str | None) -> bool:
    """Whether `header` is the signature of `body`, compared in constant time."""
    if header is None:
        return False
    return hmac.compare_digest(sign(secret, body).encode(), header.encode("utf-8", "replace"))


def sign_timestamped(secret: str, body: bytes, at: int) -> str:
    """The `X-Subs-Signature` value for a request sent at `at` (unix seconds)."""
    mac = hmac.new(secret.encode(), f"{at}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={at},v1={mac}"


def verify_timestamped(
    secret: str, body: bytes, header: str | None, now: float, window: int = REPLAY_WINDOW
) -> bool:
    """Whether `header` signs `body` and was made within `window` seconds of `now`."""
    match = _TIMESTAMPED.fullmatch(header or "")
    if match is None or abs(now - int(match.group(1))) > window:
        return False
    expected = sign_timestamped(secret, body, int(match.group(1)))
    return hmac.compare_digest(expected.encode(), (header or "").encode("utf-8", "replace"))


_TIMESTAMPED = re.compile(r"t=([0-9]{1,12}),v1=[0-9a-f]{64}")


def traceparent() -> str:
    """A fresh W3C trace context: version 00, random trace and parent ids, sampled."""
    trace_id = parent_id = 0
    while trace_id == 0:
        trace_id = secrets.randbits(128)
    while parent_id == 0:
        parent_id = secrets.randbits(64)
    return f"00-{trace_id:032x}-{parent_id:016x}-01"


class Deferred(SubsError):
    """A decision answered with an empty body: the worker sends its answer later
    (`POST /api/machine/workers/submit`). Not a failure: the caller records it waiting."""


async def deliver(
    http: aiohttp.ClientSession,
    d: Delivery,
    on_delta: OnDelta | None = None,
    *,
    defer: bool = False,
) -> dict[str, Any]:
    """POST the request once and return the worker's DecisionResponse as `to_json` gives it.

    `{}` is the empty decision (a `null` or `{}` answer). Token deltas of a streamed
    answer go to `on_delta` in order, untouched. Raises DecisionFailure for anything
    the worker or the network did; an exception raised by `on_delta` itself propagates.
    With `defer` (a decision, not a call), an empty body raises `Deferred`: the worker
    decides later (`POST /api/machine/workers/submit`, upstream's async worker submit).
    """
    headers = {
        "Content-Type": "application/json",
        "Accept": "text/event-stream, application/json",
        "traceparent": d.traceparent or traceparent(),
        **({"tracestate": d.tracestate} if d.tracestate else {}),
    }
    if d.secret is not None:
        headers[SIGNATURE_HEADER] = sign(d.secret, d.body)
        headers[TIMESTAMPED_HEADER] = sign_timestamped(d.secret, d.body, int(time.time()))
    try:
        async with asyncio.timeout(d.timeout):
            async with http.post(
                d.url, data=d.body, headers=headers, allow_redirects=False
            ) as response:
                return await _answer(response, d.max_body, on_delta, defer)
    except TimeoutError:  # the deadline, or one of aiohttp's own timeouts
        raise DecisionFailure(
            f"no answer within {d.timeout:g} s",
            code="worker_unreachable",
            detail={"timeout": d.timeout},
        ) from None
    except aiohttp.ClientError as exc:
        name, text = failure_name(exc), failure_text(exc)
        reason = f"{name}: {text}" if text else name
        raise DecisionFailure(
            f"cannot reach the worker: {reason}",
            code="worker_unreachable",
            detail={"error": name},
        ) from None


async def _answer(
    response: aiohttp.ClientResponse, limit: int, on_delta: OnDelta | None, defer: bool = False
) -> dict[str, Any]:
    if not 200 <= response.status < 300:
        raise await _status_failure(response)
    if "text/event-stream" in response.headers.get("Content-Type", "").lower():
        return await _read_stream(response, limit, on_delta)
    body = await _read_body(response, limit)
    if not body.strip() and defer:
        raise Deferred("the worker answers this decision later")
    if not body.strip():
        raise _invalid("the answer is not JSON: the body is empty")
    try:
        data = loads_checked(body)
    except JsonEdgeError as exc:
        if exc.syntax:
            raise _invalid(f"the answer is not JSON: {_excerpt(body)}") from None
        raise _invalid(f"the answer is refused: {exc.message}", param=exc.param) from None
    return _decision(data, "")


async def _status_failure(response: aiohttp.ClientResponse) -> DecisionFailure:
    head = bytearray()
    while len(head) < _ERROR_BODY and (chunk := await response.content.readany()):
        head += chunk
    message = f"worker answered {response.status}"
    if head:
        message += f": {_excerpt(bytes(head))}"
    return DecisionFailure(message, code="worker_unreachable", detail={"status": response.status})


async def _read_body(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """The whole body, refused as soon as it is known to be longer than `limit`."""
    declared = response.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    body = bytearray()
    async for chunk in response.content.iter_any():
        body += chunk
        if len(body) > limit:
            raise _too_large(limit)
    return bytes(body)


async def _read_stream(
    response: aiohttp.ClientResponse, limit: int, on_delta: OnDelta | None
) -> dict[str, Any]:
    """The worker's event stream, frame by frame (`engine/sse.py`); each frame (not the
    stream) is bounded by `limit`, so a long answer streams as many deltas as it has.
    What follows `decision.result` is drained, not read: the connection goes back to
    the pool."""
    decoder = SseDecoder()
    try:
        async for chunk in response.content.iter_any():
            answer = await _on_frames(decoder.feed(chunk), on_delta)
            if answer is not None:  # `{}`, the empty decision, is an answer too
                await drain(response)
                return answer
            if decoder.pending > limit:
                raise _too_large(limit, "an event-stream frame")
        answer = await _on_frames(decoder.close(), on_delta)
        if answer is not None:
            return answer
    except UnicodeDecodeError as err:
        raise _invalid(f"the event stream is not UTF-8 ({err.reason})") from None
    raise _invalid("the stream ended without decision.result")


async def _on_frames(events: list[Event], on_delta: OnDelta | None) -> dict[str, Any] | None:
    """Deltas go to `on_delta`; `decision.result` is the answer; other events are ignored."""
    for event in events:
        if event.event == "llm.token.delta":
            delta = _frame_json(event.event, event.data)
            if not isinstance(delta, dict):
                raise _invalid("llm.token.delta: the data is not a JSON object")
            if on_delta is not None:
                await on_delta(delta)
        elif event.event == "decision.result":
            return _decision(_frame_json(event.event, event.data), "decision.result: ")
        elif event.event == "decision.error":
            raise _handler_error(_frame_json(event.event, event.data))
    return None


def _frame_json(event: str, data: str) -> Any:
    if not data:
        raise _invalid(f"{event}: the data is not JSON: the data is empty", event=event)
    try:
        return loads_checked(data)
    except JsonEdgeError as exc:
        if exc.syntax:
            shown = _excerpt(data.encode("utf-8", "backslashreplace"))
            raise _invalid(f"{event}: the data is not JSON: {shown}", event=event) from None
        raise _invalid(
            f"{event}: the data is refused: {exc.message}", param=exc.param, event=event
        ) from None


def _decision(data: Any, where: str) -> dict[str, Any]:
    try:
        return to_json(parse_decision_response(data))
    except ProtocolError as exc:
        raise _invalid(where + exc.message, param=exc.param) from None


def _handler_error(data: Any) -> DecisionFailure:
    """The worker's own `decision.error {message, retryable?=true}`."""
    message = data.get("message") if isinstance(data, dict) else None
    retryable = data.get("retryable") if isinstance(data, dict) else None
    if retryable is None:
        retryable = True
    if not isinstance(message, str) or not isinstance(retryable, bool):
        return _invalid(
            "decision.error: the data must be {message: string, retryable?: boolean}, got "
            + _excerpt(json.dumps(data).encode()),
            event="decision.error",
        )
    return DecisionFailure(
        f"the worker failed: {message}",
        code="handler_error",
        retryable=retryable,
        detail={"event": "decision.error", "retryable": retryable},
    )


def _invalid(
    message: str, *, param: str | None = None, event: str | None = None
) -> DecisionFailure:
    detail: dict[str, Any] = {}
    if param is not None:
        detail["param"] = param
    if event is not None:
        detail["event"] = event
    return DecisionFailure(message, code="invalid_response", param=param, detail=detail)


def _too_large(limit: int, what: str = "the answer") -> DecisionFailure:
    return DecisionFailure(
        f"{what} is larger than the limit of {limit} bytes",
        code="invalid_response",
        detail={"limit": limit},
    )


def _excerpt(data: bytes) -> str:
    """The first characters of a body, quoted on one line."""
    text = data[: _EXCERPT * 4].decode("utf-8", "backslashreplace")  # a bad byte shows as \xff
    cut = len(text) > _EXCERPT or len(data) > _EXCERPT * 4
    return repr(text[:_EXCERPT]) + ("…" if cut else "")
