"""Reading sessions as they grow: a log's end, its token deltas, one instant of a session, and
following many sessions (or one, on a held connection) with blocking reads."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, cast

import orjson
from redis.exceptions import (
    ResponseError,
)
from redis.typing import KeyT, StreamIdT

from engine.jsonedge import encode
from engine.store.connection import PackedConnections, unblocked
from engine.store.keys import Keys

# The shapes of the replies this module reads. The client is made with
# decode_responses off, so Redis strings arrive as bytes; redis-py's stubs type each
# reply for either setting (`bytes | str`), so each read names the shape it gets.
Entries = list[tuple[bytes, dict[bytes, bytes]]]  # XRANGE / XREVRANGE


StreamsReply = list[tuple[bytes, Entries]]  # XREAD


DELTA_CAP = 2000


FOLLOW_FAULTS = 12  # reads in a row a follow retries on a cluster failing over (~8 s)


class SessionStreams(Keys, PackedConnections):
    """A session's log and delta stream, read as they grow; token deltas written."""

    async def last_seq(self, session_id: str) -> int:
        """The seq of the session's newest event; 0 for a session not yet created."""
        last = cast(Entries, await self.redis.xrevrange(self.log_key(session_id), count=1))
        return int(last[0][0].split(b"-")[0]) if last else 0

    async def delta_cursor(self, session_id: str) -> str:
        """The delta stream's newest id ("0-0" when empty): follow from here to miss nothing."""
        last = cast(Entries, await self.redis.xrevrange(self.delta_key(session_id), count=1))
        return last[0][0].decode() if last else "0-0"

    async def stream_ends(self, session_ids: Sequence[str]) -> list[tuple[str, str]]:
        """Where each session's log and delta stream end now ("0-0" when empty): a tail
        started there misses nothing committed afterwards."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for sid in session_ids:
                pipe.xrevrange(self.log_key(sid), count=1)
                pipe.xrevrange(self.delta_key(sid), count=1)
            replies = await pipe.execute()
        ends = [reply[0][0].decode() if reply else "0-0" for reply in replies]
        return list(zip(ends[::2], ends[1::2], strict=True))

    async def read_tails(
        self, cursors: Mapping[str, tuple[str, str]], block_ms: int
    ) -> list[tuple[str, str, str, dict[str, Any]]]:
        """What many sessions' logs and delta streams gained after `{sid: (log id, delta id)}`,
        in one blocking XREAD: `(sid, "event" | "delta", entry id, item)`.

        Within a session its deltas come first: a call's deltas are written before the
        event that ends it. On Redis Cluster, all the sessions must share a partition.
        """
        streams: dict[KeyT, StreamIdT] = {}
        owners: dict[bytes, tuple[str, str]] = {}
        for sid, (log_at, delta_at) in cursors.items():
            delta_key, log_key = self.delta_key(sid), self.log_key(sid)
            streams[delta_key] = delta_at
            streams[log_key] = log_at
            owners[delta_key.encode()] = (sid, "delta")
            owners[log_key.encode()] = (sid, "event")
        try:
            reply = cast(StreamsReply | None, await self.redis.xread(streams, block=block_ms))
        except ResponseError as err:
            if not unblocked(err):
                raise
            return []  # a failover ended the read: the caller reads again from its cursors
        out = []
        for key, entries in reply or ():
            sid, kind = owners[key]
            field = b"e" if kind == "event" else b"d"
            for entry_id, fields in entries:
                out.append((sid, kind, entry_id.decode(), orjson.loads(fields[field])))
        return out

    async def follow(
        self, session_id: str, after_seq: int, delta_cursor: str | None, block_ms: int
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """The session's events after `after_seq` (and its token deltas after
        `delta_cursor`, when given) as they come, forever: `("event" | "delta", item)`.

        Blocking XREADs, packed here, on one connection held for the whole follow: a
        follower reads once per step, and the pool's checkout and redis-py's command
        layer were most of its CPU. Within a read deltas come first: a call's deltas
        are written before the event that ends it.
        """
        log_key = self.log_key(session_id).encode()
        cursors: dict[bytes, bytes] = {}
        if delta_cursor is not None:
            cursors[self.delta_key(session_id).encode()] = delta_cursor.encode()
        cursors[log_key] = f"{after_seq}-0".encode()
        conn = await self._connection(self.log_key(session_id))
        reading = False
        failure: BaseException | None = None
        faults = 0  # in a row: a cluster failing over is waited out, for a while
        try:
            while True:
                read = [b"XREAD", b"BLOCK", block_ms, b"STREAMS", *cursors, *cursors.values()]
                reading = True
                try:
                    (reply,) = await self._ask(conn, [read])
                except Exception as err:
                    if not self._failing_over(err) or faults >= FOLLOW_FAULTS:
                        raise
                    reading = False
                    await self._put_back(conn, err)
                    await asyncio.sleep(min(0.05 * 2**faults, 1.0))  # the backoff
                    faults += 1
                    conn = await self._connection(self.log_key(session_id))
                    continue
                reading = False
                faults = 0
                for key, entries in reply.items() if isinstance(reply, dict) else reply or ():
                    kind, field = ("event", b"e") if key == log_key else ("delta", b"d")
                    for entry_id, fields in entries:
                        cursors[key] = entry_id
                        yield kind, orjson.loads(fields[fields.index(field) + 1])
        except Exception as err:  # the read failed (a fault): the connection goes
            failure = err
            raise
        finally:
            # A cancel in the read: its answer may still come, so the connection cannot
            # be reused. Closed between reads (at a yield), it can.
            if reading and failure is None:
                failure = asyncio.CancelledError()
            await self._put_back(conn, failure)

    async def add_deltas(self, session_id: str, deltas: Sequence[dict[str, Any]]) -> None:
        """One XADD per delta, all in one write, packed here: a streamed model call writes
        one of these per batch of tokens, and redis-py's pipeline spent ~60 µs of CPU per
        command encoding them (a call's last deltas held its end back by ~2 ms)."""
        xadds = self._delta_xadds(session_id, deltas)
        conn = await self._connection(self.delta_key(session_id))
        try:
            await self._ask(conn, xadds)
        except BaseException as err:
            await self._put_back(conn, err)  # answers may be left unread on it
            raise
        await self._put_back(conn, None)

    def _delta_xadds(self, session_id: str, deltas: Sequence[dict[str, Any]]) -> list[list[Any]]:
        key = self.delta_key(session_id).encode()
        return [
            [b"XADD", key, b"MAXLEN", b"~", DELTA_CAP, b"*", b"d", encode(delta)]
            for delta in deltas
        ]
