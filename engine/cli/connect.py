"""Where a command finds its engine: the configured Redis or an embedded one, an engine
in this process, or a remote one over its HTTP API (`--url`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.cli.common import Usage, http_url, lease_ms
from engine.errors import ClientError, SubsError
from engine.redact import redact_url

# The engine, Redis and the HTTP client are imported by the functions that use them:
# `subs sessions list --url` needs none but the last, and would wait for them.
if TYPE_CHECKING:
    from engine.cli.remote import HttpClient
    from engine.client import Client
    from engine.config import Project
    from engine.store.store import RedisClient


REDIS_CHECK_SECONDS = 5.0  # a Redis that does not answer PING by then is reported, not waited on


def data_folder(project: Project) -> Path:
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
async def running_redis(
    project: Project, url: str | None
) -> AsyncIterator[tuple[str, StoreProblem]]:
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
        data_folder(project),
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


async def reachable(redis: RedisClient, url: str, project: Project) -> None:
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
async def redis_client(project: Project, url: str | None) -> AsyncIterator[RedisClient]:
    """One client (one pool) on the configured or embedded Redis."""
    from engine.store.store import connect

    async with running_redis(project, url) as (address, _), connect(address) as client:
        await reachable(client, address, project)
        yield client


@contextlib.asynccontextmanager
async def remote_client(url: str) -> AsyncIterator[HttpClient]:
    """A remote engine's HTTP API, with the key from `SUBS_API_KEY`."""
    from engine.cli.remote import HttpClient

    key = os.environ.get("SUBS_API_KEY")
    if key is not None and (not key.isprintable() or " " in key):
        raise Usage("SUBS_API_KEY holds a space or a control character: set it to the key alone")
    # A dead engine is said within seconds: a refused or unanswered connection in 3 s, a
    # stream gone silent (no ping for three of the engine's 15 s heartbeats) in 45 s.
    client = HttpClient(http_url(url), key, connect_timeout=3.0, stream_silence=45.0)
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
async def engine_client(project: Project, redis_url: str | None) -> AsyncIterator[Client]:
    """A client with an engine in this process to apply what it submits (another engine
    on the same Redis may answer instead: whichever owns the session's partition)."""
    from engine.client import Client
    from engine.runtime.engine import Engine

    async with redis_client(project, redis_url) as redis:
        engine = Engine(project, redis, lease_ms=lease_ms())
        await engine.start()
        try:
            yield Client(engine.store, policies=project.budgets)
        finally:
            await engine.stop()


def say_when_lost(client: Any, printer: Any | None) -> None:
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
