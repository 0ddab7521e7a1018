"""Readers of old data: sessions stored by an older version (a user message with no content,
content null, parts without text, a role this version does not know; tests/old_sessions.py)
list and read back in the CLI (a real `subs` process) and over the HTTP API, every one of
them, next to a failed one whose status reads `failed` everywhere. The console's list of
them is drawn in a real browser in test_console.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine.api import ApiKeys, make_app
from engine.client import Client
from engine.messages import text_of
from engine.runtime.engine import Engine
from engine.store.keys import META
from engine.store.reindex import DONE_FIELD
from engine.store.store import Store, connect
from tests.api_helpers import ROOT, auth, serve
from tests.engine_helpers import subs
from tests.old_sessions import FAILURE, OLD_FIRST_MESSAGES, old_logs, store_log

LOGS = old_logs()
IDS = [log[0]["session_id"] for log in LOGS]
# What each lists as its first words: a user message's text, "" when it has none, None
# when the session has no user message at all.
FIRST_WORDS = {
    "ses-old-no-content": "",
    "ses-old-null-content": "",
    "ses-old-parts-no-text": "",
    "ses-old-text-parts": "look at",
    "ses-old-unknown-role": None,
    "ses-old-failed": "hi",
}
assert set(FIRST_WORDS) == {*OLD_FIRST_MESSAGES, "ses-old-failed"}


@pytest.mark.parametrize(
    ("content", "text"),
    [
        ("plain", "plain"),
        (None, ""),
        ([], ""),
        ([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "ab"),
        ([{"type": "image_url", "image_url": {"url": "u"}}, {}, "loose", 7], ""),
        ([{"type": "text", "text": None}, {"type": "text", "text": 3}, {"text": "kept"}], "kept"),
        ({"text": "an object"}, ""),
        (42, ""),
    ],
)
def test_a_stored_content_reads_as_text_whatever_it_holds(content: Any, text: str) -> None:
    """The one reader of a message's text (the lists, AG-UI, the Slack bot's turn view)."""
    assert text_of(content) == text


async def _seed(store: Store) -> None:
    for log in LOGS:
        await store_log(store, log, indexed=False)
    # An older version kept no listing indexes: the first listing builds them (reindex.py).
    await store.redis.hdel(META, DONE_FIELD)


def _check_rows(rows: list[dict[str, Any]]) -> None:
    """Every old session listed, newest first, as a person should read it."""
    assert [r["session_id"] for r in rows] == IDS[::-1], "newest first"
    for row, log in zip(rows, LOGS[::-1], strict=True):
        sid = row["session_id"]
        assert row["first_message"] == FIRST_WORDS[sid], sid
        assert row["turns"] == 1 and row["agent_id"] == "ops_openai"
        # One time format in a row: the events' own (ISO 8601, UTC, milliseconds).
        assert row["created_at"] == log[0]["occurred_at"], sid
        assert row["last_activity_at"] == log[-1]["occurred_at"], sid
        if sid == "ses-old-failed":
            assert (row["status"], row["failed"], row["error"]) == ("failed", True, FAILURE)
        else:
            assert (row["status"], row["failed"], row["error"]) == ("idle", False, None), sid


@pytest.fixture
async def seeded(redis_url: str) -> str:
    redis = connect(redis_url)
    try:
        await _seed(await Store.open(redis))
    finally:
        await redis.aclose()
    return redis_url


async def test_old_sessions_list_and_read_in_the_cli(seeded: str, config: Path) -> None:
    local = ("-c", str(config), "--redis", seeded)
    code, out, err = await subs("sessions", "list", "-o", "jsonl", *local)
    assert code == 0 and err == "", err
    _check_rows([json.loads(line) for line in out.splitlines()])

    code, out, err = await subs("sessions", "list", "-o", "pretty", *local)
    assert code == 0 and err == "", err
    header, *lines = out.splitlines()
    assert header.split() == [
        "SESSION", "AGENT", "STATUS", "LAST", "ACTIVITY", "TURNS", "FIRST", "MESSAGE"
    ]  # fmt: skip
    shown = {line.split()[0]: line.split() for line in lines}
    assert list(shown) == IDS[::-1]
    for sid, cells in shown.items():
        assert cells[2] == ("failed" if sid == "ses-old-failed" else "idle"), cells
        n = IDS.index(sid)
        assert cells[3:5] == ["2025-06-01", f"09:{n:02d}:{len(LOGS[n]):02d}"], cells
    assert shown["ses-old-text-parts"][-2:] == ["look", "at"]

    for log in LOGS:
        sid = log[0]["session_id"]
        code, out, err = await subs("sessions", "events", sid, "-o", "jsonl", *local)
        assert code == 0 and err == "", err
        assert [json.loads(line) for line in out.splitlines()] == log
    for sid in ("ses-old-no-content", "ses-old-text-parts"):
        code, out, err = await subs("sessions", "events", sid, "-o", "pretty", *local)
        assert code == 0 and err == "", err
        assert "message.new" in out and len(out.splitlines()) == 5, out


async def test_old_sessions_list_and_read_over_the_api(engine: Engine) -> None:
    await _seed(engine.store)
    app = make_app(Client(engine.store), engine.store, keys=ApiKeys.parse(ROOT))
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=10) as http:
        listed = await http.get("/api/admin/sessions", headers=auth(ROOT))
        assert listed.status_code == 200, listed.text
        _check_rows(listed.json()["items"])
        failed = await http.get("/api/admin/sessions?status=failed", headers=auth(ROOT))
        assert [r["session_id"] for r in failed.json()["items"]] == ["ses-old-failed"]
        idle = await http.get("/api/admin/sessions?status=idle", headers=auth(ROOT))
        assert [r["session_id"] for r in idle.json()["items"]] == IDS[-2::-1]
        for log in LOGS:
            sid = log[0]["session_id"]
            view = await http.get(f"/api/client/sessions/{sid}", headers=auth(ROOT))
            assert view.status_code == 200, view.text
            stored = [e["payload"]["message"] for e in log if e["payload"]["type"] == "message.new"]
            assert view.json()["messages"] == stored
            events = await http.get(f"/api/admin/sessions/{sid}/events", headers=auth(ROOT))
            assert events.status_code == 200 and events.json()["events"] == log
