"""A full Redis is a clear error, not a crash (issue 27): past 90 % of maxmemory a new
session is refused with 503 store_full naming the setting, running turns finish, and a
commit Redis refuses at maxmemory (OOM) is waited out, never lost. A real redis-server
whose maxmemory the test sets (and puts back)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest

from engine.client import Client, ClientError
from engine.runtime.engine import Engine
from engine.store.embedded import EmbeddedRedis
from tests.engine_helpers import (
    assert_consistent,
    payloads,
    poll_until,
    turn_ended,
    wait_for_event,
)
from tests.fakes.llm_vendor import Text, ToolCalls


def say(text: str) -> dict:
    return {
        "type": "client.message",
        "agent_id": "ops_openai",
        "message": {"role": "user", "content": text},
    }


@contextlib.asynccontextmanager
async def maxmemory(redis, value: int) -> AsyncIterator[None]:
    await redis.config_set("maxmemory", value)
    try:
        yield
    finally:
        await redis.config_set("maxmemory", 0)


async def test_past_90_percent_a_new_session_is_refused_and_a_running_turn_finishes(
    engine: Engine, vendor
):
    vendor.push(ToolCalls([("confirm", {"question": "ok?"})]), Text("finished"))
    client = Client(engine.store)
    client.memory_every_s = 0  # read Redis's memory at every submit
    reply = await client.submit(say("start"))
    sid = reply["session_id"]
    call = await wait_for_event(
        client, sid, lambda e: e["payload"]["type"] == "tool.call.dispatched"
    )
    used = int((await engine.store.redis.info("memory"))["used_memory"])
    async with maxmemory(engine.store.redis, int(used / 0.92)):  # ~92 % used
        with pytest.raises(ClientError) as err:
            await client.submit(say("a new session"))
        assert err.value.status == 503 and err.value.code == "store_full"
        assert "[store] max_memory" in err.value.message and err.value.detail["maxmemory"] > 0
        await engine.leases._read_memory()
        assert engine.metrics.value("subs_store_full") == 1
        assert "subs_store_full 1" in engine.metrics.render()
        # The running session goes on: its input is taken, its turn ends.
        result = {"type": "tool.result", "id": call["payload"]["id"], "result": "yes"}
        await client.submit(result, session_id=sid)
        end = await wait_for_event(client, sid, turn_ended(reply["turn_id"]))
        assert end["payload"]["type"] == "turn.completed"
    await engine.leases._read_memory()
    assert engine.metrics.value("subs_store_full") == 0
    vendor.push(Text("room again"))
    assert (await client.submit(say("a new session")))["session_id"]


async def test_a_commit_refused_at_maxmemory_waits_for_room_and_is_not_lost(engine: Engine, vendor):
    """The model's answer arrives while Redis refuses every write (maxmemory 1 byte): the
    commit fails with OOM, is counted and retried, and lands once there is room; the
    turn completes with the whole answer."""
    vendor.push(Text("the whole answer", chunks=4, chunk_delay=0.3))
    client = Client(engine.store)
    reply = await client.submit(say("go"))
    sid = reply["session_id"]
    await wait_for_event(client, sid, lambda e: e["payload"]["type"] == "llm.call.dispatched")
    async with maxmemory(engine.store.redis, 1):
        await poll_until(
            lambda: _value(engine, "subs_store_oom_total"), 10, "a commit refused with OOM"
        )
    end = await wait_for_event(client, sid, turn_ended(reply["turn_id"]))
    assert end["payload"]["type"] == "turn.completed"
    events = await assert_consistent(engine.store, sid)
    assert payloads(events, "message.new")[-1]["message"]["content"] == "the whole answer"


async def _value(engine: Engine, name: str) -> float:
    return engine.metrics.value(name)


def test_the_embedded_server_gets_max_memory_and_noeviction(tmp_path):
    with EmbeddedRedis(tmp_path / "r", maxmemory=64 * 1024 * 1024) as server:
        import redis

        with redis.Redis(unix_socket_path=str(server.socket_path)) as r:
            assert r.config_get("maxmemory")["maxmemory"] == str(64 * 1024 * 1024)
            assert r.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
