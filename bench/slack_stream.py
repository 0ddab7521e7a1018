"""First visible text and update cadence of a reply streamed into Slack, at 1 and 30 threads.

`subs serve` runs as its own process on an embedded (or `--redis`) redis-server, with the
agent's Slack bot on the HTTP Events API (`POST /slack/<agent>/events`, signed) and its Web
API pointed at a FakeSlack in this process (`SLACK_API_URL`), which enforces Slack's rate
limits. The fake vendor runs in a child process: bench/api_stream.py's TokenVendor, which
answers the mention `{"chunks": n, "delay": s}` with n unique words `t<k>`, one chunk every
s seconds, and notes `time.time()` just before writing each chunk. That note is the
vendor's own (FakeVendor.sending, as each frame goes out), so the first token's departure is
measured, not inferred from when the request came in plus the known delay.

Each thread (its own channel, or all in one with `--shared-channel`) runs turns back to back
for `--seconds`: a person mentions the bot in the thread, and again once the reply shows the
whole answer. The fake keeps every visible version of a message with the moment the Web
API call that made it was applied (`Version.at`, `time.time()`: the vendor's clock too),
whichever the call (chat.postMessage, chat.update, the native stream methods). Per thread
count:

- first text: from the answer's first token leaving the vendor to the first version of the
  reply that shows any of the answer; median and p99 over all replies.
- update interval: between consecutive versions whose text differs, from the first text on;
  the median over the intervals of every reply.

One turn before the runs warms the path up (Bolt's auth.test, connections) and is not
counted. The bot paces chat.update by Slack's tier (50 a minute per workspace) across all
threads, so expect ~1.2 s at one thread and ~36 s at 30. At 30 threads a 4 s answer is
complete before its reply's next slot: the reply shows its first words, then the whole
answer a round of the other replies later. That round is the cadence longer answers get
too (`--chunks 1200` streams each for two minutes, with several updates per reply).

    .venv/bin/python bench/slack_stream.py [--threads 1 30] [--seconds 60] [--chunks 40]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # engine, tests, bench

import argparse
import asyncio
import itertools
import json
import re
import statistics
from collections import Counter, deque
from dataclasses import dataclass, field

from bench.api_stream import Failure, Interrupts, _drain, with_token_vendor
from bench.step_overhead import ChildServer, p99
from engine.config import slack_env_suffix
from tests.engine_helpers import EngineProcess, project_toml
from tests.fakes.slack import FakeSlack, Message

AGENT = "ops_openai"
WORD = re.compile(r"(?<!\w)t(\d+)(?!\w)")  # one of TokenVendor's words
GRACE = 120.0  # seconds a turn may take beyond its answer's own length
MS = 1000.0


def visible(msg: Message) -> str:
    """What a person reads in a message now."""
    return msg.versions[-1].shown if msg.versions else msg.text


def changes(fake: FakeSlack, channel: str, ts: str) -> list[tuple[float, str]]:
    """When the message came to show different text, and that text."""
    seen: list[tuple[float, str]] = []
    for version in fake.edits(channel, ts):
        if not seen or seen[-1][1] != version.shown:
            seen.append((version.at, version.shown))
    return seen


def words(text: str) -> set[int]:
    return {int(k) for k in WORD.findall(text)}


def complete(shown: set[int], chunks: int) -> bool:
    """The whole answer: `chunks` consecutive words."""
    return len(shown) == chunks and max(shown) - min(shown) == chunks - 1


def ask(chunks: int, delay: float) -> str:
    """The mention text that makes the vendor answer with `chunks` words."""
    return json.dumps({"chunks": chunks, "delay": delay})


# --- the people in the threads ------------------------------------------------------------


@dataclass
class Thread:
    channel: str
    root: str | None = None
    replies: list[str] = field(default_factory=list)  # ts of each turn's reply


async def turn(
    fake: FakeSlack, url: str, thread: Thread, text: str, chunks: int, wait: float
) -> None:
    """Mention the bot in the thread; return once a new reply shows the whole answer."""
    mention = fake.post_as_user(thread.channel, fake.mention(text), thread_ts=thread.root)
    thread.root = thread.root or mention.ts
    root = thread.root
    before = {m.ts for m in fake.thread(thread.channel, root) if m.bot_id}
    delivered = await fake.send_event(url, fake.event_for(mention, kind="app_mention"))
    if delivered.status != 200:
        raise Failure(f"the bot answered {delivered.status} to a mention: {delivered.text[:200]}")

    def new_replies() -> list[Message]:
        return [m for m in fake.thread(thread.channel, root) if m.bot_id and m.ts not in before]

    def answered() -> Message | None:
        return next((m for m in new_replies() if complete(words(visible(m)), chunks)), None)

    try:
        reply = await fake.until(answered, wait)
    except TimeoutError:
        shows = [visible(m)[:200] for m in new_replies()]
        raise Failure(
            f"thread {thread.channel}/{root}: no whole answer in {wait:g} s; "
            f"the bot's new messages show {shows}"
        ) from None
    thread.replies.append(reply.ts)


async def converse(
    fake: FakeSlack, url: str, thread: Thread, args: argparse.Namespace, until: float
) -> None:
    """Turns back to back in one thread while the loop's clock is before `until`."""
    loop = asyncio.get_running_loop()
    text = ask(args.chunks, args.chunk_ms / MS)
    wait = args.chunks * args.chunk_ms / MS + GRACE
    while loop.time() < until:
        await turn(fake, url, thread, text, args.chunks, wait)


# --- one run -------------------------------------------------------------------------------


@dataclass
class Figures:
    first_text: list[float]  # seconds, per reply
    intervals: list[float]  # seconds, every reply's
    updates: list[int]  # per reply: visible changes after its first text
    errors: Counter[str]  # the fake's error answers during the run, by method and error


async def run(
    args: argparse.Namespace, fake: FakeSlack, url: str, vendor: ChildServer, n: int
) -> Figures:
    if args.shared_channel:
        channels = [fake.add_channel(f"incident-{n}")] * n
    else:
        channels = [fake.add_channel(f"incident-{n}-{i}") for i in range(n)]
    threads = [Thread(channel.id) for channel in channels]
    vendor.take()
    mark = len(fake.requests)
    until = asyncio.get_running_loop().time() + args.seconds
    async with asyncio.TaskGroup() as group:
        for thread in threads:
            group.create_task(converse(fake, url, thread, args, until))
    sent = vendor.take()
    errors = Counter(f"{c.method} {c.error}" for c in fake.requests[mark:] if c.error)

    figures = Figures([], [], [], errors)
    for thread in threads:
        for ts in thread.replies:
            seen = [(at, words(text)) for at, text in changes(fake, thread.channel, ts)]
            first = f"t{min(seen[-1][1])}"  # the answer's first word
            if first not in sent:
                raise Failure(f"the vendor has no note of sending {first}")
            times = [at for at, shown in seen if shown]
            figures.first_text.append(times[0] - sent[first])
            figures.intervals += [b - a for a, b in itertools.pairwise(times)]
            figures.updates.append(len(times) - 1)
    return figures


def line(args: argparse.Namespace, n: int, f: Figures) -> str:
    where = "one channel" if args.shared_channel else "a channel each"
    setup = (
        f"{n} thread{'s' if n > 1 else ''} ({where}; {args.chunks} chunks {args.chunk_ms:g} ms "
        f"apart; {len(f.first_text)} replies in {args.seconds:g} s)"
    )
    first = (
        f"first token -> first visible text median {statistics.median(f.first_text) * MS:.0f} ms,"
        f" p99 {p99(f.first_text) * MS:.0f} ms"
    )
    if f.intervals:
        every = (
            f"visible updates of a reply every {statistics.median(f.intervals):.2f} s (median of "
            f"{len(f.intervals)}; {statistics.mean(f.updates):.1f} per reply after its first text)"
        )
    else:
        every = "no reply was updated after its first text"
    errors = ", ".join(f"{e} x{k}" for e, k in f.errors.most_common()) or "none"
    return f"{setup}: {first}; {every}; Slack errors: {errors}"


# --- the run -------------------------------------------------------------------------------


async def bench(args: argparse.Namespace, redis_url: str, vendor: ChildServer, tmp: Path) -> None:
    interrupts = Interrupts()
    fake = FakeSlack()
    await fake.start()
    config = tmp / "subs.toml"
    slack = f'\n[agent.{AGENT}.slack]\nanswers = "both"\nstream = "{args.stream}"\n'
    config.write_text(project_toml(vendor.url) + slack)
    suffix = slack_env_suffix(AGENT)
    env = {
        "SUBS_LEASE_MS": "10000",  # the default lease
        f"SLACK_BOT_TOKEN_{suffix}": fake.bot_token,
        f"SLACK_SIGNING_SECRET_{suffix}": fake.signing_secret,
        f"SLACK_APP_TOKEN_{suffix}": "",  # HTTP, even if the shell has one set
        "SLACK_API_URL": fake.url,
    }
    serve = EngineProcess(config, redis_url, env=env)
    stderr: deque[str] = deque(maxlen=20)
    drain: asyncio.Task[None] | None = None
    try:
        await serve.start()
        assert serve.proc is not None and serve.proc.stderr is not None
        drain = asyncio.create_task(_drain(serve.proc.stderr, stderr))  # a full pipe would block it
        url = f"{serve.api}/slack/{AGENT}/events"
        warm = Thread(fake.add_channel("warm-up").id)
        await turn(fake, url, warm, ask(3, 0.0), 3, GRACE)
        for n in args.threads:
            print(line(args, n, await run(args, fake, url, vendor, n)), flush=True)
    except BaseException as exc:
        if interrupts.seen:  # Ctrl-C reaches `subs serve` too: what fails after it is no failure
            raise asyncio.CancelledError from None
        if isinstance(exc, Exception) and stderr:
            print("subs serve said:\n" + "".join(stderr), file=sys.stderr)
        raise
    finally:
        if serve.proc is not None:
            try:
                await serve.stop()
            except TimeoutError:
                serve.kill()
                await serve.proc.wait()
        if drain is not None:
            drain.cancel()
        await fake.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--threads", type=int, nargs="+", default=[1, 30], help="concurrent threads, a run each"
    )
    parser.add_argument(
        "--seconds", type=float, default=60.0, help="how long each run starts new turns"
    )
    parser.add_argument("--chunks", type=int, default=40, help="chunks (words) per answer")
    parser.add_argument("--chunk-ms", type=float, default=100.0, help="vendor pace per chunk")
    parser.add_argument(
        "--shared-channel", action="store_true", help="a run's threads all in one channel"
    )
    parser.add_argument(
        "--stream", choices=("edit", "native"), default="edit", help="the agent's Slack stream"
    )
    parser.add_argument("--redis", metavar="URL", help="a running Redis (default: embedded)")
    args = parser.parse_args()
    if args.chunks < 2 or min(args.threads) < 1:
        parser.error("--chunks must be at least 2 and every --threads at least 1")
    return with_token_vendor(
        lambda url, vendor, _server, tmp: bench(args, url, vendor, tmp), args.redis
    )


if __name__ == "__main__":
    sys.exit(main())
