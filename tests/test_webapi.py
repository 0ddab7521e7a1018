"""Governed Web API calls against a FakeSlack enforcing its limits (20x faster than Slack's)."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest
from slack_sdk.web.async_client import AsyncWebClient

from bot.slack.governor import TIERS, RateGovernor, scope
from bot.slack.webapi import governed
from tests.engine_helpers import poll_until
from tests.fakes.slack import FakeSlack

SPEEDUP = 20


async def test_concurrent_posts_in_one_channel_queue_without_a_429() -> None:
    """Many threads' first posts at once: each takes its own slot, none collide.

    The spacing is read from the slots the governor booked, not from when the posts
    reached the fake: on a loaded machine two timers that fire late fire together, which
    says nothing about the schedule (and the fake's burst absorbs it, as Slack's does).
    """
    async with FakeSlack(time_scale=1 / SPEEDUP) as fake:
        web = AsyncWebClient(token=fake.bot_token, base_url=fake.url)
        governor = RateGovernor({m: per_minute * SPEEDUP for m, per_minute in TIERS.items()})
        booked: list[float] = []
        record = governor.record

        def booking(budget: str, method: str, slot: float) -> None:
            booked.append(slot)
            record(budget, method, slot)

        governor.record = booking  # type: ignore[method-assign]
        channel = fake.general.id

        async def post(n: int) -> str:
            args = {"channel": channel, "text": f"reply {n}"}
            answer = await governed(governor, fake.team.id, web, "chat.postMessage", args)
            return str(answer["ts"])

        posted = await asyncio.wait_for(asyncio.gather(*(post(n) for n in range(12))), 30)
    calls = fake.calls("chat.postMessage")
    assert len(set(posted)) == 12 and len(calls) == 12  # every post went once
    assert not [c for c in calls if c.status == 429]
    gap = 60 / (TIERS["chat.postMessage"] * SPEEDUP)
    assert len(booked) == 12  # one slot each: no post was sent again
    assert [b - a for a, b in itertools.pairwise(booked)] == pytest.approx([gap] * 11)


async def test_a_booked_call_waits_out_a_retry_after_that_came_meanwhile() -> None:
    """A call waiting for its booked slot when another call's 429 arrives holds back until
    the Retry-After has passed, not just until its slot."""
    async with FakeSlack(time_scale=1 / SPEEDUP) as fake:
        web = AsyncWebClient(token=fake.bot_token, base_url=fake.url)
        governor = RateGovernor({**TIERS, "chat.postMessage": 300})  # 200 ms apart
        team, loop = fake.team.id, asyncio.get_running_loop()

        async def post(text: str) -> None:
            args = {"channel": fake.general.id, "text": text}
            await governed(governor, team, web, "chat.postMessage", args)

        await post("first")
        budget = scope(team, "chat.postMessage", fake.general.id)
        booked = governor.next_slot(budget, "chat.postMessage", loop.time())
        assert booked > loop.time()  # the next slot is still ahead
        waiting = asyncio.create_task(post("second"))

        async def slot_taken() -> bool:  # the second call has booked that slot
            return governor.next_slot(budget, "chat.postMessage", loop.time()) > booked

        await poll_until(slot_taken, timeout=1, what="the second call to book its slot")
        assert not waiting.done()  # waiting for its slot when the 429 comes
        penalised_at = time.time()
        governor.penalise(budget, "chat.postMessage", 0.3, loop.time())
        await asyncio.wait_for(waiting, 5)
    second = fake.calls("chat.postMessage")[1]
    assert second.args["text"] == "second"
    assert second.at - penalised_at >= 0.3


async def test_a_call_unless_takes_only_a_free_slot_and_gives_way() -> None:
    """`governed(unless=...)` (a queued turn's note) never books ahead: posts that must go,
    called after it, go first; once `unless` is done it is not made at all."""
    async with FakeSlack(time_scale=1 / SPEEDUP) as fake:
        web = AsyncWebClient(token=fake.bot_token, base_url=fake.url)
        governor = RateGovernor({**TIERS, "chat.postMessage": 600})  # 100 ms apart
        team, channel = fake.team.id, fake.general.id
        loop = asyncio.get_running_loop()

        def post(text: str, unless: asyncio.Future[None] | None = None) -> asyncio.Task[object]:
            args = {"channel": channel, "text": text}
            call = governed(governor, team, web, "chat.postMessage", args, unless=unless)
            return asyncio.ensure_future(call)

        first = post("reply 0")  # takes the free slot: the next is 100 ms away
        never: asyncio.Future[None] = loop.create_future()
        note = post("note", never)
        replies = [post(f"reply {n}") for n in (1, 2)]
        await asyncio.gather(first, *replies, note)
        texts = [c.args["text"] for c in fake.calls("chat.postMessage")]
        assert texts == ["reply 0", "reply 1", "reply 2", "note"]

        granted: asyncio.Future[None] = loop.create_future()
        busy = post("reply 3")
        gone = post("note 2", granted)
        granted.set_result(None)  # the turn's slot came before a post slot was free
        assert await gone is None
        await busy
        assert "note 2" not in [c.args["text"] for c in fake.calls("chat.postMessage")]
