"""Shared fixtures: one real embedded redis-server for the whole test session."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from redis import Redis as SyncRedis
from redis.asyncio import Redis as AsyncRedis

from engine.machine import core
from engine.machine.events import parse_event
from engine.runtime.engine import Engine
from engine.store.embedded import EmbeddedRedis
from engine.store.store import connect
from tests.engine_helpers import ENV, EngineProcess, make_project, project_toml
from tests.fakes.llm_vendor import FakeVendor
from tests.redis_cluster import LocalCluster, running_cluster

pytest_plugins = ["tests.workers", "tests.agui_helpers"]  # test_worker; the agui_* fixtures


@pytest.fixture(scope="session", autouse=True)
def emitted_events_follow_the_catalogue() -> Iterator[None]:
    """Every event a rule emits in any test parses as its catalogue record (events.py):
    a field renamed in a rule but not in the catalogue fails the test that emits it."""
    fold_one = core.evolve

    def checked(state: Any, event: Any) -> Any:
        parse_event(event)
        return fold_one(state, event)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(core, "evolve", checked)
        yield


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Url of a redis-server started once per session (unix socket, AOF on)."""
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"))
    url = server.start()
    try:
        yield url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A Redis Cluster (3 masters, 3 replicas) built once per session, when a test asks."""
    with running_cluster(tmp_path_factory.mktemp("cluster")) as cluster:
        yield cluster


@pytest.fixture
def redis_url(request: pytest.FixtureRequest, redis_server: str) -> str:
    """The session server's url, emptied before the test; with `on_both_redis`, also a
    node of the session's cluster (healthy again after any failover, emptied)."""
    if getattr(request, "param", "single") == "cluster":
        cluster: LocalCluster = request.getfixturevalue("redis_cluster")
        cluster.revive()
        cluster.wait_healthy()
        cluster.flush()
        return cluster.url
    with SyncRedis.from_url(redis_server) as client:
        client.flushall()
    return redis_server


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[AsyncRedis]:
    """An asyncio client (bytes replies) on an empty database."""
    client = connect(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def vendor() -> AsyncIterator[FakeVendor]:
    """A scripted LLM vendor on a real port (OpenAI, OpenRouter and Anthropic routes)."""
    async with FakeVendor() as fake:
        yield fake


@pytest.fixture
async def engine(redis: AsyncRedis, vendor: FakeVendor, tmp_path: Path) -> AsyncIterator[Engine]:
    """An engine in the test's process on the test's Redis: project_toml's agents, model
    calls retried at once."""
    project = make_project(
        tmp_path, vendor.url, retry="retry = { llm = { backoff_base_secs = 0 } }"
    )
    eng = Engine(project, redis, env=ENV, lease_ms=3000)
    await eng.start()
    yield eng
    await eng.stop()


@pytest.fixture
def config(tmp_path: Path, vendor: FakeVendor) -> Path:
    """A subs.toml with one agent per vendor format, retrying model calls at once."""
    path = tmp_path / "subs.toml"
    path.write_text(project_toml(vendor.url, retry="retry = { llm = { backoff_base_secs = 0 } }"))
    return path


@pytest.fixture
async def serve_processes(
    config: Path, redis_url: str
) -> AsyncIterator[Callable[[], Awaitable[EngineProcess]]]:
    """Starts `subs serve` processes on the test's Redis; stops them all afterwards."""
    started: list[EngineProcess] = []

    async def start() -> EngineProcess:
        proc = await EngineProcess(config, redis_url).start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        await proc.stop()
