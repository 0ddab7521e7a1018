"""A storm stays bounded (issue 25, item 4): many mentions at once through Bolt and the real
slack_sdk against FakeSlack, the real engine on the real Redis, the model at the fake vendor,
which counts the requests it is answering at once (`FakeVendor.max_in_flight`).

The fake's rate limits are lifted (the bot's governor is the suite's fast one): what is
measured here is the app's own bound, not Slack's pacing (tests/test_slack_load.py).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from aiohttp import web

from bot.slack.governor import TIERS
from bot.turns.slots import TurnSlots
from bot.turns.store import Slots, slot_keys
from bot.turns.turn_follower import queued_text
from engine.config import parse_project
from tests.bot_helpers import AGENT, FAST, World, serve_bots
from tests.engine_helpers import project_toml
from tests.fakes.llm_vendor import FakeVendor, Text
from tests.fakes.slack import DEFAULT_LIMITS, FakeSlack, Limit, Message
from tests.test_bot import OPTIONS
from tests.workers import WorkerFactory

UNLIMITED = {method: None for method in DEFAULT_LIMITS}
ASK = re.compile(r"storm-(\d+)")
QUEUED = ":hourglass_flowing_sand: Queued"


def answer(n: int) -> str:
    return f"Alert {n} triaged: nothing to do."


def answering(vendor: FakeVendor, pace: float) -> None:
    """Each model call answers the storm message it carries, its stream's frames `pace`
    seconds apart (three chunks of Anthropic's stream are about ten frames)."""

    def reply_for(body: Any) -> Text:
        found = ASK.findall(json.dumps(body))
        assert found, "a model call for no storm message"
        return Text(answer(int(found[-1])), chunks=3, chunk_delay=pace)

    vendor.responder = reply_for


@asynccontextmanager
async def storm_world(
    redis: Any,
    vendor: FakeVendor,
    tmp_path: Path,
    limit: int,
    *,
    tiers: Mapping[str, float] = FAST,
    slack_limits: Mapping[str, Limit | None] = UNLIMITED,
) -> AsyncIterator[World]:
    text = project_toml(vendor.url, retry="retry = { llm = { backoff_base_secs = 0 } }")
    text += f'\n[agent.{AGENT}.slack]\nanswers = "both"\nmax_concurrent_turns = {limit}\n'
    project = parse_project(text, str(tmp_path / "subs.toml"), env={})
    async with serve_bots(
        redis, vendor, project, AGENT, slack_limits=slack_limits, tiers=tiers
    ) as world:
        yield world


async def all_answered(
    world: World,
    mentions: list[Message],
    timeout: float,
    numbers: list[int] | None = None,
    *,
    idle: bool = True,
) -> list[Message]:
    """Each mention's thread's app messages, once every thread shows its whole answer (the
    mentions are storm-0, storm-1, ... unless `numbers` says otherwise) and, with `idle`,
    every turn has ended."""
    fake = world.fake
    numbers = numbers if numbers is not None else list(range(len(mentions)))

    def replies(msg: Message) -> list[Message]:
        return [m for m in fake.thread(msg.channel, msg.ts) if fake.by_app(m)]

    def done() -> bool | None:
        return (
            all(
                any(m.text == answer(n) for m in replies(msg))
                for n, msg in zip(numbers, mentions, strict=True)
            )
            or None
        )

    await fake.until(done, timeout)
    if idle:
        await world.bots.idle()
    return [m for msg in mentions for m in replies(msg)]


async def test_fifty_mentions_at_once_are_each_answered_once_within_the_limit(
    redis: Any, vendor: FakeVendor, tmp_path: Path
) -> None:
    limit, n = 4, 50
    answering(vendor, pace=0.03)
    async with storm_world(redis, vendor, tmp_path, limit) as world:
        fake = world.fake
        mentions = [fake.post_as_user(fake.general, fake.mention(f"storm-{k}")) for k in range(n)]
        events = [fake.event_for(m, kind="app_mention") for m in mentions]
        sent = await asyncio.gather(*(fake.send_event(world.url, e) for e in events))
        assert all(s.status == 200 for s in sent)
        assert max(s.elapsed for s in sent) < 3  # Slack's ack deadline, every one of them

        replies = await all_answered(world, mentions, timeout=60)
        assert [m.text for m in replies] == [answer(k) for k in range(n)]  # one each
        assert len(vendor.requests) == n  # one model call per mention, none repeated
        assert 2 <= vendor.max_in_flight <= limit  # at once, but never more than the limit
        queued = [m for m in replies if fake.edits(m.channel, m.ts)[0].text.startswith(QUEUED)]
        # Most said they were queued, then answered (a note takes only a free post slot:
        # a turn whose slot came first says nothing of the wait).
        assert len(queued) >= n // 2
        assert not await world.client.store.redis.zcard(slot_keys(AGENT)[0])  # all slots free


async def test_a_storm_with_retried_deliveries_still_answers_each_once(
    redis: Any, vendor: FakeVendor, tmp_path: Path
) -> None:
    limit, n = 2, 12
    answering(vendor, pace=0.015)
    async with storm_world(redis, vendor, tmp_path, limit) as world:
        fake = world.fake
        mentions = [fake.post_as_user(fake.general, fake.mention(f"storm-{k}")) for k in range(n)]
        events = [fake.envelope(fake.event_for(m, kind="app_mention")) for m in mentions]
        first = [fake.send_event(world.url, e) for e in events]
        # Slack's retries (same event_id) of every other event, some while the first is in flight
        again = [fake.send_event(world.url, e, retry_num=1) for e in events[::2]]
        sent = await asyncio.gather(*first, *again)
        assert all(s.status == 200 and s.elapsed < 3 for s in sent)

        replies = await all_answered(world, mentions, timeout=30)
        assert [m.text for m in replies] == [answer(k) for k in range(n)]
        assert len(vendor.requests) == n
        assert vendor.max_in_flight <= limit


async def test_two_bot_processes_on_one_redis_share_the_limit(
    redis: Any, vendor: FakeVendor, tmp_path: Path
) -> None:
    """Half the storm reaches each of two bot processes' apps (as behind a load balancer, or
    Socket Mode spreading envelopes): together they never run more than the limit."""
    limit, n = 3, 24
    answering(vendor, pace=0.02)
    async with storm_world(redis, vendor, tmp_path, limit) as world:
        fake = world.fake
        async with world.successor() as second:
            app = web.Application()
            app.add_routes(second.routes())
            runner = web.AppRunner(app, shutdown_timeout=1)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            try:
                other = f"http://127.0.0.1:{runner.addresses[0][1]}/slack/{AGENT}/events"
                mentions = [
                    fake.post_as_user(fake.general, fake.mention(f"storm-{k}")) for k in range(n)
                ]
                events = [fake.event_for(m, kind="app_mention") for m in mentions]
                urls = [world.url, other] * (n // 2)
                sent = await asyncio.gather(
                    *(fake.send_event(u, e) for u, e in zip(urls, events, strict=True))
                )
                assert all(s.status == 200 and s.elapsed < 3 for s in sent)
                replies = await all_answered(world, mentions, timeout=60)
                await second.idle()
            finally:
                await runner.cleanup()
        assert [m.text for m in replies] == [answer(k) for k in range(n)]
        assert len(vendor.requests) == n
        assert 2 <= vendor.max_in_flight <= limit


async def test_a_storm_of_watched_alerts_is_bounded_too(
    redis: Any, vendor: FakeVendor, tmp_path: Path
) -> None:
    """Alerts an integration posts into a watched channel start turns with no mention: 20
    at once (every event Slack sends for each) are triaged once each, within the limit."""
    limit, n = 3, 20
    answering(vendor, pace=0.02)
    text = project_toml(vendor.url, retry="retry = { llm = { backoff_base_secs = 0 } }")
    text += (
        f"\n[agent.{AGENT}.slack]\nmax_concurrent_turns = {limit}\n"
        f'[[agent.{AGENT}.slack.watch]]\nchannel = "${{ALERTS_CHANNEL}}"\n'
        'from = ["Alertmanager"]\nmatch = "FIRING"\n'
    )
    project = parse_project(text, str(tmp_path / "subs.toml"), env={})

    def alerts_channel(fake: FakeSlack) -> dict[str, str]:
        return {"ALERTS_CHANNEL": fake.add_channel("alerts").id}

    async with serve_bots(
        redis, vendor, project, AGENT, slack_limits=UNLIMITED, slack_env=alerts_channel
    ) as world:
        fake = world.fake
        channel = next(c for c in fake.channels.values() if c.name == "alerts")
        app = fake.add_integration("Alertmanager")
        posts = [
            fake.post_as_integration(app, channel.id, {"text": f"[FIRING:1] storm-{k}"})
            for k in range(n)
        ]
        events = [fake.envelope(e) for post in posts for e in fake.events_for(post)]
        sent = await asyncio.gather(*(fake.send_event(world.url, e) for e in events))
        assert all(s.status == 200 and s.elapsed < 3 for s in sent)
        replies = await all_answered(world, posts, timeout=60)
        assert [m.text for m in replies] == [answer(k) for k in range(n)]
        assert len(vendor.requests) == n
        assert 2 <= vendor.max_in_flight <= limit


async def test_waiting_turns_run_in_arrival_order_and_say_where_they_are(
    redis: Any, vendor: FakeVendor, tmp_path: Path
) -> None:
    answering(vendor, pace=0.03)
    async with storm_world(redis, vendor, tmp_path, limit=1) as world:
        fake = world.fake
        mentions = []
        for k in range(4):  # one after another: the arrival order is known
            mention = fake.post_as_user(fake.general, fake.mention(f"storm-{k}"))
            sent = await fake.send_event(world.url, fake.event_for(mention, kind="app_mention"))
            assert sent.status == 200
            mentions.append(mention)
        replies = await all_answered(world, mentions, timeout=30)
        asked = [int(ASK.findall(json.dumps(r.body))[-1]) for r in vendor.requests]
        assert asked == [0, 1, 2, 3]
        assert vendor.max_in_flight == 1
        first_shown = [fake.edits(m.channel, m.ts)[0].text for m in replies]
        assert first_shown[1:] == [queued_text(k, 1) for k in range(3)]
        assert not first_shown[0].startswith(QUEUED)


async def test_running_turns_replies_do_not_queue_behind_the_storms_notes(
    redis: Any, vendor: FakeVendor, tmp_path: Path
) -> None:
    """With Slack's one chat.postMessage a second per channel (the governor's tier and the
    fake's bucket), the notes of queued turns take only free slots: the running turn's
    reply is posted before later notes, not after every one of them."""
    post = "chat.postMessage"
    answering(vendor, pace=0.1)  # about a second a turn
    async with storm_world(
        redis,
        vendor,
        tmp_path,
        limit=1,
        tiers={**FAST, post: TIERS[post]},
        slack_limits={**UNLIMITED, post: DEFAULT_LIMITS[post]},
    ) as world:
        fake = world.fake
        mentions = []
        for k in range(5):
            mention = fake.post_as_user(fake.general, fake.mention(f"storm-{k}"))
            sent = await fake.send_event(world.url, fake.event_for(mention, kind="app_mention"))
            assert sent.status == 200
            mentions.append(mention)
        replies = await all_answered(world, mentions, timeout=30)
        assert [m.text for m in replies] == [answer(k) for k in range(5)]
        notes = [m for m in replies if fake.edits(m.channel, m.ts)[0].text.startswith(QUEUED)]
        assert notes  # some turns waited long enough to say so
        assert max(float(m.ts) for m in notes) > float(replies[0].ts)
        assert not [c for c in fake.calls(post) if c.error]  # no 429: the pacing held


async def test_a_turn_waiting_for_a_decision_gives_its_slot_back(
    redis: Any, vendor: FakeVendor, tmp_path: Path, test_worker: WorkerFactory
) -> None:
    """With one slot, a turn that asks for approval and waits does not stop the app: a
    mention in another thread is answered while the prompt is open."""

    async def approval_first(request: dict[str, Any]) -> Any:
        if "restart" in json.dumps(request["trigger"]):
            ask = {"message": "Restart **prod**?", "metadata": {"options": OPTIONS}}
            interrupt = {"type": "interrupt", "interrupt_id": "ok-1", "reason": "approval"}
            return {**request["proposed"], "actions": [{**interrupt, "payload": ask}]}
        return request["proposed"]

    worker = await test_worker(approval_first)
    agent = "ops_helper"
    text = project_toml(vendor.url) + (
        f'\n[agent.{agent}]\nllm = "anthropic"\nmodel = "claude-haiku-4-5"\n'
        f'system = "You help."\nworker = "{worker.url}"\n'
        f'[agent.{agent}.slack]\nanswers = "both"\nmax_concurrent_turns = 1\n'
    )
    project = parse_project(text, str(tmp_path / "subs.toml"), env={})
    answering(vendor, pace=0.01)
    async with serve_bots(redis, vendor, project, agent, slack_limits=UNLIMITED) as world:
        fake = world.fake
        ask = fake.post_as_user(fake.general, fake.mention("restart prod"))
        await fake.send_event(world.url, fake.event_for(ask, kind="app_mention"))

        def prompted() -> list[Message] | None:
            mine = [m for m in fake.thread(fake.general.id, ask.ts) if fake.by_app(m)]
            return mine if any("Restart" in m.text for m in mine) else None

        await fake.until(prompted, timeout=10)
        other = fake.post_as_user(fake.general, fake.mention("storm-7"))
        await fake.send_event(world.url, fake.event_for(other, kind="app_mention"))
        await all_answered(world, [other], timeout=10, numbers=[7], idle=False)


async def test_two_processes_share_the_limit_and_a_dead_ones_slots_lapse(redis: Any) -> None:
    """The slots as two `subs serve` processes see them on one Redis: never more running than
    the limit between them; a process that stops renewing (killed) frees its slots within a
    lease, and the waiting turns of the other go on."""
    lease_ms = 400
    one = TurnSlots(Slots(redis, lease_ms), "one", poll_s=0.02)
    two = TurnSlots(Slots(redis, lease_ms), "two", poll_s=0.02)
    running, most = 0, 0

    async def turn(slots: TurnSlots, k: int) -> None:
        nonlocal running, most
        slot = slots.slot(AGENT, f"turn-{k}", 2)
        await slot.take(_nothing)
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.05)  # the turn's work, not a synchronisation
        running -= 1
        await slot.release()

    await asyncio.gather(*(turn(one if k % 2 else two, k) for k in range(12)))
    assert most == 2

    dead = TurnSlots(Slots(redis, lease_ms), "dead")
    for k in range(2):  # the dead process's turns hold both slots, never released
        await dead.slot(AGENT, f"held-{k}", 2).take(_nothing)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.wait_for(turn(one, 99), timeout=5)
    assert loop.time() - started >= lease_ms / 1000 * 0.9  # it waited for the lease to lapse
    await one.aclose()
    await two.aclose()


async def _nothing(ahead: int, granted: asyncio.Future[None]) -> None:
    return None
