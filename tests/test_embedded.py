"""The embedded redis-server: real processes, real sockets, real AOF."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import inspect
import os
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from engine.cli.remote import HttpClient
from engine.client import ClientError
from engine.store import supervisor
from engine.store.embedded import EmbeddedRedis, EmbeddedRedisError, find_redis_server
from engine.store.supervisor import RESTART_BACKOFF, Supervisor
from tests.engine_helpers import EngineProcess, poll_until, project_toml, start_subs
from tests.fakes.llm_vendor import FakeVendor, Text

CHILD = """
import sys
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from engine.store.embedded import EmbeddedRedis
server = EmbeddedRedis(sys.argv[1])
server.start()
Redis.from_url(server.url).set("written-by", "child")
print(server.pid, flush=True)
sys.stdin.read()
"""


def _alive(pid: int) -> bool:
    """Running and not a zombie (an orphan's zombie may linger until init reaps it)."""
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return status.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _wait_dead(pid: int, timeout: float = 10.0) -> bool:
    """Wait for the process to end: its pidfd becomes readable when it does (Linux 5.3+)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
    finally:
        os.close(fd)
    return bool(ready) or not _alive(pid)


def test_find_redis_server_is_executable() -> None:
    path = find_redis_server()
    assert os.access(path, os.X_OK)
    out = subprocess.run([path, "--version"], capture_output=True, text=True, check=True).stdout
    assert out.startswith("Redis server v=")


def test_start_ping_stop(tmp_path: Path) -> None:
    data_dir = tmp_path / "new" / ".subs"  # created on start
    server = EmbeddedRedis(data_dir)
    url = server.start()
    try:
        assert url == f"unix://{data_dir / 'redis.sock'}"
        assert server.owned
        assert server.pid is not None and _alive(server.pid)
        assert stat.S_IMODE((data_dir / "redis.sock").stat().st_mode) == 0o700
        with Redis.from_url(url, decode_responses=True) as client:
            assert client.ping()
            assert client.config_get("port") == {"port": "0"}
            assert client.config_get("appendonly") == {"appendonly": "yes"}
            assert client.config_get("appendfsync") == {"appendfsync": "always"}
    finally:
        server.stop()
    assert server.pid is None
    assert not (data_dir / "redis.sock").exists()


def test_fsync_setting_becomes_appendfsync(tmp_path: Path) -> None:
    with (
        EmbeddedRedis(tmp_path, fsync="everysec") as server,
        Redis.from_url(server.url, decode_responses=True) as client,
    ):
        assert client.config_get("appendfsync") == {"appendfsync": "everysec"}


def test_data_survives_restart_via_aof(tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path) as server, Redis.from_url(server.url) as client:
        entry_id = client.xadd("sess:1:events", {"type": "started"})
        client.set("sess:1:snap", b"v1")
    assert not (tmp_path / "dump.rdb").exists()  # no RDB saves: the AOF alone carries it
    with EmbeddedRedis(tmp_path) as again, Redis.from_url(again.url) as client:
        assert again.owned
        assert client.get("sess:1:snap") == b"v1"
        assert client.xrange("sess:1:events") == [(entry_id, {b"type": b"started"})]


def test_second_instance_reuses_live_server(tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path) as first:
        second = EmbeddedRedis(tmp_path)
        assert second.start() == first.url
        assert not second.owned
        assert second.pid is None
        second.stop()
        assert first.pid is not None and _alive(first.pid)
        with Redis.from_url(first.url) as client:
            assert client.ping()


def test_stale_socket_and_pidfile_are_replaced(tmp_path: Path) -> None:
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(tmp_path / "redis.sock"))  # bound, never listened: like after a crash
    stale.close()
    # A live but unrelated pid, as after pid reuse: must not count as "server running".
    (tmp_path / "redis.pid").write_text(f"{os.getpid()}\n")
    with EmbeddedRedis(tmp_path) as server, Redis.from_url(server.url) as client:
        assert server.owned
        assert client.ping()
        assert (tmp_path / "redis.pid").read_text() == f"{server.pid}\n"


def test_start_failure_reports_binary_and_log(tmp_path: Path) -> None:
    fake = tmp_path / "fake-redis-server"
    fake.write_text("#!/bin/sh\necho 'FATAL CONFIG FILE ERROR (fake)' >&2\nexit 3\n")
    fake.chmod(0o755)
    server = EmbeddedRedis(tmp_path / "data", binary=str(fake))
    with pytest.raises(EmbeddedRedisError) as info:
        server.start()
    message = str(info.value)
    assert str(fake) in message
    assert "code 3" in message
    assert "FATAL CONFIG FILE ERROR (fake)" in message
    assert not server.owned


def test_overlong_socket_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(EmbeddedRedisError, match="shorter data dir"):
        EmbeddedRedis(tmp_path / ("x" * 120)).start()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_server_dies_with_its_parent(tmp_path: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    redis_pid = None
    try:
        assert child.stdout is not None
        redis_pid = int(child.stdout.readline())
        assert _alive(redis_pid)
        child.kill()
        child.wait()
        assert _wait_dead(redis_pid), "redis-server outlived its SIGKILLed parent"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if redis_pid is not None and _alive(redis_pid):
            os.kill(redis_pid, signal.SIGKILL)
    # It went down via SIGTERM, so the AOF was flushed and the dir is free again.
    with EmbeddedRedis(tmp_path) as server, Redis.from_url(server.url) as client:
        assert server.owned
        assert client.get("written-by") == b"child"


async def test_supervise_backs_off_while_restarts_fail(tmp_path: Path, caplog) -> None:
    """A server that will not start is tried again after 0, 0.5, 1 s...; each try is logged."""
    broken = tmp_path / "broken-redis-server"
    broken.write_text("#!/bin/sh\necho 'cannot start (fake)' >&2\nexit 1\n")
    broken.chmod(0o755)
    server = EmbeddedRedis(tmp_path / "data")
    real = server.start()
    supervisor = asyncio.create_task(Supervisor(server).run())
    try:
        with Redis.from_url(real) as client:
            client.set("kept", "yes")
        server.binary = str(broken)
        assert server.pid is not None
        os.kill(server.pid, signal.SIGKILL)

        async def failed_twice() -> bool:
            return sum("could not be restarted" in r.getMessage() for r in caplog.records) >= 2

        await poll_until(failed_twice, 10, "two failed restarts")
        server.binary = None  # the real one again: found on the next try

        async def restarted() -> bool:
            return any("restarted it as pid" in r.getMessage() for r in caplog.records)

        await poll_until(restarted, 10, "the restart's log line")
        assert await server_answers(server)()
    finally:
        supervisor.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await supervisor
        server.stop()
    # The supervisor's lines, one a try: not the server's own "loading its AOF; waiting",
    # said when a restarted server is still loading as it is first asked.
    messages = [
        r.getMessage()
        for r in caplog.records
        if r.name == "subs.embedded" and "restart" in r.getMessage()
    ]
    assert "(try 1): " in messages[0] and "cannot start (fake)" in messages[0]
    assert "(try 2): " in messages[1]
    done = messages[-1]
    assert "was killed by SIGKILL" in done and "restarted it as pid" in done
    # Tries 1 and 2 came after 0 and 0.5 s; each further one waited longer than the last.
    assert f"(restart {len(messages)}, after {RESTART_BACKOFF[len(messages) - 1]:.1f} s" in done
    with EmbeddedRedis(tmp_path / "data") as again, Redis.from_url(again.url) as client:
        assert client.get("kept") == b"yes"


async def test_a_sharer_restarts_the_server_when_its_starter_is_gone(tmp_path: Path) -> None:
    starter = EmbeddedRedis(tmp_path)
    starter.start()
    sharer = EmbeddedRedis(tmp_path)
    sharer.start()
    assert not sharer.owned
    supervisor = asyncio.create_task(Supervisor(sharer).run())
    try:
        starter.stop()  # as when the `subs` that started it exits
        await poll_until(server_answers(sharer), 10, "the sharer's own server")
        assert sharer.owned and sharer.pid is not None and _alive(sharer.pid)
    finally:
        supervisor.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await supervisor
        sharer.stop()


def server_answers(server: EmbeddedRedis) -> Callable[[], Awaitable[bool]]:
    async def answers() -> bool:
        # Not server.alive(): its probe takes the lock of a dead server for a moment.
        with Redis.from_url(server.url, socket_timeout=1) as client:
            try:
                return bool(client.ping())
            except RedisConnectionError:
                return False

    return answers


async def _lines(stream: asyncio.StreamReader, into: list[str]) -> None:
    """Keeps reading a process's stderr (a full pipe would block it) into `into`."""
    while line := await stream.readline():
        into.append(line.decode(errors="replace"))


async def test_serve_restarts_its_embedded_server_on_the_same_aof(
    tmp_path: Path, vendor: FakeVendor
) -> None:
    vendor.default = Text("back again")
    config = tmp_path / "subs.toml"
    config.write_text(project_toml(vendor.url))
    pidfile = tmp_path / ".subs" / "redis.pid"
    serve = await start_subs("serve", "-c", str(config), "--port", "0")
    assert serve.stderr is not None
    stderr: list[str] = []
    reading: asyncio.Task[None] | None = None
    pids: list[int] = []
    try:
        async with asyncio.timeout(20):
            first = (await serve.stderr.readline()).decode()
        assert first.startswith("subs: engine "), first
        reading = asyncio.create_task(_lines(serve.stderr, stderr))
        api = HttpClient(first.split("; api ")[1].split(";")[0])
        before = await api.submit(say("before"))
        await _turn_completed(api, before)
        pids.append(int(pidfile.read_text()))
        assert _alive(pids[0])

        os.kill(pids[0], signal.SIGKILL)

        async def restarted() -> int | None:
            pid = int(pidfile.read_text() or 0)
            return pid if pid != pids[0] and _alive(pid) else None

        pids.append(await poll_until(restarted, 20, "a new redis-server"))

        async def healthy() -> bool:
            try:
                async with api.http.get(f"{api.base_url}/healthz") as response:
                    return response.status == 200
            except aiohttp.ClientError:
                return False

        await poll_until(healthy, 20, "/healthz to answer 200 again")

        async def said() -> list[str]:
            return [line for line in stderr if "the embedded redis-server died" in line]

        lines = await poll_until(said, 5, "the restart's log line")
        assert len(lines) == 1, stderr
        assert f"pid {pids[0]} was killed by SIGKILL" in lines[0]
        assert f"restarted it as pid {pids[1]}" in lines[0]
        assert str(tmp_path / ".subs" / "redis.sock") in lines[0]

        # The same AOF: the session from before is there, and takes another turn.
        after = await api.submit(say("after"), session_id=before["session_id"])
        events = await _turn_completed(api, after)
        users = [
            e["payload"]["message"]["content"]
            for e in events
            if e["payload"]["type"] == "message.new" and e["payload"]["message"]["role"] == "user"
        ]
        assert users == ["before", "after"]
        await api.aclose()
    finally:
        if serve.returncode is None:
            serve.send_signal(signal.SIGTERM)
        async with asyncio.timeout(15):
            await serve.wait()
        if reading is not None:
            await reading
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert serve.returncode == 0, stderr
    assert all(_wait_dead(pid) for pid in pids)  # serve stopped the server it restarted


def say(text: str) -> dict:
    message = {"role": "user", "content": text}
    return {"type": "client.message", "agent_id": "ops_openai", "message": message}


async def _turn_completed(api: HttpClient, reply: dict) -> list[dict]:
    """Follows the turn to its end; the session's whole log once it completed."""
    sid, turn_id = reply["session_id"], reply["turn_id"]
    async with asyncio.timeout(30):
        async for kind, event in api.follow(sid, turn_id=turn_id):
            if kind == "event" and event.get("turn_id") == turn_id:
                end = event["payload"]["type"]
                if end in ("turn.completed", "turn.failed"):
                    assert end == "turn.completed", event
    return await api.events(sid)


async def _health(api: str) -> tuple[int, dict]:
    """/healthz's status and body; fails the test when it takes over 2 s to answer."""
    async with aiohttp.ClientSession() as http:
        try:
            async with (
                asyncio.timeout(2),
                http.get(f"{api}/healthz") as response,
            ):
                return response.status, await response.json()
        except TimeoutError:
            raise AssertionError("/healthz did not answer within 2 s") from None


async def test_the_data_folder_removed_under_a_serve_mid_turn_is_written_again_from_memory(
    tmp_path: Path, vendor: FakeVendor
) -> None:
    """`rm -rf .subs` under a running serve: the API goes on answering, the turn ends, the
    folder is made again with an AOF from the live server's memory, SIGTERM still ends
    the serve in seconds, and the next serve finds every session."""
    vendor.default = Text(" ".join(f"w{i}" for i in range(30)), chunk_delay=0.05)
    config = tmp_path / "subs.toml"
    config.write_text(project_toml(vendor.url))
    folder = tmp_path / ".subs"
    serve = await EngineProcess(config, None).start()
    pids: list[int] = []
    api = HttpClient(serve.api)
    try:
        pids.append(int((folder / "redis.pid").read_text()))
        reply = await api.submit(say("before"))
        await vendor.wait_for_requests(1)
        shutil.rmtree(folder)  # mid-turn: the model's answer is still streaming

        async def written_again() -> int | None:
            with contextlib.suppress(FileNotFoundError, ValueError):
                pid = int((folder / "redis.pid").read_text())
                if pid != pids[0] and _alive(pid):
                    return pid
            await _health(serve.api)  # answers throughout (200, or 503 naming the folder)
            return None

        pids.append(await poll_until(written_again, 20, "a server on the folder made again"))
        assert _wait_dead(pids[0], 5), "the server on the removed folder still runs"
        await _turn_ends_though_streams_break(api, reply)
        assert await _health(serve.api) == (200, {"status": "ok"})
        said = [line for line in serve.stderr if "was removed" in line]
        assert len(said) == 2, serve.log_tail()  # one when it is seen, one when it is mended
        assert "writing it again from memory" in said[0]
        assert "nothing is lost" in said[1] and str(folder) in said[1], said
        assert f"pid {pids[1]}, was pid {pids[0]}" in said[1]
    finally:
        await api.aclose()
        try:
            code = await serve.stop(within=5)
        finally:
            for pid in pids:
                if _alive(pid):
                    os.kill(pid, signal.SIGKILL)
    assert code == 0, serve.log_tail()
    assert "Traceback" not in "\n".join(serve.stderr), serve.log_tail()
    assert all(_wait_dead(pid, 5) for pid in pids)

    # The next serve loads the AOF written from memory: the session, and a turn on it.
    again = await EngineProcess(config, None).start()
    api = HttpClient(again.api)
    try:
        vendor.default = Text("after")
        after = await api.submit(say("after"), session_id=reply["session_id"])
        events = await _turn_completed(api, after)
        users = [
            e["payload"]["message"]["content"]
            for e in events
            if e["payload"]["type"] == "message.new" and e["payload"]["message"]["role"] == "user"
        ]
        assert users == ["before", "after"]
        pid = int((folder / "redis.pid").read_text())
    finally:
        await api.aclose()
        assert await again.stop() == 0, again.log_tail()
    assert _wait_dead(pid, 5)


async def _turn_ends_though_streams_break(api: HttpClient, reply: dict) -> None:
    """Polls the session's log (a stream open while the server restarts breaks, told to
    retry) until the turn completed."""

    async def ended() -> str | None:
        with contextlib.suppress(ClientError):
            for event in await api.events(reply["session_id"]):
                if event.get("turn_id") == reply["turn_id"]:
                    end = event["payload"]["type"]
                    if end in ("turn.completed", "turn.failed"):
                        return str(end)
        return None

    assert await poll_until(ended, 30, "the turn to end") == "turn.completed"


async def test_a_data_folder_that_cannot_be_made_again_is_said_on_healthz_until_it_can(
    tmp_path: Path, vendor: FakeVendor
) -> None:
    """The whole project folder removed: `.subs` cannot be made again, which /healthz
    (503) and the log say, once; once the parent is back it is made again from memory.
    SIGTERM still ends the serve within 5 s and leaves no redis-server behind."""
    vendor.default = Text("kept in memory")
    project = tmp_path / "project"
    project.mkdir()
    config = project / "subs.toml"
    config.write_text(project_toml(vendor.url))
    folder = project / ".subs"
    serve = await EngineProcess(config, None).start()
    pids = [int((folder / "redis.pid").read_text())]
    api = HttpClient(serve.api)
    try:
        reply = await api.submit(say("remember this"))
        await _turn_ends_though_streams_break(api, reply)
        shutil.rmtree(project)

        async def degraded() -> dict | None:
            status, body = await _health(serve.api)
            return body if status == 503 else None

        body = await poll_until(degraded, 10, "/healthz to say the store is degraded")
        assert body["code"] == "store_unavailable" and body["status"] == "degraded", body
        assert "cannot be made again (No such file or directory)" in body["redis"], body
        assert body["error"].endswith(body["redis"]), body
        assert str(tmp_path) not in str(body)  # /healthz is open to anyone: no paths
        said = [line for line in serve.stderr if "cannot be made again" in line]
        assert len(said) == 1 and str(folder) in said[0], serve.log_tail()

        project.mkdir()

        async def mended() -> int | None:
            status, _ = await _health(serve.api)
            with contextlib.suppress(FileNotFoundError, ValueError):
                pid = int((folder / "redis.pid").read_text())
                if status == 200 and pid != pids[0]:
                    return pid
            return None

        pids.append(await poll_until(mended, 20, "the folder to be made again"))
        assert any("nothing is lost" in line for line in serve.stderr), serve.log_tail()
        events = await api.events(reply["session_id"])
        assert any(e["payload"]["type"] == "turn.completed" for e in events)
    finally:
        await api.aclose()
        try:
            code = await serve.stop(within=5)
        finally:
            for pid in pids:
                if _alive(pid):
                    os.kill(pid, signal.SIGKILL)
    assert code == 0, serve.log_tail()
    assert all(_wait_dead(pid, 5) for pid in pids)


# What may block the loop: a module's I/O, a subprocess, a file lock, a sleep, and every
# method of EmbeddedRedis (processes, files, PINGs). os.close and os.getpid return at once.
_BLOCKING_MODULES = {"os", "shutil", "fcntl", "subprocess", "socket", "select", "time.sleep"}
_RETURN_AT_ONCE = {"os.close", "os.getpid"}


def blocking_calls_on_the_loop(source: str) -> list[str]:
    """Calls in `source` that may block, made by code that runs on the event loop: any
    function but those handed to asyncio.to_thread (by name; their calls run there)."""
    tree = ast.parse(source)
    server = {name for name, _ in inspect.getmembers(EmbeddedRedis, inspect.isfunction)}

    def dotted(node: ast.expr) -> str:
        if isinstance(node, ast.Attribute):
            return f"{dotted(node.value)}.{node.attr}"
        return node.id if isinstance(node, ast.Name) else "?"

    threaded = {
        dotted(call.args[0]).rpartition(".")[2]
        for call in ast.walk(tree)
        if isinstance(call, ast.Call) and dotted(call.func) == "asyncio.to_thread" and call.args
    }
    found = []
    for func in ast.walk(tree):
        if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if func.name in threaded:
            continue
        for call in ast.walk(func):
            if not isinstance(call, ast.Call):
                continue
            name = dotted(call.func)
            if name in _RETURN_AT_ONCE:
                continue
            module = name.partition(".")[0]
            method = name.rpartition(".")[2]
            on_server = "server." in name and method in server
            if module in _BLOCKING_MODULES or name in _BLOCKING_MODULES or on_server:
                found.append(f"{func.name}: {name}() on line {call.lineno}")
            if method in ("wait", "poll", "flock", "read_text", "write_text", "mkdir", "stat"):
                found.append(f"{func.name}: {name}() on line {call.lineno}")
    return found


def test_the_supervisor_calls_nothing_blocking_on_the_event_loop() -> None:
    assert blocking_calls_on_the_loop(Path(supervisor.__file__).read_text()) == []
    # The check sees what the supervisor once did: Popen.wait through ended(), a lock.
    wedged = (
        "async def supervise(server):\n"
        "    while True:\n"
        "        await asyncio.sleep(0.1)\n"
        "        if server.alive():\n"
        "            continue\n"
        "        how = server.ended()\n"
        "        await asyncio.to_thread(server.start)\n"
    )
    assert blocking_calls_on_the_loop(wedged) == [
        "supervise: server.alive() on line 4",
        "supervise: server.ended() on line 6",
    ]


async def test_supervision_never_holds_the_loop_through_a_death_and_a_removed_folder(
    tmp_path: Path, caplog
) -> None:
    """asyncio's debug mode logs every callback that holds the loop past 0.3 s. A watchdog
    SIGKILLs the server should the loop stay blocked (as on a Popen.wait on it), so a
    regression fails with that warning instead of hanging."""
    loop = asyncio.get_running_loop()
    server = EmbeddedRedis(tmp_path / "data")
    await asyncio.to_thread(server.start)
    watched = Supervisor(server)
    supervising = asyncio.create_task(watched.run())
    debug, slow = loop.get_debug(), loop.slow_callback_duration
    loop.set_debug(True)
    loop.slow_callback_duration = 0.3
    pids = [server.pid]
    try:
        with Redis.from_url(server.url) as client:
            client.set("kept", "yes")
        assert server.pid is not None
        os.kill(server.pid, signal.SIGKILL)

        def said(what: str) -> Callable[[], Awaitable[bool]]:
            async def logged() -> bool:  # the supervisor is done with it: not just a PING
                return any(what in r.getMessage() for r in caplog.records)

            return logged

        await poll_until(said("restarted it as pid"), 10, "the restart")
        pids.append(server.pid)
        await asyncio.to_thread(shutil.rmtree, server.data_dir)
        dying = server.pid
        # A thread: a callback on the loop would not run while the loop is blocked.
        watchdog = threading.Timer(5, lambda: _alive(dying) and os.kill(dying, signal.SIGKILL))
        watchdog.start()
        try:
            await poll_until(said("nothing is lost"), 10, "the folder made again")
        finally:
            watchdog.cancel()
        pids.append(server.pid)
        assert watched.problem is None
        with Redis.from_url(server.url) as client:
            assert client.get("kept") == b"yes"
    finally:
        loop.set_debug(debug)
        loop.slow_callback_duration = slow
        supervising.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await supervising
        await asyncio.to_thread(server.stop)
    slow_ones = [
        r.getMessage() for r in caplog.records if r.name == "asyncio" and " took " in r.getMessage()
    ]
    assert slow_ones == []
    assert all(pid is not None and _wait_dead(pid, 5) for pid in pids)
