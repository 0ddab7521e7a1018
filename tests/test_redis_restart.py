"""Redis dies mid-turn under load and comes back on the same AOF: nothing is lost or doubled.

`subs serve` runs as a process on a redis-server of the test's own; 20 sessions of a
worker-decided agent stream model answers when the server is SIGKILLed. The serve
process must wait Redis out (never exit), and every turn submitted before the kill
must end, completed, with each step once; then every session takes a normal turn.
"""

from __future__ import annotations

import asyncio
import os
import signal
import textwrap
from collections import Counter
from pathlib import Path

from engine.client import Client
from engine.store.embedded import EmbeddedRedis
from engine.store.store import Store, connect
from tests.engine_helpers import (
    EngineProcess,
    assert_consistent,
    payloads,
    poll_until,
    turn_ended,
    wait_for_event,
)
from tests.fakes.llm_vendor import Text
from tests.workers import echo_proposed

SESSIONS = 20


def _project(tmp_path: Path, vendor_url: str, worker_url: str) -> Path:
    path = tmp_path / "subs.toml"
    path.write_text(
        textwrap.dedent(
            f"""\
            name = "restart"

            [llm.openai]
            type = "openai"
            base_url = "{vendor_url}/v1"

            [agent.ops]
            llm = "openai"
            model = "gpt-4.1-mini"
            worker = "{worker_url}"
            retry = {{ default = {{ backoff_base_secs = 1, backoff_max_secs = 1 }} }}
            """
        )
    )
    return path


def _say(text: str) -> dict:
    return {
        "type": "client.message",
        "agent_id": "ops",
        "message": {"role": "user", "content": text},
    }


async def test_redis_sigkilled_mid_turn_and_restarted_loses_and_doubles_nothing(
    tmp_path, vendor, test_worker
):
    worker = await test_worker(echo_proposed)
    vendor.default = Text(" ".join(f"w{i}" for i in range(40)), chunk_delay=0.02)
    server = EmbeddedRedis(tmp_path / "redis")
    url = server.start()
    serve = await EngineProcess(_project(tmp_path, vendor.url, worker.url), url).start()
    redis = connect(url)
    try:
        store = await Store.open(redis)
        client = Client(store)
        turns = [await client.submit(_say(f"question {i}")) for i in range(SESSIONS)]

        async def streaming() -> bool:
            return len(vendor.requests) >= SESSIONS // 2

        await poll_until(streaming, 30, "model calls under way")
        pid = server.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        await asyncio.to_thread(server._proc.wait)  # type: ignore[union-attr]
        assert serve.proc is not None and serve.proc.returncode is None
        server = EmbeddedRedis(tmp_path / "redis")
        assert server.start() == url  # same socket, same AOF

        for turn in turns:
            end = await wait_for_event(
                client, turn["session_id"], turn_ended(turn["turn_id"]), timeout=60
            )
            assert end["payload"]["type"] == "turn.completed", end
        assert serve.proc.returncode is None, "subs serve exited while Redis was away"

        vendor.default = Text("after the restart")
        for turn in turns:
            sid = turn["session_id"]
            again = await client.submit(_say("and now?"), session_id=sid)
            end = await wait_for_event(client, sid, turn_ended(again["turn_id"]), timeout=30)
            assert end["payload"]["type"] == "turn.completed", end

        for turn in turns:
            events = await assert_consistent(store, turn["session_id"])
            started = Counter(p["turn_id"] for p in payloads(events, "turn.started"))
            assert all(n == 1 for n in started.values()) and len(started) == 2, started
            done = Counter((p["id"], p["attempt"]) for p in payloads(events, "llm.call.completed"))
            assert all(n == 1 for n in done.values()), done
            replies = [
                p["message"]["content"]
                for p in payloads(events, "message.new")
                if p["message"]["role"] == "assistant"
            ]
            assert len(replies) == 2 and replies[1] == "after the restart", replies
        listed = await store.list_sessions(limit=100)
        assert {t["session_id"] for t in turns} <= set(listed)
    finally:
        await redis.aclose()
        await serve.stop()
        server.stop()
