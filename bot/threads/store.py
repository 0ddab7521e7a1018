"""The bot's own state in Redis: the open turns' checkpoints and their followers' leases.

The bot's store module, as `engine/store/store.py` is the engine's: nothing else in `bot/` talks
to Redis. What a checkpoint is and why it is fenced: `bot/threads/checkpoint.py`.
"""

from __future__ import annotations

import logging

from redis.asyncio import Redis

from bot.threads.checkpoint import Checkpoint, LeaseLost

__all__ = ["LEASE", "TURNS", "Checkpoints", "seen_key"]

log = logging.getLogger(__name__)

TURNS = "subs:slack:turns"  # hash: "<agent> <channel> <turn id>" -> checkpoint JSON
LEASE = "subs:slack:lease:"  # + checkpoint key -> the follower's owner id
SEEN = "subs:slack:seen:"  # + kind:key -> 1 while a Slack input is remembered (dedupe)


def seen_key(kind: str, key: str) -> str:
    """The dedupe key of one Slack input (`event`, `command`, `action`) or recorded turn."""
    return f"{SEEN}{kind}:{key}"


# KEYS: turns hash, lease key, then the dedupe keys. ARGV: field, checkpoint JSON, owner,
# lease ms, dedupe ttl s. The input is seen, its turn recorded and its follower leased, or
# (any dedupe key already set, or the turn already recorded) none of them.
_START = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return 0 end
for i = 3, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then return 0 end
end
for i = 3, #KEYS do redis.call('SET', KEYS[i], 1, 'EX', ARGV[5]) end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
return 1
"""
# KEYS: turns hash, lease key. ARGV: field, owner, lease ms. The checkpoint as it is now,
# leased to the owner; nil when it is gone (finished) or another follower holds it.
_CLAIM = """
local cp = redis.call('HGET', KEYS[1], ARGV[1])
if not cp then return nil end
if not redis.call('SET', KEYS[2], ARGV[2], 'NX', 'PX', ARGV[3]) then return nil end
return cp
"""
# KEYS: turns hash, lease key. ARGV: field, owner, JSON (absent: delete the checkpoint and
# the lease). Writes only under the owner's lease: a follower that lost it changes nothing.
_WRITE = """
if redis.call('GET', KEYS[2]) ~= ARGV[2] then return 0 end
if ARGV[3] then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
else
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('DEL', KEYS[2])
end
return 1
"""
# KEYS: lease key. ARGV: owner, ttl ms. Renews only a lease the owner still holds.
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


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
