"""What a session costs Redis, and what the retention sweep gives back (issue 27).

One on-call session runs `--turns` turns (3) of the example on-call turn (a user message
that makes the fake model call the `lookup` client tool, the bench's answer, the model's
`--words`-word reply) on an in-process Engine and its own embedded redis-server, its clock
set 40 days back. Printed: the Redis bytes of that session by kind of key (`MEMORY USAGE`
of its log, snapshot and token deltas, and its index entry), per session and per turn.

Then `--sessions` (2000) copies of that session are put in Redis (its log restored under
new ids, as `subs sessions import` does, and its token deltas copied), and the sweep runs
once with archives on: printed are the sweep's rate (sessions/s, archives written and
fsynced included), the archive's size per session on disk, and Redis's `used_memory`
empty (the store opened), full, and after the sweep.

Last, `--load-turns` (40) on-call turns over 4 fresh sessions at once, without and then
with a sweep of as many idle copies running: turns/s of each (one run each).

`--scale N` (the issue's 100,000 sessions x 3 turns) does instead: the on-call session run
through the engine as above, then `--live` (1000) copies of it stamped now (not idle) and N
idle copies written straight into Redis in bulk (the restore script, pipelined 250 at a
time: running 300,000 turns through the engine would take hours on 2 cores), token deltas
copied unless `--no-deltas`; then the sweep, archives on, until a pass removes nothing.
Printed: `used_memory` empty, with the live sessions, full and after the sweep, and whether
after is within 10 % of (empty + live), the issue's bound.

`--rss N` (the issue's 50,000) does instead: N copies of the on-call session written in bulk
(stamped now), then a `subs serve` process with `[serve] state_cache_mb = --cache-mb` (32)
touches each once (`POST …/cancel`, which the engine answers `409 no_turn_running` after
loading the session's state into its cache), `--touchers` (32) at a time. Printed: the
serve's RSS (VmRSS) right after start, every 5,000 sessions, at its peak and at the end,
and the peak less `state_cache_mb`: the constant a serve costs beside its cache.

    .venv/bin/python bench/retention.py [--sessions 2000] [--turns 3] [--words 40]
        [--load-turns 40] [--scale 100000 [--live 1000] [--no-deltas]]
        [--rss 50000 [--cache-mb 32] [--touchers 32]]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # engine, tests, bench

import argparse
import asyncio
import contextlib
import tempfile
import time
from typing import Any

from bench.history import one_turn, project_of
from bench.vs_langgraph import TurnVendor, user_text
from engine.client import Client
from engine.jsonedge import encode
from engine.runtime.engine import Engine
from engine.store.embedded import EmbeddedRedis
from engine.store.store import Store, connect
from tests.engine_helpers import ENV

DAYS_BACK = 40 * 86_400


class Clock:
    def __init__(self) -> None:
        self.shift = -DAYS_BACK

    def __call__(self) -> float:
        return time.time() + self.shift


async def used(store: Store) -> int:
    return (await store.memory())[0]


async def key_bytes(store: Store, sid: str) -> dict[str, int]:
    redis = store.redis
    sizes = {
        "log": await redis.memory_usage(store.log_key(sid)) or 0,
        "snapshot": await redis.memory_usage(store.snap_key(sid)) or 0,
        "deltas": await redis.memory_usage(store.delta_key(sid)) or 0,
    }
    return sizes


async def clone(store: Store, events: list[dict[str, Any]], deltas: bytes | None, n: int) -> None:
    """`n` copies of the session under new ids: its log restored (snapshot refolded by
    the restore script's caller: here the stored state, its id rewritten), deltas copied."""
    from engine.machine import fold, state_to_json

    base = fold(events)
    assert base is not None
    state = state_to_json(base)
    for i in range(n):
        sid = f"ses_copy{i:07d}"
        copied = [{**e, "session_id": sid} for e in events]
        snapshot = encode({**state, "session_id": sid})
        await store.restore_session(sid, [encode(e) for e in copied], snapshot, base.created_at)
        if deltas is not None:
            await store.redis.restore(store.delta_key(sid), 0, deltas, replace=True)


async def main(args: argparse.Namespace) -> None:
    with (
        tempfile.TemporaryDirectory() as tmp_name,
        EmbeddedRedis(Path(tmp_name) / "redis") as server,
    ):
        tmp = Path(tmp_name)
        vendor = TurnVendor(args.words)
        await vendor.start()
        redis = connect(server.url)
        stopped = False
        clock = Clock()
        engine = Engine(project_of(tmp, vendor.url), redis, env=ENV, lease_ms=5000, clock=clock)
        try:
            await engine.start()
            store = engine.store
            empty = await used(store)
            client = Client(store)
            sid = "ses_oncall"
            async with contextlib.aclosing(client.follow(sid, 0, delta_cursor="0-0")) as events:
                for t in range(args.turns):
                    await one_turn(client, sid, events, user_text(f"{sid} t{t}"))
            clock.shift = 0
            sizes = await key_bytes(store, sid)
            index = await _index_bytes(store, sid)
            total = sum(sizes.values()) + index
            print(f"retention: one on-call session, {args.turns} turns ({args.words}-word answers)")
            for kind, size in (*sizes.items(), ("index entry", index)):
                print(f"  {kind:<12} {size:8d} bytes  {size / args.turns:9.0f} per turn")
            print(f"  {'total':<12} {total:8d} bytes  {total / args.turns:9.0f} per turn")

            log = await store.read_log(sid)
            deltas = await redis.dump(store.delta_key(sid))
            if args.scale:
                await at_scale(engine, store, log, None if args.no_deltas else deltas, args)
                return
            if args.rss:
                await engine.stop()
                stopped = True
                await serve_rss(server.url, tmp, store, log, args)
                return
            started = time.perf_counter()
            await clone(store, log, deltas, args.sessions)
            made = time.perf_counter() - started
            full = await used(store)
            sweeper = engine.sweeper
            assert sweeper is not None
            started = time.perf_counter()
            report = await sweeper.sweep_once()
            seconds = time.perf_counter() - started
            assert report is not None
            if report.archived != args.sessions + 1:
                raise RuntimeError(f"swept {report.archived} of {args.sessions + 1} sessions")
            after = await used(store)
            on_disk = sum(p.stat().st_size for p in report.files)
            print(f"sweep: {args.sessions + 1} idle sessions (copies made in {made:.1f} s)")
            rate = report.archived / seconds
            print(f"  rate: {rate:.0f} sessions/s ({seconds:.2f} s, archives fsynced)")
            print(f"  archive on disk: {on_disk / report.archived:.0f} bytes per session (gzip)")
            back = (full - after) / (full - empty) * 100
            print(
                f"  Redis used_memory: empty {empty / 1e6:.2f} MB, full {full / 1e6:.2f} MB, "
                f"after the sweep {after / 1e6:.2f} MB ({(after - empty) / 1e6:+.2f} MB over "
                f"empty: {back:.1f}% of what the sessions took is back)"
            )
            if args.load_turns:
                await sweep_under_load(engine, client, store, log, deltas, args)
        finally:
            if not stopped:
                await engine.stop()
            await redis.aclose()
            await vendor.stop()


BULK = 250  # copies a pipeline writes


async def bulk_clone(
    store: Store,
    events: list[dict[str, Any]],
    deltas: bytes | None,
    ids: list[str],
    now_ms: int | None = None,
) -> None:
    """Copies of the session under `ids`, written by the restore script `BULK` at a time;
    with `now_ms`, every event and the index entry are stamped then (a live session)."""
    from datetime import UTC, datetime

    from engine.machine import fold, state_to_json

    stamp = None
    if now_ms is not None:
        stamp = datetime.fromtimestamp(now_ms / 1000, UTC).isoformat()
        events = [{**e, "occurred_at": stamp} for e in events]
    base = fold(events)
    assert base is not None
    state = state_to_json(base)
    created = now_ms if now_ms is not None else base.created_at
    for at in range(0, len(ids), BULK):
        async with store.redis.pipeline(transaction=False) as pipe:
            for sid in ids[at : at + BULK]:
                keys = [
                    store.snap_key(sid),
                    store.log_key(sid),
                    store.sessions_key(store.partition_of(sid)),
                    store.files_key(sid),
                ]
                argv: list[Any] = [sid, len(events), encode({**state, "session_id": sid})]
                argv += [created, 0]
                for n, event in enumerate(events, 1):
                    argv += [f"{n}-0", encode({**event, "session_id": sid})]
                await store._restore(keys=keys, args=argv, client=pipe)
                if deltas is not None:
                    pipe.restore(store.delta_key(sid), 0, deltas, replace=True)
            await pipe.execute()


async def at_scale(
    engine: Engine,
    store: Store,
    log: list[dict[str, Any]],
    deltas: bytes | None,
    args: argparse.Namespace,
) -> None:
    """The issue's figure: `--scale` idle sessions and `--live` live ones; the sweep gives
    back all but the live ones' memory (within 10 %)."""
    await store.redis.delete(store.log_key("ses_oncall"), store.snap_key("ses_oncall"))
    await store.redis.delete(store.delta_key("ses_oncall"))
    await store.redis.zrem(store.sessions_key(store.partition_of("ses_oncall")), "ses_oncall")
    empty = await used(store)
    now_ms = int(time.time() * 1000)
    await bulk_clone(store, log, deltas, [f"ses_live{i:07d}" for i in range(args.live)], now_ms)
    live = await used(store)
    started = time.perf_counter()
    await bulk_clone(store, log, deltas, [f"ses_idle{i:07d}" for i in range(args.scale)])
    made = time.perf_counter() - started
    full = await used(store)
    print(
        f"scale: {args.scale} idle sessions x {args.turns} turns written in bulk in {made:.0f} s "
        f"({'with' if deltas is not None else 'without'} token deltas), {args.live} live"
    )
    sweeper = engine.sweeper
    assert sweeper is not None
    started = time.perf_counter()
    archived = on_disk = 0
    while True:
        report = await sweeper.sweep_once()
        assert report is not None
        archived += report.archived
        on_disk += sum(p.stat().st_size for p in report.files)
        for path in report.files:
            path.unlink()  # the disk is shared: the size is counted, the file goes
        if not report.archived:
            break
    seconds = time.perf_counter() - started
    after = await used(store)
    # The bound: within 10 % of an empty store plus the live sessions (`live` is
    # the store's memory with them in it). Not 10 % of the live sessions' own bytes alone:
    # for a tiny run's 5 sessions that margin (~5 KB) is below what Redis's bookkeeping moves.
    bound = live * 1.1
    print(
        f"  sweep: {archived} archived in {seconds:.0f} s ({archived / seconds:.0f} sessions/s), "
        f"{on_disk / max(archived, 1):.0f} archive bytes a session"
    )
    print(
        f"  Redis used_memory: empty {empty / 1e6:.1f} MB, with {args.live} live "
        f"{live / 1e6:.1f} MB, full {full / 1e6:.1f} MB, after the sweep {after / 1e6:.1f} MB "
        f"({'within' if after <= bound else 'NOT within'} 10 % of empty + live: "
        f"at most {bound / 1e6:.1f} MB)"
    )
    if archived != args.scale:
        raise RuntimeError(f"swept {archived} of {args.scale} idle sessions")


def rss_mb(pid: int) -> float:
    """A process's resident set (VmRSS), MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


async def serve_rss(
    redis_url: str, tmp: Path, store: Store, log: list[dict[str, Any]], args: argparse.Namespace
) -> None:
    """The issue's figure: a serve's RSS over `--rss` sessions touched stays under
    `state_cache_mb` plus a constant, measured here."""
    import httpx

    from tests.engine_helpers import EngineProcess

    sids = [f"ses_rss{i:07d}" for i in range(args.rss)]
    started = time.perf_counter()
    await bulk_clone(store, log, None, sids, int(time.time() * 1000))
    print(
        f"rss: {args.rss} sessions x {args.turns} turns written in bulk in "
        f"{time.perf_counter() - started:.0f} s"
    )
    config = tmp / "subs.toml"
    config.write_text(config.read_text() + f"\n[serve]\nstate_cache_mb = {args.cache_mb}\n")
    proc = await EngineProcess(config, redis_url).start()
    assert proc.proc is not None
    pid = proc.proc.pid
    try:
        first = peak = rss_mb(pid)
        print(f"  serve (state_cache_mb = {args.cache_mb}): RSS {first:.0f} MB after start")
        queue = iter(sids)
        done = 0
        async with httpx.AsyncClient(base_url=proc.api, timeout=60) as http:

            async def toucher() -> None:
                nonlocal done, peak
                for sid in queue:
                    got = await http.post(
                        f"/api/client/sessions/{sid}/cancel",
                        content=b"{}",
                        headers={"Content-Type": "application/json"},
                    )
                    if got.status_code != 409:
                        raise RuntimeError(f"cancel {sid}: {got.status_code} {got.text}")
                    done += 1
                    if done % 500 == 0:
                        peak = max(peak, rss_mb(pid))
                    if done % 5000 == 0:
                        print(f"  {done:6d} sessions touched: RSS {rss_mb(pid):.0f} MB")

            began = time.perf_counter()
            await asyncio.gather(*(toucher() for _ in range(args.touchers)))
            seconds = time.perf_counter() - began
        end = rss_mb(pid)
        peak = max(peak, end)
        print(
            f"  {done} touched in {seconds:.0f} s ({done / seconds:.0f}/s): "
            f"RSS peak {peak:.0f} MB, "
            f"end {end:.0f} MB; peak - state_cache_mb = {peak - args.cache_mb:.0f} MB "
            f"(the constant; {first:.0f} MB at start)"
        )
    finally:
        await proc.stop()


LOAD_SESSIONS = 4


async def load(client: Client, turns: int, tag: str) -> float:
    """`turns` on-call turns over LOAD_SESSIONS fresh sessions at once; turns/s."""

    async def session(n: int) -> None:
        sid = f"ses_load_{tag}_{n}"
        async with contextlib.aclosing(client.follow(sid, 0, delta_cursor="0-0")) as events:
            for t in range(turns // LOAD_SESSIONS):
                await one_turn(client, sid, events, user_text(f"{sid} t{t}"))

    started = time.perf_counter()
    await asyncio.gather(*(session(n) for n in range(LOAD_SESSIONS)))
    return (turns // LOAD_SESSIONS * LOAD_SESSIONS) / (time.perf_counter() - started)


async def sweep_under_load(
    engine: Engine,
    client: Client,
    store: Store,
    log: list[dict[str, Any]],
    deltas: bytes | None,
    args: argparse.Namespace,
) -> None:
    """The same load of turns without, then with, a sweep of `--sessions` idle copies
    running (one run each, in that order)."""
    alone = await load(client, args.load_turns, "alone")
    await clone(store, log, deltas, args.sessions)
    sweeper = engine.sweeper
    assert sweeper is not None
    sweeping = asyncio.create_task(sweeper.sweep_once())
    during = await load(client, args.load_turns, "during")
    swept = await sweeping
    assert swept is not None
    print(
        f"load: {args.load_turns} on-call turns over {LOAD_SESSIONS} sessions at once: "
        f"{alone:.1f} turns/s alone, {during:.1f} turns/s while the sweep ran "
        f"({swept.archived} sessions swept)"
    )


async def _index_bytes(store: Store, sid: str) -> int:
    """What the session's entry adds to its partition's index (a sorted set): the set's
    size with and without it."""
    key = store.sessions_key(store.partition_of(sid))
    with_it = await store.redis.memory_usage(key) or 0
    score = await store.redis.zscore(key, sid)
    await store.redis.zrem(key, sid)
    without = await store.redis.memory_usage(key) or 0
    await store.redis.zadd(key, {sid: score or 0})
    return max(with_it - without, 0) if without else with_it


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=2000)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--words", type=int, default=40)
    parser.add_argument("--load-turns", type=int, default=40, help="0: no load figure")
    parser.add_argument("--scale", type=int, default=0, help="idle sessions written in bulk")
    parser.add_argument("--live", type=int, default=1000, help="live sessions, with --scale")
    parser.add_argument("--no-deltas", action="store_true", help="--scale copies no deltas")
    parser.add_argument("--rss", type=int, default=0, help="sessions a serve touches")
    parser.add_argument("--cache-mb", type=int, default=32, help="with --rss")
    parser.add_argument("--touchers", type=int, default=32, help="with --rss")
    asyncio.run(main(parser.parse_args()))
