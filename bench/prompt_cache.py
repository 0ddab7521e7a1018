"""What prompt caching saves: the example on-call agent over one long session.

The repo's subs.toml, its model (anthropic/claude-sonnet-4-5 on OpenRouter) on the fake
vendor, which caches as Anthropic does through OpenRouter (tests/fakes/prompt_cache.py)
and bills at the model's OpenRouter prices ($3 input, $0.30 cache read, $3.75 cache
write, $15 output per million tokens). Its git connection (mcp-server-git, a test
dependency) runs for real on a tiny repository, so the model sees the tools it would;
the runbooks server (npx) is left off, as `subs check` leaves a command that is not
installed. Every `--tool-every` turns the model first calls changes__git_log.

One session of `--turns` turns (20) runs with `cache = true` (the default), then again
with `cache = false`, on an in-process Engine and the embedded redis-server. Printed:
each turn's input tokens, what the cache read and wrote, and its cost both ways; the
totals; and where the second turn's request carried its breakpoints.

    .venv/bin/python bench/prompt_cache.py [--turns 20] [--tool-every 5]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # engine, tests, bench

import argparse
import asyncio
import os
import shutil
import tempfile
from decimal import Decimal
from typing import Any

from engine.client import Client
from engine.config import parse_project
from engine.runtime.engine import Engine
from engine.store.embedded import EmbeddedRedis
from engine.store.store import connect
from tests.engine_helpers import ENV, ROOT, turn_ended, wait_for_event
from tests.fakes.llm_vendor import FakeVendor, Text, ToolCalls
from tests.test_example_oncall import git_repo  # the example agent's repo, as its test makes it

QUESTIONS = [
    "pg_pool_waiting_clients is firing on the API, what do I check first?",
    "The pool is at 5 and all connections are busy. Is that normal for this hour?",
    "What changed in the last deploy that could touch the database pool?",
    "Should I raise the pool size back to 20 or roll back the change?",
    "Latency on checkout went from 200 ms to 2 s at the same time. Related?",
]
ANSWER = (
    "Start with the runbook for database connections: confirm the pool size the API runs "
    "with, compare waiting clients with active ones, and look at the slowest queries of the "
    "last fifteen minutes. If the pool was lowered in the last change, that alone explains "
    "the waits; raising it back is safe, a rollback is the surer fix. Ask before either."
)


def project_text(vendor: FakeVendor, cache: bool) -> str:
    """The example's subs.toml with its model on the fake (and `cache` said)."""
    text = (ROOT / "subs.toml").read_text()
    block = '[llm.openrouter]\ntype = "openrouter"'
    assert block in text, "subs.toml's [llm.openrouter] block moved"
    said = f'{block}\nbase_url = "{vendor.openrouter_base()}"\ncache = {str(cache).lower()}'
    return text.replace(block, said)


def bare_path(tmp: Path) -> str:
    """A PATH with this Python's scripts (mcp-server-git) and git, without npx."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    git = shutil.which("git")
    if git is not None:
        (bin_dir / "git").symlink_to(git)
    return f"{Path(sys.executable).parent}{os.pathsep}{bin_dir}"


async def session(
    redis_url: str, tmp: Path, repo: Path, cache: bool, turns: int, tool_every: int
) -> tuple[list[dict[str, Any]], list[Any]]:
    """One session of `turns` turns; each turn's turn.completed payload, and the requests."""
    async with FakeVendor() as vendor:
        folder = tmp / ("cached" if cache else "uncached")
        folder.mkdir()
        shutil.copytree(ROOT / "runbooks", folder / "runbooks")
        config = folder / "subs.toml"
        config.write_text(project_text(vendor, cache))
        project = parse_project(config.read_text(), str(config), env={})
        env = {**ENV, "OPENROUTER_API_KEY": "bench", "ONCALL_REPO": str(repo)}
        engine = Engine(project, connect(redis_url), env=env)
        ends: list[dict[str, Any]] = []
        try:
            await engine.start()
            client = Client(engine.store)
            sid = None
            for n in range(turns):
                if tool_every and (n + 1) % tool_every == 0:
                    git_log = ("changes__git_log", {"repo_path": ".", "max_count": 3})
                    vendor.push(ToolCalls([git_log]))
                vendor.push(Text(ANSWER))
                message = {"role": "user", "content": QUESTIONS[n % len(QUESTIONS)]}
                submit = {"type": "client.message", "agent_id": "oncall", "message": message}
                reply = await client.submit(submit, session_id=sid)
                sid = reply["session_id"]
                end = await wait_for_event(client, sid, turn_ended(reply["turn_id"]), timeout=60)
                if end["payload"]["type"] != "turn.completed":
                    raise RuntimeError(f"turn {n + 1} failed: {end['payload'].get('error')}")
                ends.append(end["payload"])
        finally:
            await engine.stop()
            await engine.redis.aclose()
        return ends, list(vendor.requests)


def breakpoints(body: Any) -> list[str]:
    """What a Chat Completions body's markers sit on: "system", "tools", or a message."""
    found = []
    for tool in body.get("tools") or ():
        if "cache_control" in tool:
            found.append("tools")
    for index, message in enumerate(body.get("messages") or ()):
        parts = message.get("content") if isinstance(message.get("content"), list) else []
        if any("cache_control" in p for p in parts):
            role = message["role"]
            found.append("system" if role == "system" else f"messages[{index}] ({role})")
    return found


def report(
    turns: int, tool_every: int, on: list[dict[str, Any]], off: list[dict[str, Any]], second: Any
) -> None:
    print(
        f"prompt cache: the example agent (anthropic/claude-sonnet-4-5 on OpenRouter, fake), "
        f"{turns} turns, a tool call every {tool_every}"
    )
    print(
        f"  {'turn':>4} {'input':>7} {'read':>7} {'written':>7} {'cost, cached':>13} "
        f"{'cost, cache = false':>19}"
    )
    for n, (a, b) in enumerate(zip(on, off, strict=True), 1):
        u = a["usage"]
        print(
            f"  {n:>4} {u['input']:>7} {u['cache_read']:>7} {u['cache_write']:>7} "
            f"{'$' + a['cost']:>13} {'$' + b['cost']:>19}"
        )
    cost_on = sum(Decimal(e["cost"]) for e in on)
    cost_off = sum(Decimal(e["cost"]) for e in off)
    read = sum(e["usage"]["cache_read"] for e in on)
    total = sum(e["usage"]["input"] for e in on)
    print(
        f"  total: ${cost_on:.4f} cached, ${cost_off:.4f} uncached: "
        f"{100 * (1 - cost_on / cost_off):.0f}% saved; {100 * read / total:.0f}% of input read "
        "from the cache"
    )
    tools = [t["function"]["name"] for t in second.get("tools") or ()]
    print(f"  tools offered: {len(tools)} ({', '.join(tools)})")
    if len(on) > 1:
        print(
            f"  turn 2: ${Decimal(on[1]['cost']):.6f} against turn 1's "
            f"${Decimal(on[0]['cost']):.6f}; breakpoints on {', '.join(breakpoints(second))}"
        )


async def bench(args: argparse.Namespace, redis_url: str, tmp: Path) -> None:
    repo = git_repo(tmp / "app")
    os.environ["PATH"] = bare_path(tmp)
    on, requests = await session(redis_url, tmp, repo, True, args.turns, args.tool_every)
    off, _ = await session(redis_url, tmp, repo, False, args.turns, args.tool_every)
    # The second turn's request: the first after turn 1's own calls.
    first_turn_calls = 2 if args.tool_every == 1 else 1
    second = requests[min(first_turn_calls, len(requests) - 1)].body
    report(args.turns, args.tool_every, on, off, second)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=20, help="turns in the session")
    parser.add_argument(
        "--tool-every", type=int, default=5, help="a git_log call every N turns (0: none)"
    )
    args = parser.parse_args()
    if args.turns < 1 or args.tool_every < 0:
        parser.error("--turns must be at least 1 and --tool-every at least 0")
    with tempfile.TemporaryDirectory(prefix="subs-bench-") as tmp:
        server = EmbeddedRedis(Path(tmp) / "redis")
        try:
            url = server.start()
            asyncio.run(bench(args, url, Path(tmp)))
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
