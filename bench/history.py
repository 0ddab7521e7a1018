"""Does a step cost more as the conversation grows? One session, many turns.

One engine-decided session runs `--turns` turns (200) back to back on an in-process
Engine and the embedded redis-server, after a 5-turn session that warms them up. Each
turn is a streamed model call; every `--tool-every` turns (5) the model first calls a
client tool that the bench answers, so the history holds tool calls and results too.
The fake vendor (bench/vs_langgraph.py's, in its own process) answers at once with
`--words`-word replies.

Printed: the median turn time over turns 1-10 and over the last 10, and their ratio
(target: at most 1.5x), the same for the turn time minus the vendor's own time and for
the engine's apply+commit per step; then, every tenth of the run, the bytes written to
Redis per committed step (`INFO stats` total_net_input_bytes around each turn, divided by
the steps the engine committed in it: everything any client sent, so the commits' events
and snapshots, the work items, the token deltas and the clients' reads), next to the
history's length and the snapshot key's size (`MEMORY USAGE`). A step that writes only
what it adds keeps that column flat; one that rewrites the whole snapshot makes it grow
with the history.

    .venv/bin/python bench/history.py [--turns 200] [--tool-every 5] [--words 40]
        [--fsync always|everysec]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # engine, tests, bench

import argparse
import asyncio
import contextlib
import functools
import json
import signal
import statistics
import tempfile
import textwrap
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from bench.step_overhead import ChildServer
from bench.vs_langgraph import (
    MODEL,
    SYSTEM,
    TOOL,
    TOOL_DESCRIPTION,
    TURN_TIMEOUT,
    lookup,
    take_vendor,
    user_text,
    vendor_child,
)
from engine.client import Client
from engine.config import DEFAULT_FSYNC, Project, parse_project
from engine.runtime.engine import Engine
from engine.store.embedded import EmbeddedRedis
from engine.store.store import Store, connect
from tests.engine_helpers import ENV

AGENT = "historian"
EDGE = 10  # turns at each end of the run that are compared
WARMUP_TURNS = 5


def project_of(tmp: Path, vendor_url: str) -> Project:
    text = textwrap.dedent(
        f"""\
        [llm.openai]
        type = "openai"
        base_url = "{vendor_url}/v1"

        [agent.{AGENT}]
        llm = "openai"
        model = "{MODEL}"
        system = "{SYSTEM}"
        tools = [{{ name = "{TOOL}", description = "{TOOL_DESCRIPTION}", handler = "client" }}]
        """
    )
    path = tmp / "subs.toml"
    path.write_text(text)
    return parse_project(text, str(path), env={})


@dataclass
class Turn:
    seconds: float
    vendor_seconds: float
    steps: int
    step_seconds: list[float]  # the engine's apply+commit of each step
    bytes_in: int  # what Redis read from its clients during the turn
    messages: int  # in the history once the turn ended
    snapshot: int  # bytes Redis holds for the session's snapshot key once the turn ended


async def bytes_in(redis: aioredis.Redis) -> int:
    return int((await redis.info("stats"))["total_net_input_bytes"])


async def one_turn(
    client: Client,
    sid: str,
    events: AsyncIterator[tuple[str, dict[str, Any]]],
    text: str,
) -> int:
    """Submit a message, answer any client tool call, return at the turn's end.

    Returns the number of messages the turn added."""
    message = {"role": "user", "content": text}
    submitted = await client.submit(
        {"type": "client.message", "agent_id": AGENT, "message": message}, session_id=sid
    )
    turn_id = submitted["turn_id"]
    calls: dict[str, str] = {}
    added = 0
    async for kind, item in events:
        if kind != "event" or item.get("turn_id") != turn_id:
            continue
        payload = item["payload"]
        what = payload["type"]
        if what == "message.new":
            added += 1
        elif what == "tool.call.requested":
            calls[payload["id"]] = payload["arguments"]
        elif what == "tool.call.dispatched" and payload["id"] in calls:
            q = json.loads(calls.pop(payload["id"])).get("q", "")
            result = {"type": "tool.result", "id": payload["id"], "result": lookup(q)}
            await client.submit(result, session_id=sid)
        elif what == "turn.failed":
            raise RuntimeError(f"turn failed: {payload.get('error')}")
        elif what == "turn.completed":
            return added
    raise RuntimeError("the event stream ended mid-turn")


async def run(
    engine: Engine, client: Client, vendor: ChildServer, sid: str, turns: int, tool_every: int
) -> list[Turn]:
    redis = client.store.redis
    snap_key = client.store.snap_key(sid)
    out: list[Turn] = []
    messages = 0
    take_vendor(vendor)
    async with contextlib.aclosing(client.follow(sid, 0, delta_cursor="0-0")) as events:
        for t in range(turns):
            tag = f"{sid} t{t}"
            text = user_text(tag, tool=tool_every > 0 and t % tool_every == tool_every - 1)
            written, steps = await bytes_in(redis), engine.stats.steps
            recorded = len(engine.stats.step_seconds)
            started = time.perf_counter()
            async with asyncio.timeout(TURN_TIMEOUT):
                messages += await one_turn(client, sid, events, text)
            seconds = time.perf_counter() - started
            written = await bytes_in(redis) - written
            in_vendor = take_vendor(vendor).seconds  # keyed by the turn's user message
            if list(in_vendor) != [text]:
                raise RuntimeError(f"turn {t + 1}: the vendor answered {list(in_vendor)}")
            out.append(
                Turn(
                    seconds=seconds,
                    vendor_seconds=in_vendor[text],
                    steps=engine.stats.steps - steps,
                    step_seconds=engine.stats.step_seconds[recorded:],
                    bytes_in=written,
                    messages=messages,
                    snapshot=await redis.memory_usage(snap_key) or 0,
                )
            )
    return out


def edge_ratio(name: str, first: list[float], last: list[float], scale: float) -> None:
    a, b = statistics.median(first) * scale, statistics.median(last) * scale
    print(f"  {name:<42} {a:13.3f} {b:13.3f} {b / a:6.2f}x")


def report(turns: list[Turn], tool_every: int, words: int, fsync: str) -> None:
    n = len(turns)
    edge = min(EDGE, n)
    first, last = turns[:edge], turns[-edge:]
    tool = f"a tool call every {tool_every} turns" if tool_every else "no tool calls"
    print(f"history: one session, {n} turns ({tool}), {words}-word answers, fsync {fsync}")
    print(f"  {'median':<42} {f'turns 1-{edge}':>13} {f'turns {n - edge + 1}-{n}':>13}  ratio")
    edge_ratio(
        "turn time, ms (target: ratio <= 1.5x)",
        [t.seconds for t in first],
        [t.seconds for t in last],
        1000,
    )
    edge_ratio(
        "turn time minus the vendor's, ms",
        [t.seconds - t.vendor_seconds for t in first],
        [t.seconds - t.vendor_seconds for t in last],
        1000,
    )
    edge_ratio(
        "engine apply+commit per step, ms",
        [s for t in first for s in t.step_seconds],
        [s for t in last for s in t.step_seconds],
        1000,
    )
    edge_ratio(
        "written to Redis per step, KB",
        [t.bytes_in / t.steps for t in first],
        [t.bytes_in / t.steps for t in last],
        1 / 1000,
    )
    # Over windows of turns, not single ones: the full snapshot is rewritten now and then
    # (engine/store/snapshots.py), so one turn's figure is either a rewrite or none.
    print("  bytes written to Redis per step as the history grows, by window of turns:")
    print(f"  {'turns':>9} {'messages':>9} {'snapshot KB':>12} {'steps':>6} {'KB/step':>8}")
    marks = sorted({0, *range(max(n // 10, 1) - 1, n, max(n // 10, 1)), n - 1})
    start = 0
    for i in marks:
        window = turns[start : i + 1]
        steps = sum(t.steps for t in window)
        written = sum(t.bytes_in for t in window)
        t = turns[i]
        print(
            f"  {f'{start + 1}-{i + 1}':>9} {t.messages:>9} {t.snapshot / 1000:>12.1f} "
            f"{steps:>6} {written / steps / 1000:>8.1f}"
        )
        start = i + 1


async def bench(args: argparse.Namespace, redis_url: str, vendor: ChildServer, tmp: Path) -> None:
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)  # as Ctrl-C
    engine = Engine(project_of(tmp, vendor.url), connect(redis_url), env=ENV)
    client_redis = connect(redis_url)  # the clients' own pool, as a separate process would have
    try:
        await engine.start()
        await engine.leases.wait_owned(engine.store.partitions)
        engine.stats.record_steps = True
        client = Client(await Store.open(client_redis))
        # Connections, caches, lazy imports: paid by a session of its own, not by turn 1.
        await run(engine, client, vendor, "bench-warmup", WARMUP_TURNS, args.tool_every)
        turns = await run(engine, client, vendor, "bench-history", args.turns, args.tool_every)
    finally:
        await engine.stop()
        await engine.redis.aclose()
        await client_redis.aclose()
    report(turns, args.tool_every, args.words, args.fsync)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=200, help="turns in the one session")
    parser.add_argument(
        "--tool-every", type=int, default=5, help="a tool call every N turns (0: none)"
    )
    parser.add_argument("--words", type=int, default=40, help="words in each model answer")
    parser.add_argument(
        "--fsync",
        choices=["always", "everysec"],
        default=DEFAULT_FSYNC,
        help="the embedded server's appendfsync ([store] fsync; default %(default)s)",
    )
    args = parser.parse_args()
    if args.turns < 1 or args.tool_every < 0:
        parser.error("--turns must be at least 1 and --tool-every at least 0")
    with tempfile.TemporaryDirectory(prefix="subs-bench-") as tmp:
        server = EmbeddedRedis(Path(tmp) / "redis", fsync=args.fsync)
        vendor = ChildServer(functools.partial(vendor_child, args.words))
        try:
            url = server.start()
            vendor.start()
            vendor.ready()
            asyncio.run(bench(args, url, vendor, Path(tmp)))
        except (KeyboardInterrupt, asyncio.CancelledError):
            print("interrupted", file=sys.stderr)
            return 130
        finally:
            vendor.stop()
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
