"""Does the console's sessions list stay fast with thousands of sessions?

`--sessions` sessions (5000), one turn each, over two agents, every tenth turn failing
(the fake vendor answers 400), on an in-process Engine and the embedded redis-server.
Then the API (on a real port) answers the list the console asks for, `--repeat` times
(10) each: the first page of 50, a page deep in the list, a page filtered by agent
(half match), by `status=failed` (a tenth match) and by `status=running` (none match:
the filter reads its whole bounded scan of 1000 sessions), and the page's own files.

Printed: the median time of each request as the client sees it, with the rows it got.
The first page's time should not grow with `--sessions`.

    .venv/bin/python bench/console_list.py [--sessions 5000] [--repeat 10]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # engine, tests, bench

import argparse
import asyncio
import statistics
import tempfile
import time
from typing import Any

import httpx

from engine.api import ApiKeys, make_app
from engine.client import Client
from engine.runtime.engine import Engine
from engine.store.embedded import EmbeddedRedis
from engine.store.store import connect
from tests.api_helpers import serve
from tests.engine_helpers import ENV, make_project, poll_until
from tests.fakes.llm_vendor import FakeVendor, HttpError, Reply, Text

PAGE = 50
AGENTS = ("ops_openai", "ops_anthropic")


def model(body: dict[str, Any]) -> Reply:
    """A reply at once; a 400 (the turn fails) for the tenth of questions that ask it."""
    return HttpError(400) if "fail" in str(body["messages"][-1]["content"]) else Text("ok")


async def fill(client: Client, sessions: int) -> float:
    """Start one turn in each session, at most 64 at once; seconds until all have ended."""
    started = time.perf_counter()
    gate = asyncio.Semaphore(64)

    async def one(n: int) -> None:
        text = "please fail" if n % 10 == 0 else f"question {n}"
        message = {"role": "user", "content": text}
        inp = {"type": "client.message", "agent_id": AGENTS[n % 2], "message": message}
        async with gate:
            await client.submit(inp, session_id=f"ses-{n:06d}")

    await asyncio.gather(*(one(n) for n in range(sessions)))

    async def ended() -> bool:
        rows, _ = await client.session_rows(PAGE)
        return all(row["status"] in ("idle", "failed") for row in rows)

    await poll_until(ended, 120, "the newest sessions' turns to end")
    return time.perf_counter() - started


async def timed(http: httpx.AsyncClient, path: str, repeat: int) -> tuple[float, httpx.Response]:
    times = []
    answer = None
    for _ in range(repeat):
        started = time.perf_counter()
        answer = await http.get(path)
        times.append((time.perf_counter() - started) * 1000)
        assert answer.status_code == 200, answer.text
    assert answer is not None
    return statistics.median(times), answer


async def measure(http: httpx.AsyncClient, args: argparse.Namespace) -> None:
    deep = min(2000, max(args.sessions - PAGE, 0))
    cursor, walked = "", 0  # the cursor `deep` sessions in, walked to a page at a time
    while walked < deep:
        step = min(PAGE, deep - walked)
        page = (await http.get(f"/api/admin/sessions?limit={step}{cursor}")).json()
        walked += len(page["items"])
        cursor = f"&cursor={page['next_cursor']}"
    for what, query in (
        ("first page", f"limit={PAGE}"),
        (f"page at {deep}", f"limit={PAGE}{cursor}"),
        ("first_event_asc", f"limit={PAGE}&sort=first_event_asc"),
        ("wake_at_asc", f"limit={PAGE}&sort=wake_at_asc"),
        ("agent filter", f"limit={PAGE}&agent_id={AGENTS[0]}"),
        ("status=failed", f"limit={PAGE}&status=failed"),
        ("status=running", f"limit={PAGE}&status=running"),
    ):
        ms, answer = await timed(http, f"/api/admin/sessions?{query}", args.repeat)
        rows = len(answer.json()["items"])
        print(f"  {what:16s} {ms:8.1f} ms  {rows} rows  {len(answer.content)} bytes")
    for path in ("/console", "/console/static/timeline.js"):
        ms, answer = await timed(http, path, args.repeat)
        print(f"  {path:28s} {ms:6.2f} ms  {len(answer.content)} bytes")


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedRedis(Path(tmp) / "redis")
        url = server.start()
        redis = connect(url)
        try:
            async with FakeVendor() as vendor:
                vendor.responder = model
                project = make_project(Path(tmp), vendor.url)
                engine = Engine(project, redis, env=ENV, lease_ms=5000)
                await engine.start()
                try:
                    client = Client(engine.store)
                    took = await fill(client, args.sessions)
                    print(f"console list: {args.sessions} sessions made in {took:.1f} s; "
                          f"median of {args.repeat} requests each")  # fmt: skip
                    app = make_app(client, engine.store, keys=ApiKeys())
                    async with serve(app) as base, httpx.AsyncClient(base_url=base) as http:
                        await measure(http, args)
                finally:
                    await engine.stop()
        finally:
            await redis.aclose()
            server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=10)
    asyncio.run(main(parser.parse_args()))
