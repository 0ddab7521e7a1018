"""The bot's own state in Redis: the open turns' checkpoints and their followers' leases.

The bot's store module, as `engine/store/store.py` is the engine's: nothing else in `bot/` talks
to Redis. What a checkpoint is and why it is fenced: `bot/turns/checkpoint.py`.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Sequence

from bot.turns.checkpoint import Checkpoint, LeaseLost
from engine.store.store import RedisClient, Removed, lua_script

__all__ = [
    "BUCKETS",
    "LEGACY_TURNS",
    "Checkpoints",
    "Slots",
    "archived_key",
    "checkpoint_keys",
    "home_key",
    "seen_key",
    "slot_keys",
    "turns_key",
]

log = logging.getLogger(__name__)

# The bot's keys are spread over buckets by channel, each bucket one hash tag: a turn's
# checkpoint, its follower's lease and its input's dedupe keys share a slot (one script
# writes them together, also on Redis Cluster), and a Slack retry of an input (same
# channel) finds its dedupe key in the same bucket.
BUCKETS = 16
LEGACY_TURNS = "subs:slack:turns"  # where bots before the buckets kept every checkpoint


def _tag(channel: str) -> str:
    return f"subs:slack:{{slack.{zlib.crc32(channel.encode()) % BUCKETS}}}:"


def turns_key(bucket: int) -> str:
    """A bucket's hash of open turns: "<agent> <channel> <turn id>" -> checkpoint JSON."""
    return f"subs:slack:{{slack.{bucket}}}:turns"


def checkpoint_keys(cp: Checkpoint) -> tuple[str, str]:
    """The turn's bucket's hash of checkpoints, and its follower's lease."""
    tag = _tag(cp.channel)
    return tag + "turns", tag + "lease:" + cp.key


def seen_key(kind: str, key: str) -> str:
    """The dedupe name of one Slack input (`event`, `command`, `action`) or recorded turn,
    kept in its channel's bucket while the input is remembered."""
    return f"seen:{kind}:{key}"


# How long a thread whose session retention archived remembers it, so the next turn there
# says once that it starts afresh (one small key a thread, against the session's KBs).
ARCHIVED_NOTE_SECONDS = 400 * 86_400


def archived_key(session_id: str) -> str | None:
    """The note that a thread's session was archived, in its channel's bucket; None for a
    session no Slack thread started."""
    thread = _thread_of(session_id)
    return None if thread is None else _tag(thread[1]) + "archived:" + session_id


# A session landed in Slack from the API (engine/landing.py) keeps its home thread here,
# both ways: the session's thread (its turns go there) and the thread's session (mentions
# there continue it, whatever the shape of its id). Only a landing (bot/turns/land.py),
# for a full key, writes them: no other key can point a thread at a session.
def home_key(session_id: str) -> str:
    """A landed session's home: `<agent> <channel> <thread ts>` (ts empty: being posted)."""
    return f"subs:slack:home:{session_id}"


def thread_key(agent: str, channel: str, thread_ts: str) -> str:
    """The session a thread's mentions continue, when it is not `slack:<agent>:…`."""
    return _tag(channel) + f"thread:{agent} {channel} {thread_ts}"


_START = lua_script(__package__, "start.lua")
_CLAIM = lua_script(__package__, "claim.lua")
_WRITE = lua_script(__package__, "write.lua")
# A follower's lease is a key fenced by its owner's value, as a partition's is.
_RENEW = lua_script("engine.store", "renew.lua")
_RELEASE = lua_script("engine.store", "release.lua")
_SLOT_TAKE = lua_script(__package__, "slot_take.lua")
_SLOT_KEEP = lua_script(__package__, "slot_keep.lua")


class Checkpoints:
    """The open turns' checkpoints and their followers' leases."""

    def __init__(self, redis: RedisClient, owner: str, lease_ms: int) -> None:
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
        tag = _tag(cp.channel)
        keys = [*checkpoint_keys(cp), *(tag + name for name in dedupe)]
        args: list[str | int] = [cp.key, cp.dumps(), self.owner, self.lease_ms, ttl_s]
        return bool(await self._start(keys=keys, args=args))

    async def save(self, cp: Checkpoint) -> None:
        """Write `cp` under our lease.

        Raises:
            LeaseLost: another follower took the turn over.
        """
        keys = list(checkpoint_keys(cp))
        if not await self._write(keys=keys, args=[cp.key, self.owner, cp.dumps()]):
            raise LeaseLost(key=cp.key)

    async def drop(self, cp: Checkpoint) -> None:
        """The turn's reply is whole in Slack (or given up): nothing is left to resume.

        Raises:
            LeaseLost: another follower took the turn over.
        """
        if not await self._write(keys=list(checkpoint_keys(cp)), args=[cp.key, self.owner]):
            raise LeaseLost(key=cp.key)

    async def open(self) -> list[Checkpoint]:
        """Every open turn's checkpoint; one that cannot be read is logged and skipped.

        Checkpoints a bot from before the buckets left in `subs:slack:turns` move to
        their bucket first (one by one: two slots), so their turns resume too."""
        for key, raw in (await self.redis.hgetall(LEGACY_TURNS)).items():
            try:
                cp = Checkpoint.loads(raw)
            except (ValueError, TypeError):
                continue  # left there, and said below with the others
            await self.redis.hsetnx(checkpoint_keys(cp)[0], key, raw)
            await self.redis.hdel(LEGACY_TURNS, key)
        async with self.redis.pipeline(transaction=False) as pipe:
            for bucket in range(BUCKETS):
                pipe.hgetall(turns_key(bucket))
            pipe.hgetall(LEGACY_TURNS)
            buckets = await pipe.execute()
        found = []
        for key, raw in (item for turns in buckets for item in turns.items()):
            try:
                found.append(Checkpoint.loads(raw))
            except (ValueError, TypeError) as err:
                log.error("slack: unreadable checkpoint %r left alone: %s", key, err)
        return found

    async def claim(self, cp: Checkpoint) -> Checkpoint | None:
        """Take the lease on following `cp`: its checkpoint as it is now, or None when the
        turn finished meanwhile or another live follower holds it."""
        keys = list(checkpoint_keys(cp))
        raw = await self._claim(keys=keys, args=[cp.key, self.owner, self.lease_ms])
        return Checkpoint.loads(raw) if raw is not None else None

    async def renew(self, cp: Checkpoint) -> bool:
        """Extend our lease; False when it lapsed and is no longer ours."""
        lease = checkpoint_keys(cp)[1]
        return bool(await self._renew(keys=[lease], args=[self.owner, self.lease_ms]))

    async def first(self, channel: str, name: str, ttl_s: int) -> bool:
        """Whether this is the first time `name` (a `seen_key`) is seen in `channel`'s
        bucket within `ttl_s`: it is remembered from now on."""
        return bool(await self.redis.set(_tag(channel) + name, "1", nx=True, ex=ttl_s))

    async def take_archived(self, session_id: str) -> bool:
        """Whether retention archived this thread's session since a turn last said so
        (read and forgotten at once: a thread is told once)."""
        key = archived_key(session_id)
        return key is not None and await self.redis.getdel(key) is not None

    async def claim_home(
        self, session_id: str, agent: str, channel: str, thread_ts: str, pending_s: int
    ) -> tuple[str, str, str] | None:
        """Make this the session's home unless it has one: None when it is ours now, else
        the home it had (agent, channel, thread ts; the ts empty while its root is posted).

        A home whose root is still to be posted lapses after `pending_s`: a landing that
        never got its checkpoint recorded (a crash in between) must not hold it forever."""
        home = f"{agent} {channel} {thread_ts}"
        ttl = None if thread_ts else pending_s
        if await self.redis.set(home_key(session_id), home, nx=True, ex=ttl):
            if thread_ts:
                await self.redis.set(thread_key(agent, channel, thread_ts), session_id)
            return None
        return await self.home(session_id)

    async def home(self, session_id: str) -> tuple[str, str, str] | None:
        """(agent, channel, thread ts) of a landed session; None for any other."""
        raw = await self.redis.get(home_key(session_id))
        if raw is None:
            return None
        agent, channel, thread_ts = (raw.decode() if isinstance(raw, bytes) else raw).split(" ")
        return agent, channel, thread_ts

    async def set_home(self, session_id: str, agent: str, channel: str, thread_ts: str) -> None:
        """The landed session's root message is posted: its thread is its home, both ways
        (the thread's key first: a mention finds the session before the API sends there)."""
        await self.redis.set(thread_key(agent, channel, thread_ts), session_id)
        await self.redis.set(home_key(session_id), f"{agent} {channel} {thread_ts}")

    async def landed(self, agent: str, channel: str, thread_ts: str) -> str | None:
        """The session a landed thread belongs to; None for a thread the bot's ids name."""
        raw = await self.redis.get(thread_key(agent, channel, thread_ts))
        return None if raw is None else raw.decode() if isinstance(raw, bytes) else str(raw)

    async def release(self, cp: Checkpoint) -> None:
        """Give up following this turn, if this follower still holds it."""
        await self._release(keys=[checkpoint_keys(cp)[1]], args=[self.owner])


def _thread_of(session_id: str) -> tuple[str, str] | None:
    """(agent, channel) of a Slack thread's session id (`bot/turns/routing.py`); None for
    a session no thread started."""
    if not session_id.startswith("slack:"):
        return None
    rest, _, _thread = session_id[len("slack:") :].rpartition(":")
    agent, _, channel = rest.rpartition(":")
    return (agent, channel) if agent and channel else None


async def purge_sessions(redis: RedisClient, removed: Sequence[Removed]) -> int:
    """The store removed these sessions (retention): drop the bot's keys of their turns —
    checkpoints left behind, their followers' leases, the turns' dedupe keys. Only turns
    the removed log holds: a turn a thread starts meanwhile is another session's. Each
    thread gets a note (`archived_key`) so its next turn says it starts afresh.
    A Slack input's own dedupe key (`seen:event:…`) names no session; it expires.
    The sweep's purge hook (`bot.app.PURGE_HOOKS`)."""
    turns = {r.session_id: set(r.turn_ids) for r in removed}
    async with redis.pipeline(transaction=False) as pipe:
        for bucket in range(BUCKETS):
            pipe.hgetall(turns_key(bucket))
        buckets = await pipe.execute()
    doomed: list[tuple[str, str | None]] = []  # (key, hash field or None)
    for bucket, entries in enumerate(buckets):
        for field, raw in entries.items():
            try:
                cp = Checkpoint.loads(raw)
            except (ValueError, TypeError):
                continue
            if cp.turn_id in turns.get(cp.session_id, ()):
                doomed += [(turns_key(bucket), field), (checkpoint_keys(cp)[1], None)]
    notes = [key for r in removed if (key := archived_key(r.session_id)) is not None]
    for r in removed:  # a landed session's home, both ways: its thread starts afresh
        raw = await redis.get(home_key(r.session_id))
        if raw is not None:
            agent, channel, thread_ts = (raw.decode() if isinstance(raw, bytes) else raw).split(" ")
            doomed.append((home_key(r.session_id), None))
            if thread_ts:
                doomed.append((thread_key(agent, channel, thread_ts), None))
    for r in removed:
        thread = _thread_of(r.session_id)
        if thread is not None:
            agent, channel = thread
            for turn_id in r.turn_ids:
                name = seen_key("turn", f"{agent} {channel} {turn_id}")
                doomed.append((_tag(channel) + name, None))
    async with redis.pipeline(transaction=False) as pipe:
        for key, field in doomed:
            if field is None:
                pipe.delete(key)
            else:
                pipe.hdel(key, field)
        for key in notes:
            pipe.set(key, 1, ex=ARCHIVED_NOTE_SECONDS)
        replies = await pipe.execute()
    return sum(int(n) for n in replies[: len(doomed)])


def slot_keys(agent: str) -> tuple[str, str, str, str]:
    """One app's turn slots, in one slot of a cluster: the running turns (member -> lease end,
    ms), the waiting ones (member -> ticket), the waiting ones' lease ends, the ticket counter."""
    tag = f"subs:slack:{{slots.{agent}}}:"
    return tag + "running", tag + "waiting", tag + "alive", tag + "tickets"


class Slots:
    """Each Slack app's turn slots, shared by every bot process on this Redis: at most a
    limit of its turns run at once, the others wait by ticket (arrival order).

    A member is `<owner> <turn key>`: a turn resumed by another process waits anew rather
    than inherit a slot the dead process may still hold, which lapses within one lease."""

    def __init__(self, redis: RedisClient, lease_ms: int) -> None:
        self.redis = redis
        self.lease_ms = lease_ms
        self._take = redis.register_script(_SLOT_TAKE)
        self._keep = redis.register_script(_SLOT_KEEP)

    async def take(self, agent: str, member: str, limit: int) -> tuple[bool, int, int]:
        """(running, ticket, turns ahead): the slot is the member's now (or was already),
        else it waits in line (kept there while `keep` renews it)."""
        keys = list(slot_keys(agent))
        running, ticket, ahead = await self._take(keys=keys, args=[member, limit, self.lease_ms])
        return bool(running), int(ticket), int(ahead)

    async def keep(self, agent: str, members: list[str]) -> None:
        """Extend the leases of our running and waiting members."""
        if members:
            running, _, alive, _ = slot_keys(agent)
            await self._keep(keys=[running, alive], args=[self.lease_ms, *members])

    async def leave(self, agent: str, member: str) -> None:
        """The member's turn ended (or stopped waiting): its slot or place is free."""
        running, waiting, alive, _ = slot_keys(agent)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.zrem(running, member)
            pipe.zrem(waiting, member)
            pipe.zrem(alive, member)
            await pipe.execute()
