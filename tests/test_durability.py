"""[store] fsync and wait_replicas against real redis-servers: the start-up check, WAIT."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import pytest
from redis import Redis
from redis.asyncio import Redis as AsyncRedis
from redis.exceptions import ConnectionError as RedisConnectionError

from engine.config import StoreConfig
from engine.jsonedge import encode
from engine.runtime.engine import Engine
from engine.store.durability import check_server
from engine.store.embedded import EmbeddedRedis, find_redis_server
from engine.store.store import STORE_FAULTS, Commit, Store, StoreConflict, connect
from tests.engine_helpers import ENV, make_project, poll_until


@asynccontextmanager
async def embedded(tmp_path: Path, fsync: str) -> AsyncIterator[AsyncRedis]:
    """A private server, so CONFIG and ACL changes stay in this test."""
    with EmbeddedRedis(tmp_path / "redis", fsync=fsync) as server:  # type: ignore[arg-type]
        client = connect(server.url)
        try:
            yield client
        finally:
            await client.aclose()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def tcp_redis(data_dir: Path, *extra: str) -> Iterator[int]:
    """A redis-server on a loopback port (replication needs TCP); yields the port."""
    data_dir.mkdir()
    port = _free_port()
    args = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", str(data_dir)]
    proc = subprocess.Popen(
        [find_redis_server(), *args, *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        with Redis(port=port, socket_connect_timeout=1) as client:
            while True:
                try:
                    client.ping()
                    break
                except RedisConnectionError:
                    pass
                assert proc.poll() is None, "redis-server exited at start"
                assert time.monotonic() < deadline, "redis-server did not answer PING"
                time.sleep(0.02)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


def one_step(sid: str, seq: int) -> Commit:
    event = {"seq": seq, "session_id": sid, "payload": {"type": "test.step"}}
    return Commit(sid, seq - 1, seq, (encode(event),), snapshot=b'{"t":1}')


async def commit_steps(store: Store, sid: str, steps: int) -> list[float]:
    """Commits `steps` steps to `sid`; seconds each commit took."""
    p = store.partition_of(sid)
    lease = await store.acquire(p, "test", 30_000)
    assert lease is not None
    took = []
    for seq in range(1, steps + 1):
        started = time.monotonic()
        await store.commit(p, lease, one_step(sid, seq))
        took.append(time.monotonic() - started)
    return took


async def test_a_server_weaker_than_fsync_is_named_once(tmp_path, caplog):
    async with embedded(tmp_path, "everysec") as redis:
        line = await check_server(redis, "always")
        assert line is not None and "'everysec'" in line and "~1 s" in line
        assert [r.getMessage() for r in caplog.records] == [line]
        assert await check_server(redis, "everysec") is None
        await redis.config_set("appendonly", "no")
        line = await check_server(redis, "everysec")
        assert line is not None and "appendonly no" in line


async def test_a_server_refusing_config_is_said_so(tmp_path):
    async with embedded(tmp_path, "everysec") as redis:
        await redis.acl_setuser(
            "app", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-config"]
        )
        limited = AsyncRedis(
            unix_socket_path=redis.connection_pool.connection_kwargs["path"],
            username="app",
            password="pw",
        )
        try:
            line = await check_server(limited, "always")
        finally:
            await limited.aclose()
    assert line is not None and "CONFIG GET refused" in line


async def test_engine_checks_the_server_and_hands_wait_replicas_to_its_store(
    tmp_path, vendor, caplog
):
    project = make_project(tmp_path, vendor.url)
    project = dataclasses.replace(project, store=StoreConfig("always", 2, 300))
    async with embedded(tmp_path, "everysec") as redis:
        engine = Engine(project, redis, env=ENV)
        await engine.start()
        try:
            assert engine.store.replicas is not None
            assert (engine.store.replicas.replicas, engine.store.replicas.timeout_ms) == (2, 300)
        finally:
            await engine.stop()
    assert any("weaker than [store] fsync = 'always'" in r.getMessage() for r in caplog.records)


async def test_wait_without_replicas_times_out_but_the_commits_stand(tmp_path, caplog):
    async with embedded(tmp_path, "always") as redis:
        store = await Store.open(redis, wait_replicas=1, wait_timeout_ms=100)
        took = await commit_steps(store, "s1", 3)
        assert min(took) >= 0.1  # each commit waited for the replica that never came
        assert [e["seq"] for e in await store.read_log("s1")] == [1, 2, 3]
        snap = await store.load_snapshot("s1")
        assert snap is not None and (snap.seq, snap.at, snap.state) == (3, 3, {"t": 1})
    lines = [r.getMessage() for r in caplog.records if r.name == "subs.store"]
    assert len(lines) == 1, lines  # rate-limited: one line for the three short WAITs
    assert "reached 0 of 1 replicas in 100 ms; it stands" in lines[0]
    assert store.replicas is not None and store.replicas.short == 2


async def test_wait_returns_once_a_replica_has_the_commit(tmp_path, caplog):
    with (
        tcp_redis(tmp_path / "primary") as primary,
        tcp_redis(tmp_path / "replica") as replica_port,
    ):
        replica = AsyncRedis(port=replica_port)
        await replica.replicaof("127.0.0.1", primary)
        redis = connect(f"redis://127.0.0.1:{primary}")
        try:

            async def linked() -> bool:
                return (await replica.info("replication"))["master_link_status"] == "up"

            await poll_until(linked, 10, "the replica's link to the primary")
            store = await Store.open(redis, wait_replicas=1, wait_timeout_ms=10_000)
            took = await commit_steps(store, "s1", 3)
            assert max(took) < 2.0
            # WAIT returned: the replica already holds every step.
            entries = await replica.xrange(store.log_key("s1"))
            assert [e[0] for e in entries] == [b"1-0", b"2-0", b"3-0"]
        finally:
            await redis.aclose()
            await replica.aclose()
    assert not [r for r in caplog.records if r.name == "subs.store"]


@pytest.mark.parametrize("fsync", ["always", "everysec"])
async def test_the_embedded_servers_own_setting_passes(tmp_path, caplog, fsync):
    async with embedded(tmp_path, fsync) as redis:
        assert await check_server(redis, fsync) is None
    assert not caplog.records


def test_the_store_writes_what_the_edge_keeps() -> None:
    """Integers past 64 bits come through the edge exact (tests/test_jsonedge.py) and are
    written exact; what orjson cannot write is still refused like `json` refuses it."""
    big = 123456789012345678901234567890
    assert encode({"n": big, "s": "é"}) == '{"n":123456789012345678901234567890,"s":"é"}'.encode()
    with pytest.raises(ValueError, match="JSON compliant"):
        encode({"n": big, "x": float("nan")})


async def test_commits_go_on_after_redis_forgets_the_script_and_the_connection(redis) -> None:
    """A restarted Redis has no scripts, and the partition's commit connection is gone."""
    store = await Store.open(redis)
    sid = f"lines-{time.monotonic_ns()}"
    p = store.partition_of(sid)
    lease = await store.acquire(p, "test", 30_000)
    assert lease is not None
    await store.commit(p, lease, one_step(sid, 1))
    await redis.script_flush()
    await store.commit(p, lease, one_step(sid, 2))
    await redis.client_kill_filter(_type="normal", skipme=True)
    with pytest.raises(STORE_FAULTS):
        await store.commit(p, lease, one_step(sid, 3))  # the held connection was killed
    await store.commit(p, lease, one_step(sid, 3))  # a new one
    assert [e["seq"] for e in await store.read_log(sid)] == [1, 2, 3]


async def test_a_calls_last_deltas_go_out_once_with_the_commit_that_ends_it(redis) -> None:
    """Ahead of the script in one write: there even when Redis lost the script (sent
    again alone) or the commit is refused, and never written twice."""
    store = await Store.open(redis)
    sid = f"tail-{time.monotonic_ns()}"
    p = store.partition_of(sid)
    lease = await store.acquire(p, "test", 30_000)
    assert lease is not None

    def delta(n: int) -> dict[str, object]:
        return {"call_id": "c1", "attempt": 1, "seq": n, "text": f"w{n}"}

    async def written() -> list[int]:
        cut = await store.read_cut(sid)
        assert cut is not None
        return [d["seq"] for d in cut[1]]

    await store.commit(p, lease, one_step(sid, 1), [delta(1), delta(2)])
    assert await written() == [1, 2]
    await redis.script_flush()
    await store.commit(p, lease, one_step(sid, 2), [delta(3)])
    assert await written() == [1, 2, 3]
    with pytest.raises(StoreConflict):
        await store.commit(p, lease, one_step(sid, 2), [delta(4)])  # seq 2 is taken
    assert await written() == [1, 2, 3, 4]
    assert [e["seq"] for e in await store.read_log(sid)] == [1, 2]


async def test_a_follow_holds_one_connection_and_a_cancel_mid_read_drops_it(redis) -> None:
    """The follower's blocking read is on its own connection: closed after a yield, it goes
    back to the pool for reuse; cancelled while blocked, it is closed (its answer may
    still come) and Redis sees no reader left behind."""
    store = await Store.open(redis)
    sid = f"follow-{time.monotonic_ns()}"
    p = store.partition_of(sid)
    lease = await store.acquire(p, "test", 30_000)
    assert lease is not None

    async def readers() -> int:
        clients = await redis.client_list()
        return sum(1 for c in clients if c["cmd"] == "xread")

    await store.commit(p, lease, one_step(sid, 1))
    follow = store.follow(sid, 0, None, 10_000)
    assert await anext(follow) == (
        "event",
        {"seq": 1, "session_id": sid, "payload": {"type": "test.step"}},
    )
    await follow.aclose()  # between reads: the connection is clean
    blocked = asyncio.create_task(anext(store.follow(sid, 1, "0-0", 10_000)))
    await poll_until(lambda: _at_least(readers, 1), 5, "the follower blocked in XREAD")
    blocked.cancel()
    with pytest.raises(asyncio.CancelledError):
        await blocked
    await poll_until(lambda: _at_most(readers, 0), 5, "the blocked reader's connection closed")
    await store.commit(p, lease, one_step(sid, 2))  # the pool still serves


async def _at_least(count, n: int) -> bool:
    return await count() >= n


async def _at_most(count, n: int) -> bool:
    return await count() <= n
