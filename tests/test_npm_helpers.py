"""tests/npm_helpers.py against registries on loopback: one that refuses connections and
one that takes them and never answers (each a skip, within the probe's bound), and one
that answers but has no such package (a failure)."""

from __future__ import annotations

import asyncio
import shutil
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aiohttp import web

from tests.api_helpers import serve
from tests.npm_helpers import PING_SECS, npm_install

ABSENT = "@subs-tests/absent@1.0.0"  # no registry has it


@pytest.fixture
def npm() -> str:
    found = shutil.which("npm")
    if found is None:
        pytest.skip("npm is not on PATH: nothing to install with")
    return found


@pytest.fixture
def refused() -> Iterator[str]:
    """A registry URL on a loopback port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    yield f"http://127.0.0.1:{port}/"


@pytest.fixture
def silent() -> Iterator[str]:
    """A registry URL whose port takes connections (the kernel's backlog) and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/"


@pytest.fixture
async def empty_registry() -> AsyncIterator[str]:
    """A registry that answers `npm ping` and has no packages."""

    async def ping(request: web.Request) -> web.Response:
        return web.json_response({})

    async def absent(request: web.Request) -> web.Response:
        return web.json_response({"error": "not found"}, status=404)

    app = web.Application()
    app.router.add_get("/-/ping", ping)
    app.router.add_route("*", "/{tail:.*}", absent)
    async with serve(app) as url:
        yield url + "/"


@pytest.mark.parametrize("registry", ["refused", "silent"])
async def test_a_registry_out_of_reach_skips_saying_so(
    npm: str, registry: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request
) -> None:
    monkeypatch.setenv("npm_config_registry", request.getfixturevalue(registry))
    started = time.monotonic()
    with pytest.raises(pytest.skip.Exception) as caught:
        await asyncio.to_thread(npm_install, npm, tmp_path / "js", ABSENT, timeout=120)
    assert time.monotonic() - started < PING_SECS + 2
    assert "the npm registry is out of reach" in str(caught.value), caught.value
    assert ABSENT in str(caught.value)


async def test_a_failed_install_from_a_registry_in_reach_fails(
    npm: str, empty_registry: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("npm_config_registry", empty_registry)
    with pytest.raises(pytest.fail.Exception) as caught:
        await asyncio.to_thread(npm_install, npm, tmp_path / "js", ABSENT, timeout=120)
    assert f"npm install {ABSENT} failed" in str(caught.value), caught.value
