"""Bounded load through `subs serve`: Slack threads streaming at once within Slack's limits.

FakeSlack enforces Slack's limits as they are (DEFAULT_LIMITS: chat.update 50/min per
workspace, chat.postMessage 1/s per channel, ...), so every edit of 30 growing messages
shares one chat.update budget of 1.2 s. The bot must pace and coalesce: no failed post, every
final message complete, nothing about errors or rate limits shown to a person.

The full load, 30 threads for a minute, takes about 100 s, not less: after 60 s of tokens
the 30 final edits alone need 36 s of chat.update budget; it is marked `slow`. The default
run streams 6 threads for 8 s (about 20 s): the same contention for one chat.update budget,
the same checks.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bot.rendering.mrkdwn import to_mrkdwn
from tests.fakes.llm_vendor import FakeVendor, Text
from tests.fakes.slack import DEFAULT_LIMITS, Call, FakeSlack, Message
from tests.slack_serve_helpers import SlackServe, of_type, slack_serve

CHANNELS = 3  # incident channels, threads / CHANNELS threads each
SHOWN_BAD = re.compile(r"rate.?limit|ratelimited|\b429\b|retry|error|fail|warning", re.I)
TARGET = ("channel", "channel_id", "ts", "thread_ts", "timestamp")


@dataclass(frozen=True)
class Load:
    threads: int
    stream_seconds: float
    words: int  # one chunk each, spread over stream_seconds


FULL = Load(threads=30, stream_seconds=60, words=60)
SMALL = Load(threads=6, stream_seconds=8, words=16)


def answer(n: int, words: int) -> str:
    """Thread n's answer: plain words, so its mrkdwn is itself and nothing looks like an error."""
    return f"Thread {n}: " + " ".join(f"check{n}.{k} ok" for k in range(words - 2))


def target(call: Call) -> tuple[Any, ...]:
    """The message or thread a call acts on: a retry of a refused call names the same one."""
    return (call.method, *(call.args.get(key) for key in TARGET))


@pytest.mark.parametrize(
    "load", [SMALL, pytest.param(FULL, marks=pytest.mark.slow)], ids=["6x8s", "30x60s"]
)
async def test_threads_stream_at_once_within_slacks_limits(
    tmp_path: Path, redis_url: str, vendor: FakeVendor, load: Load
) -> None:
    def reply_for(body: Any) -> Text:
        found = re.search(r"load-(\d+)", json.dumps(body))
        assert found is not None, "a model call for no load thread"
        n = int(found.group(1))
        delay = load.stream_seconds / load.words
        return Text(answer(n, load.words), chunks=load.words, chunk_delay=delay)

    vendor.responder = reply_for
    # Every thread streams at once: Slack's limits are what this measures, so the app's own
    # bound on turns at once (max_concurrent_turns, tests/test_slack_storm.py) is lifted.
    lifted = f"max_concurrent_turns = {load.threads}\n"
    async with slack_serve(tmp_path, redis_url, vendor.url, transport="http", extra=lifted) as app:
        fake = app.fake
        assert fake.limits == DEFAULT_LIMITS  # Slack's limits, not loosened
        channels = [fake.add_channel(f"incident-{c}") for c in range(CHANNELS)]
        mentions = [
            fake.post_as_user(channels[n % CHANNELS], fake.mention(f"load-{n} status?"))
            for n in range(load.threads)
        ]
        started = time.monotonic()
        sent = await asyncio.gather(
            *(app.send_event(fake.event_for(m, kind="app_mention")) for m in mentions)
        )
        assert all(s.status == 200 and s.elapsed < 3 for s in sent), [
            (s.status, s.elapsed) for s in sent
        ]

        # The stream, then the final edits at 1.2 s apart, and slack for a loaded machine.
        timeout = load.stream_seconds + 1.2 * load.threads + 30
        replies = await asyncio.gather(
            *(
                app.reply(m, text=to_mrkdwn(answer(n, load.words)), timeout=timeout)
                for n, m in enumerate(mentions)
            )
        )
        took = time.monotonic() - started
        await check_sessions(app, mentions)
        logged_errors = [line for line in app.stderr if line.startswith("ERROR")]

    for n, (mention, reply) in enumerate(zip(mentions, replies, strict=True)):
        thread = fake.thread(mention.channel, mention.ts)
        assert [m.ts for m in thread] == [mention.ts, reply.ts], f"thread {n}"
        assert reply.text == to_mrkdwn(answer(n, load.words))
        assert len(fake.edits(reply.channel, reply.ts)) > 1, f"thread {n} was not streamed"

    refused = [c for c in fake.requests if c.error and c.status != 429]
    assert refused == [], [(c.method, c.error) for c in refused]
    limited = [c for c in fake.requests if c.status == 429]
    for call in limited:  # each one was tried again, and that landed
        assert any(
            later.at >= call.at and not later.error and target(later) == target(call)
            for later in fake.requests
        ), f"429 on {target(call)} never retried"
    assert fake.ephemerals == []
    assert shown_bad(fake, mentions) == []
    # 429s the fake answered: 0 in our runs (the bot's governor uses Slack's tiers). Before
    # governed calls booked their slot, concurrent first posts in a channel collided: ~60
    # chat.postMessage 429s a run, and 6 posts given up after 5 tries (caught by `logged_errors`).
    print(f"\n{load.threads} threads in {took:.1f} s; 429s answered by the fake: {len(limited)}")
    # A post the bot gave up on (a failed turn, logged) is a failed post, even if a later
    # resume of the turn posted it again.
    assert logged_errors == [], "\n".join(logged_errors)


async def check_sessions(app: SlackServe, mentions: list[Message]) -> None:
    """One turn per thread, completed."""
    for mention in mentions:
        events = await app.events(mention)
        assert len(of_type(events, "turn.started")) == 1
        assert len(of_type(events, "turn.completed")) == 1


def shown_bad(fake: FakeSlack, mentions: list[Message]) -> list[tuple[str, str]]:
    """Any version of any message in the load threads that reads like an error or a limit."""
    bad = []
    for mention in mentions:
        for msg in fake.thread(mention.channel, mention.ts):
            for version in fake.edits(msg.channel, msg.ts):
                shown = version.text + json.dumps(version.blocks)
                if SHOWN_BAD.search(shown):
                    bad.append((msg.ts, shown[:200]))
    return bad
