"""A worker that decides later (upstream's docs/250-api.md, `POST /api/machine/workers/
submit`; docs/50-workers.md, "Answer a tool later"): it answers a decision request with an
empty body, then sends the DecisionResponse by `session_id` and `decision_id`. Real
worker, real HTTP, real Redis, the engine in process and as `subs serve` processes."""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from engine.api import ApiKeys, make_app
from engine.client import Client
from engine.config import parse_project
from engine.runtime.engine import Engine
from engine.store.snapshots import load_state
from engine.store.store import Store, connect
from tests.api_helpers import ROOT, auth, serve
from tests.engine_helpers import (
    ENV,
    EngineProcess,
    payloads,
    turn_ended,
    wait_for_event,
)
from tests.fakes.llm_vendor import FakeVendor, Text
from tests.workers import Reply

SUBMIT = "/api/machine/workers/submit"
KEYS = {"SUBS_API_KEYS": f"{ROOT}"}


def project_text(vendor_url: str, worker_url: str, retry: str = "") -> str:
    return textwrap.dedent(
        f"""\
        [llm.openai]
        type = "openai"
        base_url = "{vendor_url}/v1"

        [agent.helper]
        llm = "openai"
        model = "gpt-4.1-mini"
        worker = "{worker_url}"
        {retry}
        """
    )


class Deferring:
    """A worker's `decide`: the first control decision of each turn is answered with an
    empty body (kept here to answer later); everything else is the proposal."""

    def __init__(self) -> None:
        self.deferred: list[dict[str, Any]] = []
        self.arrived = asyncio.Event()

    async def __call__(self, request: dict[str, Any]) -> Any:
        if request["trigger"]["type"] == "client.messages" and not self.deferred:
            self.deferred.append(request)
            self.arrived.set()
            return Reply(200, b"")
        return request["proposed"]


def say(text: str) -> dict[str, Any]:
    return {
        "type": "client.message",
        "agent_id": "helper",
        "message": {"role": "user", "content": text},
    }


@asynccontextmanager
async def api(engine: Engine) -> AsyncIterator[httpx.AsyncClient]:
    app = make_app(Client(engine.store), engine.store, keys=ApiKeys.from_env(KEYS))
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=20) as http:
        yield http


async def test_an_async_decision_completes_the_turn_and_a_stale_id_is_refused(
    redis, vendor: FakeVendor, test_worker, tmp_path: Path
) -> None:
    deciding = Deferring()
    worker = await test_worker(deciding)
    vendor.default = Text("Disk is at 91%.")
    path = tmp_path / "subs.toml"
    path.write_text(project_text(vendor.url, worker.url))
    engine = Engine(parse_project(path.read_text(), str(path), env={}), redis, env=ENV)
    await engine.start()
    try:
        client = Client(engine.store)
        reply = await client.submit(say("how full is the disk?"))
        sid, turn_id = reply["session_id"], reply["turn_id"]
        await asyncio.wait_for(deciding.arrived.wait(), 10)
        waiting = await wait_for_event(
            client, sid, lambda e: e["payload"]["type"] == "decision.waiting"
        )
        request = deciding.deferred[0]
        assert waiting["payload"]["decision_id"] == request["decision_id"]
        state = await load_state(engine.store, sid)
        assert state is not None and state.decision is not None
        assert state.decision.status == "waiting" and state.decision.deadline is not None
        assert state.turn is not None  # the turn waits for the worker, under its deadline
        async with api(engine) as http:
            stale = {"session_id": sid, "decision_id": "dec_abc", "actions": []}
            resp = await http.post(SUBMIT, json=stale, headers=auth(ROOT))
            assert resp.status_code == 409, resp.text
            assert resp.json()["ok"] is False and resp.json()["code"] == "decision_not_pending"
            body = {"session_id": sid, "decision_id": request["decision_id"], **request["proposed"]}
            resp = await http.post(SUBMIT, json=body, headers=auth(ROOT))
            assert (resp.status_code, resp.json()) == (200, {"ok": True}), resp.text
            end = await wait_for_event(client, sid, turn_ended(turn_id))
            assert end["payload"]["type"] == "turn.completed"
            again = await http.post(SUBMIT, json=body, headers=auth(ROOT))  # repeated: refused
            assert again.status_code == 409 and again.json()["ok"] is False
            unknown = await http.post(
                SUBMIT, json={**body, "session_id": "ses_none"}, headers=auth(ROOT)
            )
            assert unknown.status_code == 404 and unknown.json()["ok"] is False
            bad = await http.post(
                SUBMIT, json={**body, "actions": [{"type": "nope"}]}, headers=auth(ROOT)
            )
            assert bad.status_code == 422 and bad.json()["ok"] is False
        events = await engine.store.read_log(sid)
        assert len(payloads(events, "decision.completed")) >= 1
        assert len(payloads(events, "turn.completed")) == 1
    finally:
        await engine.stop()


async def test_sigkill_between_the_empty_answer_and_the_submit_completes_once(
    redis_url: str, vendor: FakeVendor, test_worker, tmp_path: Path
) -> None:
    deciding = Deferring()
    worker = await test_worker(deciding)
    vendor.default = Text("Disk is at 91%.")
    config = tmp_path / "subs.toml"
    config.write_text(project_text(vendor.url, worker.url))
    first = await EngineProcess(config, redis_url, KEYS).start()
    second: EngineProcess | None = None
    redis = connect(redis_url)
    try:
        store = await Store.open(redis)
        client = Client(store)
        reply = await client.submit(say("how full is the disk?"))
        sid, turn_id = reply["session_id"], reply["turn_id"]
        await wait_for_event(client, sid, lambda e: e["payload"]["type"] == "decision.waiting")
        first.kill()
        await first.proc.wait()  # type: ignore[union-attr]
        second = await EngineProcess(config, redis_url, KEYS).start()
        request = deciding.deferred[0]
        body = {"session_id": sid, "decision_id": request["decision_id"], **request["proposed"]}
        async with httpx.AsyncClient(base_url=second.api, timeout=30) as http:
            resp = await http.post(SUBMIT, json=body, headers=auth(ROOT))
            assert (resp.status_code, resp.json()) == (200, {"ok": True}), resp.text
        end = await wait_for_event(client, sid, turn_ended(turn_id), timeout=30)
        assert end["payload"]["type"] == "turn.completed"
        events = await store.read_log(sid)
        assert len(payloads(events, "turn.completed")) == 1
        assert len(deciding.deferred) == 1  # the waiting decision was not sent again
        completed = [p for p in payloads(events, "decision.completed")]
        assert [p["decision_id"] for p in completed].count(request["decision_id"]) == 1
    finally:
        await redis.aclose()
        if second is not None:
            await second.stop()
        await first.stop()


async def test_a_deferred_decision_never_submitted_fails_at_its_deadline(
    redis, vendor: FakeVendor, test_worker, tmp_path: Path
) -> None:
    """The attempt's recorded deadline still ends it: a worker that never submits gets a
    failed attempt (`deadline_exceeded`), then a clean `turn.failed`; a late submit is 409."""
    deciding = Deferring()
    worker = await test_worker(deciding)
    path = tmp_path / "subs.toml"
    retry = "retry = { default = { run_timeout_secs = 1, max_attempts = 1 } }"
    path.write_text(project_text(vendor.url, worker.url, retry))
    engine = Engine(parse_project(path.read_text(), str(path), env={}), redis, env=ENV)
    await engine.start()
    try:
        client = Client(engine.store)
        reply = await client.submit(say("how full is the disk?"))
        sid, turn_id = reply["session_id"], reply["turn_id"]
        end = await wait_for_event(client, sid, turn_ended(turn_id), timeout=20)
        assert end["payload"]["type"] == "turn.failed"
        assert end["payload"]["error"]["code"] == "deadline_exceeded"
        events = await engine.store.read_log(sid)
        assert len(payloads(events, "decision.waiting")) == 1
        request = deciding.deferred[0]
        async with api(engine) as http:
            body = {"session_id": sid, "decision_id": request["decision_id"], "actions": []}
            resp = await http.post(SUBMIT, json=body, headers=auth(ROOT))
            assert resp.status_code == 409 and resp.json()["ok"] is False
    finally:
        await engine.stop()


async def test_a_cancel_ends_a_turn_waiting_on_a_deferred_decision(
    redis, vendor: FakeVendor, test_worker, tmp_path: Path
) -> None:
    deciding = Deferring()
    worker = await test_worker(deciding)
    path = tmp_path / "subs.toml"
    path.write_text(project_text(vendor.url, worker.url))
    engine = Engine(parse_project(path.read_text(), str(path), env={}), redis, env=ENV)
    await engine.start()
    try:
        client = Client(engine.store)
        reply = await client.submit(say("how full is the disk?"))
        sid, turn_id = reply["session_id"], reply["turn_id"]
        await wait_for_event(client, sid, lambda e: e["payload"]["type"] == "decision.waiting")
        await client.cancel(sid, "not needed")
        end = await wait_for_event(client, sid, turn_ended(turn_id))
        assert end["payload"]["type"] == "turn.failed"
        state = await load_state(engine.store, sid)
        assert state is not None and state.decision is None and state.turn is None
        request = deciding.deferred[0]
        async with api(engine) as http:
            body = {"session_id": sid, "decision_id": request["decision_id"], "actions": []}
            resp = await http.post(SUBMIT, json=body, headers=auth(ROOT))
            assert resp.status_code == 409 and resp.json()["code"] == "decision_not_pending"
    finally:
        await engine.stop()
