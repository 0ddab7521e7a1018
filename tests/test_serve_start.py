"""`subs serve` starting and stopping as a process: with Slack unreachable, with Slack
apps off for want of their tokens, twice in one project folder (one embedded Redis), and on
a Redis still loading its data."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from redis import Redis

from engine.config import slack_env_suffix
from engine.store.embedded import CONFIG_NAME, EmbeddedRedis, find_redis_server
from tests.engine_helpers import ENV, ROOT, EngineProcess, poll_until, subs
from tests.slack_serve_helpers import AGENT, slack_toml


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def healthy(api: str) -> bool:
    async with httpx.AsyncClient(timeout=1) as http:
        try:
            return (await http.get(f"{api}/healthz")).status_code == 200
        except httpx.HTTPError:
            return False


async def test_an_unreachable_slack_holds_up_neither_the_api_nor_the_stop(
    tmp_path: Path, vendor, redis_url: str
):
    config = tmp_path / "subs.toml"
    config.write_text(slack_toml(vendor.url))
    suffix = slack_env_suffix(AGENT)
    env = {
        f"SLACK_BOT_TOKEN_{suffix}": "xoxb-test",
        f"SLACK_APP_TOKEN_{suffix}": "xapp-test",
        "SLACK_API_URL": f"http://127.0.0.1:{closed_port()}/api/",
    }
    serve = await EngineProcess(config, redis_url, env).start()
    try:
        await poll_until(lambda: healthy(serve.api), 5, "/healthz to answer")

        async def retrying() -> bool:
            return any("cannot connect Socket Mode" in line for line in serve.stderr)

        await poll_until(retrying, 10, "the log line that says Slack is being retried")
        assert serve.proc is not None
        serve.proc.send_signal(signal.SIGINT)
        code = await asyncio.wait_for(serve.proc.wait(), 10)
        await serve.drained()
    finally:
        await serve.stop()  # no-op once it exited; kills it if it did not
    assert code == 0, serve.log_tail()
    log = "\n".join(serve.stderr)
    assert "Traceback" not in log, log
    retry_lines = [line for line in serve.stderr if "cannot connect Socket Mode" in line]
    assert f"agent {AGENT}" in retry_lines[0] and "retrying in 1 s" in retry_lines[0]


class EmbeddedServe:
    """`subs serve` on the project's own embedded Redis (no --redis)."""

    def __init__(self, config: Path) -> None:
        self.config = config
        self.proc: asyncio.subprocess.Process | None = None
        self.api = ""

    async def start(self) -> EmbeddedServe:
        env = {**os.environ, **ENV, "PYTHONPATH": str(ROOT), "SUBS_LEASE_MS": "1500"}
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "engine.cli",
            "serve",
            "-c",
            str(self.config),
            "--port",
            "0",
            env=env,
            stderr=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
        )
        lock = self.config.parent / ".subs" / "serve.lock"

        async def bound() -> bool:
            text = lock.read_text() if lock.exists() else ""
            return text.startswith(f"{self.proc.pid} http://") if self.proc else False

        await poll_until(bound, 20, "serve to record its API address")
        self.api = lock.read_text().split()[1]
        await poll_until(lambda: healthy(self.api), 10, "/healthz to answer")
        return self

    async def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(sig)
        try:
            return await asyncio.wait_for(self.proc.wait(), 15)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
            raise AssertionError("subs serve did not stop within 15 s") from None


@pytest.fixture
async def embedded_serves(config: Path) -> AsyncIterator[list[EmbeddedServe]]:
    started: list[EmbeddedServe] = []
    yield started
    for serve in started:
        if serve.proc is not None and serve.proc.returncode is None:
            await serve.stop(signal.SIGKILL)


async def test_a_second_serve_in_one_folder_is_refused_naming_the_first(
    config: Path, embedded_serves: list[EmbeddedServe]
):
    first = EmbeddedServe(config)
    embedded_serves.append(first)
    await first.start()
    assert first.proc is not None
    code, _, err = await subs("serve", "-c", str(config), "--port", "0")
    assert code == 1 and "Traceback" not in err, err
    assert f"another subs serve (pid {first.proc.pid}, api {first.api})" in err
    assert "--redis" in err
    assert await healthy(first.api)  # the first one never noticed

    # A serve that crashed leaves its lock behind in the file, not held: no obstacle.
    assert await first.stop(signal.SIGKILL) == -signal.SIGKILL
    second = EmbeddedServe(config)
    embedded_serves.append(second)
    await second.start()
    assert await second.stop() == 0


async def test_serve_and_check_say_the_same_of_slack_apps_without_their_tokens(
    config: Path, redis_url: str
):
    """An API-only set-up (no Slack variables) and a half-done one (a bot token alone):
    serve runs the engine and says why each app is off; check says the same, and fails
    for the half-done one only."""
    config.write_text(
        config.read_text() + "\n[agent.ops_openai.slack]\n\n[agent.ops_anthropic.slack]\n"
    )
    env = {
        f"SLACK_{var}_{agent}": ""
        for var in ("BOT_TOKEN", "APP_TOKEN", "SIGNING_SECRET")
        for agent in ("OPS_OPENAI", "OPS_ANTHROPIC")
    }
    env["SLACK_BOT_TOKEN_OPS_ANTHROPIC"] = "xoxb-half-done"
    serve = await EngineProcess(config, redis_url, env).start()
    try:

        async def both_said() -> list[str] | None:
            lines = [line for line in serve.stderr if line.startswith("subs: Slack app ")]
            return lines if len(lines) == 2 else None

        lines = await poll_until(both_said, 10, "serve's lines on the two Slack apps")
        assert await healthy(serve.api)
    finally:
        await serve.stop()
    assert lines == [
        "subs: Slack app ops_openai off: set SLACK_BOT_TOKEN_OPS_OPENAI and "
        "SLACK_APP_TOKEN_OPS_OPENAI (Socket Mode) or SLACK_SIGNING_SECRET_OPS_OPENAI (HTTP)",
        "subs: Slack app ops_anthropic off: SLACK_BOT_TOKEN_OPS_ANTHROPIC is set, but neither "
        "SLACK_APP_TOKEN_OPS_ANTHROPIC (Socket Mode) nor SLACK_SIGNING_SECRET_OPS_ANTHROPIC "
        "(HTTP): set one",
    ]
    code, out, err = await subs("check", "-c", str(config), env=env)
    rows = [json.loads(line) for line in out.splitlines() if "slack_off" in line]
    assert [f"subs: {row['why']}" for row in rows] == lines
    assert [row["partial"] for row in rows] == [False, True]
    assert code == 1, out + err
    del env["SLACK_BOT_TOKEN_OPS_ANTHROPIC"]  # both off by choice: nothing is wrong
    code, out, err = await subs("check", "-c", str(config), env=env)
    assert code == 0, out + err


# Redis answers clients while it loads once per 2 MB read: keys of 2.1 MB, each read
# KEY_LOAD_DELAY µs slower, make it answer every quarter second, for 3 s from the moment
# serve first connects (6.2 takes no CONFIG SET while loading: the time cannot be cut
# short once serve said it waits).
LOAD_KEYS = 12
KEY_LOAD_DELAY = 250_000


def _slow_to_load(data_dir: Path) -> None:
    """An AOF of LOAD_KEYS incompressible values, rewritten (its RDB preamble is what
    key-load-delay slows down); the server that wrote it is stopped."""
    with EmbeddedRedis(data_dir) as server, Redis.from_url(server.url) as client:
        client.config_set("auto-aof-rewrite-percentage", 0)  # the one rewrite is ours
        for i in range(LOAD_KEYS):
            client.set(f"bulk:{i}", os.urandom(2_100_000))
        client.bgrewriteaof()
        deadline = time.monotonic() + 30
        while client.info("persistence")["aof_rewrite_in_progress"]:
            assert time.monotonic() < deadline, "the AOF rewrite did not end"
            time.sleep(0.05)


class LoadsOnFirstConnect:
    """A unix socket that starts the redis-server (loading its AOF) when serve first
    connects to it, and from then on pipes every connection's bytes to that server.

    Redis's loading time runs from its own start, and serve's start (Python's imports)
    takes seconds on a busy machine: a Redis started beside serve could be done loading
    before serve ever asked. Started on serve's first connection, the server is loading
    whenever serve first reaches it, however long serve took to get there."""

    def __init__(self, path: Path, data_dir: Path) -> None:
        self.path = path
        self.data_dir = data_dir
        self.redis: subprocess.Popen[bytes] | None = None
        self.server: asyncio.Server | None = None
        self._started = asyncio.Lock()
        self._pipes: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> LoadsOnFirstConnect:
        self.server = await asyncio.start_unix_server(self._connected, str(self.path))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        for task in self._pipes:
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)
        if self.redis is not None:
            self.redis.terminate()
            await asyncio.to_thread(self.redis.wait, 10)

    async def _redis(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        socket_path = self.data_dir / "redis.sock"
        async with self._started:
            if self.redis is None:
                self.redis = subprocess.Popen(
                    [
                        find_redis_server(),
                        str(self.data_dir / CONFIG_NAME),
                        *("--key-load-delay", str(KEY_LOAD_DELAY)),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
        deadline = time.monotonic() + 10
        while True:  # a process start has no event to wait on: its socket appears
            try:
                return await asyncio.open_unix_connection(str(socket_path))
            except (FileNotFoundError, ConnectionRefusedError):
                assert time.monotonic() < deadline, "the loading redis-server did not listen"
                await asyncio.sleep(0.02)

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        task = asyncio.current_task()
        assert task is not None
        self._pipes.add(task)
        try:
            up_reader, up_writer = await self._redis()
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            writer.close()
            self._pipes.discard(task)


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()
    except ConnectionError:
        pass
    finally:
        sink.close()


async def test_serve_waits_for_a_redis_still_loading_its_aof_then_serves(
    tmp_path: Path, config: Path
):
    """Right after a Redis restart it answers LOADING: serve says it waits (one line) and
    serves once the data is in, instead of exiting 1."""
    data_dir = tmp_path / "redis"
    await asyncio.to_thread(_slow_to_load, data_dir)
    front = tmp_path / "front.sock"
    url = "unix://" + quote(str(front))
    async with LoadsOnFirstConnect(front, data_dir) as loading:
        serve = EngineProcess(config, url)
        starting = asyncio.create_task(serve.start())
        try:

            async def waiting() -> list[str]:
                assert not starting.done(), "serve started (or ended) while Redis was loading"
                return [line for line in serve.stderr if "loading" in line]

            said = await poll_until(waiting, 20, "serve to say it waits for the loading Redis")
            assert loading.redis is not None  # it was serve's connection that started it
            assert said[0].startswith(f"subs: Redis at {url} is loading its data; waiting"), said
            await starting
            assert [line for line in serve.stderr if "loading" in line] == said  # said once
            assert await healthy(serve.api)
            direct = "unix://" + quote(str(data_dir / "redis.sock"))  # not through the loop
            with Redis.from_url(direct) as client:
                assert client.exists("bulk:0", f"bulk:{LOAD_KEYS - 1}") == 2
            assert await serve.stop() == 0, serve.log_tail()
        finally:
            if not starting.done():
                starting.cancel()
            if serve.proc is not None and serve.proc.returncode is None:
                serve.kill()
                await serve.proc.wait()


async def test_serve_on_a_redis_that_never_answers_ends_with_the_clear_error(
    tmp_path: Path, config: Path
):
    """A Redis that takes the connection but never answers (not LOADING: nothing at all)
    still ends serve after the bound, with the error that names it. (A unix socket: a
    TCP URL is first asked whether it is a cluster node, which has a bound of its own.)

    The bound runs from serve's first connection, not from the process's start: Python's
    imports take seconds of their own on a busy machine, before serve asks anything. So
    the upper bound is measured from the moment the connection arrives, the lower one
    (serve gave up no sooner than 5 s) from the launch, which is earlier still."""
    path = tmp_path / "silent.sock"
    loop = asyncio.get_running_loop()
    connected: list[float] = []
    held: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connected.append(loop.time())
        held.append(writer)
        await reader.read()  # takes whatever serve sends, answers nothing, until it hangs up

    server = await asyncio.start_unix_server(silent, str(path))
    try:
        launched = loop.time()
        code, _, err = await subs(
            "serve", "-c", str(config), "--port", "0", "--redis", f"unix://{path}"
        )
        ended = loop.time()
    finally:
        server.close()
        for writer in held:
            writer.close()
    assert code == 1, err
    assert f"cannot reach Redis at unix://{path} (no answer within 5 s)" in err, err
    assert "Traceback" not in err and "loading" not in err, err
    assert connected, "serve never connected"
    assert ended - launched >= 5, ended - launched
    assert ended - connected[0] < 15, ended - connected[0]
