"""Budget policies (`[[budgets]]`, issue #28): usage buckets over time and people.

A policy names a `dimension` (`total_tokens` | `cost_usd`), a `limit` over a rolling
`window`, and `group_by` keys (`agent`, `user`, `channel`, `session`): each distinct
value of those keys is one bucket. A session falls into a policy's bucket when its
`match` conditions hold and it has every `group_by` key (a session with no Slack
channel is in no per-channel bucket), as the original engine resolves them.

The keys of a session: its agent, a subject (`issuer:id`: a Slack user, a token's `sub`,
an API key), the Slack channel its identity names, and its id. The subject is the running
turn's submitter (the shell passes it in the identity), so in a shared thread each person
spends their own bucket; the other keys are fixed for the session's life.

Everything here is pure: the shell reads the buckets' usage from Redis before a step
(engine/store/buckets.py) and hands the machine `Bucket`s; the machine decides from them
(budgets.py) and what it decided is recorded in the events it emits (the failed turn's
detail, the interrupt's metadata), so a replay folds the same.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from . import events as ev
from .evolve import Event

GROUP_KEYS = ("agent", "user", "channel", "session")
DIMENSIONS = ("total_tokens", "cost_usd")
STRATEGIES = ("reject", "interrupt")
SLOTS = 60  # a window is kept as this many sub-buckets: memory bounded, whatever the traffic
NANO = Decimal(1_000_000_000)  # cost is counted in nano-USD: integers add exactly in Redis

_WINDOW = re.compile(r"(\d+)(s|m|h|d)")
_WINDOW_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def window_ms(text: str) -> int:
    """`"5m"`, `"1h"`, `"30d"` as milliseconds.

    Raises:
        ValueError: not such a duration, or 0.
    """
    match = _WINDOW.fullmatch(text.strip().lower())
    if match is None or int(match.group(1)) == 0:
        raise ValueError(f'must be a duration like "5m", "1h" or "30d" (more than 0), got {text!r}')
    return int(match.group(1)) * _WINDOW_MS[match.group(2)]


@dataclass(frozen=True)
class BudgetPolicy:
    """One `[[budgets]]` entry, checked (engine/config/budgets.py builds it)."""

    name: str
    group_by: tuple[str, ...]
    dimension: str  # total_tokens | cost_usd
    limit: str  # a decimal: tokens, or USD
    window: str  # as written ("1h")
    window_ms: int
    strategy: str  # reject | interrupt
    match: tuple[tuple[str, str], ...] = ()

    @property
    def slot_ms(self) -> int:
        """One sub-bucket's span: the window in `SLOTS` parts (at least a second)."""
        return max(1000, -(-self.window_ms // SLOTS))


@dataclass(frozen=True)
class BucketRef:
    """Where one policy's bucket for one group lives, and what it counts to."""

    policy: BudgetPolicy
    group: str  # "user=slack:U1,agent=oncall" (empty: the whole deployment)

    @property
    def id(self) -> str:
        """A stable short name for the bucket's Redis keys (the group may hold any text)."""
        raw = f"{self.policy.name}\n{self.group}".encode()
        return hashlib.sha1(raw, usedforsecurity=False).hexdigest()[:20]


@dataclass(frozen=True)
class Bucket:
    """A bucket's usage as the shell read it: the facts the machine checks a model call
    against."""

    policy: str
    group: str
    dimension: str
    limit: str
    used: str  # tokens, or USD, counted in the window as of the read
    frees_at: int | None  # epoch ms when enough of it leaves the window to be under its limit
    strategy: str


@dataclass(frozen=True)
class Unread:
    """In place of a step's buckets: the session counts toward some, not read yet.

    Most steps start no model call (a tool's answer a worker will decide on, a timer, a
    delta), so the shell does not read the buckets before a step: the machine lets a
    model call through and records its check (`PolicyCheck`, in the transition), and the
    shell reads the buckets only when there is one. If the figures refuse or hold a call
    the step let through, the shell runs the step again with them (budgets.py
    `first_over`), so a call is refused exactly as when they were read first."""

    def __bool__(self) -> bool:
        return True  # buckets exist: a model call wants an estimate, as with figures


UNREAD = Unread()


@dataclass(frozen=True)
class PolicyCheck:
    """A model call let through before its buckets were read (`Unread`): what checking
    it against them takes, as of the moment it was made."""

    estimate: dict[str, Any] | None  # the call's input estimate (budgets.estimate)
    raised: tuple[tuple[str, int], ...]  # the turn's approved raises then (`policy:<name>`)


def context_of(
    session_id: str, agent_id: str, identity: Mapping[str, Any] | None
) -> dict[str, str]:
    """The group and match keys a session has (GROUP_KEYS; a missing one is left out)."""
    ctx = {"agent": agent_id, "session": session_id}
    subject = (identity or {}).get("subject")
    if isinstance(subject, dict) and subject.get("id"):
        issuer = subject.get("issuer")
        ctx["user"] = f"{issuer}:{subject['id']}" if issuer else str(subject["id"])
    channel = ((identity or {}).get("metadata") or {}).get("slack_channel")
    if isinstance(channel, str) and channel:
        ctx["channel"] = channel
    return ctx


def buckets_for(policies: Iterable[BudgetPolicy], ctx: Mapping[str, str]) -> list[BucketRef]:
    """The buckets a session with keys `ctx` counts toward, in the policies' order."""
    out = []
    for policy in policies:
        if any(ctx.get(k) != v for k, v in policy.match):
            continue
        if any(k not in ctx for k in policy.group_by):
            continue
        group = ",".join(f"{k}={ctx[k]}" for k in policy.group_by)
        out.append(BucketRef(policy, group))
    return out


def amount_of(dimension: str, usage: Mapping[str, Any] | None, cost: str) -> int:
    """What one settled call adds to a bucket of `dimension`, in its integer unit
    (tokens, or nano-USD)."""
    if dimension == "cost_usd":
        return int((Decimal(cost or "0") * NANO).to_integral_value())
    usage = usage or {}
    total = usage.get("total")
    if total is None:
        total = int(usage.get("input") or 0) + int(usage.get("output") or 0)
    return int(total or 0)


def from_units(dimension: str, units: int) -> Decimal:
    """A bucket's integer count as tokens or USD."""
    return Decimal(units) / NANO if dimension == "cost_usd" else Decimal(units)


def usage_in_window(
    slots: Mapping[int, int], policy: BudgetPolicy, now_ms: int
) -> tuple[int, int | None]:
    """A bucket's units in the window as of `now_ms` (its sub-buckets still inside it), and
    when it frees up: the time enough of the oldest leave the window to bring it under its
    limit (None while it is under)."""
    slot_ms = policy.slot_ms
    first = now_ms // slot_ms - SLOTS + 1  # the oldest sub-bucket still counted
    live = sorted((i, n) for i, n in slots.items() if i >= first and n)
    used = sum(n for _, n in live)
    limit = Decimal(policy.limit)
    limit_units = limit * NANO if policy.dimension == "cost_usd" else limit
    if used < limit_units:
        return used, None
    left = used
    for i, n in live:
        left -= n
        if left < limit_units:
            return used, (i + SLOTS) * slot_ms
    return used, None  # unreachable: the loop empties it


@dataclass(frozen=True)
class Charge:
    """One settled model call's usage, to be added to each of its session's buckets."""

    id: str  # session/call/attempt: the bucket counts it once however often it is applied
    at_ms: int
    buckets: tuple[tuple[BucketRef, int], ...]


def charges(
    refs: list[BucketRef], session_id: str, events: Iterable[Event], at_ms: int
) -> list[Charge]:
    """What a committed transition's settled model calls add to the session's buckets."""
    out: list[Charge] = []
    if not refs:
        return out
    for event in events:
        p = event["payload"]
        if p["type"] != ev.LLM_CALL_COMPLETED:
            continue
        amounts = tuple(
            (ref, amount_of(ref.policy.dimension, p.get("usage"), p.get("cost") or "0"))
            for ref in refs
        )
        amounts = tuple((ref, n) for ref, n in amounts if n > 0)
        if amounts:
            out.append(Charge(f"{session_id}/{p['id']}/{p['attempt']}", at_ms, amounts))
    return out
