"""The open API (no `SUBS_API_KEYS`) answers the machine it runs on, not every web page
that machine's browser opens (SPEC §13): with no key to check, a request must name this
server in `Host` (a DNS-rebound name does not), come from no other page's `Origin`, and
send every `POST` and `DELETE` as JSON, which a plain form or a simple cross-origin fetch
cannot (they are refused before any handler runs). Slack's route is left to its signature
(it posts forms, through whatever name a tunnel gives it). Plain functions of the request
and the allowed names; the middleware is `local_only`."""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from aiohttp import web

from engine.api.errors import ApiError, excerpt

# Names that only ever mean this machine: a browser never asks DNS for them.
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
_SIGNED_PREFIX = "/slack/"  # Slack signs its requests, and posts forms


def host_name(value: str) -> str | None:
    """The name in a `Host` header or an origin (`h`, `h:port`, `[v6]:port`), lower-cased,
    or None when it is not one."""
    try:
        parts = urlsplit(f"//{value}")
        _ = parts.port  # raises on a port that is not a number
    except ValueError:
        return None
    return parts.hostname or None


def allowed_hosts(names: Iterable[str | None]) -> frozenset[str]:
    """The loopback names, and each of `names` (the bound address, `public_url`'s host)."""
    return LOOPBACK_NAMES | {n.strip("[]").lower() for n in names if n}


def local_refusal(
    request: web.Request, hosts: frozenset[str], origins: frozenset[str]
) -> ApiError | None:
    """Why an open API refuses this request, or None: 421 for another `Host`, 403 for
    another page's `Origin`, 415 for a write that is not JSON. Slack's route answers
    only what Slack signed, under whatever name a tunnel gives it."""
    if request.path.startswith(_SIGNED_PREFIX):
        return None
    host = request.headers.get("Host", "")
    if host_name(host) not in hosts:
        return ApiError(
            f"Host {excerpt(host)} is not this server: with no SUBS_API_KEYS the API only "
            "answers requests for its own address (set [serve] public_url for another name)",
            status=421,
            code="misdirected_request",
        )
    origin = request.headers.get("Origin")
    if origin is not None and origin.lower() not in origins:
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or parts.netloc.lower() != host.lower():
            return ApiError(
                f"Origin {excerpt(origin)} is not this server's and not in [serve] "
                "cors_origins: with no SUBS_API_KEYS other pages may not call the API",
                status=403,
                code="origin_not_allowed",
            )
    if request.method in ("POST", "DELETE") and (
        request.content_type != "application/json" or "Content-Type" not in request.headers
    ):
        got = request.headers.get("Content-Type")
        sent = f"Content-Type {excerpt(got)}" if got is not None else "no Content-Type"
        return ApiError(
            f"every {request.method} must be sent as Content-Type: application/json "
            f"(an empty body too), not with {sent}",
            status=415,
            code="unsupported_media_type",
        )
    return None
