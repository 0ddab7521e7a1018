"""The embedded redis-server: real processes, real sockets, real AOF."""

from __future__ import annotations

import os
import select
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from redis import Redis

from engine.embedded import EmbeddedRedis, EmbeddedRedisError, find_redis_server

CHILD = """
import sys
from redis import Redis
from engine.embedded import EmbeddedRedis
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
