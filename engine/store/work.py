"""Partition work: each partition's work stream (inputs for its owner), the answers pushed
back to submitters, timers, the outbox to other sessions, and the leases that say who owns
a partition."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import orjson
from redis.asyncio.connection import AbstractConnection
from redis.commands.core import AsyncScript
from redis.exceptions import (
    ResponseError,
)

from engine.jsonedge import encode
from engine.store.connection import PackedConnections, lua_script, unblocked
from engine.store.keys import Keys
from engine.store.streams import Entries

GROUP = "engine"


ACQUIRE_SCRIPT = lua_script(__package__, "acquire.lua")


RENEW_SCRIPT = lua_script(__package__, "renew.lua")


RELEASE_SCRIPT = lua_script(__package__, "release.lua")


@dataclass(frozen=True)
class WorkItem:
    """One input read off a work stream (or made in process), with where to answer it."""

    entry_id: str | None  # None for in-process completions
    session_id: str
    input: dict[str, Any]
    reply_to: str | None = None
    timer_member: str | None = None
    deliveries: int = 1  # times the work stream handed this entry to an engine
    deltas: tuple[dict[str, Any], ...] = ()  # a call's last token deltas, written with its end


class PartitionWork(Keys, PackedConnections):
    """A partition's inputs, timers, outbox and lease."""

    _acquire: AsyncScript
    _release: AsyncScript
    _readers: dict[int, AbstractConnection]  # each partition's work reader

    async def ensure_group(self, p: int) -> None:
        """Create the partition's consumer group, once; an existing one is fine."""
        try:
            await self.redis.xgroup_create(self.work_key(p), GROUP, id="0", mkstream=True)
        except ResponseError as err:
            if "BUSYGROUP" not in str(err):
                raise

    async def enqueue(self, session_id: str, inp: dict[str, Any], reply_to: str | None) -> str:
        """Put an input on its session's partition's work stream; its entry id."""
        body = {"sid": session_id, "input": inp, "reply_to": reply_to}
        p = self.partition_of(session_id)
        entry = cast(bytes, await self.redis.xadd(self.work_key(p), {"w": encode(body)}))
        return entry.decode()

    async def wait_reply(self, reply_to: str, timeout: float) -> bytes | None:
        """The engine's answer pushed on `reply_to` (see `enqueue`); None after `timeout` s.

        A wait its master ended by becoming a replica (a failover) popped nothing: it
        waits on, at the slot's new master, for the time left."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            try:
                answer = cast(
                    tuple[bytes, bytes] | None,
                    await self.redis.blpop([reply_to], timeout=max(deadline - loop.time(), 0.01)),
                )
            except ResponseError as err:
                if not unblocked(err) or loop.time() >= deadline:
                    raise
                continue
            return None if answer is None else answer[1]

    async def request(
        self, session_id: str, inp: dict[str, Any], reply_to: str, timeout: float
    ) -> bytes | None:
        """`enqueue`, then `wait_reply`. On one server both commands go in one write on a
        connection of the pool, packed here: a submit is on every turn's path, and redis-py's
        command layer and the second round trip cost ~0.1 ms of CPU a submit (measured).
        The server runs them in order, as before; any failure raises, as redis-py's did
        (its connections retry nothing), and drops the connection. On a cluster, the two
        calls (a failover ends a wait there, and the wait goes on at the new master)."""
        if self.cluster is not None:
            await self.enqueue(session_id, inp, reply_to)
            return await self.wait_reply(reply_to, timeout)
        body = {"sid": session_id, "input": inp, "reply_to": reply_to}
        work = self.work_key(self.partition_of(session_id))
        xadd = [b"XADD", work, b"*", b"w", encode(body)]
        blpop = [b"BLPOP", reply_to, max(timeout, 0.01)]
        conn = await self._connection(work)
        try:
            _, answer = await self._ask(conn, [xadd, blpop])
        except BaseException as err:  # a cancel in the wait included: its answer may come
            await self._put_back(conn, err)
            raise
        await self._put_back(conn, None)
        return None if answer is None else cast(list[bytes], answer)[1]

    @staticmethod
    def _parse_work(entry_id: bytes, raw: bytes | None) -> WorkItem | None:
        """An entry's `w` field; None when the entry was trimmed."""
        if raw is None:
            return None  # trimmed under us: nothing left to apply
        body = orjson.loads(raw)
        return WorkItem(entry_id.decode(), body["sid"], body["input"], body.get("reply_to"))

    async def read_work(
        self, p: int, consumer: str, *, block_ms: int, count: int = 64, own: bool = False
    ) -> list[WorkItem]:
        """New entries of the partition's work stream; with `own`, instead, those already
        handed to `consumer` and not acked (a read whose answer was lost on the way).

        On the partition's own connection, packed here, as the commit is: one reader a
        partition, so it is never shared; the pool's checkout and redis-py's command
        layer were ~4% of the engine's CPU per step. Any failure (a cancel while
        blocked included: its answer would be left unread) drops the connection.
        """
        read = [b"COUNT", count, b"BLOCK", block_ms] if not own else []
        command = [b"XREADGROUP", b"GROUP", GROUP, consumer, *read]
        command += [b"STREAMS", self.work_key(p), b"0" if own else b">"]
        conn = self._readers.pop(p, None) or await self._connection(self.work_key(p))
        try:
            (reply,) = await self._ask(conn, [command])
        except BaseException as err:
            await self._put_back(conn, err)
            if unblocked(err):  # a failover ended the read, handing out nothing
                return []
            raise
        self._readers[p] = conn
        streams = reply.values() if isinstance(reply, dict) else [e for _, e in reply or ()]
        items = []
        for entries in streams:
            for entry_id, fields in entries:  # fields: flat pairs, none when trimmed
                w = dict(zip(fields[::2], fields[1::2], strict=True)).get(b"w") if fields else None
                item = self._parse_work(entry_id, w)
                if item is not None:
                    items.append(item)
        return items

    async def committed_seq(self, session_id: str) -> int:
        """The seq the session's snapshot reflects: did a commit whose answer was lost land?"""
        seq = await self.redis.hget(self.snap_key(session_id), "seq")
        return int(seq or 0)

    async def claim_pending(self, p: int, consumer: str) -> list[WorkItem]:
        """Take over every pending entry of the partition (its previous owner is gone).

        Each item carries how often the stream has handed it out: an input that
        takes its engine down with it comes back here every time.
        """
        counts = {
            entry["message_id"]: int(entry["times_delivered"])
            for entry in await self.redis.xpending_range(self.work_key(p), GROUP, "-", "+", 10_000)
        }
        items: list[WorkItem] = []
        start = "0-0"
        while True:
            reply = await self.redis.xautoclaim(
                self.work_key(p), GROUP, consumer, min_idle_time=0, start_id=start, count=100
            )
            start, entries = reply[0], reply[1]
            for entry_id, fields in entries:
                item = self._parse_work(entry_id, fields.get(b"w") if fields else None)
                if item is not None:
                    # The claim itself is one more delivery.
                    deliveries = counts.get(entry_id, 0) + 1
                    items.append(dataclasses.replace(item, deliveries=deliveries))
            if start in (b"0-0", "0-0"):
                return items

    async def inflight_sessions(self, p: int) -> list[str]:
        """Sessions of the partition with effects out when their engine stopped."""
        members = cast(set[bytes], await self.redis.smembers(self.inflight_key(p)))
        return [s.decode() for s in members]

    async def outbox(self, p: int) -> list[tuple[str, str]]:
        """What commits left for after them, not yet handed over: (id, item), in order."""
        entries = cast(Entries, await self.redis.xrange(self.outbox_key(p)))
        return [
            (entry_id.decode(), (fields.get(b"m") or b"").decode()) for entry_id, fields in entries
        ]

    async def outbox_done(self, p: int, entry_id: str) -> None:
        """A message handed over: drop it from the outbox."""
        await self.redis.xdel(self.outbox_key(p), entry_id)

    async def outbox_dead(self, p: int, entry_id: str, letter: dict[str, Any]) -> None:
        """An outbox entry no relay can hand over: to the partition's dead-letter stream
        (as the commit keeps an input no transition could take), out of the outbox, at
        once (both keys are the partition's: one slot)."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.xadd(self.dead_key(p), {"d": orjson.dumps(letter)}, maxlen=10_000)
            pipe.xdel(self.outbox_key(p), entry_id)
            await pipe.execute()

    async def due_timers_all(self, partitions: list[int], now_ms: int) -> list[str]:
        """Due timers of several partitions in one round trip. Asked every `timer_poll_ms`,
        busy or idle: on one server the reads are packed here on a connection of the pool,
        as the commit's are (redis-py's pipeline cost ~0.2 ms of CPU a poll, measured); on a
        cluster the pipeline sends each partition's read to its own master."""
        if self.cluster is not None or not partitions:
            async with self.redis.pipeline(transaction=False) as pipe:
                for p in partitions:
                    pipe.zrangebyscore(self.timers_key(p), "-inf", now_ms, 0, 100)
                replies = await pipe.execute()
        else:
            commands = [
                [b"ZRANGEBYSCORE", self.timers_key(p), b"-inf", now_ms, b"LIMIT", 0, 100]
                for p in partitions
            ]
            conn = await self._connection(self.timers_key(partitions[0]))
            try:
                replies = await self._ask(conn, commands)
            except BaseException as err:
                await self._put_back(conn, err)  # answers may be left unread on it
                raise
            await self._put_back(conn, None)
        return [m.decode() for members in replies for m in members]

    async def acquire(self, p: int, owner: str, ttl_ms: int) -> str | None:
        """Take the partition's lease if free; the fenced lease value, or None."""
        value = await self._acquire(
            keys=[self.lease_key(p), self.fence_key(p)], args=[owner, ttl_ms]
        )
        return value.decode() if value else None

    async def renew(self, leases: Mapping[int, str], ttl_ms: int) -> list[int]:
        """Renew several partitions' leases in one round trip (a busy process still renews
        them all in time); returns the partitions whose lease is no longer ours."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for p, lease in leases.items():  # EVAL, not EVALSHA: a pipeline cannot reload it
                pipe.eval(RENEW_SCRIPT, 1, self.lease_key(p), lease, ttl_ms)
            renewed = await pipe.execute()
        return [p for p, ok in zip(leases, renewed, strict=True) if not ok]

    async def release(self, p: int, lease: str) -> None:
        """Give the lease up, if it is still ours."""
        await self._release(keys=[self.lease_key(p)], args=[lease])

    async def heartbeat(self, owner: str, until_ms: int, now_ms: int) -> int:
        """Register this engine; returns how many engines are alive."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zadd("subs:engines", {owner: until_ms})
            pipe.zremrangebyscore("subs:engines", "-inf", now_ms)
            pipe.zcard("subs:engines")
            _, _, live = await pipe.execute()
        return int(live)

    async def leave(self, owner: str) -> None:
        """This engine stops: no longer counted among the live ones."""
        await self.redis.zrem("subs:engines", owner)
