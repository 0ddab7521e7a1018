"""The chain every request passes, outermost first (`make_app` sets the order): errors
rendered as `{"error", "code"}` and requests counted, an open API's local-only checks,
CORS preflights answered before auth (a browser sends no key with them), then the bearer
key checked. CORS headers on every answer come from the `on_response_prepare` hook here too."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from engine.api.auth import Principal, read_only_refusal, unauthorized
from engine.api.client_tokens import APP_ISSUER, looks_like_jwt
from engine.api.errors import INTERNAL, STORE_DOWN, ApiError, error_response, http_error
from engine.api.local import local_refusal
from engine.api.state import API, PRINCIPAL
from engine.errors import SubsError
from engine.store.store import STORE_FAULTS

log = logging.getLogger("subs.api")


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_OPEN_PATHS = frozenset({"/healthz", "/console"})
# Slack signs its own requests; the console's and the chat page's files hold nothing a
# key protects (each page asks for the key and sends it with its calls).
_OPEN_PREFIXES = ("/slack/", "/console/")
# Where a client token is a credential (upstream's docs/250-api.md: the client API and the
# AG-UI channel take a client JWT; the machine and admin APIs an API key).
_TOKEN_PREFIXES = ("/api/client/", "/api/channels/ag-ui/")
# The console's pages run only the package's own files: no inline script or style, no
# other origin, never framed. Its JS reaches the API on the same origin.
CONSOLE_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)


@web.middleware
async def render_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Outermost: every refusal becomes `{"error", "code"}`; counts and times requests."""
    api = request.app[API]
    started = time.perf_counter()
    try:
        response = await handler(request)
    except SubsError as err:
        if err.status == 500:  # not a refusal: a bug, whose message is for the log
            log.exception("%s %s failed", request.method, request.path)
            err = INTERNAL
        response = error_response(err)
    except STORE_FAULTS as err:
        log.warning("%s %s: Redis is not reachable (%s)", request.method, request.path, err)
        response = error_response(STORE_DOWN)
    except web.HTTPException as err:  # the router's 404 and 405, aiohttp's 413
        if err.status < 400:
            raise
        response = error_response(http_error(err))
    except Exception:
        log.exception("%s %s failed", request.method, request.path)
        response = error_response(INTERNAL)
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
async def local_only(request: web.Request, handler: Handler) -> web.StreamResponse:
    """With no keys configured: only requests for this server, from no other page (see
    `engine.api.local`). With keys, the bearer key is what a page cannot send."""
    api = request.app[API]
    if api.keys.open:
        refusal = local_refusal(request, api.local_hosts, api.cors_origins)
        if refusal is not None:
            raise refusal
    return await handler(request)


@web.middleware
async def preflight(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Answers preflights, before auth (a browser sends none with them): listed origins only."""
    if request.method != "OPTIONS" or "Access-Control-Request-Method" not in request.headers:
        return await handler(request)
    if _listed_origin(request) is None:
        raise ApiError(
            "this origin is not in the API's [serve] cors_origins",
            status=403,
            code="origin_not_allowed",
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
async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Everything but /healthz, Slack's routes (Slack signs its own) and the console's
    and chat page's files (a page holds no data: it asks for a key, then calls the API
    with it) needs a key when any exist. A read-only key may only read."""
    api = request.app[API]
    if request.path in _OPEN_PATHS or request.path.startswith(_OPEN_PREFIXES):
        return await handler(request)
    authorization = request.headers.get("Authorization")
    principal = None if api.keys.open else api.keys.authenticate(authorization)
    if principal is None:
        principal = _token_caller(request, authorization)
    if principal is None and api.keys.open:
        principal = Principal(None, full=True)
    if principal is None:
        raise ApiError(
            unauthorized(request.headers.get("Authorization")), status=401, code="unauthorized"
        )
    if principal.read_only and (refusal := read_only_refusal(request.method, request.path)):
        raise ApiError(refusal, status=403, code="forbidden")
    request[PRINCIPAL] = principal
    return await handler(request)


def _token_caller(request: web.Request, authorization: str | None) -> Principal | None:
    """The caller a bearer client token names, None when the credential is no token (a
    JWT-shaped bearer is one when tokens are on, or when keys are set: then the 401 says
    tokens are off). A bad token is a 401 with PyJWT's reason; a good one only reaches
    the client API and the AG-UI channel."""
    api = request.app[API]
    scheme, _, credential = (authorization or "").partition(" ")
    credential = credential.strip()
    if scheme.lower() != "bearer" or not looks_like_jwt(credential):
        return None
    if not api.tokens.enabled and api.keys.open:
        return None
    claims = api.tokens.verify(credential)
    if not request.path.startswith(_TOKEN_PREFIXES):
        raise ApiError(
            f"{request.path}: a client token reaches only /api/client/ and the AG-UI channel; "
            "this route takes an API key",
            status=403,
            code="forbidden",
        )
    return Principal(claims.sub, full=False, issuer=APP_ISSUER, metadata=claims.metadata)


async def console_headers(request: web.Request, response: web.StreamResponse) -> None:
    """The strict policy on every console answer (its pages, scripts and refusals), unless
    the handler set a stricter one of its own (the chat page's)."""
    if request.path == "/console" or request.path.startswith("/console/"):
        response.headers.setdefault("Content-Security-Policy", CONSOLE_POLICY)
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Referrer-Policy", "no-referrer")


async def cors_headers(request: web.Request, response: web.StreamResponse) -> None:
    """Every response, streams included (their headers go out at `prepare`). With origins
    configured, each answer depends on `Origin`, so caches are told (`Vary`) either way."""
    if not request.app[API].cors_origins:
        return
    vary = response.headers.get("Vary")
    response.headers["Vary"] = f"{vary}, Origin" if vary else "Origin"
    origin = _listed_origin(request)
    if origin is not None:
        response.headers["Access-Control-Allow-Origin"] = origin
