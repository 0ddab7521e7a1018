"""Redis persistence: session logs, snapshots, partitioned work, leases, timers, deltas.

Every key of a session carries its partition's hash tag `{p}`, so one Lua
script commits a transition atomically (also on Redis Cluster). A session log
is a stream whose entry ids are `<seq>-0`: the client-visible `seq` is the
stream id. See DESIGN.md "Storage on Redis".

`Store` is the one command layer the rest of the engine uses; its parts, one seam each:
`connection.py` (a server or a Cluster, its faults, the packed connections of the hot
path), `keys.py` (key naming and partition tags), `log.py` (commits, snapshots, listing),
`streams.py` (reading sessions as they grow), `files.py` (a session's files, once each)
and `work.py` (each partition's work stream, timers, outbox and lease). The names other
modules use are re-exported here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import cast

from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import OutOfMemoryError, RedisError

from engine.store.buckets import BucketUse, BudgetBuckets
from engine.store.connection import (
    STORE_FAULTS,
    RedisClient,
    cluster_enabled,
    cluster_shape,
    connect,
    lua_script,
    unreachable,
)
from engine.store.durability import ReplicaWait
from engine.store.files import SessionFiles
from engine.store.index import BUILD_SCRIPT, PAGE_SCRIPT, SessionIndex
from engine.store.keys import DEFAULT_PARTITIONS, META, spread_tags
from engine.store.log import (
    COMMIT_SCRIPT,
    DELETE_SCRIPT,
    Commit,
    SessionLog,
    Snapshot,
    StoreConflict,
)
from engine.store.retention import (
    REMOVE_SCRIPT,
    RESTORE_SCRIPT,
    PurgeHook,
    PurgeHooks,
    Removals,
    Removed,
    SessionRetention,
)
from engine.store.work import ACQUIRE_SCRIPT, GROUP, RELEASE_SCRIPT, PartitionWork, WorkItem

__all__ = [
    "GROUP",
    "STORE_FAULTS",
    "BucketUse",
    "Commit",
    "OutOfMemoryError",
    "PurgeHook",
    "PurgeHooks",
    "RedisClient",
    "RedisCluster",
    "RedisError",
    "Removals",
    "Removed",
    "Snapshot",
    "Store",
    "StoreConflict",
    "WorkItem",
    "cluster_enabled",
    "cluster_shape",
    "connect",
    "lua_script",
    "spread_tags",
    "unreachable",
]

META_SCRIPT = lua_script(__package__, "meta.lua")


class Store(SessionLog, SessionRetention, PartitionWork, SessionFiles, BudgetBuckets, SessionIndex):
    """A thin, typed command layer over one Redis connection pool (or one cluster client).

    Every key of a partition carries the partition's hash tag: on a cluster each
    partition lives on one master, and every script and multi-key command stays on
    one slot. `tags` is None for stores made before tags were spread (`{p}`). `removals`
    is told of each session it deletes or archives (its own when not given: no one)."""

    def __init__(
        self,
        redis: RedisClient,
        partitions: int = DEFAULT_PARTITIONS,
        *,
        tags: Sequence[str] | None = None,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 1000,
        removals: Removals | None = None,
    ) -> None:
        self.redis = redis
        self.removals = Removals() if removals is None else removals
        self.partitions = partitions
        self.tags = list(tags) if tags is not None else [str(p) for p in range(partitions)]
        self.replicas = ReplicaWait(wait_replicas, wait_timeout_ms) if wait_replicas else None
        self.cluster = redis if isinstance(redis, RedisCluster) else None
        self._stale = False  # a cluster fault was seen: read the slot map before routing
        self._commit = redis.register_script(COMMIT_SCRIPT)
        self._lines: dict[int, AbstractConnection] = {}  # each partition's commit connection
        self._line_locks: dict[int, asyncio.Lock] = {}
        self._commit_keys: dict[tuple[str, int, tuple[str, ...] | None], tuple[str, ...]] = {}
        self._readers: dict[int, AbstractConnection] = {}  # each partition's work reader
        self._acquire = redis.register_script(ACQUIRE_SCRIPT)
        self._release = redis.register_script(RELEASE_SCRIPT)
        self._delete = redis.register_script(DELETE_SCRIPT)
        self._remove = redis.register_script(REMOVE_SCRIPT)
        self._restore = redis.register_script(RESTORE_SCRIPT)
        self._ix_page = redis.register_script(PAGE_SCRIPT)
        self._ix_build = redis.register_script(BUILD_SCRIPT)

    @classmethod
    async def open(
        cls,
        redis: RedisClient,
        partitions: int | None = None,
        *,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 1000,
        removals: Removals | None = None,
    ) -> Store:
        """Agree on the partition count (and the partitions' hash tags) with whoever set
        up this Redis first; on a cluster, learn its slot map now."""
        if isinstance(redis, RedisCluster):
            await redis.initialize()
        wanted = partitions or DEFAULT_PARTITIONS
        stored, scheme = cast(
            list[bytes | None], await redis.eval(META_SCRIPT, 1, META, wanted, "spread")
        )
        count = int(cast(bytes, stored))
        tags = spread_tags(count) if scheme == b"spread" else None
        return cls(
            redis,
            count,
            tags=tags,
            wait_replicas=wait_replicas,
            wait_timeout_ms=wait_timeout_ms,
            removals=removals,
        )

    async def ping(self) -> None:
        """Ask the server for a PONG (a health check); raises what the client raises."""
        await self.redis.ping()
