"""Redis persistence: session logs, snapshots, partitioned work, leases, timers, deltas.

Every key of a session carries its partition's hash tag `{p}`, so one Lua
script commits a transition atomically (also on Redis Cluster). A session log
is a stream whose entry ids are `<seq>-0`: the client-visible `seq` is the
stream id. See DESIGN.md "Storage on Redis".
"""

from __future__ import annotations

import asyncio
import dataclasses
import zlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib.resources import files
from typing import Any, NewType, cast

import orjson
import redis.asyncio as aioredis
from hiredis import pack_command
from redis import Redis as SyncRedis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import AbstractConnection, Connection
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.exceptions import (
    AskError,
    BusyLoadingError,
    ClusterDownError,
    ClusterError,
    MovedError,
    NoScriptError,
    ReadOnlyError,
    RedisError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry
from redis.typing import KeyT, StreamIdT

from engine.errors import SubsError
from engine.jsonedge import encode
from engine.store.durability import ReplicaWait

SessionId = NewType("SessionId", str)

# This module is the engine's only way to Redis (tests/test_import_rules.py): the rest of
# the engine holds a client as an opaque handle, and names Redis's failures by
# `RedisError` (imported above) and `STORE_FAULTS`. A URL naming a node of a Redis
# Cluster gives redis-py's cluster client; any other, the plain one.
RedisClient = aioredis.Redis | RedisCluster

# The shapes of the replies this module reads. The client is made with
# decode_responses off, so Redis strings arrive as bytes; redis-py's stubs type each
# reply for either setting (`bytes | str`), so each read names the shape it gets.
Entries = list[tuple[bytes, dict[bytes, bytes]]]  # XRANGE / XREVRANGE
StreamsReply = list[tuple[bytes, Entries]]  # XREAD

GROUP = "engine"
DEFAULT_PARTITIONS = 16
DELTA_CAP = 2000
_LEGACY_SESSIONS = "subs:sessions"
META = "subs:meta"
SLOTS = 16384  # Redis Cluster's hash slots
CLUSTER_PROBE_SECONDS = 5.0
LOADING_POLL = 0.1  # seconds between two PINGs of a server that answers LOADING
FOLLOW_FAULTS = 12  # reads in a row a follow retries on a cluster failing over (~8 s)


def cluster_enabled(url: str) -> bool:
    """Whether `url` names a node of a Redis Cluster (its INFO says `cluster_enabled:1`).

    Asked once, when a client is made, with a short timeout: a server that does not
    answer is taken as a single one (the caller's reachability check names it then).
    A unix socket is never a cluster node (the cluster bus is TCP).
    """
    if url.startswith("unix:"):
        return False
    probe = SyncRedis.from_url(
        url,
        socket_timeout=CLUSTER_PROBE_SECONDS,
        socket_connect_timeout=CLUSTER_PROBE_SECONDS,
        retry=Retry(NoBackoff(), 0),
    )
    try:
        info = cast(dict[str, Any], probe.info("cluster"))
    except (RedisError, OSError):
        return False
    finally:
        probe.close()
    return str(info.get("cluster_enabled", 0)) == "1"


@dataclass(frozen=True)
class ClusterShape:
    """What `subs check` says of a Redis Cluster, as one of its nodes sees it."""

    state: str  # CLUSTER INFO's cluster_state: ok | fail
    masters: int  # masters holding slots, not failing
    replicas: int  # replicas not failing
    slots: int  # slots a live master serves, of 16384
    failing: int  # nodes flagged fail


def cluster_shape(url: str) -> ClusterShape | None:
    """The cluster behind `url` (CLUSTER INFO and CLUSTER NODES); None when not a cluster."""
    if not cluster_enabled(url):
        return None
    with SyncRedis.from_url(
        url, socket_timeout=CLUSTER_PROBE_SECONDS, socket_connect_timeout=CLUSTER_PROBE_SECONDS
    ) as probe:
        info = cast(bytes, probe.execute_command("CLUSTER", "INFO"))
        nodes = cast(bytes, probe.execute_command("CLUSTER", "NODES"))
    state = dict(line.split(":", 1) for line in _text(info).splitlines() if ":" in line).get(
        "cluster_state", "?"
    )
    masters = replicas = slots = failing = 0
    for row in (line.split() for line in _text(nodes).splitlines() if line.strip()):
        flags = row[2].split(",")
        if "fail" in flags:
            failing += 1
            continue
        if "slave" in flags:
            replicas += 1
        elif "master" in flags and len(row) > 8:
            masters += 1
            for spec in row[8:]:
                if spec.startswith("["):  # a slot being imported or migrated: counted once
                    continue
                first, _, last = spec.partition("-")
                slots += int(last or first) - int(first) + 1
    return ClusterShape(state.strip(), masters, replicas, slots, failing)


def _text(reply: Any) -> str:
    return reply.decode() if isinstance(reply, bytes) else str(reply)


def connect(
    url: str,
    max_connections: int = 1024,
    name: str | None = None,
    *,
    socket_timeout: float | None = None,
) -> RedisClient:
    """A client with its own connection pool; `name` labels its connections in CLIENT LIST.

    On a Redis Cluster node, redis-py's cluster client: it learns the other nodes and
    the slot map from the one named, and follows MOVED/ASK and failovers by itself.

    No socket read timeout by default: blocking reads wait on purpose (redis-py's
    default of 5 s would cut them off). A pool whose longest wait is known (the
    engine's) sets one, so a Redis that stops answering without closing the
    connection (a network partition) is a fault to wait out, not a hang forever.
    A blocking pool: each waiting submit and each partition's event-stream reader
    holds a connection, and past the cap a caller should wait for one, not fail.
    """
    if cluster_enabled(url):
        return RedisCluster.from_url(
            url,
            max_connections=max_connections,
            socket_timeout=socket_timeout,
            socket_connect_timeout=10,
            client_name=name,
        )
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=30,
        socket_timeout=socket_timeout,
        socket_connect_timeout=10,
        client_name=name,
    )
    return aioredis.Redis.from_pool(pool)


# What Redis going away (a restart, a failover, a partition) looks like to a caller: the
# command may or may not have run, and the same call can succeed later. MOVED and ASK
# reach a caller only from the commands packed here (redis-py's cluster client follows
# them itself): the slot moved (a failover, a resharding), the command did not run.
STORE_FAULTS: tuple[type[Exception], ...] = (
    MovedError,
    AskError,
    SlotNotCoveredError,  # a cluster mid-failover: no master serves the slot yet
    ClusterError,  # redirected too often (the slot map kept changing)
    RedisConnectionError,
    RedisTimeoutError,
    BusyLoadingError,
    ReadOnlyError,
    TryAgainError,
    ClusterDownError,
    OSError,
)


def unblocked(err: BaseException) -> bool:
    """A blocking read its server ended on becoming a replica (a failover): it took
    nothing, and the same read at the slot's new master can go on."""
    return isinstance(err, ResponseError) and str(err).startswith("UNBLOCKED")


async def unreachable(
    client: RedisClient, timeout: float, on_loading: Callable[[], None] = lambda: None
) -> str | None:
    """Why `client`'s server does not answer a PING within `timeout` s; None when it does.

    A server that answers LOADING (reading its data after a restart) is waited for as
    long as it loads, each LOADING answer starting the `timeout` over; `on_loading` is
    called the first time it says so.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    loading = False
    while True:
        try:
            async with asyncio.timeout(max(deadline - loop.time(), 0.0)):
                await client.ping()
            return None
        except BusyLoadingError:  # before RedisError: it is one
            if not loading:
                loading = True
                on_loading()
            deadline = loop.time() + timeout
            await asyncio.sleep(LOADING_POLL)
        except (RedisError, OSError, TimeoutError) as err:
            return str(err) or f"no answer within {timeout:g} s"


class StoreConflict(SubsError):
    """A commit was refused: the lease moved or another writer got there first."""

    def __init__(self, message: str, *, lease_lost: bool) -> None:
        super().__init__(message, code="internal", retryable=True)
        self.lease_lost = lease_lost


def _assemble(seq: bytes, state: bytes, at: bytes | None, entries: Entries) -> Snapshot:
    """A snapshot hash's fields and the log entries after its `at`, as a Snapshot."""
    head = int(seq)
    raw = [fields[b"e"] for _, fields in entries]
    since = head if at is None else int(at)  # no `at`: written before tails existed
    return Snapshot(
        head,
        since,
        orjson.loads(state),
        len(state),
        [orjson.loads(r) for r in raw],
        sum(map(len, raw)),
    )


def lua_script(package: str, name: str) -> str:
    """A store's Redis script, kept as a .lua file in its package's `lua/` so it reads
    (and lints) as Lua. The engine's `renew.lua`/`release.lua` serve any key a holder
    fences with its own value (the bot's followers' leases too)."""
    return (files(package) / "lua" / name).read_text()


_COMMIT = lua_script(__package__, "commit.lua")
_ACQUIRE = lua_script(__package__, "acquire.lua")
_RENEW = lua_script(__package__, "renew.lua")
_RELEASE = lua_script(__package__, "release.lua")
_DELETE = lua_script(__package__, "delete.lua")


@dataclass(frozen=True)
class Commit:
    """One transition's writes, applied all-or-nothing.

    `events` are the new log entries, encoded, numbered from `expected_seq + 1`. The
    snapshot is the whole state, written only now and then (engine/store/snapshots.py): a
    step that does not write it still moves the hash's `seq`, and the state stays at
    its `at`, the log's tail after it folded on load.
    """

    session_id: str
    expected_seq: int
    new_seq: int
    events: tuple[bytes, ...]
    snapshot: bytes | None  # None: not rewritten
    ack_id: str | None = None
    inflight: bool | None = None  # None: unchanged
    timers: tuple[tuple[int, str], ...] = ()
    timers_done: tuple[str, ...] = ()
    reply: dict[str, Any] | None = None
    reply_to: str | None = None
    outbox: tuple[str, ...] = ()  # messages to other sessions, relayed after the commit
    created_ms: int | None = None  # the session is new: index it (in the same commit)
    dead_letter: bytes | None = None  # an input no transition could take, kept for a person


@dataclass(frozen=True)
class Snapshot:
    """A session as stored: the state at seq `at` and the log entries after it, to `seq`."""

    seq: int
    at: int
    state: dict[str, Any]
    state_bytes: int
    tail: list[dict[str, Any]]
    tail_bytes: int


@dataclass(frozen=True)
class WorkItem:
    entry_id: str | None  # None for in-process completions
    session_id: str
    input: dict[str, Any]
    reply_to: str | None = None
    timer_member: str | None = None
    deliveries: int = 1  # times the work stream handed this entry to an engine
    deltas: tuple[dict[str, Any], ...] = ()  # a call's last token deltas, written with its end


def spread_tags(partitions: int) -> list[str]:
    """Each partition's hash tag, chosen so partition p's slot falls in the p-th equal
    share of the cluster's 16384 slots: a cluster whose masters hold equal slot ranges
    (as `redis-cli --cluster create` makes them) gets an equal share of partitions on
    each. The tag is `<p>.<k>`, k the first that lands there (a few dozen tries)."""
    if partitions > SLOTS:
        raise SubsError(f"at most {SLOTS} partitions (one a slot), got {partitions}")
    tags = []
    for p in range(partitions):
        k = 0
        while key_slot(f"{p}.{k}".encode()) * partitions // SLOTS != p:
            k += 1
        tags.append(f"{p}.{k}")
    return tags


_META = lua_script(__package__, "meta.lua")


class Store:
    """A thin, typed command layer over one Redis connection pool (or one cluster client).

    Every key of a partition carries the partition's hash tag: on a cluster each
    partition lives on one master, and every script and multi-key command stays on
    one slot. `tags` is None for stores made before tags were spread (`{p}`).
    """

    def __init__(
        self,
        redis: RedisClient,
        partitions: int = DEFAULT_PARTITIONS,
        *,
        tags: Sequence[str] | None = None,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 1000,
    ) -> None:
        self.redis = redis
        self.partitions = partitions
        self.tags = list(tags) if tags is not None else [str(p) for p in range(partitions)]
        self.replicas = ReplicaWait(wait_replicas, wait_timeout_ms) if wait_replicas else None
        self.cluster = redis if isinstance(redis, RedisCluster) else None
        self._stale = False  # a cluster fault was seen: read the slot map before routing
        self._commit = redis.register_script(_COMMIT)
        self._lines: dict[int, AbstractConnection] = {}  # each partition's commit connection
        self._line_locks: dict[int, asyncio.Lock] = {}
        self._readers: dict[int, AbstractConnection] = {}  # each partition's work reader
        self._acquire = redis.register_script(_ACQUIRE)
        self._release = redis.register_script(_RELEASE)
        self._delete = redis.register_script(_DELETE)

    @classmethod
    async def open(
        cls,
        redis: RedisClient,
        partitions: int | None = None,
        *,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 1000,
    ) -> Store:
        """Agree on the partition count (and the partitions' hash tags) with whoever set
        up this Redis first; on a cluster, learn its slot map now."""
        if isinstance(redis, RedisCluster):
            await redis.initialize()
        wanted = partitions or DEFAULT_PARTITIONS
        stored, scheme = cast(
            list[bytes | None], await redis.eval(_META, 1, META, wanted, "spread")
        )
        count = int(cast(bytes, stored))
        tags = spread_tags(count) if scheme == b"spread" else None
        return cls(
            redis,
            count,
            tags=tags,
            wait_replicas=wait_replicas,
            wait_timeout_ms=wait_timeout_ms,
        )

    # -- keys --------------------------------------------------------------------

    def partition_of(self, session_id: str) -> int:
        return zlib.crc32(session_id.encode()) % self.partitions

    def _key(self, p: int, name: str) -> str:
        return f"subs:{{{self.tags[p]}}}:{name}"

    def log_key(self, session_id: str) -> str:
        return self._key(self.partition_of(session_id), f"log:{session_id}")

    def snap_key(self, session_id: str) -> str:
        return self._key(self.partition_of(session_id), f"snap:{session_id}")

    def delta_key(self, session_id: str) -> str:
        return self._key(self.partition_of(session_id), f"deltas:{session_id}")

    def work_key(self, p: int) -> str:
        return self._key(p, "work")

    def lease_key(self, p: int) -> str:
        return self._key(p, "lease")

    def fence_key(self, p: int) -> str:
        return self._key(p, "fence")

    def timers_key(self, p: int) -> str:
        return self._key(p, "timers")

    def inflight_key(self, p: int) -> str:
        return self._key(p, "inflight")

    def outbox_key(self, p: int) -> str:
        return self._key(p, "outbox")

    def sessions_key(self, p: int) -> str:
        return self._key(p, "sessions")

    def dead_key(self, p: int) -> str:
        return self._key(p, "dead")

    def reply_key(self, session_id: str, request_id: str) -> str:
        return self._key(self.partition_of(session_id), f"reply:{request_id}")

    # -- snapshots and logs --------------------------------------------------------

    async def head(self, session_id: str) -> tuple[int, dict[str, Any]] | None:
        """The session's seq and owner (its identity, fixed when it was created): what an
        access check needs, without the log's tail. None when the session does not exist."""
        seq, state = cast(
            list[bytes | None], await self.redis.hmget(self.snap_key(session_id), "seq", "state")
        )
        if seq is None or state is None:
            return None
        return int(seq), orjson.loads(state)["identity"]

    async def load_snapshot(self, session_id: str) -> Snapshot | None:
        """The last full snapshot and the log after it; None when the session does not exist."""
        seq, state, at = cast(
            list[bytes | None],
            await self.redis.hmget(self.snap_key(session_id), "seq", "state", "at"),
        )
        if seq is None or state is None:
            return None
        return await self._snapshot(session_id, seq, state, at)

    async def load_snapshots(self, session_ids: Sequence[str]) -> list[Snapshot | None]:
        """`load_snapshot` for many sessions in two round trips (the hashes, then the tails
        that are not empty), not two each: a listing page reads a page of them."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for sid in session_ids:
                pipe.hmget(self.snap_key(sid), "seq", "state", "at")
            heads = cast(list[list[bytes | None]], await pipe.execute())
        tails: dict[int, Entries] = {}
        wanted = [
            (n, sid, int(seq), int(at or seq))
            for n, (sid, (seq, state, at)) in enumerate(zip(session_ids, heads, strict=True))
            if seq is not None and state is not None and int(at or seq) < int(seq)
        ]
        if wanted:
            async with self.redis.pipeline(transaction=False) as pipe:
                for _, sid, head, since in wanted:
                    pipe.xrange(self.log_key(sid), min=f"({since}-0", max=f"{head}-0")
                replies = await pipe.execute()
            tails = {n: entries for (n, *_), entries in zip(wanted, replies, strict=True)}
        return [
            None if seq is None or state is None else _assemble(seq, state, at, tails.get(n, []))
            for n, (seq, state, at) in enumerate(heads)
        ]

    async def _snapshot(
        self, session_id: str, seq: bytes, state: bytes, at: bytes | None
    ) -> Snapshot:
        """A snapshot hash read as one instant, with its tail. The tail is read after it:
        log entries up to `seq` never change, so a commit in between adds nothing to it."""
        head = int(seq)
        since = head if at is None else int(at)  # no `at`: written before tails existed
        entries: Entries = []
        if since < head:
            entries = cast(
                Entries,
                await self.redis.xrange(
                    self.log_key(session_id), min=f"({since}-0", max=f"{head}-0"
                ),
            )
        return _assemble(seq, state, at, entries)

    async def commit(
        self, p: int, lease: str, c: Commit, deltas: Sequence[dict[str, Any]] = ()
    ) -> int:
        """Apply a transition. Raises StoreConflict when fenced off.

        `deltas` (token deltas of the call this input ends) go out in the same write,
        ahead of the script: they reach the delta stream before the event that ends
        their call, with no round trip of their own. They are written even when the
        commit is then refused (they are best effort, and were streamed).
        """
        sid = c.session_id
        args: list[Any] = [
            lease,
            c.expected_seq,
            c.new_seq,
            c.snapshot or b"",
            c.ack_id or "",
            "" if c.inflight is None else ("+" if c.inflight else "-"),
            sid,
            encode(c.reply) if c.reply is not None and c.reply_to else "",
            len(c.events),
            "" if c.created_ms is None else c.created_ms,
            c.dead_letter or b"",
        ]
        for n, event in enumerate(c.events, c.expected_seq + 1):
            args += [f"{n}-0", event]
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
            self.sessions_key(p),
            self.dead_key(p),
        ]
        if deltas and self.replicas is not None:
            await self.add_deltas(sid, deltas)  # not counted by the commit's WAIT
            deltas = ()
        result = await self._commit_on_line(
            p, sid, [len(keys), *keys, *args], self._delta_xadds(sid, deltas)
        )
        if result == -1:
            raise StoreConflict(f"lease on partition {p} is no longer ours", lease_lost=True)
        if result == -2:
            raise StoreConflict(f"session {sid} moved past seq {c.expected_seq}", lease_lost=False)
        return int(result)

    async def _commit_on_line(
        self, p: int, sid: str, args: list[Any], before: list[list[Any]]
    ) -> Any:
        """EVALSHA of the commit script on the partition's own connection, packed here.

        Commits are the hot path: redis-py's command layer (a pool checkout with its
        health probe, per-argument encoding, the Script wrapper) cost ~90 µs of CPU a
        commit more than this (measured). One partition commits one input at a time,
        so its connection is never shared; any failure drops it (the pool makes a new
        one), and a Redis that lost its scripts (a restart) is given the script again.
        `before` are commands sent ahead of the script in the same write. On a cluster
        the connection is to the master owning the partition's slot. With `wait_replicas`, a
        WAIT follows on the same connection (WAIT counts its own connection's writes).
        """
        lock = self._line_locks.get(p)
        if lock is None:
            lock = self._line_locks[p] = asyncio.Lock()
        async with lock:
            conn = self._lines.pop(p, None) or await self._connection(self.log_key(sid))
            evalsha = [b"EVALSHA", self._commit.sha, *args]
            try:
                try:
                    result = await self._run_commit(conn, before, evalsha)
                except MovedError as moved:  # nothing ran: sent once more, to the new master
                    await self._put_back(conn, moved)
                    conn = await self._connection(self.log_key(sid))
                    result = await self._run_commit(conn, before, evalsha)
                if self.replicas is not None and result >= 0:
                    (acked,) = await self._ask(conn, [self.replicas.command()])
                    self.replicas.record(int(acked), sid)
            except BaseException as err:
                await self._put_back(conn, err)
                raise
            self._lines[p] = conn
            return result

    async def _run_commit(
        self, conn: AbstractConnection, before: list[list[Any]], evalsha: list[Any]
    ) -> Any:
        """`before`, then the script; a server without the script (restarted, or a replica
        just promoted) is given it."""
        try:
            *_, result = await self._ask(conn, [*before, evalsha])
        except NoScriptError:  # `before` ran: only the script is sent again
            _, result = await self._ask(conn, [[b"SCRIPT", b"LOAD", _COMMIT], evalsha])
        return result

    async def _connection(self, key: str) -> AbstractConnection:
        """A connection of our own to the server holding `key`: the pool's, or on a cluster
        one of the master that owns the key's slot (after a fault, the slot map is read
        again first: the slot may have a new master)."""
        if self.cluster is None:
            return await self._pool().get_connection()
        if self._stale:
            self._stale = False
            await self.cluster.nodes_manager.initialize()
        node = self.cluster.get_node_from_key(key)
        if node is None:  # pragma: no cover - redis-py raises SlotNotCoveredError first
            raise ClusterDownError(f"no master holds the slot of {key!r}")
        return node.acquire_connection()

    async def _put_back(self, conn: AbstractConnection, err: BaseException | None) -> None:
        """Hand `conn` back to its pool or node. After `err` it is closed first (replies may
        be left unread on it); on a cluster a fault also marks the slot map stale."""
        if err is not None:
            await conn.disconnect(nowait=True)
            if self.cluster is not None and (isinstance(err, STORE_FAULTS) or unblocked(err)):
                self._stale = True
        if self.cluster is None:
            await self._pool().release(conn)
            return
        node = self._node_of(conn)
        if node is None or not isinstance(conn, Connection):  # gone from the slot map
            await conn.disconnect(nowait=True)
        else:
            node.release(conn)

    def _node_of(self, conn: AbstractConnection) -> ClusterNode | None:
        assert self.cluster is not None
        host, port = getattr(conn, "host", None), getattr(conn, "port", None)
        return self.cluster.get_node(host=host, port=port) if host and port else None

    def _pool(self) -> aioredis.ConnectionPool:
        assert isinstance(self.redis, aioredis.Redis)
        return self.redis.connection_pool

    @staticmethod
    async def _ask(conn: AbstractConnection, commands: list[list[Any]]) -> list[Any]:
        """Commands packed by hiredis (C) and sent in one write; their replies, in order. A
        reply that is an error raises, leaving later replies unread: the caller drops `conn`."""
        packed = b"".join(pack_command(tuple(command)) for command in commands)
        await conn.send_packed_command(packed, check_health=False)
        return [await conn.read_response() for _ in commands]

    async def read_log(
        self, session_id: str, after_seq: int = 0, count: int | None = None
    ) -> list[dict[str, Any]]:
        entries = cast(
            Entries,
            await self.redis.xrange(
                self.log_key(session_id), min=f"({after_seq}-0" if after_seq else "-", count=count
            ),
        )
        return [orjson.loads(fields[b"e"]) for _, fields in entries]

    async def ping(self) -> None:
        """Ask the server for a PONG (a health check); raises what the client raises."""
        await self.redis.ping()

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

    async def last_seq(self, session_id: str) -> int:
        """The seq of the session's newest event; 0 for a session not yet created."""
        last = cast(Entries, await self.redis.xrevrange(self.log_key(session_id), count=1))
        return int(last[0][0].split(b"-")[0]) if last else 0

    async def delta_cursor(self, session_id: str) -> str:
        """The delta stream's newest id ("0-0" when empty): follow from here to miss nothing."""
        last = cast(Entries, await self.redis.xrevrange(self.delta_key(session_id), count=1))
        return last[0][0].decode() if last else "0-0"

    async def read_cut(self, session_id: str) -> tuple[Snapshot, list[dict[str, Any]], str] | None:
        """The snapshot, and the token deltas with the delta stream's last id ("0-0" when
        empty), read in one transaction: one instant. None when the session does not
        exist. Both keys share the session's slot."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hmget(self.snap_key(session_id), "seq", "state", "at")
            pipe.xrange(self.delta_key(session_id))
            (seq, raw, at), entries = await pipe.execute()
        if raw is None:
            return None
        deltas = [orjson.loads(fields[b"d"]) for _, fields in entries]
        cursor = entries[-1][0].decode() if entries else "0-0"
        return await self._snapshot(session_id, seq, raw, at), deltas, cursor

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

    def _failing_over(self, err: Exception) -> bool:
        """On a cluster: the slot moved or its master went (a failover); the read is sent
        again to the slot's master, once the slot map says which it is."""
        return self.cluster is not None and (unblocked(err) or isinstance(err, STORE_FAULTS))

    async def list_sessions(self, offset: int = 0, limit: int = 50) -> list[str]:
        """Session ids, newest first, merged from every partition's index.

        The index is written by the commit that creates a session, in the session's
        own slot; `subs:sessions` is where versions before that kept it, still read.
        """
        keys = [self.sessions_key(p) for p in range(self.partitions)] + [_LEGACY_SESSIONS]
        async with self.redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.zrevrange(key, 0, offset + limit - 1, withscores=True)
            replies = await pipe.execute()
        newest: dict[str, float] = {}
        for members in replies:
            for member, score in members:
                newest.setdefault(member.decode(), score)
        ordered = sorted(newest, key=lambda sid: (-newest[sid], sid))
        return ordered[offset : offset + limit]

    async def delete_session(self, session_id: str, expected_seq: int) -> bool:
        """Remove the session's log, snapshot, token deltas and index entries, if its seq
        is still `expected_seq`; False when a commit moved it (nothing was deleted).

        An engine that cached the session is fenced off by the seq check of its next
        commit, and reads the session afresh (gone) then.
        """
        p = self.partition_of(session_id)
        keys = [
            self.snap_key(session_id),
            self.log_key(session_id),
            self.delta_key(session_id),
            self.sessions_key(p),
            self.inflight_key(p),
        ]
        if not await self._delete(keys=keys, args=[expected_seq, session_id]):
            return False
        await self.redis.zrem(_LEGACY_SESSIONS, session_id)  # another slot: not in the script
        return True

    async def last_events(self, session_ids: Sequence[str]) -> list[dict[str, Any] | None]:
        """Each session's newest event (None when its log is empty), in one round trip."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for sid in session_ids:
                pipe.xrevrange(self.log_key(sid), count=1)
            replies = await pipe.execute()
        return [orjson.loads(reply[0][1][b"e"]) if reply else None for reply in replies]

    async def dead_letters(self, count: int = 100) -> list[dict[str, Any]]:
        """Inputs no transition could take, newest first, across partitions."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for p in range(self.partitions):
                pipe.xrevrange(self.dead_key(p), count=count)
            replies = await pipe.execute()
        letters = [
            {"id": entry_id.decode(), **orjson.loads(fields[b"d"])}
            for entries in replies
            for entry_id, fields in entries
        ]
        letters.sort(key=lambda d: d.get("at_ms", 0), reverse=True)
        return letters[:count]

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
        entry = cast(bytes, await self.redis.xadd(self.work_key(p), {"w": encode(body)}))
        return entry.decode()

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
        members = cast(set[bytes], await self.redis.smembers(self.inflight_key(p)))
        return [s.decode() for s in members]

    async def outbox(self, p: int) -> list[tuple[str, str, str]]:
        """Messages committed for other sessions and not yet handed over: (id, to, item)."""
        entries = cast(Entries, await self.redis.xrange(self.outbox_key(p)))
        out = []
        for entry_id, fields in entries:
            item = fields[b"m"].decode()
            out.append((entry_id.decode(), orjson.loads(item)["to"], item))
        return out

    async def outbox_done(self, p: int, entry_id: str) -> None:
        await self.redis.xdel(self.outbox_key(p), entry_id)

    # -- timers ----------------------------------------------------------------------

    # -- leases ----------------------------------------------------------------------

    async def acquire(self, p: int, owner: str, ttl_ms: int) -> str | None:
        value = await self._acquire(
            keys=[self.lease_key(p), self.fence_key(p)], args=[owner, ttl_ms]
        )
        return value.decode() if value else None

    async def renew(self, leases: Mapping[int, str], ttl_ms: int) -> list[int]:
        """Renew several partitions' leases in one round trip (a busy process still renews
        them all in time); returns the partitions whose lease is no longer ours."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for p, lease in leases.items():  # EVAL, not EVALSHA: a pipeline cannot reload it
                pipe.eval(_RENEW, 1, self.lease_key(p), lease, ttl_ms)
            renewed = await pipe.execute()
        return [p for p, ok in zip(leases, renewed, strict=True) if not ok]

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

    async def due_timers_all(self, partitions: list[int], now_ms: int) -> list[str]:
        """Due timers of several partitions in one round trip."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for p in partitions:
                pipe.zrangebyscore(self.timers_key(p), "-inf", now_ms, 0, 100)
            replies = await pipe.execute()
        return [m.decode() for members in replies for m in members]
