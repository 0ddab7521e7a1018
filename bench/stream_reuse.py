"""What reading a model stream to its end buys: CPU and time per streamed call, by connection.

Streamed OpenAI-shaped calls through `engine.effects.llm.complete` against the fake vendor
in a child process (so its CPU is not counted here), one mode after the other,
round after round:

- `drain`: the engine as it is: the body is read past `[DONE]` to its end and the
  connection goes back to the pool.
- `close`: the response is closed at `[DONE]` instead. aiohttp has often read the
  body's end already by then (it came with `[DONE]`), and such a connection is
  reused anyway; the others are closed.
- `new`: keep-alive off, a new connection for every call: what abandoning the stream
  at `[DONE]` cost with httpx, which never read the end it was not asked for.

The vendor counts the connections each mode's calls came over.

    .venv/bin/python bench/stream_reuse.py [--calls 1000] [--rounds 5] [--concurrency 1]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # engine, tests, bench

import argparse
import asyncio
import contextlib
import signal
import statistics
import time
from multiprocessing.connection import Connection
from unittest import mock

import aiohttp

from bench.step_overhead import ChildServer, _recv
from engine.effects.http_pool import new_session
from engine.effects.llm import LlmTarget, client, complete
from tests.fakes.llm_vendor import FakeVendor, Text

MODES = ("drain", "close", "new")
REQUEST = {"model": "m", "messages": [{"role": "user", "content": "Say ok."}]}
WARMUP = 20


def _vendor_child(conn: Connection) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us, also on Ctrl-C
    asyncio.run(_vendor_serve(conn))


async def _vendor_serve(conn: Connection) -> None:
    vendor = FakeVendor()
    vendor.default = Text("ok")
    await vendor.start()
    try:
        conn.send(vendor.url)
        while await asyncio.to_thread(_recv, conn) == "take":
            conn.send({"connections": vendor.connections, "calls": len(vendor.requests)})
            vendor.requests.clear()
    finally:
        await vendor.stop()


async def _close(response: aiohttp.ClientResponse) -> None:
    """In place of the engine's drain: the response closed at `[DONE]`."""
    response.close()


def _session(mode: str) -> aiohttp.ClientSession:
    if mode != "new":
        return new_session()
    connector = aiohttp.TCPConnector(force_close=True)
    return aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=None, connect=30.0)
    )


async def one_mode(url: str, mode: str, calls: int, concurrency: int) -> tuple[float, float]:
    """CPU and wall milliseconds per call."""
    target = LlmTarget("openai", url + "/v1", "key", "OPENAI_API_KEY")
    patch = mock.patch.object(client, "drain", _close)
    with patch if mode == "close" else contextlib.nullcontext():
        async with _session(mode) as http:

            async def some(n: int) -> None:
                for _ in range(n):
                    await complete(http, target, REQUEST, stream=True)

            await some(WARMUP)
            cpu, wall = time.process_time(), time.perf_counter()
            await asyncio.gather(*(some(calls // concurrency) for _ in range(concurrency)))
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    done = calls // concurrency * concurrency
    return cpu / done * 1000, wall / done * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1000, help="measured calls per mode")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the three modes")
    parser.add_argument("--concurrency", type=int, default=1, help="calls in flight at once")
    args = parser.parse_args()
    vendor = ChildServer(_vendor_child)
    figures: dict[str, list[tuple[float, float, float]]] = {mode: [] for mode in MODES}
    try:
        vendor.start()
        vendor.ready()
        for r in range(args.rounds):
            for mode in MODES:
                cpu, wall = asyncio.run(one_mode(vendor.url, mode, args.calls, args.concurrency))
                seen = vendor.take()
                figures[mode].append((cpu, wall, seen["connections"]))
                print(
                    f"round {r + 1} {mode:>5}: cpu {cpu:.3f} ms/call, wall {wall:.3f} ms/call, "
                    f"{seen['connections']} connections for {seen['calls']} calls"
                )
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        vendor.stop()
    print(f"median of {args.rounds} rounds, {args.concurrency} call(s) in flight:")
    for mode, rows in figures.items():
        cpu, wall, conns = (statistics.median(column) for column in zip(*rows, strict=True))
        print(
            f"  {mode:>5}: cpu {cpu:.3f} ms/call, wall {wall:.3f} ms/call, "
            f"{conns:.0f} connections per {args.calls + WARMUP} calls"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
