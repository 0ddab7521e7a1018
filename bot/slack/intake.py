"""`POST /slack/<agent>/events`: Slack's signature first, then only bodies Bolt can read.

Bolt parses a request when it is built, before its own signature middleware runs, and its
parsing and listener matchers trust the body's shape (a JSON list, an `event` whose `type`
is a number, `actions` that are not objects all raise, and Bolt answers 500). So the route
checks the signature on the raw bytes with slack_sdk's `SignatureVerifier` before anything
reads them (401 when it is missing, wrong or stale), then builds Bolt's request and checks
the shape Slack always sends (400 when the signed body is not one). Bolt then verifies
again, routes and acks.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response
from slack_bolt.async_app import AsyncApp
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.signature import SignatureVerifier

from engine.errors import SubsError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# Members Slack sends as objects (or null) wherever they appear at the top of a body.
_OBJECTS = ("event", "view", "container", "channel", "user", "team", "message", "state")


def events_handler(app: AsyncApp, verifier: SignatureVerifier) -> Handler:
    """The aiohttp handler for Slack's HTTP deliveries: checks the signature before Bolt sees
    the body, so an unsigned or stale request is refused without running a listener."""

    async def events(request: web.Request) -> web.StreamResponse:
        timestamp = request.headers.get("X-Slack-Request-Timestamp")
        signature = request.headers.get("X-Slack-Signature")
        if not timestamp or not signature:
            return _refusal(401, "unsigned", "no Slack signature")
        raw = await request.read()  # bounded by the app's client_max_size (413)
        if not _signed(verifier, raw, timestamp, signature):
            return _refusal(401, "bad_signature", "bad or stale Slack signature")
        try:
            # Whatever Bolt's parsing raises here, the (signed) body is at fault.
            bolt_request = AsyncBoltRequest(
                body=raw.decode(), query=request.query_string, headers=dict(request.headers)
            )
        except Exception:
            return _refusal(400, "malformed_body", "not a body Slack sends")
        if not readable(bolt_request.body):
            return _refusal(400, "malformed_body", "not a body Slack sends")
        return await to_aiohttp_response(await app.async_dispatch(bolt_request))

    return events


def _signed(verifier: SignatureVerifier, raw: bytes, timestamp: str, signature: str) -> bool:
    """slack_sdk's check, which raises on a timestamp that is not a number, a body that is
    not UTF-8 (it signs text, so it cannot verify one) and a signature that is not ASCII."""
    try:
        return verifier.is_valid(raw, timestamp, signature)
    except (ValueError, TypeError):
        return False


def _refusal(status: int, code: str, message: str) -> web.Response:
    """The API's error shape (`SubsError.body`): this route may be served on its own."""
    err = SubsError(message, code=code, status=status)
    return web.json_response(err.body(), status=err.status)


def readable(body: Any) -> bool:
    """A body of a kind Slack sends (an Events API envelope and an interaction have a string
    `type`, a slash command a `command`, Slack's probe of a command URL `ssl_check`), shaped
    as Slack shapes it where Bolt's matchers and our listeners read it without checking."""
    if not isinstance(body, dict):
        return False
    if not any(isinstance(body.get(key), str) for key in ("type", "command", "ssl_check")):
        return False
    if not all(isinstance(body.get(key), dict | None) for key in _OBJECTS):
        return False
    event = body.get("event")
    if event is not None and not isinstance(event.get("type"), str):
        return False
    if body.get("type") == "block_actions":
        actions = body.get("actions")
        return isinstance(actions, list) and all(
            isinstance(action, dict) and isinstance(action.get("action_id"), str)
            for action in actions
        )
    return True
