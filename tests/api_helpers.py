"""The HTTP API on a real port, and readers for its event streams."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
from aiohttp import web
from httpx_sse import EventSource, ServerSentEvent, aconnect_sse

ROOT, ALICE, BOB = "root-key", "alice-key", "bob-key"
KEYS_ENV = {"SUBS_API_KEYS": f"{ROOT}, {ALICE}:own,{BOB}:own"}
INPUT = "/api/client/sessions/input"


def auth(key: str | None) -> dict[str, str]:
    return {} if key is None else {"Authorization": f"Bearer {key}"}


def stream_path(sid: str) -> str:
    return f"/api/client/sessions/{sid}/events/stream"


@contextlib.asynccontextmanager
async def serve(app: web.Application) -> AsyncIterator[str]:
    """Run `app` on 127.0.0.1, port 0, the way a deployment would (handlers are
    cancelled when their client hangs up); yields the base url."""
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=2)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def sse_frames(source: EventSource) -> AsyncIterator[ServerSentEvent]:
    """The frames a browser's EventSource would dispatch. httpx-sse 0.4 also dispatches
    a block with no data once any event had an `id:` (the id is sticky), so each `: ping`
    after an event came out as a `message` frame with empty data: the spec dispatches
    nothing for a block whose data buffer is empty (WHATWG HTML, "dispatch the event",
    step 2; florimondmanca/httpx-sse issue #35). Our server sends no data-less frame."""
    async for frame in source.aiter_sse():
        if frame.data == "" and frame.event == "message":
            continue
        yield frame


async def read_stream(
    http: httpx.AsyncClient,
    sid: str,
    *,
    key: str | None = ROOT,
    params: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    stop: Callable[[ServerSentEvent], bool] | None = None,
    timeout: float = 15.0,
    path: str | None = None,
) -> list[ServerSentEvent]:
    """Frames of one connection until the server ends it or `stop(frame)` is true
    (then the client hangs up)."""
    frames: list[ServerSentEvent] = []
    async with asyncio.timeout(timeout):
        async with aconnect_sse(
            http,
            "GET",
            path or stream_path(sid),
            params=params,
            headers={**auth(key), **(headers or {})},
        ) as source:
            assert source.response.status_code == 200, await source.response.aread()
            async for frame in sse_frames(source):
                frames.append(frame)
                if stop is not None and stop(frame):
                    break
    return frames


def events_of(frames: list[ServerSentEvent]) -> list[dict[str, Any]]:
    """The log events among the frames (token deltas and control frames left out)."""
    out = []
    for frame in frames:
        if frame.event in ("llm.token.delta", "stream.overflow"):
            continue
        event = frame.json()
        assert frame.id == str(event["seq"]) and frame.event == event["payload"]["type"]
        out.append(event)
    return out


def deltas_of(frames: list[ServerSentEvent], call_id: str) -> list[dict[str, Any]]:
    deltas = (f.json() for f in frames if f.event == "llm.token.delta")
    return [d for d in deltas if d["call_id"] == call_id]


def of_type(kind: str) -> Callable[[ServerSentEvent], bool]:
    return lambda frame: frame.event == kind
