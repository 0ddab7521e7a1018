"""One agent turn three ways, side by side: LangGraph, subs with the engine deciding, subs
with an HTTP worker deciding; and the same vendor calls with no framework at all.

The turn: the user asks, the model (streamed) asks for the `lookup` tool, the tool
answers, the model (streamed) answers. One fake OpenAI-style vendor
(tests/fakes/llm_vendor/, streamed chat completions ending in `[DONE]`) serves every
variant from its own process, so its CPU is billed to none of them.

- **HTTP calls alone** (the floor): per turn, the two streamed POSTs through one aiohttp
  ClientSession, each SSE body read to `[DONE]` and its chunks parsed, the tool called
  in between; the conversation kept in a list. Nothing is saved.
- **LangGraph** (>= 1.0): what its docs teach a user to write. A `StateGraph` over
  `MessagesState` with an `agent` node calling langchain-openai's `ChatOpenAI`
  (`streaming=True`, `stream_usage=True`, tools bound) and a prebuilt `ToolNode`, routed by
  `tools_condition`, compiled with `AsyncSqliteSaver` (langgraph-checkpoint-sqlite) on a
  file; a turn is `graph.astream(..., stream_mode="messages")` read to its end (every
  token reaches the caller), with `durability="sync"` by default: each checkpoint is
  written before the next step runs, as subs commits each step before acting
  (`--lg-durability` changes it).
- **subs, engine decides**: an in-process Engine on the embedded redis-server (AOF,
  `[store] fsync` as `--fsync`), the agent without a worker. Its tool is a client tool
  (`handler = "client"`): without a worker that is the only tool an engine-decided agent
  can run, and it costs what a UI answering a tool does: the client sees
  `tool.call.dispatched` on its event stream and submits `tool.result`.
- **subs, HTTP worker decides**: the same engine, the agent with `worker = URL`: an aiohttp
  worker in its own process that checks the signature, answers `tool.execute` with
  `tool.result` and echoes `proposed` for every other trigger (SPEC §3-§6): six
  decisions a turn (client.messages, llm.finished, tool.execute, tool.finished,
  llm.finished, turn.finished).

subs clients run in this process, as `subs run` does: one per session, following the
session's events and token deltas from its first turn to its last.

N sessions run concurrently, each 5 turns back to back, for N = 1, 20, 100; each
repeat runs every variant once, in turn (A B C D A B C D ...). Per variant: turns/s,
p50/p99 turn latency (submit to the turn's end, as its client sees it), CPU per turn of
this process (engine, clients, LangGraph and its SQLite thread), and the total with the
redis-server and the worker process added (what each variant costs the machine; the
vendor's CPU is in none, it is printed apart). Each subs variant's ratios are to
LangGraph's figures of the same N. Without the `[bench]` extra only the baseline and the
subs variants run, and the report says LangGraph was not measured and why.

    .venv/bin/python bench/vs_langgraph.py [--sessions 1 20 100] [--turns 5] [--repeat 3]
        [--lg-durability sync|async|exit] [--fsync always|everysec]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # engine, tests, bench

import argparse
import asyncio
import contextlib
import functools
import hashlib
import hmac
import importlib
import importlib.metadata
import json
import signal
import statistics
import tempfile
import textwrap
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, cast

import aiohttp
import redis.asyncio as aioredis
from aiohttp import web

from bench.step_overhead import ChildServer, TimedVendor, _recv, p99
from engine.client import Client
from engine.config import DEFAULT_FSYNC, Project, parse_project
from engine.runtime.engine import Engine, new_event_loop
from engine.store.embedded import EmbeddedRedis
from engine.store.store import Store, connect
from tests.engine_helpers import ENV
from tests.fakes.llm_vendor import Reply, Text, ToolCalls

MODEL = "gpt-4.1-mini"
SYSTEM = "You are the on-call assistant. Be terse."
TOOL = "lookup"
TOOL_DESCRIPTION = "Look up a fact about a host."
TOOL_INPUT = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
ASK_TOOL = "(look it up)"  # a user message with this makes the fake model call the tool
ENGINE_AGENT = "engine_decides"
WORKER_AGENT = "worker_decides"
SECRET_ENV = "BENCH_WORKER_SECRET"
SECRET = "bench-worker-signing-secret"
TURN_TIMEOUT = 120.0  # seconds: a turn that takes longer fails the bench instead of hanging


def lookup(q: str) -> str:
    """The tool, identical in every variant: a small JSON answer."""
    return json.dumps({"q": q, "host": "db-1", "disk_used": "91%", "trend": "+2%/day"})


def user_text(tag: str, *, tool: bool = True) -> str:
    """A user message; `tag` makes it unique, so the vendor's time can be matched to it."""
    ask = f" {ASK_TOOL}" if tool else ""
    return f"{tag}: how full is the disk on db-1?{ask}"


# --- the fake vendor, in its own process ----------------------------------------------


class TurnVendor(TimedVendor):
    """Asks for the tool when the last message is a user's that says so; else answers."""

    def __init__(self, words: int) -> None:
        super().__init__()
        self.responder = self.respond
        self.answer = " ".join(f"word{i}" for i in range(words))

    def respond(self, body: Any) -> Reply:
        messages = body.get("messages") if isinstance(body, dict) else None
        last = messages[-1] if messages else {}
        if last.get("role") == "user" and ASK_TOOL in str(last.get("content")):
            return ToolCalls([(TOOL, {"q": "disk usage on db-1"})])
        return Text(self.answer)


def vendor_child(words: int, conn: Connection) -> None:
    """Child entry point; `functools.partial(vendor_child, words)` is what ChildServer runs."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us, also on Ctrl-C
    asyncio.run(_vendor_serve(conn, words))


async def _vendor_serve(conn: Connection, words: int) -> None:
    vendor = TurnVendor(words)
    await vendor.start()
    try:
        conn.send(vendor.url)
        while await asyncio.to_thread(_recv, conn) == "take":
            requests = len(vendor.requests)
            conn.send({"cpu": time.process_time(), "requests": requests, "seconds": vendor.take()})
    finally:
        await vendor.stop()


@dataclass
class VendorTake:
    cpu: float  # the vendor process's CPU seconds so far
    requests: int  # since the last take
    seconds: dict[str, float]  # time spent answering, per user message, since the last take


def take_vendor(vendor: ChildServer) -> VendorTake:
    answer = cast(dict[str, Any], vendor.take())
    return VendorTake(answer["cpu"], answer["requests"], answer["seconds"])


# --- the HTTP worker, in its own process ----------------------------------------------


def _worker_child(conn: Connection) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    asyncio.run(_worker_serve(conn))


async def _worker_serve(conn: Connection) -> None:
    """A worker as its docs would have one written: verify, run the tool, else accept."""
    secret = SECRET.encode()

    async def decide(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        signature = request.headers.get("X-Substructure-Signature", "")
        expected = "sha256=" + hmac.new(secret, raw, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(signature, expected):
            return web.Response(status=401, text="bad signature")
        body = json.loads(raw)
        trigger = body["trigger"]
        if trigger["type"] == "tool.execute":
            q = (trigger.get("input") or {}).get("value", {}).get("q", "")
            return web.json_response({"actions": [{"type": "tool.result", "result": lookup(q)}]})
        return web.json_response(body["proposed"])

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/", decide)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        conn.send(f"http://127.0.0.1:{runner.addresses[0][1]}/")
        while await asyncio.to_thread(_recv, conn) == "take":
            conn.send({"cpu": time.process_time()})
    finally:
        await runner.cleanup()


def child_cpu(child: ChildServer) -> float:
    return cast(dict[str, float], child.take())["cpu"]


# --- the variants -------------------------------------------------------------------------


class Variant:
    """One way to run the turn; `session` runs one session's turns, appending latencies."""

    name = ""
    key = ""  # short, in session ids
    uses_redis = False
    worker: ChildServer | None = None

    async def session(self, label: str, turns: int, latencies: list[float]) -> None:
        raise NotImplementedError


class HttpAlone(Variant):
    """The vendor calls of a turn and the tool, nothing else: the floor."""

    name = "HTTP calls alone (aiohttp)"
    key = "http"

    def __init__(self, http: aiohttp.ClientSession, vendor_url: str) -> None:
        self.http = http
        self.url = f"{vendor_url}/v1/chat/completions"
        self.tools = [
            {
                "type": "function",
                "function": {
                    "name": TOOL,
                    "description": TOOL_DESCRIPTION,
                    "parameters": TOOL_INPUT,
                },
            }
        ]

    async def session(self, label: str, turns: int, latencies: list[float]) -> None:
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
        for t in range(turns):
            started = time.perf_counter()
            async with asyncio.timeout(TURN_TIMEOUT):
                messages.append({"role": "user", "content": user_text(f"{label} t{t}")})
                asked = await self.stream(messages)
                messages.append(asked)
                calls = asked.get("tool_calls") or []
                if len(calls) != 1:
                    raise RuntimeError(f"the model asked for {len(calls)} tool calls, not 1")
                for call in calls:
                    q = json.loads(call["function"]["arguments"])["q"]
                    messages.append(
                        {"role": "tool", "tool_call_id": call["id"], "content": lookup(q)}
                    )
                answer = await self.stream(messages)
                if not answer.get("content"):
                    raise RuntimeError("the model's answer came back empty")
                messages.append(answer)
            latencies.append(time.perf_counter() - started)

    async def stream(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """One streamed chat completion, read to `[DONE]`: the assistant message it built."""
        body = {
            "model": MODEL,
            "messages": messages,
            "tools": self.tools,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        headers = {"Authorization": "Bearer bench"}
        text: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        async with self.http.post(self.url, json=body, headers=headers) as response:
            response.raise_for_status()
            async for line in response.content:
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                for choice in json.loads(data).get("choices") or ():
                    delta = choice.get("delta") or {}
                    if delta.get("content"):
                        text.append(delta["content"])
                    for piece in delta.get("tool_calls") or ():
                        call = calls.setdefault(
                            piece["index"], {"type": "function", "function": {"arguments": ""}}
                        )
                        if piece.get("id"):
                            call["id"] = piece["id"]
                        function = piece.get("function") or {}
                        if function.get("name"):
                            call["function"]["name"] = function["name"]
                        call["function"]["arguments"] += function.get("arguments") or ""
        message: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None}
        if calls:
            message["tool_calls"] = [calls[i] for i in sorted(calls)]
        return message


def langgraph_missing() -> str | None:
    """Why LangGraph cannot be measured here, or None when it can."""
    for module in (
        "langgraph.graph",
        "langgraph.prebuilt",
        "langgraph.checkpoint.sqlite.aio",
        "langchain_openai",
    ):
        try:
            importlib.import_module(module)
        except ImportError as exc:
            return f"{exc} (install the extra: pip install -e '.[bench]')"
    return None


class LangGraph(Variant):
    """StateGraph + ToolNode + ChatOpenAI, checkpointed by AsyncSqliteSaver."""

    def __init__(self, graph: Any, durability: str) -> None:
        version = importlib.metadata.version("langgraph")
        self.name = f"LangGraph {version} + AsyncSqliteSaver"
        self.key = "lg"
        self.graph = graph
        self.durability = durability

    @staticmethod
    @contextlib.asynccontextmanager
    async def built(vendor_url: str, db: Path, durability: str) -> AsyncIterator[LangGraph]:
        from langchain_core.messages import SystemMessage
        from langchain_core.tools import tool
        from langchain_openai import ChatOpenAI
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
        from langgraph.graph import START, MessagesState, StateGraph
        from langgraph.prebuilt import ToolNode, tools_condition

        @tool(TOOL, description=TOOL_DESCRIPTION)
        async def lookup_tool(q: str) -> str:
            return lookup(q)

        model = ChatOpenAI(
            model=MODEL,
            base_url=f"{vendor_url}/v1",
            api_key=ENV["OPENAI_API_KEY"],  # type: ignore[arg-type]
            streaming=True,
            stream_usage=True,
        ).bind_tools([lookup_tool])

        async def agent(state: MessagesState) -> dict[str, Any]:
            reply = await model.ainvoke([SystemMessage(SYSTEM), *state["messages"]])
            return {"messages": [reply]}

        builder = StateGraph(MessagesState)
        builder.add_node("agent", agent)
        builder.add_node("tools", ToolNode([lookup_tool]))
        builder.add_edge(START, "agent")
        builder.add_conditional_edges("agent", tools_condition)
        builder.add_edge("tools", "agent")
        async with AsyncSqliteSaver.from_conn_string(str(db)) as saver:
            yield LangGraph(builder.compile(checkpointer=saver), durability)

    async def session(self, label: str, turns: int, latencies: list[float]) -> None:
        from langchain_core.messages import AIMessageChunk, HumanMessage, ToolMessage

        config = {"configurable": {"thread_id": label}}
        for t in range(turns):
            started = time.perf_counter()
            tools = answered = 0
            async with asyncio.timeout(TURN_TIMEOUT):
                stream = self.graph.astream(
                    {"messages": [HumanMessage(user_text(f"{label} t{t}"))]},
                    config,
                    stream_mode="messages",
                    durability=self.durability,
                )
                async for message, _ in stream:
                    if isinstance(message, ToolMessage):
                        tools += 1
                    elif isinstance(message, AIMessageChunk) and message.content:
                        answered += 1
            if tools != 1 or not answered:
                raise RuntimeError(f"LangGraph turn: {tools} tool results, {answered} tokens")
            latencies.append(time.perf_counter() - started)


class Subs(Variant):
    """A subs agent, followed by one client per session: events and token deltas."""

    uses_redis = True

    def __init__(
        self, name: str, agent: str, client: Client, worker: ChildServer | None = None
    ) -> None:
        self.name = name
        self.key = agent
        self.agent = agent
        self.client = client
        self.worker = worker

    async def session(self, label: str, turns: int, latencies: list[float]) -> None:
        sid = f"bench-{label}"
        async with contextlib.aclosing(self.client.follow(sid, 0, delta_cursor="0-0")) as events:
            for t in range(turns):
                started = time.perf_counter()
                async with asyncio.timeout(TURN_TIMEOUT):
                    await self.turn(sid, events, user_text(f"{label} t{t}"))
                latencies.append(time.perf_counter() - started)

    async def turn(
        self, sid: str, events: AsyncIterator[tuple[str, dict[str, Any]]], text: str
    ) -> None:
        message = {"role": "user", "content": text}
        submitted = await self.client.submit(
            {"type": "client.message", "agent_id": self.agent, "message": message},
            session_id=sid,
        )
        turn_id = submitted["turn_id"]
        client_calls: dict[str, str] = {}  # open client tool calls: id -> arguments
        tools = 0
        async for kind, item in events:
            if kind != "event" or item.get("turn_id") != turn_id:
                continue  # token deltas: read, as a UI would, and dropped
            payload = item["payload"]
            what = payload["type"]
            if what == "tool.call.requested" and payload.get("handler") == "client":
                client_calls[payload["id"]] = payload["arguments"]
            elif what == "tool.call.dispatched" and payload["id"] in client_calls:
                q = json.loads(client_calls.pop(payload["id"]))["q"]
                await self.client.submit(
                    {"type": "tool.result", "id": payload["id"], "result": lookup(q)},
                    session_id=sid,
                )
            elif what == "tool.call.completed":
                tools += 1
            elif what == "turn.failed":
                raise RuntimeError(f"turn failed: {payload.get('error')}")
            elif what == "turn.completed":
                if tools != 1:
                    raise RuntimeError(f"the turn completed with {tools} tool calls, not 1")
                return


# --- measuring ------------------------------------------------------------------------


@dataclass
class Run:
    latencies: list[float]
    wall: float
    cpu: float  # this process
    cpu_total: float  # this process + redis-server + worker, as the variant uses them
    vendor_cpu: float
    steps: int  # subs variants: committed steps


@dataclass
class Machine:
    """What every variant's run reads around itself."""

    vendor: ChildServer
    redis: aioredis.Redis
    engine: Engine


async def redis_cpu(redis: aioredis.Redis) -> float:
    info = await redis.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


async def measure(variant: Variant, m: Machine, label: str, sessions: int, turns: int) -> Run:
    async def others() -> float:
        spent = await redis_cpu(m.redis) if variant.uses_redis else 0.0
        return spent + (child_cpu(variant.worker) if variant.worker else 0.0)

    vendor_before = take_vendor(m.vendor)
    others_before = await others()
    steps_before = m.engine.stats.steps
    latencies: list[float] = []
    started, cpu_started = time.perf_counter(), time.process_time()
    async with asyncio.TaskGroup() as group:
        for s in range(sessions):
            group.create_task(variant.session(f"{label}-{variant.key}-s{s}", turns, latencies))
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    others_spent = await others() - others_before
    vendor = take_vendor(m.vendor)
    if vendor.requests != 2 * sessions * turns:
        raise RuntimeError(
            f"{variant.name}: the vendor saw {vendor.requests} requests for "
            f"{sessions * turns} turns (2 expected per turn)"
        )
    return Run(
        latencies=latencies,
        wall=wall,
        cpu=cpu,
        cpu_total=cpu + others_spent,
        vendor_cpu=vendor.cpu - vendor_before.cpu,
        steps=m.engine.stats.steps - steps_before if variant.uses_redis else 0,
    )


@dataclass
class Figures:
    turns_per_s: float
    p50_ms: float
    p99_ms: float
    cpu_ms: float  # per turn, this process
    total_ms: float  # per turn, with redis-server and the worker
    vendor_ms: float  # per turn, the vendor process (billed to no variant)
    steps: float  # per turn (subs)


def figures(runs: list[Run]) -> Figures:
    latencies = [x for run in runs for x in run.latencies]
    turns = [len(run.latencies) for run in runs]

    def per_turn(value: Callable[[Run], float]) -> float:
        return statistics.median(value(run) / n for run, n in zip(runs, turns, strict=True))

    return Figures(
        turns_per_s=statistics.median(n / run.wall for run, n in zip(runs, turns, strict=True)),
        p50_ms=statistics.median(latencies) * 1000,
        p99_ms=p99(latencies) * 1000,
        cpu_ms=per_turn(lambda r: r.cpu) * 1000,
        total_ms=per_turn(lambda r: r.cpu_total) * 1000,
        vendor_ms=per_turn(lambda r: r.vendor_cpu) * 1000,
        steps=per_turn(lambda r: r.steps),
    )


def report(
    sessions: int,
    turns: int,
    repeat: int,
    rows: dict[str, Figures],
    lg_name: str | None,
    not_measured: str | None,
) -> None:
    print(
        f"{sessions} sessions x {turns} turns, {repeat} repeat(s) (turns/s and CPU: median "
        "of the repeats; latency: over every turn)"
    )
    width = max(len(name) for name in rows)
    print(
        f"  {'variant':<{width}}  {'turns/s':>8}  {'p50 ms':>7}  {'p99 ms':>7}  "
        f"{'cpu ms':>7}  {'all ms':>7}  {'vendor ms':>9}  {'steps/turn':>10}"
    )
    for name, f in rows.items():
        steps = f"{f.steps:10.1f}" if f.steps else ""
        print(
            f"  {name:<{width}}  {f.turns_per_s:8.1f}  {f.p50_ms:7.1f}  {f.p99_ms:7.1f}  "
            f"{f.cpu_ms:7.2f}  {f.total_ms:7.2f}  {f.vendor_ms:9.2f}  {steps}".rstrip()
        )
    lg = rows.get(lg_name) if lg_name else None
    if lg is None:
        print(f"  LangGraph not measured: {not_measured}")
        return
    for name, f in rows.items():
        if name.startswith("subs"):
            print(
                f"  {name} / LangGraph: turns/s {f.turns_per_s / lg.turns_per_s:.2f}x, "
                f"p50 {f.p50_ms / lg.p50_ms:.2f}x, p99 {f.p99_ms / lg.p99_ms:.2f}x, "
                f"cpu {f.cpu_ms / lg.cpu_ms:.2f}x, all {f.total_ms / lg.total_ms:.2f}x"
            )


def project_of(tmp: Path, vendor_url: str, worker_url: str) -> Project:
    """Both subs agents on one engine: the same model and tool, decided by it or a worker."""
    tool = (
        f'name = "{TOOL}", description = "{TOOL_DESCRIPTION}", input = {{ type = "object", '
        'properties = { q = { type = "string" } }, required = ["q"] }'
    )
    text = textwrap.dedent(
        f"""\
        [llm.openai]
        type = "openai"
        base_url = "{vendor_url}/v1"

        [agent.{ENGINE_AGENT}]
        llm = "openai"
        model = "{MODEL}"
        system = "{SYSTEM}"
        tools = [{{ {tool}, handler = "client" }}]

        [agent.{WORKER_AGENT}]
        llm = "openai"
        model = "{MODEL}"
        system = "{SYSTEM}"
        worker = "{worker_url}"
        signing_secret_env = "{SECRET_ENV}"
        tools = [{{ {tool} }}]
        """
    )
    path = tmp / "subs.toml"
    path.write_text(text)
    return parse_project(text, str(path), env={})


async def bench(
    args: argparse.Namespace, redis_url: str, children: tuple[ChildServer, ChildServer], tmp: Path
) -> None:
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)  # as Ctrl-C
    vendor, worker = children
    not_measured = langgraph_missing()
    engine = Engine(
        project_of(tmp, vendor.url, worker.url),
        connect(redis_url),
        env={**ENV, SECRET_ENV: SECRET},
    )
    client_redis = connect(redis_url)  # the clients' own pool, as a separate process would have
    async with contextlib.AsyncExitStack() as stack:
        await engine.start()
        stack.push_async_callback(engine.redis.aclose)
        stack.push_async_callback(engine.stop)
        stack.push_async_callback(client_redis.aclose)
        await engine.leases.wait_owned(engine.store.partitions)
        client = Client(await Store.open(client_redis))
        http = await stack.enter_async_context(aiohttp.ClientSession())
        variants: list[Variant] = [HttpAlone(http, vendor.url)]
        lg_name = None
        if not_measured is None:
            lg = await stack.enter_async_context(
                LangGraph.built(vendor.url, tmp / "langgraph.sqlite", args.lg_durability)
            )
            variants.append(lg)
            lg_name = lg.name
        variants += [
            Subs("subs, engine decides (client tool)", ENGINE_AGENT, client),
            Subs("subs, HTTP worker decides (worker tool)", WORKER_AGENT, client, worker),
        ]
        m = Machine(vendor, client_redis, engine)
        print(
            f"vs_langgraph: a turn is 2 streamed model calls + 1 tool call; {args.words}-word "
            f"answers; LangGraph durability={args.lg_durability}; subs fsync={args.fsync}\n"
            "  cpu: CPU per turn of this process (the clients, the engine, LangGraph and its "
            "SQLite thread)\n"
            "  all: cpu + the redis-server's + the worker process's: what the variant costs "
            "the machine\n"
            "  vendor: the fake vendor process's CPU per turn, in no variant's figures"
        )
        if not_measured is not None:
            print(f"LangGraph not measured: {not_measured}")
        for variant in variants:  # imports, connections, SQLite tables, the engine's caches
            await measure(variant, m, "warmup", 2, 1)
        for sessions in args.sessions:
            runs: dict[str, list[Run]] = {v.name: [] for v in variants}
            for r in range(args.repeat):
                for variant in variants:
                    run = await measure(variant, m, f"n{sessions}-r{r}", sessions, args.turns)
                    runs[variant.name].append(run)
            rows = {name: figures(each) for name, each in runs.items()}
            report(sessions, args.turns, args.repeat, rows, lg_name, not_measured)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sessions",
        type=int,
        nargs="+",
        default=[1, 20, 100],
        help="concurrent sessions, a run each",
    )
    parser.add_argument("--turns", type=int, default=5, help="sequential turns per session")
    parser.add_argument("--repeat", type=int, default=3, help="runs of every variant per N")
    parser.add_argument("--words", type=int, default=20, help="words in the model's answer")
    parser.add_argument(
        "--lg-durability",
        choices=["sync", "async", "exit"],
        default="sync",
        help="LangGraph's checkpoint durability (default %(default)s: saved before going on)",
    )
    parser.add_argument(
        "--fsync",
        choices=["always", "everysec"],
        default=DEFAULT_FSYNC,
        help="the embedded server's appendfsync ([store] fsync; default %(default)s)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="subs-bench-") as tmp:
        server = EmbeddedRedis(Path(tmp) / "redis", fsync=args.fsync)
        vendor = ChildServer(functools.partial(vendor_child, args.words))
        worker = ChildServer(_worker_child)
        try:
            url = server.start()
            vendor.start()
            worker.start()
            vendor.ready()
            worker.ready()
            # Every variant on the loop `subs serve` runs (uvloop): LangGraph gains from it too.
            with asyncio.Runner(loop_factory=new_event_loop) as runner:
                runner.run(bench(args, url, (vendor, worker), Path(tmp)))
        except (KeyboardInterrupt, asyncio.CancelledError):
            print("interrupted", file=sys.stderr)
            return 130
        finally:
            worker.stop()
            vendor.stop()
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
