"""Kill `subs serve` mid-stream and start it again: the thread ends with one complete reply.

The engine re-runs the model call the kill cut (attempt 2, so the vendor answers twice); the
bot's checkpoint and message stamps let the new process finish the message the dead one
began, in either transport and either streaming mode.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.turns.store import Checkpoints
from engine.store.store import connect
from tests.engine_helpers import poll_until
from tests.fakes.llm_vendor import FakeVendor, Text
from tests.fakes.slack import FakeSlack, Message, alerts
from tests.slack_serve_helpers import AGENT, of_type, slack_serve

ANSWER = (
    "The **primary** database is back.\n\n"
    "1. `db-1` took over at 02:14\n"
    "2. replication caught up at 02:16\n\n"
    "Nothing else to do; the runbook has the details."
)


def _shown(msg: Message) -> str:
    """The answer a message shows: its markdown block (edits) or its streamed text."""
    blocks = [b["text"] for b in msg.blocks if b.get("type") == "markdown"]
    return blocks[0] if blocks else msg.text


@pytest.mark.parametrize(
    ("transport", "stream"), [("http", "edit"), ("socket", "edit"), ("http", "native")]
)
async def test_a_serve_killed_mid_stream_leaves_one_complete_reply(
    tmp_path: Path, redis_url: str, vendor: FakeVendor, transport: str, stream: str
) -> None:
    vendor.push(Text(ANSWER, chunks=40, chunk_delay=0.15))  # cut by the kill
    vendor.push(Text(ANSWER, chunks=8, chunk_delay=0.05))  # the engine's second attempt
    async with slack_serve(
        tmp_path, redis_url, vendor.url, transport=transport, stream=stream
    ) as app:
        fake = app.fake
        asked = fake.post_as_user(fake.general, fake.mention("is the db back?"))
        sent = await app.send_event(fake.event_for(asked, kind="app_mention"))
        assert sent.status == 200

        def partly_shown() -> Message | None:
            mine = app.bot_messages(asked)
            return mine[0] if mine and 0 < len(_shown(mine[0])) < len(ANSWER) else None

        first = await fake.until(partly_shown, timeout=20)
        await app.kill()
        assert _shown(first) != ANSWER  # the dead process left it half-written
        await app.restart()

        log = await app.turns_ended(asked, timeout=40)
        await fake.until(lambda: _shown(first) == ANSWER or None, timeout=40)
        redis = connect(redis_url)
        try:

            async def checkpoint_dropped() -> bool:
                return not await Checkpoints(redis, "probe", 1).open()

            await poll_until(checkpoint_dropped, timeout=20, what="the turn's checkpoint to go")
        finally:
            await redis.aclose()

        assert [m.ts for m in app.bot_messages(asked)] == [first.ts]  # one reply, the same one
        assert _shown(fake.message(first.channel, first.ts)) == ANSWER
        assert len(of_type(log, "turn.started")) == 1 and of_type(log, "turn.completed")
        attempts = [p["attempt"] for p in of_type(log, "llm.call.dispatched")]
        assert attempts == [1, 2]  # the kill cut the first attempt
        assert not [c for c in fake.requests if c.error and c.status != 429]


async def test_a_watched_alert_is_triaged_once_across_a_kill_and_slack_s_retries(
    tmp_path: Path, redis_url: str, vendor: FakeVendor
) -> None:
    """An app's alert in a watched channel: its triage, cut by a SIGKILL, is finished by the
    next process in the same message; Slack's retry of the event and the same message
    under a new event_id start nothing more. (Replies stream natively here, but an alert
    has no person to stream to: its reply is edited.)"""
    vendor.push(Text(ANSWER, chunks=40, chunk_delay=0.15))  # cut by the kill
    vendor.push(Text(ANSWER, chunks=8, chunk_delay=0.05))  # the engine's second attempt
    async with FakeSlack() as fake:
        alerts_channel = fake.add_channel("alerts")
        alertmanager = fake.add_integration("Alertmanager", classic=True)
        watch = (
            f'[[agent.{AGENT}.slack.watch]]\nchannel = "{alerts_channel.id}"\n'
            'from = ["Alertmanager"]\nmatch = "^\\\\[FIRING"\n'
        )
        async with slack_serve(
            tmp_path, redis_url, vendor.url, stream="native", fake=fake, extra=watch
        ) as app:
            alert = fake.post_as_integration(
                alertmanager, alerts_channel, alerts.ALERTMANAGER_FIRING
            )
            [event] = fake.events_for(alert)
            envelope = fake.envelope(event)
            assert (await app.send_event(envelope)).status == 200

            def partly_shown() -> Message | None:
                mine = app.bot_messages(alert)
                return mine[0] if mine and 0 < len(_shown(mine[0])) < len(ANSWER) else None

            first = await fake.until(partly_shown, timeout=20)
            await app.kill()
            await app.restart()
            assert (await app.send_event(envelope, retry_num=1)).status == 200
            assert (await app.send_event(fake.envelope(event))).status == 200

            log = await app.turns_ended(alert, timeout=40)
            await fake.until(lambda: _shown(first) == ANSWER or None, timeout=40)
            assert [m.ts for m in app.bot_messages(alert)] == [first.ts]
            assert first.thread_ts == alert.ts
            assert len(of_type(log, "turn.started")) == 1 and of_type(log, "turn.completed")
            assert not fake.calls("chat.startStream")
            [asked] = [p for p in of_type(log, "message.new") if p["message"]["role"] == "user"]
            assert asked["message"]["content"].startswith("Alertmanager: [FIRING:2]")
