"""Token latency and SSE fan-out of `subs serve`, over real HTTP.

`subs serve` runs as its own process (engine and API together, as deployed) on an
embedded redis-server; the fake vendor runs in a child process; the SSE watchers
(aiohttp + engine/sse.py) run here. Two figures:

- token latency: from a model token leaving the vendor to its `llm.token.delta`
  frame reaching an SSE client. The vendor streams each reply as chunks with
  unique text (`t17`) at a steady pace and notes `time.time()` just before
  writing each; the watcher notes `time.time()` as the decoder hands it the frame.
  Both read the same host clock. The Redis entry id of each delta (ms, from the
  same clock) splits the path: vendor -> stored in Redis (the engine reads, parses
  and XADDs) and Redis -> client (the API's XREAD wakes, frames, writes; the
  watcher reads). Those two legs are +-0.5 ms each.
- fan-out: 200 watchers, by default 20 sessions x 10 watchers (each delta is
  written once and read by ten connections, each its own blocking XREAD), while
  every session runs turns back to back against a vendor that answers at once.
  Frames (events + deltas) received per second across all watchers over a fixed
  window, measured once. Afterwards every watcher's events must equal the
  session's log (GET /api/admin/sessions/{id}/events) and it must hold every
  delta of every call, in order, spelling the reply.

The watchers share the machine with the server, so the fan-out figure is for
client and server on the same cores: each process's CPU over the window is
printed, to show which one ran out.

    .venv/bin/python bench/api_stream.py [--repeat 3] [--sessions 20] [--watchers 10]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # engine, tests, bench

import argparse
import asyncio
import json
import multiprocessing
import os
import re
import signal
import statistics
import tempfile
import time
from collections import defaultdict, deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import aiohttp

from bench.step_overhead import ChildServer, _recv, p99
from engine.cli.remote import HttpClient
from engine.sse import SseDecoder
from engine.store.embedded import EmbeddedRedis
from engine.store.store import Store, connect
from tests.engine_helpers import EngineProcess, project_toml
from tests.fakes.llm_vendor import FakeVendor, Text

AGENT = "ops_openai"
TURN_ENDS = ("turn.completed", "turn.failed")
TOKEN = re.compile(rb'"content":"\s*(t\d+)')  # a text chunk of the OpenAI stream
TURN_TIMEOUT = 30.0
MS = 1000.0


class Failure(Exception):
    """The bench saw the server misbehave: a lost, extra or reordered frame, a dead stream."""


# --- the fake vendor, in its own process -------------------------------------------------


class TokenVendor(FakeVendor):
    """Answers the user message `{"chunks": n, "delay": s}` with n chunks `t<k>` (k unique
    over the run), one every s seconds, and notes when each chunk left."""

    def __init__(self) -> None:
        super().__init__()
        self.responder = self._reply
        self.next_token = 0
        self.sent: dict[str, float] = {}

    def _reply(self, body: Any) -> Text:
        text = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
        ask = json.loads(text[text.index("{") :])  # from Slack it reads "<poster>: {...}"
        first, self.next_token = self.next_token, self.next_token + ask["chunks"]
        words = " ".join(f"t{k}" for k in range(first, self.next_token))
        return Text(words, chunk_delay=ask["delay"])

    def sending(self, frame: bytes) -> None:
        token = TOKEN.search(frame)
        if token:
            self.sent[token[1].decode()] = time.time()

    def take(self) -> dict[str, float]:
        taken, self.sent = self.sent, {}
        self.requests.clear()
        return taken


def _token_vendor_child(conn: Connection) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us, also on Ctrl-C
    asyncio.run(_token_vendor_serve(conn))


async def _token_vendor_serve(conn: Connection) -> None:
    vendor = TokenVendor()
    await vendor.start()
    try:
        conn.send(vendor.url)
        while await asyncio.to_thread(_recv, conn) == "take":
            conn.send(vendor.take())
    finally:
        await vendor.stop()


# --- watchers and turns ---------------------------------------------------------------------


def ask(chunks: int, delay: float) -> dict[str, Any]:
    """The client.message that makes the vendor answer with `chunks` chunks."""
    text = json.dumps({"chunks": chunks, "delay": delay})
    return {
        "type": "client.message",
        "agent_id": AGENT,
        "message": {"role": "user", "content": text},
    }


class Watcher:
    """One SSE connection following a session from seq 0 until cancelled.

    Any other ending (HTTP error, `stream.overflow`, end of stream) is a Failure.
    """

    def __init__(self, http: aiohttp.ClientSession, api: str, sid: str) -> None:
        self.http = http
        self.url = f"{api}/api/client/sessions/{sid}/events/stream"
        self.sid = sid
        self.events: list[dict[str, Any]] = []
        self.deltas: list[tuple[float, dict[str, Any]]] = []  # (receipt time, delta)
        self.ends: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)

    async def run(self) -> None:
        headers = {"Accept": "text/event-stream"}
        async with self.http.get(self.url, params={"after_seq": 0}, headers=headers) as response:
            if response.status != 200:
                text = (await response.read())[:200].decode("utf-8", "replace")
                raise Failure(f"{self.sid}: the stream answered {response.status}: {text}")
            decoder = SseDecoder()
            async for chunk in response.content.iter_any():
                received = time.time()
                for sse in decoder.feed(chunk):
                    self.frame(received, sse.event, sse.data)
        raise Failure(f"{self.sid}: the server ended a stream that had no turn_id")

    def frame(self, received: float, event: str, text: str) -> None:
        data = json.loads(text)
        if event == "llm.token.delta":
            self.deltas.append((received, data))
        elif "seq" in data:
            self.events.append(data)
            if data["payload"]["type"] in TURN_ENDS:
                self.ends[data["turn_id"]].set()
        else:
            raise Failure(f"{self.sid}: a watcher got {event}: {text}")

    async def turn_end(self, turn_id: str) -> None:
        """Returns once this watcher has seen the turn complete; Failure if it failed."""
        try:
            async with asyncio.timeout(TURN_TIMEOUT):
                await self.ends[turn_id].wait()
        except TimeoutError:
            raise Failure(f"{self.sid}: no end of turn {turn_id} in {TURN_TIMEOUT:g} s") from None
        end = next(e for e in reversed(self.events) if e.get("turn_id") == turn_id)
        if end["payload"]["type"] != "turn.completed":
            raise Failure(f"{self.sid}: turn failed: {end['payload'].get('error')}")


async def run_turns(
    client: HttpClient, watcher: Watcher, message: dict[str, Any], more: Callable[[], bool]
) -> str:
    """Turns back to back while `more()`; each ends when `watcher` sees it end. Returns
    the last turn's id."""
    last = ""
    while more():
        reply = await client.submit(message, session_id=watcher.sid)
        last = reply["turn_id"]
        await watcher.turn_end(last)
    return last


def countdown(n: int) -> Callable[[], bool]:
    """True `n` times, then False."""
    left = iter(range(n))
    return lambda: next(left, None) is not None


async def verify(client: HttpClient, watchers: list[Watcher]) -> int:
    """Every watcher saw its session's whole log, and each call's deltas 1..n spelling the
    reply. Returns the number of deltas checked."""
    checked = 0
    logs = {sid: await client.events(sid) for sid in dict.fromkeys(w.sid for w in watchers)}
    for n, w in enumerate(watchers):
        log = logs[w.sid]
        if w.events != log:
            first = next(
                (i for i, (a, b) in enumerate(zip(w.events, log, strict=False)) if a != b),
                min(len(w.events), len(log)),
            )
            raise Failure(
                f"{w.sid}: watcher {n} saw {len(w.events)} events, the log has {len(log)}; "
                f"they differ from index {first}"
            )
        got: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
        for _, delta in w.deltas:
            got[delta["call_id"], delta["attempt"]].append(delta)
        replies = {
            e["payload"]["message"]["id"]: e["payload"]["message"]["content"]
            for e in log
            if e["payload"]["type"] == "message.new"
            and e["payload"]["message"]["role"] == "assistant"
        }
        calls = [e["payload"] for e in log if e["payload"]["type"] == "llm.call.completed"]
        if set(got) != {(c["id"], c["attempt"]) for c in calls}:
            raise Failure(f"{w.sid}: watcher {n} got deltas of other calls than the log has")
        for call in calls:
            deltas = got[call["id"], call["attempt"]]
            if [d["seq"] for d in deltas] != list(range(1, len(deltas) + 1)):
                raise Failure(f"{w.sid}: watcher {n}: deltas of {call['id']} lost or reordered")
            if "".join(d.get("text", "") for d in deltas) != replies[call["id"]]:
                raise Failure(f"{w.sid}: watcher {n}: deltas of {call['id']} miss text")
            checked += len(deltas)
    return checked


# --- token latency -----------------------------------------------------------------------------


@dataclass
class Latency:
    total: list[float]  # seconds, vendor write -> SSE client
    to_redis: list[float]  # vendor write -> XADD (entry id ms, taken as its middle)
    from_redis: list[float]  # XADD -> SSE client


async def stored_at(store: Store, sids: list[str]) -> dict[str, float]:
    """When Redis stored each token's delta: the entry id's ms, taken as its middle."""
    out: dict[str, float] = {}
    for sid in sids:
        for entry_id, fields in await store.redis.xrange(store.delta_key(sid)):
            delta = json.loads(fields[b"d"])
            if "text" in delta:  # not the closing `finish_reason` delta
                ms = int(entry_id.split(b"-")[0])
                out[delta["text"].strip()] = (ms + 0.5) / MS
    return out


async def latency_repeat(
    args: argparse.Namespace,
    client: HttpClient,
    store: Store,
    vendor: ChildServer,
    watchers: list[Watcher],
) -> Latency:
    vendor.take()
    marks = [len(w.deltas) for w in watchers]
    message = ask(args.tokens, args.token_delay_ms / MS)

    await asyncio.gather(
        *(run_turns(client, w, message, countdown(args.latency_turns)) for w in watchers)
    )
    sent = vendor.take()
    stored = await stored_at(store, [w.sid for w in watchers])
    received = {
        delta["text"].strip(): at
        for w, m in zip(watchers, marks, strict=True)
        for at, delta in w.deltas[m:]
        if "text" in delta
    }
    if received.keys() != sent.keys():
        lost = sorted(sent.keys() - received.keys())[:5]
        raise Failure(f"tokens sent and received differ (e.g. lost {lost})")
    tokens = list(sent)
    return Latency(
        total=[received[t] - sent[t] for t in tokens],
        to_redis=[stored[t] - sent[t] for t in tokens],
        from_redis=[received[t] - stored[t] for t in tokens],
    )


def latency_line(lat: Latency) -> str:
    def ms(values: list[float]) -> str:
        return f"median {statistics.median(values) * MS:.2f} ms, p99 {p99(values) * MS:.2f} ms"

    return (
        f"token -> SSE client: {ms(lat.total)} over {len(lat.total)} tokens"
        f" (vendor -> Redis {ms(lat.to_redis)}; Redis -> client {ms(lat.from_redis)})"
    )


async def latency_phase(
    args: argparse.Namespace,
    client: HttpClient,
    watch_http: aiohttp.ClientSession,
    store: Store,
    vendor: ChildServer,
) -> None:
    watchers = [
        Watcher(watch_http, client.base_url, f"lat-{i}") for i in range(args.latency_sessions)
    ]
    runs: list[Latency] = []
    async with asyncio.TaskGroup() as group:
        # The first turn creates the session (a stream needs one) and warms the path up.
        firsts = await asyncio.gather(
            *(client.submit(ask(args.tokens, 0.0), session_id=w.sid) for w in watchers)
        )
        tasks = [group.create_task(w.run()) for w in watchers]
        await asyncio.gather(
            *(w.turn_end(r["turn_id"]) for w, r in zip(watchers, firsts, strict=True))
        )
        for r in range(args.repeat):
            lat = await latency_repeat(args, client, store, vendor, watchers)
            runs.append(lat)
            print(f"latency repeat {r + 1}/{args.repeat}: {latency_line(lat)}", flush=True)
        for task in tasks:
            task.cancel()
    await verify(client, watchers)
    medians = Latency(
        *(
            [statistics.median(getattr(lat, leg)) for lat in runs]
            for leg in ("total", "to_redis", "from_redis")
        )
    )
    p99s = [p99(lat.total) for lat in runs]
    pooled = [t for lat in runs for t in lat.total]
    pace = f"{args.latency_sessions} sessions, a token every {args.token_delay_ms:g} ms"
    print(
        f"token latency, median of {len(runs)} repeats ({pace}; same host clock): "
        f"median {statistics.median(medians.total) * MS:.2f} ms, "
        f"p99 {statistics.median(p99s) * MS:.2f} ms"
    )
    print(
        f"  all {len(pooled)} tokens together: median {statistics.median(pooled) * MS:.2f} ms, "
        f"p99 {p99(pooled) * MS:.2f} ms"
    )
    print(
        f"  of which vendor -> Redis {statistics.median(medians.to_redis) * MS:.2f} ms, "
        f"Redis -> client {statistics.median(medians.from_redis) * MS:.2f} ms (medians, +-0.5 ms)"
    )


# --- fan-out -------------------------------------------------------------------------------------


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU of a process so far (Linux /proc); NaN when unknown."""
    if pid is None:
        return float("nan")
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Sample:
    at: float
    events: int
    deltas: int
    turns: int
    cpu: dict[str, float]


def sample(watchers: list[Watcher], turns: int, pids: dict[str, int | None]) -> Sample:
    return Sample(
        at=time.perf_counter(),
        events=sum(len(w.events) for w in watchers),
        deltas=sum(len(w.deltas) for w in watchers),
        turns=turns,
        cpu={name: cpu_seconds(pid) for name, pid in pids.items()},
    )


async def fanout_phase(
    args: argparse.Namespace,
    client: HttpClient,
    watch_http: aiohttp.ClientSession,
    pids: dict[str, int | None],
) -> None:
    sids = [f"load-{i}" for i in range(args.sessions)]
    per_session = {
        sid: [Watcher(watch_http, client.base_url, sid) for _ in range(args.watchers)]
        for sid in sids
    }
    watchers = [w for ws in per_session.values() for w in ws]
    message = ask(args.load_tokens, args.load_delay_ms / MS)
    stop = asyncio.Event()
    turns = 0
    tasks: list[asyncio.Task[None]] = []

    async def session(group: asyncio.TaskGroup, sid: str) -> None:
        first = await client.submit(message, session_id=sid)
        tasks.extend(group.create_task(w.run()) for w in per_session[sid])
        lead = per_session[sid][0]  # the session's turns are paced by its first watcher
        await lead.turn_end(first["turn_id"])
        last = first["turn_id"]

        def more() -> bool:  # called once after each turn that ended
            nonlocal turns
            turns += 1
            return not stop.is_set()

        last = await run_turns(client, lead, message, more) or last
        await asyncio.gather(*(w.turn_end(last) for w in per_session[sid]))

    async with asyncio.TaskGroup() as group:
        sessions = [group.create_task(session(group, sid)) for sid in sids]
        await asyncio.sleep(args.warmup)  # the measuring schedule, not a wait for a condition
        before = sample(watchers, turns, pids)
        await asyncio.sleep(args.window)
        after = sample(watchers, turns, pids)
        stop.set()
        await asyncio.gather(*sessions)
        for task in tasks:
            task.cancel()
    checked = await verify(client, watchers)

    span = after.at - before.at
    events, deltas = after.events - before.events, after.deltas - before.deltas
    layout = f"{args.sessions} sessions x {args.watchers} watchers"
    print(
        f"fan-out, {len(watchers)} watchers ({layout}), {span:.1f} s window, measured once: "
        f"{(events + deltas) / span:.0f} frames/s "
        f"({events / span:.0f} events/s + {deltas / span:.0f} deltas/s; "
        f"{(after.turns - before.turns) / span:.0f} turns/s, "
        f"{args.load_tokens} tokens/turn)"
    )
    cpu = ", ".join(
        f"{name} {(after.cpu[name] - before.cpu[name]) / span * 100:.0f} %" for name in pids
    )
    print(f"  cpu over the window (100 % = one core of {os.cpu_count()}): {cpu}")
    log_events = sum(len(w.events) for w in watchers)
    print(
        f"  checked: every watcher got its session's whole log ({log_events} events in all) "
        f"and every delta of every call in order ({checked} deltas)"
    )


# --- the run -------------------------------------------------------------------------------------


class Interrupts:
    """SIGINT and SIGTERM cancel the running bench; `seen` tells it that is why it stopped."""

    def __init__(self) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.seen = False
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, self._cancel, task)

    def _cancel(self, task: asyncio.Task[Any]) -> None:
        self.seen = True
        task.cancel()


async def bench(
    args: argparse.Namespace, redis_url: str, vendor: ChildServer, redis_pid: int | None, tmp: Path
) -> None:
    interrupts = Interrupts()
    config = tmp / "subs.toml"
    config.write_text(project_toml(vendor.url))
    env = {
        "SUBS_LEASE_MS": "10000",  # the default lease
        # All the watchers come from this one address: let them all in.
        "SUBS_MAX_STREAMS_PER_KEY": str(args.sessions * args.watchers + args.latency_sessions),
    }
    serve = EngineProcess(config, redis_url, env=env)
    stderr: deque[str] = deque(maxlen=20)
    drain: asyncio.Task[None] | None = None
    # Watchers get a pool of their own, as large as they need: each holds a connection.
    watch_http = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0),
        timeout=aiohttp.ClientTimeout(total=None, connect=30.0),
    )
    client = HttpClient("")
    store_redis = connect(redis_url)
    try:
        await serve.start()
        assert serve.proc is not None and serve.proc.stderr is not None
        drain = asyncio.create_task(_drain(serve.proc.stderr, stderr))  # a full pipe would block it
        client.base_url = serve.api
        store = await Store.open(store_redis)
        await latency_phase(args, client, watch_http, store, vendor)
        children = [p.pid for p in multiprocessing.active_children()]  # the vendor
        pids = {
            "bench (watchers)": os.getpid(),
            "serve": serve.proc.pid,
            "redis": redis_pid,
            "vendor": children[0] if children else None,
        }
        await fanout_phase(args, client, watch_http, pids)
    except BaseException as exc:
        if interrupts.seen:  # Ctrl-C reaches `subs serve` too, and ends its streams: no failure
            raise asyncio.CancelledError from None
        if isinstance(exc, Exception) and stderr:
            print("subs serve said:\n" + "".join(stderr), file=sys.stderr)
        raise
    finally:
        await watch_http.close()
        await client.aclose()
        await store_redis.aclose()
        if serve.proc is not None:
            await serve.stop()
        if drain is not None:
            drain.cancel()


async def _drain(stream: asyncio.StreamReader, tail: deque[str]) -> None:
    while line := await stream.readline():
        tail.append(line.decode(errors="replace"))


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out += _leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="measured latency runs")
    parser.add_argument(
        "--latency-sessions", type=int, default=2, help="sessions, one watcher each"
    )
    parser.add_argument("--latency-turns", type=int, default=4, help="turns per session per repeat")
    parser.add_argument("--tokens", type=int, default=25, help="chunks per reply (latency)")
    parser.add_argument("--token-delay-ms", type=float, default=20.0, help="vendor pace (latency)")
    parser.add_argument("--sessions", type=int, default=20, help="sessions (fan-out)")
    parser.add_argument("--watchers", type=int, default=10, help="watchers per session (fan-out)")
    parser.add_argument("--load-tokens", type=int, default=25, help="chunks per reply (fan-out)")
    parser.add_argument(
        "--load-delay-ms", type=float, default=0.0, help="vendor pace (fan-out; 0: at once)"
    )
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds before the window")
    parser.add_argument("--window", type=float, default=10.0, help="fan-out window, seconds")
    args = parser.parse_args()
    return with_token_vendor(
        lambda url, vendor, server, tmp: bench(args, url, vendor, server.pid if server else 0, tmp)
    )


Bench = Callable[[str, ChildServer, EmbeddedRedis | None, Path], Coroutine[Any, Any, None]]


def with_token_vendor(run: Bench, redis_url: str | None = None) -> int:
    """Redis (embedded unless `redis_url`) and the token vendor in a child process around
    `run(url, vendor, embedded server or None, scratch dir)`; the process exit status."""
    with tempfile.TemporaryDirectory(prefix="subs-bench-") as tmp:
        server = None if redis_url else EmbeddedRedis(Path(tmp) / "redis")
        vendor = ChildServer(_token_vendor_child)
        try:
            url = server.start() if server is not None else str(redis_url)
            vendor.start()
            vendor.ready()
            asyncio.run(run(url, vendor, server, Path(tmp)))
        except (KeyboardInterrupt, asyncio.CancelledError):
            print("interrupted", file=sys.stderr)
            return 130
        except Failure as err:
            print(f"FAILED: {err}", file=sys.stderr)
            return 1
        except BaseExceptionGroup as group:
            failures = [e for e in _leaves(group) if isinstance(e, Failure)]
            if not failures:
                raise
            for err in failures:
                print(f"FAILED: {err}", file=sys.stderr)
            return 1
        finally:
            vendor.stop()
            if server is not None:
                server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
