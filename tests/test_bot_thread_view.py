"""The thread as people see it, end to end (FakeSlack -> Bolt and slack_sdk -> the engine ->
the fake vendor): other apps' alerts reach the model as they read in the channel, every
message named by its poster, names from a cached users.info, and each turn's author
named to a worker."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from slack_sdk.web.async_client import AsyncWebClient

from bot.slack.directory import Directory
from bot.slack.governor import RateGovernor
from engine.config import parse_project
from tests.bot_helpers import AGENT, FAST, World, serve_bots
from tests.engine_helpers import project_toml
from tests.fakes.llm_vendor import FakeVendor, Text
from tests.fakes.slack import FakeSlack, Message, alerts
from tests.workers import TestWorker, WorkerFactory

AM_LINK = "http://alertmanager.example.com:9093/#/alerts?receiver=oncall-slack"
AM = f"Alertmanager: [FIRING:2] HighErrorRate (api production) ({AM_LINK})"


@pytest.fixture
async def world(redis, vendor: FakeVendor, tmp_path: Path) -> AsyncIterator[World]:
    text = project_toml(vendor.url, retry="retry = { llm = { backoff_base_secs = 0 } }")
    text += f'\n[agent.{AGENT}.slack]\nanswers = "both"\n'
    project = parse_project(text, str(tmp_path / "subs.toml"), env={})
    async with serve_bots(redis, vendor, project, AGENT) as served:
        yield served


def _user_texts(vendor: FakeVendor, call: int = 0) -> list[str]:
    """The user messages of the model call `call`, as the vendor received them (the text
    parts of one that carries a file)."""
    return [
        c if isinstance(c, str) else "\n".join(p["text"] for p in c if p["type"] == "text")
        for m in vendor.requests[call].body["messages"]
        if m["role"] == "user"
        for c in [m["content"]]
    ]


async def _ask(world: World, text: str, thread: Message, **kw: Any) -> Message:
    """A person mentions the app in `thread`'s thread; Slack delivers the app_mention."""
    fake = world.fake
    asked = fake.post_as_user(fake.general, fake.mention(text), thread_ts=thread.ts, **kw)
    delivered = await fake.send_event(world.url, fake.event_for(asked, kind="app_mention"))
    assert delivered.status == 200
    return asked


# (app name, what it posts at the root, what it posts in the thread, what the model must read)
SHAPES = {
    "alertmanager-firing": ("Alertmanager", alerts.ALERTMANAGER_FIRING, [], [AM]),
    "alertmanager-resolved": (
        "Alertmanager",
        alerts.ALERTMANAGER_RESOLVED,
        [],
        [AM.replace("[FIRING:2]", "[RESOLVED]")],
    ),
    "alertmanager-fields": (
        "Alertmanager",
        alerts.ALERTMANAGER_TEMPLATED,
        [],
        [AM, "*Description:* 7.2% of requests", "severity: critical\nerror ratio: 7.2%"],
    ),
    "grafana": (
        "Grafana",
        alerts.GRAFANA_FIRING,
        [alerts.GRAFANA_PANEL_IMAGE],
        [
            "Grafana: [FIRING:1] HighCPU Infra (node-1 critical) (https://grafana.example.com/",
            " - summary = CPU above 95% for 5 minutes\n",
            "Panel: https://grafana.example.com/d/node-exporter?orgId=1&viewPanel=3\n",
            "Grafana: *Firing*: HighCPU, *Labels*: alertname=HighCPU",  # the image's reply
            "[file panel-3.png (PNG, 47.1 KiB)]",  # its panel image, given to the model
        ],
    ),
    "sentry": (
        "Sentry",
        alerts.SENTRY_ISSUE,
        [],
        [
            "Sentry: :red_circle: *ZeroDivisionError: division by zero* (https://acme.sentry.io/",
            "environment: `production`\nlevel: `error`",
            "[Resolve] [Archive]",
        ],
    ),
    "webhook-blocks": (
        "disk-check",
        alerts.WEBHOOK_BLOCKS,
        [],
        ["disk-check: Disk almost full on db-1\n*Host:*\ndb-1.prod", "Paging @db-oncall"],
    ),
}


@pytest.mark.parametrize("classic", [True, False], ids=["bot_message", "modern-app"])
@pytest.mark.parametrize("shape", list(SHAPES))
async def test_a_mention_under_an_alert_gives_the_model_the_alert(
    world: World, shape: str, classic: bool
) -> None:
    fake = world.fake
    name, root, replies, expected = SHAPES[shape]
    app = fake.add_integration(name, classic=classic)
    alert = fake.post_as_integration(app, fake.general, root)
    for reply in replies:
        fake.post_as_integration(app, fake.general, reply, thread_ts=alert.ts)
    world.vendor.push(Text("Looks like the api is failing."))
    asked = await _ask(world, "what is this?", alert)
    answer = await world.reply_to(alert)

    # In the channel: the alert, its replies, the question and one answer, in its thread.
    thread = fake.thread(fake.general.id, alert.ts)
    assert [m.ts for m in thread][-2:] == [asked.ts, answer.ts]
    assert fake.by_app(answer) and not fake.by_app(alert) and answer.thread_ts == alert.ts
    # The model: the alert (the thread's root, posted by another app) and then the question.
    said = _user_texts(world.vendor)
    assert len(said) == 2 + len(replies)
    assert said[-1] == "alice: what is this?"
    seen = "\n".join(said[:-1])
    for part in expected:
        assert part in seen
    assert "no text" not in seen and f"<@{fake.user.id}>" not in seen and "&amp;" not in seen


async def test_the_model_sees_display_names_looked_up_once_per_person(world: World) -> None:
    fake = world.fake
    carol = fake.add_user("carol", display_name="Carol D", real_name="Carol Danvers")
    dave = fake.add_user("dave", real_name="Dave Lister")  # no display name: the full name
    for person in (carol, dave):
        fake.channels[fake.general.id].members.add(person.id)
    app = fake.add_integration("Alertmanager", classic=True)
    alert = fake.post_as_integration(app, fake.general, alerts.ALERTMANAGER_FIRING)
    for who, text in [(carol, "on it"), (dave, "api pods restarting"), (carol, "3 of 5 up")]:
        fake.post_as_user(fake.general, text, user=who, thread_ts=alert.ts)
    world.vendor.push(Text("Deploy 412 broke it."), Text("Roll it back."))
    await _ask(world, f"<@{dave.id}> says pods restart; why?", alert)
    await world.reply_to(alert)
    fake.post_as_user(fake.general, f"<@{carol.id}> rolled back?", user=dave, thread_ts=alert.ts)
    await _ask(world, "and now?", alert, user=carol)
    await world.reply_to(alert, nth=2)

    assert _user_texts(world.vendor, 0) == [
        AM,
        "Carol D: on it",
        "Dave Lister: api pods restarting",
        "Carol D: 3 of 5 up",
        "alice: @Dave Lister says pods restart; why?",
    ]
    assert _user_texts(world.vendor, 1)[-2:] == [
        "Dave Lister: @Carol D rolled back?",
        "Carol D: and now?",
    ]
    looked_up = [c.args["user"] for c in fake.calls("users.info")]
    assert sorted(looked_up) == sorted([fake.user.id, carol.id, dave.id])  # once each, 2 turns
    assert not fake.calls("bots.info")  # Alertmanager's post names itself (`username`)


async def test_a_refused_users_info_shows_the_id_and_is_not_asked_again(world: World) -> None:
    fake = world.fake
    fake.scopes = fake.scopes.replace(",users:read", "")  # installed without users:read
    world.vendor.push(Text("Hi."), Text("Still here."))
    first = fake.post_as_user(fake.general, fake.mention("hello"))
    await fake.send_event(world.url, fake.event_for(first, kind="app_mention"))
    await world.reply_to(first)
    await _ask(world, "again", first)
    await world.reply_to(first, nth=2)

    assert _user_texts(world.vendor, 0) == [f"{fake.user.id}: hello"]
    assert _user_texts(world.vendor, 1)[-1] == f"{fake.user.id}: again"
    assert [c.error for c in fake.calls("users.info")] == ["missing_scope"]  # kept for the TTL


async def test_a_classic_app_without_a_name_is_named_by_bots_info(world: World) -> None:
    fake = world.fake
    app = fake.add_integration("Uptime", classic=True)
    alert = fake.post_as_integration(app, fake.general, {"text": "api.example.com is *down*"})
    world.vendor.push(Text("Checking."))
    await _ask(world, "since when?", alert)
    await world.reply_to(alert)
    assert _user_texts(world.vendor)[0] == "Uptime: api.example.com is *down*"
    assert [c.args["bot"] for c in fake.calls("bots.info")] == [app.bot_id]


async def test_names_are_kept_for_their_ttl_and_asked_once_at_a_time() -> None:
    now = [0.0]
    async with FakeSlack() as fake:
        bob = fake.add_user("bob", display_name="Bob")
        app = fake.add_integration("Grafana")
        web = AsyncWebClient(token=fake.bot_token, base_url=fake.url)
        names = Directory(web, RateGovernor(FAST), ttl=60, clock=lambda: now[0])
        team = fake.team.id
        wanted = [bob.id, bob.id, app.bot_id, "U404", "C0CHANNEL"]
        both = [await names.names(team, wanted), await names.names(team, wanted)]
        assert both == [{bob.id: "Bob", app.bot_id: "Grafana"}] * 2  # U404: Slack refused
        assert len(fake.calls("users.info")) == 2 and len(fake.calls("bots.info")) == 1

        now[0] = 61.0  # the TTL has passed: asked again, once for all who ask at once
        again = await asyncio.gather(*(names.names(team, [bob.id]) for _ in range(5)))
        assert again == [{bob.id: "Bob"}] * 5
        assert [c.args["user"] for c in fake.calls("users.info")].count(bob.id) == 2


async def test_names_kept_are_bounded_the_least_recently_used_going_first() -> None:
    async with FakeSlack() as fake:
        people = [fake.add_user(f"p{k}", display_name=f"P{k}") for k in range(4)]
        web = AsyncWebClient(token=fake.bot_token, base_url=fake.url)
        names = Directory(web, RateGovernor(FAST), max_names=2)
        team = fake.team.id
        ids = [p.id for p in people]
        for ref in [ids[0], ids[1], ids[0], ids[2]]:  # p0 used again: p1 is the oldest
            await names.names(team, [ref])
        assert [ref for _, ref in names._known] == [ids[0], ids[2]]
        assert await names.names(team, ids[:3]) == {ids[k]: f"P{k}" for k in range(3)}
        assert len(names._known) == 2
        asked = [c.args["user"] for c in fake.calls("users.info")]
        assert asked == [ids[0], ids[1], ids[2], ids[1]]  # p1 was forgotten, asked again


async def test_names_fall_back_to_ids_when_slack_is_away() -> None:
    async with FakeSlack() as fake:
        url, bob = fake.url, fake.add_user("bob")
    names = Directory(AsyncWebClient(token="xoxb-1", base_url=url), RateGovernor(FAST))
    assert await names.names("T1", [bob.id]) == {}
    assert not names._known  # not kept: the next turn asks again


# -- the author of each turn, for a worker --------------------------------------------------

HELPER = "ops_helper"


@pytest.fixture
async def helper(
    redis, vendor: FakeVendor, tmp_path: Path, test_worker: WorkerFactory
) -> AsyncIterator[tuple[World, TestWorker]]:
    worker = await test_worker()  # echoes the engine's proposal: the model answers
    text = project_toml(vendor.url) + (
        f'\n[agent.{HELPER}]\nllm = "anthropic"\nmodel = "claude-haiku-4-5"\n'
        f'system = "You help."\nworker = "{worker.url}"\n'
        f'[agent.{HELPER}.slack]\nanswers = "both"\n'
    )
    project = parse_project(text, str(tmp_path / "subs.toml"), env={})
    async with serve_bots(redis, vendor, project, HELPER) as served:
        yield served, worker


async def test_each_turn_names_its_own_author_to_the_worker(
    helper: tuple[World, TestWorker],
) -> None:
    world, worker = helper
    fake = world.fake
    bob = fake.add_user("bob", display_name="Bob")
    fake.channels[fake.general.id].members.add(bob.id)
    world.vendor.push(Text("Looking."), Text("Done."))
    first = fake.post_as_user(fake.general, fake.mention("the db is down"))
    await fake.send_event(world.url, fake.event_for(first, kind="app_mention"))
    await world.reply_to(first)
    await _ask(world, "is it back?", first, user=bob)
    await world.reply_to(first, nth=2)

    asked = [r for r in worker.requests if r["trigger"]["type"] == "client.messages"]
    authors = [r["trigger"]["client"]["forwarded_props"]["slack"]["author"] for r in asked]
    assert authors == [
        {"issuer": "slack", "id": fake.user.id, "name": "alice"},
        {"issuer": "slack", "id": bob.id, "name": "Bob"},
    ]
    # The session's identity stays its first asker's: it owns the thread's session.
    assert {r["identity"]["subject"]["id"] for r in worker.requests} == {fake.user.id}
    assert asked[1]["trigger"]["messages"][-1]["content"] == "Bob: is it back?"
    assert worker.schema_errors == []
