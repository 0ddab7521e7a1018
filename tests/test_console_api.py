"""The console's server side over real HTTP: its files (types, the strict CSP, no key
needed, nothing but the shipped files), read-only keys, and the sessions list it reads
(totals, failures, filters, a bounded scan). The page itself is tested in a browser
(test_console.py)."""

from __future__ import annotations

import re
from importlib import resources
from typing import Any

import httpx
import pytest

from engine.api import ApiKeys, ApiKeysError, make_app
from engine.api.middleware import CONSOLE_POLICY
from engine.client import Client
from engine.runtime.engine import Engine
from tests.api_helpers import INPUT, ROOT, auth, read_stream, serve
from tests.engine_helpers import poll_until
from tests.fakes.llm_vendor import HttpError, Text, ToolCalls

READER = "reader-key"
KEYS = f"{ROOT},{READER}:read"
STATIC = resources.files("engine.console").joinpath("static")


@pytest.fixture
async def http(engine):
    app = make_app(Client(engine.store), engine.store, keys=ApiKeys.parse(KEYS), heartbeat=0.2)
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        yield client


async def start(http: httpx.AsyncClient, sid: str, agent: str, text: str) -> None:
    inp = {
        "type": "client.message",
        "agent_id": agent,
        "message": {"role": "user", "content": text},
    }
    answer = await http.post(INPUT, json={"session_id": sid, "input": inp}, headers=auth(ROOT))
    assert answer.status_code == 202, answer.text


async def settled(http: httpx.AsyncClient, sid: str, status: str) -> dict[str, Any]:
    async def seen() -> dict[str, Any] | None:
        view = (await http.get(f"/api/client/sessions/{sid}", headers=auth(ROOT))).json()
        return view if view["status"] == status else None

    return await poll_until(seen, 10, f"{sid} to be {status}")


# --- the files ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("/console", "text/html; charset=utf-8"),
        ("/console/sessions/ses_x", "text/html; charset=utf-8"),
        ("/console/static/app.js", "text/javascript; charset=utf-8"),
        ("/console/static/timeline.js", "text/javascript; charset=utf-8"),
        ("/console/static/console.css", "text/css; charset=utf-8"),
    ],
)
async def test_console_files_need_no_key_and_carry_their_type_and_a_strict_policy(
    http: httpx.AsyncClient, path: str, kind: str
) -> None:
    answer = await http.get(path)  # no key: the files hold no data
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == kind
    assert answer.headers["content-security-policy"] == CONSOLE_POLICY
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert "unsafe" not in CONSOLE_POLICY and "default-src 'self'" in CONSOLE_POLICY


@pytest.mark.parametrize("name", ["nope.js", "__init__.py", "..%2F__init__.py", "index.htm"])
async def test_only_the_shipped_files_are_served(http: httpx.AsyncClient, name: str) -> None:
    answer = await http.get(f"/console/static/{name}")
    assert answer.status_code == 404
    assert answer.json()["code"] == "not_found"
    assert answer.headers["content-security-policy"] == CONSOLE_POLICY


def test_the_page_runs_no_inline_code_and_every_import_is_shipped() -> None:
    """What the CSP would block must not be there: inline scripts, styles, handlers."""
    shipped = {entry.name for entry in STATIC.iterdir()}
    page = STATIC.joinpath("index.html").read_text()
    scripts = re.findall(r"<script\b([^>]*)>(.*?)</script>", page, re.S)
    assert scripts and all('src="/console/static/' in attrs and not body for attrs, body in scripts)
    assert "<style" not in page and " style=" not in page and not re.search(r" on\w+=", page)
    for name in shipped - {"index.html"}:
        text = STATIC.joinpath(name).read_text()
        assert "innerHTML" not in text and "eval(" not in text, name  # text, never markup
        for imported in re.findall(r'from "\./([\w.]+)"', text):
            assert imported in shipped, f"{name} imports {imported}, which is not shipped"


# --- read-only keys --------------------------------------------------------------------------


def test_a_read_key_parses_as_read_only_with_full_sight() -> None:
    keys = ApiKeys.parse("k-ops,k-watch:read")
    watcher = keys.authenticate("Bearer k-watch")
    assert watcher is not None and watcher.read_only and watcher.full
    ops = keys.authenticate("Bearer k-ops")
    assert ops is not None and not ops.read_only
    with pytest.raises(ApiKeysError, match="entry 1: empty key before ':read'"):
        ApiKeys.parse(":read")


async def test_a_read_only_key_sees_everything_and_changes_nothing(
    http: httpx.AsyncClient, vendor
) -> None:
    vendor.push(ToolCalls([("confirm", {"question": "Restart?"})]))
    await start(http, "ses-held", "ops_openai", "restart checkout")
    view = await poll_until(
        lambda: _with_open_call(http), 10, "the turn to wait on its client tool"
    )
    reader = auth(READER)
    assert (await http.get("/api/client/sessions/ses-held", headers=reader)).status_code == 200
    listed = (await http.get("/api/admin/sessions", headers=reader)).json()["items"]
    assert [row["session_id"] for row in listed] == ["ses-held"]
    # The engine's own commits keep the indexes: the running turn; a client call waits
    # with no deadline, so nothing wakes the session until an interrupt that expires.
    [held] = listed
    assert held["turn_id"] is not None and (held["status"], held["wake_at"]) == ("running", None)
    wake = "/api/admin/sessions?sort=wake_at_asc"
    assert (await http.get(wake, headers=reader)).json()["items"] == []
    expires = "2999-01-01T00:00:00Z"
    paused = await http.post(
        "/api/client/sessions/ses-held/interrupt",
        json={"reason": "confirm", "payload": {"expiresAt": expires}},
        headers=auth(ROOT),
    )
    assert paused.status_code == 202, paused.text
    [woken] = (await http.get(wake, headers=reader)).json()["items"]
    assert (woken["session_id"], woken["status"]) == ("ses-held", "interrupted")
    assert woken["wake_at"].startswith("2999-01-01T00:00:00")
    resume = {"type": "interrupt.resume", "interrupt_id": paused.json()["interrupt_id"]}
    body = {"session_id": "ses-held", "input": {**resume, "payload": {"ok": True}}}
    assert (await http.post(INPUT, json=body, headers=auth(ROOT))).status_code == 202
    assert (await http.get(wake, headers=reader)).json()["items"] == []
    events = (await http.get("/api/admin/sessions/ses-held/events", headers=reader)).json()
    assert events["events"][0]["payload"]["type"] == "session.created"
    frames = await read_stream(http, "ses-held", key=READER, stop=lambda f: f.id == "1")
    assert frames[0].event == "session.created"
    assert (await http.get("/metrics", headers=reader)).status_code == 200
    call_id = view["messages"][-1]["tool_calls"][0]["id"]
    refused = [
        await http.post("/api/client/sessions/ses-held/cancel", headers=reader),
        await http.post(
            INPUT,
            json={"input": {"type": "client.message", "agent_id": "ops_openai",
                            "message": {"role": "user", "content": "hi"}}},
            headers=reader,
        ),
        await http.post(
            "/api/client/sessions/ses-held/interrupt", json={"reason": "x"}, headers=reader
        ),
        await http.post(
            "/api/machine/sessions/ses-held/calls/settle",
            json={"id": call_id, "result": "yes"},
            headers=reader,
        ),
        await http.delete("/api/client/sessions/ses-held", headers=reader),
    ]  # fmt: skip
    for answer in refused:
        assert answer.status_code == 403, answer.text
        body = answer.json()
        assert body["code"] == "forbidden"
        assert "this key is read-only (a KEY:read entry in SUBS_API_KEYS)" in body["error"]
    assert (await settled(http, "ses-held", "running"))["turn_id"] == view["turn_id"]


async def _with_open_call(http: httpx.AsyncClient) -> dict[str, Any] | None:
    view = (await http.get("/api/client/sessions/ses-held", headers=auth(ROOT))).json()
    waiting = view["status"] == "running" and view["messages"][-1].get("tool_calls")
    return view if waiting else None


# --- the sessions list -----------------------------------------------------------------------


async def test_the_list_shows_totals_and_failures_and_filters_by_agent_and_status(
    http: httpx.AsyncClient, vendor, engine: Engine
) -> None:
    vendor.push(Text("All green."))
    await start(http, "ses-1-ok", "ops_openai", "is checkout up?")
    await settled(http, "ses-1-ok", "idle")
    vendor.push(HttpError(400))
    await start(http, "ses-2-bad", "ops_openai", "and payments?")
    await settled(http, "ses-2-bad", "idle")
    vendor.push(Text("Quiet."))
    await start(http, "ses-3-other", "ops_anthropic", "anything paging?")
    await settled(http, "ses-3-other", "idle")

    def listed(query: str) -> Any:
        return http.get(f"/api/admin/sessions?{query}", headers=auth(READER))

    rows = (await listed("limit=10")).json()["items"]
    assert [r["session_id"] for r in rows] == ["ses-3-other", "ses-2-bad", "ses-1-ok"]
    ok, bad = rows[2], rows[1]
    assert ok["tokens"] > 0 and float(ok["cost"]) > 0 and ok["turns"] == 1
    assert (ok["failed"], ok["error"]) == (False, None)
    assert bad["failed"] is True and bad["status"] == "failed"
    assert "400" in bad["error"] and bad["tokens"] == 0

    page = (await listed("agent_id=ops_openai&limit=10")).json()
    assert [r["session_id"] for r in page["items"]] == ["ses-2-bad", "ses-1-ok"]
    assert page["next_cursor"] is None
    page = (await listed("status=failed")).json()
    assert [r["session_id"] for r in page["items"]] == ["ses-2-bad"]
    page = (await listed("agent=ops_openai&limit=1")).json()  # `agent`: the older name
    assert [r["session_id"] for r in page["items"]] == ["ses-2-bad"]
    page = (await listed(f"agent=ops_openai&limit=1&cursor={page['next_cursor']}")).json()
    assert [r["session_id"] for r in page["items"]] == ["ses-1-ok"]
    running = (await listed("status=running")).json()
    assert (running["items"], running["next_cursor"]) == ([], None)
    assert running["store"]["full"] is False and running["store"]["used_memory"] > 0
    wrong = await listed("status=broken")
    assert wrong.status_code == 400 and wrong.json()["code"] == "invalid_query"
    assert "status: 'broken' is not one of idle, running, interrupted, failed" in wrong.text

    # A page's snapshots are read together, as each alone reads them (tails included).
    ids = ["ses-1-ok", "ses-404", "ses-2-bad", "ses-3-other"]
    together = await engine.store.load_snapshots(ids)
    assert together == [await engine.store.load_snapshot(sid) for sid in ids]
    assert together[1] is None and all(snap and snap.tail for snap in together[::2])
