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
from typing import Any

import redis.asyncio as aioredis
from aiohttp import web

from bot.app import start_bots
from bot.manifest import events_path, manifest, to_yaml

from .api import ApiKeys, ApiKeysError, bind_warning, check_bind, make_app
from .client import Client, ClientError
from .config import ConfigError, Project, load_project, slack_env_suffix
from .console import Printer, short, watch_turn
from .embedded import EmbeddedRedis, EmbeddedRedisError, supervise
from .http_client import HttpClient
from .machine import iso
from .metrics import Metrics
from .redact import Redactor, env_secrets, project_secrets, redact_url
from .runner import Engine
from .store import Store, connect

# Masks secrets in every log record (installed by `main`) and in the errors `main` prints.
REDACTOR = Redactor()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="subs", description="A durable agent engine.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run one turn and stream the reply")
    run.add_argument("agent")
    run.add_argument("message", nargs="?")
    run.add_argument("--session", help="continue this session")
    run.add_argument("--input", help="a ClientInput as JSON instead of a message")
    run.add_argument(
        "-o",
        "--output",
        choices=["pretty", "jsonl"],
        help="default: pretty on a terminal, else jsonl",
    )
    run.add_argument("-c", "--config", default="subs.toml")
    run.add_argument("--redis", help="Redis URL (default: the file's, else an embedded server)")
    run.add_argument("--url", help="drive a remote engine through its HTTP API instead")
    chat = sub.add_parser("chat", help="talk to an agent interactively")
    chat.add_argument("agent")
    chat.add_argument("--session", help="continue this session")
    chat.add_argument("-c", "--config", default="subs.toml")
    chat.add_argument("--redis", help="Redis URL (default: the file's, else an embedded server)")
    chat.add_argument("--url", help="talk to a remote engine through its HTTP API")
    check = sub.add_parser("check", help="validate subs.toml and list missing env vars")
    check.add_argument("-c", "--config", default="subs.toml")
    sessions = sub.add_parser("sessions", help="list sessions or print a session's events")
    sessions_sub = sessions.add_subparsers(dest="sessions_command", required=True)
    listing = sessions_sub.add_parser("list", help="sessions, newest first")
    listing.add_argument("--limit", type=int, default=50)
    dead = sessions_sub.add_parser(
        "dead",
        help="inputs the engine could not apply (each failed its session's turn), newest first",
    )
    dead.add_argument("--limit", type=int, default=100)
    events = sessions_sub.add_parser("events", help="a session's events")
    events.add_argument("session")
    events.add_argument("--from", dest="after", type=int, default=0, help="after this seq")
    events.add_argument("--follow", action="store_true", help="keep printing new events")
    events.add_argument("-o", "--output", choices=["pretty", "jsonl"], default=None)
    cancel = sessions_sub.add_parser("cancel", help="end a session's running turn")
    cancel.add_argument("session")
    cancel.add_argument("--reason", help="recorded in the turn's error")
    delete = sessions_sub.add_parser("delete", help="remove an idle session and its history")
    delete.add_argument("session")
    for command in (listing, dead, events, cancel, delete):
        command.add_argument("-c", "--config", default="subs.toml")
        command.add_argument("--redis", help="Redis URL (default: the file's, else embedded)")
        command.add_argument("--url", help="read from a remote engine's HTTP API instead")
    serve = sub.add_parser("serve", help="run the engine until SIGTERM/SIGINT")
    serve.add_argument("-c", "--config", default="subs.toml")
    serve.add_argument("--redis", help="Redis URL (default: the file's, else an embedded server)")
    serve.add_argument("--host", help="address to bind (default: [serve] host)")
    serve.add_argument("--port", type=int, help="port to bind, 0 for any (default: [serve] port)")
    man = sub.add_parser("manifest", help="print an agent's Slack app manifest")
    man.add_argument("agent")
    man.add_argument("-c", "--config", default="subs.toml")
    transport = man.add_mutually_exclusive_group()
    transport.add_argument(
        "--socket-mode",
        action="store_true",
        default=None,
        help="default when SLACK_APP_TOKEN_<AGENT> is set",
    )
    transport.add_argument(
        "--url", help="public base URL for request URLs (default: http://[serve] host:port)"
    )
    return parser


@contextlib.asynccontextmanager
async def _redis_url(project: Project, url: str | None) -> AsyncIterator[str]:
    """The configured Redis's URL, or that of a private embedded one under `.subs/`
    beside the file, running (restarted on the same AOF whenever it dies) until the
    block ends."""
    url = url or project.redis
    if url is not None:
        yield url
        return
    embedded = EmbeddedRedis(Path(project.path).parent / ".subs", fsync=project.store.fsync)
    address = await asyncio.to_thread(embedded.start)
    supervisor = asyncio.create_task(supervise(embedded), name="subs-embedded-redis")
    try:
        yield address
    finally:
        supervisor.cancel()  # first, or it would restart the server stopped below
        with contextlib.suppress(asyncio.CancelledError):
            await supervisor
        await asyncio.to_thread(embedded.stop)


@contextlib.asynccontextmanager
async def _redis_for(project: Project, url: str | None) -> AsyncIterator[aioredis.Redis]:
    """One client (one pool) on the configured or embedded Redis."""
    async with _redis_url(project, url) as address, connect(address) as client:
        yield client


def _load(args: argparse.Namespace) -> Project:
    """The project, its secrets (and those in `--redis`) known to the redactor from now on."""
    project = load_project(args.config)
    REDACTOR.add(project_secrets(project, os.environ, getattr(args, "redis", None)))
    return project


def _identity() -> dict[str, Any]:
    return {"subject": {"issuer": "cli", "id": getpass.getuser()}, "metadata": {}}


def _message(agent: str, text: str) -> dict[str, Any]:
    # Queued: a turn still running in this session (say, one a killed run left
    # behind) finishes first, then this one runs.
    message = {"role": "user", "content": text}
    return {"type": "client.message", "agent_id": agent, "message": message, "queue": True}


@contextlib.asynccontextmanager
async def _remote(url: str) -> AsyncIterator[HttpClient]:
    """A remote engine's HTTP API, with the key from `SUBS_API_KEY`."""
    key = os.environ.get("SUBS_API_KEY")
    client = HttpClient(url, key)
    try:
        yield client
    except ClientError as err:
        if err.status != 401:
            raise
        message = _key_refused(url, err.message, key)
        raise ClientError(message, code=err.code, status=401, detail={}) from None
    finally:
        await client.aclose()


def _key_refused(url: str, reason: str, key: str | None) -> str:
    """A remote engine's 401 as something to do: the CLI's key comes from SUBS_API_KEY."""
    if not key:
        fix = "SUBS_API_KEY is not set: set it to one of the keys in the server's SUBS_API_KEYS"
    else:
        fix = "the key in SUBS_API_KEY is not one of the server's SUBS_API_KEYS: set it to one"
    return f"{url} refused the request ({reason}); {fix}"


@contextlib.asynccontextmanager
async def _session_client(args: argparse.Namespace) -> AsyncIterator[Any]:
    """A remote engine's HTTP API with `--url`, else an engine in this process."""
    if getattr(args, "url", None):
        async with _remote(args.url) as client:
            yield client
        return
    project = _load(args)
    if args.agent not in project.agents:
        declared = ", ".join(sorted(project.agents)) or "none"
        raise _Usage(f"no agent {args.agent!r} in {project.path}; declared: {declared}")
    async with _engine_client(project, args.redis) as client:
        yield client


@contextlib.asynccontextmanager
async def _engine_client(project: Project, redis_url: str | None) -> AsyncIterator[Client]:
    """A client with an engine in this process to apply what it submits (another engine
    on the same Redis may answer instead: whichever owns the session's partition)."""
    async with _redis_for(project, redis_url) as redis:
        engine = Engine(project, redis, lease_ms=_lease_ms())
        await engine.start()
        try:
            yield Client(engine.store)
        finally:
            await engine.stop()


class _Usage(Exception):
    """A command-line mistake: exit 2 with this message."""


async def _run(args: argparse.Namespace) -> int:
    if args.input:
        payload = json.loads(args.input)
        payload.setdefault("agent_id", args.agent)
    elif args.message is not None:
        payload = _message(args.agent, args.message)
    else:
        raise _Usage("subs run: give a message or --input")
    printer = Printer(sys.stdout, _jsonl(args.output), sys.stderr)

    def announce(sid: str, queued: bool) -> None:
        if not printer.jsonl:
            waiting = " (queued behind the running turn)" if queued else ""
            print(f"session {sid}{waiting}", file=sys.stderr, flush=True)

    async with _session_client(args) as client:
        outcome = await watch_turn(
            client,
            payload,
            printer,
            session_id=args.session,
            identity=_identity(),
            on_session=announce,
        )
    if not printer.jsonl:
        print(
            f'continue: subs run {args.agent} "..." --session {outcome.session_id}', file=sys.stderr
        )
    if outcome.status == "failed":
        print(f"subs: the turn failed: {outcome.error}", file=sys.stderr)
        return 1
    return 0 if outcome.status == "completed" else 1


async def _read_message() -> str | None:
    """One message from the keyboard; a line ending in a backslash continues it."""
    lines: list[str] = []
    prompt = "you> "
    while True:
        line = await asyncio.to_thread(_input, prompt)
        if line is None:
            return None if not lines else "\n".join(lines)
        if line.endswith("\\"):
            lines.append(line[:-1])
            prompt = "...> "
            continue
        lines.append(line)
        return "\n".join(lines)


def _input(prompt: str) -> str | None:
    try:
        return input(prompt)
    except EOFError:
        return None


async def _chat(args: argparse.Namespace) -> int:
    """Talk to an agent; Ctrl-C stops watching a turn (it goes on), Ctrl-D leaves."""
    with contextlib.suppress(ImportError):
        import readline  # noqa: F401  (line editing and history for input())
    printer = Printer(sys.stdout, False, sys.stderr)
    sid = args.session
    async with _session_client(args) as client:
        while True:
            text = await _read_message()
            if text is None:
                break
            if not text.strip():
                continue
            watching = asyncio.create_task(
                watch_turn(
                    client,
                    _message(args.agent, text),
                    printer,
                    session_id=sid,
                    identity=_identity(),
                )
            )
            try:
                outcome = await watching
            except asyncio.CancelledError:
                # Ctrl-C cancelled us: stop watching, keep the session (and the turn) going.
                current = asyncio.current_task()
                if current is not None:
                    current.uncancel()
                watching.cancel()
                print("\n(stopped watching; the turn goes on)", file=sys.stderr)
                continue
            sid = outcome.session_id
            if outcome.status == "failed":
                print(f"subs: the turn failed: {outcome.error}", file=sys.stderr)
    if sid:
        print(f"session {sid}", file=sys.stderr)
    return 0


def _lease_ms() -> int:
    """Lease length; short in tests that kill engines on purpose."""
    return int(os.environ.get("SUBS_LEASE_MS", "10000"))


def _engine_socket_timeout(project: Project) -> float:
    """Longer than any command the engine waits on (a 2 s work read, a WAIT), so only a
    Redis that stopped answering trips it; short, since each dead connection costs it once."""
    return 5.0 + project.store.wait_timeout_ms / 1000


async def _serve(args: argparse.Namespace) -> int:
    """Engine and HTTP API in one process, until SIGTERM/SIGINT (SPEC §15)."""
    project = _load(args)
    host = args.host or project.serve.host
    port = project.serve.port if args.port is None else args.port
    try:
        keys = ApiKeys.from_env(os.environ)
    except ApiKeysError as err:
        raise _Usage(str(err)) from None
    refusal = check_bind(host, keys)
    if refusal is not None:
        raise _Usage(refusal)
    # Two pools on one server: whatever the API and the bots wait on (submits, event
    # streams), the engine's leases, commits and timers always find a connection.
    async with (
        _redis_url(project, args.redis) as url,
        connect(
            url, name="subs-engine", socket_timeout=_engine_socket_timeout(project)
        ) as engine_redis,
        connect(url, name="subs-api") as api_redis,
    ):
        metrics = Metrics()
        engine = Engine(project, engine_redis, lease_ms=_lease_ms(), metrics=metrics)
        await engine.start()
        store = await Store.open(api_redis)
        client = Client(store)
        # The agents whose Slack tokens are set; a dead serve's turns move after one lease.
        bots = start_bots(project, client, os.environ, lease_ms=_lease_ms(), owner=engine.owner)
        await bots.start()  # connects the Socket Mode bots (SLACK_APP_TOKEN_<AGENT>)
        app = make_app(
            client,
            store,
            keys=keys,
            metrics=metrics,
            cors_origins=project.serve.cors_origins,
            max_streams_per_key=project.serve.max_streams_per_key,
        )
        app.add_routes(bots.routes())  # POST /slack/<agent>/events
        runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=3)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0]
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        deciders = ", ".join(
            f"{a.id} ({'worker ' + redact_url(a.worker) if a.worker else 'engine'})"
            for a in project.agents.values()
        )
        configured = args.redis or project.redis
        where = redact_url(configured) if configured else "embedded redis under .subs/"
        missing = ", ".join(m.var for m in project.missing_env(os.environ)) or "none"
        slack = ", ".join(bots.describe()) or "none"
        print(
            f"subs: engine {engine.owner} on {where}; api http://{bound[0]}:{bound[1]}; "
            f"agents: {deciders}; slack: {slack}; missing env: {missing}",
            file=sys.stderr,
            flush=True,
        )
        warning = bind_warning(host, keys)
        if warning:
            print(f"subs: {warning}", file=sys.stderr, flush=True)
        await stop.wait()
        # Stop taking requests (open streams end), then hand back partitions and calls.
        await runner.cleanup()
        await bots.aclose()
        await engine.stop()
    return 0


def _check(args: argparse.Namespace) -> int:
    """Exit 1 when the file is wrong or an environment variable it needs is missing."""
    project = _load(args)
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


def _manifest(args: argparse.Namespace) -> int:
    """Print the agent's Slack app manifest; the transport follows the environment by default."""
    project = _load(args)
    agent = project.agents.get(args.agent)
    if agent is None:
        declared = ", ".join(sorted(project.agents)) or "none"
        raise _Usage(f"no agent {args.agent!r} in {project.path}; declared: {declared}")
    if agent.slack is None:
        raise _Usage(f"agent {agent.id!r} has no [agent.{agent.id}.slack] block in {project.path}")
    socket_mode = args.socket_mode
    if socket_mode is None:
        socket_mode = args.url is None and bool(
            os.environ.get(f"SLACK_APP_TOKEN_{slack_env_suffix(agent.id)}")
        )
    url = None
    if not socket_mode:
        base = args.url or f"http://{project.serve.host}:{project.serve.port}"
        scheme = base.partition("://")[0]
        if scheme not in ("http", "https") or not base.partition("://")[2]:
            raise _Usage(f"--url must be an http(s) URL, got {base!r}")
        if scheme != "https":
            print("subs: Slack only calls public https URLs; pass --url", file=sys.stderr)
        url = base.rstrip("/") + events_path(agent.id)
    print(to_yaml(manifest(agent, socket_mode=socket_mode, request_url=url)), end="")
    return 0


@contextlib.asynccontextmanager
async def _reader(args: argparse.Namespace) -> AsyncIterator[Any]:
    """Read sessions from a remote engine (`--url`) or straight from Redis."""
    if args.url:
        async with _remote(args.url) as client:
            yield client
        return
    project = _load(args)
    async with _redis_for(project, args.redis) as redis:
        yield Client(await Store.open(redis))


async def _cancel(args: argparse.Namespace) -> int:
    """Cancelling is an input: an engine applies it (a remote one, or one started here)."""
    if args.url:
        async with _remote(args.url) as remote:
            reply = await remote.cancel(args.session, args.reason)
    else:
        async with _engine_client(_load(args), args.redis) as client:
            reply = await client.cancel(args.session, args.reason)
    print(f"subs: cancelled turn {reply['turn_id']} of session {args.session}", file=sys.stderr)
    return 0


async def _sessions(args: argparse.Namespace) -> int:
    if args.sessions_command == "cancel":
        return await _cancel(args)
    async with _reader(args) as client:
        if args.sessions_command == "delete":
            await client.delete(args.session)
            print(f"subs: deleted session {args.session}", file=sys.stderr)
            return 0
        if args.sessions_command == "list":
            for row in await client.sessions(0, args.limit):
                print(row if isinstance(row, str) else row["session_id"])
            return 0
        if args.sessions_command == "dead":
            for letter in await client.dead_letters(args.limit):
                print(_dead_letter_line(letter))
            return 0
        jsonl = _jsonl(args.output)
        events = await client.events(args.session, args.after)
        if not events and args.after == 0 and not args.follow:
            print(f"subs: no session {args.session!r}", file=sys.stderr)
            return 1
        for event in events:
            _print_event(event, jsonl)
        if args.follow:
            after = events[-1]["seq"] if events else args.after
            async for kind, event in client.follow(args.session, after):
                if kind == "event":
                    _print_event(event, jsonl)
    return 0


def _dead_letter_line(letter: dict[str, Any]) -> str:
    """`<time> <session> <input kind> (<n> deliveries): <reason>`: one line to act on."""
    when = iso(int(letter.get("at_ms", 0)))
    body = letter.get("input") or {}
    kind = body.get("kind", "?")
    if kind == "client":
        kind = f"client {(body.get('input') or {}).get('type', '?')}"
    deliveries = letter.get("deliveries", 1)
    return f"{when} {letter['session_id']} {kind} ({deliveries}x): {letter.get('reason', '')}"


def _jsonl(output: str | None) -> bool:
    """JSON lines when asked, or by default when stdout is not a terminal."""
    return output == "jsonl" or (output is None and not sys.stdout.isatty())


def _print_event(event: dict[str, Any], jsonl: bool) -> None:
    if jsonl:
        print(json.dumps(event), flush=True)
        return
    p = event["payload"]
    detail = {k: v for k, v in p.items() if k != "type"}
    text = json.dumps(detail, ensure_ascii=False)
    print(
        f"{event['seq']:>5} {event['occurred_at']} {p['type']:<26} {short(text, 120)}", flush=True
    )


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=os.environ.get("SUBS_LOG", "WARNING"), stream=sys.stderr)
    REDACTOR.add(env_secrets(os.environ))
    REDACTOR.install()
    args = _parser().parse_args(argv)
    try:
        if args.command == "check":
            return _check(args)
        if args.command == "manifest":
            return _manifest(args)
        runs = {"serve": _serve, "run": _run, "chat": _chat, "sessions": _sessions}
        return asyncio.run(runs[args.command](args))
    except (ConfigError, _Usage) as err:
        print(f"subs: {REDACTOR.scrub(str(err))}", file=sys.stderr)
        return 2
    except (ClientError, EmbeddedRedisError) as err:
        print(f"subs: {REDACTOR.scrub(str(err))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
