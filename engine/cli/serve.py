"""`subs serve`: the composition root of the engine, the HTTP API and the Slack apps
in one process, until SIGTERM/SIGINT (SPEC §15)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import errno
import fcntl
import os
import signal
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from engine.cli.common import Usage, lease_ms, priced_project
from engine.cli.connect import data_folder, reachable, running_redis
from engine.errors import SubsError
from engine.redact import redact_url

if TYPE_CHECKING:
    from bot.app import Bots
    from engine.api import ApiKeys
    from engine.api.client_tokens import ClientTokens
    from engine.cli.connect import StoreProblem
    from engine.client import Client
    from engine.config import Project
    from engine.metrics import Metrics
    from engine.runtime.engine import Engine
    from engine.store.store import RedisClient, Removals, Store


SERVE_LOCK = "serve.lock"


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


@dataclasses.dataclass(frozen=True)
class _Settings:
    """What serve runs with, each piece checked before anything starts."""

    project: Project
    host: str
    port: int
    redis: str | None  # --redis; None: the file's, else an embedded one
    keys: ApiKeys
    tokens: ClientTokens

    @property
    def configured(self) -> str | None:
        """The Redis URL given (flag, environment or file); None for the embedded one."""
        return self.redis or self.project.redis


@dataclasses.dataclass(frozen=True)
class _Pools:
    """The Redis serve runs on, and its two pools there."""

    url: str
    problem: StoreProblem  # why the store is degraded (the embedded one's supervisor)
    engine: RedisClient
    api: RedisClient


@dataclasses.dataclass(frozen=True)
class _Parts:
    """What the API is built over: the engine's client and store, its metrics, the bots."""

    client: Client
    store: Store
    metrics: Metrics
    bots: Bots
    problem: StoreProblem


def _settings(args: argparse.Namespace) -> _Settings:
    """The project (priced), the address, the API's keys and client tokens: a mistake in
    any of them is said before a port is bound or Redis started."""
    from engine.api import ApiKeys, ApiKeysError, check_bind
    from engine.api.client_tokens import ClientTokens, TokenConfigError

    project = priced_project(args)
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
    return _Settings(project, host, port, args.redis, keys, tokens)


async def _store(stack: contextlib.AsyncExitStack, settings: _Settings) -> _Pools:
    """The configured Redis or an embedded one, answering, with one pool for the engine
    and one for the API and the bots. Two pools on one server: whatever the API and the
    bots wait on (submits, event streams), the engine's leases, commits and timers
    always find a connection."""
    from engine.store.store import connect

    project = settings.project
    url, problem = await stack.enter_async_context(running_redis(project, settings.redis))
    engine = connect(url, name="subs-engine", socket_timeout=_engine_socket_timeout(project))
    stack.push_async_callback(engine.aclose)
    api = connect(url, name="subs-api")
    stack.push_async_callback(api.aclose)
    await reachable(engine, url, project)
    return _Pools(url, problem, engine, api)


async def _engine(
    stack: contextlib.AsyncExitStack,
    project: Project,
    redis: RedisClient,
    metrics: Metrics,
    removals: Removals,
) -> Engine:
    """The engine, running; stopped last, when it hands back its partitions and in-flight
    calls. It takes part in the retention sweep, whose removals reach the process's
    watchers (`removals`) and whose hooks drop the bot's keys of a removed session."""
    from bot.app import PURGE_HOOKS
    from engine.runtime.engine import Engine

    engine = Engine(
        project,
        redis,
        lease_ms=lease_ms(),
        metrics=metrics,
        sweep=True,
        removals=removals,
        purge=PURGE_HOOKS,
    )
    await engine.start()
    stack.push_async_callback(engine.stop)
    return engine


def _bots(
    stack: contextlib.AsyncExitStack,
    project: Project,
    client: Client,
    redis: RedisClient,
    engine: Engine,
    metrics: Metrics,
) -> Bots:
    """The Slack apps of the agents whose tokens are set (not connected yet); a dead
    serve's turns move to another after one lease."""
    from bot.app import start_bots  # the Slack stack: only serve needs it

    bots = start_bots(
        project,
        client,
        redis,
        os.environ,
        lease_ms=lease_ms(),
        owner=engine.owner,
        refused=lambda agent, reason: metrics.inc(
            "subs_slack_refusals_total", agent=agent, reason=reason
        ),
        spans=None if engine.tracing is None else engine.tracing.emit,
    )
    stack.push_async_callback(bots.aclose)
    return bots


async def _api(
    stack: contextlib.AsyncExitStack,
    settings: _Settings,
    sock: socket.socket,
    parts: _Parts,
) -> str:
    """The HTTP API (with the Slack apps' event routes) answering on `sock`; its URL."""
    from aiohttp import web

    from engine.api import make_app, make_runner
    from engine.landing import AlertHook

    project, bots = settings.project, parts.bots
    alerts = project.alertmanager
    app = make_app(
        parts.client,
        parts.store,
        keys=settings.keys,
        metrics=parts.metrics,
        cors_origins=project.serve.cors_origins,
        max_streams_per_key=project.serve.max_streams_per_key,
        max_streams=project.serve.max_streams,
        agents=project.agents,
        store_problem=parts.problem,
        hosts=(settings.host, urlsplit(project.serve.public_url or "").hostname),
        tokens=settings.tokens,
        lander=bots if bots.bots else None,  # sessions that land in Slack: docs/slack.md
        alertmanager=None if alerts is None else AlertHook(alerts.agent, alerts.channel),
    )
    app.add_routes(bots.routes())  # POST /slack/<agent>/events
    runner = make_runner(app, header_timeout=project.serve.header_timeout_secs, shutdown_timeout=3)
    await runner.setup()
    # Last in, first out: stop taking requests (open streams end), then the bots,
    # then the engine hands back partitions and calls.
    stack.push_async_callback(runner.cleanup)
    await web.SockSite(runner, sock).start()
    bound = runner.addresses[0]
    return f"http://{bound[0]}:{bound[1]}"


def _stop_on_signals() -> asyncio.Event:
    """Set by SIGTERM or SIGINT: serve then stops, in the order its parts were stacked."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


def _say_started(settings: _Settings, owner: str, bots: Bots, api: str) -> None:
    """The start line a supervisor reads first (credentials masked), then what is off."""
    from engine.api import bind_warning

    project = settings.project
    deciders = ", ".join(
        f"{a.id} ({'worker ' + redact_url(a.worker) if a.worker else 'engine'})"
        for a in project.agents.values()
    )
    configured = settings.configured
    where = redact_url(configured) if configured else "embedded redis under .subs/"
    missing = ", ".join(m.var for m in project.missing_env(os.environ)) or "none"
    slack = ", ".join(bots.describe()) or "none"
    off = project.connections_off(os.environ)
    mcp = ", ".join(f"{p} (off)" if p in off else p for p in (b.path for b in project.mcp.values()))
    print(
        f"subs: engine {owner} on {where}; api {api}; "
        f"agents: {deciders}; slack: {slack}; mcp: {mcp or 'none'}; missing env: {missing}",
        file=sys.stderr,
        flush=True,
    )
    for path, why in off.items():
        print(f"subs: {path} is off: {why}; its agents run without its tools", file=sys.stderr)
    for bot_off in project.slack_off(os.environ):
        print(f"subs: {bot_off.why}", file=sys.stderr)
    warning = bind_warning(settings.host, settings.keys)
    if warning:
        print(f"subs: {warning}", file=sys.stderr, flush=True)


async def serve(args: argparse.Namespace) -> int:
    """Engine and HTTP API in one process, until SIGTERM/SIGINT (SPEC §15).

    The API answers as soon as the engine runs; Slack connects in the background (with
    retries), so an unreachable Slack never holds up the API or the stop. Each part is
    stacked as it starts, and stopped in reverse: requests, bots, engine, Redis.
    """
    from engine.client import Client
    from engine.metrics import Metrics
    from engine.store.store import Removals, Store

    settings = _settings(args)
    project = settings.project
    async with contextlib.AsyncExitStack() as stack:
        record_api: Callable[[str], None] = lambda api: None  # noqa: E731
        if settings.configured is None:
            record_api = stack.enter_context(_one_serve_per_folder(data_folder(project)))
        sock = stack.enter_context(_listen(settings.host, settings.port))
        pools = await _store(stack, settings)
        metrics = Metrics()
        # The process's watchers of removed sessions, for both stores: a session the sweep
        # (the engine's) or a DELETE (the API's) removes leaves the engine's cache and
        # ends the API's streams of it.
        removals = Removals()
        engine = await _engine(stack, project, pools.engine, metrics, removals)
        store = await Store.open(pools.api, removals=removals)
        client = Client(store, policies=project.budgets)
        bots = _bots(stack, project, client, pools.api, engine, metrics)
        api = await _api(stack, settings, sock, _Parts(client, store, metrics, bots, pools.problem))
        record_api(api)
        stop = _stop_on_signals()
        _say_started(settings, engine.owner, bots, api)
        # After the start line: a Socket Mode app that cannot connect logs its first
        # retry at once, and the start line is what a supervisor reads first.
        await bots.start()  # Socket Mode connects in the background, retrying
        await stop.wait()
        print("subs: stopping", file=sys.stderr, flush=True)
    return 0
