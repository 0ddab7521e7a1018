"""The bot's own state in Redis: the open turns' checkpoints and their followers' leases.

The bot's store module, as `engine/store/store.py` is the engine's: nothing else in `bot/` talks
to Redis. What a checkpoint is and why it is fenced: `bot/threads/checkpoint.py`.
"""

from __future__ import annotations

import logging

from redis.asyncio import Redis

from bot.threads.checkpoint import Checkpoint, LeaseLost
from engine.store.store import lua_script

__all__ = ["LEASE", "TURNS", "Checkpoints", "seen_key"]

log = logging.getLogger(__name__)

TURNS = "subs:slack:turns"  # hash: "<agent> <channel> <turn id>" -> checkpoint JSON
LEASE = "subs:slack:lease:"  # + checkpoint key -> the follower's owner id
SEEN = "subs:slack:seen:"  # + kind:key -> 1 while a Slack input is remembered (dedupe)


def seen_key(kind: str, key: str) -> str:
    """The dedupe key of one Slack input (`event`, `command`, `action`) or recorded turn."""
    return f"{SEEN}{kind}:{key}"


_START = lua_script(__package__, "start.lua")
_CLAIM = lua_script(__package__, "claim.lua")
_WRITE = lua_script(__package__, "write.lua")
# A follower's lease is a key fenced by its owner's value, as a partition's is.
_RENEW = lua_script("engine.store", "renew.lua")
_RELEASE = lua_script("engine.store", "release.lua")


class Checkpoints:
    """The open turns' checkpoints and their followers' leases."""

    def __init__(self, redis: Redis, owner: str, lease_ms: int) -> None:
        self.redis = redis
        self.owner = owner
        self.lease_ms = lease_ms
        self._start = redis.register_script(_START)
        self._claim = redis.register_script(_CLAIM)
        self._write = redis.register_script(_WRITE)
        self._renew = redis.register_script(_RENEW)
        self._release = redis.register_script(_RELEASE)

    async def start(self, dedupe: list[str], ttl_s: int, cp: Checkpoint) -> bool:
        """Record `cp`, leased to us; False when a dedupe key was seen or the turn is known."""
        keys = [TURNS, LEASE + cp.key, *dedupe]
        args: list[str | int] = [cp.key, cp.dumps(), self.owner, self.lease_ms, ttl_s]
        return bool(await self._start(keys=keys, args=args))

    async def save(self, cp: Checkpoint) -> None:
        """Write `cp` under our lease.

        Raises:
            LeaseLost: another follower took the turn over.
        """
        if not await self._write(
            keys=[TURNS, LEASE + cp.key], args=[cp.key, self.owner, cp.dumps()]
        ):
            raise LeaseLost(cp.key)

    async def drop(self, cp: Checkpoint) -> None:
        """The turn's reply is whole in Slack (or given up): nothing is left to resume.

        Raises:
            LeaseLost: another follower took the turn over.
        """
        if not await self._write(keys=[TURNS, LEASE + cp.key], args=[cp.key, self.owner]):
            raise LeaseLost(cp.key)

    async def open(self) -> list[Checkpoint]:
        """Every open turn's checkpoint; one that cannot be read is logged and skipped."""
        found = []
        for key, raw in (await self.redis.hgetall(TURNS)).items():
            try:
                found.append(Checkpoint.loads(raw))
            except (ValueError, TypeError) as err:
                log.error("slack: unreadable checkpoint %r left alone: %s", key, err)
        return found

    async def claim(self, cp: Checkpoint) -> Checkpoint | None:
        """Take the lease on following `cp`: its checkpoint as it is now, or None when the
        turn finished meanwhile or another live follower holds it."""
        keys = [TURNS, LEASE + cp.key]
        raw = await self._claim(keys=keys, args=[cp.key, self.owner, self.lease_ms])
        return Checkpoint.loads(raw) if raw is not None else None

    async def renew(self, cp: Checkpoint) -> bool:
        """Extend our lease; False when it lapsed and is no longer ours."""
        return bool(await self._renew(keys=[LEASE + cp.key], args=[self.owner, self.lease_ms]))

    async def release(self, cp: Checkpoint) -> None:
        await self._release(keys=[LEASE + cp.key], args=[self.owner])
