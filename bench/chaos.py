"""Chaos: `subs serve` processes SIGKILLed at random while sessions submit turns.

Runs K `subs serve` processes (default 3) on one redis-server that this script
starts itself (AOF in a temp dir, fsync always), a fake model vendor and a test
worker in child processes, and two agents: one the engine decides for (model
answers streamed by the vendor) and one a worker decides for (it echoes the
engine's proposals). S sessions (default 20) submit turns back to back over the
HTTP API of a random live serve. Meanwhile it SIGKILLs a random serve at random
intervals (N kills, default 100; each killed serve is started again at once) and
SIGKILLs and restarts the redis-server R times (default 3) on the same AOF.

With `--cluster` the serves run on a Redis Cluster instead (3 masters + 3 replicas of
the same redis-server on loopback ports), and each of the R Redis events is a master
failing over to its replica: a graceful CLUSTER FAILOVER, then a SIGKILL of a master
(its replica promoted, the killed one started again as the replica), in turn. At the
end every master must hold session keys (the partitions spread over them).

Then it waits (bounded) for every submitted turn to end, reads every session's log
from Redis and prints one line per figure: turns submitted, completed, failed (by
error code), lost (never ended), duplicated (a turn started or ended twice, a seq
gap or repeat, an LLM call attempt completed twice, a message applied twice),
sessions whose snapshot is not the fold of their log, and lease handoff times (from
a kill to the moment other engines hold every partition the dead one held). Exit
status 1 when anything was lost, duplicated or inconsistent; 130 on Ctrl-C.

    .venv/bin/python bench/chaos.py [--serves 3] [--sessions 20] [--kills 100]
        [--redis-restarts 3] [--cluster] [--quick] [--seed N] [--keep]
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
import os
import random
import shutil
import signal
import statistics
import subprocess
import tempfile
import textwrap
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import aiohttp
from aiohttp import web
from redis.exceptions import RedisError

from bench.api_stream import Interrupts
from bench.step_overhead import ChildServer, _recv
from engine.cli.remote import HttpClient
from engine.client import ClientError
from engine.machine import fold, state_to_json
from engine.store.embedded import EmbeddedRedis, die_with_parent
from engine.store.store import Store, connect
from tests.engine_helpers import ENV, ROOT
from tests.fakes.llm_vendor import FakeVendor, Text
from tests.redis_cluster import LocalCluster
from tests.workers import TestWorker

AGENTS = ("engine_decided", "worker_decided")
TURN_ENDS = ("turn.completed", "turn.failed")
LEASE_POLL = 0.05  # seconds between two reads of every lease
QUICK = {
    "serves": 2,
    "sessions": 5,
    "kills": 5,
    "redis_restarts": 1,
    "min_gap": 1.0,
    "max_gap": 3.0,
    "drain": 30.0,
}
FULL = {
    "serves": 3,
    "sessions": 20,
    "kills": 100,
    "redis_restarts": 3,
    "min_gap": 2.0,
    "max_gap": 8.0,
    "drain": 60.0,
}


class ChaosError(Exception):
    """The run itself could not go on (a serve that would not start, say)."""


# --- the outside services, in child processes -------------------------------------------------


class _Vendor(FakeVendor):
    """Streams the same short answer to every call; keeps a count, not the requests."""

    def __init__(self, chunk_delay: float) -> None:
        super().__init__()
        self.default = Text("all quiet on the pager tonight", chunk_delay=chunk_delay)
        self.calls = 0

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.calls += 1
        try:
            return await super()._handle(request)
        finally:
            self.requests.clear()  # a long run makes many; none is needed here

    def counts(self) -> dict[str, Any]:
        return {"calls": self.calls}


class _Worker(TestWorker):
    """Echoes the engine's proposals, checking every request against the protocol schema."""

    def __init__(self) -> None:
        super().__init__()
        self.decisions = 0

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.decisions += 1
        try:
            return await super()._handle(request)
        finally:
            self.raw_bodies.clear()
            self.headers.clear()
            self.requests.clear()

    def counts(self) -> dict[str, Any]:
        errors = self.schema_errors + self.response_schema_errors
        return {"decisions": self.decisions, "schema_errors": errors[:5], "errors": len(errors)}


def _vendor_child(chunk_delay: float, conn: Connection) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us, also on Ctrl-C
    asyncio.run(_child_serve(_Vendor(chunk_delay), conn))


def _worker_child(conn: Connection) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    asyncio.run(_child_serve(_Worker(), conn))


async def _child_serve(server: _Vendor | _Worker, conn: Connection) -> None:
    await server.start()
    try:
        conn.send(server.url)
        while await asyncio.to_thread(_recv, conn) == "take":
            conn.send(server.counts())
    finally:
        await server.stop()


def project_toml(vendor_url: str, worker_url: str) -> str:
    return textwrap.dedent(
        f"""\
        name = "chaos"

        [llm.openai]
        type = "openai"
        base_url = "{vendor_url}/v1"

        [agent.{AGENTS[0]}]
        llm = "openai"
        model = "gpt-4.1-mini"
        system = "You are terse."

        [agent.{AGENTS[1]}]
        llm = "openai"
        model = "gpt-4.1-mini"
        system = "You are terse."
        worker = "{worker_url}"
        """
    )


# --- the serves --------------------------------------------------------------------------------


class Serve:
    """One `subs serve` process; its stderr goes to a file (it says a lot while Redis is away)."""

    def __init__(self, slot: int, config: Path, redis_url: str, logs: Path, lease_ms: int) -> None:
        self.slot = slot
        self.config = config
        self.redis_url = redis_url
        self.logs = logs
        self.lease_ms = lease_ms
        self.generation = 0
        self.log = logs / f"serve-{slot}.log"
        self.proc: asyncio.subprocess.Process | None = None
        self.owner = ""  # set once it has said it runs; cleared when it is killed
        self.api = ""

    @property
    def up(self) -> bool:
        return bool(self.owner) and self.proc is not None and self.proc.returncode is None

    async def start(self, timeout: float = 60.0) -> None:
        self.generation += 1
        self.log = self.logs / f"serve-{self.slot}.{self.generation}.log"
        env = {**os.environ, **ENV, "SUBS_LEASE_MS": str(self.lease_ms), "PYTHONPATH": str(ROOT)}
        with open(self.log, "wb") as out:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                *("-m", "engine.cli", "serve", "-c", str(self.config)),
                *("--redis", self.redis_url, "--port", "0"),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=out,
                preexec_fn=die_with_parent(),  # a SIGKILLed bench leaves no serve behind
            )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not (line := self._start_line()):
            if self.proc.returncode is not None or loop.time() > deadline:
                tail = self.log.read_text(errors="replace")[-2000:]
                raise ChaosError(f"serve {self.slot} did not start; its log ends:\n{tail}")
            await asyncio.sleep(0.05)  # the line is in a file: nothing to wait on but time
        self.owner = line.split()[2]
        self.api = line.split("; api ")[1].split(";")[0]

    def _start_line(self) -> str | None:
        for line in self.log.read_text(errors="replace").splitlines(keepends=True):
            if line.startswith("subs: engine ") and line.endswith("\n"):
                return line
        return None

    async def kill(self) -> None:
        assert self.proc is not None
        self.owner = ""
        self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()

    async def stop(self) -> None:
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(15):
                await proc.wait()
        except TimeoutError:
            proc.kill()
            await proc.wait()


# --- leases ------------------------------------------------------------------------------------


@dataclass
class Handoff:
    kill: int  # which kill of the run
    killed_at: float
    owner: str
    partitions: set[int]
    took: float | None = None


class Leases:
    """Reads every partition's lease in a loop; times how long a dead owner's take to move."""

    def __init__(self, redis: Any, store: Store) -> None:
        self.redis = redis
        self.store = store
        self.handoffs: list[Handoff] = []

    async def owners(self) -> dict[int, str]:
        async with self.redis.pipeline(transaction=False) as pipe:
            for p in range(self.store.partitions):
                pipe.get(self.store.lease_key(p))
            values = await pipe.execute()
        return {p: v.decode().rsplit(":", 1)[0] for p, v in enumerate(values) if v}

    async def watch(self) -> None:
        while True:
            # Redis restarting, or anything else: poll again (a watcher that died would
            # report every later kill as never handed over).
            with contextlib.suppress(Exception):
                owners = await self.owners()
                now = asyncio.get_running_loop().time()
                for h in self.handoffs:
                    if h.took is None and all(
                        owners.get(p) not in (None, h.owner) for p in h.partitions
                    ):
                        h.took = now - h.killed_at
            await asyncio.sleep(LEASE_POLL)


# --- sessions and turns ----------------------------------------------------------------------


@dataclass
class Turn:
    session_id: str
    tag: str  # the user message, unique over the run
    turn_id: str | None  # None: the submit got no answer


@dataclass
class SessionLog:
    """What one session's log says, read once."""

    events: list[dict[str, Any]]
    snapshot: tuple[int, Any]  # (at, state) as stored, read together with the log
    started: Counter[str] = field(default_factory=Counter)
    ends: defaultdict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    tags: defaultdict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    llm_done: Counter[tuple[str, int]] = field(default_factory=Counter)

    @classmethod
    def of(cls, events: list[dict[str, Any]], snapshot: tuple[int, Any]) -> SessionLog:
        log = cls(events, snapshot)
        for e in events:
            p = e["payload"]
            kind = p["type"]
            if kind == "turn.started":
                log.started[p["turn_id"]] += 1
            elif kind in TURN_ENDS:
                log.ends[p["turn_id"]].append(p)
            elif kind == "message.new" and p["message"]["role"] == "user":
                log.tags[str(p["message"]["content"])].append(e.get("turn_id") or "")
            elif kind == "llm.call.completed":
                log.llm_done[(p["id"], p["attempt"])] += 1
        return log

    @property
    def seq_ok(self) -> bool:
        return [e["seq"] for e in self.events] == list(range(1, len(self.events) + 1))

    def snapshot_difference(self) -> str | None:
        """Where the stored snapshot differs from the fold of the log up to its seq (DESIGN:
        it can always be rebuilt from the log); None when it does not."""
        seq, state = self.snapshot
        if seq > len(self.events):
            return f"snapshot at seq {seq}, log ends at {len(self.events)}"
        folded = fold(json.loads(json.dumps(self.events[:seq])))
        return _difference(None if folded is None else state_to_json(folded), state, "state")


def _difference(folded: Any, stored: Any, path: str) -> str | None:
    """The first path at which two JSON values differ, with both values."""
    if isinstance(folded, dict) and isinstance(stored, dict):
        for key in sorted(folded.keys() | stored.keys()):
            found = _difference(folded.get(key), stored.get(key), f"{path}.{key}")
            if found:
                return found
        return None
    if isinstance(folded, list) and isinstance(stored, list) and len(folded) == len(stored):
        for i, (a, b) in enumerate(zip(folded, stored, strict=True)):
            found = _difference(a, b, f"{path}[{i}]")
            if found:
                return found
        return None
    if folded == stored:
        return None
    return f"{path}: fold {json.dumps(folded)[:120]}, stored {json.dumps(stored)[:120]}"


class Run:
    """Everything one chaos run starts, counts and reads back."""

    def __init__(
        self, args: argparse.Namespace, redis_server: EmbeddedRedis | LocalCluster, tmp: Path
    ) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.server = redis_server
        self.tmp = tmp
        self.redis = connect(redis_server.url)
        self.http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=200),
            timeout=aiohttp.ClientTimeout(total=45.0),
        )
        self.store: Store
        self.leases: Leases
        self.serves: list[Serve] = []
        self.turns: list[Turn] = []
        self.submit_problems: Counter[str] = Counter()
        self.serve_start_failures: list[str] = []
        self.kills_skipped = 0
        self.redis_back_after: list[float] = []
        self.stop_submitting = asyncio.Event()
        self.started = time.monotonic()

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:7.1f} s] {text}", file=sys.stderr, flush=True)

    # -- the workload --

    async def session_slot(self, slot: int) -> None:
        """Turns back to back, in sessions of `turns_per_session` turns."""
        agent = AGENTS[slot % len(AGENTS)]
        generation = k = 0
        while not self.stop_submitting.is_set():
            sid = f"chaos-{slot}-{generation}"
            turn = await self.submit(sid, agent, f"chaos {slot}.{generation}.{k}")
            self.turns.append(turn)
            k += 1
            ended = turn.turn_id is not None and await self.wait_turn(sid, turn.turn_id)
            if not ended or k % self.args.turns_per_session == 0:
                generation += 1  # none queued behind a stuck turn; histories stay short
            await asyncio.sleep(self.args.pause_ms / 1000)  # the pace of the load

    async def submit(self, sid: str, agent: str, tag: str) -> Turn:
        serve = await self.live_serve()
        message = {"role": "user", "content": tag}
        payload = {"type": "client.message", "agent_id": agent, "message": message, "queue": True}
        try:
            reply = await HttpClient(serve.api, http=self.http).submit(payload, session_id=sid)
        except ClientError as err:
            # Unreached: the transport failure's name (ConnectError, RemoteProtocolError...).
            unreached = err.code == "unreachable"
            problem = err.detail["error"] if unreached else f"HTTP {err.status} {err.code}"
        else:
            return Turn(sid, tag, reply["turn_id"])
        self.submit_problems[problem] += 1
        return Turn(sid, tag, None)

    async def live_serve(self) -> Serve:
        while True:
            up = [s for s in self.serves if s.up]
            if up:
                return self.rng.choice(up)
            await asyncio.sleep(0.05)  # every serve is restarting: a start is not an event here

    async def wait_turn(self, sid: str, turn_id: str) -> bool:
        """Whether the turn ended within `--turn-wait` seconds, read from the log in Redis."""
        key, cursor = self.store.log_key(sid), "0-0"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.args.turn_wait
        while (left := deadline - loop.time()) > 0:
            try:
                reply = await self.redis.xread(
                    {key: cursor}, block=max(int(min(left, 1) * 1000), 1)
                )
            except (RedisError, OSError):
                await asyncio.sleep(0.2)  # Redis is restarting
                continue
            for _, entries in reply or ():
                for entry_id, fields in entries:
                    cursor = entry_id
                    event = json.loads(fields[b"e"])
                    if event.get("turn_id") == turn_id and event["payload"]["type"] in TURN_ENDS:
                        return True
        return False

    # -- the chaos --

    async def chaos(self) -> None:
        plan = ["serve"] * self.args.kills
        for i in range(self.args.redis_restarts, 0, -1):  # spread evenly between the kills
            plan.insert(i * self.args.kills // (self.args.redis_restarts + 1), "redis")
        deadline = self.started + self.args.max_seconds
        restarts: list[asyncio.Task[None]] = []
        for n, what in enumerate(plan, 1):
            await asyncio.sleep(self.rng.uniform(self.args.min_gap, self.args.max_gap))
            if time.monotonic() > deadline:
                self.say(f"--max-seconds reached after {n - 1} of {len(plan)} events")
                break
            if what == "redis":
                await self.restart_redis(n, len(plan))
            else:
                restart = await self.kill_serve(n, len(plan), restarts)
                if restart is not None:
                    restarts.append(restart)
        if restarts:
            await asyncio.wait(restarts, timeout=90)

    async def kill_serve(
        self, n: int, of: int, restarts: list[asyncio.Task[None]]
    ) -> asyncio.Task[None] | None:
        """SIGKILL a serve that is up. When every serve is still starting again (a loaded
        machine takes longer to start one than the gap between two kills), the kill waits
        for the first of them to be up: it is a kill of a running serve, never skipped."""
        while not (up := [s for s in self.serves if s.up]):
            pending = [r for r in restarts if not r.done()]
            if not pending:  # none is coming back (each start failure is counted)
                self.kills_skipped += 1
                return None
            self.say(f"{n}/{of}: waiting for a serve to be up again")
            await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        victim = self.rng.choice(up)
        owner = victim.owner
        try:
            owners = await self.leases.owners()
        except (RedisError, OSError):
            owners = {}
        held = {p for p, o in owners.items() if o == owner}
        killed_at = asyncio.get_running_loop().time()
        await victim.kill()
        self.leases.handoffs.append(Handoff(n, killed_at, owner, held))
        self.say(f"{n}/{of}: SIGKILL serve {victim.slot} ({owner}, {len(held)} partitions)")
        return asyncio.create_task(self.restart_serve(victim))

    async def restart_serve(self, serve: Serve) -> None:
        try:
            await serve.start()
        except ChaosError as err:
            self.serve_start_failures.append(str(err))
            self.say(f"serve {serve.slot} did not come back: {str(err).splitlines()[0]}")

    async def restart_redis(self, n: int, of: int) -> None:
        if isinstance(self.server, LocalCluster):
            await self.fail_over(self.server, n, of)
            return
        assert self.server.pid is not None
        killed_at = time.monotonic()
        os.kill(self.server.pid, signal.SIGKILL)
        await asyncio.to_thread(self.server.ended)
        await asyncio.to_thread(self.server.start, 60.0)
        self.redis_back_after.append(time.monotonic() - killed_at)
        self.say(f"{n}/{of}: SIGKILL redis-server; back after {self.redis_back_after[-1]:.2f} s")

    async def fail_over(self, cluster: LocalCluster, n: int, of: int) -> None:
        """A master fails over to its replica: gracefully, or (every other time) SIGKILLed."""
        master = self.rng.choice(cluster.masters())
        killed = len(self.redis_back_after) % 2 == 1
        started = time.monotonic()
        if killed:
            await cluster.kill(master)
        else:
            await asyncio.to_thread(cluster.failover, master)
        self.redis_back_after.append(time.monotonic() - started)
        how = "SIGKILL master" if killed else "CLUSTER FAILOVER of master"
        took = self.redis_back_after[-1]
        self.say(f"{n}/{of}: {how} {master.port}; cluster ok again after {took:.2f} s")

    async def masters_with_sessions(self) -> tuple[int, int]:
        """How many masters hold session logs, of how many masters."""
        assert isinstance(self.server, LocalCluster)
        cluster = self.server

        def count() -> tuple[int, int]:
            masters = cluster.masters()
            holding = 0
            for node in masters:
                with node.client() as c:
                    logs = c.scan_iter(match="subs:*:log:*", count=1000)
                    holding += next(iter(logs), None) is not None
            return holding, len(masters)

        return await asyncio.to_thread(count)

    # -- reading it back --

    async def read(self, sid: str) -> SessionLog:
        """The log and the snapshot in one transaction: a serve may be committing meanwhile."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.xrange(self.store.log_key(sid))
            pipe.hmget(self.store.snap_key(sid), "state", "at", "seq")
            entries, (state, at, seq) = await pipe.execute()
        events = [json.loads(fields[b"e"]) for _, fields in entries]
        # The full state is as of `at`; the log's tail after it is folded on load.
        at = int(at or seq or 0)
        return SessionLog.of(events, (at, json.loads(state) if state else None))

    def outcome(self, turn: Turn, log: SessionLog) -> tuple[str | None, list[dict[str, Any]]]:
        """The turn's id (for an unanswered submit: from its message, if it ran) and ends."""
        turn_id = turn.turn_id
        if turn_id is None:
            ids = [t for t in log.tags.get(turn.tag, []) if t]
            turn_id = ids[0] if ids else None
        return turn_id, log.ends.get(turn_id, []) if turn_id else []

    async def drain(self) -> None:
        """Waits (bounded) until every turn that ran has ended."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.args.drain
        by_session: defaultdict[str, list[Turn]] = defaultdict(list)
        for turn in self.turns:
            by_session[turn.session_id].append(turn)
        waiting = set(by_session)
        while waiting and loop.time() < deadline:
            for sid in sorted(waiting):
                with contextlib.suppress(RedisError, OSError):
                    log = await self.read(sid)
                    outcomes = [self.outcome(t, log) for t in by_session[sid]]
                    if all(ends or not turn_id for turn_id, ends in outcomes):
                        waiting.discard(sid)
            if waiting:
                await asyncio.sleep(0.5)  # turns end in other processes: poll

    async def report(self, elapsed: float, children: dict[str, dict[str, Any]]) -> bool:
        """Prints the summary; True when nothing was lost, duplicated or inconsistent."""
        logs = {sid: await self.read(sid) for sid in sorted({t.session_id for t in self.turns})}
        completed = lost = ran_anyway = 0
        stuck: list[str] = []
        failed: Counter[str] = Counter()
        for turn in self.turns:
            turn_id, ends = self.outcome(turn, logs[turn.session_id])
            if turn.turn_id is None and turn_id is None:
                continue  # never ran: counted with the unanswered submits
            ran_anyway += turn.turn_id is None
            if not ends:
                lost += 1
                events = logs[turn.session_id].events
                last = events[-1]["payload"]["type"] if events else "no event"
                stuck.append(f"{turn.session_id} {turn_id or turn.tag!r} (last event: {last})")
            elif ends[0]["type"] == "turn.completed":
                completed += 1
            else:
                failed[str((ends[0].get("error") or {}).get("code", "?"))] += 1
        dups = Counter(
            {
                "turn started twice": sum(
                    sum(n > 1 for n in log.started.values()) for log in logs.values()
                ),
                "turn ended twice": sum(
                    sum(len(e) > 1 for e in log.ends.values()) for log in logs.values()
                ),
                "seq gap/repeat": sum(not log.seq_ok for log in logs.values()),
                "llm attempt completed twice": sum(
                    sum(n > 1 for n in log.llm_done.values()) for log in logs.values()
                ),
                "message applied twice": sum(
                    sum(len(ids) > 1 for ids in log.tags.values()) for log in logs.values()
                ),
            }
        )
        differences = {sid: log.snapshot_difference() for sid, log in logs.items()}
        differing = [
            f"{sid} at seq {logs[sid].snapshot[0]}: {d}" for sid, d in differences.items() if d
        ]
        mismatched = len(differing)
        answered = sum(t.turn_id is not None for t in self.turns)
        unanswered = len(self.turns) - answered
        a = self.args
        redis_events = "master failovers on a cluster" if a.cluster else "redis restarts"
        print(
            f"chaos: {a.serves} serves, {a.sessions} sessions, {a.kills} serve kills, "
            f"{a.redis_restarts} {redis_events}, lease {a.lease_ms} ms, seed {a.seed}, "
            f"{elapsed:.0f} s"
        )
        print(f"turns submitted: {answered}")
        problems = ", ".join(f"{k} x{v}" for k, v in self.submit_problems.most_common())
        print(
            f"submits unanswered: {unanswered}"
            + (f" ({problems}); {ran_anyway} of them ran anyway" if unanswered else "")
        )
        print(f"turns completed: {completed}")
        codes = ", ".join(f"{k} x{v}" for k, v in failed.most_common())
        print(f"turns failed: {sum(failed.values())}" + (f" ({codes})" if codes else ""))
        print(f"turns lost (never ended): {lost}")
        for line in stuck[:5]:
            print(f"  lost: {line}")
        detail = ", ".join(f"{k} {v}" for k, v in dups.items())
        print(f"duplicated: {sum(dups.values())} ({detail})")
        print(f"snapshots that are not their log's fold: {mismatched} of {len(logs)} sessions")
        for line in differing[:5]:
            print(f"  not the fold: {line}")
        moved = [h for h in self.leases.handoffs if h.partitions and h.took is not None]
        took = [h.took for h in moved if h.took is not None]
        empty = sum(not h.partitions for h in self.leases.handoffs)
        never = sum(bool(h.partitions) and h.took is None for h in self.leases.handoffs)
        slowest = max(moved, key=lambda h: h.took or 0.0) if moved else None
        spread = (
            f"median {statistics.median(took):.2f} s, max {max(took):.2f} s (event {slowest.kill})"
            if slowest
            else "-"
        )
        print(
            f"lease handoff after a serve kill: {spread} over {len(took)} kills "
            f"({empty} held no partition, {never} never handed over, "
            f"{self.kills_skipped} skipped with no serve up)"
        )
        if never:
            try:
                owners = await self.leases.owners()
            except (RedisError, OSError) as err:
                owners = {p: f"unread ({err})" for p in range(self.store.partitions)}
            for h in self.leases.handoffs:
                if h.partitions and h.took is None:
                    left = {p: owners.get(p) or "none" for p in sorted(h.partitions)}
                    print(f"  never handed over: kill {h.kill} of {h.owner}; owners now {left}")
        back = self.redis_back_after
        spread_ok = True
        if isinstance(self.server, LocalCluster):
            holding, masters = await self.masters_with_sessions()
            spread_ok = holding == masters
            print(f"masters holding sessions: {holding} of {masters}")
        print(
            f"{'master failovers' if isinstance(self.server, LocalCluster) else 'redis restarts'}"
            f": {len(back)}"
            + (
                f", answering again after median {statistics.median(back):.2f} s, "
                f"max {max(back):.2f} s"
                if back
                else ""
            )
        )
        worker = children.get("worker", {})
        print(
            f"model calls: {children.get('vendor', {}).get('calls', '?')}; worker decisions: "
            f"{worker.get('decisions', '?')} ({worker.get('errors', '?')} schema errors"
            + (f": {worker['schema_errors']}" if worker.get("schema_errors") else "")
            + f"); serves that did not restart: {len(self.serve_start_failures)}"
        )
        return lost == 0 and sum(dups.values()) == 0 and mismatched == 0 and spread_ok

    async def aclose(self) -> None:
        for serve in self.serves:
            with contextlib.suppress(Exception):
                await serve.stop()
        await self.http.close()
        await self.redis.aclose()


async def chaos_run(
    args: argparse.Namespace,
    server: EmbeddedRedis | LocalCluster,
    vendor: ChildServer,
    worker: ChildServer,
) -> bool:
    interrupts = Interrupts()
    run = Run(args, server, Path(args.dir))
    tasks: list[asyncio.Task[Any]] = []
    try:
        config = run.tmp / "subs.toml"
        config.write_text(project_toml(vendor.url, worker.url))
        run.store = await Store.open(run.redis)
        run.leases = Leases(run.redis, run.store)
        logs = run.tmp / "logs"
        logs.mkdir()
        run.serves = [Serve(i, config, server.url, logs, args.lease_ms) for i in range(args.serves)]
        await asyncio.gather(*(s.start() for s in run.serves))
        run.say(f"{args.serves} serves up; logs in {logs}")
        tasks.append(asyncio.create_task(run.leases.watch()))
        slots = [asyncio.create_task(run.session_slot(i)) for i in range(args.sessions)]
        tasks += slots
        await run.chaos()
        run.stop_submitting.set()
        run.say("chaos over: waiting for the sessions' last turns")
        await asyncio.wait(slots, timeout=args.turn_wait + 30)
        await run.drain()
        children = {"vendor": await asyncio.to_thread(vendor.take)}
        children["worker"] = await asyncio.to_thread(worker.take)
        return await run.report(time.monotonic() - run.started, children)
    except BaseException:
        if interrupts.seen:
            raise asyncio.CancelledError from None
        raise
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await run.aclose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small run, as the test does")
    parser.add_argument("--serves", type=int, help="subs serve processes (3; quick 2)")
    parser.add_argument("--sessions", type=int, help="sessions submitting turns (20; quick 5)")
    parser.add_argument("--kills", type=int, help="serve SIGKILLs (100; quick 5)")
    parser.add_argument(
        "--redis-restarts", type=int, help="redis-server SIGKILLs + restarts (3; quick 1)"
    )
    parser.add_argument("--min-gap", type=float, help="least seconds between kills (2; quick 1)")
    parser.add_argument("--max-gap", type=float, help="most seconds between kills (8; quick 3)")
    parser.add_argument(
        "--drain", type=float, help="seconds to wait for the last turns to end (60; quick 30)"
    )
    parser.add_argument("--lease-ms", type=int, default=2000, help="SUBS_LEASE_MS of the serves")
    parser.add_argument("--turns-per-session", type=int, default=10)
    parser.add_argument("--turn-wait", type=float, default=60.0, help="seconds a turn may take")
    parser.add_argument("--pause-ms", type=float, default=100.0, help="between a session's turns")
    parser.add_argument("--chunk-delay-ms", type=float, default=10.0, help="vendor pace")
    parser.add_argument("--max-seconds", type=float, default=1200.0, help="bound on the chaos")
    parser.add_argument("--cluster", action="store_true", help="on a 3+3 Redis Cluster")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (serve logs, AOF)")
    args = parser.parse_args()
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.dir = tempfile.mkdtemp(prefix="subs-chaos-")
    server: EmbeddedRedis | LocalCluster
    if args.cluster:
        server = LocalCluster(Path(args.dir) / "cluster")
    else:
        server = EmbeddedRedis(Path(args.dir) / "redis")
    vendor = ChildServer(functools.partial(_vendor_child, args.chunk_delay_ms / 1000))
    worker = ChildServer(_worker_child)
    try:
        server.start()
        vendor.start()
        worker.start()
        vendor.ready()
        worker.ready()
        clean = asyncio.run(chaos_run(args, server, vendor, worker))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted", file=sys.stderr)
        return 130
    except ChaosError as err:
        print(f"FAILED: {err}", file=sys.stderr)
        return 2
    finally:
        vendor.stop()
        worker.stop()
        server.stop()
        if args.keep:
            print(f"kept {args.dir}", file=sys.stderr)
        else:
            shutil.rmtree(args.dir, ignore_errors=True)
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
