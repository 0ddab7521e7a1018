"""Taking idle sessions out of Redis, and putting archived ones back (docs/retention.md).

The store's half of retention: which sessions may be idle (the index, by age), when each
was last active (its newest event), the fenced removal of one session (a Lua script on
its slot that deletes only what the sweep saw), the restore of an archived one, the
sweep's own lease, the hooks through which other owners of per-session keys (the Slack
bot's checkpoints) drop theirs, so this layer deletes them without importing them, and
the watchers in this process told that a session left. The composition root (`subs
serve`) builds the hooks and the watchers' `Removals` and passes them in: nothing here is
filled at import or start.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

import orjson
from redis.commands.core import AsyncScript

from engine.jsonedge import encode
from engine.store.connection import RedisClient, lua_script
from engine.store.index import SessionIndex
from engine.store.keys import LEGACY_SESSIONS
from engine.store.streams import Entries

log = logging.getLogger("subs.retention")

RENEW_SCRIPT = lua_script(__package__, "renew.lua")
REMOVE_SCRIPT = lua_script(__package__, "archive_delete.lua")
RESTORE_SCRIPT = lua_script(__package__, "restore.lua")

# The sweep's lease: one engine at a time sweeps (fenced like a partition's lease).
SWEEP_LEASE = "subs:{retention}:lease"
SWEEP_FENCE = "subs:{retention}:fence"

# A partition's work stream holds only inputs not yet committed; past this many the
# removal gives up for now rather than scan a long stream inside a script.
WORK_SCAN_LIMIT = 1000

FULL_AT = 0.9  # of maxmemory: past it new sessions are refused (503 store_full)

REMOVED = 1
MOVED = 0  # a commit moved the session since the sweep read it
IN_FLIGHT = -1  # a call of it is out
BUSY = -2  # its partition's work stream is too long to check now
WAITING = -3  # an input for it waits on the work stream


@dataclass(frozen=True)
class Removed:
    """A session the store removed: what the hooks need to find what else was its."""

    session_id: str
    turn_ids: tuple[str, ...]


# Keys some other layer keeps per session (the bot's) go with the session: a hook deletes
# them, given the sessions removed, and returns how many keys it deleted. By name (logs).
PurgeHook = Callable[[RedisClient, Sequence[Removed]], Awaitable[int]]
PurgeHooks = Mapping[str, PurgeHook]


class Removals:
    """Who in this process hears that a session left Redis, deleted or archived: an
    engine drops its cached state of it, the API ends its open streams. One per process,
    given to each store it opens, so a removal through any of them reaches them all."""

    def __init__(self) -> None:
        self._watchers: list[Callable[[str], None]] = []

    def watch(self, watcher: Callable[[str], None]) -> None:
        """Call `watcher(session_id)` at each removal from now on."""
        self._watchers.append(watcher)

    def unwatch(self, watcher: Callable[[str], None]) -> None:
        """Stop telling `watcher` of removals."""
        with contextlib.suppress(ValueError):
            self._watchers.remove(watcher)

    def __call__(self, session_id: str) -> None:
        """Tell every watcher that `session_id` left Redis."""
        for watcher in list(self._watchers):
            watcher(session_id)


def occurred_ms(event: dict[str, Any]) -> int:
    """An event's `occurred_at` as epoch milliseconds."""
    return int(datetime.fromisoformat(event["occurred_at"]).timestamp() * 1000)


class SessionRetention(SessionIndex):
    """Finding idle sessions, removing one as the sweep saw it, restoring an archived one."""

    redis: RedisClient
    removals: Removals
    _remove: AsyncScript
    _restore: AsyncScript
    _acquire: AsyncScript
    _release: AsyncScript

    async def created_before(self, p: int, cutoff_ms: int, offset: int, count: int) -> list[str]:
        """Sessions of partition p created at or before `cutoff_ms`, oldest first (only
        those can have been idle since then)."""
        members = cast(
            list[bytes],
            await self.redis.zrangebyscore(
                self.sessions_key(p), "-inf", cutoff_ms, start=offset, num=count
            ),
        )
        return [m.decode() for m in members]

    async def last_activity(self, session_ids: Sequence[str]) -> list[int | None]:
        """Each session's newest event's time (None: its log is empty), one round trip."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for sid in session_ids:
                pipe.xrevrange(self.log_key(sid), count=1)
            replies = cast(list[Entries], await pipe.execute())
        return [
            occurred_ms(orjson.loads(reply[0][1][b"e"])) if reply else None for reply in replies
        ]

    def session_keys(self, session_id: str) -> list[str]:
        """Every key the engine keeps for one session alone."""
        return [
            self.snap_key(session_id),
            self.log_key(session_id),
            self.delta_key(session_id),
            self.files_key(session_id),
        ]

    async def session_files(self, session_id: str) -> dict[str, bytes]:
        """The session's files (engine/store/files.py), digest -> bytes."""
        raw = cast(dict[bytes, bytes], await self.redis.hgetall(self.files_key(session_id)))
        return {name.decode(): data for name, data in raw.items()}

    async def remove_session(self, session_id: str, expected_seq: int) -> int:
        """Delete the session's snapshot, log, token deltas and index entry in one script,
        only if it is still as the caller saw it (REMOVED); else MOVED, IN_FLIGHT, BUSY or
        WAITING and nothing is deleted."""
        p = self.partition_of(session_id)
        keys = [
            *self.session_keys(session_id),
            self.sessions_key(p),
            self.inflight_key(p),
            self.work_key(p),
            *await self.indexed_keys(session_id),
        ]
        needle = encode({"sid": session_id})[1:-1]
        args: list[Any] = [expected_seq, session_id, WORK_SCAN_LIMIT, needle]
        result = int(await self._remove(keys=keys, args=args))
        if result == REMOVED:
            self.removals(session_id)
            await self.redis.zrem(LEGACY_SESSIONS, session_id)  # another slot: not in the script
        return result

    async def restore_session(
        self,
        session_id: str,
        events: Sequence[bytes],
        state: bytes,
        created_ms: int,
        files: Mapping[str, bytes] | None = None,
    ) -> bool:
        """Write an archived session back whole; False when a session with its id exists."""
        p = self.partition_of(session_id)
        keys = [
            self.snap_key(session_id),
            self.log_key(session_id),
            self.sessions_key(p),
            self.files_key(session_id),
        ]
        args: list[Any] = [session_id, len(events), state, created_ms, len(files or {})]
        for name, data in (files or {}).items():
            args += [name, data]
        for n, event in enumerate(events, 1):
            args += [f"{n}-0", event]
        return bool(await self._restore(keys=keys, args=args))

    async def acquire_sweep(self, owner: str, ttl_ms: int) -> str | None:
        """The sweep's lease, or None while another engine holds it."""
        value = await self._acquire(keys=[SWEEP_LEASE, SWEEP_FENCE], args=[owner, ttl_ms])
        return value.decode() if value else None

    async def renew_sweep(self, lease: str, ttl_ms: int) -> bool:
        """Keep the sweep's lease; False when another engine holds it now."""
        return bool(await self.redis.eval(RENEW_SCRIPT, 1, SWEEP_LEASE, lease, ttl_ms))

    async def release_sweep(self, lease: str) -> None:
        """Let go of the sweep's lease, if it is still ours."""
        await self._release(keys=[SWEEP_LEASE], args=[lease])

    async def purge_outside(self, removed: Sequence[Removed], hooks: PurgeHooks) -> int:
        """Run each of `hooks` on the removed sessions; a failing hook is logged (its keys
        are stale, not live: the session is gone) and the others still run."""
        deleted = 0
        for name, hook in hooks.items():
            try:
                deleted += await hook(self.redis, removed)
            except Exception as err:
                log.warning(
                    "retention: the %s keys of %d sessions stay: %s", name, len(removed), err
                )
        return deleted

    async def memory(self) -> tuple[int, int]:
        """The server's `used_memory` and `maxmemory` (0: no limit)."""
        info = await self.redis.info("memory")
        if "used_memory" not in info:  # a cluster: one reply per node; the fullest one
            nodes = [n for n in info.values() if isinstance(n, dict) and n.get("maxmemory")]
            if not nodes:
                return 0, 0
            node = max(nodes, key=lambda n: int(n["used_memory"]) / int(n["maxmemory"]))
            return int(node["used_memory"]), int(node["maxmemory"])
        return int(info["used_memory"]), int(info.get("maxmemory", 0))
