"""A scripted LLM vendor: OpenAI Chat Completions, OpenRouter and Anthropic Messages.

A real aiohttp server on 127.0.0.1, port 0. Tests push replies; each request pops
one and the reply is rendered in the format of the route that received it, as a
JSON body or an event stream (the request's `stream` decides), byte for byte as
notes/engine-facts.md §3 records the vendors' wire formats.

Usage is deterministic: input = characters of the request's text and tools // 4 + 1, output =
words of the reply (+ a quarter of each tool call's arguments). Part of the input is
read from or written to the vendor's prompt cache as each vendor does it
(tests/fakes/prompt_cache.py: Anthropic's breakpoints, OpenAI's automatic prefixes); the
rest is uncached. OpenRouter's reported cost prices each kind at its own rate.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import string
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from aiohttp import web

from tests.fakes.prompt_cache import CacheUse, PromptCaches, TooManyBreakpoints, tool_chars

OPENAI_PATH = "/v1/chat/completions"
OPENROUTER_PATH = "/api/v1/chat/completions"
ANTHROPIC_PATH = "/v1/messages"


# --- the script ------------------------------------------------------------------------


@dataclass
class Text:
    """A text answer.

    `chunks` splits the text into about that many stream chunks (default: one per
    word). `chunk_delay` is slept before each chunk (before a whole body, once);
    `end_delay` between a stream's last chunk and the end of its body, which over a
    real network can arrive in a packet of its own.
    `cache_read` / `cache_write` add that many cached input tokens to what the vendor's
    cache rule gives.
    `reasoning` adds Anthropic thinking / OpenRouter reasoning. `cost` is what
    OpenRouter reports (default: derived from the usage).
    """

    text: str
    chunks: int | None = None
    cache_read: int = 0
    cache_write: int = 0
    reasoning: str | None = None
    finish: str = "stop"
    cost: str | None = None
    chunk_delay: float = 0.0
    end_delay: float = 0.0


@dataclass
class ToolCalls:
    """Tool calls (parallel when several), with optional text before them."""

    calls: list[tuple[str, dict[str, Any]]]
    text: str | None = None
    chunk_delay: float = 0.0
    ids: list[str] | None = None  # the calls' ids; default: the vendor's own style, random


@dataclass
class HttpError:
    """An HTTP error answer; `body` defaults to the vendor's own body for the status."""

    status: int
    retry_after: float | None = None
    body: dict[str, Any] | None = None


@dataclass
class CutStream:
    """A stream that starts fine and stops before its finish reason.

    `abort=True` closes the connection mid-body; False ends the body cleanly.
    """

    after_chunks: int
    text: str = "this answer will never reach its end"
    abort: bool = True


@dataclass
class InStreamError:
    """A 200 stream that reports an error event/chunk after `after_chunks` chunks."""

    after_chunks: int = 1
    text: str = "this answer meets an error on its way"


@dataclass
class Raw:
    """Bytes sent as they are, for answers no vendor should send."""

    body: bytes
    status: int = 200
    content_type: str = "application/json"


Reply = Text | ToolCalls | HttpError | CutStream | InStreamError | Raw


@dataclass
class Recorded:
    """One request as the fake received it (header names in lower case); `peer` is the
    client's address and port, one per connection."""

    path: str
    headers: dict[str, str]
    body: Any
    received: float
    peer: str = ""
    raw: bytes = b""  # the body's bytes as they arrived


# --- one answer, vendor-neutral --------------------------------------------------------


@dataclass
class _Call:
    id: str
    name: str
    arguments: str  # json.dumps default style, as both vendors stream it


@dataclass
class _Answer:
    model: str
    text_pieces: list[str]
    reasoning_pieces: list[str]
    calls: list[_Call]
    finish: str  # neutral: stop | length | tool_calls
    uncached: int
    cache_read: int
    cache_write: int
    output: int
    cost: str | None = None

    @property
    def text(self) -> str:
        return "".join(self.text_pieces)

    @property
    def reasoning(self) -> str:
        return "".join(self.reasoning_pieces)


@dataclass
class _Frames:
    """A rendered stream: frames, and the index of the first one carrying the finish."""

    frames: list[bytes]
    finish_at: int


_OPENAI_FINISH = {"stop": "stop", "length": "length", "tool_calls": "tool_calls"}
_ANTHROPIC_FINISH = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}

_NUMBER = re.compile(r'"@num:([0-9.]+)@"')


def _num(value: Decimal) -> str:
    """Marks a number to be written as a plain decimal (JS style), not 7.35e-06."""
    return f"@num:{format(value.normalize(), 'f')}@"


def _dumps(value: Any, *, compact: bool = True, indent: int | None = None) -> str:
    separators = (",", ":") if compact and indent is None else None
    text = json.dumps(value, separators=separators, indent=indent, ensure_ascii=False)
    return _NUMBER.sub(r"\1", text)


def _json_response(text: str, headers: dict[str, str], *, status: int = 200) -> web.Response:
    headers = {"Content-Type": "application/json", **headers}
    return web.Response(status=status, body=text.encode(), headers=headers)


def _split_words(text: str, chunks: int | None) -> list[str]:
    if not text:
        return []
    if chunks is None:
        return re.findall(r"\s*\S+\s*$|\s*\S+", text)
    size = max(1, -(-len(text) // max(1, chunks)))
    return [text[i : i + size] for i in range(0, len(text), size)]


def _split_json(text: str) -> list[str]:
    return re.findall(r"\w+|\s+\w+|[^\w\s]+|\s+", text)


def _request_text(body: Any) -> int:
    """Characters of the request's message text (content, text, system, tool results) and
    of its tool definitions (their JSON)."""
    total = 0

    def walk(value: Any, key: str | None) -> None:
        nonlocal total
        if isinstance(value, str):
            if key in ("content", "text", "system"):
                total += len(value)
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(v, k)
        elif isinstance(value, list):
            for item in value:
                walk(item, key)

    if isinstance(body, dict):
        walk({"system": body.get("system"), "messages": body.get("messages")}, None)
        total += sum(tool_chars(tool) for tool in body.get("tools") or ())
    return total


# --- the server ------------------------------------------------------------------------


class FakeVendor:
    """A scripted vendor server; see the module docstring."""

    def __init__(self, *, seed: int = 0) -> None:
        self.url = ""
        self.default: Reply | None = None
        # Chooses a reply from the request when the script is empty (many sessions at once).
        self.responder: Callable[[Any], Reply] | None = None
        self.requests: list[Recorded] = []
        # Requests being answered now (arrived, response not yet ended), and the most ever.
        self.in_flight = 0
        self.max_in_flight = 0
        self.durations: list[float] = []  # seconds each answered request took, in end order
        self._script: deque[Reply] = deque()
        self._arrived = asyncio.Event()
        self._rng = random.Random(seed)
        self._runner: web.AppRunner | None = None
        self.caches = PromptCaches()

    async def start(self) -> None:
        app = web.Application()
        for path in (OPENAI_PATH, OPENROUTER_PATH, ANTHROPIC_PATH):
            app.router.add_post(path, self._handle)
        # handler_cancellation: a client that hangs up mid-stream cancels its handler.
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeVendor:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def openai_base(self) -> str:
        return self.url + "/v1"

    def openrouter_base(self) -> str:
        return self.url + "/api/v1"

    def anthropic_base(self) -> str:
        return self.url

    def push(self, *replies: Reply) -> None:
        """Queues replies; each request, on any route, takes the oldest."""
        self._script.extend(replies)

    async def wait_for_requests(self, n: int, timeout: float = 10) -> None:
        """Returns once at least `n` requests have arrived; TimeoutError after `timeout`."""
        async with asyncio.timeout(timeout):
            while len(self.requests) < n:
                self._arrived.clear()
                await self._arrived.wait()

    # --- handling ----------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        began = time.monotonic()
        try:
            return await self._answer_request(request)
        finally:
            self.in_flight -= 1
            self.durations.append(time.monotonic() - began)

    async def _answer_request(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        headers = {name.lower(): value for name, value in request.headers.items()}
        assert request.transport is not None
        host, port = request.transport.get_extra_info("peername")[:2]
        peer = f"{host}:{port}"
        self.requests.append(Recorded(request.path, headers, body, time.time(), peer, raw))
        self._arrived.set()
        vendor = _VENDORS[request.path](self._rng, body if isinstance(body, dict) else {})
        use = self._cache_use(request.path, body)
        if isinstance(use, TooManyBreakpoints):
            return vendor.refuse(use)
        if self._script:
            reply = self._script.popleft()
        elif self.responder is not None:
            reply = self.responder(body)
        else:
            reply = self.default
        if reply is None:
            return web.json_response(
                {"error": {"message": "FakeVendor: the script ran out of replies."}},
                status=500,
            )
        if isinstance(reply, Raw):
            return web.Response(
                status=reply.status, body=reply.body, headers={"Content-Type": reply.content_type}
            )
        if isinstance(reply, HttpError):
            return vendor.error(reply)
        answer = self._answer(vendor, reply, body, use)
        delay = reply.chunk_delay if isinstance(reply, Text | ToolCalls) else 0.0
        if not vendor.streaming:
            if delay:
                await asyncio.sleep(delay)  # a slow vendor, not a test's synchronisation
            return vendor.whole(answer)
        rendered = vendor.stream(answer)
        frames, cut = rendered.frames, False
        if isinstance(reply, CutStream | InStreamError):
            frames = _first_chunks(frames, reply.after_chunks, rendered.finish_at)
            if isinstance(reply, InStreamError):
                frames.append(vendor.stream_error())
            cut = isinstance(reply, CutStream) and reply.abort
        end_delay = reply.end_delay if isinstance(reply, Text) else 0.0
        return await self._send_stream(
            request, vendor.stream_headers(), frames, delay, cut, end_delay
        )

    def _cache_use(self, path: str, body: Any) -> CacheUse | TooManyBreakpoints:
        """What the route's vendor reads from and writes to its prompt cache."""
        if not isinstance(body, dict):
            return CacheUse()
        if path == ANTHROPIC_PATH:
            return self.caches.anthropic(body, chat=False)
        if path == OPENROUTER_PATH and str(body.get("model", "")).startswith("anthropic/"):
            return self.caches.anthropic(body, chat=True)
        return self.caches.openai(body)

    def _answer(self, vendor: _Vendor, reply: Reply, body: Any, use: CacheUse) -> _Answer:
        uncached = _request_text(body) // 4 + 1 - use.read - use.write
        model = body.get("model", "") if isinstance(body, dict) else ""
        if isinstance(reply, ToolCalls):
            ids = reply.ids or [vendor.call_id() for _ in reply.calls]
            calls = [
                _Call(call_id, name, json.dumps(args, ensure_ascii=False))
                for call_id, (name, args) in zip(ids, reply.calls, strict=True)
            ]
            text = reply.text or ""
            output = len(text.split()) + sum(len(c.arguments) // 4 + 1 for c in calls)
            return _Answer(
                model=model,
                text_pieces=_split_words(text, None),
                reasoning_pieces=[],
                calls=calls,
                finish="tool_calls",
                uncached=uncached,
                cache_read=use.read,
                cache_write=use.write,
                output=output,
            )
        if isinstance(reply, Text):
            text, chunks, reasoning = reply.text, reply.chunks, reply.reasoning or ""
            cache_read, cache_write, finish, cost = (
                use.read + reply.cache_read,
                use.write + reply.cache_write,
                reply.finish,
                reply.cost,
            )
        else:  # CutStream / InStreamError: a text answer that will not finish
            text, chunks, reasoning = reply.text, None, ""
            cache_read, cache_write, finish, cost = use.read, use.write, "stop", None
        return _Answer(
            model=model,
            text_pieces=_split_words(text, chunks),
            reasoning_pieces=_split_words(reasoning, None),
            calls=[],
            finish=finish,
            uncached=uncached,
            cache_read=cache_read,
            cache_write=cache_write,
            output=max(1, len(text.split()) + len(reasoning.split())),
            cost=cost,
        )

    @property
    def connections(self) -> int:
        """How many connections the recorded requests came over."""
        return len({r.peer for r in self.requests})

    def sending(self, frame: bytes) -> None:
        """Called as each stream frame goes out; a benchmark overrides it to time tokens."""

    async def _send_stream(
        self,
        request: web.Request,
        headers: dict[str, str],
        frames: list[bytes],
        delay: float,
        cut: bool,
        end_delay: float = 0.0,
    ) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers=headers)
        await response.prepare(request)
        try:
            for frame in frames:
                if delay:
                    await asyncio.sleep(delay)  # a slow vendor, not a test's synchronisation
                self.sending(frame)
                await response.write(frame)
            if cut:
                # Close mid-body: the chunked encoding never gets its last chunk.
                assert request.transport is not None
                request.transport.close()
                return response
            if end_delay:
                await asyncio.sleep(end_delay)  # a slow network, not a test's synchronisation
            await response.write_eof()
        except ConnectionResetError:
            pass  # the client hung up; nothing to finish
        return response


def _first_chunks(frames: list[bytes], n: int, finish_at: int) -> list[bytes]:
    """The first `n` data frames (comments ride along), never reaching the finish."""
    out: list[bytes] = []
    taken = 0
    for index, frame in enumerate(frames):
        if index >= finish_at or (taken >= n and not frame.startswith(b":")):
            break
        out.append(frame)
        if not frame.startswith(b":"):
            taken += 1
    return out


# --- vendors ---------------------------------------------------------------------------


class _Vendor:
    """How one route renders answers and errors."""

    name = ""

    def __init__(self, rng: random.Random, body: dict[str, Any]) -> None:
        self.rng = rng
        self.body = body
        self.streaming = bool(body.get("stream"))
        self.created = int(time.time())

    def rand(self, n: int, alphabet: str = string.ascii_letters + string.digits) -> str:
        return "".join(self.rng.choice(alphabet) for _ in range(n))

    def call_id(self) -> str:
        raise NotImplementedError

    def whole(self, answer: _Answer) -> web.Response:
        raise NotImplementedError

    def stream(self, answer: _Answer) -> _Frames:
        raise NotImplementedError

    def stream_headers(self) -> dict[str, str]:
        raise NotImplementedError

    def stream_error(self) -> bytes:
        raise NotImplementedError

    def error(self, reply: HttpError) -> web.Response:
        headers = {}
        if reply.retry_after is not None:
            seconds = reply.retry_after
            headers["retry-after"] = str(int(seconds)) if seconds == int(seconds) else str(seconds)
        body = reply.body if reply.body is not None else self.error_body(reply.status)
        return _json_response(_dumps(body), headers, status=reply.status)

    def error_body(self, status: int) -> dict[str, Any]:
        raise NotImplementedError

    def refuse(self, refusal: TooManyBreakpoints) -> web.Response:
        """The 400 for too many cache breakpoints (Anthropic's own error)."""
        raise NotImplementedError


_OPENAI_ERRORS: dict[int, tuple[str, str, str | None]] = {
    400: ("Invalid request.", "invalid_request_error", None),
    401: ("Incorrect API key provided.", "invalid_request_error", "invalid_api_key"),
    403: ("You are not allowed to use this model.", "invalid_request_error", None),
    404: ("The model does not exist.", "invalid_request_error", "model_not_found"),
    429: (
        "Rate limit reached for requests per min (RPM): Limit 3, Used 3, Requested 1.",
        "requests",
        "rate_limit_exceeded",
    ),
    500: (
        "The server had an error while processing your request. Sorry about that!",
        "server_error",
        None,
    ),
    503: ("The engine is currently overloaded, please try again later.", "server_error", None),
}


class _OpenAI(_Vendor):
    name = "openai"

    def __init__(self, rng: random.Random, body: dict[str, Any]) -> None:
        super().__init__(rng, body)
        self.id = "chatcmpl-" + self.rand(29)
        options = body.get("stream_options") or {}
        self.include_usage = bool(options.get("include_usage"))
        self.obfuscation = options.get("include_obfuscation", True) is not False

    def call_id(self) -> str:
        return "call_" + self.rand(24)

    def usage(self, answer: _Answer) -> dict[str, Any]:
        prompt = answer.uncached + answer.cache_read
        return {
            "prompt_tokens": prompt,
            "completion_tokens": answer.output,
            "total_tokens": prompt + answer.output,
            "prompt_tokens_details": {"cached_tokens": answer.cache_read, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": 0,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        }

    def message(self, answer: _Answer) -> dict[str, Any]:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": answer.text or None,
            "refusal": None,
            "annotations": [],
        }
        if answer.calls:
            message["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in answer.calls
            ]
        return message

    def whole(self, answer: _Answer) -> web.Response:
        body = {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": answer.model,
            "choices": [
                {
                    "index": 0,
                    "message": self.message(answer),
                    "logprobs": None,
                    "finish_reason": _OPENAI_FINISH[answer.finish],
                }
            ],
            "usage": self.usage(answer),
            "service_tier": "default",
            "system_fingerprint": None,
        }
        # The live API pretty-prints its JSON bodies.
        return _json_response(_dumps(body, indent=2), {"x-request-id": "req_" + self.rand(32)})

    def chunk(self, answer: _Answer, choices: list[Any], usage: Any = None) -> bytes:
        chunk: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": answer.model,
            "service_tier": "default",
            "system_fingerprint": None,
            "choices": choices,
        }
        if self.include_usage:
            chunk["usage"] = usage
        if self.obfuscation:
            chunk["obfuscation"] = self.rand(self.rng.randint(0, 8))
        return b"data: " + _dumps(chunk).encode() + b"\n\n"

    def choice(self, delta: dict[str, Any], finish: str | None = None) -> list[Any]:
        return [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]

    def deltas(self, answer: _Answer) -> Iterator[dict[str, Any]]:
        """The deltas of an answer, first to last, before the finish."""
        calls = list(enumerate(answer.calls))
        role: dict[str, Any] = {"role": "assistant", "content": "" if answer.text else None}
        if not answer.text and calls:
            role["tool_calls"] = [self.call_start(*calls[0])]
        role["refusal"] = None
        yield role
        for piece in answer.text_pieces:
            yield {"content": piece}
        for position, (index, call) in enumerate(calls):
            if position or answer.text:
                yield {"tool_calls": [self.call_start(index, call)]}
            for piece in _split_json(call.arguments):
                yield {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}

    def call_start(self, index: int, call: _Call) -> dict[str, Any]:
        return {
            "index": index,
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }

    def stream(self, answer: _Answer) -> _Frames:
        frames = [self.chunk(answer, self.choice(delta)) for delta in self.deltas(answer)]
        finish_at = len(frames)
        frames.append(self.chunk(answer, self.choice({}, _OPENAI_FINISH[answer.finish])))
        if self.include_usage:
            frames.append(self.chunk(answer, [], self.usage(answer)))
        frames.append(b"data: [DONE]\n\n")
        return _Frames(frames, finish_at)

    def stream_headers(self) -> dict[str, str]:
        return {
            "Content-Type": "text/event-stream; charset=utf-8",
            "x-request-id": "req_" + self.rand(32),
        }

    def stream_error(self) -> bytes:
        message, kind, code = _OPENAI_ERRORS[500]
        error = {"message": message, "type": kind, "param": None, "code": code}
        return b"data: " + _dumps({"error": error}).encode() + b"\n\n"

    def error_body(self, status: int) -> dict[str, Any]:
        message, kind, code = _OPENAI_ERRORS.get(status, _OPENAI_ERRORS[500])
        return {"error": {"message": message, "type": kind, "param": None, "code": code}}


@dataclass(frozen=True)
class _Price:
    input: Decimal  # USD per token
    output: Decimal


# What OpenRouter bills per token for the models the tests and benches use (its model
# pages: anthropic/claude-sonnet-4.5 $3 / $15 per million); any other model the fake's
# flat $0.10 / $0.40 per million.
_OPENROUTER_PRICES = {
    "anthropic/claude-sonnet-4-5": _Price(Decimal("0.000003"), Decimal("0.000015")),
    "anthropic/claude-haiku-4-5": _Price(Decimal("0.000001"), Decimal("0.000005")),
}
_OPENROUTER_DEFAULT = _Price(Decimal("0.0000001"), Decimal("0.0000004"))
# Cache reads and writes as multiples of the input price (OpenRouter's prompt-caching
# page): Anthropic reads 0.1x and writes 1.25x; OpenAI's writes cost nothing more and its
# reads are discounted (0.5x on that page's table; the exact rate is per model).
_CACHE_RATES = {"anthropic": (Decimal("0.1"), Decimal("1.25")), "": (Decimal("0.5"), Decimal(1))}


class _OpenRouter(_OpenAI):
    """OpenAI's format plus OpenRouter's additions (notes §3.3)."""

    name = "openrouter"

    def __init__(self, rng: random.Random, body: dict[str, Any]) -> None:
        super().__init__(rng, body)
        self.id = f"gen-{self.created}-{self.rand(20)}"
        self.include_usage = True  # OpenRouter always sends usage
        self.obfuscation = False

    def usage(self, answer: _Answer) -> dict[str, Any]:
        prompt = answer.uncached + answer.cache_read + answer.cache_write
        price = _OPENROUTER_PRICES.get(answer.model.replace(".", "-"), _OPENROUTER_DEFAULT)
        read, write = _CACHE_RATES["anthropic" if answer.model.startswith("anthropic/") else ""]
        prompt_cost = price.input * (
            answer.uncached + answer.cache_read * read + answer.cache_write * write
        )
        completion_cost = Decimal(answer.output) * price.output
        cost = Decimal(answer.cost) if answer.cost is not None else prompt_cost + completion_cost
        return {
            "prompt_tokens": prompt,
            "completion_tokens": answer.output,
            "total_tokens": prompt + answer.output,
            "cost": _num(cost),
            "is_byok": False,
            "prompt_tokens_details": {
                "cached_tokens": answer.cache_read,
                "cache_write_tokens": answer.cache_write,
                "audio_tokens": 0,
                "video_tokens": 0,
            },
            "cost_details": {
                "upstream_inference_cost": None,
                "upstream_inference_prompt_cost": _num(prompt_cost),
                "upstream_inference_completions_cost": _num(completion_cost),
            },
            "completion_tokens_details": {
                "reasoning_tokens": len(answer.reasoning.split()),
                "image_tokens": 0,
                "audio_tokens": 0,
            },
        }

    def whole(self, answer: _Answer) -> web.Response:
        message = self.message(answer)
        del message["annotations"]
        message["reasoning"] = answer.reasoning or None
        finish = _OPENAI_FINISH[answer.finish]
        body = {
            "id": self.id,
            "provider": "OpenAI",
            "model": answer.model,
            "object": "chat.completion",
            "created": self.created,
            "choices": [
                {
                    "logprobs": None,
                    "finish_reason": finish,
                    "native_finish_reason": finish,
                    "index": 0,
                    "message": message,
                }
            ],
            "usage": self.usage(answer),
        }
        return _json_response(_dumps(body), {})

    def chunk(self, answer: _Answer, choices: list[Any], usage: Any = None) -> bytes:
        chunk: dict[str, Any] = {
            "id": self.id,
            "provider": "OpenAI",
            "model": answer.model,
            "object": "chat.completion.chunk",
            "created": self.created,
            "choices": choices,
        }
        if usage is not None:
            chunk["usage"] = usage
        return b"data: " + _dumps(chunk).encode() + b"\n\n"

    def choice(self, delta: dict[str, Any], finish: str | None = None) -> list[Any]:
        return [
            {
                "index": 0,
                "delta": delta,
                "finish_reason": finish,
                "native_finish_reason": finish,
                "logprobs": None,
            }
        ]

    def deltas(self, answer: _Answer) -> Iterator[dict[str, Any]]:
        for piece in answer.reasoning_pieces:
            yield {"role": "assistant", "content": "", "reasoning": piece}
        for piece in answer.text_pieces:
            yield {"role": "assistant", "content": piece}
        for index, call in enumerate(answer.calls):
            start = {
                "role": "assistant",
                "content": None,
                "tool_calls": [self.call_start(index, call)],
            }
            yield start
            for piece in _split_json(call.arguments):
                yield {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}

    def stream(self, answer: _Answer) -> _Frames:
        rendered = super().stream(answer)
        comment = b": OPENROUTER PROCESSING\n\n"
        return _Frames([comment, *rendered.frames], rendered.finish_at + 1)

    def stream_headers(self) -> dict[str, str]:
        return {"Content-Type": "text/event-stream", "X-Generation-Id": self.id}

    def stream_error(self) -> bytes:
        chunk = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.body.get("model", ""),
            "provider": "OpenAI",
            "error": {"code": "server_error", "message": "Provider disconnected unexpectedly"},
            "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "error"}],
        }
        return b"data: " + _dumps(chunk).encode() + b"\n\n"

    def error_body(self, status: int) -> dict[str, Any]:
        message = {
            400: "Invalid request",
            401: "No auth credentials found",
            402: "Insufficient credits",
            403: "Input was flagged by moderation",
            408: "Request timed out",
            429: "Rate limit exceeded",
            502: "Provider returned error",
            503: "No available provider meets your routing requirements",
        }.get(status, "Internal Server Error")
        return {"error": {"code": status, "message": message, "metadata": {}}}

    def refuse(self, refusal: TooManyBreakpoints) -> web.Response:
        """OpenRouter relays the provider's 400 with its raw body in `metadata.raw`."""
        raw = {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": refusal.message},
        }
        metadata = {"raw": _dumps(raw), "provider_name": "Anthropic"}
        body = {"error": {"code": 400, "message": "Provider returned error", "metadata": metadata}}
        return _json_response(_dumps(body), {}, status=400)


_ANTHROPIC_ERRORS: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "Invalid request."),
    401: ("authentication_error", "invalid x-api-key"),
    402: ("billing_error", "Your credit balance is too low."),
    403: (
        "permission_error",
        "Your API key does not have permission to use the specified resource.",
    ),
    404: ("not_found_error", "The requested resource could not be found."),
    409: ("conflict_error", "Conflict."),
    413: ("request_too_large", "Request exceeds the maximum allowed number of bytes."),
    429: ("rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit."),
    500: ("api_error", "Internal server error"),
    504: ("timeout_error", "Request timed out"),
    529: ("overloaded_error", "Overloaded"),
}


class _Anthropic(_Vendor):
    name = "anthropic"

    def __init__(self, rng: random.Random, body: dict[str, Any]) -> None:
        super().__init__(rng, body)
        self.id = "msg_01" + self.rand(22)

    def call_id(self) -> str:
        return "toolu_01" + self.rand(22)

    def signature(self) -> str:
        return "EqQB" + self.rand(60, string.ascii_letters + string.digits + "+/") + "=="

    def usage(self, answer: _Answer, output: int, *, where: str) -> dict[str, Any]:
        """Usage as message_start, message_delta (cumulative) or a whole body carries it."""
        usage: dict[str, Any] = {
            "input_tokens": answer.uncached,
            "cache_creation_input_tokens": answer.cache_write,
            "cache_read_input_tokens": answer.cache_read,
        }
        if where == "body":
            usage["cache_creation"] = {
                "ephemeral_5m_input_tokens": answer.cache_write,
                "ephemeral_1h_input_tokens": 0,
            }
        usage["output_tokens"] = output
        if where != "delta":
            usage["service_tier"] = "standard"
        return usage

    def blocks(self, answer: _Answer) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = []
        if answer.reasoning:
            blocks.append(
                {"type": "thinking", "thinking": answer.reasoning, "signature": self.signature()}
            )
        if answer.text:
            blocks.append({"type": "text", "text": answer.text})
        for call in answer.calls:
            blocks.append(
                {
                    "type": "tool_use",
                    "id": call.id,
                    "name": call.name,
                    "input": json.loads(call.arguments),
                }
            )
        return blocks

    def whole(self, answer: _Answer) -> web.Response:
        body = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": answer.model,
            "content": self.blocks(answer),
            "stop_reason": _ANTHROPIC_FINISH[answer.finish],
            "stop_sequence": None,
            "usage": self.usage(answer, answer.output, where="body"),
        }
        return _json_response(_dumps(body), {"request-id": "req_01" + self.rand(22)})

    @staticmethod
    def event(data: dict[str, Any], *, compact: bool = True) -> bytes:
        return f"event: {data['type']}\ndata: {_dumps(data, compact=compact)}\n\n".encode()

    def stream(self, answer: _Answer) -> _Frames:
        e = self.event
        frames = [
            e(
                {
                    "type": "message_start",
                    "message": {
                        "id": self.id,
                        "type": "message",
                        "role": "assistant",
                        "model": answer.model,
                        "content": [],
                        "stop_reason": None,
                        "stop_sequence": None,
                        "usage": self.usage(answer, 1, where="start"),
                    },
                }
            )
        ]
        index = 0

        def block(start: dict[str, Any], deltas: list[dict[str, Any]]) -> None:
            nonlocal index
            frames.append(
                e({"type": "content_block_start", "index": index, "content_block": start})
            )
            if index == 0:
                frames.append(self.event({"type": "ping"}, compact=False))
            for delta in deltas:
                frames.append(e({"type": "content_block_delta", "index": index, "delta": delta}))
            frames.append(e({"type": "content_block_stop", "index": index}))
            index += 1

        if answer.reasoning:
            thinking = [{"type": "thinking_delta", "thinking": p} for p in answer.reasoning_pieces]
            thinking.append({"type": "signature_delta", "signature": self.signature()})
            block({"type": "thinking", "thinking": "", "signature": ""}, thinking)
        if answer.text:
            block(
                {"type": "text", "text": ""},
                [{"type": "text_delta", "text": p} for p in answer.text_pieces],
            )
        for call in answer.calls:
            pieces = ["", *_split_json(call.arguments)]
            block(
                {
                    "type": "tool_use",
                    "id": call.id,
                    "name": call.name,
                    "caller": {"type": "direct"},
                    "input": {},
                },
                [{"type": "input_json_delta", "partial_json": p} for p in pieces],
            )
        finish_at = len(frames)
        frames.append(
            e(
                {
                    "type": "message_delta",
                    "delta": {
                        "stop_reason": _ANTHROPIC_FINISH[answer.finish],
                        "stop_sequence": None,
                    },
                    "usage": self.usage(answer, answer.output, where="delta"),
                }
            )
        )
        frames.append(e({"type": "message_stop"}))
        return _Frames(frames, finish_at)

    def stream_headers(self) -> dict[str, str]:
        return {
            "Content-Type": "text/event-stream; charset=utf-8",
            "request-id": "req_01" + self.rand(22),
        }

    def stream_error(self) -> bytes:
        error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
        return self.event(error, compact=False)

    def error_body(self, status: int) -> dict[str, Any]:
        kind, message = _ANTHROPIC_ERRORS.get(status, _ANTHROPIC_ERRORS[500])
        return {
            "type": "error",
            "error": {"type": kind, "message": message},
            "request_id": "req_01" + self.rand(22),
        }

    def refuse(self, refusal: TooManyBreakpoints) -> web.Response:
        """Anthropic's 400 for a fifth cache_control block."""
        body = {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": refusal.message},
            "request_id": "req_01" + self.rand(22),
        }
        return _json_response(_dumps(body), {"request-id": "req_01" + self.rand(22)}, status=400)


_VENDORS: dict[str, type[_Vendor]] = {
    OPENAI_PATH: _OpenAI,
    OPENROUTER_PATH: _OpenRouter,
    ANTHROPIC_PATH: _Anthropic,
}
