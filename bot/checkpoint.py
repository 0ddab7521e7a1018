"""Where each followed turn stands, kept in Redis so a restarted bot finishes what a dead one began.

Issue 5 / SPEC §14: a turn's final reply lands exactly once even when the bot process is killed
mid-stream. The checkpoint is written *with* the Slack event's dedupe key (one script), before
the turn is submitted under a turn id the bot chose, so a crash at any point leaves either
nothing (Slack's retry starts over) or a checkpoint another bot resumes: it submits again (the
engine answers an existing turn id with that turn), follows the session's log from `after`, and
posts only the parts of the reply that `posted` (and the thread's message metadata stamps) do
not show already.

A follower holds a short lease per turn, renewed while it follows, so with several `subs serve`
processes a turn is followed by one of them and a dead process's turns move to a live one.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from redis.asyncio import Redis

from .threads import session_id_for

__all__ = ["Checkpoint", "Checkpoints"]

TURNS = "subs:slack:turns"  # hash: "<session id> <turn id>" -> checkpoint JSON
LEASE = "subs:slack:lease:"  # + checkpoint key -> the follower's owner id

# KEYS: dedupe key, turns hash, lease key. ARGV: dedupe ttl s, field, checkpoint JSON, owner,
# lease ms. The event is seen, its turn recorded and its follower leased, or none of them.
_CLAIM_EVENT = """
if redis.call('SET', KEYS[1], 1, 'NX', 'EX', ARGV[1]) then
  redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
  redis.call('SET', KEYS[3], ARGV[4], 'PX', ARGV[5])
  return 1
end
return 0
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
    after: int  # the session's last seq before the input: the turn's events come later
    cursor: str  # the delta stream's end at that moment
    trigger: str = ""  # the message a working reaction goes on
    mention: dict[str, Any] | None = None  # {event, bot_user, bot_id} to build `payload` from
    quiet: bool = False  # a button's turn: no "No reply." message when it has nothing to say
    resumes: int = 0  # followers that took the turn over from a dead or failed one
    posted: dict[str, str] = field(default_factory=dict)  # reply part -> message ts
    streaming: str = ""  # ts of a native stream not known to be stopped

    @property
    def session_id(self) -> str:
        return session_id_for(self.agent, self.channel, self.thread_ts)

    @property
    def key(self) -> str:
        return f"{self.session_id} {self.turn_id}"

    def dumps(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def loads(cls, raw: str | bytes) -> Checkpoint:
        return cls(**json.loads(raw))


class Checkpoints:
    """The open turns' checkpoints and their followers' leases."""

    def __init__(self, redis: Redis, owner: str, lease_ms: int) -> None:
        self.redis = redis
        self.owner = owner
        self.lease_ms = lease_ms
        self._claim_event = redis.register_script(_CLAIM_EVENT)
        self._renew = redis.register_script(_RENEW)
        self._release = redis.register_script(_RELEASE)

    async def start(self, event_key: str, ttl_s: int, cp: Checkpoint) -> bool:
        """Record `cp`, leased to us, unless the event `event_key` names was seen (False)."""
        keys = [event_key, TURNS, LEASE + cp.key]
        args = [ttl_s, cp.key, cp.dumps(), self.owner, self.lease_ms]
        return bool(await self._claim_event(keys=keys, args=args))

    async def save(self, cp: Checkpoint) -> None:
        await self.redis.hset(TURNS, cp.key, cp.dumps())

    async def drop(self, cp: Checkpoint) -> None:
        """The turn's reply is whole in Slack: nothing is left to resume."""
        await self.redis.hdel(TURNS, cp.key)
        await self._release(keys=[LEASE + cp.key], args=[self.owner])

    async def open(self) -> list[Checkpoint]:
        raw = await self.redis.hvals(TURNS)
        return [Checkpoint.loads(r) for r in raw]

    async def claim(self, cp: Checkpoint) -> bool:
        """Take the lease on following `cp`; False while another live follower holds it."""
        return bool(await self.redis.set(LEASE + cp.key, self.owner, nx=True, px=self.lease_ms))

    async def renew(self, cp: Checkpoint) -> bool:
        """Extend our lease; False when it lapsed and is no longer ours."""
        return bool(await self._renew(keys=[LEASE + cp.key], args=[self.owner, self.lease_ms]))

    async def release(self, cp: Checkpoint) -> None:
        await self._release(keys=[LEASE + cp.key], args=[self.owner])
