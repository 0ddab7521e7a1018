"""Event-stream fan-out: one Redis reader per partition, shared by every watcher.

A watched session has a tap: where its log and delta stream have been read up
to, and the watchers to hand new frames to. One task per partition tails all
that partition's taps in one blocking XREAD over many keys (they share the
partition's hash slot, so this holds on Redis Cluster too). Each entry read is
encoded once and appended to every watcher's bounded buffer without waiting, so
open streams cost the API at most one blocking connection per partition, and a
watcher whose buffer fills is dropped (told why) instead of slowing the others.

A watcher joins before it reads its catch-up cut, and a tap is positioned before
any watcher of it may read one, so the cut is never older than the first frame
the watcher is handed: what it reads both ways it drops by seq (events) or by
delta stream id (deltas).

Bounded: a tap lives only while a watcher holds it (at most one per open stream, which
`[serve] max_streams` bounds), and a session this process deletes or archives loses its tap
at once (the store's removal hook), its watchers told why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.store.store import STORE_FAULTS, Store

log = logging.getLogger("subs.fanout")

Encode = Callable[[str, Mapping[str, Any]], bytes]


def stream_pos(entry_id: str) -> tuple[int, int]:
    """A stream entry id as comparable numbers: "12-0" -> (12, 0)."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


@dataclass(frozen=True, slots=True)
class Frame:
    """One log event or token delta as the tap read it, encoded once for every watcher."""

    kind: str  # "event" | "delta"
    item: dict[str, Any]
    wire: bytes
    pos: tuple[int, int]  # its stream entry id; an event's is (seq, 0)


class Watch:
    """One watcher's live frames: everything its tap reads after the watcher joined.

    The tap never waits on it: past `limit` unread frames the watch ends as
    overflowed, keeping what it holds (all in order) for the reader to finish.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.ended: str | None = None  # why no more frames will come
        self.overflowed = False
        self._frames: deque[Frame] = deque()
        self._more = asyncio.Event()

    def push(self, frame: Frame) -> bool:
        """Buffer a frame; False once the watch has ended (here, when its buffer was full)."""
        if self.ended is not None:
            return False
        if len(self._frames) >= self.limit:
            self.end(f"the client fell {self.limit} frames behind the live stream", overflowed=True)
            return False
        self._frames.append(frame)
        self._more.set()
        return True

    def end(self, reason: str, overflowed: bool = False) -> None:
        """No more frames: the reader finishes what is buffered; the first reason given stays."""
        if self.ended is None:
            self.ended, self.overflowed = reason, overflowed
            self._more.set()

    async def take(self) -> list[Frame]:
        """Every frame buffered, once there is one (one socket write for a burst); []
        once the watch has ended and its buffer is empty."""
        while not self._frames:
            if self.ended is not None:
                return []
            self._more.clear()
            await self._more.wait()
        frames = list(self._frames)
        self._frames.clear()
        return frames


@dataclass(eq=False)
class _Tap:
    """A watched session: its read position and its watchers."""

    sid: str
    log_at: str = ""  # "" until positioned
    delta_at: str = ""
    watches: set[Watch] = field(default_factory=set)
    positioned: asyncio.Event = field(default_factory=asyncio.Event)
    failure: str | None = None

    def deliver(self, kind: str, entry_id: str, item: dict[str, Any], encode: Encode) -> None:
        if kind == "event":
            self.log_at = entry_id
        else:
            self.delta_at = entry_id
        frame = Frame(kind, item, encode(kind, item), stream_pos(entry_id))
        for watch in [w for w in self.watches if not w.push(frame)]:
            self.watches.discard(watch)

    def close(self, reason: str, failure: str | None = None) -> None:
        """No more frames: end every watch and release whoever waits to join."""
        self.failure = failure
        self.positioned.set()
        for watch in self.watches:
            watch.end(reason)
        self.watches.clear()


class _Reader:
    """One partition's taps, tailed by one task in one blocking XREAD."""

    def __init__(self, hub: Hub, p: int) -> None:
        self.hub = hub
        self.p = p
        self.taps: dict[str, _Tap] = {}
        self.reading = False  # in the blocking read: a restart must interrupt it
        self.restarting = False
        self.task = asyncio.create_task(self._run(), name=f"subs-fanout-{p}")

    def restart(self) -> None:
        """A tap joined or the last one left: interrupt the read in flight (its connection
        is dropped and remade), so the next read covers exactly the current taps."""
        if self.reading and not self.restarting:
            self.restarting = True
            self.task.cancel()

    async def _run(self) -> None:
        try:
            while self.taps:
                fresh = [tap for tap in self.taps.values() if not tap.positioned.is_set()]
                if fresh:
                    ends = await self.hub.store.stream_ends([tap.sid for tap in fresh])
                    for tap, (log_at, delta_at) in zip(fresh, ends, strict=True):
                        tap.log_at, tap.delta_at = log_at, delta_at
                        tap.positioned.set()
                    continue  # more may have joined meanwhile
                tailed = dict(self.taps)
                cursors = {sid: (tap.log_at, tap.delta_at) for sid, tap in tailed.items()}
                self.reading = True
                try:
                    entries = await self.hub.store.read_tails(cursors, self.hub.block_ms)
                except asyncio.CancelledError:
                    # A restart, unless we are cancelled too (the hub is closing).
                    task = asyncio.current_task()
                    if not self.restarting or (task is not None and task.uncancel() > 0):
                        raise
                    continue  # unread entries stay past the cursors: the next read has them
                finally:
                    self.reading = self.restarting = False
                for sid, kind, entry_id, item in entries:
                    tailed[sid].deliver(kind, entry_id, item, self.hub.encode)
        except Exception as err:
            if isinstance(err, STORE_FAULTS):  # Redis went away (a restart): no bug of ours
                log.warning(
                    "the event-stream reader of partition %d lost Redis (%s: %s); its %d "
                    "watched sessions' streams end, told to reconnect",
                    self.p,
                    type(err).__name__,
                    err,
                    len(self.taps),
                )
            else:
                log.exception("the event-stream reader of partition %d failed", self.p)
            reason = f"the event feed broke ({type(err).__name__}); reconnect to resume"
            for tap in self.taps.values():
                tap.close(reason, failure=reason)
            self.taps.clear()
        finally:
            if self.hub.readers.get(self.p) is self:
                del self.hub.readers[self.p]


class Hub:
    """This process's readers of watched sessions, one per partition with watchers."""

    def __init__(self, store: Store, encode: Encode, *, block_ms: int = 5000, buffer: int = 256):
        self.store = store
        self.encode = encode
        self.block_ms = block_ms
        self.buffer = buffer  # frames a watcher may hold unread before it is dropped
        self.readers: dict[int, _Reader] = {}
        self.closed = False
        # Weakly: a hub nobody closed (an app never cleaned up) is not kept alive by the hook.
        ref = weakref.ref(self)

        def forget(sid: str) -> None:
            hub = ref()
            if hub is not None:
                hub.forget(sid)

        self._on_removal = forget
        store.removals.watch(forget)

    def taps(self) -> int:
        """How many sessions are watched now (one tap each)."""
        return sum(len(reader.taps) for reader in self.readers.values())

    def forget(self, sid: str) -> None:
        """The session was deleted or archived: end its watches (their streams end, told
        why) and drop its tap now, not when its last client leaves."""
        reader = self.readers.get(self.store.partition_of(sid))
        tap = reader.taps.pop(sid, None) if reader is not None else None
        if reader is None or tap is None:
            return
        tap.close(_REMOVED)
        reader.restart()  # the read in flight names the tap: the next one does not

    @contextlib.asynccontextmanager
    async def watch(self, sid: str) -> AsyncIterator[Watch]:
        """Join a session's fan-out; once this yields, the tap is positioned, so a cut
        read now is at or past where the watch's frames begin.

        Raises:
            ConnectionError: the partition's reader failed before the tap was positioned.
        """
        watch = Watch(self.buffer)
        if self.closed:
            watch.end(_SHUTDOWN)
            yield watch
            return
        tap, reader = self._tap(sid)
        tap.watches.add(watch)
        try:
            await tap.positioned.wait()
            if tap.failure is not None:
                raise ConnectionError(tap.failure)
            yield watch
        finally:
            watch.end("the stream closed")
            tap.watches.discard(watch)
            if not tap.watches and reader.taps.get(sid) is tap:
                del reader.taps[sid]
                if not reader.taps:
                    reader.restart()  # no one left: end the read and the task now

    def _tap(self, sid: str) -> tuple[_Tap, _Reader]:
        p = self.store.partition_of(sid)
        reader = self.readers.get(p)
        if reader is None:
            reader = self.readers[p] = _Reader(self, p)
        tap = reader.taps.get(sid)
        if tap is None:
            tap = reader.taps[sid] = _Tap(sid)
            reader.restart()
        return tap, reader

    async def aclose(self) -> None:
        """End every watch and stop every reader (the server is shutting down)."""
        self.closed = True
        self.store.removals.unwatch(self._on_removal)
        readers = list(self.readers.values())
        for reader in readers:
            for tap in reader.taps.values():
                tap.close(_SHUTDOWN)
            reader.task.cancel()
        for reader in readers:
            with contextlib.suppress(asyncio.CancelledError):
                await reader.task


_SHUTDOWN = "the server is shutting down"
_REMOVED = "the session was deleted or archived"
