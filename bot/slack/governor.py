"""Pacing Slack Web API calls: one budget per workspace and method, shared by all threads.

SPEC §14: edits are coalesced and paced so the app stays inside Slack's per-method,
per-workspace limits across every concurrent thread, honouring `Retry-After`; the final
text always lands. Three layers:

- `RateGovernor` (pure): when the next call of a method may go in a workspace.
- `Coalescer` (pure): pending versions of messages; a newer version of a message replaces
  the older one, and distinct messages take turns (round robin), so no thread starves.
- `Paced` (async shell): one pump per (workspace, method) that waits for the governor's slot,
  sends the oldest waiting message's latest version, and requeues it after a 429.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from engine.errors import SubsError
from engine.telemetry.live import in_live

__all__ = ["PER_CHANNEL", "TIERS", "Coalescer", "Paced", "RateGovernor", "RateLimited", "scope"]

log = logging.getLogger(__name__)

# Calls per minute, at the floor of each published tier (notes/slack-facts.md). Limits apply
# "per API method per workspace/team per app" and answer 429 + Retry-After beyond (§1.5).
TIERS: dict[str, float] = {
    # "special": "generally allows posting one message per second per channel" (§1.5,
    # docs.slack.dev/apis/web-api/rate-limits); scoped per channel, see `scope`.
    "chat.postMessage": 60,
    "chat.update": 50,  # Tier 3, 50+/min per workspace (§1.5)
    "chat.startStream": 20,  # Tier 2, 20+/min (§1.1)
    "chat.appendStream": 100,  # Tier 4, 100+/min, shared by all open streams (§1.1, §1.2)
    "chat.stopStream": 20,  # Tier 2 (§1.1)
    # "special" with no published number (§1.4); Tier 3's floor is an assumption.
    "assistant.threads.setStatus": 50,
    "reactions.add": 50,  # Tier 3 (§1.5)
    "reactions.remove": 20,  # Tier 2 (§1.5)
    "conversations.replies": 50,  # Tier 3 (§1.5)
    "conversations.history": 50,  # Tier 3 (§1.5)
    "chat.postEphemeral": 100,  # Tier 4 (§1.5)
    "users.info": 100,  # Tier 4 (§1.5; oncall-facts §2.4)
    "bots.info": 50,  # Tier 3 (docs.slack.dev/reference/methods/bots.info)
    # Downloads of files (`url_private_download`): Slack publishes no rate for them; Tier 4's
    # floor is an assumption. Uploads: files.getUploadURLExternal and
    # files.completeUploadExternal are Tier 4 (slack-facts: files_upload_v2).
    "files.download": 100,
    "files.getUploadURLExternal": 100,
    "files.completeUploadExternal": 100,
    "usergroups.users.list": 20,  # Tier 2 (docs.slack.dev/reference/methods/usergroups.users.list)
}
PER_CHANNEL = frozenset({"chat.postMessage"})

K = TypeVar("K", bound=Hashable)
P = TypeVar("P")


def scope(team: str, method: str, channel: str) -> str:
    """The budget a call draws on: the workspace, or the channel for per-channel methods."""
    return f"{team}/{channel}" if method in PER_CHANNEL else team


@dataclass
class _Budget:
    last: float | None = None  # when the last call went
    blocked_until: float = float("-inf")  # a 429's Retry-After


class RateGovernor:
    """Spaces the calls of each (scope, method) evenly at the tier's rate.

    Even spacing (`60 / per_minute` apart) never puts more than `per_minute` calls in any
    minute and needs no burst allowance that Slack does not publish. Time is always passed
    in (`now`, seconds on any monotonic clock); the governor has no clock of its own.
    """

    def __init__(self, tiers: Mapping[str, float] = TIERS) -> None:
        self.tiers = dict(tiers)
        self._budgets: dict[tuple[str, str], _Budget] = {}

    def interval(self, method: str) -> float:
        """Seconds between two calls of `method` in one scope.

        Raises:
            KeyError: for a method without a tier.
        """
        if method not in self.tiers:
            raise KeyError(f"no rate tier for Slack method {method!r}")
        return 60.0 / self.tiers[method]

    def next_slot(self, team: str, method: str, now: float) -> float:
        """When the next call of `method` in `team` may go: `now` or later. Reads only."""
        gap = self.interval(method)
        budget = self._budgets.get((team, method))
        if budget is None:
            return now
        earliest = budget.blocked_until
        if budget.last is not None:
            earliest = max(earliest, budget.last + gap)
        return max(now, earliest)

    def blocked_until(self, team: str, method: str) -> float:
        """Until when a 429's Retry-After holds calls back (-inf when none did)."""
        budget = self._budgets.get((team, method))
        return budget.blocked_until if budget is not None else float("-inf")

    def record(self, team: str, method: str, at: float) -> None:
        """A call of `method` went (or is booked) at `at`. Mutates the budget."""
        budget = self._budget(team, method)
        budget.last = at if budget.last is None else max(budget.last, at)

    def penalise(self, team: str, method: str, retry_after: float, now: float) -> None:
        """Slack answered 429 with `Retry-After: retry_after`: nothing goes before then."""
        budget = self._budget(team, method)
        budget.blocked_until = max(budget.blocked_until, now + max(retry_after, 0.0))

    def _budget(self, team: str, method: str) -> _Budget:
        self.interval(method)
        return self._budgets.setdefault((team, method), _Budget())


class Coalescer(Generic[K, P]):
    """Latest versions of messages waiting for one budget, taken round robin.

    A key (a message) keeps its place in line while newer versions replace its payload;
    once taken, its next version queues behind every other waiting key.
    """

    def __init__(self) -> None:
        self._pending: OrderedDict[K, P] = OrderedDict()

    def __len__(self) -> int:
        return len(self._pending)

    def __contains__(self, key: object) -> bool:
        return key in self._pending

    def submit(self, key: K, payload: P) -> None:
        """Queue `payload` as the latest version of `key`, replacing a waiting one."""
        self._pending[key] = payload

    def pop(self) -> tuple[K, P] | None:
        """The next key in turn and its latest version, or None when nothing waits."""
        if not self._pending:
            return None
        return self._pending.popitem(last=False)

    def requeue(self, key: K, payload: P) -> None:
        """Put a version that could not be sent back at the front, unless a newer one is
        already waiting (then the newer one goes instead, in its place)."""
        if key not in self._pending:
            self._pending[key] = payload
            self._pending.move_to_end(key, last=False)


class RateLimited(SubsError):
    """Raised by a send function when Slack answered 429; `retry_after` in seconds."""

    code = "rate_limited"

    def __init__(self, retry_after: float) -> None:
        super().__init__(f"rate limited; retry after {retry_after} s", retryable=True)
        self.retry_after = retry_after


Send = Callable[[str, str, Any], Awaitable[None]]


class Paced:
    """Sends through `send(team, method, payload)` under a `RateGovernor`, coalesced.

    `submit` returns a future that resolves once that version, or a newer one of the same
    key, has been sent, and fails if its send failed (other than with `RateLimited`, which
    is retried after Retry-After). Callers may ignore the futures of interim versions.
    """

    def __init__(
        self,
        governor: RateGovernor,
        send: Send,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.governor = governor
        self._send = send
        self._clock = clock
        self._sleep = sleep
        self._lanes: dict[tuple[str, str], Coalescer[Hashable, Any]] = {}
        self._waiters: dict[tuple[str, str, Hashable], list[asyncio.Future[None]]] = {}
        self._pumps: dict[tuple[str, str], asyncio.Task[None]] = {}

    def submit(self, team: str, method: str, key: Hashable, payload: Any) -> asyncio.Future[None]:
        """Queue `payload` as the latest version of message `key` for `method` in `team`.

        Raises:
            KeyError: for a method without a tier.
        """
        self.governor.interval(method)  # an unknown method fails here, not in the pump
        if callable(payload):  # sent later by the pump: under the submitter's span, if any
            payload = in_live(payload)
        lane = (team, method)
        self._lanes.setdefault(lane, Coalescer()).submit(key, payload)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.add_done_callback(_observe)
        self._waiters.setdefault((team, method, key), []).append(done)
        if lane not in self._pumps:
            self._pumps[lane] = asyncio.create_task(self._pump(lane))
        return done

    async def drain(self) -> None:
        """Wait until everything submitted so far (and since) has been sent or failed."""
        while self._pumps:
            await asyncio.wait(list(self._pumps.values()))

    async def aclose(self) -> None:
        """Stop the pumps; versions not yet sent are cancelled."""
        pumps = list(self._pumps.values())
        for task in pumps:
            task.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
        for waiters in self._waiters.values():
            for w in waiters:
                w.cancel()
        self._waiters.clear()
        self._lanes.clear()

    async def _pump(self, lane: tuple[str, str]) -> None:
        team, method = lane
        pending = self._lanes[lane]
        try:
            while pending:
                now = self._clock()
                slot = self.governor.next_slot(team, method, now)
                if slot > now:
                    await self._sleep(slot - now)
                    continue  # a 429 may have moved the slot while we slept
                popped = pending.pop()
                assert popped is not None
                self.governor.record(team, method, now)
                await self._deliver(lane, *popped)
        finally:
            del self._pumps[lane]

    async def _deliver(self, lane: tuple[str, str], key: Hashable, payload: Any) -> None:
        team, method = lane
        waiters = self._waiters.pop((team, method, key), [])
        try:
            await self._send(team, method, payload)
        except RateLimited as limited:
            self.governor.penalise(team, method, limited.retry_after, self._clock())
            self._lanes[lane].requeue(key, payload)
            newer = self._waiters.get((team, method, key), [])
            self._waiters[(team, method, key)] = waiters + newer
            return
        except asyncio.CancelledError:
            for w in waiters:
                w.cancel()
            raise
        except Exception as err:
            log.warning("%s in %s failed: %s", method, team, err)
            for w in waiters:
                if not w.done():
                    w.set_exception(err)
            return
        for w in waiters:
            if not w.done():
                w.set_result(None)


def _observe(future: asyncio.Future[None]) -> None:
    """Mark a failure as seen: interim versions' futures are often dropped unawaited, and
    the pump has logged the failure already."""
    if not future.cancelled():
        future.exception()
