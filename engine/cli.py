"""The `subs` command (SPEC §15)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import json
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, TextIO

import redis.asyncio as aioredis

from .client import Client, ClientError
from .config import ConfigError, Project, load_project
from .embedded import EmbeddedRedis, EmbeddedRedisError
from .runner import Engine
from .store import Store, connect


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="subs", description="A durable agent engine.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run one turn and stream the reply")
    run.add_argument("agent")
    run.add_argument("message", nargs="?")
    run.add_argument("--session", help="continue this session")
    run.add_argument("--input", help="a ClientInput as JSON instead of a message")
    run.add_argument("-o", "--output", choices=["pretty", "jsonl"], default="pretty")
    run.add_argument("-c", "--config", default="subs.toml")
    run.add_argument("--redis", help="Redis URL (default: the file's, else an embedded server)")
    check = sub.add_parser("check", help="validate subs.toml and list missing env vars")
    check.add_argument("-c", "--config", default="subs.toml")
    sessions = sub.add_parser("sessions", help="list sessions or print a session's events")
    sessions_sub = sessions.add_subparsers(dest="sessions_command", required=True)
    listing = sessions_sub.add_parser("list", help="sessions, newest first")
    listing.add_argument("--limit", type=int, default=50)
    events = sessions_sub.add_parser("events", help="a session's events")
    events.add_argument("session")
    events.add_argument("--from", dest="after", type=int, default=0, help="after this seq")
    events.add_argument("--follow", action="store_true", help="keep printing new events")
    events.add_argument("-o", "--output", choices=["pretty", "jsonl"], default=None)
    for command in (listing, events):
        command.add_argument("-c", "--config", default="subs.toml")
        command.add_argument("--redis", help="Redis URL (default: the file's, else embedded)")
    serve = sub.add_parser("serve", help="run the engine until SIGTERM/SIGINT")
    serve.add_argument("-c", "--config", default="subs.toml")
    serve.add_argument("--redis", help="Redis URL (default: the file's, else an embedded server)")
    return parser


@contextlib.asynccontextmanager
async def _redis_for(project: Project, url: str | None) -> AsyncIterator[aioredis.Redis]:
    """The configured Redis, or a private embedded one under `.subs/` beside the file."""
    url = url or project.redis
    embedded = None
    if url is None:
        embedded = EmbeddedRedis(Path(project.path).parent / ".subs")
        url = await asyncio.to_thread(embedded.start)
    client = connect(url)
    try:
        yield client
    finally:
        await client.aclose()
        if embedded is not None:
            await asyncio.to_thread(embedded.stop)


class _Printer:
    """Pretty output: tokens as they stream, tool calls as compact lines."""

    def __init__(self, out: TextIO, jsonl: bool) -> None:
        self.out = out
        self.jsonl = jsonl
        self.open_line = False

    def write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()
        self.open_line = not text.endswith("\n")

    def line(self, text: str) -> None:
        if self.open_line:
            self.write("\n")
        self.write(text + "\n")

    def delta(self, delta: dict[str, Any]) -> None:
        if self.jsonl:
            self.write(json.dumps({"type": "llm.token.delta", **delta}) + "\n")
        elif delta.get("text"):
            self.write(delta["text"])

    def event(self, event: dict[str, Any]) -> None:
        if self.jsonl:
            self.write(json.dumps(event) + "\n")
            return
        p = event["payload"]
        kind = p["type"]
        if kind == "tool.call.requested":
            self.line(f"→ {p['name']}({_short(p.get('arguments') or '')})")
        elif kind == "tool.call.errored" and p.get("final"):
            self.line(f"✗ {p['error']['message']}")
        elif kind == "llm.call.errored" and not p.get("final"):
            self.line(f"… retrying: {p['error']['message']}")


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


async def _answer_client_tool(client: Client, sid: str, payload: dict[str, Any]) -> None:
    """A client tool runs here, at the keyboard: ask, and send the answer back."""
    question = payload.get("arguments") or "{}"
    with contextlib.suppress(ValueError, AttributeError):
        question = json.loads(question).get("question", question)
    sys.stderr.write(f"{payload['name']}: {question}\n> ")
    sys.stderr.flush()
    answer = await asyncio.to_thread(sys.stdin.readline)
    if answer:
        body = {"type": "tool.result", "id": payload["id"], "result": answer.rstrip("\n")}
    else:
        body = {"type": "tool.error", "id": payload["id"], "error": "no answer", "retryable": False}
    await client.submit(body, session_id=sid)


async def _run(args: argparse.Namespace) -> int:
    project = load_project(args.config)
    if args.agent not in project.agents:
        declared = ", ".join(sorted(project.agents)) or "none"
        print(
            f"subs: no agent {args.agent!r} in {project.path}; declared: {declared}",
            file=sys.stderr,
        )
        return 2
    if args.input:
        payload = json.loads(args.input)
        payload.setdefault("agent_id", args.agent)
    elif args.message is not None:
        message = {"role": "user", "content": args.message}
        # Queued: a turn still running in this session (say, one a killed run left
        # behind) finishes first, then this one runs.
        payload = {
            "type": "client.message",
            "agent_id": args.agent,
            "message": message,
            "queue": True,
        }
    else:
        print("subs run: give a message or --input", file=sys.stderr)
        return 2
    printer = _Printer(sys.stdout, args.output == "jsonl")
    async with _redis_for(project, args.redis) as redis:
        engine = Engine(project, redis, lease_ms=_lease_ms())
        await engine.start()
        try:
            return await _one_turn(engine, payload, args, printer)
        finally:
            await engine.stop()


async def _one_turn(
    engine: Engine, payload: dict[str, Any], args: argparse.Namespace, printer: _Printer
) -> int:
    client = Client(engine.store)
    sid = args.session
    after = 0
    cursor = "0-0"
    if sid:
        events = await client.events(sid)
        after = events[-1]["seq"] if events else 0
        cursor = await client.delta_cursor(sid)
    identity = {"subject": {"issuer": "cli", "id": getpass.getuser()}, "metadata": {}}
    reply = await client.submit(payload, session_id=sid, identity=identity)
    sid, turn_id = reply["session_id"], reply["turn_id"]
    if not printer.jsonl:
        waiting = " (queued behind the running turn)" if reply.get("queued") else ""
        print(f"session {sid}{waiting}", file=sys.stderr, flush=True)
    client_calls: dict[str, dict[str, Any]] = {}
    ours: set[str] = set()  # model calls of this turn: only their tokens are printed
    early: dict[str, list[dict[str, Any]]] = {}  # deltas read before their call's event
    async for kind, item in client.follow(sid, after, delta_cursor=cursor):
        if kind == "delta":
            if item["call_id"] in ours:
                printer.delta(item)
            else:
                early.setdefault(item["call_id"], []).append(item)
            continue
        p = item["payload"]
        if item.get("turn_id") != turn_id:
            if printer.jsonl:
                printer.event(item)
            continue
        printer.event(item)
        if p["type"] == "llm.call.requested":
            ours.add(p["id"])
            for delta in early.pop(p["id"], ()):
                printer.delta(delta)
        elif p["type"] == "tool.call.requested" and p["handler"] == "client":
            client_calls[p["id"]] = p
        elif p["type"] == "tool.call.dispatched" and p["id"] in client_calls:
            await _answer_client_tool(client, sid, client_calls.pop(p["id"]))
        elif p["type"] in ("turn.completed", "turn.failed"):
            if not printer.jsonl:
                printer.line("")
                print(f'continue: subs run {args.agent} "..." --session {sid}', file=sys.stderr)
            if p["type"] == "turn.failed":
                print(f"subs: the turn failed: {p['error']['message']}", file=sys.stderr)
                return 1
            return 0
    return 1


def _lease_ms() -> int:
    """Lease length; short in tests that kill engines on purpose."""
    return int(os.environ.get("SUBS_LEASE_MS", "10000"))


async def _serve(args: argparse.Namespace) -> int:
    project = load_project(args.config)
    async with _redis_for(project, args.redis) as redis:
        engine = Engine(project, redis, lease_ms=_lease_ms())
        await engine.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        deciders = ", ".join(
            f"{a.id} ({'worker ' + a.worker if a.worker else 'engine'})"
            for a in project.agents.values()
        )
        where = args.redis or project.redis or "embedded redis under .subs/"
        missing = ", ".join(m.var for m in project.missing_env(os.environ)) or "none"
        print(
            f"subs: engine {engine.owner} on {where}; agents: {deciders}; missing env: {missing}",
            file=sys.stderr,
            flush=True,
        )
        await stop.wait()
        await engine.stop()
    return 0


def _check(args: argparse.Namespace) -> int:
    """Exit 1 when the file is wrong or an environment variable it needs is missing."""
    project = load_project(args.config)
    missing = project.missing_env(os.environ)
    if sys.stdout.isatty():
        agents = ", ".join(
            f"{a.id} ({'worker' if a.worker else 'engine'})" for a in project.agents.values()
        )
        print(f"{project.path}: ok; agents: {agents or 'none'}")
        for m in missing:
            print(f"missing {m.var}: needed by {m.needed_by} ({m.why})")
    else:
        for m in missing:
            print(json.dumps({"missing": m.var, "needed_by": m.needed_by, "why": m.why}))
    return 1 if missing else 0


async def _sessions(args: argparse.Namespace) -> int:
    project = load_project(args.config)
    async with _redis_for(project, args.redis) as redis:
        store = await Store.open(redis)
        if args.sessions_command == "list":
            for sid in await store.list_sessions(0, args.limit):
                print(sid)
            return 0
        client = Client(store)
        jsonl = args.output == "jsonl" or (args.output is None and not sys.stdout.isatty())
        events = await client.events(args.session, args.after)
        if not events and args.after == 0 and not args.follow:
            print(f"subs: no session {args.session!r}", file=sys.stderr)
            return 1
        for event in events:
            _print_event(event, jsonl)
        if args.follow:
            after = events[-1]["seq"] if events else args.after
            async for _, event in client.follow(args.session, after):
                _print_event(event, jsonl)
    return 0


def _print_event(event: dict[str, Any], jsonl: bool) -> None:
    if jsonl:
        print(json.dumps(event), flush=True)
        return
    p = event["payload"]
    detail = {k: v for k, v in p.items() if k != "type"}
    text = json.dumps(detail, ensure_ascii=False)
    print(
        f"{event['seq']:>5} {event['occurred_at']} {p['type']:<26} {_short(text, 120)}", flush=True
    )


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=os.environ.get("SUBS_LOG", "WARNING"), stream=sys.stderr)
    args = _parser().parse_args(argv)
    try:
        if args.command == "check":
            return _check(args)
        runs = {"serve": _serve, "run": _run, "sessions": _sessions}
        return asyncio.run(runs[args.command](args))
    except ConfigError as err:
        print(f"subs: {err}", file=sys.stderr)
        return 2
    except (ClientError, EmbeddedRedisError) as err:
        print(f"subs: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
