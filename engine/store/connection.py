"""Connections to Redis: one server or a Cluster (detected from the URL's node), what its
faults look like, and the store's own packed connections for the hot path."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from importlib.resources import files
from typing import Any, cast

import redis.asyncio as aioredis
from hiredis import pack_command
from redis import Redis as SyncRedis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import AbstractConnection, Connection
from redis.backoff import NoBackoff
from redis.exceptions import (
    AskError,
    BusyLoadingError,
    ClusterDownError,
    ClusterError,
    MovedError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

# The store package is the engine's only way to Redis (tests/test_import_rules.py): the rest of
# the engine holds a client as an opaque handle, and names Redis's failures by
# `RedisError` (imported above) and `STORE_FAULTS`. A URL naming a node of a Redis
# Cluster gives redis-py's cluster client; any other, the plain one.
RedisClient = aioredis.Redis | RedisCluster


CLUSTER_PROBE_SECONDS = 5.0
LOADING_POLL = 0.1  # seconds between two PINGs of a server that answers LOADING


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
        info = probe.info("cluster")
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
    OutOfMemoryError,  # Redis at maxmemory: a commit waits for room, never dropped
    OSError,
)


def out_of_memory(err: BaseException) -> bool:
    """Redis refused a write at maxmemory. A script's refusal comes wrapped ("Error running
    script … -OOM command not allowed …"), not as redis-py's OutOfMemoryError; a script is
    refused at its first write only, so nothing of it was written."""
    return isinstance(err, ResponseError) and "OOM command not allowed" in str(err)


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


class PackedConnections:
    """Connections of the store's own, taken from the pool (or the slot's master on a cluster),
    with commands packed by hiredis and sent in one write: the hot path's commits, work reads
    and follows skip redis-py's command layer."""

    redis: RedisClient
    cluster: RedisCluster | None
    _stale: bool  # a cluster fault was seen: read the slot map before routing

    async def _connection(self, key: str) -> AbstractConnection:
        """A connection of our own to the server holding `key`: the pool's, or on a cluster
        one of the master that owns the key's slot (after a fault, the slot map is read
        again first: the slot may have a new master)."""
        if self.cluster is None:
            connection: AbstractConnection = await self._pool().get_connection()
            return connection
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
        try:
            return [await conn.read_response() for _ in commands]
        except ResponseError as err:
            if out_of_memory(err) and not isinstance(err, OutOfMemoryError):
                raise OutOfMemoryError(str(err)) from None
            raise

    def _failing_over(self, err: Exception) -> bool:
        """On a cluster: the slot moved or its master went (a failover); the read is sent
        again to the slot's master, once the slot map says which it is."""
        return self.cluster is not None and (unblocked(err) or isinstance(err, STORE_FAULTS))


def lua_script(package: str, name: str) -> str:
    """A store's Redis script, kept as a .lua file in its package's `lua/` so it reads
    (and lints) as Lua. The engine's `renew.lua`/`release.lua` serve any key a holder
    fences with its own value (the bot's followers' leases too)."""
    return (files(package) / "lua" / name).read_text()
