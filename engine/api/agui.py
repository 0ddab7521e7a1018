"""The AG-UI channel (notes: agui-facts): `POST /api/channels/ag-ui/agents/{agent}/run`
takes a `RunAgentInput` and answers the run as an SSE stream of AG-UI events;
`.../connect` replays a thread. Same keys as the client API.

A thread is a session and a run is a turn (`runId` is the turn id, so a repeated run
replays that turn instead of starting another). Frontend `tools` are the turn's
per-submit client tools: a run that calls one ends waiting for it, and the next run,
whose view carries the tool message, settles the call and streams the same turn on.
Everything refused is refused before the stream opens, as a plain HTTP error.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

from ag_ui.core import RunAgentInput
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from engine.api.agui_events import RunTranslator, snapshot, sse
from engine.api.errors import ApiError
from engine.api.fanout import Watch
from engine.api.parsing import json_body, validate
from engine.api.sessions import refuse_reserved
from engine.api.state import API, ApiState, principal_of
from engine.api.stream import PING, SSE_HEADERS
from engine.machine import SessionState
from engine.machine.tree import match_view, path_to
from engine.messages import text_of
from engine.store.snapshots import load_state

PREFIX = "/api/channels/ag-ui/agents/{agent_id}"
_MAX_ID = 200  # as the client API's session ids


class ConnectBody(BaseModel):
    """`connect`'s body: upstream reads only `threadId`."""

    model_config = ConfigDict(extra="allow")

    threadId: str = Field(min_length=1, max_length=_MAX_ID)
    runId: str | None = Field(default=None, min_length=1, max_length=_MAX_ID)


# -- input ------------------------------------------------------------------------------


def _run_input(body: Any) -> RunAgentInput:
    run: RunAgentInput = validate(RunAgentInput, body)
    for name, value in (("threadId", run.thread_id), ("runId", run.run_id)):
        if not 0 < len(value) <= _MAX_ID:
            raise ApiError(
                f"{name}: 1 to {_MAX_ID} characters", status=422, code="invalid_input", param=name
            )
    return run


def draft_messages(run: RunAgentInput) -> list[dict[str, Any]]:
    """The run's view as our DraftMessages, ids kept (reasoning and activity messages
    are the client's display of a reply: the tree keeps reasoning inside the reply)."""
    drafts: list[dict[str, Any]] = []
    for i, msg in enumerate(run.messages):
        raw = msg.model_dump(by_alias=True, exclude_none=True)
        role = raw["role"]
        if role in ("reasoning", "activity"):
            continue
        draft: dict[str, Any] = {"id": raw["id"], "role": "system" if role == "developer" else role}
        content = raw.get("content")
        if isinstance(content, list):
            if any(part.get("type") != "text" for part in content):
                raise ApiError(
                    f"messages.{i}.content: only text parts are supported",
                    status=422,
                    code="invalid_input",
                    param=f"messages.{i}.content",
                )
            content = text_of(content)
        if content is not None:
            draft["content"] = content
        if role == "assistant" and raw.get("toolCalls"):
            draft["tool_calls"] = [
                {"id": tc["id"], "type": "function", "function": tc["function"]}
                for tc in raw["toolCalls"]
            ]
        if role == "tool":
            draft["tool_call_id"] = raw["toolCallId"]
            if raw.get("error"):
                draft["error"] = raw["error"]
        drafts.append(draft)
    return drafts


def client_context(run: RunAgentInput) -> dict[str, Any]:
    """The run's tools, context, state and forwarded props as our ClientContext."""
    client: dict[str, Any] = {}
    tools = []
    for tool in run.tools or ():
        offered: dict[str, Any] = {"name": tool.name, "description": tool.description}
        if tool.parameters is not None:
            offered["input"] = tool.parameters
        tools.append(offered)
    if tools:
        client["tools"] = tools
    if run.context:
        client["context"] = [c.model_dump(by_alias=True) for c in run.context]
    if run.state is not None:
        client["state"] = run.state
    if run.forwarded_props is not None:
        client["forwarded_props"] = run.forwarded_props
    return client


def _results_for_open_calls(
    state: SessionState, drafts: list[dict[str, Any]]
) -> list[dict[str, Any]] | None:
    """The view's new messages when they are all tool messages answering the running
    turn's open client calls at the head: the run resumes that turn. Else None."""
    if state.turn is None:
        return None
    match = match_view(state.nodes, drafts)
    new = drafts[match.new_from :]
    waiting = {
        c.id
        for c in state.calls.values()
        if c.turn_id == state.turn.id and c.handler == "client" and c.kind == "tool"
    }
    if not new or match.known != state.head_id:
        return None
    if all(m["role"] == "tool" and m.get("tool_call_id") in waiting for m in new):
        return new
    return None


# -- the run ------------------------------------------------------------------------------


async def _owned(
    request: web.Request, api: ApiState, sid: str, agent_id: str
) -> SessionState | None:
    """The thread's session (None: a new one), refused when another key owns it or it
    runs another agent."""
    state = await load_state(api.store, sid)
    if state is None:
        return None
    if not principal_of(request).owns(state.identity):
        raise ApiError(f"thread {sid!r} belongs to another key", status=403, code="forbidden")
    if state.agent_id != agent_id:
        raise ApiError(
            f"thread {sid!r} runs agent {state.agent_id!r}, not {agent_id!r}",
            status=409,
            code="agent_mismatch",
        )
    return state


async def _turn_start(api: ApiState, sid: str, turn_id: str) -> int:
    """The seq just before turn `turn_id` started (a repeated run replays from there)."""
    after = 0
    while events := await api.store.read_log(sid, after, count=api.limits.page):
        for event in events:
            payload = event["payload"]
            if payload["type"] == "turn.started" and payload["turn_id"] == turn_id:
                return int(event["seq"]) - 1
        after = events[-1]["seq"]
    return after


async def post_run(request: web.Request) -> web.StreamResponse:
    """An AG-UI run: submits the run's input and streams the turn as AG-UI events."""
    api = request.app[API]
    agent_id = request.match_info["agent_id"]
    run = _run_input(await json_body(request))
    caller = api.take_stream_slot(request)
    try:
        # Joined before anything is read or submitted: every event past the seq the
        # session had when it was read (`joined`) reaches the watch.
        async with api.hub.watch(run.thread_id) as watch:
            translator, after, joined = await _begin(request, api, agent_id, run)
            resp = web.StreamResponse(headers=SSE_HEADERS)
            await resp.prepare(request)
            request.app[RUNS].add(watch)
            try:
                await _stream(api, resp, watch, translator, after, joined)
                await resp.write_eof()
            except (ConnectionError, TimeoutError):
                pass  # the client went away or stopped reading; the turn goes on
            finally:
                request.app[RUNS].discard(watch)
            return resp
    finally:
        api.free_stream_slot(caller)


async def _begin(
    request: web.Request, api: ApiState, agent_id: str, run: RunAgentInput
) -> tuple[RunTranslator, int, int]:
    """Apply the run's input: answers to interrupts, then either the tool results that
    resume a waiting turn or the view that starts one. Returns the run's translator, the
    seq its stream starts after, and the seq the session had when the watch had joined.
    Raises an ApiError (no stream yet) when refused."""
    sid = run.thread_id
    refuse_reserved(request, sid, "threadId")
    drafts = draft_messages(run)
    state = await _owned(request, api, sid, agent_id)
    after = joined = state.seq if state is not None else 0
    translator = RunTranslator(sid, run.run_id, None)
    if state is None and run.resume:
        raise ApiError(
            f"thread {sid!r} has no interrupt to resume", status=404, code="unknown_session"
        )
    for entry in run.resume or ():
        payload = {"status": entry.status, "payload": entry.payload}
        resume = {
            "type": "interrupt.resume",
            "interrupt_id": entry.interrupt_id,
            "payload": payload,
        }
        await api.client.submit(resume, session_id=sid, timeout=api.request_timeout)
    results = None if state is None else _results_for_open_calls(state, drafts)
    if state is not None and state.turn is not None and results is not None:
        for message in results:
            error = message.get("error")
            await api.client.settle(
                sid,
                message["tool_call_id"],
                result=None if error else message.get("content", ""),
                error=error,
                message_id=message["id"],
                client_only=not principal_of(request).full,
                timeout=api.request_timeout,
            )
        translator.turn_id = state.turn.id
        translator.client_calls |= {m["tool_call_id"] for m in results}
    elif state is not None and state.turn is not None and run.resume:
        translator.turn_id = state.turn.id  # the answered interrupt goes on with the turn
    elif drafts:
        inp: dict[str, Any] = {
            "type": "client.messages",
            "agent_id": agent_id,
            "messages": [{k: v for k, v in d.items() if k != "error"} for d in drafts],
            "turn_id": run.run_id,
            "client": client_context(run),
        }
        principal = principal_of(request)
        identity = principal.identity()
        reply = await api.client.submit(
            inp,
            session_id=sid,
            identity=identity,
            owner=None if principal.full else identity.get("subject"),
            traceparent=request.headers.get("traceparent"),
            tracestate=request.headers.get("tracestate"),
            timeout=api.request_timeout,
        )
        translator.turn_id = reply["turn_id"]
        if reply.get("existing"):
            after = await _turn_start(api, sid, reply["turn_id"])
    return translator, after, joined


async def _write(resp: web.StreamResponse, api: ApiState, frames: list[bytes]) -> None:
    if frames:
        async with asyncio.timeout(api.limits.write_timeout):
            await resp.write(b"".join(frames))


async def _stream(
    api: ApiState,
    resp: web.StreamResponse,
    watch: Watch,
    translator: RunTranslator,
    after: int,
    joined: int,
) -> None:
    """RUN_STARTED, the turn's events past `after` as AG-UI events, then its end: the
    turn's end, or the turn waiting for the client (its tools, an interrupt)."""
    sid = translator.thread_id
    await _write(resp, api, [sse(e) for e in translator.started()])
    if translator.turn_id is None:
        await _write(resp, api, [sse(e) for e in translator.finished_idle()])
        return
    # Catch-up: what the log held before the watch joined (a repeated run's turn); all
    # later comes through the watch, token deltas with it.
    seen = after
    while seen < joined and not translator.done:
        events = await api.store.read_log(sid, seen, count=min(api.limits.page, joined - seen))
        if not events:
            break
        seen = events[-1]["seq"]
        await _write(resp, api, [sse(e) for e in translator.feed(events, [])])
    seen = max(seen, joined)
    pause_at: int | None = None
    while not translator.done:
        if pause_at is None and (translator.open_client_calls or translator.interrupted):
            pause_at = await _paused_at(api, translator)
        if pause_at is not None and seen >= pause_at:
            state = await load_state(api.store, sid)
            assert state is not None
            pending = sorted(translator.open_client_calls)
            out = translator.paused(pending, list(state.interrupts.values()))
            await _write(resp, api, [sse(e) for e in out])
            return
        try:
            async with asyncio.timeout(api.heartbeat):
                batch = await watch.take()
        except TimeoutError:
            await _write(resp, api, [PING])
            pause_at = None  # look again: a quiet turn may be the one waiting
            continue
        if not batch:
            reason = watch.ended or "the event stream ended"
            out = translator.failed(f"{reason}; connect again to see the thread", "internal")
            await _write(resp, api, [sse(e) for e in out])
            return
        events = [f.item for f in batch if f.kind == "event" and f.item["seq"] > seen]
        deltas = [f.item for f in batch if f.kind == "delta"]
        if events:
            seen = events[-1]["seq"]
            pause_at = None
        await _write(resp, api, [sse(e) for e in translator.feed(events, deltas)])


def waiting_for_client(state: SessionState) -> tuple[list[str], list[dict[str, Any]]] | None:
    """What the running turn waits on the client for, if that is all it waits on: its
    open client tool calls (nothing else in flight), or its open interrupts."""
    turn = state.turn
    if turn is None or state.decision is not None or state.pending:
        return None
    if state.interrupts:
        return [], [dict(i) for i in state.interrupts.values()]
    open_calls = [c for c in state.calls.values() if c.turn_id == turn.id]
    if open_calls and all(c.handler == "client" for c in open_calls):
        return sorted(c.id for c in open_calls), []
    return None


async def _paused_at(api: ApiState, translator: RunTranslator) -> int | None:
    """The seq at which the run's turn waits for the client, if it does. The run ends
    once the client has been sent everything up to there."""
    state = await load_state(api.store, translator.thread_id)
    if state is None or state.turn is None or state.turn.id != translator.turn_id:
        return None
    waiting = waiting_for_client(state)
    if waiting is None:
        return None
    translator.open_client_calls = set(waiting[0])
    translator.client_calls |= translator.open_client_calls
    return state.seq


# -- connect ------------------------------------------------------------------------------


async def post_connect(request: web.Request) -> web.StreamResponse:
    """Replay a thread: RUN_STARTED, MESSAGES_SNAPSHOT of its active branch, RUN_FINISHED
    (with what the thread's turn waits on the client for, as the run that paused it said)."""
    api = request.app[API]
    body: ConnectBody = validate(ConnectBody, await json_body(request))
    sid = body.threadId
    state = await _owned(request, api, sid, request.match_info["agent_id"])
    if state is None:
        raise ApiError(f"thread {sid!r} does not exist", status=404, code="unknown_session")
    translator = RunTranslator(sid, body.runId or f"run_{secrets.token_hex(8)}", None)
    events = [*translator.started(), snapshot(path_to(state.nodes, state.head_id))]
    waiting = waiting_for_client(state)
    events += translator.finished_idle() if waiting is None else translator.paused(*waiting)
    resp = web.StreamResponse(headers=SSE_HEADERS)
    await resp.prepare(request)
    await resp.write(b"".join(sse(e) for e in events))
    await resp.write_eof()
    return resp


RUNS: web.AppKey[set[Watch]] = web.AppKey("subs_agui_runs")


async def _end_runs(app: web.Application) -> None:
    """The server is stopping: each open run ends now, with RUN_ERROR saying why."""
    runs: set[Watch] = app[RUNS]
    for watch in list(runs):
        watch.end("the server is shutting down")


def install(app: web.Application) -> None:
    """The channel's routes and the hook that ends open runs at shutdown."""
    app[RUNS] = set()
    app.on_shutdown.append(_end_runs)
    router = app.router
    router.add_post(PREFIX + "/run", post_run)
    router.add_post(PREFIX + "/connect", post_connect)
