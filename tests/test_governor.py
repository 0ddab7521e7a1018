"""Slack calls are paced per workspace and method, coalesced per message, fair across threads."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest

from bot.slack.governor import TIERS, Coalescer, Paced, RateGovernor, RateLimited, scope

EPS = 1e-9


def test_tiers_are_the_published_floors() -> None:
    assert TIERS["chat.update"] == 50 and TIERS["chat.startStream"] == 20
    assert TIERS["chat.appendStream"] == 100 and TIERS["chat.stopStream"] == 20
    assert TIERS["chat.postMessage"] == 60
    assert scope("T1", "chat.postMessage", "C1") == "T1/C1"  # one per second per channel
    assert scope("T1", "chat.update", "C1") == "T1"  # per workspace


def test_governor_spaces_calls_and_keeps_budgets_apart() -> None:
    gov = RateGovernor({"chat.update": 50, "chat.startStream": 20})
    assert gov.next_slot("T1", "chat.update", 10.0) == 10.0  # nothing sent yet
    gov.record("T1", "chat.update", 10.0)
    assert gov.next_slot("T1", "chat.update", 10.5) == pytest.approx(11.2)
    assert gov.next_slot("T1", "chat.update", 12.0) == 12.0
    assert gov.next_slot("T2", "chat.update", 10.5) == 10.5  # another workspace
    assert gov.next_slot("T1", "chat.startStream", 10.5) == 10.5  # another method
    gov.record("T1", "chat.startStream", 10.5)
    assert gov.next_slot("T1", "chat.startStream", 10.6) == pytest.approx(13.5)
    with pytest.raises(KeyError, match=r"chat\.delete"):
        gov.next_slot("T1", "chat.delete", 0.0)


def test_retry_after_pushes_the_next_slot_out() -> None:
    gov = RateGovernor()
    gov.record("T1", "chat.update", 0.0)
    gov.penalise("T1", "chat.update", 30.0, now=0.5)
    assert gov.next_slot("T1", "chat.update", 1.0) == 30.5
    gov.penalise("T1", "chat.update", 2.0, now=1.0)  # a shorter one does not shorten it
    assert gov.next_slot("T1", "chat.update", 1.0) == 30.5
    gov.record("T1", "chat.update", 30.5)
    assert gov.next_slot("T1", "chat.update", 30.5) == pytest.approx(31.7)
    assert gov.next_slot("T2", "chat.update", 1.0) == 1.0  # only that workspace waits


def test_coalescer_keeps_the_latest_version_and_takes_turns() -> None:
    c: Coalescer[str, int] = Coalescer()
    for key, version in [("a", 1), ("b", 1), ("a", 2), ("c", 1), ("a", 3)]:
        c.submit(key, version)
    assert len(c) == 3 and "a" in c
    assert c.pop() == ("a", 3)  # its place in line, its latest version
    c.submit("a", 4)  # sent once: the next version queues behind the others
    assert [c.pop(), c.pop(), c.pop(), c.pop()] == [("b", 1), ("c", 1), ("a", 4), None]


def test_coalescer_requeue_goes_first_unless_superseded() -> None:
    c: Coalescer[str, int] = Coalescer()
    c.submit("a", 1)
    c.submit("b", 1)
    key, version = c.pop() or ("", 0)
    c.requeue(key, version)
    assert c.pop() == ("a", 1)
    c.submit("a", 2)
    c.requeue("a", 1)  # 429 on version 1 while version 2 waits: version 2 goes, in its place
    assert [c.pop(), c.pop()] == [("b", 1), ("a", 2)]


class World:
    """Virtual time for `Paced`: `sleep` moves the clock and delivers, in order, the planned
    submissions it passes. Nothing waits on real time and nothing races."""

    def __init__(self) -> None:
        self.now = 0.0
        self._plan: list[tuple[float, int, Callable[[], None]]] = []
        self._n = itertools.count()
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def at(self, when: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._plan, (when, next(self._n), action))

    async def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.sleeps.append(seconds)
        until = self.now + seconds
        while self._plan and self._plan[0][0] <= until:
            self._next()
        self.now = until

    def _next(self) -> None:
        when, _, action = heapq.heappop(self._plan)
        self.now = max(self.now, when)
        action()

    async def run(self, paced: Paced) -> None:
        """Play the plan: when nothing is waiting to be sent, jump to the next submission."""
        while self._plan:
            await paced.drain()
            if self._plan:
                self._next()
        await paced.drain()


class Slack:
    """Records sends; answers 429 on the calls listed in `limited` (call index -> seconds)."""

    def __init__(self, world: World, limited: dict[int, float] | None = None) -> None:
        self.world = world
        self.limited = limited or {}
        self.calls: list[tuple[float, str, str, Any]] = []
        self.fail: set[Any] = set()

    async def send(self, team: str, method: str, payload: Any) -> None:
        self.calls.append((self.world.now, team, method, payload))
        retry_after = self.limited.get(len(self.calls) - 1)
        if retry_after is not None:
            raise RateLimited(retry_after=retry_after)
        if payload in self.fail:
            raise RuntimeError(f"cannot send {payload}")

    def delivered(self) -> list[tuple[float, Any]]:
        """(time, payload) of the calls that went through."""
        return [(t, p) for i, (t, _, _, p) in enumerate(self.calls) if i not in self.limited]


THREADS, EDITS, SECONDS = 30, 100, 60.0


def plan_threads(world: World, paced: Paced) -> None:
    """30 threads each streaming 100 edits of their own message within 60 s."""
    for thread in range(THREADS):
        for version in range(EDITS):
            when = version * SECONDS / EDITS + thread * 0.013

            def submit(thread: int = thread, version: int = version) -> None:
                paced.submit("T1", "chat.update", thread, (thread, version))

            world.at(when, submit)


def assert_within_tier(times: list[float], per_minute: int) -> None:
    assert times == sorted(times)
    gap = 60.0 / per_minute
    assert all(b - a >= gap - EPS for a, b in itertools.pairwise(times))
    for i, start in enumerate(times):  # no 60 s window holds more than the tier
        assert sum(1 for t in times[i:] if t < start + 60.0 - EPS) <= per_minute


async def test_thirty_threads_share_one_workspace_budget_fairly() -> None:
    world = World()
    slack = Slack(world)
    paced = Paced(RateGovernor(), slack.send, clock=world.clock, sleep=world.sleep)
    plan_threads(world, paced)
    await world.run(paced)

    sent = slack.delivered()
    assert_within_tier([t for t, _ in sent], 50)
    assert sum(1 for t, _ in sent if t < SECONDS) == 50  # the budget is used, not wasted
    by_thread: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for t, (thread, version) in sent:
        by_thread[thread].append((t, version))
    assert sorted(by_thread) == list(range(THREADS))
    for thread, sends in by_thread.items():
        versions = [v for _, v in sends]
        assert versions == sorted(set(versions)), thread  # never an older version after a newer
        assert versions[-1] == EDITS - 1, thread  # the final version lands
        # Round robin: a thread with an edit waiting is served within one turn of all threads.
        times = [0.0] + [t for t, _ in sends]
        assert max(b - a for a, b in itertools.pairwise(times)) <= THREADS * 1.2 + 1.0, thread
    assert len(sent) < THREADS * EDITS / 10  # coalescing: one call per many edits


async def test_a_429_holds_the_method_and_the_newest_version_goes_after() -> None:
    world = World()
    slack = Slack(world, limited={3: 20.0})
    paced = Paced(RateGovernor(), slack.send, clock=world.clock, sleep=world.sleep)
    plan_threads(world, paced)
    await world.run(paced)

    limited_at = slack.calls[3][0]
    sent = slack.delivered()
    times = [t for t, _ in sent]
    assert not [t for t in times if limited_at < t < limited_at + 20.0 - EPS]
    after = next(p for t, p in sent if t >= limited_at + 20.0 - EPS)
    assert after[0] == slack.calls[3][3][0]  # the limited message goes first, in its turn
    assert after[1] >= slack.calls[3][3][1]  # in its newest version
    assert_within_tier(times, 50)
    finals = {thread: version for _, (thread, version) in sent}
    assert finals == dict.fromkeys(range(THREADS), EDITS - 1)


async def test_futures_resolve_when_a_version_or_a_newer_one_is_sent() -> None:
    world = World()
    slack = Slack(world, limited={0: 5.0})
    paced = Paced(RateGovernor(), slack.send, clock=world.clock, sleep=world.sleep)
    futures: dict[str, Any] = {}

    def submit(name: str, key: str) -> Callable[[], None]:
        def go() -> None:
            futures[name] = paced.submit("T1", "chat.update", key, name)

        return go

    world.at(0.0, submit("a1", "a"))  # 429 at t=0
    world.at(2.0, submit("a2", "a"))  # replaces a1 while the method is held
    world.at(3.0, submit("b1", "b"))
    slack.fail.add("b1")
    await world.run(paced)

    assert [(t, p) for t, _, _, p in slack.calls] == [(0.0, "a1"), (5.0, "a2"), (6.2, "b1")]
    assert futures["a1"].done() and futures["a1"].result() is None  # superseded, then sent
    assert futures["a2"].result() is None
    with pytest.raises(RuntimeError, match="cannot send b1"):
        futures["b1"].result()
    assert world.sleeps == [5.0, pytest.approx(1.2)]  # slept only until each slot


async def test_an_unknown_method_is_refused_at_submit() -> None:
    paced = Paced(RateGovernor(), Slack(World()).send)
    with pytest.raises(KeyError):
        paced.submit("T1", "chat.delete", "k", "p")


async def test_aclose_cancels_what_was_not_sent() -> None:
    world = World()
    slack = Slack(world)
    paced = Paced(RateGovernor(), slack.send, clock=world.clock, sleep=_never)
    first = paced.submit("T1", "chat.update", "a", 1)
    second = paced.submit("T1", "chat.update", "b", 1)
    await asyncio.wait([first], timeout=10)  # sent at once; "b" then waits for a slot...
    assert first.done() and first.result() is None
    await paced.aclose()
    assert second.cancelled() and [p for _, _, _, p in slack.calls] == [1]


async def _never(seconds: float) -> None:
    """...which never comes."""
    await asyncio.Event().wait()
