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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

from engine.machine.policies import (
    SLOTS,
    BucketRef,
    BudgetPolicy,
    Charge,
    from_units,
    usage_in_window,
)
from engine.store.connection import RedisClient, lua_script

CHARGE_SCRIPT = lua_script(__package__, "charge.lua")
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


class BudgetBuckets:
    """The store's commands on budget buckets (mixed into `Store`)."""

    redis: RedisClient
    _charge: AsyncScript | None = None

    async def charge(self, message: dict[str, Any], now_ms: int) -> int:
        """Apply one outbox charge to each of its buckets; how many counted it anew (0
        when every bucket had already counted it). One round trip on one server: every
        bucket's script and the index's entries in one pipeline (a server that lost the
        script, restarted, is given it and asked again: a bucket counts a charge once).
        The index is told each bucket's expiry even when the script did not count (the
        charge was counted already, or is out of the window): an entry may then outlive
        its bucket by a window, and the listing passes over a bucket that is gone."""
        if self._charge is None:
            self._charge = self.redis.register_script(CHARGE_SCRIPT)
        at = int(message["at"])
        calls: list[tuple[str, str, list[Any]]] = []
        index: dict[str, int] = {}
        for b in message["buckets"]:
            bid = str(b["id"])
            slot_ms, window = int(b["slot_ms"]), int(b["window_ms"])
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
            calls.append((use_key(bid), seen_key(bid), args))
            index[bid] = (max(at, now_ms) // slot_ms + SLOTS) * slot_ms
        if not calls:
            return 0
        for attempt in range(2):
            try:
                async with self.redis.pipeline(transaction=False) as pipe:
                    for use, seen, args in calls:
                        pipe.evalsha(self._charge.sha, 2, use, seen, *args)
                    pipe.zadd(INDEX, index, gt=True)
                    replies = await pipe.execute()
                return sum(1 for counted in replies[: len(calls)] if counted)
            except NoScriptError:
                if attempt:
                    raise
                await self.redis.script_load(CHARGE_SCRIPT)
        raise AssertionError("unreachable")

    async def read_buckets(self, refs: Sequence[BucketRef], now_ms: int) -> list[BucketUse]:
        """What each bucket holds in its window as of `now_ms` (one round trip on one server)."""
        if not refs:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for ref in refs:
                pipe.hgetall(use_key(ref.id))
            replies = cast(list[dict[bytes, bytes]], await pipe.execute())
        return [
            _use(ref.policy, ref.group, _slots(fields or {}), now_ms)
            for ref, fields in zip(refs, replies, strict=True)
        ]

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
