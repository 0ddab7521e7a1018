"""1,100 event streams from one key against `subs serve`: the streams past the key's limit
are refused, the engine keeps every lease, and a turn run meanwhile takes about its usual
time and reaches every open stream."""

from __future__ import annotations

import asyncio
import re
import resource
import time
from pathlib import Path

import aiohttp
import pytest
from redis.asyncio import Redis

from engine.client import Client
from engine.store.store import Store
from tests.engine_helpers import (
    EngineProcess,
    poll_until,
    project_toml,
    turn_ended,
    wait_for_event,
)
from tests.fakes.llm_vendor import FakeVendor, Text

KEY = "load-key"
AGENT = "ops_openai"
STREAMS, LIMIT = 1100, 1000
TURN_FRAMES = ("turn.completed", "turn.failed")


def need_fds(n: int) -> None:
    """Raise this process's open-file soft limit to `n` (`subs serve` inherits it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= n:
        return
    if hard != resource.RLIM_INFINITY and hard < n:
        pytest.skip(f"needs {n} open files for {STREAMS} streams; the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (n, hard))


async def metric(http: aiohttp.ClientSession, name: str) -> float:
    async with http.get("/metrics", headers=AUTH) as resp:
        text = await resp.text()
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    assert found, f"{name} is not in /metrics"
    return float(found[1])


async def blocked_api_reads(redis: Redis) -> int:
    """Connections of the API's pool (named by `subs serve`) parked in a blocking read."""
    clients = await redis.client_list()
    return sum(c["name"] == "subs-api" and "b" in c["flags"] for c in clients)


AUTH = {"Authorization": f"Bearer {KEY}"}


def say(text: str, turn_id: str) -> dict:
    message = {"role": "user", "content": text}
    return {
        "type": "client.message",
        "agent_id": "ops_openai",
        "message": message,
        "turn_id": turn_id,
    }


async def timed_turn(
    http: aiohttp.ClientSession, client: Client, sid: str | None, turn_id: str
) -> tuple[str, float]:
    """Submit a turn over HTTP; the seconds until its end is in the log (read from Redis)."""
    started = time.perf_counter()
    body = {"input": say("go", turn_id), **({"session_id": sid} if sid else {})}
    async with http.post("/api/client/sessions/input", json=body, headers=AUTH) as resp:
        assert resp.status == 202, await resp.text()
        sid = (await resp.json())["session_id"]
    end = await wait_for_event(client, sid, turn_ended(turn_id), timeout=60)
    assert end["payload"]["type"] == "turn.completed", end
    return sid, time.perf_counter() - started


def sse_ids(body: str) -> list[int]:
    """The `id:` of each frame of an event stream's body: the events' seqs."""
    return [int(line[4:]) for line in body.splitlines() if line.startswith("id: ")]


async def test_1100_streams_from_one_key(tmp_path: Path, vendor: FakeVendor, redis_url, redis):
    need_fds(4 * STREAMS)
    config = tmp_path / "subs.toml"
    config.write_text(project_toml(vendor.url))
    vendor.responder = lambda body: Text("here for all", chunks=3)
    env = {"SUBS_API_KEYS": KEY, "SUBS_MAX_STREAMS_PER_KEY": str(LIMIT)}
    proc = await EngineProcess(config, redis_url, env=env).start()
    client = Client(await Store.open(redis))
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=None)
    connector = aiohttp.TCPConnector(limit=0)
    try:
        async with aiohttp.ClientSession(proc.api, connector=connector, timeout=timeout) as http:
            sid, _ = await timed_turn(http, client, None, "T-first")
            _, usual = await timed_turn(http, client, sid, "T-usual")
            owned = await metric(http, "subs_partitions_owned")
            assert owned == client.store.partitions  # the only engine owns them all
            end = (await client.events(sid))[-1]["seq"]

            path = f"/api/client/sessions/{sid}/events/stream"
            params = {"after_seq": str(end), "turn_id": "T-load"}

            async def open_stream() -> aiohttp.ClientResponse:
                return await http.get(path, params=params, headers=AUTH)

            responses: list[aiohttp.ClientResponse] = []
            for _ in range(0, STREAMS, 100):  # in waves: the listen backlog is 128
                responses += await asyncio.gather(*(open_stream() for _ in range(100)))
            ok = [r for r in responses if r.status == 200]
            refused = [r for r in responses if r.status != 200]
            assert (len(ok), len(refused)) == (LIMIT, STREAMS - LIMIT)
            for resp in refused:
                assert resp.status == 429 and resp.headers["Retry-After"] == "1"
                body = await resp.json()
                assert (body["code"], body["limit"]) == ("too_many_streams", LIMIT)
                assert "max_streams_per_key" in body["error"]
            bodies = [asyncio.create_task(r.text()) for r in ok]
            assert await metric(http, "subs_sse_streams_open") == LIMIT
            assert await metric(http, "subs_sse_readers") == 1
            assert await blocked_api_reads(redis) == 1  # one session, one reader

            _, loaded = await timed_turn(http, client, sid, "T-load")
            print(f"\nturn: {usual * 1e3:.0f} ms alone, {loaded * 1e3:.0f} ms with {LIMIT} streams")
            assert loaded < max(20 * usual, 5.0), (usual, loaded)
            got = await asyncio.wait_for(asyncio.gather(*bodies), 60)
            turn = await client.events(sid, end)
            assert turn[-1]["payload"]["type"] == "turn.completed"
            log = [e["seq"] for e in turn]
            assert all(sse_ids(body) == log for body in got)

            assert await metric(http, "subs_partitions_owned") == owned
            assert await metric(http, "subs_partition_leases_lost_total") == 0

            # The streams ended with their turn: every slot is free again.
            async def all_closed() -> bool:
                return await metric(http, "subs_sse_streams_open") == 0

            await poll_until(all_closed, 10, "every stream to close")
            assert await metric(http, "subs_sse_readers") == 0
            async with http.get(path, params={"turn_id": "T-load"}, headers=AUTH) as again:
                assert again.status == 200
                assert sse_ids(await again.text())[-1] == log[-1]
    finally:
        await proc.stop()
