"""Turns per second through `subs serve` processes on one redis-server vs a Redis Cluster.

Starts K `subs serve` processes (default 3) on either the embedded redis-server (one
process, unix socket, AOF fsync always) or a Redis Cluster of 3 masters + 3 replicas
of the same binary on loopback TCP (AOF fsync always on each node), a fake model
vendor that answers at once in a child process, and then S sessions (default 30)
each run T turns (default 10) back to back over the serves' HTTP APIs (session i on
serve i mod K). Prints turns/s over the measured run, after a warm-up turn per
session. With `--wait-replicas N` every commit also waits for N replicas (`[store]
wait_replicas`, WAIT N on the commit's connection): the price of not losing the last
acknowledged steps when a master fails over.

Everything runs on this machine: a cluster's masters share its cores with the serves
and the vendor, so the figure says what the cluster costs here, not how it scales
across machines.

    .venv/bin/python bench/cluster.py [--redis single|cluster] [--serves 3]
        [--sessions 30] [--turns 10] [--wait-replicas 0] [--partitions 16] [--repeat 3]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # engine, tests, bench

import argparse
import asyncio
import functools
import json
import shutil
import statistics
import tempfile
import time

import aiohttp

from bench.chaos import AGENTS, Serve, _vendor_child, _worker_child, project_toml
from bench.step_overhead import ChildServer
from engine.cli.remote import HttpClient
from engine.store.embedded import EmbeddedRedis
from engine.store.store import RedisClient, Store, connect
from tests.redis_cluster import LocalCluster

TURN_ENDS = ("turn.completed", "turn.failed")


async def turn(
    http: aiohttp.ClientSession, redis: RedisClient, store: Store, api: str, sid: str, n: int
) -> None:
    """One turn submitted over HTTP, waited for in the session's log; fails if it failed."""
    message = {"role": "user", "content": f"turn {n}"}
    payload = {"type": "client.message", "agent_id": AGENTS[0], "message": message}
    reply = await HttpClient(api, http=http).submit(payload, session_id=sid)
    key, cursor = store.log_key(sid), "0-0"
    while True:
        got = await redis.xread({key: cursor}, block=10_000)
        if not got:
            raise RuntimeError(f"turn {reply['turn_id']} of {sid} did not end within 10 s")
        for _, entries in got:
            for entry_id, fields in entries:
                cursor = entry_id
                event = json.loads(fields[b"e"])
                kind = event["payload"]["type"]
                if event.get("turn_id") == reply["turn_id"] and kind in TURN_ENDS:
                    if kind != "turn.completed":
                        raise RuntimeError(f"{sid}: {event['payload']}")
                    return


async def measure(
    args: argparse.Namespace, url: str, vendor: str, worker: str, tmp: Path
) -> list[float]:
    config = tmp / "subs.toml"
    store_block = (
        f"\n[store]\nwait_replicas = {args.wait_replicas}\npartitions = {args.partitions}\n"
    )
    config.write_text(project_toml(vendor, worker) + store_block)
    logs = tmp / "logs"
    logs.mkdir()
    serves = [Serve(i, config, url, logs, 5000) for i in range(args.serves)]
    redis = connect(url)
    http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=400))
    rates = []
    try:
        await asyncio.gather(*(s.start() for s in serves))
        store = await Store.open(redis)
        for r in range(args.repeat + 1):  # the first is a warm-up
            sids = [f"bench-{r}-{i}" for i in range(args.sessions)]

            async def session(i: int, sid: str, turns: int) -> None:
                for n in range(turns):
                    await turn(http, redis, store, serves[i % len(serves)].api, sid, n)

            started = time.perf_counter()
            turns = args.turns if r else 1
            await asyncio.gather(*(session(i, sid, turns) for i, sid in enumerate(sids)))
            if r:
                rates.append(args.sessions * args.turns / (time.perf_counter() - started))
    finally:
        for s in serves:
            await s.stop()
        await http.close()
        await redis.aclose()
    return rates


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis", choices=("single", "cluster"), default="single")
    parser.add_argument("--serves", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=30)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--wait-replicas", type=int, default=0)
    parser.add_argument("--partitions", type=int, default=16, help="[store] partitions")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="subs-cluster-bench-"))
    server: EmbeddedRedis | LocalCluster
    server = LocalCluster(tmp / "cluster") if args.redis == "cluster" else EmbeddedRedis(tmp / "r")
    vendor = ChildServer(functools.partial(_vendor_child, 0.0))
    worker = ChildServer(_worker_child)
    try:
        server.start()
        vendor.start()
        worker.start()
        vendor.ready()
        worker.ready()
        rates = asyncio.run(measure(args, server.url, vendor.url, worker.url, tmp))
    finally:
        vendor.stop()
        worker.stop()
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"{args.redis}: {args.serves} serves, {args.sessions} sessions x {args.turns} turns, "
        f"{args.partitions} partitions, wait_replicas {args.wait_replicas}: "
        f"median {statistics.median(rates):.0f} turns/s "
        f"(runs: {', '.join(f'{r:.0f}' for r in rates)})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
