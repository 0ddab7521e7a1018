"""Engine overhead per committed step, against a fake vendor that answers at once.

Runs N concurrent sessions x T sequential turns through one in-process Engine on
the embedded redis-server (AOF on), and prints the engine's own apply+commit time
per step, end-to-end turn time minus the time spent inside the fake vendor per
step, and throughput. Target: under 1 ms median per step.

It also counts Redis traffic per committed step, two ways. Round trips this process
made, by connection pool (the engine's, the clients') and command, counted in
redis-py's send path (a pipeline is one round trip, named by its commands); target
for the engine: 1 commit (`evalsha`) + at most 1 read per step. And what Redis ran,
from `INFO commandstats` deltas around the run: there the commands a script runs
(the commit's XADDs, HSET, XACK...) count again under their own names.

With many sessions the loop is saturated, so the two per-step times measure
waiting for the loop as much as work; CPU time per step says what a step costs.
The engine runs on an event loop of its own in its own thread, so that thread's
CPU time is the engine side alone (target: 0.5 ms per step); the clients run in
the main thread, and this process's CPU time covers both.

The fake vendor runs in a child process, so its CPU time is neither billed to the
engine nor hidden in the vendor time subtracted from a turn. For the same reason
`python -m cProfile` cannot run this script (the child cannot be spawned from
it): `--profile FILE` profiles the measured repeats instead (the engine's thread).

`--new-connections` turns keep-alive off in the engine's HTTP session (patched here,
not in the engine): a new connection per model call, as when streams were abandoned at
`[DONE]` with httpx, against reading each to its end and reusing its connection.

    .venv/bin/python bench/step_overhead.py [--sessions 20] [--turns 10] [--repeat 3]
        [--fsync always|everysec] [--no-stream] [--new-connections] [--trace]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # engine, tests.fakes

import argparse
import asyncio
import contextlib
import cProfile
import json
import math
import multiprocessing
import pstats
import resource
import signal
import statistics
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, fields, replace
from multiprocessing.connection import Connection
from typing import Any
from unittest import mock

import aiohttp
import redis.asyncio as aioredis
from aiohttp import web
from redis.asyncio.client import Pipeline
from redis.asyncio.connection import AbstractConnection

from engine.client import Client
from engine.config import DEFAULT_FSYNC, AgentDecl, Project, TelemetryConfig
from engine.machine.policies import BudgetPolicy
from engine.runtime.engine import Engine, new_event_loop
from engine.store.embedded import EmbeddedRedis
from engine.store.store import Store, connect
from tests.engine_helpers import ENV, make_project
from tests.fakes.llm_vendor import FakeVendor, Text
from tests.otlp_receiver import otlp_receiver

AGENT = "ops_openai"
WARMUP_TURNS = 2
ENGINE_POOL, CLIENTS_POOL = "bench-engine", "bench-clients"  # CLIENT SETNAME of each pool


# --- the fake vendor, timed, in its own process ---------------------------------------


class TimedVendor(FakeVendor):
    """Adds up the time each request spends in the fake, keyed by its last user message."""

    def __init__(self) -> None:
        super().__init__()
        self.default = Text("ok")
        self.seconds: dict[str, float] = {}

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        response = await super()._handle(request)
        spent = time.perf_counter() - started
        body = json.loads(await request.read())  # aiohttp keeps the body: no second read
        tag = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
        self.seconds[tag] = self.seconds.get(tag, 0.0) + spent
        return response

    def take(self) -> dict[str, float]:
        taken, self.seconds = self.seconds, {}
        self.requests.clear()
        return taken


def _vendor_child(conn: Connection) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us, also on Ctrl-C
    asyncio.run(_vendor_serve(conn))


def _recv(conn: Connection) -> str:
    try:
        return conn.recv()
    except EOFError:  # the parent is gone
        return "stop"


async def _vendor_serve(conn: Connection) -> None:
    vendor = TimedVendor()
    await vendor.start()
    try:
        conn.send(vendor.url)
        while await asyncio.to_thread(_recv, conn) == "take":
            conn.send(vendor.take())
    finally:
        await vendor.stop()


class ChildServer:
    """A server in a spawned child: sends its URL, then answers `take` until `stop`."""

    def __init__(self, target: Callable[[Connection], None]) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=target, args=(child,), daemon=True)
        self.url = ""

    def start(self) -> None:
        """Spawn the child; `ready()` waits for its URL, so several children boot at once."""
        self._proc.start()

    def ready(self) -> None:
        self.url = self._ask(None)

    def take(self) -> dict[str, float]:
        """Seconds spent per request key since the last take."""
        return self._ask("take")

    def stop(self) -> None:
        if self._proc.pid is None:
            return
        with contextlib.suppress(OSError):
            self._conn.send("stop")
        self._proc.join(5)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join()

    def _ask(self, command: str | None) -> Any:
        if command is not None:
            self._conn.send(command)
        if not self._conn.poll(30):
            raise RuntimeError("a child server process did not answer")
        return self._conn.recv()


# --- the workload -----------------------------------------------------------------------


class _UnstreamedAgent(AgentDecl):
    """Asks for whole-body answers. `stream` is not an AgentConfig field of the protocol;
    the request builder honours it, which is all a benchmark switch needs."""

    def wire_config(self, project: Project) -> dict | None:
        config = super().wire_config(project)
        return None if config is None else {**config, "stream": False}


@dataclass
class Run:
    steps: int
    step_seconds: list[float]
    turn_seconds: list[float]  # wall minus vendor, per turn
    vendor_seconds: list[float]  # per turn
    turns: int
    wall: float
    cpu: float  # this process: the engine and the clients, not the vendor
    engine_cpu: float  # the engine's thread alone
    engine_kernel: float  # the part of it spent in the kernel (its sockets' system calls)
    commands: Counter[str]  # what Redis ran (INFO commandstats), by command
    trips: dict[str, Counter[str]]  # round trips from this process, by pool and command

    @property
    def steps_per_turn(self) -> float:
        return self.steps / self.turns


async def one_turn(
    client: Client, sid: str | None, seen: int, text: str, agent: str = AGENT
) -> tuple[str, int]:
    """Submit one message and follow the session until that turn ends.

    Returns the session id and the last seq seen, to continue from.
    """
    message = {"role": "user", "content": text}
    reply = await client.submit(
        {"type": "client.message", "agent_id": agent, "message": message}, session_id=sid
    )
    sid, turn_id = reply["session_id"], reply["turn_id"]
    async with contextlib.aclosing(client.follow(sid, seen)) as events:
        async for kind, event in events:
            if kind != "event":
                continue
            seen = event["seq"]
            end = event["payload"]["type"]
            if event.get("turn_id") == turn_id and end in ("turn.completed", "turn.failed"):
                if end == "turn.failed":
                    raise RuntimeError(f"turn failed: {event['payload'].get('error')}")
                break
    return sid, seen


async def one_session(client: Client, label: str, turns: int, out: list[tuple[str, float]]) -> None:
    sid: str | None = None
    seen = 0
    for t in range(turns):
        tag = f"{label} turn {t}"  # unique: lets the vendor's time be matched to this turn
        started = time.perf_counter()
        sid, seen = await one_turn(client, sid, seen, tag)
        out.append((tag, time.perf_counter() - started))


class EngineThread:
    """The engine on an event loop of its own, in its own thread: the thread's CPU time is
    the engine's alone (the clients run in the main thread, the vendor in a child)."""

    def __init__(self, engine: Callable[[], Engine]) -> None:
        self._make = engine
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="engine", daemon=True)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.engine: Engine | None = None
        self.failure: BaseException | None = None

    def _main(self) -> None:
        self.loop = new_event_loop()  # as `subs serve` runs it
        try:
            self.engine = self._make()
            self.loop.run_until_complete(self.engine.start())
        except BaseException as err:
            self.failure = err
            self._ready.set()
            return
        self._ready.set()
        self.loop.run_forever()
        self.loop.close()

    async def start(self) -> Engine:
        self._thread.start()
        await asyncio.to_thread(self._ready.wait)
        if self.failure is not None:
            raise self.failure
        assert self.engine is not None
        return self.engine

    async def run(self, coro: Awaitable[Any]) -> Any:
        """`coro` on the engine's loop; its result here."""
        assert self.loop is not None
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    async def cpu(self) -> tuple[float, float]:
        """The engine thread's CPU seconds so far: all of it, and the kernel's part."""

        async def thread_time() -> tuple[float, float]:
            return time.thread_time(), resource.getrusage(resource.RUSAGE_THREAD).ru_stime

        return tuple(await self.run(thread_time()))  # type: ignore[return-value]

    async def stop(self) -> None:
        if self.loop is None or self.engine is None:
            return
        engine = self.engine

        async def stop() -> None:
            await engine.stop()
            await engine.redis.aclose()

        await self.run(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        await asyncio.to_thread(self._thread.join, 10)


async def _in_thread(call: Callable[[], Any]) -> None:
    call()


async def run_once(
    engine: EngineThread, client: Client, vendor: ChildServer, label: str, sessions: int, turns: int
) -> Run:
    vendor.take()
    stats = engine.engine.stats if engine.engine else None
    assert stats is not None
    steps_before = stats.steps
    stats.step_seconds.clear()
    walls: list[tuple[str, float]] = []
    ran_before = await commands_run(client.store.redis)
    with counting_round_trips() as trips:
        started, cpu_started = time.perf_counter(), time.process_time()
        engine_cpu_started, engine_kernel_started = await engine.cpu()
        async with asyncio.TaskGroup() as group:
            for s in range(sessions):
                group.create_task(one_session(client, f"{label} s{s}", turns, walls))
        engine_cpu, engine_kernel = await engine.cpu()
        engine_cpu -= engine_cpu_started
        engine_kernel -= engine_kernel_started
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    ran = await commands_run(client.store.redis)
    ran.subtract(ran_before)
    del ran["info"]  # ours, around the run
    steps = stats.steps - steps_before
    in_vendor = vendor.take()
    missing = [tag for tag, _ in walls if tag not in in_vendor]
    if missing:
        raise RuntimeError(f"the vendor saw no request for {missing[:3]}")
    steps_per_turn = steps / len(walls)
    return Run(
        steps=steps,
        step_seconds=list(stats.step_seconds),
        turn_seconds=[(w - in_vendor[tag]) / steps_per_turn for tag, w in walls],
        vendor_seconds=[in_vendor[tag] for tag, _ in walls],
        turns=len(walls),
        wall=wall,
        cpu=cpu,
        engine_cpu=engine_cpu,
        engine_kernel=engine_kernel,
        commands=+ran,
        trips=dict(trips),
    )


# --- Redis traffic ----------------------------------------------------------------------


async def commands_run(redis: aioredis.Redis) -> Counter[str]:
    """Calls per command since the server started (INFO commandstats)."""
    info = await redis.info("commandstats")
    return Counter({name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in info.items()})


@contextlib.contextmanager
def counting_round_trips() -> Iterator[defaultdict[str, Counter[str]]]:
    """Counts the round trips to Redis of this process by pool name and command, while open.

    A command goes out through `send_command` (also the blocking reads and a pipeline's
    SCRIPT EXISTS), a pipeline or transaction in one write of all its commands, a
    commit and a batch of token deltas through the store's own packed sends.
    """
    counts: defaultdict[str, Counter[str]] = defaultdict(Counter)
    send = AbstractConnection.send_command
    batches = Pipeline._execute_pipeline, Pipeline._execute_transaction

    ask = Store._ask

    async def counted_ask(conn: AbstractConnection, commands: list[list[Any]]) -> list[Any]:
        names = "+".join(sorted({bytes(c[0]).decode().lower() for c in commands}))
        counts[conn.client_name or "other"][
            names if len(commands) == 1 else f"packed[{names}]"
        ] += 1
        return await ask(conn, commands)

    async def counted_send(self: AbstractConnection, *args: Any, **kwargs: Any) -> None:
        counts[self.client_name or "other"][str(args[0]).lower()] += 1
        await send(self, *args, **kwargs)

    def counted(execute: Callable[..., Any]) -> Callable[..., Any]:
        async def run(self: Pipeline, conn: AbstractConnection, commands: Any, *rest: Any) -> Any:
            names = "+".join(sorted({str(args[0]).lower() for args, _ in commands}))
            counts[conn.client_name or "other"][f"pipeline[{names}]"] += 1
            return await execute(self, conn, commands, *rest)

        return run

    with (
        mock.patch.object(AbstractConnection, "send_command", counted_send),
        mock.patch.object(Store, "_ask", staticmethod(counted_ask)),
        mock.patch.object(Pipeline, "_execute_pipeline", counted(batches[0])),
        mock.patch.object(Pipeline, "_execute_transaction", counted(batches[1])),
    ):
        yield counts


def per_step(counts: Counter[str], steps: int) -> dict[str, float]:
    return {name: n / steps for name, n in counts.most_common()}


def redis_traffic(
    run_commands: dict[str, float], trips: dict[str, dict[str, float]], pools: list[str]
) -> None:
    """Prints Redis traffic per committed step: round trips by pool, then what Redis ran."""

    def listed(counts: dict[str, float]) -> str:
        ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        return ", ".join(f"{name} {n:.2f}" for name, n in ordered if n >= 0.005)

    for pool in pools:
        counts = trips.get(pool, {})
        print(
            f"  Redis round trips per step, {pool.removeprefix('bench-')}: "
            f"{sum(counts.values()):.2f} ({listed(counts)})"
        )
    print(
        f"  Redis commands run per step (INFO commandstats; a script's own commands count "
        f"too): {sum(run_commands.values()):.2f} ({listed(run_commands)})"
    )


def _connection_per_call() -> aiohttp.ClientSession:
    """The engine's session with keep-alive off: every request on a new connection."""
    connector = aiohttp.TCPConnector(force_close=True)
    return aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=None, connect=30.0)
    )


# --- figures ----------------------------------------------------------------------------


def p99(values: list[float]) -> float:
    """Nearest rank: the smallest value at or above 99 % of the sample."""
    ordered = sorted(values)
    return ordered[max(math.ceil(0.99 * len(ordered)) - 1, 0)]


@dataclass
class Figures:
    step_median: float
    step_p99: float
    turn_median: float
    turn_p99: float
    vendor_median: float
    steps_per_s: float
    turns_per_s: float
    cpu_per_step: float
    engine_cpu_per_step: float
    engine_kernel_per_step: float


def figures(run: Run) -> Figures:
    ms = 1000.0
    return Figures(
        step_median=statistics.median(run.step_seconds) * ms,
        step_p99=p99(run.step_seconds) * ms,
        turn_median=statistics.median(run.turn_seconds) * ms,
        turn_p99=p99(run.turn_seconds) * ms,
        vendor_median=statistics.median(run.vendor_seconds) * ms,
        steps_per_s=run.steps / run.wall,
        turns_per_s=run.turns / run.wall,
        cpu_per_step=run.cpu / run.steps * ms,
        engine_cpu_per_step=run.engine_cpu / run.steps * ms,
        engine_kernel_per_step=run.engine_kernel / run.steps * ms,
    )


def report(f: Figures, *, steps: int, turns: int, spt: float, sessions: int, t: int) -> None:
    print(
        f"  step overhead (engine apply+commit): median {f.step_median:.3f} ms, "
        f"p99 {f.step_p99:.3f} ms over {steps} steps"
    )
    print(
        f"  turn overhead minus vendor: median {f.turn_median:.3f} ms per step, "
        f"p99 {f.turn_p99:.3f} ms ({turns} turns, {spt:.2f} steps/turn, "
        f"vendor median {f.vendor_median:.3f} ms/turn)"
    )
    print(
        f"  throughput: {f.steps_per_s:.0f} steps/s, {f.turns_per_s:.0f} turns/s "
        f"({sessions} sessions x {t} turns)"
    )
    user = f.engine_cpu_per_step - f.engine_kernel_per_step
    print(
        f"  engine cpu (its own thread; target <= 0.5 ms): {f.engine_cpu_per_step:.3f} ms per step"
        f" = {user:.3f} ms in Python + {f.engine_kernel_per_step:.3f} ms in the kernel"
        " (its sockets' system calls)"
    )
    print(f"  cpu of this process (engine + clients): {f.cpu_per_step:.3f} ms per step")


async def bench(args: argparse.Namespace, redis_url: str, vendor: ChildServer, tmp: Path) -> None:
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)  # as Ctrl-C
    project = make_project(tmp, vendor.url)
    if args.no_stream:
        agents = {k: _UnstreamedAgent(**vars(a)) for k, a in project.agents.items()}
        project = replace(project, agents=agents)
    if args.budgets:  # two `[[budgets]]` policies every session falls in, never spent
        hour = 3_600_000
        project = replace(
            project,
            budgets=(
                BudgetPolicy("agent", ("agent",), "total_tokens", "1e12", "1h", hour, "reject"),
                # Per session, not per user: the bench's sessions have no subject, so a
                # per-user policy would hold none of them.
                BudgetPolicy(
                    "session", ("session",), "total_tokens", "1e12", "1d", 24 * hour, "reject"
                ),
            ),
        )
    exits = contextlib.AsyncExitStack()
    if args.trace:  # every span exported over OTLP/HTTP to a receiver in this process
        receiver = await exits.enter_async_context(otlp_receiver())
        project = replace(project, telemetry=TelemetryConfig(endpoint=receiver.url))
    engine = EngineThread(lambda: Engine(project, connect(redis_url, name=ENGINE_POOL), env=ENV))
    # The clients' own pool, as a separate process would have.
    client_redis = connect(redis_url, name=CLIENTS_POOL)
    pools = [ENGINE_POOL, CLIENTS_POOL]
    try:
        started = await engine.start()
        await engine.run(started.leases.wait_owned(started.store.partitions))
        started.stats.record_steps = True
        client = Client(await Store.open(client_redis))
        await run_once(engine, client, vendor, "warmup", args.sessions, WARMUP_TURNS)
        runs: list[Run] = []
        # The engine's thread is profiled, not the clients'.
        profile = cProfile.Profile() if args.profile else None
        if profile:
            await engine.run(_in_thread(profile.enable))
        for r in range(args.repeat):
            run = await run_once(engine, client, vendor, f"r{r}", args.sessions, args.turns)
            runs.append(run)
            print(f"repeat {r + 1}/{args.repeat} ({run.wall:.2f} s):")
            report(
                figures(run),
                steps=run.steps,
                turns=run.turns,
                spt=run.steps_per_turn,
                sessions=args.sessions,
                t=args.turns,
            )
            redis_traffic(
                per_step(run.commands, run.steps),
                {pool: per_step(counts, run.steps) for pool, counts in run.trips.items()},
                pools,
            )
        if profile:
            await engine.run(_in_thread(profile.disable))
            profile.dump_stats(args.profile)
            pstats.Stats(profile).sort_stats("cumulative").print_stats(25)
    finally:
        await engine.stop()
        await client_redis.aclose()
        await exits.aclose()
    each = [figures(run) for run in runs]
    names = [fl.name for fl in fields(Figures)]
    med = Figures(*(statistics.median(getattr(f, name) for f in each) for name in names))
    mode = "whole bodies" if args.no_stream else "streamed"
    if args.trace:
        mode += ", tracing on"
    if args.new_connections:
        mode += ", a new connection per call"
    print(f"median of {len(runs)} repeats ({mode}; a shared machine is noisy, compare medians):")
    report(
        med,
        steps=runs[0].steps,
        turns=runs[0].turns,
        spt=statistics.median(run.steps_per_turn for run in runs),
        sessions=args.sessions,
        t=args.turns,
    )
    redis_traffic(
        median_counts([per_step(run.commands, run.steps) for run in runs]),
        {
            pool: median_counts(
                [per_step(run.trips.get(pool, Counter()), run.steps) for run in runs]
            )
            for pool in pools
        },
        pools,
    )


def median_counts(each: list[dict[str, float]]) -> dict[str, float]:
    """Per name, the median over runs (a run without the name counts 0)."""
    names = {name for counts in each for name in counts}
    return {name: statistics.median(counts.get(name, 0.0) for counts in each) for name in names}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=20, help="concurrent sessions")
    parser.add_argument("--turns", type=int, default=10, help="sequential turns per session")
    parser.add_argument("--repeat", type=int, default=3, help="measured runs")
    parser.add_argument(
        "--no-stream", action="store_true", help="ask the vendor for whole bodies, not streams"
    )
    parser.add_argument(
        "--new-connections",
        action="store_true",
        help="keep-alive off: a new connection per model call",
    )
    parser.add_argument(
        "--fsync",
        choices=["always", "everysec"],
        default=DEFAULT_FSYNC,
        help="the embedded server's appendfsync ([store] fsync; default %(default)s)",
    )
    parser.add_argument(
        "--profile", metavar="FILE", help="cProfile the measured repeats into FILE (slows them)"
    )
    parser.add_argument(
        "--budgets",
        action="store_true",
        help="two [[budgets]] policies every session falls in: a bucket read a step, a charge "
        "a model call",
    )
    parser.add_argument(
        "--trace",
        action="store_true",
        help="tracing on ([telemetry] endpoint): spans exported to a receiver in this process",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="subs-bench-") as tmp:
        server = EmbeddedRedis(Path(tmp) / "redis", fsync=args.fsync)
        vendor = ChildServer(_vendor_child)
        try:
            url = server.start()
            vendor.start()
            vendor.ready()
            fresh = mock.patch("engine.effects.runner.new_session", _connection_per_call)
            with fresh if args.new_connections else contextlib.nullcontext():
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
