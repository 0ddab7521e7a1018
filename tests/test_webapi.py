"""Governed Web API calls against a FakeSlack enforcing its limits (20x faster than Slack's)."""

from __future__ import annotations

import asyncio
import itertools

from slack_sdk.web.async_client import AsyncWebClient

from bot.governor import TIERS, RateGovernor
from bot.webapi import governed
from tests.fakes.slack import FakeSlack

SPEEDUP = 20


async def test_concurrent_posts_in_one_channel_queue_without_a_429() -> None:
    """Many threads' first posts at once: each takes its own slot, none collide."""
    async with FakeSlack(time_scale=1 / SPEEDUP) as fake:
        web = AsyncWebClient(token=fake.bot_token, base_url=fake.url)
        governor = RateGovernor({m: per_minute * SPEEDUP for m, per_minute in TIERS.items()})
        channel = fake.general.id

        async def post(n: int) -> str:
            args = {"channel": channel, "text": f"reply {n}"}
            answer = await governed(governor, fake.team.id, web, "chat.postMessage", args)
            return str(answer["ts"])

        posted = await asyncio.wait_for(asyncio.gather(*(post(n) for n in range(12))), 10)
    calls = fake.calls("chat.postMessage")
    assert len(set(posted)) == 12 and len(calls) == 12  # every post went once
    assert not [c for c in calls if c.status == 429]
    gaps = [b.at - a.at for a, b in itertools.pairwise(calls)]
    gap = 60 / (TIERS["chat.postMessage"] * SPEEDUP)
    assert min(gaps) > gap * 0.8  # spaced at the tier, not fired together
