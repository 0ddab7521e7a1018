"""The HTTP API (SPEC §13): a thin aiohttp shell over the Redis-level `Client`.

Handlers validate at the edge, call `Client`/`Store`, and map refusals to
`{"error", "code"}` bodies. The event stream is one SSE writer per connection:
it writes the session's catch-up read from the log, then the live frames that
the process's shared readers (`fanout.Hub`) hand it. A client that cannot keep
up is sent `stream.overflow` and dropped, so it costs nobody else; each key may
hold only so many streams at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import ipaddress
import logging
import re
import socket
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..client import Client, validate_client_input
from ..errors import SubsError
from ..jsonedge import JsonEdgeError, compact_json, loads_checked
from ..machine import SessionState
from ..machine.events import CALL_ENDS, TURN_ENDS
from ..machine.tree import path_to
from ..metrics import Metrics
from ..protocol import InterruptPayload, WorkerIdentity
from ..snapshots import load, load_state
from ..store import STORE_FAULTS, Store
from .fanout import Hub, Watch, stream_pos

log = logging.getLogger("subs.api")

SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}
PING = b": ping\n\n"
MAX_SEQ = 2**63 - 1  # a seq is a Redis stream id's first half: a signed 64-bit integer here
HEALTH_TIMEOUT = 1.0  # /healthz waits this long for Redis's PONG
_DIGITS = re.compile(r"[0-9]{1,19}")  # int() also takes ' 7', '+7', '7_0', non-ASCII digits


# --- errors -------------------------------------------------------------------------------


class ApiError(SubsError):
    """A request the API refuses, with its HTTP status; the error middleware renders it."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        headers: Mapping[str, str] | None = None,
        param: str | None = None,
        **detail: Any,
    ) -> None:
        super().__init__(
            message, code=code, status=status, headers=headers, param=param, detail=detail
        )


def _error_response(err: SubsError) -> web.Response:
    """Every error answer of the API (and of the Slack route on the same app): `err.body()`."""
    headers = err.headers
    if err.status == 401:
        headers = {**headers, "WWW-Authenticate": "Bearer"}
    return web.json_response(err.body(), status=err.status, headers=headers, dumps=compact_json)


_HTTP_CODES = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 413: "too_large"}
_INTERNAL = ApiError(500, "internal", "internal error (logged by the API)")
_STORE_DOWN = ApiError(
    503,
    "store_unavailable",
    "the store (Redis) is not reachable; retry shortly",
    headers={"Retry-After": "1"},
)


def _http_error(err: web.HTTPException) -> ApiError:
    """aiohttp's own refusal in the API's shape, keeping the headers it must carry."""
    code = _HTTP_CODES.get(err.status, "http_error")
    kept = {k: v for k, v in err.headers.items() if k in ("Allow", "Retry-After")}
    return ApiError(err.status, code, err.reason, headers=kept)


def _excerpt(raw: str, limit: int = 40) -> str:
    """A client's value quoted back in an error, cut short: it may be anything."""
    return repr(raw[:limit]) + ("..." if len(raw) > limit else "")


# --- auth -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Principal:
    """Who is calling: `key_id` is None when the API runs open."""

    key_id: str | None
    full: bool

    def owns(self, identity: Mapping[str, Any] | None) -> bool:
        """Full access owns everything; a scoped key owns what its first input created."""
        if self.full:
            return True
        subject = (identity or {}).get("subject") or {}
        return subject.get("issuer") == "api" and subject.get("id") == self.key_id

    def identity(self) -> dict[str, Any]:
        """The identity a new session created by this caller records."""
        if self.key_id is None:
            return {"metadata": {}}
        return {"subject": {"issuer": "api", "id": self.key_id}, "metadata": {}}


@dataclass(frozen=True)
class ApiKey:
    digest: bytes = field(repr=False)  # sha256 of the key: compared instead, so lengths never leak
    key_id: str
    scoped: bool


class ApiKeysError(SubsError):
    """A bad `SUBS_API_KEYS` entry. The message names its position and the mistake, never
    the key: it is printed, and the key is a secret. Exits 2, as a bad flag does."""

    code = "invalid_config"
    exit_status = 2


@dataclass(frozen=True)
class ApiKeys:
    """The configured bearer keys. None configured means the API runs open."""

    keys: tuple[ApiKey, ...] = ()

    @classmethod
    def parse(cls, text: str) -> ApiKeys:
        """Comma-separated entries: `KEY` (full access) or `KEY:own` (own sessions only).

        Empty text configures no key. Otherwise every entry must be good: one that is not
        would otherwise leave the API with fewer keys than meant, or open.

        Raises:
            ApiKeysError: the first bad entry, by position (1-based).
        """
        if not text:
            return cls()
        return cls(tuple(_api_key(raw.strip(), n) for n, raw in enumerate(text.split(","), 1)))

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ApiKeys:
        return cls.parse(env.get("SUBS_API_KEYS", ""))

    @property
    def open(self) -> bool:
        return not self.keys

    def authenticate(self, authorization: str | None) -> Principal | None:
        """The caller a `Bearer` header names, or None. Every key is compared, always."""
        if self.open:
            return Principal(None, full=True)
        scheme, _, token = (authorization or "").partition(" ")
        digest = hashlib.sha256(token.strip().encode()).digest()
        found: ApiKey | None = None
        for key in self.keys:
            if hmac.compare_digest(digest, key.digest) and found is None:
                found = key
        if found is None or scheme.lower() != "bearer":
            return None
        return Principal(found.key_id, full=not found.scoped)


def _api_key(entry: str, position: int) -> ApiKey:
    where = f"SUBS_API_KEYS entry {position}"
    if not entry:
        raise ApiKeysError(f"{where}: empty (separate keys with single commas)")
    secret, sep, scope = entry.rpartition(":")
    if not sep:
        secret, scope = entry, ""
    elif scope != "own":
        # A word after ':' is a suffix typo; anything else may be part of the key: not shown.
        shown = f"':{scope}'" if scope.isalpha() and len(scope) <= 12 else "after ':'"
        raise ApiKeysError(f"{where}: unknown suffix {shown} (use KEY or KEY:own)")
    if not secret:
        raise ApiKeysError(f"{where}: empty key before ':own'")
    if any(c.isspace() for c in secret):
        raise ApiKeysError(f"{where}: whitespace inside the key")
    digest = hashlib.sha256(secret.encode()).digest()
    return ApiKey(digest, digest.hex()[:12], scoped=scope == "own")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, keys: ApiKeys) -> str | None:
    """Why the API must not listen on `host` (SPEC §13), or None when it may."""
    if keys.open and not _is_loopback(host):
        return (
            f"refusing to serve the API on {host} without keys: set SUBS_API_KEYS "
            "or bind to 127.0.0.1"
        )
    return None


def bind_warning(host: str, keys: ApiKeys) -> str | None:
    """The one line to print at start when the API runs open on loopback."""
    if keys.open and _is_loopback(host):
        return f"the API on {host} is open: no SUBS_API_KEYS set, any local process may call it"
    return None


# --- SSE framing ---------------------------------------------------------------------------


def sse_frame(kind: str, item: Mapping[str, Any]) -> bytes:
    """One SSE frame for what `Client.follow` yields, or a named control frame.

    A log event carries its seq as `id:` (the resume cursor); a token delta and a
    control frame (`stream.overflow`) carry none, because they cannot be resumed
    by seq. JSON never contains a raw newline, so `data:` is always one line.
    """
    if kind == "event":
        head = f"id: {item['seq']}\nevent: {item['payload']['type']}\n"
    elif kind == "delta":
        head = "event: llm.token.delta\n"
    else:
        head = f"event: {kind}\n"
    return f"{head}data: {compact_json(item)}\n\n".encode()


@dataclass(frozen=True)
class SseLimits:
    """What one event-stream connection may cost before it is dropped."""

    max_pending: int = 256  # live frames waiting for the socket; one more drops the client
    write_timeout: float = 10.0  # a write the socket does not take by then drops the client
    close_grace: float = 5.0  # how long the final overflow frame gets before the socket is cut
    send_buffer: int | None = 256 * 1024  # SO_SNDBUF per stream; None keeps the kernel's
    page: int = 500  # catch-up events per Redis read
    block_ms: int = 5000  # live tail: one blocking read's length


# --- session reads ------------------------------------------------------------------------


@dataclass
class _Cut:
    """A session's snapshot and token deltas read in one transaction: one instant."""

    seq: int
    state: SessionState
    deltas: list[dict[str, Any]]
    delta_cursor: str  # the delta stream's last id at the cut; "0-0" when empty


async def _read_cut(store: Store, sid: str) -> _Cut | None:
    """None when the session does not exist."""
    read = await store.read_cut(sid)
    if read is None:
        return None
    snap, deltas, cursor = read
    return _Cut(snap.seq, await load(store, sid, snap), deltas, cursor)


def _delta_key(delta: Mapping[str, Any]) -> tuple[Any, Any]:
    return delta.get("call_id"), delta.get("attempt")


def _ended_deltas(
    pending: dict[tuple[Any, Any], list[dict[str, Any]]], event: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """The deltas of the call attempt this event ends (a result without an attempt
    ends the latest one)."""
    payload = event["payload"]
    if payload["type"] not in CALL_ENDS:
        return []
    call_id, attempt = payload.get("id"), payload.get("attempt")
    if attempt is None:
        attempts = [a for c, a in pending if c == call_id]
        if not attempts:
            return []
        attempt = max(attempts, key=lambda a: a or 0)
    return pending.pop((call_id, attempt), [])


def _ends_turn(event: Mapping[str, Any], turn_id: str | None) -> bool:
    return (
        turn_id is not None
        and event.get("turn_id") == turn_id
        and event["payload"]["type"] in TURN_ENDS
    )


Sent = tuple[bytes, int | None]  # SSE frames, and the seq of the last event among them


async def _session_feed(
    store: Store,
    watch: Watch,
    cut: _Cut,
    after_seq: int,
    *,
    turn_id: str | None = None,
    page: int = 500,
    heartbeat: float = 15.0,
) -> AsyncGenerator[Sent, None]:
    """Events after `after_seq` and token deltas, in order, with no gap or repeat, a
    batch at a time; `PING` after `heartbeat` seconds without a live frame.

    Catch-up reads the log up to the cut; then come the watch's live frames past
    the cut (the watch joined before the cut was read, so it holds everything
    after it, and maybe some from before: those are dropped). Deltas: each call
    attempt that had not ended at `after_seq` gets its deltas replayed whole
    (clients dedupe by `call_id`, `attempt`, `seq`): those of an attempt that
    ended during catch-up come right before the event that ends it, those of an
    attempt still running at the cut come after catch-up. Deltas of attempts that
    ended at or before `after_seq` are dropped. With `turn_id`, stops after that
    turn's end event (or after catch-up when the turn ended at or before `after_seq`).
    """
    sid = cut.state.session_id
    pending: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for delta in cut.deltas:
        pending.setdefault(_delta_key(delta), []).append(delta)
    cursor = after_seq
    while cursor < cut.seq:
        # Seqs are gapless stream ids, so this count stops exactly at the cut.
        events = await store.read_log(sid, cursor, count=min(page, cut.seq - cursor))
        if not events:
            break
        frames: list[bytes] = []
        for event in events:
            frames += [sse_frame("delta", delta) for delta in _ended_deltas(pending, event)]
            frames.append(sse_frame("event", event))
            if _ends_turn(event, turn_id):
                yield b"".join(frames), event["seq"]
                return
        cursor = events[-1]["seq"]
        yield b"".join(frames), cursor
    if turn_id is not None and cut.state.turns.get(turn_id) in ("completed", "failed"):
        return
    running = {
        (c.id, c.attempt) for c in cut.state.calls.values() if c.status in ("running", "waiting")
    }
    replay = [
        sse_frame("delta", delta)
        for delta in cut.deltas
        if _delta_key(delta) in pending and _delta_key(delta) in running
    ]
    if replay:
        yield b"".join(replay), None
    delta_floor = stream_pos(cut.delta_cursor)
    while True:
        try:
            async with asyncio.timeout(heartbeat):
                batch = await watch.take()
        except TimeoutError:
            yield PING, None
            continue
        if not batch:
            return
        wires: list[bytes] = []
        last: int | None = None
        for frame in batch:
            if frame.kind == "delta":
                if frame.pos > delta_floor:
                    wires.append(frame.wire)
            elif frame.item["seq"] > cut.seq:
                wires.append(frame.wire)
                last = frame.item["seq"]
                if _ends_turn(frame.item, turn_id):
                    yield b"".join(wires), last
                    return
        if wires:
            yield b"".join(wires), last


# --- the SSE writer --------------------------------------------------------------------------


class _SseStream:
    """One connection: writes its feed to the socket, each write bounded in time.

    Catch-up is read as fast as the socket takes it; live frames wait in the
    watch's buffer (at most `max_pending`). A client that lets a write sit for
    `write_timeout`, or its buffer fill, gets a `stream.overflow` frame naming the
    seq to resume after, and is disconnected.
    """

    def __init__(
        self,
        request: web.Request,
        watch: Watch,
        *,
        after_seq: int,
        limits: SseLimits,
        metrics: Metrics,
    ) -> None:
        self.request = request
        self.watch = watch
        self.limits = limits
        self.metrics = metrics
        self.last_sent = after_seq  # seq of the last event handed to the socket
        self.overflow: str | None = None

    def stop(self) -> None:
        """End the stream after the live frames already buffered (server shutdown)."""
        self.watch.end("the server is shutting down")

    async def run(self, feed: AsyncGenerator[Sent, None]) -> web.StreamResponse:
        resp = web.StreamResponse(headers=SSE_HEADERS)
        resp.force_close()
        sock = self.request.transport.get_extra_info("socket") if self.request.transport else None
        if sock is not None and self.limits.send_buffer:
            # Bounds what the kernel holds for a client that stops reading.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.limits.send_buffer)
        await resp.prepare(self.request)
        try:
            async with contextlib.aclosing(feed):
                ended = await self._pump(resp, feed)
            if ended:
                async with asyncio.timeout(self.limits.write_timeout):
                    await resp.write_eof()
            else:
                await self._overflowed(resp)
        except ConnectionError:
            pass  # the client is gone
        except TimeoutError:
            self._abort()  # the client stopped reading at the very end
        return resp

    async def _pump(self, resp: web.StreamResponse, feed: AsyncGenerator[Sent, None]) -> bool:
        """Write frames until the feed ends (True) or the client falls behind (False)."""
        try:
            async for frames, seq in feed:
                if seq is not None:
                    self.last_sent = seq
                try:
                    async with asyncio.timeout(self.limits.write_timeout):
                        await resp.write(frames)
                except TimeoutError:
                    self.overflow = f"the client read nothing for {self.limits.write_timeout:g} s"
                    return False
        except ConnectionError:
            raise
        except Exception:
            log.exception("event stream of %s failed", self.request.match_info.get("sid"))
            return True
        if self.watch.overflowed:
            self.overflow = self.watch.ended
            return False
        return True

    async def _overflowed(self, resp: web.StreamResponse) -> None:
        """Say why and where to resume, best effort; then cut the connection.

        `resume_after_seq` is the last event handed to the socket before this frame:
        a client that reads this frame has read that event too.
        """
        self.metrics.inc("subs_sse_overflows_total")
        body = SubsError(
            f"{self.overflow}: the stream ends; resume after seq {self.last_sent}",
            code="stream_overflow",
            detail={"reason": self.overflow, "resume_after_seq": self.last_sent},
        ).body()
        try:
            async with asyncio.timeout(self.limits.close_grace):
                await resp.write(sse_frame("stream.overflow", body))
                await resp.write_eof()
        except (ConnectionError, TimeoutError):
            self._abort()

    def _abort(self) -> None:
        """Drop the connection with whatever the client never read: a plain close
        would keep that buffer until the client reads it, maybe never."""
        if self.request.transport is not None:
            self.request.transport.abort()


# --- request bodies ---------------------------------------------------------------------------


class _InputBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    session_id: str | None = Field(default=None, min_length=1, max_length=200)
    input: Any = Field(...)
    identity: dict[str, Any] | None = None


class _SettleBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1)
    attempt: int | None = Field(default=None, ge=1)
    result: Any = None
    error: str | None = None
    retryable: bool = False


class _InterruptBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str
    payload: dict[str, Any] | None = None


class _CancelBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str | None = Field(default=None, max_length=1000)


def _invalid(exc: ValidationError, prefix: str = "") -> ApiError:
    """422 naming the first bad field as a dotted path."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in (prefix, *first["loc"]) if p != "")
    text = "required field is missing" if first["type"] == "missing" else first["msg"]
    if first["type"] == "extra_forbidden":
        text = "unknown field"
    return ApiError(422, "invalid_input", f"{where}: {text}" if where else text, param=where)


def _validate(model: type[BaseModel], data: Any, prefix: str = "") -> Any:
    if not isinstance(data, dict):
        raise ApiError(422, "invalid_input", "the body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _invalid(exc, prefix) from None


# --- the app -----------------------------------------------------------------------------------


@dataclass
class _Api:
    client: Client
    store: Store
    keys: ApiKeys
    metrics: Metrics
    max_body: int
    heartbeat: float
    limits: SseLimits
    cors_origins: frozenset[str]  # lower-cased; empty: no CORS headers at all
    request_timeout: float
    hub: Hub
    max_streams_per_key: int
    streams: set[_SseStream] = field(default_factory=set)
    streams_by_caller: dict[str, int] = field(default_factory=dict)

    def take_stream_slot(self, request: web.Request) -> str:
        """Count one more stream for the caller, or refuse it: 429 past the limit.

        The caller is the API key; when the API runs open, the client's address.
        Returns the caller to hand back to `free_stream_slot`.
        """
        key_id = request[PRINCIPAL].key_id
        caller = f"key:{key_id}" if key_id is not None else f"addr:{request.remote}"
        held = self.streams_by_caller.get(caller, 0)
        if held >= self.max_streams_per_key:
            who = "this key" if key_id is not None else "this address"
            raise ApiError(
                429,
                "too_many_streams",
                f"too many event streams: {who} already has {held} open, the limit set by "
                "[serve] max_streams_per_key (or SUBS_MAX_STREAMS_PER_KEY); close one first",
                headers={"Retry-After": "1"},
                limit=self.max_streams_per_key,
            )
        self.streams_by_caller[caller] = held + 1
        return caller

    def free_stream_slot(self, caller: str) -> None:
        held = self.streams_by_caller.pop(caller) - 1
        if held:
            self.streams_by_caller[caller] = held


API = web.AppKey("subs_api", _Api)
PRINCIPAL = web.RequestKey("subs_principal", Principal)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_OPEN_PATHS = frozenset({"/healthz"})


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Outermost: every refusal becomes `{"error", "code"}`; counts and times requests."""
    api = request.app[API]
    started = time.perf_counter()
    try:
        response = await handler(request)
    except SubsError as err:
        if err.status == 500:  # not a refusal: a bug, whose message is for the log
            log.exception("%s %s failed", request.method, request.path)
            err = _INTERNAL
        response = _error_response(err)
    except STORE_FAULTS as err:
        log.warning("%s %s: Redis is not reachable (%s)", request.method, request.path, err)
        response = _error_response(_STORE_DOWN)
    except web.HTTPException as err:  # the router's 404 and 405, aiohttp's 413
        if err.status < 400:
            raise
        response = _error_response(_http_error(err))
    except Exception:
        log.exception("%s %s failed", request.method, request.path)
        response = _error_response(_INTERNAL)
    route = request.match_info.route.resource
    path = route.canonical if route is not None else "unmatched"
    status = str(response.status)
    api.metrics.inc("subs_http_requests_total", method=request.method, route=path, status=status)
    api.metrics.observe("subs_http_request_seconds", time.perf_counter() - started, route=path)
    return response


def _listed_origin(request: web.Request) -> str | None:
    """The request's `Origin` when `[serve] cors_origins` lists it, else None."""
    origin = request.headers.get("Origin")
    if origin is not None and origin.lower() in request.app[API].cors_origins:
        return origin
    return None


@web.middleware
async def _cors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Answers preflights, before auth (a browser sends none with them): listed origins only."""
    if request.method != "OPTIONS" or "Access-Control-Request-Method" not in request.headers:
        return await handler(request)
    if _listed_origin(request) is None:
        raise ApiError(
            403, "origin_not_allowed", "this origin is not in the API's [serve] cors_origins"
        )
    return web.Response(
        status=204,
        headers={
            "Access-Control-Allow-Methods": "GET, POST, DELETE, OPTIONS",
            "Access-Control-Allow-Headers": "Authorization, Content-Type, Last-Event-ID",
            "Access-Control-Max-Age": "600",
        },
    )


@web.middleware
async def _auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Everything but /healthz (and Slack's routes) needs a key when any exist."""
    api = request.app[API]
    if request.path in _OPEN_PATHS or request.path.startswith("/slack/"):  # Slack signs its own
        return await handler(request)
    principal = api.keys.authenticate(request.headers.get("Authorization"))
    if principal is None:
        raise ApiError(401, "unauthorized", _unauthorized(request.headers.get("Authorization")))
    request[PRINCIPAL] = principal
    return await handler(request)


async def _cors_headers(request: web.Request, response: web.StreamResponse) -> None:
    """Every response, streams included (their headers go out at `prepare`). With origins
    configured, each answer depends on `Origin`, so caches are told (`Vary`) either way."""
    if not request.app[API].cors_origins:
        return
    vary = response.headers.get("Vary")
    response.headers["Vary"] = f"{vary}, Origin" if vary else "Origin"
    origin = _listed_origin(request)
    if origin is not None:
        response.headers["Access-Control-Allow-Origin"] = origin


async def _stop_streams(app: web.Application) -> None:
    for stream in list(app[API].streams):
        stream.stop()


async def _close_hub(app: web.Application) -> None:
    await app[API].hub.aclose()


def _unauthorized(authorization: str | None) -> str:
    """What was wrong with the credential, and where a good one comes from (the setting and
    the header); never the key that was sent."""
    fix = 'send "Authorization: Bearer <key>" with a key from SUBS_API_KEYS'
    if not authorization:
        return f"missing API key: {fix}"
    scheme = authorization.partition(" ")[0]
    if scheme.lower() != "bearer":
        return f"the Authorization header is not a Bearer key: {fix}"
    return f"unknown API key: {fix}"


def _principal(request: web.Request) -> Principal:
    return request[PRINCIPAL]


def _full_access(request: web.Request) -> None:
    if not _principal(request).full:
        raise ApiError(
            403,
            "forbidden",
            "this key may only use its own sessions (a KEY:own entry in SUBS_API_KEYS); "
            "the admin endpoints need a full-access key",
        )


def _integer(raw: str, name: str, code: str, *, lo: int, hi: int) -> int:
    """A plain decimal in lo..hi: ASCII digits and nothing else, or a 400 naming `name`."""
    if _DIGITS.fullmatch(raw) is None or not lo <= int(raw) <= hi:
        message = f"{name}: expected an integer {lo}..{hi}, got {_excerpt(raw)}"
        raise ApiError(400, code, message, param=name)
    return int(raw)


def _int_query(request: web.Request, name: str, default: int, *, lo: int, hi: int) -> int:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    return _integer(raw, name, "invalid_query", lo=lo, hi=hi)


async def _json_body(request: web.Request) -> Any:
    """The body as JSON every parser reads alike (see jsonedge): 415 unless it says it is
    JSON, 413 past `max_body` (declared or read), 400 naming the path of what is wrong."""
    if request.content_type != "application/json":  # aiohttp's: lower-cased, no parameters
        got = request.headers.get("Content-Type")
        sent = f"Content-Type {_excerpt(got)}" if got is not None else "no Content-Type"
        message = f"the body must be sent as Content-Type: application/json, not with {sent}"
        raise ApiError(415, "unsupported_media_type", message)
    limit = request.app[API].max_body
    too_large = ApiError(413, "too_large", f"the body is larger than {limit} bytes")
    if request.content_length is not None and request.content_length > limit:
        raise too_large
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise too_large from None
    try:
        return loads_checked(raw)
    except JsonEdgeError as err:
        if err.param is None:
            raise ApiError(400, "invalid_json", f"the body: {err.message}") from None
        raise ApiError(400, "invalid_json", err.message, param=err.param) from None


async def _owned_state(request: web.Request, sid: str) -> SessionState:
    """The session's state, 404 when unknown, 403 when the caller does not own it."""
    state = await load_state(request.app[API].store, sid)
    if state is None:
        raise ApiError(404, "unknown_session", f"session {sid!r} does not exist")
    if not _principal(request).owns(state.identity):
        raise ApiError(403, "forbidden", f"session {sid!r} belongs to another key")
    return state


# --- handlers -----------------------------------------------------------------------------------


async def post_input(request: web.Request) -> web.Response:
    api = request.app[API]
    body: _InputBody = _validate(_InputBody, await _json_body(request))
    validate_client_input(body.input)  # names the bad field under `input.`
    principal = _principal(request)
    identity = principal.identity()
    if body.identity is not None:
        if not principal.full:
            raise ApiError(403, "forbidden", "identity: only a full-access key may set it")
        given = {"metadata": {}, **body.identity}
        supplied = _validate(WorkerIdentity, given, "identity").model_dump(
            mode="json", exclude_unset=True
        )
        metadata = {**identity["metadata"], **supplied.get("metadata", {})}
        identity = {**identity, **supplied, "metadata": metadata}
    if body.session_id is not None and not principal.full:
        head = await api.store.head(body.session_id)
        if head is not None and not principal.owns(head[1]):
            raise ApiError(403, "forbidden", f"session {body.session_id!r} belongs to another key")
    reply = await api.client.submit(
        body.input,
        session_id=body.session_id,
        identity=identity,
        owner=None if principal.full else identity.get("subject"),
        timeout=api.request_timeout,
    )
    return web.json_response(reply, status=202, dumps=compact_json)


async def get_session(request: web.Request) -> web.Response:
    state = await _owned_state(request, request.match_info["sid"])
    view = {
        "session_id": state.session_id,
        "agent_id": state.agent_id,
        "status": state.status,
        "turn_id": state.turn.id if state.turn else None,
        "seq": state.seq,
        "interrupts": list(state.interrupts.values()),
        "messages": path_to(state.nodes, state.head_id),
        "message_tree": {
            "nodes": [
                {"message": n.message, "parent_id": n.parent_id} for n in state.nodes.values()
            ],
            "head_id": state.head_id,
        },
    }
    return web.json_response(view, dumps=compact_json)


async def stream_events(request: web.Request) -> web.StreamResponse:
    api = request.app[API]
    sid = request.match_info["sid"]
    header = request.headers.get("Last-Event-ID")
    if header:  # it wins over after_seq; an empty one is no header (aiohttp strips spaces)
        after = _integer(header, "Last-Event-ID", "invalid_header", lo=0, hi=MAX_SEQ)
    else:
        after = _int_query(request, "after_seq", 0, lo=0, hi=MAX_SEQ)
    turn_id = request.query.get("turn_id") or None
    caller = api.take_stream_slot(request)
    try:
        head = await api.store.head(sid)
        if head is None:
            raise ApiError(404, "unknown_session", f"session {sid!r} does not exist")
        seq, identity = head
        if not _principal(request).owns(identity):
            raise ApiError(403, "forbidden", f"session {sid!r} belongs to another key")
        if after > seq:
            raise ApiError(400, "invalid_query", f"seq {after} is past the log's end ({seq})")
        async with api.hub.watch(sid) as watch:
            cut = await _read_cut(api.store, sid)  # after joining: see `fanout`
            if cut is None:
                raise ApiError(404, "unknown_session", f"session {sid!r} does not exist")
            limits = api.limits
            feed = _session_feed(
                api.store,
                watch,
                cut,
                after,
                turn_id=turn_id,
                page=limits.page,
                heartbeat=api.heartbeat,
            )
            stream = _SseStream(request, watch, after_seq=after, limits=limits, metrics=api.metrics)
            api.streams.add(stream)
            api.metrics.inc("subs_sse_streams_open")
            try:
                return await stream.run(feed)
            finally:
                api.metrics.inc("subs_sse_streams_open", -1)
                api.streams.discard(stream)
    finally:
        api.free_stream_slot(caller)


async def post_interrupt(request: web.Request) -> web.Response:
    api = request.app[API]
    sid = request.match_info["sid"]
    body: _InterruptBody = _validate(_InterruptBody, await _json_body(request))
    if body.payload is not None:
        _validate(InterruptPayload, body.payload, "payload")
    await _owned_state(request, sid)
    reply = await api.client.interrupt(sid, body.reason, body.payload, timeout=api.request_timeout)
    return web.json_response(reply, status=202, dumps=compact_json)


async def post_cancel(request: web.Request) -> web.Response:
    """End the running turn; the body (`{reason?}`) may be left out."""
    api = request.app[API]
    sid = request.match_info["sid"]
    raw = await _json_body(request) if request.body_exists else {}
    body: _CancelBody = _validate(_CancelBody, raw)
    await _owned_state(request, sid)
    reply = await api.client.cancel(sid, body.reason, timeout=api.request_timeout)
    return web.json_response(reply, status=202, dumps=compact_json)


async def delete_session(request: web.Request) -> web.Response:
    """Remove an idle session and all it stored; 409 `turn_running` while a turn runs."""
    sid = request.match_info["sid"]
    await _owned_state(request, sid)
    await request.app[API].client.delete(sid)
    return web.Response(status=204)


async def post_settle(request: web.Request) -> web.Response:
    api = request.app[API]
    sid = request.match_info["sid"]
    body: _SettleBody = _validate(_SettleBody, await _json_body(request))
    if body.error is not None and "result" in body.model_fields_set:
        raise ApiError(422, "invalid_input", "result: give either result or error, not both")
    if not _principal(request).full:
        await _owned_state(request, sid)
    reply = await api.client.settle(
        sid,
        body.id,
        attempt=body.attempt,
        result=body.result,
        error=body.error,
        retryable=body.retryable,
        timeout=api.request_timeout,
    )
    return web.json_response(reply, status=202, dumps=compact_json)


async def admin_sessions(request: web.Request) -> web.Response:
    _full_access(request)
    offset = _int_query(request, "offset", 0, lo=0, hi=2**31)
    limit = _int_query(request, "limit", 50, lo=1, hi=500)
    sessions, more = await request.app[API].client.session_rows(offset, limit)
    body = {"sessions": sessions, "next_offset": offset + limit if more else None}
    return web.json_response(body, dumps=compact_json)


async def admin_dead_letters(request: web.Request) -> web.Response:
    """Inputs the engine could not apply, newest first (each failed its session's turn)."""
    _full_access(request)
    limit = _int_query(request, "limit", 100, lo=1, hi=1000)
    letters = await request.app[API].store.dead_letters(limit)
    return web.json_response({"dead_letters": letters}, dumps=compact_json)


async def admin_events(request: web.Request) -> web.Response:
    _full_access(request)
    store = request.app[API].store
    sid = request.match_info["sid"]
    after = _int_query(request, "after_seq", 0, lo=0, hi=MAX_SEQ)
    limit = _int_query(request, "limit", 100, lo=1, hi=1000)
    head = await store.head(sid)
    if head is None:
        raise ApiError(404, "unknown_session", f"session {sid!r} does not exist")
    events = await store.read_log(sid, after, count=limit)
    last = events[-1]["seq"] if events else after
    body = {"events": events, "next_after_seq": last if last < head[0] else None}
    return web.json_response(body, dumps=compact_json)


async def get_healthz(request: web.Request) -> web.Response:
    """Redis answers a PING within `HEALTH_TIMEOUT`, or the engine is degraded. Open to
    anyone, so the reason is a word (the error's type), never an address."""
    try:
        async with asyncio.timeout(HEALTH_TIMEOUT):
            await request.app[API].store.ping()
    except TimeoutError:
        reason = f"no answer within {HEALTH_TIMEOUT:g} s"
    except Exception as err:  # whatever stops the PING: the check's only question
        reason = type(err).__name__
    else:
        return web.json_response({"status": "ok"}, dumps=compact_json)
    return _error_response(
        SubsError(
            f"the store (Redis) does not answer: {reason}",
            code="store_unavailable",
            status=503,
            detail={"status": "degraded", "redis": reason},
        )
    )


async def get_metrics(request: web.Request) -> web.Response:
    api = request.app[API]
    api.metrics.set("subs_sse_readers", len(api.hub.readers))
    text = api.metrics.render()
    return web.Response(
        body=text.encode(), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
    )


def make_app(
    engine_client: Client,
    store: Store,
    *,
    keys: ApiKeys,
    max_body: int = 1 << 20,
    metrics: Metrics | None = None,
    heartbeat: float = 15.0,
    sse: SseLimits | None = None,
    cors_origins: Iterable[str] = (),
    request_timeout: float = 30.0,
    max_streams_per_key: int = 100,
) -> web.Application:
    """The API as an aiohttp app; the caller runs it (and decides where, see `check_bind`).

    `cors_origins` are the browser origins (`scheme://host[:port]`) allowed to call it;
    none, the default, sends no CORS headers and refuses every preflight. `store` should
    be on a connection pool of its own, apart from the engine's: the API's waits
    (submits, event-stream readers) must never hold up a lease renewal.
    """
    limits = sse or SseLimits()
    app = web.Application(middlewares=[_errors, _cors, _auth], client_max_size=max_body)
    app[API] = _Api(
        client=engine_client,
        store=store,
        keys=keys,
        metrics=metrics or Metrics(),
        max_body=max_body,
        heartbeat=heartbeat,
        limits=limits,
        cors_origins=frozenset(o.lower() for o in cors_origins),
        request_timeout=request_timeout,
        hub=Hub(store, sse_frame, block_ms=limits.block_ms, buffer=limits.max_pending),
        max_streams_per_key=max_streams_per_key,
    )
    app.on_response_prepare.append(_cors_headers)
    app.on_shutdown.append(_stop_streams)
    app.on_cleanup.append(_close_hub)
    r = app.router
    r.add_post("/api/client/sessions/input", post_input)
    r.add_get("/api/client/sessions/{sid}", get_session)
    r.add_get("/api/client/sessions/{sid}/events/stream", stream_events)
    r.add_post("/api/client/sessions/{sid}/interrupt", post_interrupt)
    r.add_post("/api/client/sessions/{sid}/cancel", post_cancel)
    r.add_delete("/api/client/sessions/{sid}", delete_session)
    r.add_post("/api/machine/sessions/{sid}/calls/settle", post_settle)
    r.add_get("/api/admin/sessions", admin_sessions)
    r.add_get("/api/admin/sessions/{sid}/events", admin_events)
    r.add_get("/api/admin/dead-letters", admin_dead_letters)
    r.add_get("/healthz", get_healthz)
    r.add_get("/metrics", get_metrics)
    return app
