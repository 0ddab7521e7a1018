"""A real test worker: an aiohttp server on 127.0.0.1 that answers decision requests.

It checks what the engine sends the way a strict third-party worker would: every
request body against `#/properties/decision_request` of the in-repo schema, the
delivery headers of SPEC §3, and the signature (recomputed here, independently of
engine code). Everything it answers, except what a test marks as garbage, is checked
against `#/properties/decision_response`, so a test cannot pass on an answer that a
real worker could never send.

Use the `test_worker` fixture (import it into a conftest or a test module); it stops
every worker it made and asserts that none recorded a schema error.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from jsonschema import Draft202012Validator
from referencing import Registry
from referencing.jsonschema import DRAFT202012

SCHEMA_PATH = Path(__file__).parents[1] / "spec" / "protocol.schema.json"
_SCHEMA_URI = "urn:subs:protocol"
_REGISTRY = Registry().with_resource(
    _SCHEMA_URI, DRAFT202012.create_resource(json.loads(SCHEMA_PATH.read_text()))
)
_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")


def _validator(entry: str) -> Draft202012Validator:
    return Draft202012Validator(
        {"$ref": f"{_SCHEMA_URI}#/properties/{entry}"},
        registry=_REGISTRY,
        format_checker=Draft202012Validator.FORMAT_CHECKER,
    )


REQUEST_SCHEMA = _validator("decision_request")
RESPONSE_SCHEMA = _validator("decision_response")


def schema_errors(validator: Draft202012Validator, instance: Any) -> list[str]:
    """Each violation as `<json path>: <message>`."""
    return [f"{e.json_path}: {e.message}" for e in validator.iter_errors(instance)]


@dataclass
class Json:
    """A JSON answer; `invalid=True` marks one the test means to be wrong."""

    value: Any
    invalid: bool = False


@dataclass
class Stream:
    """A `text/event-stream` answer.

    Each frame is `(event, data)`: a `str` data is sent as it is (split into one
    `data:` line per line), anything else as JSON. `space` puts a space after
    `data:`; `newline` ends lines. `hang=True` keeps the stream open after the last
    frame until the client goes away or the worker stops. `end_delay` is slept
    between the last frame and the body's end: a worker slow to close its stream.
    """

    frames: list[tuple[str, Any]]
    invalid: bool = False
    space: bool = True
    newline: str = "\n"
    hang: bool = False
    end_delay: float = 0.0


@dataclass
class Reply:
    """Raw bytes with a status, for garbage; `chunked=True` sends no Content-Length."""

    status: int
    body: bytes
    content_type: str = "application/json"
    chunked: bool = False


class Hang:
    """Never answer: the handler waits until the client goes away or the worker stops."""


Decide = Callable[[dict[str, Any]], Awaitable[Any]]


async def echo_proposed(request: dict[str, Any]) -> Any:
    """Accept whatever the engine proposes, as most real workers do for most triggers."""
    return request["proposed"]


class TestWorker:
    """A worker on a real socket; `decide(request)` returns what it answers.

    `decide` may return a dict/None (sent as JSON), `Json`, `Stream`, `Reply` or
    `Hang()`; by default it echoes `proposed`. `raw_bodies` and `headers` record
    every request received, `peers` the client address and port each came from (one
    per connection), `requests` the decoded ones that passed the signature
    check and reached `decide`. `schema_errors` collects what was wrong with a
    request (body against the schema, delivery headers), `response_schema_errors`
    what was wrong with an answer not marked invalid.
    """

    __test__ = False  # a helper, not a pytest test class

    def __init__(self, decide: Decide | None = None, *, secret: str | None = None) -> None:
        self.decide = decide or echo_proposed
        self.secret = secret
        self.url = ""
        self.requests: list[dict[str, Any]] = []
        self.raw_bodies: list[bytes] = []
        self.headers: list[dict[str, str]] = []
        self.peers: list[str] = []
        self.schema_errors: list[str] = []
        self.response_schema_errors: list[str] = []
        self._arrived = asyncio.Condition()
        self._stopping = asyncio.Event()
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/", self._handle)
        # handler_cancellation: a hung handler ends when the client gives up.
        self._runner = web.AppRunner(
            app, handler_cancellation=True, shutdown_timeout=1.0, access_log=None
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/"

    async def stop(self) -> None:
        self._stopping.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> TestWorker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def wait_for(self, n_requests: int, timeout: float = 10) -> None:
        """Wait until at least `n_requests` requests have arrived (signed or not)."""
        async with self._arrived:
            await asyncio.wait_for(
                self._arrived.wait_for(lambda: len(self.raw_bodies) >= n_requests), timeout
            )

    # --- one request -----------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        async with self._arrived:
            self.raw_bodies.append(raw)
            self.headers.append(dict(request.headers))
            self.peers.append(_peer(request))
            self._arrived.notify_all()
        self._check_headers(request)
        try:
            body = json.loads(raw)
        except ValueError as exc:
            self.schema_errors.append(f"request body is not JSON: {exc}")
            return web.Response(status=400, text="not JSON")
        self.schema_errors.extend(schema_errors(REQUEST_SCHEMA, body))
        if self.secret is not None and not self._signed(raw, request):
            return web.Response(
                status=401, text="bad or missing X-Substructure-Signature or X-Subs-Signature"
            )
        self.requests.append(body)
        answer = await self.decide(body)
        if isinstance(answer, Hang):
            await self._stopping.wait()
            return web.Response(status=503, text="worker stopped")
        if isinstance(answer, Reply):
            return await self._reply(request, answer)
        if isinstance(answer, Stream):
            return await self._stream(request, answer)
        if not isinstance(answer, Json):
            answer = Json(answer)
        if answer.value is not None and not answer.invalid:
            self._check_response(answer.value)
        return web.json_response(answer.value)

    def _check_headers(self, request: web.Request) -> None:
        content_type = request.headers.get("Content-Type")
        if content_type != "application/json":
            self.schema_errors.append(f"header Content-Type is {content_type!r}")
        accept = request.headers.get("Accept", "")
        if "text/event-stream" not in accept or "application/json" not in accept:
            self.schema_errors.append(f"header Accept is {accept!r}")
        trace = _TRACEPARENT.fullmatch(request.headers.get("traceparent", ""))
        if trace is None or set(trace[1]) == {"0"} or set(trace[2]) == {"0"}:
            self.schema_errors.append(
                f"header traceparent is {request.headers.get('traceparent')!r}"
            )

    def _signed(self, raw: bytes, request: web.Request) -> bool:
        """Both signatures: the original engine's, and `X-Subs-Signature` (timestamped,
        within 5 minutes of this clock); a request missing either is refused."""
        assert self.secret is not None
        key = self.secret.encode()
        expected = "sha256=" + hmac.new(key, raw, hashlib.sha256).hexdigest()
        given = request.headers.get("X-Substructure-Signature", "")
        if not hmac.compare_digest(expected.encode(), given.encode("utf-8", "replace")):
            return False
        stamped = re.fullmatch(
            r"t=(\d+),v1=([0-9a-f]{64})", request.headers.get("X-Subs-Signature", "")
        )
        if stamped is None or abs(time.time() - int(stamped[1])) > 300:
            return False
        mac = hmac.new(key, stamped[1].encode() + b"." + raw, hashlib.sha256).hexdigest()
        return hmac.compare_digest(mac, stamped[2])

    def _check_response(self, value: Any) -> None:
        self.response_schema_errors.extend(schema_errors(RESPONSE_SCHEMA, value))

    def _check_result(self, data: Any) -> None:
        if isinstance(data, str):
            try:
                data = json.loads(data)
            except ValueError:
                self.response_schema_errors.append(f"decision.result is not JSON: {data[:80]!r}")
                return
        if data is not None:
            self._check_response(data)

    async def _reply(self, request: web.Request, reply: Reply) -> web.StreamResponse:
        if not reply.chunked:
            return web.Response(
                status=reply.status, body=reply.body, content_type=reply.content_type
            )
        response = web.StreamResponse(status=reply.status)
        response.content_type = reply.content_type
        response.enable_chunked_encoding()
        await response.prepare(request)
        step = 64 * 1024
        try:
            for start in range(0, len(reply.body), step):
                await response.write(reply.body[start : start + step])
            await response.write_eof()
        except ConnectionResetError:
            pass  # the client refused to read on
        return response

    async def _stream(self, request: web.Request, stream: Stream) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        prefix = "data: " if stream.space else "data:"
        try:
            for event, data in stream.frames:
                if event == "decision.result" and not stream.invalid:
                    self._check_result(data)
                text = data if isinstance(data, str) else json.dumps(data)
                lines = [f"event: {event}"] + [prefix + line for line in text.split("\n")]
                frame = "".join(line + stream.newline for line in lines) + stream.newline
                await response.write(frame.encode())
            if stream.hang:
                await self._stopping.wait()
            if stream.end_delay:
                await asyncio.sleep(stream.end_delay)  # a slow worker, not synchronisation
            await response.write_eof()
        except ConnectionResetError:
            pass  # the client stopped reading, as it may after decision.result
        return response


def _peer(request: web.Request) -> str:
    """The client's end of the connection: a new one has a new port."""
    assert request.transport is not None
    host, port = request.transport.get_extra_info("peername")[:2]
    return f"{host}:{port}"


WorkerFactory = Callable[..., Awaitable[TestWorker]]


@pytest.fixture
async def test_worker() -> AsyncIterator[WorkerFactory]:
    """`await test_worker(decide=None, *, secret=None)` starts a TestWorker.

    At teardown every worker is stopped, then the test fails if any of them saw a
    request that breaks the schema or answered with an unmarked invalid response.
    """
    started: list[TestWorker] = []

    async def start(decide: Decide | None = None, *, secret: str | None = None) -> TestWorker:
        worker = TestWorker(decide, secret=secret)
        await worker.start()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        await worker.stop()
    for worker in started:
        assert worker.schema_errors == [], f"{worker.url} received: {worker.schema_errors}"
        assert worker.response_schema_errors == [], (
            f"{worker.url} answered: {worker.response_schema_errors}"
        )
