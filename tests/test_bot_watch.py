"""On-call threads without a mention, end to end (FakeSlack -> Bolt and slack_sdk -> the
engine -> the fake vendor): a watched channel's alerts are triaged in their own threads,
once; a person's follow-up in a thread the app answered is answered; each message is one
turn however often Slack delivers it (retries, a new event_id, `app_mention` + `message`).

Every event goes through `fake.events_for` (what Slack sends with channel messages
subscribed) or the fake's `changed_event` / `deleted_event`. Each listener records its turn
before Bolt acks, so once a delivery is answered and the bots are idle, a turn it started
has run: "no turn" is checked then, with no waiting on time.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from engine.config import parse_project
from tests.bot_helpers import AGENT, World, serve_bots
from tests.engine_helpers import project_toml
from tests.fakes.llm_vendor import FakeVendor, Text
from tests.fakes.slack import FakeSlack, Message, alerts

AM_TITLE = "Alertmanager: [FIRING:2] HighErrorRate (api production)"
WATCH = (
    '[[agent.{agent}.slack.watch]]\nchannel = "${{ALERTS_CHANNEL}}"\n'
    'from = ["Alertmanager", "grafana"]\nmatch = "FIRING"\n'
)


def _alerts_channel(fake: FakeSlack) -> dict[str, str]:
    return {"ALERTS_CHANNEL": fake.add_channel("alerts").id}


async def _world(
    redis: Any, vendor: FakeVendor, tmp_path: Path, slack: str
) -> AsyncIterator[World]:
    text = project_toml(vendor.url, retry="retry = { llm = { backoff_base_secs = 0 } }")
    text += f"\n[agent.{AGENT}.slack]\n{slack}"
    project = parse_project(text, str(tmp_path / "subs.toml"), env={})
    async with serve_bots(redis, vendor, project, AGENT, slack_env=_alerts_channel) as served:
        yield served


@pytest.fixture
async def world(redis, vendor: FakeVendor, tmp_path: Path) -> AsyncIterator[World]:
    async for served in _world(redis, vendor, tmp_path, WATCH.format(agent=AGENT)):
        yield served


@pytest.fixture
async def native(redis, vendor: FakeVendor, tmp_path: Path) -> AsyncIterator[World]:
    slack = 'stream = "native"\n' + WATCH.format(agent=AGENT)
    async for served in _world(redis, vendor, tmp_path, slack):
        yield served


@pytest.fixture
async def unfollowing(redis, vendor: FakeVendor, tmp_path: Path) -> AsyncIterator[World]:
    async for served in _world(redis, vendor, tmp_path, "follow = false\n"):
        yield served


def _alerts(fake: FakeSlack) -> str:
    return next(c.id for c in fake.channels.values() if c.name == "alerts")


async def _deliver(world: World, msg: Message) -> list[dict[str, Any]]:
    """Slack delivers every event of a new message, each in its own envelope."""
    sent = []
    for event in world.fake.events_for(msg):
        envelope = world.fake.envelope(event)
        delivered = await world.fake.send_event(world.url, envelope)
        assert delivered.status == 200
        sent.append(envelope)
    return sent


async def _send(world: World, event: dict[str, Any]) -> None:
    delivered = await world.fake.send_event(world.url, event)
    assert delivered.status == 200


def _bot_messages(world: World, channel: str, thread_ts: str) -> list[Message]:
    return [m for m in world.fake.thread(channel, thread_ts) if world.fake.by_app(m)]


def _user_texts(vendor: FakeVendor, call: int = 0) -> list[str]:
    return [m["content"] for m in vendor.requests[call].body["messages"] if m["role"] == "user"]


# -- alert channels ---------------------------------------------------------------------------


@pytest.mark.parametrize("classic", [True, False], ids=["bot_message", "modern-app"])
async def test_a_watched_alert_is_triaged_in_its_thread_once(world: World, classic: bool) -> None:
    fake = world.fake
    app = fake.add_integration("Alertmanager", classic=classic)
    world.vendor.push(Text("HighErrorRate: api 5xx since deploy 412; roll back."))
    alert = fake.post_as_integration(app, _alerts(fake), alerts.ALERTMANAGER_FIRING)
    [envelope] = await _deliver(world, alert)  # apps' posts: a `message` event only
    assert envelope["event"]["text"] == "" and envelope["event"]["bot_id"] == app.bot_id
    answer = await world.reply_to(alert)
    # Slack retries the same event, and sends the same message under a new event_id.
    again = await fake.send_event(world.url, envelope, retry_num=1)
    assert again.status == 200
    await _send(world, fake.envelope(envelope["event"]))
    await world.bots.idle()

    assert answer.thread_ts == alert.ts and fake.by_app(answer)
    assert [m.ts for m in _bot_messages(world, alert.channel, alert.ts)] == [answer.ts]
    assert len(await world.turns(alert.channel, alert.ts)) == 1
    assert len(world.vendor.requests) == 1
    [said] = _user_texts(world.vendor)
    assert said.startswith(AM_TITLE) and "alerts?receiver=oncall-slack" in said


async def test_an_alert_reply_streams_by_edits_when_replies_stream_natively(
    native: World,
) -> None:
    """Slack's native stream is addressed to a person (`recipient_user_id`): an app's alert
    has none, so its reply is posted and edited."""
    fake = native.fake
    app = fake.add_integration("Grafana")
    native.vendor.push(Text("CPU on node-1 is pinned by a backup job.", chunks=4))
    alert = fake.post_as_integration(app, _alerts(fake), alerts.GRAFANA_FIRING)
    await _deliver(native, alert)
    answer = await native.reply_to(alert)
    assert "backup job" in answer.text or "backup job" in str(answer.blocks)
    assert not fake.calls("chat.startStream")
    assert "Grafana: [FIRING:1] HighCPU" in _user_texts(native.vendor)[0]


async def test_what_is_not_a_new_watched_alert_starts_no_turn(world: World) -> None:
    fake = world.fake
    channel = _alerts(fake)
    am = fake.add_integration("Alertmanager", classic=True)
    grafana = fake.add_integration("Grafana")
    other = fake.add_integration("Deploybot")
    # Another poster, a message the regex does not find, the watched poster elsewhere.
    await _deliver(world, fake.post_as_integration(other, channel, {"text": "FIRING: deploy 412"}))
    await _deliver(world, fake.post_as_integration(am, channel, alerts.ALERTMANAGER_RESOLVED))
    await _deliver(world, fake.post_as_integration(am, fake.general, alerts.ALERTMANAGER_FIRING))
    # A person's post (not in `from`), an edit that makes a post match, a deletion.
    await _deliver(world, fake.post_as_user(channel, "is anything FIRING?"))
    quiet = fake.post_as_integration(grafana, channel, alerts.GRAFANA_RESOLVED)
    await _deliver(world, quiet)
    before = fake.edit_post(quiet, alerts.GRAFANA_FIRING)
    await _send(world, fake.changed_event(quiet, before))
    quiet.deleted = True
    await _send(world, fake.deleted_event(quiet))
    # A thread reply by the watched poster (Grafana's panel image under its alert).
    root = fake.post_as_user(channel, "keeping an eye on the FIRING ones")
    panel = fake.post_as_integration(
        grafana, channel, alerts.GRAFANA_PANEL_IMAGE, thread_ts=root.ts
    )
    await _deliver(world, panel)
    await world.bots.idle()

    assert not world.vendor.requests
    assert not [m for c in fake.channels for m in fake.history(c) if fake.by_app(m)]
    assert not [c for c in fake.requests if c.method == "chat.postMessage"]


# -- one message, one turn ------------------------------------------------------------------


@pytest.mark.parametrize("where", ["top-level", "answered-thread"])
@pytest.mark.parametrize("first", ["message", "app_mention"])
async def test_a_mention_delivered_as_message_and_app_mention_is_answered_once(
    world: World, first: str, where: str
) -> None:
    """In a thread the app answered, the `message` twin is also a follow-up: still one turn."""
    fake = world.fake
    if where == "top-level":
        world.vendor.push(Text("The db is fine."))
        root = asked = fake.post_as_user(fake.general, fake.mention("is the db ok?"))
    else:
        world.vendor.push(Text("Looking."), Text("The db is fine."))
        root = fake.post_as_user(fake.general, fake.mention("the db?"))
        await _deliver(world, root)
        await world.reply_to(root)
        asked = fake.post_as_user(fake.general, fake.mention("is the db ok?"), thread_ts=root.ts)
    events = fake.events_for(asked)
    assert sorted(e["type"] for e in events) == ["app_mention", "message"]
    events.sort(key=lambda e: e["type"] != first)
    for event in events:
        await _send(world, event)  # each in its own envelope, its own event_id
    answers = 2 if where == "answered-thread" else 1
    answer = await world.reply_to(root, nth=answers)
    await world.bots.idle()

    assert len(_bot_messages(world, root.channel, root.ts)) == answers
    assert answer.ts > asked.ts
    assert len(await world.turns(root.channel, root.ts)) == answers
    assert len(world.vendor.requests) == answers
    assert _user_texts(world.vendor, answers - 1)[-1] == "alice: is the db ok?"


# -- follow-ups -----------------------------------------------------------------------------


async def test_a_reply_in_a_thread_the_app_answered_is_answered_without_a_mention(
    world: World,
) -> None:
    fake = world.fake
    world.vendor.push(Text("Deploy 412 broke it."), Text("Roll back with `deploy rollback 412`."))
    asked = fake.post_as_user(fake.general, fake.mention("why is the api failing?"))
    await _deliver(world, asked)
    first = await world.reply_to(asked)
    await _deliver(world, first)  # the app's own reply comes back as a message event
    follow_up = fake.post_as_user(fake.general, "how do I roll it back?", thread_ts=asked.ts)
    await _deliver(world, follow_up)
    second = await world.reply_to(asked, nth=2)
    await _deliver(world, second)
    await world.bots.idle()

    assert second.thread_ts == asked.ts and second.ts > follow_up.ts
    assert len(_bot_messages(world, asked.channel, asked.ts)) == 2
    assert len(await world.turns(asked.channel, asked.ts)) == 2
    assert len(world.vendor.requests) == 2  # the app's own messages started nothing
    assert _user_texts(world.vendor, 1)[-1] == "alice: how do I roll it back?"


async def test_a_triaged_alert_s_thread_is_followed(world: World) -> None:
    fake = world.fake
    app = fake.add_integration("Alertmanager", classic=True)
    world.vendor.push(Text("api 5xx; see the runbook."), Text("Yes: error ratio 7.2%."))
    alert = fake.post_as_integration(app, _alerts(fake), alerts.ALERTMANAGER_FIRING)
    await _deliver(world, alert)
    await world.reply_to(alert)
    await _deliver(world, fake.post_as_user(alert.channel, "still firing?", thread_ts=alert.ts))
    await world.reply_to(alert, nth=2)
    assert _user_texts(world.vendor, 1)[-1] == "alice: still firing?"


async def test_replies_that_are_no_follow_ups_start_no_turn(world: World) -> None:
    fake = world.fake
    bob = fake.add_user("bob", display_name="Bob")
    fake.channels[fake.general.id].members.add(bob.id)
    world.vendor.push(Text("Looking."))
    # A thread the app was never asked in.
    talk = fake.post_as_user(fake.general, "lunch?")
    await _deliver(world, talk)
    await _deliver(world, fake.post_as_user(fake.general, "sure", user=bob, thread_ts=talk.ts))
    # In a thread it answered: a message to someone else only, and an edit of the question.
    asked = fake.post_as_user(fake.general, fake.mention("the db is slow"))
    await _deliver(world, asked)
    await world.reply_to(asked)
    aside = f"<@{bob.id}> can you check the replica?"
    await _deliver(world, fake.post_as_user(fake.general, aside, thread_ts=asked.ts))
    before = fake.edit_post(asked, {"text": fake.mention("the db is very slow")})
    await _send(world, fake.changed_event(asked, before))
    await world.bots.idle()

    assert len(world.vendor.requests) == 1
    assert not _bot_messages(world, talk.channel, talk.ts)
    assert len(_bot_messages(world, asked.channel, asked.ts)) == 1


async def test_with_follow_off_a_reply_needs_a_mention(unfollowing: World) -> None:
    world = unfollowing
    fake = world.fake
    world.vendor.push(Text("Looking."), Text("Still looking."))
    asked = fake.post_as_user(fake.general, fake.mention("the db is slow"))
    await _deliver(world, asked)
    await world.reply_to(asked)
    await _deliver(world, fake.post_as_user(fake.general, "any news?", thread_ts=asked.ts))
    await world.bots.idle()
    assert len(world.vendor.requests) == 1
    mention = fake.post_as_user(fake.general, fake.mention("any news?"), thread_ts=asked.ts)
    await _deliver(world, mention)
    await world.reply_to(asked, nth=2)
    assert len(world.vendor.requests) == 2


async def test_a_follow_up_posted_while_a_turn_runs_is_the_next_turn(world: World) -> None:
    """As a mention mid-turn: queued, answered after the running turn, with what was said
    in between (an aside to a person included)."""
    fake = world.fake
    bob = fake.add_user("bob", display_name="Bob")
    fake.channels[fake.general.id].members.add(bob.id)
    world.vendor.push(Text("Checking the db now.", chunks=6, chunk_delay=0.1), Text("It is."))
    asked = fake.post_as_user(fake.general, fake.mention("is the db down?"))
    await _deliver(world, asked)
    await world.vendor.wait_for_requests(1)  # the first turn is running
    aside = fake.post_as_user(fake.general, f"<@{bob.id}> are you on it?", thread_ts=asked.ts)
    await _deliver(world, aside)
    follow_up = fake.post_as_user(fake.general, "is it the replica?", thread_ts=asked.ts)
    await _deliver(world, follow_up)
    first = await world.reply_to(asked)
    second = await world.reply_to(asked, nth=2)

    assert first.ts < second.ts and len(await world.turns(asked.channel, asked.ts)) == 2
    assert len(world.vendor.requests) == 2
    said = _user_texts(world.vendor, 1)
    assert said[-2:] == ["alice: @Bob are you on it?", "alice: is it the replica?"]
