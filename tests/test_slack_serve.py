"""The Slack bot end to end through `subs serve` as a process, over HTTP and Socket Mode.

The scenarios of test_bot.py, with nothing in the test's process but fakes: FakeSlack (real
Slack limits), FakeVendor, a TestWorker and Redis. The serve process paces edits at Slack's
real tiers, so answers that should show several steps stream for a few seconds.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bot.rendering.mrkdwn import to_mrkdwn
from tests.engine_helpers import on_both_redis
from tests.fakes.llm_vendor import FakeVendor, Text
from tests.fakes.slack import FakeSlack, Message
from tests.slack_serve_helpers import TRANSPORTS, SlackServe, of_type, slack_serve
from tests.workers import TestWorker, WorkerFactory

ANSWER = "The **primary** database is back; see `db-1` for details and the runbook."
HELPER = "helper"  # an agent whose worker decides


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
async def served(
    tmp_path: Path, redis_url: str, vendor: FakeVendor, transport: str
) -> AsyncIterator[SlackServe]:
    async with slack_serve(tmp_path, redis_url, vendor.url, transport=transport) as app:
        yield app


@pytest.fixture
async def over_http(
    tmp_path: Path, redis_url: str, vendor: FakeVendor
) -> AsyncIterator[SlackServe]:
    async with slack_serve(tmp_path, redis_url, vendor.url, transport="http") as app:
        yield app


def failed_calls(fake: FakeSlack) -> list[tuple[str, str | None]]:
    """Web API calls Slack answered with an error (a 429 included)."""
    return [(c.method, c.error) for c in fake.requests if c.error]


async def mention(app: SlackServe, text: str, *, thread_ts: str | None = None) -> Message:
    """Alice mentions the app in #general and Slack delivers the app_mention."""
    fake = app.fake
    msg = fake.post_as_user(fake.general, fake.mention(text), thread_ts=thread_ts)
    sent = await app.send_event(fake.event_for(msg, kind="app_mention"))
    assert sent.status == 200 and sent.elapsed < 3
    return msg


async def sentinel(app: SlackServe, vendor: FakeVendor) -> Message:
    """A mention whose answer proves the app still works and has handled earlier deliveries."""
    vendor.push(Text("sentinel"))
    msg = await mention(app, "ping")
    await app.reply(msg, text="sentinel")
    return msg


# -- mentions ---------------------------------------------------------------------------


@on_both_redis
async def test_a_mention_streams_one_reply_in_the_thread(
    served: SlackServe, vendor: FakeVendor
) -> None:
    fake = served.fake
    # ~3.6 s (the delay is before each of the stream's ~12 frames): several 1.2 s edit slots
    vendor.push(Text(ANSWER, chunks=6, chunk_delay=0.3))
    asked = await mention(served, "is the db ok?")

    reply = await served.reply(asked, text=to_mrkdwn(ANSWER))
    assert [m.ts for m in fake.thread(fake.general.id, asked.ts)] == [asked.ts, reply.ts]
    assert {"type": "markdown", "text": ANSWER} in reply.blocks
    steps = [v.text for v in fake.edits(fake.general.id, reply.ts)]
    assert len(steps) > 1 and steps[0] != steps[-1] and steps[-1] == to_mrkdwn(ANSWER)
    assert ANSWER.startswith(steps[0].split("*")[0])  # the first step was part of the answer
    posts = [c for c in fake.calls("chat.postMessage") if c.args.get("thread_ts") == asked.ts]
    assert len(posts) == 1  # one message for the turn, then edits
    assert failed_calls(fake) == []

    events = await served.events(asked)
    assert len(of_type(events, "turn.started")) == 1
    assert of_type(events, "turn.completed")
    created = of_type(events, "session.created")[0]
    assert created["identity"]["subject"] == {"issuer": "slack", "id": fake.user.id}
    assert created["identity"]["metadata"] == {
        "slack_channel": fake.general.id,
        "slack_thread_ts": asked.ts,
        "slack_team": fake.team.id,
    }
    said = [m["message"] for m in of_type(events, "message.new")]
    assert [(m["role"], m["content"]) for m in said] == [
        ("user", "alice: is the db ok?"),
        ("assistant", ANSWER),
    ]
    assert said[0]["id"] == f"slack:{asked.ts}"


async def test_a_mention_streams_natively_when_the_agent_asks_for_it(
    tmp_path: Path, redis_url: str, vendor: FakeVendor
) -> None:
    async with slack_serve(tmp_path, redis_url, vendor.url, stream="native") as app:
        fake = app.fake
        vendor.push(Text(ANSWER, chunks=6, chunk_delay=0.3))
        asked = await mention(app, "is the db ok?")
        reply = await app.reply(asked, text=ANSWER)  # a stream's text is the Markdown itself

        await fake.until(lambda: reply.stream == "stopped" or None, timeout=10)  # not left open
        assert [m.ts for m in fake.thread(fake.general.id, asked.ts)] == [asked.ts, reply.ts]
        steps = [v.text for v in fake.edits(fake.general.id, reply.ts)]
        assert len(steps) > 1 and steps[-1] == ANSWER
        assert all(ANSWER.startswith(step) for step in steps)  # it only ever grew
        assert len(fake.calls("chat.startStream")) == 1 and not fake.calls("chat.update")
        assert failed_calls(fake) == []


async def test_a_follow_up_mention_continues_the_session_with_missed_messages(
    served: SlackServe, vendor: FakeVendor
) -> None:
    fake = served.fake
    bob = fake.add_user("bob")
    fake.channels[fake.general.id].members.add(bob.id)
    vendor.push(Text("Looking."), Text("Clear the logs.", chunks=3, chunk_delay=0.2))
    first = await mention(served, "the db is down")
    await served.reply(first, text="Looking.")

    missed = fake.post_as_user(fake.general, "the disk is full", user=bob, thread_ts=first.ts)
    second = await mention(served, "what now?", thread_ts=first.ts)
    reply = await served.reply(first, nth=2, turns=2, text="Clear the logs.")
    assert reply.thread_ts == first.ts
    assert [m.ts for m in fake.thread(fake.general.id, first.ts)][2:] == [
        missed.ts,
        second.ts,
        reply.ts,
    ]

    events = await served.events(first)
    assert len(of_type(events, "turn.started")) == 2
    assert {e["session_id"] for e in events} == {served.session_of(first)}  # one session
    users = [m["message"] for m in of_type(events, "message.new")]
    assert [(m["id"], m["content"]) for m in users if m["role"] == "user"] == [
        (f"slack:{first.ts}", "alice: the db is down"),
        (f"slack:{missed.ts}", "bob: the disk is full"),
        (f"slack:{second.ts}", "alice: what now?"),
    ]
    seen = str(vendor.requests[1].body)
    assert "bob: the disk is full" in seen and "alice: what now?" in seen
    assert "the db is down" in seen and "Looking." in seen  # the same conversation
    assert failed_calls(fake) == []


# -- a worker-decided agent: slash commands and approvals -------------------------------

OPTIONS = [
    {"label": "Approve", "value": "go", "style": "primary"},
    {"label": "Decline", "value": "stop", "style": "danger"},
]


async def approval_first(request: dict[str, Any]) -> Any:
    """Asks for approval before answering a message about a restart; else the proposal."""
    trigger = request["trigger"]
    if trigger["type"] == "client.messages" and "restart" in str(trigger["messages"][-1]):
        ask = {"message": "Restart **prod**?", "metadata": {"options": OPTIONS}}
        interrupt = {"type": "interrupt", "interrupt_id": "ok-1", "reason": "approval"}
        return {**request["proposed"], "actions": [{**interrupt, "payload": ask}]}
    return request["proposed"]


@pytest.fixture
async def helper(
    tmp_path: Path,
    redis_url: str,
    vendor: FakeVendor,
    transport: str,
    test_worker: WorkerFactory,
) -> AsyncIterator[tuple[SlackServe, TestWorker]]:
    worker = await test_worker(approval_first)
    async with slack_serve(
        tmp_path, redis_url, vendor.url, transport=transport, agent=HELPER, worker=worker.url
    ) as app:
        yield app, worker


async def test_a_slash_command_runs_in_the_thread_of_a_root_message(
    helper: tuple[SlackServe, TestWorker], vendor: FakeVendor
) -> None:
    app, worker = helper
    fake = app.fake
    answer = "Acked INC-42 and paged the owner of the checkout service."
    vendor.push(Text(answer, chunks=5, chunk_delay=0.3))
    sent = await app.send_command("/oncall", "ack INC-42")
    assert sent.status == 200 and sent.elapsed < 3

    def root() -> Message | None:
        roots = [m for m in fake.history(fake.general.id) if m.bot_id]
        return roots[0] if roots else None

    posted = await fake.until(root, timeout=10)
    assert posted.text == f"<@{fake.user.id}> ran `/oncall ack INC-42`"
    assert posted.thread_ts in (None, posted.ts)
    reply = await app.reply(posted, nth=2, text=to_mrkdwn(answer))  # the root is the first
    assert reply.thread_ts == posted.ts
    assert [m.ts for m in fake.thread(fake.general.id, posted.ts)] == [posted.ts, reply.ts]
    assert len(fake.edits(fake.general.id, reply.ts)) > 1  # streamed in steps
    events = await app.events(posted)
    assert len(of_type(events, "turn.started")) == 1

    [action] = [r["trigger"] for r in worker.requests if r["trigger"]["type"] == "client.action"]
    assert action["name"] == "oncall"
    args = action["args"]
    assert set(args) == {"text", "user_id", "channel_id", "team_id", "response_url", "trigger_id"}
    command = sent.payload  # the fields Slack sent the app
    assert args == {key: command[key] for key in args}
    assert (args["text"], args["user_id"], args["channel_id"], args["team_id"]) == (
        "ack INC-42",
        fake.user.id,
        fake.general.id,
        fake.team.id,
    )
    assert "/oncall ack INC-42" in str(vendor.requests[0].body)  # the engine's proposal
    assert failed_calls(fake) == []


async def test_an_approval_resumes_once_and_says_who_approved(
    helper: tuple[SlackServe, TestWorker], vendor: FakeVendor
) -> None:
    app, worker = helper
    fake = app.fake
    vendor.push(Text("Restarted prod; all checks green.", chunks=3, chunk_delay=0.2))
    asked = await mention(app, "restart prod")
    [prompt] = await fake.until(lambda: app.bot_messages(asked)[:1] or None, timeout=10)
    assert "Restart" in prompt.text
    buttons = [e for b in prompt.blocks if b["type"] == "actions" for e in b["elements"]]
    assert [(b["text"]["text"], b.get("style")) for b in buttons] == [
        ("Approve", "primary"),
        ("Decline", "danger"),
    ]
    assert len(of_type(await app.events(asked), "session.interrupted")) == 1

    approve = buttons[0]["action_id"]
    click = fake.block_action(prompt, approve)
    again = fake.block_action(prompt, approve)  # the same button, clicked a second time
    acked = await app.send_action(click)
    assert acked.status == 200 and acked.elapsed < 3
    reply = await app.reply(asked, nth=2, text="Restarted prod; all checks green.")

    def answered() -> Message | None:
        shown = fake.message(fake.general.id, prompt.ts)
        return shown if "Approved" in shown.text else None

    shown = await fake.until(answered, timeout=10)
    assert f"✅ Approved by <@{fake.user.id}>" in shown.text
    assert not [b for b in shown.blocks if b["type"] == "actions"]  # no more buttons
    [resumed] = [
        r["trigger"] for r in worker.requests if r["trigger"]["type"] == "interrupt.resumed"
    ]
    assert resumed["payload"] == {
        "value": "go",
        "responder": {
            "channel": "slack",
            "user": fake.user.id,
            "label": "Approve",
            "style": "primary",
        },
    }
    assert [m.ts for m in app.bot_messages(asked)] == [prompt.ts, reply.ts]

    edits = len(fake.edits(fake.general.id, prompt.ts))
    assert (await app.send_action(again)).status == 200
    [told] = await fake.until(lambda: fake.ephemerals or None, timeout=10)
    assert "already answered" in told.text.lower() and told.user == fake.user.id
    assert len(fake.edits(fake.general.id, prompt.ts)) == edits  # the prompt is unchanged
    events = await app.events(asked)
    assert len(of_type(events, "session.interrupt_resumed")) == 1
    assert len(of_type(events, "turn.started")) == 1 and len(of_type(events, "turn.completed")) == 1
    assert [m.ts for m in app.bot_messages(asked)] == [prompt.ts, reply.ts]
    assert failed_calls(fake) == []


# -- bad input --------------------------------------------------------------------------


async def test_forged_and_stale_requests_are_refused_and_start_nothing(
    over_http: SlackServe, vendor: FakeVendor
) -> None:
    app, fake = over_http, over_http.fake
    root = fake.post_as_user(fake.general, "release day")
    asked = fake.post_as_user(fake.general, fake.mention("deploy"), thread_ts=root.ts)
    event = fake.event_for(asked, kind="app_mention")

    forged = await app.send_event(event, signing_secret="not-the-secret")
    stale = await app.send_event(event, ts=time.time() - 600)
    assert (forged.status, stale.status) == (401, 401)
    command = await fake.send_command(app.events_url, "/oncall", "ack", signing_secret="nope")
    assert command.status == 401

    vendor.requests.clear()
    later = await sentinel(app, vendor)  # answered: everything before it was handled
    assert await app.client.sessions() == [app.session_of(later)]
    assert len(vendor.requests) == 1
    assert fake.thread(fake.general.id, root.ts) == [root, asked]  # nothing answered there
    assert not fake.calls("conversations.replies")


@on_both_redis
async def test_a_replayed_event_starts_no_second_turn(
    served: SlackServe, vendor: FakeVendor
) -> None:
    app, fake = served, served.fake
    vendor.push(Text("Once, and only once.", chunks=4, chunk_delay=0.2))  # still running
    asked = fake.post_as_user(fake.general, fake.mention("deploy"))
    first = await app.send_event(fake.event_for(asked, kind="app_mention"))
    retry = await app.send_event(first.payload, retry_num=1)  # same event_id, while it runs
    assert (first.status, retry.status) == (200, 200)
    reply = await app.reply(asked, text="Once, and only once.")
    late = await app.send_event(first.payload, retry_num=2)  # and once the turn has ended
    assert late.status == 200

    await sentinel(app, vendor)
    events = await app.events(asked)
    kinds = [e["payload"]["type"] for e in events]
    assert kinds.count("turn.started") == 1 and "turn.queued" not in kinds
    assert [m.ts for m in fake.thread(fake.general.id, asked.ts)] == [asked.ts, reply.ts]
    assert len(vendor.requests) == 2  # the mention's and the sentinel's


async def test_malformed_payloads_are_ignored_and_the_app_keeps_answering(
    over_http: SlackServe, vendor: FakeVendor
) -> None:
    app, fake = over_http, over_http.fake
    missing = await app.send_event({"type": "app_mention", "text": "no channel, user or ts"})
    not_an_object = await app.send_event({**fake.envelope({"type": "x"}), "event": 7})
    no_event_id = {**fake.envelope({"type": "app_mention"}), "event_id": None}
    nameless = await app.send_event(no_event_id)
    garbage_status = (await fake.send_raw(app.events_url, b"{not json")).status
    statuses = [missing.status, not_an_object.status, nameless.status, garbage_status]
    assert all(status < 500 for status in statuses), statuses  # no retry storm from Slack
    assert app.alive

    later = await sentinel(app, vendor)
    assert app.alive
    assert await app.client.sessions() == [app.session_of(later)]
    assert failed_calls(fake) == []
