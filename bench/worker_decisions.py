"""Engine overhead per worker decision, against a worker and a vendor that answer at once.

A worker-decided agent runs through one in-process Engine on the embedded
redis-server (AOF on). The worker is a minimal aiohttp app in a child process:
it verifies nothing, echoes `proposed`, and reports how long it spent on each
request (from the handler's start to the end of its written answer). The fake
vendor runs in another child, as in bench/step_overhead.py, so neither one's CPU
is billed to the engine's loop.

Per decision the bench stamps, in this process only (patches made here, not in
the engine): the HTTP round trip of `DecisionRun.run`, the apply+commit of the
`DecisionAnswered` that reports it, and the moments the commits of its
`decision.dispatched` and `decision.completed` return. Then

    overhead = (round trip - worker's own time) + apply+commit of the answer

Loopback and the worker's HTTP server before and after its handler stay in
the overhead: they are the cost of delivering a decision, not of deciding it.
`commit to commit` is the whole span minus the worker's time; it adds what the
overhead leaves out, the wait for the loop before the request goes out and
before the answer is applied. `engine.stats.step_seconds` holds the same
apply+commit times, but neither keyed by input nor in order when several
partitions apply at once, so the answers' applies are timed around the call.

Each repeat has two phases. `--solo-sessions` sessions, one at a time, each
running `--solo-turns` turns back to back, give the overhead of a decision on an
idle engine (several short sessions rather than one long one, so the growing
conversation does not skew it). `--sessions` concurrent sessions give the
throughput, and the same overhead under load (where it is mostly waiting for
the loop). Every turn asks the worker three times (client.messages,
llm.finished, turn.finished), a session's first turn once more (session.start).

`--profile FILE` profiles the measured repeats, as `python -m cProfile` cannot
run this script (the children cannot be spawned).

    .venv/bin/python bench/worker_decisions.py [--sessions 50] [--turns 5] [--repeat 3]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # engine, tests, bench

import argparse
import asyncio
import contextlib
import cProfile
import json
import pstats
import signal
import statistics
import tempfile
import textwrap
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from multiprocessing.connection import Connection
from typing import Any
from unittest import mock

import aiohttp
from aiohttp import web

from bench.step_overhead import ChildServer, _recv, _vendor_child, one_turn, p99
from engine.client import Client
from engine.config import Project, parse_project
from engine.effects.worker import DecisionRun
from engine.machine import DecisionAnswered, Input
from engine.machine.inputs import WIRE_NAMES
from engine.runtime.engine import Engine
from engine.runtime.partitions import Partition
from engine.store.embedded import EmbeddedRedis
from engine.store.store import Commit, Store, WorkItem, connect
from tests.engine_helpers import ENV

AGENT = "helper"
SECRET_ENV = "HELPER_SECRET"
SECRET = "bench-signing-secret"
WARMUP_TURNS = 1


# --- the worker, timed, in its own process ----------------------------------------------


def _worker_child(conn: Connection) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us, also on Ctrl-C
    asyncio.run(_worker_serve(conn))


async def _worker_serve(conn: Connection) -> None:
    seconds: dict[str, float] = {}

    async def decide(request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        try:
            body = json.loads(await request.read())
        except ConnectionResetError:  # the engine stopped mid-request (Ctrl-C)
            return web.Response(status=400)
        response = web.Response(
            body=json.dumps(body["proposed"]).encode(), content_type="application/json"
        )
        await response.prepare(request)
        await response.write_eof()
        seconds[key(body["decision_id"], body["attempts"])] = time.perf_counter() - started
        return response

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/", decide)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        conn.send(f"http://127.0.0.1:{runner.addresses[0][1]}/")
        while await asyncio.to_thread(_recv, conn) == "take":
            taken = seconds.copy()
            seconds.clear()
            conn.send(taken)
    finally:
        await runner.cleanup()


# --- stamps taken inside the engine -----------------------------------------------------


def key(decision_id: str, attempt: int) -> str:
    return f"{decision_id}/{attempt}"


@dataclass
class Probe:
    """perf_counter readings per decision attempt, keyed by `key()`."""

    round_trip: dict[str, float] = field(default_factory=dict)
    apply: dict[str, float] = field(default_factory=dict)
    dispatched: dict[str, float] = field(default_factory=dict)
    completed: dict[str, float] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)
    expected: int = 0
    # A client sees the turn end at the commit, before the engine's apply returns.
    all_applied: asyncio.Event = field(default_factory=asyncio.Event)

    def clear(self, expected: int) -> None:
        for name in ("round_trip", "apply", "dispatched", "completed"):
            getattr(self, name).clear()
        self.failed.clear()
        self.expected = expected
        self.all_applied.clear()


@contextlib.contextmanager
def instrumented(engine: Engine, probe: Probe) -> Iterator[None]:
    """Time the engine's side of each decision; undone on exit."""
    run, apply, commit = DecisionRun.run, engine.work._settle, engine.store.commit

    async def timed_run(self: DecisionRun, http: aiohttp.ClientSession) -> Input:
        started = time.perf_counter()
        result = await run(self, http)
        probe.round_trip[key(self.decision_id, self.attempt)] = time.perf_counter() - started
        if not isinstance(result, DecisionAnswered):
            probe.failed.append(repr(result))
        return result

    async def timed_apply(part: Partition, item: WorkItem) -> None:
        if item.input.get("kind") != WIRE_NAMES[DecisionAnswered]:
            return await apply(part, item)
        started = time.perf_counter()
        await apply(part, item)
        probe.apply[key(item.input["decision_id"], item.input["attempt"])] = (
            time.perf_counter() - started
        )
        if len(probe.apply) >= probe.expected:
            probe.all_applied.set()

    async def timed_commit(p: int, lease: str, c: Commit, deltas: Sequence[Any] = ()) -> int:
        seq = await commit(p, lease, c, deltas)
        now = time.perf_counter()
        for encoded in c.events:
            payload = json.loads(encoded)["payload"]
            if payload["type"] == "decision.dispatched":
                probe.dispatched[key(payload["decision_id"], payload["attempt"])] = now
            elif payload["type"] == "decision.completed":
                probe.completed[key(payload["decision_id"], payload["attempt"])] = now
        return seq

    with (
        mock.patch.object(DecisionRun, "run", timed_run),
        mock.patch.object(engine.work, "_settle", timed_apply),
        mock.patch.object(engine.store, "commit", timed_commit),
    ):
        yield


# --- the workload -----------------------------------------------------------------------


def worker_project(tmp: Path, vendor_url: str, worker_url: str) -> Project:
    text = textwrap.dedent(
        f"""\
        [llm.openai]
        type = "openai"
        base_url = "{vendor_url}/v1"

        [agent.{AGENT}]
        llm = "openai"
        model = "gpt-4.1-mini"
        system = "You help."
        worker = "{worker_url}"
        signing_secret_env = "{SECRET_ENV}"
        """
    )
    path = tmp / "subs.toml"
    path.write_text(text)
    return parse_project(text, str(path), env={})


async def one_session(client: Client, label: str, turns: int) -> None:
    sid: str | None = None
    seen = 0
    for t in range(turns):
        sid, seen = await one_turn(client, sid, seen, f"{label} turn {t}", AGENT)


@dataclass
class Phase:
    overhead: list[float]  # per decision: round trip - worker + apply+commit
    round_trip: list[float]  # minus the worker's time
    worker: list[float]
    apply: list[float]
    span: list[float]  # commit of dispatched to commit of completed, minus the worker's time
    step_seconds: list[float]  # every step the engine committed
    turns: int
    wall: float
    cpu: float  # this process: the engine and the clients, not the worker or the vendor


async def run_phase(
    engine: Engine,
    client: Client,
    servers: tuple[ChildServer, ChildServer],
    probe: Probe,
    label: str,
    sessions: int,
    turns: int,
    *,
    one_at_a_time: bool = False,
) -> Phase:
    worker, vendor = servers
    worker.take()
    expected = sessions * (1 + 3 * turns)  # session.start; client.messages, llm + turn.finished
    probe.clear(expected)
    engine.stats.step_seconds.clear()
    started, cpu_started = time.perf_counter(), time.process_time()
    if one_at_a_time:
        for s in range(sessions):
            await one_session(client, f"{label} solo s{s}", turns)
    else:
        async with asyncio.TaskGroup() as group:
            for s in range(sessions):
                group.create_task(one_session(client, f"{label} s{s}", turns))
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    with contextlib.suppress(TimeoutError):  # a shortfall is reported below
        await asyncio.wait_for(probe.all_applied.wait(), 10)
    vendor.take()  # drops what the vendor recorded
    in_worker = worker.take()
    if probe.failed:
        raise RuntimeError(f"{len(probe.failed)} decision attempts failed: {probe.failed[0]}")
    decisions = sorted(probe.apply)
    if len(decisions) != expected or set(decisions) != set(in_worker):
        raise RuntimeError(
            f"{len(decisions)} answers applied, {len(in_worker)} seen by the worker, "
            f"{expected} expected"
        )
    rtt = [probe.round_trip[d] - in_worker[d] for d in decisions]
    return Phase(
        overhead=[r + probe.apply[d] for r, d in zip(rtt, decisions, strict=True)],
        round_trip=rtt,
        worker=[in_worker[d] for d in decisions],
        apply=[probe.apply[d] for d in decisions],
        span=[probe.completed[d] - probe.dispatched[d] - in_worker[d] for d in decisions],
        step_seconds=list(engine.stats.step_seconds),
        turns=sessions * turns,
        wall=wall,
        cpu=cpu,
    )


# --- figures ----------------------------------------------------------------------------


@dataclass
class Figures:
    overhead_median: float
    overhead_p99: float
    rtt_median: float
    rtt_p99: float
    worker_median: float
    apply_median: float
    apply_p99: float
    step_median: float
    span_median: float
    span_p99: float
    decisions: float
    decisions_per_s: float
    turns_per_s: float
    cpu_per_decision: float


def figures(phase: Phase) -> Figures:
    ms = 1000.0
    decisions = len(phase.overhead)
    return Figures(
        overhead_median=statistics.median(phase.overhead) * ms,
        overhead_p99=p99(phase.overhead) * ms,
        rtt_median=statistics.median(phase.round_trip) * ms,
        rtt_p99=p99(phase.round_trip) * ms,
        worker_median=statistics.median(phase.worker) * ms,
        apply_median=statistics.median(phase.apply) * ms,
        apply_p99=p99(phase.apply) * ms,
        step_median=statistics.median(phase.step_seconds) * ms,
        span_median=statistics.median(phase.span) * ms,
        span_p99=p99(phase.span) * ms,
        decisions=decisions,
        decisions_per_s=decisions / phase.wall,
        turns_per_s=phase.turns / phase.wall,
        cpu_per_decision=phase.cpu / decisions * ms,
    )


def report(solo: Figures, load: Figures, sessions: int) -> None:
    print(
        f"  decision round-trip overhead (engine side): median {solo.overhead_median:.3f} ms, "
        f"p99 {solo.overhead_p99:.3f} ms over {solo.decisions:.0f} decisions "
        "(one session at a time)"
    )
    print(
        f"    HTTP round trip minus worker: median {solo.rtt_median:.3f} ms, "
        f"p99 {solo.rtt_p99:.3f} ms (worker's own time: median {solo.worker_median:.3f} ms)"
    )
    print(
        f"    apply+commit of the answer: median {solo.apply_median:.3f} ms, "
        f"p99 {solo.apply_p99:.3f} ms (every step: median {solo.step_median:.3f} ms)"
    )
    print(
        f"    commit to commit minus worker: median {solo.span_median:.3f} ms, "
        f"p99 {solo.span_p99:.3f} ms"
    )
    print(
        f"  throughput: {load.decisions_per_s:.0f} decisions/s with {sessions} concurrent "
        f"sessions ({load.turns_per_s:.0f} turns/s, {load.decisions:.0f} decisions; "
        f"cpu of engine + clients {load.cpu_per_decision:.3f} ms per decision)"
    )
    print(
        f"    under that load: overhead median {load.overhead_median:.3f} ms, "
        f"p99 {load.overhead_p99:.3f} ms; commit to commit minus worker median "
        f"{load.span_median:.3f} ms, p99 {load.span_p99:.3f} ms"
    )


def median_figures(each: list[Figures]) -> Figures:
    names = [fl.name for fl in fields(Figures)]
    return Figures(*(statistics.median(getattr(f, name) for f in each) for name in names))


async def bench(
    args: argparse.Namespace, redis_url: str, servers: tuple[ChildServer, ChildServer], tmp: Path
) -> None:
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)  # as Ctrl-C
    worker, vendor = servers
    project = worker_project(tmp, vendor.url, worker.url)
    engine = Engine(project, connect(redis_url), env={**ENV, SECRET_ENV: SECRET})
    client_redis = connect(redis_url)  # the clients' own pool, as a separate process would have
    probe = Probe()
    solos: list[Figures] = []
    loads: list[Figures] = []
    try:
        await engine.start()
        await engine.leases.wait_owned(engine.store.partitions)
        engine.stats.record_steps = True
        client = Client(await Store.open(client_redis))
        with instrumented(engine, probe):
            await run_phase(engine, client, servers, probe, "warmup", args.sessions, WARMUP_TURNS)
            profile = cProfile.Profile() if args.profile else None
            if profile:
                profile.enable()
            for r in range(args.repeat):
                solo = await run_phase(
                    engine,
                    client,
                    servers,
                    probe,
                    f"r{r}",
                    args.solo_sessions,
                    args.solo_turns,
                    one_at_a_time=True,
                )
                load = await run_phase(
                    engine, client, servers, probe, f"r{r}", args.sessions, args.turns
                )
                solos.append(figures(solo))
                loads.append(figures(load))
                print(
                    f"repeat {r + 1}/{args.repeat} "
                    f"(solo {solo.wall:.2f} s, {args.sessions} sessions {load.wall:.2f} s):"
                )
                report(solos[-1], loads[-1], args.sessions)
            if profile:
                profile.disable()
                profile.dump_stats(args.profile)
                pstats.Stats(profile).sort_stats("cumulative").print_stats(25)
    finally:
        await engine.stop()
        await engine.redis.aclose()
        await client_redis.aclose()
    print(f"median of {len(solos)} repeats (a shared machine is noisy, compare medians):")
    report(median_figures(solos), median_figures(loads), args.sessions)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=50, help="concurrent sessions")
    parser.add_argument("--turns", type=int, default=5, help="sequential turns per session")
    parser.add_argument(
        "--solo-sessions", type=int, default=5, help="sessions run one at a time, for latency"
    )
    parser.add_argument("--solo-turns", type=int, default=8, help="turns per solo session")
    parser.add_argument("--repeat", type=int, default=3, help="measured runs")
    parser.add_argument(
        "--profile", metavar="FILE", help="cProfile the measured repeats into FILE (slows them)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="subs-bench-") as tmp:
        server = EmbeddedRedis(Path(tmp) / "redis")
        worker, vendor = ChildServer(_worker_child), ChildServer(_vendor_child)
        try:
            url = server.start()
            worker.start()
            vendor.start()
            worker.ready()
            vendor.ready()
            asyncio.run(bench(args, url, (worker, vendor), Path(tmp)))
        except (KeyboardInterrupt, asyncio.CancelledError):
            print("interrupted", file=sys.stderr)
            return 130
        finally:
            vendor.stop()
            worker.stop()
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
