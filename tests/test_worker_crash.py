"""An engine SIGKILLed while a worker is deciding: the next engine asks again, once.

SPEC §12: on restart the engine fails its own in-flight work and sends it again at
once; an answered decision_id does nothing; finished work is never repeated.
"""

from __future__ import annotations

import asyncio
import signal
import textwrap
from pathlib import Path
from typing import Any

import pytest

from engine.client import Client
from engine.store.store import Store
from tests.engine_helpers import (
    EngineProcess,
    assert_consistent,
    payloads,
    turn_ended,
    wait_for_event,
)
from tests.fakes.llm_vendor import FakeVendor, Text

SECRET = "crash-worker-secret"
REPLY = "Nothing is paging."


@pytest.fixture
async def engines(redis_url):
    """Starts `subs serve` processes (they inherit os.environ); stops each at teardown."""
    started: list[EngineProcess] = []

    async def start(config: Path) -> EngineProcess:
        proc = EngineProcess(config, redis_url, {"HELPER_SECRET": SECRET})
        started.append(proc)
        return await proc.start()

    yield start
    for proc in started:
        if proc.proc is not None:
            await proc.stop()


def config(tmp_path: Path, vendor: FakeVendor, worker_url: str) -> Path:
    path = tmp_path / "subs.toml"
    path.write_text(
        textwrap.dedent(
            f"""\
            [llm.openai]
            type = "openai"
            base_url = "{vendor.openai_base()}"

            [agent.helper]
            llm = "openai"
            model = "gpt-4.1-mini"
            system = "You help."
            worker = "{worker_url}"
            signing_secret_env = "HELPER_SECRET"
            """
        )
    )
    return path


class SlowFirstDecision:
    """Echoes proposals; holds its FIRST client.messages answer until `release` is set."""

    def __init__(self) -> None:
        self.asked: list[dict[str, Any]] = []  # every client.messages request
        self.first_arrived = asyncio.Event()
        self.asked_again = asyncio.Event()
        self.release = asyncio.Event()
        self.first_over = asyncio.Event()  # answered late, or cancelled with its connection

    async def __call__(self, request: dict[str, Any]) -> Any:
        if request["trigger"]["type"] != "client.messages":
            return request["proposed"]
        self.asked.append(request)
        if len(self.asked) > 1:
            self.asked_again.set()
            return request["proposed"]
        self.first_arrived.set()
        try:
            await self.release.wait()
            return request["proposed"]
        finally:
            self.first_over.set()


async def test_a_decision_lost_with_its_engine_is_asked_again_and_applied_once(
    redis, vendor, test_worker, engines, tmp_path
):
    vendor.push(Text(REPLY, chunks=3))
    slow = SlowFirstDecision()
    worker = await test_worker(slow, secret=SECRET)
    path = config(tmp_path, vendor, worker.url)
    first = await engines(path)
    store = await Store.open(redis)
    client = Client(store)
    reply = await client.submit(
        {
            "type": "client.message",
            "agent_id": "helper",
            "message": {"role": "user", "content": "is anything paging?"},
        }
    )
    sid, turn_id = reply["session_id"], reply["turn_id"]

    async with asyncio.timeout(20):
        await slow.first_arrived.wait()
    first.kill()
    assert await first.stop() == -signal.SIGKILL

    await engines(path)

    async with asyncio.timeout(20):
        await slow.asked_again.wait()
    lost, again = slow.asked
    assert again["decision_id"] == lost["decision_id"]
    assert (lost["attempts"], again["attempts"]) == (1, 2)

    # The late answer to attempt 1: its connection died with the engine.
    slow.release.set()
    async with asyncio.timeout(10):
        await slow.first_over.wait()

    end = await wait_for_event(client, sid, turn_ended(turn_id), timeout=20)
    assert end["payload"]["type"] == "turn.completed"
    events = await assert_consistent(store, sid)

    def of_decision(kind: str) -> list[dict[str, Any]]:
        return [p for p in payloads(events, kind) if p["decision_id"] == lost["decision_id"]]

    assert [p["attempt"] for p in of_decision("decision.dispatched")] == [1, 2]
    assert [p["attempt"] for p in of_decision("decision.completed")] == [2]
    (errored,) = of_decision("decision.errored")
    assert errored["attempt"] == 1 and errored["retryable"] and not errored["final"]
    assert "engine" in errored["error"]["message"] and "stopped" in errored["error"]["message"]
    messages = [p["message"] for p in payloads(events, "message.new")]
    assert [(m["role"], m["content"]) for m in messages] == [
        ("user", "is anything paging?"),
        ("assistant", REPLY),
    ]
    assert len(vendor.requests) == 1  # the model was asked once
    assert len(slow.asked) == 2  # and the worker no more than twice
