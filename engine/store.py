"""Redis persistence: session logs, snapshots, partitioned work, leases, timers, deltas.

Every key of a session carries its partition's hash tag `{p}`, so one Lua
script commits a transition atomically (also on Redis Cluster). A session log
is a stream whose entry ids are `<seq>-0`: the client-visible `seq` is the
stream id. See DESIGN.md "Storage on Redis".
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from typing import Any, NewType

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from .durability import ReplicaWait
from .errors import SubsError

SessionId = NewType("SessionId", str)

GROUP = "engine"
DEFAULT_PARTITIONS = 16
DELTA_CAP = 2000


def connect(url: str, max_connections: int = 1024) -> aioredis.Redis:
    """A client for the engine's use.

    No socket read timeout: blocking stream reads wait on purpose (redis-py's
    default of 5 s would cut them off). A blocking pool: each event-stream
    watcher and each waiting submit holds a connection, and past the cap a
    caller should wait for one, not fail.
    """
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=30,
        socket_timeout=None,
        socket_connect_timeout=10,
    )
    return aioredis.Redis.from_pool(pool)


class StoreConflict(SubsError):
    """A commit was refused: the lease moved or another writer got there first."""

    def __init__(self, message: str, *, lease_lost: bool) -> None:
        super().__init__(message, code="internal", retryable=True)
        self.lease_lost = lease_lost


# KEYS: log, snap, work, inflight, lease, timers, reply, outbox
# ARGV: lease_value, expected_seq, new_seq, snapshot ('' = unchanged), ack_id, inflight (+/-/''),
#       session_id, reply ('' = none), n_events, (id, json)*, n_timers, (score, member)*,
#       n_timer_removals, member*, n_outbox, item*
_COMMIT = """
if redis.call('GET', KEYS[5]) ~= ARGV[1] then return -1 end
local cur = tonumber(redis.call('HGET', KEYS[2], 'seq') or '0')
if cur ~= tonumber(ARGV[2]) then return -2 end
local i = 10
local n = tonumber(ARGV[9])
for _ = 1, n do
  redis.call('XADD', KEYS[1], ARGV[i], 'e', ARGV[i + 1])
  i = i + 2
end
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[2], 'seq', ARGV[3], 'state', ARGV[4])
end
if ARGV[5] ~= '' then
  redis.call('XACK', KEYS[3], 'engine', ARGV[5])
  redis.call('XDEL', KEYS[3], ARGV[5])
end
if ARGV[6] == '+' then redis.call('SADD', KEYS[4], ARGV[7])
elseif ARGV[6] == '-' then redis.call('SREM', KEYS[4], ARGV[7]) end
n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  redis.call('ZADD', KEYS[6], ARGV[i], ARGV[i + 1])
  i = i + 2
end
n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  redis.call('ZREM', KEYS[6], ARGV[i])
  i = i + 1
end
n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  redis.call('XADD', KEYS[8], '*', 'm', ARGV[i])
  i = i + 1
end
if ARGV[8] ~= '' then
  redis.call('RPUSH', KEYS[7], ARGV[8])
  redis.call('PEXPIRE', KEYS[7], 60000)
end
return tonumber(ARGV[3])
"""

_ACQUIRE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local token = redis.call('INCR', KEYS[2])
local value = ARGV[1] .. ':' .. token
redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
return value
"""

_RENEW = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
"""


@dataclass(frozen=True)
class Commit:
    """One transition's writes, applied all-or-nothing."""

    session_id: str
    expected_seq: int
    new_seq: int
    events: list[dict[str, Any]]
    snapshot: str | None  # None: unchanged
    ack_id: str | None = None
    inflight: bool | None = None  # None: unchanged
    timers: tuple[tuple[int, str], ...] = ()
    timers_done: tuple[str, ...] = ()
    reply: dict[str, Any] | None = None
    reply_to: str | None = None
    outbox: tuple[str, ...] = ()  # messages to other sessions, relayed after the commit


@dataclass(frozen=True)
class WorkItem:
    entry_id: str | None  # None for in-process completions
    session_id: str
    input: dict[str, Any]
    reply_to: str | None = None
    timer_member: str | None = None


def compact_json(value: Any) -> str:
    """JSON as stored and served: no spaces, UTF-8 kept (Redis and HTTP alike)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class Store:
    """A thin, typed command layer over one Redis connection pool."""

    def __init__(
        self,
        redis: aioredis.Redis,
        partitions: int = DEFAULT_PARTITIONS,
        *,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 1000,
    ) -> None:
        self.redis = redis
        self.partitions = partitions
        self.replicas = ReplicaWait(wait_replicas, wait_timeout_ms) if wait_replicas else None
        self._commit = redis.register_script(_COMMIT)
        self._acquire = redis.register_script(_ACQUIRE)
        self._renew = redis.register_script(_RENEW)
        self._release = redis.register_script(_RELEASE)

    @classmethod
    async def open(
        cls,
        redis: aioredis.Redis,
        partitions: int | None = None,
        *,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 1000,
    ) -> Store:
        """Agree on the partition count with whoever set up this Redis first."""
        wanted = partitions or DEFAULT_PARTITIONS
        await redis.hsetnx("subs:meta", "partitions", wanted)
        stored = int(await redis.hget("subs:meta", "partitions"))
        return cls(redis, stored, wait_replicas=wait_replicas, wait_timeout_ms=wait_timeout_ms)

    # -- keys --------------------------------------------------------------------

    def partition_of(self, session_id: str) -> int:
        return zlib.crc32(session_id.encode()) % self.partitions

    def log_key(self, session_id: str) -> str:
        return f"subs:{{{self.partition_of(session_id)}}}:log:{session_id}"

    def snap_key(self, session_id: str) -> str:
        return f"subs:{{{self.partition_of(session_id)}}}:snap:{session_id}"

    def delta_key(self, session_id: str) -> str:
        return f"subs:{{{self.partition_of(session_id)}}}:deltas:{session_id}"

    @staticmethod
    def work_key(p: int) -> str:
        return f"subs:{{{p}}}:work"

    @staticmethod
    def lease_key(p: int) -> str:
        return f"subs:{{{p}}}:lease"

    @staticmethod
    def timers_key(p: int) -> str:
        return f"subs:{{{p}}}:timers"

    @staticmethod
    def inflight_key(p: int) -> str:
        return f"subs:{{{p}}}:inflight"

    @staticmethod
    def outbox_key(p: int) -> str:
        return f"subs:{{{p}}}:outbox"

    def reply_key(self, session_id: str, request_id: str) -> str:
        return f"subs:{{{self.partition_of(session_id)}}}:reply:{request_id}"

    # -- snapshots and logs --------------------------------------------------------

    async def load_snapshot(self, session_id: str) -> tuple[int, dict[str, Any] | None]:
        seq, state = await self.redis.hmget(self.snap_key(session_id), "seq", "state")
        if state is None:
            return 0, None
        return int(seq), json.loads(state)

    async def commit(self, p: int, lease: str, c: Commit) -> int:
        """Apply a transition. Raises StoreConflict when fenced off."""
        sid = c.session_id
        args: list[Any] = [
            lease,
            c.expected_seq,
            c.new_seq,
            c.snapshot or "",
            c.ack_id or "",
            "" if c.inflight is None else ("+" if c.inflight else "-"),
            sid,
            compact_json(c.reply) if c.reply is not None and c.reply_to else "",
            len(c.events),
        ]
        for e in c.events:
            args += [f"{e['seq']}-0", compact_json(e)]
        args.append(len(c.timers))
        for due, member in c.timers:
            args += [due, member]
        args.append(len(c.timers_done))
        args += list(c.timers_done)
        args.append(len(c.outbox))
        args += list(c.outbox)
        keys = [
            self.log_key(sid),
            self.snap_key(sid),
            self.work_key(p),
            self.inflight_key(p),
            self.lease_key(p),
            self.timers_key(p),
            c.reply_to or self.reply_key(sid, "none"),
            self.outbox_key(p),
        ]
        if self.replicas is None:
            result = await self._commit(keys=keys, args=args)
        else:
            # WAIT counts the writes of its own connection: the script and WAIT share one.
            async with self.redis.client() as conn:
                result = await self._commit(keys=keys, args=args, client=conn)
                if result >= 0:
                    await self.replicas.wait(conn, sid)
        if result == -1:
            raise StoreConflict(f"lease on partition {p} is no longer ours", lease_lost=True)
        if result == -2:
            raise StoreConflict(f"session {sid} moved past seq {c.expected_seq}", lease_lost=False)
        return int(result)

    async def read_log(
        self, session_id: str, after_seq: int = 0, count: int | None = None
    ) -> list[dict[str, Any]]:
        entries = await self.redis.xrange(
            self.log_key(session_id), min=f"({after_seq}-0" if after_seq else "-", count=count
        )
        return [json.loads(fields[b"e"]) for _, fields in entries]

    async def note_session(self, session_id: str, created_ms: int) -> None:
        """Index for listing; outside the session's slot, so written after the commit."""
        await self.redis.zadd("subs:sessions", {session_id: created_ms}, nx=True)

    async def list_sessions(self, offset: int = 0, limit: int = 50) -> list[str]:
        ids = await self.redis.zrevrange("subs:sessions", offset, offset + limit - 1)
        return [i.decode() for i in ids]

    # -- work ------------------------------------------------------------------------

    async def ensure_group(self, p: int) -> None:
        try:
            await self.redis.xgroup_create(self.work_key(p), GROUP, id="0", mkstream=True)
        except ResponseError as err:
            if "BUSYGROUP" not in str(err):
                raise

    async def enqueue(self, session_id: str, inp: dict[str, Any], reply_to: str | None) -> str:
        body = {"sid": session_id, "input": inp, "reply_to": reply_to}
        p = self.partition_of(session_id)
        entry = await self.redis.xadd(self.work_key(p), {"w": compact_json(body)})
        return entry.decode()

    @staticmethod
    def _parse_work(entry_id: bytes, fields: dict[bytes, bytes] | None) -> WorkItem | None:
        if not fields or b"w" not in fields:
            return None  # trimmed under us: nothing left to apply
        body = json.loads(fields[b"w"])
        return WorkItem(entry_id.decode(), body["sid"], body["input"], body.get("reply_to"))

    async def read_work(
        self, p: int, consumer: str, *, block_ms: int, count: int = 64
    ) -> list[WorkItem]:
        reply = await self.redis.xreadgroup(
            GROUP, consumer, {self.work_key(p): ">"}, count=count, block=block_ms
        )
        items = []
        for _, entries in reply or ():
            for entry_id, fields in entries:
                item = self._parse_work(entry_id, fields)
                if item is not None:
                    items.append(item)
        return items

    async def claim_pending(self, p: int, consumer: str) -> list[WorkItem]:
        """Take over every pending entry of the partition (its previous owner is gone)."""
        items: list[WorkItem] = []
        start = "0-0"
        while True:
            reply = await self.redis.xautoclaim(
                self.work_key(p), GROUP, consumer, min_idle_time=0, start_id=start, count=100
            )
            start, entries = reply[0], reply[1]
            for entry_id, fields in entries:
                item = self._parse_work(entry_id, fields)
                if item is not None:
                    items.append(item)
            if start in (b"0-0", "0-0"):
                return items

    async def inflight_sessions(self, p: int) -> list[str]:
        return [s.decode() for s in await self.redis.smembers(self.inflight_key(p))]

    async def outbox(self, p: int) -> list[tuple[str, str, str]]:
        """Messages committed for other sessions and not yet handed over: (id, to, item)."""
        entries = await self.redis.xrange(self.outbox_key(p))
        out = []
        for entry_id, fields in entries:
            item = fields[b"m"].decode()
            out.append((entry_id.decode(), json.loads(item)["to"], item))
        return out

    async def outbox_done(self, p: int, entry_id: str) -> None:
        await self.redis.xdel(self.outbox_key(p), entry_id)

    # -- timers ----------------------------------------------------------------------

    # -- leases ----------------------------------------------------------------------

    async def acquire(self, p: int, owner: str, ttl_ms: int) -> str | None:
        value = await self._acquire(
            keys=[self.lease_key(p), f"subs:{{{p}}}:fence"], args=[owner, ttl_ms]
        )
        return value.decode() if value else None

    async def renew(self, p: int, lease: str, ttl_ms: int) -> bool:
        return bool(await self._renew(keys=[self.lease_key(p)], args=[lease, ttl_ms]))

    async def release(self, p: int, lease: str) -> None:
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
        await self.redis.zrem("subs:engines", owner)

    # -- token deltas ----------------------------------------------------------------

    async def add_deltas(self, session_id: str, deltas: list[dict[str, Any]]) -> None:
        key = self.delta_key(session_id)
        async with self.redis.pipeline(transaction=False) as pipe:
            for delta in deltas:
                pipe.xadd(key, {"d": compact_json(delta)}, maxlen=DELTA_CAP, approximate=True)
            await pipe.execute()

    async def due_timers_all(self, partitions: list[int], now_ms: int) -> list[str]:
        """Due timers of several partitions in one round trip."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for p in partitions:
                pipe.zrangebyscore(self.timers_key(p), "-inf", now_ms, 0, 100)
            replies = await pipe.execute()
        return [m.decode() for members in replies for m in members]
