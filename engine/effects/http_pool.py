"""The engine's outbound HTTP: one pooled, kept-alive aiohttp session for vendors and workers.

One session per engine process (`EffectRunner` owns it), so a model call or a
worker delivery reuses the connection the previous one to that host left in the
pool instead of paying for a new TCP (and TLS) handshake. aiohttp hands a
connection back only when its response was read to the end; a stream the
reader is done with goes through `drain`, anything else is closed on release.

Transport failures keep the names the engine's messages have always used
(`ConnectError`, `ReadTimeout`, ...): those messages are recorded in session
logs and read by people, so they should not change with the client library.
"""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp.http_exceptions import ContentEncodingError, HttpProcessingError

__all__ = ["drain", "failure_name", "failure_text", "is_decoding", "new_session"]

CONNECT_TIMEOUT = 30.0  # a free pooled connection, or a new one, within this
# A TCP handshake within this: a wrong address (a `base_url` nothing answers at) fails in
# seconds, not after the OS gives up (with retries, over a minute).
SOCK_CONNECT_TIMEOUT = 5.0
LIMIT = 256  # connections in all: a bound on sockets, far above one host's share
LIMIT_PER_HOST = 100  # what the whole pool allowed before, per host now
# Idle connections are dropped after this, before Node's 5 s server default closes them
# under a request we are just sending (workers are often Node servers).
KEEPALIVE = 4.0
DRAIN_BYTES = 64 * 1024  # after the answer; a peer that sends more loses the connection
DRAIN_SECONDS = 0.5  # the vendors end the body at once; one that does not loses it too

# First match wins: subclasses before their bases.
_NAMES: tuple[tuple[type[BaseException], str], ...] = (
    (aiohttp.ConnectionTimeoutError, "ConnectTimeout"),
    (aiohttp.SocketTimeoutError, "ReadTimeout"),
    (TimeoutError, "Timeout"),
    (aiohttp.ClientConnectorError, "ConnectError"),
    (aiohttp.ServerDisconnectedError, "RemoteProtocolError"),
    (aiohttp.ClientOSError, "ReadError"),
    (aiohttp.InvalidURL, "InvalidURL"),
    (aiohttp.NonHttpUrlClientError, "UnsupportedProtocol"),
)


def new_session(
    *,
    connect_timeout: float = CONNECT_TIMEOUT,
    sock_connect_timeout: float = SOCK_CONNECT_TIMEOUT,
    read_timeout: float | None = None,
) -> aiohttp.ClientSession:
    """A session for the running loop; the caller closes it (`await session.close()`).

    No total timeout and no read timeout by default: every call runs under a deadline
    of its own (the effect's, recorded in the log), which is what bounds it. No
    environment (proxies, netrc) and no cookies: what is sent is what the code says.
    Redirects are not followed by the callers (`allow_redirects=False`): a 3xx is
    an answer like any other status.
    """
    connector = aiohttp.TCPConnector(
        limit=LIMIT, limit_per_host=LIMIT_PER_HOST, keepalive_timeout=KEEPALIVE
    )
    timeout = aiohttp.ClientTimeout(
        total=None,
        connect=connect_timeout,
        sock_connect=min(sock_connect_timeout, connect_timeout),
        sock_read=read_timeout,
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        trust_env=False,
        cookie_jar=aiohttp.DummyCookieJar(),
    )


async def drain(response: aiohttp.ClientResponse) -> None:
    """Reads what is left of a body whose answer is already in hand, so that its
    connection goes back to the pool; never raises.

    An OpenAI stream ends with `[DONE]`, and a worker's with `decision.result`, a
    moment before the body itself ends. Left unread, the connection would be closed
    on release and the next call would open a new one. Bounded: past DRAIN_BYTES or
    DRAIN_SECONDS the connection is given up (closed on release) instead.
    """
    content = response.content
    if content.is_eof():  # the end is already in: the connection is reusable as it is
        return
    left = DRAIN_BYTES
    try:
        async with asyncio.timeout(DRAIN_SECONDS):
            while left >= 0 and (chunk := await content.readany()):
                left -= len(chunk)
    except (TimeoutError, aiohttp.ClientError):
        pass  # the answer stands; this connection is closed on release


def failure_name(exc: BaseException) -> str:
    """A transport failure's stable name for messages: `ConnectError`, `ReadTimeout`..."""
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "DecodingError" if is_decoding(exc) else "RemoteProtocolError"
    for kind, name in _NAMES:
        if isinstance(exc, kind):
            return name
    return type(exc).__name__


def failure_text(exc: BaseException) -> str:
    """What went wrong, as one line without reprs; "" when the name says it all."""
    if isinstance(exc, aiohttp.ClientPayloadError):
        cause = exc.__cause__
        if isinstance(cause, HttpProcessingError) and cause.message:
            return " ".join(cause.message.split())
        return "the body ended before its end"
    if isinstance(exc, aiohttp.NonHttpUrlClientError):
        return "the URL is not http(s)"  # the URL itself may hold a secret: not quoted
    if isinstance(exc, aiohttp.InvalidURL):
        return "the URL is not valid"
    return " ".join(str(exc).split())


def is_decoding(exc: BaseException) -> bool:
    """Whether a payload error is a body that could not be decompressed, not a cut one."""
    return isinstance(exc, aiohttp.ClientPayloadError) and isinstance(
        exc.__cause__, ContentEncodingError
    )
