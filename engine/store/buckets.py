"""Budget-policy buckets in Redis (`[[budgets]]`, engine/machine/policies.py).

A bucket is a hash of `SLOTS` sub-buckets (index -> tokens or nano-USD) beside a sorted
set of the charge ids counted in its window; both expire when the newest sub-bucket leaves
the window, so a bucket costs a few hundred bytes plus one id per model call in its window.

What "atomic with the commit" became: on Redis Cluster a bucket's keys and a session's keys
sit in different slots, so no one script can write both. Instead the commit script writes
the call's charge into the partition's outbox, in the same script as the event that
settles the call (fenced by the lease and the session's seq like every commit: a zombie's
or a retried commit's charge never lands twice, since the commit itself does not); the
outbox relay then applies it to each bucket with `charge.lua`, idempotent by the charge's
id (`session/call/attempt`), and only then drops it from the outbox. A crash between the
two applies it again, and the bucket counts it once. So usage is durable from the commit
on and counted exactly once, a relay's round trip after the commit.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from redis.asyncio.connection import AbstractConnection
from redis.exceptions import NoScriptError

from engine.machine.policies import (
    SLOTS,
    BucketRef,
    BudgetPolicy,
    Charge,
    from_units,
    usage_in_window,
)
from engine.store.connection import PackedConnections, lua_script

CHARGE_SCRIPT = lua_script(__package__, "charge.lua")
CHARGE_SHA = hashlib.sha1(CHARGE_SCRIPT.encode(), usedforsecurity=False).hexdigest().encode()
LINES_KEPT = 4  # connections kept for bucket reads and charges between writes
INDEX = "subs:budgets"  # bucket id -> when it expires: the admin listing reads it


def use_key(bucket_id: str) -> str:
    """A bucket's sub-buckets and facts (hash)."""
    return f"subs:{{bud:{bucket_id}}}:use"


def seen_key(bucket_id: str) -> str:
    """The charge ids a bucket has counted in its window (sorted set)."""
    return f"subs:{{bud:{bucket_id}}}:seen"


@dataclass(frozen=True)
class BucketUse:
    """A bucket as read: what it holds in its window, and when it frees up."""

    policy: str
    group: str
    dimension: str
    limit: str
    window_ms: int
    used: str  # tokens, or USD
    frees_at: int | None  # epoch ms; None while under its limit


def charge_message(charge: Charge) -> dict[str, Any]:
    """A charge as the commit puts it in the outbox (`to` empty: no session receives it)."""
    return {
        "to": "",
        "charge": {
            "id": charge.id,
            "at": charge.at_ms,
            "buckets": [
                {
                    "id": ref.id,
                    "policy": ref.policy.name,
                    "group": ref.group,
                    "dimension": ref.policy.dimension,
                    "limit": ref.policy.limit,
                    "window_ms": ref.policy.window_ms,
                    "slot_ms": ref.policy.slot_ms,
                    "amount": amount,
                }
                for ref, amount in charge.buckets
            ],
        },
    }


def _as_map(reply: Any) -> dict[bytes, bytes]:
    """A hash as HGETALL's reply: a map (RESP3) or a flat list of fields and values."""
    if isinstance(reply, dict):
        return reply
    items = list(reply or ())
    return dict(zip(items[::2], items[1::2], strict=True))


def _slots(fields: dict[bytes, bytes]) -> dict[int, int]:
    out = {}
    for k, v in fields.items():
        if not k.startswith(b"_"):
            out[int(k)] = int(v)
    return out


def _policy_of(fields: dict[bytes, bytes]) -> BudgetPolicy:
    """The policy a stored bucket was last charged under (its `_` facts)."""
    window = int(fields.get(b"_window_ms", b"0"))
    return BudgetPolicy(
        name=fields.get(b"_policy", b"").decode(),
        group_by=(),
        dimension=fields.get(b"_dimension", b"total_tokens").decode(),
        limit=fields.get(b"_limit", b"0").decode(),
        window="",
        window_ms=window,
        strategy="reject",
    )


def _use(policy: BudgetPolicy, group: str, slots: dict[int, int], now_ms: int) -> BucketUse:
    units, frees_at = usage_in_window(slots, policy, now_ms)
    used = from_units(policy.dimension, units)
    return BucketUse(
        policy=policy.name,
        group=group,
        dimension=policy.dimension,
        limit=policy.limit,
        window_ms=policy.window_ms,
        used=format(used.normalize(), "f") if used else "0",
        frees_at=frees_at,
    )


class BudgetBuckets(PackedConnections):
    """The store's commands on budget buckets (mixed into `Store`).

    A step that starts a model call reads its buckets, and each settled call charges
    them: both are packed here and sent in one write per server (connection.py), as the
    hot path's commits are (a one-bucket read: 25-30 µs of CPU against 104 through
    redis-py's pipeline; a charge 60-90 µs against 156 for its script and ZADD, measured
    3000 times each). On a Cluster a session's buckets sit in several slots: one write
    per master, at once."""

    _bucket_lines: list[AbstractConnection] | None = None  # kept between writes (one server)

    async def charge(self, message: dict[str, Any], now_ms: int) -> int:
        """Apply one outbox charge to each of its buckets; how many counted it anew (0
        when every bucket had already counted it). Every bucket's script and the index's
        entries in one write per server; a server that lost the script (restarted, or a
        replica just promoted) is given it and asked again for the charges it refused.
        The index is told each bucket's expiry even when the script did not count (the
        charge was counted already, or is out of the window): an entry may then outlive
        its bucket by a window, and the listing passes over a bucket that is gone."""
        at = int(message["at"])
        calls: list[tuple[str, list[Any]]] = []
        index: list[Any] = []
        for b in message["buckets"]:
            bid = str(b["id"])
            slot_ms, window = int(b["slot_ms"]), int(b["window_ms"])
            use = use_key(bid)
            args = [
                message["id"],
                at,
                now_ms,
                slot_ms,
                SLOTS,
                int(b["amount"]),
                b["policy"],
                b["group"],
                b["dimension"],
                b["limit"],
                window,
            ]
            calls.append((use, [b"EVALSHA", CHARGE_SHA, 2, use, seen_key(bid), *args]))
            index += [(max(at, now_ms) // slot_ms + SLOTS) * slot_ms, bid]
        if not calls:
            return 0
        calls.append((INDEX, [b"ZADD", INDEX, b"GT", *index]))
        replies = await self._packed(calls, self._charge_write)
        return sum(1 for counted in replies[:-1] if counted)

    async def read_buckets(self, refs: Sequence[BucketRef], now_ms: int) -> list[BucketUse]:
        """What each bucket holds in its window as of `now_ms` (one round trip)."""
        if not refs:
            return []
        keys = [use_key(ref.id) for ref in refs]
        replies = await self._packed([(key, [b"HGETALL", key]) for key in keys], self._one_write)
        return [
            _use(ref.policy, ref.group, _slots(_as_map(fields)), now_ms)
            for ref, fields in zip(refs, replies, strict=True)
        ]

    async def _packed(
        self,
        commands: list[tuple[str, list[Any]]],
        write: Callable[[str, list[list[Any]]], Awaitable[list[Any]]],
    ) -> list[Any]:
        """Each command (with the key that places it) on the server holding its key, by
        `write`: one write per server, those to several servers at once; the replies in
        order."""
        if self.cluster is None:
            return await write(commands[0][0], [c for _, c in commands])
        groups: dict[str, list[int]] = {}
        for i, (key, _) in enumerate(commands):
            node = self.cluster.get_node_from_key(key)
            groups.setdefault(node.name if node is not None else key, []).append(i)
        parts = await asyncio.gather(
            *(write(commands[ix[0]][0], [commands[i][1] for i in ix]) for ix in groups.values())
        )
        replies: list[Any] = [None] * len(commands)
        for ix, part in zip(groups.values(), parts, strict=True):
            for i, reply in zip(ix, part, strict=True):
                replies[i] = reply
        return replies

    async def _charge_write(self, key: str, commands: list[list[Any]]) -> list[Any]:
        """Charges to one server; one that lost the script (restarted, or a replica just
        promoted) refused them all: it is given the script and they are sent again."""
        try:
            return await self._one_write(key, commands)
        except NoScriptError:
            await self.redis.script_load(CHARGE_SCRIPT)
            return await self._one_write(key, commands)

    async def _one_write(self, key: str, commands: list[list[Any]]) -> list[Any]:
        """`commands` to the server holding `key`, packed by hiredis in one write. On one
        server a few connections are kept for these between calls, as the commits' are
        (the pool's checkout and release were half a read's CPU); on a Cluster, whose
        masters change, each write takes one of the slot's master from its pool."""
        idle = self._bucket_lines
        if idle is None and self.cluster is None:
            idle = self._bucket_lines = []
        conn = idle.pop() if idle else await self._connection(key)
        try:
            replies = await self._ask(conn, commands)
        except BaseException as err:
            await self._put_back(conn, err)  # replies may be left unread on it
            while idle:  # the server may have gone (restarted): the kept ones with it
                await self._put_back(idle.pop(), err)
            raise
        if idle is not None and len(idle) < LINES_KEPT:
            idle.append(conn)
        else:
            await self._put_back(conn, None)
        return replies

    async def list_buckets(self, now_ms: int, limit: int = 1000) -> list[BucketUse]:
        """Every bucket still inside its window, as last charged (the admin listing)."""
        await self.redis.zremrangebyscore(INDEX, "-inf", now_ms)
        ids = cast(list[bytes], await self.redis.zrange(INDEX, 0, limit - 1))
        if not ids:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for bid in ids:
                pipe.hgetall(use_key(bid.decode()))
            replies = cast(list[dict[bytes, bytes]], await pipe.execute())
        out = []
        for fields in replies:
            if not fields:
                continue
            policy = _policy_of(fields)
            if policy.window_ms <= 0:
                continue
            out.append(_use(policy, fields.get(b"_group", b"").decode(), _slots(fields), now_ms))
        return sorted(out, key=lambda u: (u.policy, u.group))
