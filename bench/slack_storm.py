"""A storm of mentions at once: how `max_concurrent_turns` bounds it, and what it costs.

N mentions, each a new thread in one alerts channel, are delivered to the bot at once
(signed Events API requests, Bolt, the real slack_sdk against a FakeSlack) with the real
engine on an embedded redis-server and the fake vendor answering each model call after
`--latency` seconds. Everything runs in this one process, so the figures include its CPU
sharing. Per (N, max_concurrent_turns):

- ack: the slowest HTTP answer to Slack's deliveries (Slack wants each within 3 s);
- first / last reply: from the deliveries to the first and to the last thread whose reply
  shows its whole answer (the fake's `Version.at`, when the call that made it was applied);
- max model calls in flight: the most requests the vendor was answering at once;
- Web API calls: every call the fake received during the run, the busiest methods, and the
  429s it answered.

By default Slack's limits are lifted on both sides (the bot's governor and the fake), so
the run measures the bound itself: the last reply comes after about N / limit model calls.
`--slack-tiers` keeps Slack's own limits (the governor's tiers, the fake's buckets): then
chat.postMessage's one per second per channel and chat.update's 50 a minute pace the
replies, and a run of 200 takes minutes.

    .venv/bin/python bench/slack_storm.py [--n 50 200] [--limits 4 16] [--latency 1.0]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # engine, tests, bench

import argparse
import asyncio
import re
import statistics
import tempfile
import time
from collections import Counter
from typing import Any

from bot.slack.governor import TIERS
from engine.config import parse_project
from engine.store.embedded import EmbeddedRedis
from engine.store.store import connect
from tests.bot_helpers import AGENT, FAST, serve_bots
from tests.engine_helpers import project_toml
from tests.fakes.llm_vendor import FakeVendor, Text
from tests.fakes.slack import DEFAULT_LIMITS, FakeSlack

ASK = re.compile(r"storm-(\d+)")
GRACE = 600.0  # seconds the last reply may take beyond N / limit model calls


def answer(n: int) -> str:
    return f"Alert {n} triaged: nothing to do."


class Failure(Exception):
    """The run did not answer every mention once."""


async def run(
    redis_url: str, n: int, limit: int, latency: float, slack_tiers: bool, tmp: Path
) -> str:
    redis = connect(redis_url)
    await redis.flushall()
    vendor = FakeVendor()
    await vendor.start()

    def reply_for(body: Any) -> Text:
        found = ASK.findall(str(body))
        if not found:
            raise Failure("a model call for no storm mention")
        return Text(answer(int(found[-1])), chunks=1, end_delay=latency)

    vendor.responder = reply_for
    text = project_toml(vendor.url, retry="retry = { llm = { backoff_base_secs = 0 } }")
    text += f'\n[agent.{AGENT}.slack]\nanswers = "both"\nmax_concurrent_turns = {limit}\n'
    project = parse_project(text, str(tmp / "subs.toml"), env={})
    limits = None if slack_tiers else {m: None for m in DEFAULT_LIMITS}
    tiers = TIERS if slack_tiers else FAST
    try:
        async with serve_bots(
            redis, vendor, project, AGENT, slack_limits=limits, tiers=tiers
        ) as world:
            return await storm(world.fake, world.url, vendor, n, limit, latency)
    finally:
        await vendor.stop()
        await redis.aclose()


async def storm(
    fake: FakeSlack, url: str, vendor: FakeVendor, n: int, limit: int, latency: float
) -> str:
    channel = fake.add_channel("alerts")
    mentions = [fake.post_as_user(channel, fake.mention(f"storm-{k}")) for k in range(n)]
    events = [fake.event_for(m, kind="app_mention") for m in mentions]
    mark = len(fake.requests)
    began = time.time()
    sent = await asyncio.gather(*(fake.send_event(url, e) for e in events))
    if any(s.status != 200 for s in sent):
        raise Failure(f"deliveries answered {Counter(s.status for s in sent)}")

    def answered_at() -> list[float] | None:
        times = []
        for k, msg in enumerate(mentions):
            found = [
                v.at
                for m in fake.thread(channel.id, msg.ts)
                if fake.by_app(m)
                for v in fake.edits(channel.id, m.ts)
                if v.text == answer(k)
            ]
            if not found:
                return None
            times.append(min(found))
        return times

    times = await fake.until(answered_at, n / limit * (latency + 1) + GRACE)
    replies = [m for msg in mentions for m in fake.thread(channel.id, msg.ts) if fake.by_app(m)]
    if len(replies) != n or len(vendor.requests) != n:
        raise Failure(f"{len(replies)} replies and {len(vendor.requests)} model calls for {n}")
    calls = fake.requests[mark:]
    methods = ", ".join(f"{m} {k}" for m, k in Counter(c.method for c in calls).most_common(4))
    limited = sum(1 for c in calls if c.status == 429)
    model = statistics.median(vendor.durations)
    return (
        f"N={n} max_concurrent_turns={limit}: ack max {max(s.elapsed for s in sent):.2f} s; "
        f"first reply {min(times) - began:.2f} s, last reply {max(times) - began:.2f} s; "
        f"max model calls in flight {vendor.max_in_flight} (model call median {model:.2f} s); "
        f"Web API calls {len(calls)} ({methods}; 429s {limited})"
    )


async def bench(args: argparse.Namespace, redis_url: str, tmp: Path) -> None:
    for n in args.n:
        for limit in args.limits:
            print(await run(redis_url, n, limit, args.latency, args.slack_tiers, tmp), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, nargs="+", default=[50, 200], help="mentions at once")
    parser.add_argument(
        "--limits", type=int, nargs="+", default=[4, 16], help="max_concurrent_turns, a run each"
    )
    parser.add_argument("--latency", type=float, default=1.0, help="seconds per model call")
    parser.add_argument(
        "--slack-tiers", action="store_true", help="keep Slack's rate limits (slow: minutes)"
    )
    args = parser.parse_args()
    if min(args.n) < 1 or min(args.limits) < 1 or args.latency < 0:
        parser.error("--n and --limits must be at least 1, --latency at least 0")
    with tempfile.TemporaryDirectory(prefix="subs-bench-") as tmp:
        server = EmbeddedRedis(Path(tmp) / "redis")
        try:
            url = server.start()
            asyncio.run(bench(args, url, Path(tmp)))
        except (KeyboardInterrupt, asyncio.CancelledError):
            print("interrupted", file=sys.stderr)
            return 130
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
