"""Shared fixtures: one real embedded redis-server for the whole test session."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from redis import Redis as SyncRedis
from redis.asyncio import Redis as AsyncRedis

from engine.embedded import EmbeddedRedis
from engine.store import connect

pytest_plugins = ["tests.workers"]  # the test_worker fixture


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Url of a redis-server started once per session (unix socket, AOF on)."""
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"))
    url = server.start()
    try:
        yield url
    finally:
        server.stop()


@pytest.fixture
def redis_url(redis_server: str) -> str:
    """The session server's url, emptied before the test."""
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
