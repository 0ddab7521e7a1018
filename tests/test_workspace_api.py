"""One bot a workspace shares (issue 26, items 4-5): session ids the engine's channels
derive are not a namespace an API key may plant in, a scoped key settles only its client
tools, `/metrics` is an operator's; and the open (keyless) API answers only local pages."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from engine.api import ApiKeys, make_app, make_runner
from engine.client import Client
from engine.runtime.engine import Engine
from tests.agui_helpers import run_path
from tests.api_helpers import ALICE, INPUT, ROOT, auth, serve
from tests.engine_helpers import ENV, make_project, wait_for_event
from tests.fakes.llm_vendor import FakeVendor, Text, ToolCalls
from tests.test_engine_worker import start_engine, worker_project

READER = "reader-key"
KEYS = ApiKeys.parse(f"{ROOT},{ALICE}:own,{READER}:read")
SLACK_SID = "slack:ops_openai:C0PLANTED:1700000000.000100"
JSON = {"Content-Type": "application/json"}


def say(text: str, agent: str = "ops_openai") -> dict[str, Any]:
    return {
        "type": "client.message",
        "agent_id": agent,
        "message": {"role": "user", "content": text},
    }


@asynccontextmanager
async def api(engine: Engine, keys: ApiKeys = KEYS, **kw: Any) -> AsyncIterator[httpx.AsyncClient]:
    app = make_app(Client(engine.store), engine.store, keys=keys, **kw)
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=10) as http:
        yield http


@pytest.fixture
async def engine(redis, vendor: FakeVendor, tmp_path: Path) -> AsyncIterator[Engine]:
    eng = Engine(make_project(tmp_path, vendor.url), redis, env=ENV, lease_ms=3000)
    await eng.start()
    yield eng
    await eng.stop()


# -- item 4: reserved ids, settles, /metrics -------------------------------------------------


async def test_a_scoped_key_can_neither_create_nor_write_a_slack_session(
    engine: Engine, vendor: FakeVendor
) -> None:
    vendor.default = Text("ok")
    async with api(engine) as http:
        planted = await http.post(
            INPUT, json={"session_id": SLACK_SID, "input": say("plant")}, headers=auth(ALICE)
        )
        assert planted.status_code == 403, planted.text
        body = planted.json()
        assert body["code"] == "reserved_session_id" and body["param"] == "session_id"
        assert "'slack:'" in body["error"] and "Slack bot" in body["error"]
        run = {
            "threadId": SLACK_SID,
            "runId": "run-1",
            "messages": [{"id": "m1", "role": "user", "content": "plant"}],
            "tools": [],
            "context": [],
            "state": None,
            "forwardedProps": None,
        }
        agui = await http.post(run_path("ops_openai"), json=run, headers=auth(ALICE))
        assert agui.status_code == 403 and agui.json()["param"] == "threadId", agui.text
        assert await engine.store.head(SLACK_SID) is None  # nothing was created
        # A full-access key may (the bot's own writes go through the engine's client).
        made = await http.post(
            INPUT, json={"session_id": SLACK_SID, "input": say("ops")}, headers=auth(ROOT)
        )
        assert made.status_code == 202, made.text
        base = f"/api/client/sessions/{SLACK_SID}"
        for method, path, body_ in [
            ("POST", f"{base}/cancel", {}),
            ("POST", f"{base}/interrupt", {"reason": "x"}),
            ("DELETE", base, None),
            ("POST", f"/api/machine/sessions/{SLACK_SID}/calls/settle", {"id": "c", "result": 1}),
        ]:
            resp = await http.request(method, path, json=body_, headers={**auth(ALICE), **JSON})
            assert resp.status_code == 403, (path, resp.text)
            assert resp.json()["code"] == "reserved_session_id", (path, resp.text)


async def test_a_scoped_key_cannot_settle_its_sessions_worker_call(
    redis, vendor: FakeVendor, test_worker, tmp_path: Path
) -> None:
    async def decide(request: dict[str, Any]) -> Any:
        if request["trigger"]["type"] == "tool.execute":
            return {}  # async: the worker's backend settles it later
        return request["proposed"]

    worker = await test_worker(decide, secret="wsecret-1234")
    project = worker_project(tmp_path, vendor.url, worker.url)
    engine = await start_engine(redis, project, secret="wsecret-1234")
    vendor.push(ToolCalls([("lookup", {"q": "x"})]), Text("Got it."))
    try:
        async with api(engine) as http:
            sent = await http.post(
                INPUT, json={"input": say("look", "helper")}, headers=auth(ALICE)
            )
            assert sent.status_code == 202, sent.text
            sid, turn = sent.json()["session_id"], sent.json()["turn_id"]
            client = Client(engine.store)
            waiting = await wait_for_event(
                client, sid, lambda e: e["payload"]["type"] == "tool.call.waiting"
            )
            call_id = waiting["payload"]["id"]
            path = f"/api/machine/sessions/{sid}/calls/settle"
            forged = await http.post(
                path, json={"id": call_id, "result": "forged"}, headers=auth(ALICE)
            )
            assert forged.status_code == 403, forged.text
            assert forged.json()["code"] == "forbidden" and "worker" in forged.json()["error"]
            assert "forged" not in str(await client.events(sid))
            real = await http.post(path, json={"id": call_id, "result": "real"}, headers=auth(ROOT))
            assert real.status_code == 202, real.text
            end = await wait_for_event(
                client,
                sid,
                lambda e: (
                    e.get("turn_id") == turn
                    and e["payload"]["type"] in ("turn.completed", "turn.failed")
                ),
            )
            assert end["payload"]["type"] == "turn.completed"
    finally:
        await engine.stop()


async def test_metrics_answers_full_and_read_keys_only(engine: Engine) -> None:
    async with api(engine) as http:
        assert (await http.get("/metrics", headers=auth(ROOT))).status_code == 200
        assert (await http.get("/metrics", headers=auth(READER))).status_code == 200
        scoped = await http.get("/metrics", headers=auth(ALICE))
        assert scoped.status_code == 403 and scoped.json()["code"] == "forbidden"
        assert "KEY:read" in scoped.json()["error"]


# -- item 5: the open API answers only this machine's own pages -------------------------------

OPEN = ApiKeys()  # no SUBS_API_KEYS: the open loopback mode


async def test_open_mode_answers_only_requests_for_its_own_host(engine: Engine) -> None:
    async with api(engine, OPEN, hosts=("127.0.0.1", "subs.example.com")) as http:
        rebound = await http.get("/api/admin/sessions", headers={"Host": "attacker.example:80"})
        assert rebound.status_code == 421, rebound.text
        assert rebound.json()["code"] == "misdirected_request"
        assert "attacker.example" in rebound.json()["error"]
        for host in ("localhost:8080", "subs.example.com", "[::1]:1"):
            ok = await http.get("/api/admin/sessions", headers={"Host": host})
            assert ok.status_code == 200, (host, ok.text)
        assert (await http.get("/api/admin/sessions")).status_code == 200  # 127.0.0.1:<port>
        # Slack's route is Slack's signature's to refuse, whatever name a tunnel gives it.
        tunnel = {"Host": "abc.tunnel.example", "Content-Type": "application/x-www-form-urlencoded"}
        slack = await http.post("/slack/ops_openai/events", headers=tunnel, content=b"x=1")
        assert slack.status_code == 404, slack.text  # no Slack app here: the router's 404
        # With keys the key is the guard: any name a proxy forwards is served.
        async with api(engine) as keyed:
            named = await keyed.get(
                "/api/admin/sessions", headers={"Host": "attacker.example", **auth(ROOT)}
            )
            assert named.status_code == 200


async def test_open_mode_writes_must_be_json_and_from_no_other_page(
    engine: Engine, vendor: FakeVendor
) -> None:
    vendor.push(ToolCalls([("confirm", {"question": "restart?"})]), Text("Restarted."))
    async with api(engine, OPEN) as http:
        sent = await http.post(INPUT, json={"input": say("restart the db")})
        assert sent.status_code == 202, sent.text
        sid, turn = sent.json()["session_id"], sent.json()["turn_id"]
        client = Client(engine.store)
        asked = await wait_for_event(
            client, sid, lambda e: e["payload"]["type"] == "tool.call.requested"
        )
        cancel = f"/api/client/sessions/{sid}/cancel"
        # What a form or a "simple" cross-origin fetch can send: no preflight, no JSON.
        for headers, content in [
            ({}, None),
            ({"Content-Type": "text/plain"}, b'{"reason": "x"}'),
            ({"Content-Type": "application/x-www-form-urlencoded"}, b"reason=x"),
        ]:
            refused = await http.post(cancel, headers=headers, content=content)
            assert refused.status_code == 415, (headers, refused.text)
            assert refused.json()["code"] == "unsupported_media_type"
        deleted = await http.delete(f"/api/client/sessions/{sid}")
        assert deleted.status_code == 415
        # Another page's Origin, JSON or not, and whatever the method.
        evil = {"Origin": "https://evil.example", **JSON}
        for method in ("POST", "GET"):
            path = cancel if method == "POST" else f"/api/client/sessions/{sid}"
            other = await http.request(method, path, headers=evil, content=b"{}")
            assert other.status_code == 403, other.text
            assert other.json()["code"] == "origin_not_allowed"
        view = (await http.get(f"/api/client/sessions/{sid}")).json()
        assert view["status"] == "running" and view["turn_id"] == turn  # the turn runs on
        # This server's own page (the console) sends its own Origin, and JSON.
        own = str(http.base_url).rstrip("/")
        settle = f"/api/machine/sessions/{sid}/calls/settle"
        answered = await http.post(
            settle,
            json={"id": asked["payload"]["id"], "result": "yes"},
            headers={"Origin": own},
        )
        assert answered.status_code == 202, answered.text
        end = await wait_for_event(
            client,
            sid,
            lambda e: (
                e.get("turn_id") == turn
                and e["payload"]["type"] in ("turn.completed", "turn.failed")
            ),
        )
        assert end["payload"]["type"] == "turn.completed"
        # A body-less write that says JSON is served (the CLI's and console's cancel).
        idle = await http.post(cancel, headers=JSON)
        assert idle.status_code == 409 and idle.json()["code"] == "no_turn_running"


async def test_a_client_trickling_its_headers_is_cut_off_within_the_bound(
    engine: Engine,
) -> None:
    bound = 0.6
    runner = make_runner(
        make_app(Client(engine.store), engine.store, keys=KEYS), header_timeout=bound
    )
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        # The server's bound runs from the moment it accepts: the clock starts before that.
        started = time.monotonic()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")

        async def trickle() -> int:
            sent = 0
            with contextlib.suppress(ConnectionError):
                while time.monotonic() - started < 10 * bound:
                    writer.write(b"X-Slow: %d\r\n" % sent)
                    await writer.drain()
                    sent += 1
                    await asyncio.sleep(bound / 10)  # the attack's pace, not a wait on state
            return sent

        dripping = asyncio.create_task(trickle())
        async with asyncio.timeout(10 * bound):
            rest = await reader.read()  # b"" once the server closes the connection
        closed_after = time.monotonic() - started
        dripping.cancel()
        writer.close()
        assert rest == b""  # no answer: the head never completed
        assert bound <= closed_after < bound + 1.0, closed_after
        # An honest client on the same server is served.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 200 ")
    finally:
        await runner.cleanup()
