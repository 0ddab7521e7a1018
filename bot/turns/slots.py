"""A storm stays bounded: at most `max_concurrent_turns` of a Slack app's turns run at once,
across every `subs serve` process on one Redis; the others wait in arrival order.

The count lives in Redis (bot/turns/store.py `Slots`): a turn takes a slot before its input
reaches the engine and gives it back once the engine's turn has ended, so the model calls in
flight for the app never exceed the limit. A turn that cannot run yet takes a ticket; in this
process only the waiting turn with the lowest ticket asks Redis again (at once when one of
ours ends, else every `POLL_S`: a turn of another process ending), so a hundred waiting turns
cost one Redis call per poll, not a hundred. Slots and places are leased like the followers'
checkpoints: a process that dies frees its slots within one lease, and its turns, resumed by
another process (bot/turns/follower.py), queue there anew.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from bot.turns.store import Slots

__all__ = ["POLL_S", "Queued", "Slot", "TurnSlots"]

log = logging.getLogger(__name__)

POLL_S = 0.2  # how soon a slot freed by another process is taken up
REDIS_RETRY_S = 1.0  # between asks while Redis does not answer (one log line each)
# Told a turn waits: how many wait before it, and a future done once its slot came (it
# should stop soon after: its turn is running).
Queued = Callable[[int, asyncio.Future[None]], Awaitable[None]]


@dataclass(order=True)
class _Waiting:
    ticket: int
    order: int  # ties (never expected) by arrival here
    member: str = field(compare=False)
    granted: asyncio.Future[None] = field(compare=False)


class Slot:
    """One turn's claim on its app's slots; `release` is safe to call more than once."""

    def __init__(self, slots: TurnSlots, agent: str, member: str, limit: int) -> None:
        self._slots = slots
        self.agent = agent
        self.member = member
        self.limit = limit
        self.running = False
        self._done = False

    async def take(self, queued: Queued) -> None:
        """Return once the turn may run; if it must wait, `queued(ahead, granted)` runs
        meanwhile (the thread is told), while its place in line is kept."""
        await self._slots.take(self, queued)

    async def release(self) -> None:
        """The turn ended, failed or was cancelled: give the slot (or the place) back."""
        if not self._done:
            self._done = True
            await self._slots.release(self)


class TurnSlots:
    """This process's side of the slots: its waiting turns, in ticket order per app."""

    def __init__(self, store: Slots, owner: str, poll_s: float = POLL_S) -> None:
        self.store = store
        self.owner = owner
        self.poll_s = poll_s
        self._waiting: dict[str, list[_Waiting]] = {}  # agent -> heap
        self._running: dict[str, set[str]] = {}
        self._limits: dict[str, int] = {}
        self._wake: dict[str, asyncio.Event] = {}
        self._pumps: dict[str, asyncio.Task[None]] = {}
        self._order = itertools.count()

    def slot(self, agent: str, turn_key: str, limit: int) -> Slot:
        return Slot(self, agent, f"{self.owner} {turn_key}", limit)

    async def take(self, slot: Slot, queued: Queued) -> None:
        agent = slot.agent
        self._limits[agent] = slot.limit
        running, ticket, ahead = await self.store.take(agent, slot.member, slot.limit)
        if running:
            self._running.setdefault(agent, set()).add(slot.member)
            slot.running = True
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(
            self._waiting.setdefault(agent, []),
            _Waiting(ticket, next(self._order), slot.member, granted),
        )
        if agent not in self._pumps:
            self._pumps[agent] = asyncio.create_task(self._pump(agent), name=f"slots-{agent}")
        try:
            await queued(ahead, granted)
            await granted
        except BaseException:
            granted.cancel()  # the pump skips it (or, granted meanwhile, release gives it back)
            raise
        slot.running = True

    async def release(self, slot: Slot) -> None:
        self._running.get(slot.agent, set()).discard(slot.member)
        await self.store.leave(slot.agent, slot.member)
        self._wake.setdefault(slot.agent, asyncio.Event()).set()

    async def keep(self) -> None:
        """Renew the leases of our running and waiting turns (the followers' lease round)."""
        for agent in set(self._running) | set(self._waiting):
            members = set(self._running.get(agent, ()))
            members |= {w.member for w in self._waiting.get(agent, []) if not w.granted.done()}
            await self.store.keep(agent, sorted(members))

    async def aclose(self) -> None:
        pumps, self._pumps = list(self._pumps.values()), {}
        for task in pumps:
            task.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)

    async def _pump(self, agent: str) -> None:
        """Ask for the slot of our first waiting turn until none waits."""
        heap = self._waiting[agent]
        wake = self._wake.setdefault(agent, asyncio.Event())
        try:
            while heap:
                head = heap[0]
                if head.granted.done():  # its follower stopped waiting
                    heapq.heappop(heap)
                    continue
                wake.clear()
                try:
                    running, ticket, _ = await self.store.take(
                        agent, head.member, self._limits[agent]
                    )
                except Exception as err:  # Redis away a moment: ask again in a second
                    log.warning("slack: asking for a turn slot failed: %s", err)
                    await asyncio.sleep(REDIS_RETRY_S)
                    continue
                if running:
                    _drop(heap, head)  # not heappop: a lower ticket may have come meanwhile
                    if head.granted.done():  # cancelled while we asked: not ours to keep
                        await self.store.leave(agent, head.member)
                        continue
                    self._running.setdefault(agent, set()).add(head.member)
                    head.granted.set_result(None)
                    continue
                if ticket != head.ticket:  # its place lapsed (a long stall): new ticket
                    _drop(heap, head)
                    heapq.heappush(heap, _Waiting(ticket, head.order, head.member, head.granted))
                    continue
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), self.poll_s)
        finally:
            self._pumps.pop(agent, None)


def _drop(heap: list[_Waiting], entry: _Waiting) -> None:
    heap.remove(entry)
    heapq.heapify(heap)
