"""The machine API's routes in upstream's shapes (its docs/250-api.md, "Machine API"): a
backend mints client tokens and submits for a user it names. A Machine caller is a
full-access key; errors of `sessions/submit` carry upstream's `"ok": false` beside ours."""

from __future__ import annotations

import functools
import time
from typing import Any, cast

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from engine.api.client_tokens import APP_ISSUER, MAX_TTL, SECRET_ENV
from engine.api.errors import ApiError
from engine.api.middleware import Handler
from engine.api.parsing import json_body, validate
from engine.api.sessions import refuse_reserved
from engine.api.state import API, principal_of
from engine.errors import ProtocolError, SubsError
from engine.jsonedge import compact_json
from engine.machine.shapes import Answer
from engine.protocol import parse_decision_response, to_json


class IdentityBody(BaseModel):
    """Upstream's `WorkerIdentity` as a backend names a user: an id and string metadata."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, max_length=200)
    metadata: dict[str, str] = Field(default_factory=dict)


class ClientTokenBody(BaseModel):
    """`POST /api/machine/client-tokens`."""

    model_config = ConfigDict(extra="forbid")

    identity: IdentityBody
    ttl_seconds: StrictInt = Field(default=600, ge=1, le=MAX_TTL)


class MachineSubmitBody(BaseModel):
    """`POST /api/machine/sessions/submit`: a ClientPayload (a ClientInput without its
    `agent_id`), for the user `identity` names."""

    model_config = ConfigDict(extra="forbid")

    agent_id: str = Field(min_length=1, max_length=200)
    identity: IdentityBody
    session_id: str | None = Field(default=None, min_length=1, max_length=200)
    payload: dict[str, Any]
    queue: StrictBool = False


class WorkerSubmitBody(BaseModel):
    """`POST /api/machine/workers/submit`: a DecisionResponse (`actions`, and `agent` or
    `state` beside them) for the decision `decision_id` of `session_id`."""

    model_config = ConfigDict(extra="allow")

    session_id: str = Field(min_length=1, max_length=200)
    decision_id: str = Field(min_length=1, max_length=200)


def ok_false(handler: Handler) -> Handler:
    """Upstream's second error shape for the machine submit routes: `{"ok": false, "error"}`
    (ours keeps its `code` and `param` beside them)."""

    @functools.wraps(handler)
    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except SubsError as err:
            if err.status < 500:
                err.detail = {"ok": False, **err.detail}
            raise

    return wrapped


def require_machine(request: web.Request) -> None:
    """403 unless a full-access key (upstream's Machine caller) sent the request."""
    if not principal_of(request).full:
        raise ApiError(
            f"{request.path}: needs a full-access API key (a KEY entry in SUBS_API_KEYS)",
            status=403,
            code="forbidden",
        )


def app_identity(identity: IdentityBody) -> dict[str, Any]:
    """The session identity a backend-named user records: a client token for the same id
    (subject issuer "app") then owns the session."""
    return {"subject": {"issuer": APP_ISSUER, "id": identity.id}, "metadata": identity.metadata}


async def post_client_token(request: web.Request) -> web.Response:
    """Mint a client token for the user `identity.id` names: `{token, expires_at}`."""
    api = request.app[API]
    require_machine(request)
    body: ClientTokenBody = validate(ClientTokenBody, await json_body(request))
    if not api.tokens.enabled:
        raise ApiError(
            f"client tokens are off on this server: set {SECRET_ENV} (32 bytes or more)",
            status=503,
            code="client_tokens_off",
        )
    token, expires_at = api.tokens.mint(
        body.identity.id, body.identity.metadata, body.ttl_seconds, time.time()
    )
    return web.json_response({"token": token, "expires_at": expires_at}, dumps=compact_json)


@ok_false
async def post_worker_submit(request: web.Request) -> web.Response:
    """A worker's answer to a decision it deferred (it answered the request with an empty
    body): applied once, then `{"ok": true}`; any other decision id is `409`."""
    api = request.app[API]
    require_machine(request)
    raw = await json_body(request)
    body: WorkerSubmitBody = validate(WorkerSubmitBody, raw)
    response = {k: v for k, v in raw.items() if k not in ("session_id", "decision_id")}
    try:
        # Validated by the wire model: its dump is the machine's shape of an answer.
        decision = cast(Answer, to_json(parse_decision_response(response)))
    except ProtocolError as err:
        raise ApiError(err.message, status=422, code="invalid_input", param=err.param) from None
    refuse_reserved(request, body.session_id)
    await api.client.submit_decision(
        body.session_id, body.decision_id, decision, timeout=api.request_timeout
    )
    return web.json_response({"ok": True}, dumps=compact_json)


@ok_false
async def post_machine_submit(request: web.Request) -> web.Response:
    """Submit a ClientPayload for the user `identity` names; answers as the client input
    route does (`{session_id, turn_id, queued}`, 202)."""
    api = request.app[API]
    require_machine(request)
    body: MachineSubmitBody = validate(MachineSubmitBody, await json_body(request))
    if body.session_id is not None:
        refuse_reserved(request, body.session_id)
    given_agent = body.payload.get("agent_id")
    if given_agent is not None and given_agent != body.agent_id:
        raise ApiError(
            f"payload.agent_id {given_agent!r} differs from agent_id {body.agent_id!r}",
            status=422,
            code="invalid_input",
            param="payload.agent_id",
        )
    payload: dict[str, Any] = {**body.payload, "agent_id": body.agent_id}
    if body.queue:
        payload["queue"] = True
    reply = await api.client.submit(
        payload,
        session_id=body.session_id,
        identity=app_identity(body.identity),
        traceparent=request.headers.get("traceparent"),
        timeout=api.request_timeout,
    )
    return web.json_response(reply, status=202, dumps=compact_json)
