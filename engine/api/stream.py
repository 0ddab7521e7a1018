"""The session event stream over SSE: one writer per connection.

It reads a cut (snapshot and token deltas at one instant), writes the catch-up from the
log with the deltas of unfinished call attempts replayed, then the live frames the
shared reader (`fanout.Hub`) hands it, with a heartbeat when idle. A client that cannot
keep up is sent `stream.overflow` and dropped, so it costs nobody else.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from engine.api.fanout import Watch, stream_pos
from engine.errors import SubsError
from engine.jsonedge import compact_json
from engine.machine import SessionState
from engine.machine.events import CALL_ENDS, TURN_ENDS
from engine.metrics import Metrics
from engine.store.snapshots import load
from engine.store.store import Store

log = logging.getLogger("subs.api")


SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}
PING = b": ping\n\n"


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


@dataclass
class Cut:
    """A session's snapshot and token deltas read in one transaction: one instant."""

    seq: int
    state: SessionState
    deltas: list[dict[str, Any]]
    delta_cursor: str  # the delta stream's last id at the cut; "0-0" when empty


async def read_cut(store: Store, sid: str) -> Cut | None:
    """None when the session does not exist."""
    read = await store.read_cut(sid)
    if read is None:
        return None
    snap, deltas, cursor = read
    return Cut(snap.seq, await load(store, sid, snap), deltas, cursor)


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


async def session_feed(
    store: Store,
    watch: Watch,
    cut: Cut,
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


class SseStream:
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
        """Write the feed until it ends, the client leaves or it falls too far behind."""
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
