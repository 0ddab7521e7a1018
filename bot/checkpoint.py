"""Where each followed turn stands, kept in Redis so a restarted bot finishes what a dead one began.

Issue 5 / SPEC §14: a turn's final reply lands exactly once even when the bot process is killed
mid-stream. The checkpoint is written together with the Slack input's dedupe keys (one script)
before Slack gets its ack and before the turn is submitted under a turn id the bot chose. So a
crash leaves either nothing (unacked: Slack delivers the event again) or a checkpoint another
follower resumes: it submits again (the engine answers an existing turn id with that turn),
follows the session's log from `after`, and posts only the parts of the reply that `posted`
(and the thread's message metadata stamps) do not show already.

A follower holds a short lease per turn, renewed while it follows, and writes the checkpoint
only under it (fenced in the scripts), so with several `subs serve` processes a turn is
followed by one of them, a dead process's turns move to a live one, and a follower that lost
its lease (a long stall) stops instead of writing over its successor.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from redis.asyncio import Redis

from .threads import session_id_for

__all__ = ["Checkpoint", "Checkpoints", "LeaseLost"]

log = logging.getLogger(__name__)

TURNS = "subs:slack:turns"  # hash: "<agent> <channel> <turn id>" -> checkpoint JSON
LEASE = "subs:slack:lease:"  # + checkpoint key -> the follower's owner id

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


class LeaseLost(Exception):
    """Another follower holds the turn now: this one must stop writing to Slack."""


@dataclass
class Checkpoint:
    """One turn the bot streams into a thread, and what of it is already in Slack."""

    agent: str
    team: str
    channel: str
    thread_ts: str
    turn_id: str
    user: str
    payload: dict[str, Any] | None  # the turn-starting input with `turn_id`; None: `mention`
    after: int = 0  # the session's last seq before the input: the turn's events come later
    cursor: str = "0-0"  # the delta stream's end at that moment
    trigger: str = ""  # the message a working reaction goes on
    since: str = ""  # ts the turn began at: its messages in the thread come after it
    bot_id: str = ""  # this app's bot id, to know its own unstamped messages
    mention: dict[str, Any] | None = None  # {event, bot_user, bot_id} to build `payload` from
    quiet: bool = False  # a button's turn: no "No reply." message when it has nothing to say
    failures: int = 0  # followers that failed on it (not those that died or handed it over)
    retry_at: float = 0.0  # epoch seconds: not resumed before (backing off after a failure)
    posted: dict[str, str] = field(default_factory=dict)  # reply part -> message ts
    streaming: str = ""  # ts of a native stream not known to be stopped

    @property
    def session_id(self) -> str:
        return session_id_for(self.agent, self.channel, self.thread_ts)

    @property
    def key(self) -> str:
        """Unique per turn: the bot's turn ids are unique within a channel."""
        return f"{self.agent} {self.channel} {self.turn_id}"

    def dumps(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def loads(cls, raw: str | bytes) -> Checkpoint:
        """Fields this version does not know (a newer or older bot wrote it) are left out."""
        data = json.loads(raw)
        return cls(**{k: v for k, v in data.items() if k in _FIELDS})


_FIELDS = frozenset(f.name for f in fields(Checkpoint))


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
