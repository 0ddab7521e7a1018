"""The routes on one session: a client's input, view, event stream, interrupt, cancel and
delete, and a worker's settle of a call. A scoped key reaches only its own sessions."""

from __future__ import annotations

from aiohttp import web

from engine.api.errors import ApiError
from engine.api.parsing import (
    MAX_SEQ,
    CancelBody,
    InputBody,
    InterruptBody,
    SettleBody,
    int_query,
    integer,
    json_body,
    validate,
)
from engine.api.slack_landing import land_if_slack
from engine.api.state import API, principal_of
from engine.api.stream import SseStream, read_cut, session_feed
from engine.client import session_view
from engine.jsonedge import compact_json
from engine.machine import SessionState
from engine.protocol import InterruptPayload, WorkerIdentity
from engine.session_ids import reserved_for
from engine.store.snapshots import load_state


def refuse_reserved(request: web.Request, sid: str, param: str = "session_id") -> None:
    """403 when a key that is not a full-access key would create or write a session id one
    of the engine's channels derives (engine/session_ids.py): it could plant a thread."""
    why = reserved_for(sid)
    if why is not None and not principal_of(request).full:
        raise ApiError(
            f"session {sid!r} is reserved: {why}; only a full-access key may create or "
            "write it (pick another id, or leave session_id out)",
            status=403,
            code="reserved_session_id",
            param=param,
        )


async def _owned_state(request: web.Request, sid: str) -> SessionState:
    """The session's state, 404 when unknown, 403 when the caller does not own it."""
    state = await load_state(request.app[API].store, sid)
    if state is None:
        raise ApiError(f"session {sid!r} does not exist", status=404, code="unknown_session")
    if not principal_of(request).owns(state.identity):
        raise ApiError(f"session {sid!r} belongs to another key", status=403, code="forbidden")
    return state


async def post_input(request: web.Request) -> web.Response:
    """Submit one ClientInput: answers once the engine has committed it."""
    api = request.app[API]
    body: InputBody = validate(InputBody, await json_body(request))
    principal = principal_of(request)
    identity = principal.identity()
    if body.identity is not None:
        if not principal.full:
            raise ApiError(
                "identity: only a full-access key may set it", status=403, code="forbidden"
            )
        given = {"metadata": {}, **body.identity}
        supplied = validate(WorkerIdentity, given, "identity").model_dump(
            mode="json", exclude_unset=True
        )
        metadata = {**identity["metadata"], **supplied.get("metadata", {})}
        identity = {**identity, **supplied, "metadata": metadata}
    if body.session_id is not None:
        refuse_reserved(request, body.session_id)
    if body.session_id is not None and not principal.full:
        head = await api.store.head(body.session_id)
        if head is not None and not principal.owns(head[1]):
            raise ApiError(
                f"session {body.session_id!r} belongs to another key", status=403, code="forbidden"
            )
    landed = await land_if_slack(
        api, body.input, session_id=body.session_id, identity=identity, full=principal.full
    )
    if landed is not None:  # the bot submits it, under the turn id chosen here
        return web.json_response(landed, status=202, dumps=compact_json)
    reply = await api.client.submit(
        body.input,
        session_id=body.session_id,
        identity=identity,
        owner=None if principal.full else identity.get("subject"),
        traceparent=request.headers.get("traceparent"),
        tracestate=request.headers.get("tracestate"),
        timeout=api.request_timeout,
    )
    return web.json_response(reply, status=202, dumps=compact_json)


async def get_session(request: web.Request) -> web.Response:
    """The session as a client reads it, if the caller may read it."""
    state = await _owned_state(request, request.match_info["sid"])
    view = session_view(state)
    return web.json_response(view, dumps=compact_json)


async def stream_events(request: web.Request) -> web.StreamResponse:
    """The session's events as SSE, from `after_seq` or `Last-Event-ID`, so a client
    that reconnects misses nothing and sees nothing twice."""
    api = request.app[API]
    sid = request.match_info["sid"]
    header = request.headers.get("Last-Event-ID")
    if header:  # it wins over after_seq; an empty one is no header (aiohttp strips spaces)
        after = integer(header, "Last-Event-ID", "invalid_header", lo=0, hi=MAX_SEQ)
    else:
        after = int_query(request, "after_seq", 0, lo=0, hi=MAX_SEQ)
    turn_id = request.query.get("turn_id") or None
    caller = api.take_stream_slot(request)
    try:
        head = await api.store.head(sid)
        if head is None:
            raise ApiError(f"session {sid!r} does not exist", status=404, code="unknown_session")
        seq, identity = head
        if not principal_of(request).owns(identity):
            raise ApiError(f"session {sid!r} belongs to another key", status=403, code="forbidden")
        if after > seq:
            raise ApiError(
                f"seq {after} is past the log's end ({seq})", status=400, code="invalid_query"
            )
        async with api.hub.watch(sid) as watch:
            cut = await read_cut(api.store, sid)  # after joining: see `fanout`
            if cut is None:
                raise ApiError(
                    f"session {sid!r} does not exist", status=404, code="unknown_session"
                )
            limits = api.limits
            feed = session_feed(
                api.store,
                watch,
                cut,
                after,
                turn_id=turn_id,
                page=limits.page,
                heartbeat=api.heartbeat,
            )
            stream = SseStream(request, watch, after_seq=after, limits=limits, metrics=api.metrics)
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
    """Pause the running turn with a prompt (SPEC §8)."""
    api = request.app[API]
    sid = request.match_info["sid"]
    refuse_reserved(request, sid)
    body: InterruptBody = validate(InterruptBody, await json_body(request))
    if body.payload is not None:
        validate(InterruptPayload, body.payload, "payload")
    await _owned_state(request, sid)
    reply = await api.client.interrupt(sid, body.reason, body.payload, timeout=api.request_timeout)
    return web.json_response(reply, status=202, dumps=compact_json)


async def post_cancel(request: web.Request) -> web.Response:
    """End the running turn; the body (`{reason?}`) may be left out."""
    api = request.app[API]
    sid = request.match_info["sid"]
    refuse_reserved(request, sid)
    raw = await json_body(request) if request.body_exists else {}
    body: CancelBody = validate(CancelBody, raw)
    await _owned_state(request, sid)
    reply = await api.client.cancel(sid, body.reason, timeout=api.request_timeout)
    return web.json_response(reply, status=202, dumps=compact_json)


async def delete_session(request: web.Request) -> web.Response:
    """Remove an idle session and all it stored; 409 `turn_running` while a turn runs."""
    sid = request.match_info["sid"]
    refuse_reserved(request, sid)
    await _owned_state(request, sid)
    await request.app[API].client.delete(sid)
    return web.Response(status=204)


async def post_settle(request: web.Request) -> web.Response:
    """Settle an async worker or client tool call from outside (SPEC §6)."""
    api = request.app[API]
    sid = request.match_info["sid"]
    refuse_reserved(request, sid)
    body: SettleBody = validate(SettleBody, await json_body(request))
    if body.error is not None and "result" in body.model_fields_set:
        raise ApiError(
            "result: give either result or error, not both", status=422, code="invalid_input"
        )
    full = principal_of(request).full
    if not full:
        await _owned_state(request, sid)
    reply = await api.client.settle(
        sid,
        body.id,
        client_only=not full,  # a scoped key answers its client tools, never a worker's call
        attempt=body.attempt,
        result=body.result,
        error=body.error,
        retryable=body.retryable,
        timeout=api.request_timeout,
    )
    return web.json_response(reply, status=202, dumps=compact_json)
