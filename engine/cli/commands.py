"""What the `subs` commands do (engine/cli/parser.py parses their arguments first).

Every failure a person can fix ends here as one line naming the problem and what to
do next, with a non-zero exit: 2 for a mistake on the command line, 1 for the rest.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import errno
import fcntl
import getpass
import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

from engine.cli.text import short
from engine.errors import ClientError, SubsError, describe
from engine.redact import Redactor, env_secrets, redact_url

# The engine, Redis, Slack, MCP and the config's models are imported by the functions
# that use them: `subs sessions list --url` needs none of them, and would wait for them.
if TYPE_CHECKING:
    from engine.cli.remote import HttpClient
    from engine.client import Client
    from engine.config import Project
    from engine.session_client import SessionClient, SessionRow
    from engine.store.store import RedisClient

# Masks secrets in every log record (installed by `run_command`) and in the errors it prints.
REDACTOR = Redactor()
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
REDIS_CHECK_SECONDS = 5.0  # a Redis that does not answer PING by then is reported, not waited on
SERVE_LOCK = "serve.lock"


class Usage(SubsError):
    """A command-line mistake: exit 2 with this message."""

    code = "usage"
    exit_status = 2


def _data_dir(project: Project) -> Path:
    """`.subs/` beside the project file, made if missing: the embedded Redis's home."""
    path = Path(project.path).resolve().parent / ".subs"
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        probe = path / ".write-test"
        probe.touch()
        probe.unlink()
    except OSError as err:
        raise SubsError(
            f"cannot use {path} for the embedded Redis ({err.strerror or err}): run subs "
            "from a folder you can write to, or give it a Redis with --redis or SUBS_REDIS"
        ) from None
    return path


StoreProblem = Callable[[], str | None]  # why the store is degraded though it answers


@contextlib.asynccontextmanager
async def _redis_url(project: Project, url: str | None) -> AsyncIterator[tuple[str, StoreProblem]]:
    """The configured Redis's URL, or that of a private embedded one under `.subs/`
    beside the file, running (restarted on the same AOF whenever it dies, its folder
    made again if it vanishes) until the block ends; with what its supervisor knows."""
    from engine.store.embedded import EmbeddedRedis, EmbeddedRedisError
    from engine.store.supervisor import Supervisor

    url = url or project.redis
    if url is not None:
        yield url, lambda: None
        return
    embedded = EmbeddedRedis(
        _data_dir(project),
        fsync=project.store.fsync,
        maxmemory=project.store.max_memory_bytes(),
    )
    try:
        address = await asyncio.to_thread(embedded.start)
    except OSError as err:
        raise EmbeddedRedisError(
            f"cannot start the embedded Redis in {embedded.data_dir} ({err.strerror or err}); "
            "give subs a Redis with --redis or SUBS_REDIS"
        ) from None
    supervisor = Supervisor(embedded)
    supervising = asyncio.create_task(supervisor.run(), name="subs-embedded-redis")
    try:
        yield address, lambda: supervisor.problem
    finally:
        supervising.cancel()  # first, or it would restart the server stopped below
        with contextlib.suppress(asyncio.CancelledError):
            await supervising
        await asyncio.to_thread(embedded.stop)


async def _reachable(redis: RedisClient, url: str, project: Project) -> None:
    """Fail now, naming the server, when Redis does not answer: not later, in a retry loop.
    One that answers LOADING (just restarted, reading its AOF) is waited for: said once."""
    from engine.store.store import unreachable

    def loading() -> None:
        print(f"subs: Redis at {redact_url(url)} is loading its data; waiting", file=sys.stderr)

    why = await unreachable(redis, REDIS_CHECK_SECONDS, on_loading=loading)
    if why is not None:
        raise SubsError(
            f"cannot reach Redis at {redact_url(url)} ({why}): start it, or fix --redis, "
            f"SUBS_REDIS or `redis` in {project.path} (leave all unset for an embedded one)"
        )


@contextlib.asynccontextmanager
async def _redis_for(project: Project, url: str | None) -> AsyncIterator[RedisClient]:
    """One client (one pool) on the configured or embedded Redis."""
    from engine.store.store import connect

    async with _redis_url(project, url) as (address, _), connect(address) as client:
        await _reachable(client, address, project)
        yield client


def _load(args: argparse.Namespace) -> Project:
    """The project, its secrets (and those in `--redis`) known to the redactor from now on."""
    from engine.config import load_project, project_secrets

    redis = getattr(args, "redis", None)
    if redis is not None and urlsplit(redis).scheme not in ("redis", "rediss", "unix"):
        raise Usage(
            f"--redis must be a redis://, rediss:// or unix:// URL, got {redact_url(redis)!r} "
            "(e.g. --redis redis://127.0.0.1:6379/0)"
        )
    project = load_project(args.config)
    REDACTOR.add(project_secrets(project, os.environ, redis))
    return project


def _load_priced(args: argparse.Namespace) -> Project:
    """The project to serve or check: an agent with a limit in USD needs its model's price
    (a cost it cannot count would never stop it), so one without is a ConfigError."""
    from engine.config import ConfigError
    from engine.effects.llm.prices import unpriced

    project = _load(args)
    for key, why in unpriced(project):
        raise ConfigError(why, file=project.path, key=key)
    return project


def _http_url(url: str) -> str:
    """`--url` as given, when it is one: a bare `host:port` would fail later, less clearly."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise Usage(
            f"--url must start with http:// or https://, got {url!r} "
            f"(e.g. --url http://{url if '://' not in url else '127.0.0.1:8080'})"
        )
    return url


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
    from engine.cli.remote import HttpClient

    key = os.environ.get("SUBS_API_KEY")
    if key is not None and (not key.isprintable() or " " in key):
        raise Usage("SUBS_API_KEY holds a space or a control character: set it to the key alone")
    # A dead engine is said within seconds: a refused or unanswered connection in 3 s, a
    # stream gone silent (no ping for three of the engine's 15 s heartbeats) in 45 s.
    client = HttpClient(_http_url(url), key, connect_timeout=3.0, stream_silence=45.0)
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
async def _session_client(args: argparse.Namespace) -> AsyncIterator[SessionClient]:
    """A remote engine's HTTP API with `--url`, else an engine in this process. An
    agent that is not there is a command-line mistake either way (exit 2)."""
    if getattr(args, "url", None):
        try:
            async with _remote(args.url) as client:
                yield client
        except ClientError as err:
            if err.code != "unknown_agent":
                raise
            raise Usage(f"{args.url}: {err.message}") from None
        return
    project = _load(args)
    if args.agent not in project.agents:
        declared = ", ".join(sorted(project.agents)) or "none"
        raise Usage(f"no agent {args.agent!r} in {project.path}; declared: {declared}")
    async with _engine_client(project, args.redis) as client:
        yield client


@contextlib.asynccontextmanager
async def _engine_client(project: Project, redis_url: str | None) -> AsyncIterator[Client]:
    """A client with an engine in this process to apply what it submits (another engine
    on the same Redis may answer instead: whichever owns the session's partition)."""
    from engine.client import Client
    from engine.runtime.engine import Engine

    async with _redis_for(project, redis_url) as redis:
        engine = Engine(project, redis, lease_ms=_lease_ms())
        await engine.start()
        try:
            yield Client(engine.store)
        finally:
            await engine.stop()


def _client_input(args: argparse.Namespace) -> dict[str, Any]:
    """`--input`, checked here as the API would check it: one error naming the field."""
    from engine.client import validate_client_input

    example = (
        """--input '{"type": "client.message", "message": {"role": "user", "content": "hi"}}'"""
    )
    try:
        payload = json.loads(args.input)
    except json.JSONDecodeError as err:
        raise Usage(
            f"--input is not JSON ({err.msg} at column {err.colno}); e.g. {example}"
        ) from None
    if not isinstance(payload, dict):
        raise Usage(f"--input must be a JSON object (a ClientInput); e.g. {example}")
    payload.setdefault("agent_id", args.agent)
    try:
        validate_client_input(payload)
    except ClientError as err:
        raise Usage(f"--input: {err.message}; e.g. {example}") from None
    return payload


def _console_link(args: argparse.Namespace) -> Callable[[str], str] | None:
    """A session's console page: on the `--url` engine, else at `[serve] public_url`.
    None without either: the engine runs in this process, and serves no console."""
    if getattr(args, "url", None):
        base = _http_url(args.url).rstrip("/")
        return lambda sid: f"{base}/console/sessions/{quote(sid, safe='')}"
    serve = _load(args).serve
    return serve.console_url if serve.public_url else None


class _CtrlC:
    """Ctrl-C cancels the command's task, wherever it waits (a prompt, a stream, a lost
    engine), every time, so the command can say how to pick the session up; once it is
    on its way out, more Ctrl-C are ignored: the engine in this process is handing back
    its work and must not be cut off half-way."""

    def __init__(self) -> None:
        self.task = asyncio.current_task()
        self.leaving = False
        self.loop = asyncio.get_running_loop()
        # Not in the main thread: asyncio's own handling (the first Ctrl-C cancels).
        with contextlib.suppress(RuntimeError, ValueError):
            self.loop.add_signal_handler(signal.SIGINT, self._hit)

    def _hit(self) -> None:
        if not self.leaving and self.task is not None:
            self.task.cancel()

    def caught(self) -> None:
        """The cancel was Ctrl-C, and is handled: the task goes on (to its way out)."""
        if self.task is not None:
            self.task.uncancel()


def _say_when_lost(client: Any, printer: Any | None) -> None:
    """A remote engine that stops answering is said within seconds, and when it is back
    (through the terminal `printer`, which clears its status line first; else on stderr)."""
    from engine.cli.remote import HttpClient

    if not isinstance(client, HttpClient):
        return
    url = client.base_url

    def say(text: str) -> None:
        if printer is not None:
            printer.notice(text)
        else:
            print(text, file=sys.stderr, flush=True)

    def lost(err: ClientError) -> None:
        why = err.detail.get("error") or "no answer"
        say(f"subs: cannot reach the engine at {url} ({why}); still trying (Ctrl-C stops)")

    client.on_lost = lost
    client.on_back = lambda: say(f"subs: the engine at {url} answers again")


def _pick_up(command: str, agent: str, sid: str | None, remote: bool, *, asked: bool) -> str:
    """The line Ctrl-C leaves: what happens to the turn, and the command that resumes it."""
    if sid is None:
        return "subs: stopped before a session was made"
    if asked:
        what = "the turn waits for your answer, and asks again"
    elif remote:
        what = "the turn goes on in the engine"
    else:
        what = "the turn is kept, and goes on once an engine runs (subs serve, or"
        return f"subs: stopped; {what} this): subs {command} {agent} --session {sid}"
    return f"subs: stopped; {what}: subs {command} {agent} --session {sid}"


async def _run(args: argparse.Namespace) -> int:
    from engine.cli.keyboard import keyboard
    from engine.cli.terminal import (
        OpenTurn,
        Printer,
        TurnOutcome,
        finish_open_turn,
        require_session,
        watch_turn,
    )

    payload: dict[str, Any] | None = None
    if args.input:
        payload = _client_input(args)
    elif args.message is not None:
        payload = _message(args.agent, args.message)
    elif not args.session:
        raise Usage(
            'give a message or --input, e.g. subs run oncall "what\'s paging?" '
            "(or --session ID alone, to pick up a session's running turn)"
        )
    printer = Printer(sys.stdout, _jsonl(args.output), sys.stderr)
    console = _console_link(args)
    sid: str | None = args.session
    sent = payload is None  # nothing to send, or sent
    ctrl_c = _CtrlC()

    def announce(session: str, queued: bool) -> None:
        nonlocal sid
        sid = session
        if not printer.jsonl:
            waiting = " (queued behind the running turn)" if queued else ""
            print(f"session {session}{waiting}", file=sys.stderr)
            if console is not None:
                print(f"console: {console(session)}", file=sys.stderr, flush=True)

    def waiting_on(turn: OpenTurn) -> None:
        if printer.jsonl:
            return
        announce(args.session, False)
        later = "; your message is sent once it ends, as the next turn" if not sent else ""
        print(f"its turn {turn.turn_id} is waiting for your answer{later}", file=sys.stderr)

    async with _session_client(args) as client:
        _say_when_lost(client, printer)
        try:
            outcome: TurnOutcome | None = None
            if args.session:
                turn_sid = args.session
                await require_session(client, turn_sid)
                outcome = await finish_open_turn(
                    client, turn_sid, printer, waiting_only=payload is not None, on_open=waiting_on
                )
                if outcome is None and payload is None:
                    raise Usage(
                        f"session {turn_sid} has no turn running: give a message, e.g. "
                        f'subs run {args.agent} "and now?" --session {turn_sid}'
                    )
                if outcome is not None and outcome.status == "failed" and payload is not None:
                    print(f"subs: the turn failed: {outcome.error}", file=sys.stderr)
            if payload is not None:
                sent = True
                outcome = await watch_turn(
                    client,
                    payload,
                    printer,
                    session_id=args.session,
                    identity=_identity(),
                    on_session=announce,
                )
        except asyncio.CancelledError:
            ctrl_c.caught()
            ctrl_c.leaving = True
            asked = keyboard().stopped_asking
            line = _pick_up("run", args.agent, sid, bool(args.url), asked=asked)
            if not sent:
                line += " (your message was not sent)"
            printer.notice(line)
            return 130
        ctrl_c.leaving = True
    assert outcome is not None
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
    from engine.cli.keyboard import keyboard

    lines: list[str] = []
    prompt = "you> "
    while True:
        line = await keyboard().edited_line(prompt)
        if line is None:
            return None if not lines else "\n".join(lines)
        if line.endswith("\\"):
            lines.append(line[:-1])
            prompt = "...> "
            continue
        lines.append(line)
        return "\n".join(lines)


async def _chat(args: argparse.Namespace) -> int:
    """Talk to an agent; Ctrl-C while a turn streams stops watching it (it goes on), at a
    question or at `you>` it leaves, saying how to pick the session up; Ctrl-D leaves."""
    from engine.cli.keyboard import keyboard
    from engine.cli.terminal import OpenTurn, Printer, finish_open_turn, require_session, watch_turn

    with contextlib.suppress(ImportError):
        import readline  # noqa: F401  (line editing and history for input())
    printer = Printer(sys.stdout, False, sys.stderr)
    sid: str | None = args.session
    ctrl_c = _CtrlC()
    board = keyboard()
    at_you = False  # waiting at `you>`

    def known(session: str, queued: bool) -> None:
        nonlocal sid
        sid = session

    def waiting_on(turn: OpenTurn) -> None:
        print(f"session {sid}: its turn is waiting for your answer", file=sys.stderr)

    try:
        async with _session_client(args) as client:
            _say_when_lost(client, printer)
            try:
                if sid:
                    await require_session(client, sid)
                    await finish_open_turn(client, sid, printer, on_open=waiting_on)
                while True:
                    at_you = True
                    text = await _read_message()
                    at_you = False
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
                            on_session=known,
                        )
                    )
                    try:
                        outcome = await watching
                    except asyncio.CancelledError:
                        ctrl_c.caught()
                        watching.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await watching
                        if board.stopped_asking:
                            raise  # at a question: leave, below
                        # Stop watching; keep the session (and the turn) going.
                        printer.notice("(stopped watching; the turn goes on)")
                        continue
                    if outcome.status == "failed":
                        print(f"subs: the turn failed: {outcome.error}", file=sys.stderr)
            except asyncio.CancelledError:
                ctrl_c.caught()
                ctrl_c.leaving = True
                asked = board.stopped_asking
                line = _pick_up("chat", args.agent, sid, bool(args.url), asked=asked)
                printer.notice(("\n" if at_you else "") + line)  # `you> ` has no newline
                return 130
            ctrl_c.leaving = True
    finally:
        board.restore()
    if sid:
        print(f"session {sid}", file=sys.stderr)
    return 0


def _lease_ms() -> int:
    """Lease length; short in tests that kill engines on purpose."""
    raw = os.environ.get("SUBS_LEASE_MS", "10000")
    if not raw.isdigit() or int(raw) < 100:
        raise Usage(f"SUBS_LEASE_MS must be a whole number of milliseconds >= 100, got {raw!r}")
    return int(raw)


def _engine_socket_timeout(project: Project) -> float:
    """Longer than any command the engine waits on (a 2 s work read, a WAIT), so only a
    Redis that stopped answering trips it; short, since each dead connection costs it once."""
    return 5.0 + project.store.wait_timeout_ms / 1000


@contextlib.contextmanager
def _one_serve_per_folder(data_dir: Path) -> Iterator[Callable[[str], None]]:
    """Refuse a second serve on this folder's embedded Redis: the first one owns it.

    An flock on `.subs/serve.lock`, held while this process lives (a crashed serve's
    lock goes with it), which names its holder: pid and API address. Yields the
    function that records the address once the API is bound.
    """
    path = data_dir / SERVE_LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid, _, api = os.pread(fd, 300, 0).decode(errors="replace").strip().partition(" ")
            raise SubsError(
                f"another subs serve (pid {pid or '?'}, api {api or 'starting'}) already runs "
                f"on this folder's embedded Redis ({data_dir}): stop it first, or give each "
                "serve the same Redis with --redis or SUBS_REDIS"
            ) from None

        def record(api: str) -> None:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {api}\n".encode(), 0)

        record("")
        yield record
    finally:
        os.close(fd)  # and with it the lock


def _listen(host: str, port: int) -> socket.socket:
    """The API's listening socket, bound before anything starts: a port in use is the
    first thing a person hears about, not a traceback after the engine came up."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as err:
        raise Usage(
            f"cannot bind to host {host!r}: {err.strerror}; pass --host 127.0.0.1"
        ) from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as err:
        sock.close()
        if err.errno == errno.EADDRINUSE:
            raise SubsError(
                f"cannot listen on {host}:{port}: the port is in use (another subs serve?); "
                "stop that process, or pass --port N (--port 0 picks a free one)"
            ) from None
        raise SubsError(
            f"cannot listen on {host}:{port}: {err.strerror}; pass another --host or --port"
        ) from None
    return sock


async def _serve(args: argparse.Namespace) -> int:
    """Engine and HTTP API in one process, until SIGTERM/SIGINT (SPEC §15).

    The API answers as soon as the engine runs; Slack connects in the background (with
    retries), so an unreachable Slack never holds up the API or the stop.
    """
    from aiohttp import web

    from bot.app import start_bots  # the Slack stack: only serve needs it
    from engine.api import ApiKeys, ApiKeysError, bind_warning, check_bind, make_app, make_runner
    from engine.api.client_tokens import ClientTokens, TokenConfigError
    from engine.client import Client
    from engine.landing import AlertHook
    from engine.runtime.engine import Engine
    from engine.runtime.metrics import Metrics
    from engine.store.store import Store, connect

    project = _load_priced(args)
    host = args.host or project.serve.host
    port = project.serve.port if args.port is None else args.port
    try:
        keys = ApiKeys.from_env(os.environ)
        tokens = ClientTokens.from_env(
            os.environ,
            issuer=project.serve.client_token_issuer,
            audience=project.serve.client_token_audience,
        )
    except (ApiKeysError, TokenConfigError) as err:
        raise Usage(str(err)) from None
    refusal = check_bind(host, keys)
    if refusal is not None:
        raise Usage(refusal)
    configured = args.redis or project.redis
    async with contextlib.AsyncExitStack() as stack:
        record_api: Callable[[str], None] = lambda api: None  # noqa: E731
        if configured is None:
            record_api = stack.enter_context(_one_serve_per_folder(_data_dir(project)))
        sock = stack.enter_context(_listen(host, port))
        url, store_problem = await stack.enter_async_context(_redis_url(project, args.redis))
        # Two pools on one server: whatever the API and the bots wait on (submits, event
        # streams), the engine's leases, commits and timers always find a connection.
        engine_redis = connect(
            url, name="subs-engine", socket_timeout=_engine_socket_timeout(project)
        )
        stack.push_async_callback(engine_redis.aclose)
        api_redis = connect(url, name="subs-api")
        stack.push_async_callback(api_redis.aclose)
        await _reachable(engine_redis, url, project)
        metrics = Metrics()
        engine = Engine(project, engine_redis, lease_ms=_lease_ms(), metrics=metrics, sweep=True)
        await engine.start()
        stack.push_async_callback(engine.stop)
        store = await Store.open(api_redis)
        client = Client(store)
        # The agents whose Slack tokens are set; a dead serve's turns move after one lease.
        bots = start_bots(
            project,
            client,
            api_redis,
            os.environ,
            lease_ms=_lease_ms(),
            owner=engine.owner,
            refused=lambda agent, reason: metrics.inc(
                "subs_slack_refusals_total", agent=agent, reason=reason
            ),
            spans=None if engine.tracing is None else engine.tracing.emit,
        )
        stack.push_async_callback(bots.aclose)
        app = make_app(
            client,
            store,
            keys=keys,
            metrics=metrics,
            cors_origins=project.serve.cors_origins,
            max_streams_per_key=project.serve.max_streams_per_key,
            max_streams=project.serve.max_streams,
            agents=project.agents,
            store_problem=store_problem,
            hosts=(host, urlsplit(project.serve.public_url or "").hostname),
            tokens=tokens,
            lander=bots if bots.bots else None,  # sessions that land in Slack: docs/slack.md
            alertmanager=None
            if project.alertmanager is None
            else AlertHook(project.alertmanager.agent, project.alertmanager.channel),
        )
        app.add_routes(bots.routes())  # POST /slack/<agent>/events
        runner = make_runner(
            app, header_timeout=project.serve.header_timeout_secs, shutdown_timeout=3
        )
        await runner.setup()
        # Last in, first out: stop taking requests (open streams end), then the bots,
        # then the engine hands back partitions and calls.
        stack.push_async_callback(runner.cleanup)
        await web.SockSite(runner, sock).start()
        bound = runner.addresses[0]
        api = f"http://{bound[0]}:{bound[1]}"
        record_api(api)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        deciders = ", ".join(
            f"{a.id} ({'worker ' + redact_url(a.worker) if a.worker else 'engine'})"
            for a in project.agents.values()
        )
        where = redact_url(configured) if configured else "embedded redis under .subs/"
        missing = ", ".join(m.var for m in project.missing_env(os.environ)) or "none"
        slack = ", ".join(bots.describe()) or "none"
        off = project.connections_off(os.environ)
        mcp = ", ".join(
            f"{p} (off)" if p in off else p for p in (b.path for b in project.mcp.values())
        )
        print(
            f"subs: engine {engine.owner} on {where}; api {api}; "
            f"agents: {deciders}; slack: {slack}; mcp: {mcp or 'none'}; missing env: {missing}",
            file=sys.stderr,
            flush=True,
        )
        for path, why in off.items():
            print(f"subs: {path} is off: {why}; its agents run without its tools", file=sys.stderr)
        for bot_off in project.slack_off(os.environ):
            print(f"subs: {bot_off.why}", file=sys.stderr)
        warning = bind_warning(host, keys)
        if warning:
            print(f"subs: {warning}", file=sys.stderr, flush=True)
        # After the start line: a Socket Mode app that cannot connect logs its first
        # retry at once, and the start line is what a supervisor reads first.
        await bots.start()  # Socket Mode connects in the background, retrying
        await stop.wait()
        print("subs: stopping", file=sys.stderr, flush=True)
    return 0


def _check(args: argparse.Namespace) -> int:
    """Exit 1 when the file is wrong, an environment variable it needs is missing, or a
    Slack app has some of its variables but not enough (none at all is an API-only set-up:
    a note, like an MCP connection that is off).

    With a Redis URL configured (--redis, SUBS_REDIS, `redis`) that names a node of a
    Redis Cluster, it also says the cluster's shape; a Redis it cannot reach is not an
    error here (check validates the file, and runs where Redis may not be reachable)."""
    project = _load_priced(args)
    missing = project.missing_env(os.environ)
    off = project.connections_off(os.environ)
    slack = project.slack_off(os.environ)
    exposed = {b.path: why for b in project.mcp.values() if (why := b.secret_in_command())}
    shape = _cluster_shape(args.redis or project.redis)
    if sys.stdout.isatty():
        agents = ", ".join(
            f"{a.id} ({'worker' if a.worker else 'engine'})" for a in project.agents.values()
        )
        print(f"{project.path}: ok; agents: {agents or 'none'}")
        if shape is not None:
            print(
                f"redis: cluster {shape['state']}: {shape['masters']} masters, "
                f"{shape['replicas']} replicas, {shape['slots']} of 16384 slots served, "
                f"{shape['failing']} nodes failing"
            )
        for m in missing:
            print(f"missing {m.var}: needed by {m.needed_by} ({m.why})")
        for path, why in off.items():
            print(f"{path} is off: {why}; its agents run without its tools")
        for app in slack:
            print(app.why)
        for path, why in exposed.items():
            print(f"warning: {path}: {why}")
    else:
        if shape is not None:
            print(json.dumps({"redis_cluster": shape}))
        for m in missing:
            print(json.dumps({"missing": m.var, "needed_by": m.needed_by, "why": m.why}))
        for path, why in off.items():
            print(json.dumps({"off": path, "why": why}))
        for app in slack:
            print(json.dumps({"slack_off": app.agent, "why": app.why, "partial": app.partial}))
        for path, why in exposed.items():
            print(json.dumps({"warning": path, "why": why}))
    return 1 if missing or any(app.partial for app in slack) else 0


def _cluster_shape(url: str | None) -> dict[str, Any] | None:
    """The shape of the cluster `url` names; None when it names none (or no URL is set)."""
    from engine.store.store import RedisError, cluster_shape

    if url is None:
        return None
    try:
        shape = cluster_shape(url)
    except (RedisError, OSError):
        return None
    return None if shape is None else dataclasses.asdict(shape)


def _manifest(args: argparse.Namespace) -> int:
    """Print the agent's Slack app manifest; the transport follows the environment by default."""
    from bot.slack.manifest import events_path, manifest, to_yaml
    from engine.config import slack_env_suffix

    project = _load(args)
    agent = project.agents.get(args.agent)
    if agent is None:
        declared = ", ".join(sorted(project.agents)) or "none"
        raise Usage(f"no agent {args.agent!r} in {project.path}; declared: {declared}")
    if agent.slack is None:
        raise Usage(f"agent {agent.id!r} has no [agent.{agent.id}.slack] block in {project.path}")
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
            raise Usage(f"--url must be an http(s) URL, got {base!r}")
        if scheme != "https":
            print(f"subs: {_not_https(base, given=args.url is not None)}", file=sys.stderr)
        url = base.rstrip("/") + events_path(agent.id)
    print(to_yaml(manifest(agent, socket_mode=socket_mode, request_url=url)), end="")
    return 0


def _not_https(base: str, *, given: bool) -> str:
    """The manifest's request URLs are not https: Slack will refuse them. Says so of
    the URL the person gave, or of the default they did not choose."""
    if given:
        return (
            f"Slack only calls public https URLs, and --url {base} is not one: "
            "give the https address that reaches this serve (a proxy or tunnel)"
        )
    return (
        f"the request URLs point at {base} ([serve] host and port), and Slack only calls "
        "public https URLs: pass --url https://<the address that reaches this serve>"
    )


@contextlib.asynccontextmanager
async def _reader(args: argparse.Namespace) -> AsyncIterator[SessionClient]:
    """Read sessions from a remote engine (`--url`) or straight from Redis."""
    if args.url:
        async with _remote(args.url) as client:
            yield client
        return
    from engine.client import Client
    from engine.store.store import Store

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
    if args.sessions_command == "import":
        return await _import(args)
    async with _reader(args) as client:
        if args.sessions_command == "list":
            rows, more = await client.session_rows(args.limit, args.cursor)
            _print_sessions(rows, _jsonl(args.output))
            if more is not None:
                print(f"subs: more: subs sessions list --cursor {more}", file=sys.stderr)
            return 0
        if args.sessions_command == "delete":
            await client.delete(args.session)
            print(f"subs: deleted session {args.session}", file=sys.stderr)
            return 0
        if args.sessions_command == "export":
            return await _export(args, client)
        if args.sessions_command == "dead":
            for letter in await client.dead_letters(args.limit):
                print(_dead_letter_line(letter))
            return 0
        jsonl = _jsonl(args.output)
        events = await client.events(args.session, args.after)
        if not events and args.after == 0 and not args.follow:
            raise SubsError(f"no session {args.session!r}; `subs sessions list` shows them")
        for event in events:
            _print_event(event, jsonl)
        if args.follow:
            _say_when_lost(client, None)
            after = events[-1]["seq"] if events else args.after
            async for kind, event in client.follow(args.session, after):
                if kind == "event":
                    _print_event(event, jsonl)
    return 0


async def _export(args: argparse.Namespace, client: Any) -> int:
    """A live session's log, as the sweep archives it (docs/archive.md)."""
    from engine.runtime.retention import export
    from engine.store import archive

    events = await client.events(args.session, 0)
    if not events:
        raise SubsError(f"no session {args.session!r}; `subs sessions list` shows them")
    store = getattr(client, "store", None)  # straight from Redis: the files come too
    files = await store.session_files(args.session) if store is not None else {}
    if store is None:
        print(
            "subs: over --url the session's files are not exported, only its log", file=sys.stderr
        )
    kept = export(events, int(time.time() * 1000), files)
    path = Path(args.file or archive.export_name(args.session))
    try:
        await asyncio.to_thread(archive.write, path, kept)
    except OSError as err:
        raise SubsError(f"cannot write {path}: {err.strerror or err}") from None
    print(f"subs: wrote {kept.seq} events of session {args.session} to {path}", file=sys.stderr)
    return 0


async def _import(args: argparse.Namespace) -> int:
    """Put an archived session back: straight into Redis (an engine needs no part in it)."""
    from engine.runtime.retention import restore
    from engine.store import archive
    from engine.store.store import Store

    kept = await asyncio.to_thread(archive.read, Path(args.file))
    project = _load(args)
    async with _redis_for(project, args.redis) as redis:
        state = await restore(await Store.open(redis), kept)
    print(
        f"subs: restored session {kept.session_id} ({state.seq} events, agent {state.agent_id})",
        file=sys.stderr,
    )
    return 0


def _print_sessions(rows: list[SessionRow], jsonl: bool) -> None:
    """One JSON object a line, or a table with the first words of each conversation."""
    if jsonl:
        for row in rows:
            print(json.dumps(row, ensure_ascii=False))
        return
    if not rows:
        print('no sessions yet; start one with: subs run <agent> "hello"', file=sys.stderr)
        return
    table = [("SESSION", "AGENT", "STATUS", "LAST ACTIVITY", "TURNS", "FIRST MESSAGE")]
    for row in rows:
        last = (row.get("last_activity_at") or "")[:19].replace("T", " ")
        first = short(row.get("first_message") or "", 50)
        table.append(
            (row["session_id"], row["agent_id"], row["status"], last, str(row["turns"]), first)
        )
    widths = [max(len(line[i]) for line in table) for i in range(5)]
    for line in table:
        cells = [cell.ljust(w) for cell, w in zip(line, widths, strict=False)]
        print("  ".join([*cells, line[5]]).rstrip())


def _dead_letter_line(letter: dict[str, Any]) -> str:
    """`<time> <session> <input kind> (<n> deliveries): <reason>`: one line to act on."""
    from engine.machine import iso

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


def _log_level() -> str | None:
    """`SUBS_LOG`, any case; None when unset. A level logging does not know is refused."""
    raw = os.environ.get("SUBS_LOG")
    if raw is None:
        return None
    level = raw.strip().upper()
    if level not in LOG_LEVELS:
        raise Usage(
            f"SUBS_LOG={raw!r} is not a level; use one of {', '.join(LOG_LEVELS)} (any case)"
        )
    return level


class OneLine(logging.Formatter):
    """A warning as the CLI says everything else: `subs: <message>`, on one line.

    The default, so a library's or the engine's warning does not break into a command's
    output as a raw logger line or a traceback; with `SUBS_LOG` set the records are
    printed in full. An exception's class and message end the line; `scrub` masks them
    (the redactor scrubs the message itself before the record gets here)."""

    def __init__(self, scrub: Callable[[str], str]) -> None:
        super().__init__()
        self.scrub = scrub

    def format(self, record: logging.LogRecord) -> str:
        """The record as one `subs:` line, its exception (scrubbed) at the end."""
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text = f"{text} ({self.scrub(describe(record.exc_info[1]))})"
            if record.levelno >= logging.ERROR:  # a bug: its traceback is one variable away
                text += "; SUBS_LOG=INFO prints the traceback"
        return "subs: " + " ".join(line.strip() for line in text.splitlines() if line.strip())


def _log_format() -> str | None:
    """`SUBS_LOG_FORMAT`: `json` or unset (the default lines)."""
    raw = os.environ.get("SUBS_LOG_FORMAT")
    if raw is None or not raw.strip():
        return None
    if raw.strip().lower() != "json":
        raise Usage(f"SUBS_LOG_FORMAT={raw!r} is not a format; the one there is: json")
    return "json"


def _start_logging() -> None:
    """Warnings as `subs:` lines on stderr by default; `SUBS_LOG` for full records (with the
    span they happened in, when tracing is on), `SUBS_LOG_FORMAT=json` for JSON lines."""
    from engine.telemetry.logs import JsonLines, SpanFields, WithSpan

    level, form = _log_level(), _log_format()
    handler = logging.StreamHandler(sys.stderr)
    if form == "json":
        handler.setFormatter(JsonLines())
    elif level is None:
        handler.setFormatter(OneLine(REDACTOR.scrub))
    else:
        handler.setFormatter(WithSpan(logging.BASIC_FORMAT))
    handler.addFilter(SpanFields())
    logging.basicConfig(level=level or logging.WARNING, handlers=[handler])
    REDACTOR.install()


def _redis_errors() -> tuple[type[Exception], ...]:
    """Redis's error class once the store is loaded; none before, when nothing can raise it."""
    store = sys.modules.get("engine.store.store")
    return () if store is None else (store.RedisError,)


def run_command(args: argparse.Namespace) -> int:
    """Run the parsed command; every failure a person can act on is one line on stderr."""
    REDACTOR.add(env_secrets(os.environ))
    try:
        _start_logging()
        if args.command == "check":
            return _check(args)
        if args.command == "manifest":
            return _manifest(args)
        runs = {"serve": _serve, "run": _run, "chat": _chat, "sessions": _sessions}
        loop = None
        if args.command == "serve":
            from engine.runtime.engine import new_event_loop

            loop = new_event_loop
        with asyncio.Runner(loop_factory=loop) as runner:
            return runner.run(runs[args.command](args))
    except SubsError as err:  # ConfigError and Usage exit 2, the rest 1
        print(f"subs: {REDACTOR.scrub(str(err))}", file=sys.stderr)
        return err.exit_status
    except _redis_errors() as err:
        print(
            f"subs: Redis failed: {REDACTOR.scrub(str(err)) or type(err).__name__}; "
            "check that it runs, then try again",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt:
        return 130
