"""The admin list as the original engine pages it (`GET /api/admin/sessions`, its
docs/250-api.md): cursor pages over the listing indexes in each sort and filter, a
cursor that neither repeats nor skips while sessions are written between pages, one 400
naming a bad parameter, and indexes that retention and delete leave clean.

Sessions are written through the store's own commit (the script the engine commits
with, index entries included), on the real Redis and on the cluster, so a test can set
each session's times exactly; tests/test_console_api.py lists sessions real turns wrote.
"""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine.api import ApiKeys, make_app
from engine.client import Client
from engine.jsonedge import compact_json
from engine.machine import default_kinds, fold, iso, state_to_json
from engine.machine.evolve import at_ms
from engine.machine.state import ZERO_USAGE
from engine.store.index import IndexWrite, scopes_of
from engine.store.keys import META
from engine.store.reindex import DONE_FIELD, ensure_indexes, index_sessions
from engine.store.retention import REMOVED
from engine.store.store import Commit, Store
from tests.api_helpers import ROOT, auth, serve
from tests.engine_helpers import on_both_redis, subs
from tests.old_sessions import old_log, store_log

BASE = 1_780_000_000_000  # ms: the sessions' times are set, not read from a clock


@dataclass
class Writer:
    """Writes sessions through `Store.commit`, as the engine's commits do."""

    store: Store
    leases: dict[int, str]
    logs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    wakes: dict[str, int | None] = field(default_factory=dict)

    async def create(
        self, sid: str, *, at: int, agent: str = "oncall", parent: str | None = None
    ) -> None:
        created = {
            "type": "session.created",
            "agent_id": agent,
            "decider": "engine",
            "identity": {"subject": {"issuer": "api", "id": "t"}, "metadata": {}},
            "llm_routes": {},
            "ancestry": [parent] if parent else [],
        }
        self.logs[sid] = []
        await self._append(sid, [created], at, created=True)

    async def touch(self, sid: str, *, at: int, wake: int | None = None) -> None:
        """One more turn, its events at `at`; the session's wake time becomes `wake`."""
        turn = f"turn-{len(self.logs[sid])}"
        payloads = [
            {"type": "turn.started", "turn_id": turn},
            {"type": "turn.completed", "turn_id": turn, "cost": "0", "usage": ZERO_USAGE},
        ]
        self.wakes[sid] = wake
        await self._append(sid, payloads, at)

    async def _append(
        self, sid: str, payloads: list[dict[str, Any]], at: int, created: bool = False
    ) -> None:
        log = self.logs[sid]
        seq = len(log)
        new = [
            {"session_id": sid, "seq": seq + n, "occurred_at": iso(at), "payload": payload}
            for n, payload in enumerate(payloads, 1)
        ]
        log += new
        state = fold(log)
        assert state is not None
        p = self.store.partition_of(sid)
        commit = Commit(
            sid,
            seq,
            len(log),
            tuple(compact_json(e).encode() for e in new),
            compact_json(state_to_json(state)).encode(),
            created_ms=at if created else None,
            index=IndexWrite(
                state.created_at,
                at,
                self.wakes.get(sid),
                scopes_of(state.agent_id, not state.ancestry),
            ),
        )
        await self.store.commit(p, self.leases[p], commit)


@pytest.fixture
async def writer(redis) -> AsyncIterator[Writer]:
    store = await Store.open(redis)
    leases = {}
    for p in range(store.partitions):
        lease = await store.acquire(p, "test", 600_000)
        assert lease is not None
        leases[p] = lease
    yield Writer(store, leases)
    for p, lease in leases.items():
        await store.release(p, lease)


@pytest.fixture
async def http(writer: Writer) -> AsyncIterator[httpx.AsyncClient]:
    app = make_app(Client(writer.store), writer.store, keys=ApiKeys.parse(ROOT))
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=20) as client:
        yield client


async def _page(http: httpx.AsyncClient, **query: Any) -> dict[str, Any]:
    answer = await http.get("/api/admin/sessions", params=query, headers=auth(ROOT))
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


async def _walk(http: httpx.AsyncClient, **query: Any) -> list[str]:
    """Every page of a listing, in order; each page at most `limit` long."""
    ids: list[str] = []
    cursor = None
    for _ in range(1000):
        page = await _page(http, **query, **({"cursor": cursor} if cursor else {}))
        assert len(page["items"]) <= int(query.get("limit", 50))
        ids += [item["session_id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            return ids
    raise AssertionError("the listing never ended")


def _ordered(scores: dict[str, int], desc: bool) -> list[str]:
    """Redis's order: by score, equal scores by id (both reversed when descending)."""
    return sorted(scores, key=lambda sid: (scores[sid], sid.encode()), reverse=desc)


async def test_each_sort_pages_250_sessions_each_once_in_order(
    writer: Writer, http: httpx.AsyncClient
) -> None:
    rng = random.Random(30)
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    wake: dict[str, int] = {}
    top: set[str] = set()
    agents: dict[str, str] = {}
    parents: list[str] = []
    for n in range(250):
        sid = f"ses-{rng.randrange(10**6):06d}-{n}"
        agent = "oncall" if n % 3 else "triage"
        created = BASE + n * 1000
        sub = parents and n % 5 == 4
        await writer.create(sid, at=created, agent=agent, parent=parents[-1] if sub else None)
        if not sub:
            parents.append(sid)
            top.add(sid)
        # Later activity in another order; ties on purpose (equal ms, broken by id).
        active = BASE + 500_000 + rng.randrange(60) * 1000
        woken = BASE + 900_000 + rng.randrange(40) * 1000 if n % 4 else None
        await writer.touch(sid, at=active, wake=woken)
        first[sid], last[sid], agents[sid] = created, active, agent
        if woken is not None:
            wake[sid] = woken

    def only(scores: dict[str, int], keep: set[str]) -> dict[str, int]:
        return {sid: s for sid, s in scores.items() if sid in keep}

    everyone = set(first)
    cases = [
        ({}, _ordered(only(last, top), desc=True)),
        ({"sort": "last_event_desc"}, _ordered(only(last, top), desc=True)),
        ({"sort": "first_event_asc"}, _ordered(only(first, top), desc=False)),
        ({"sort": "first_event_desc"}, _ordered(only(first, top), desc=True)),
        ({"sort": "wake_at_asc"}, _ordered(only(wake, top), desc=False)),
        ({"top_level": "false"}, _ordered(last, desc=True)),
        ({"sort": "wake_at_asc", "top_level": "false"}, _ordered(wake, desc=False)),
        (
            {"agent_id": "triage", "sort": "first_event_asc", "top_level": "false"},
            _ordered(only(first, {s for s in everyone if agents[s] == "triage"}), desc=False),
        ),
        (
            {"agent_id": "oncall"},
            _ordered(only(last, {s for s in top if agents[s] == "oncall"}), desc=True),
        ),
    ]
    for query, expected in cases:
        assert await _walk(http, limit=17, **query) == expected, query
    # One page of all of them, and the items carry the original's fields with ours.
    page = await _page(http, limit=500, top_level="false", sort="wake_at_asc")
    assert page["next_cursor"] is None and len(page["items"]) == len(wake)
    item = page["items"][0]
    sid = item["session_id"]
    assert item["wake_at"] == iso(wake[sid]) and item["last_event_at"] == iso(last[sid])
    assert item["first_event_at"] == item["created_at"] == iso(first[sid])
    assert item["top_level"] is (sid in top) and item["turn_id"] is None
    assert (item["cost"], item["sub_agent_cost"], item["status"]) == ("0", "0", "idle")
    assert item["seq"] == 3 and item["agent_id"] == agents[sid]
    # One session by id, whatever its level; a filter it fails leaves the page empty.
    child = next(s for s in everyone - top)
    assert [i["session_id"] for i in (await _page(http, session_id=child))["items"]] == [child]
    assert (await _page(http, session_id=child, top_level="true"))["items"] == []
    assert (await _page(http, session_id="ses-none"))["items"] == []


@pytest.mark.parametrize("sort", ["last_event_desc", "wake_at_asc"])
async def test_a_cursor_holds_still_while_sessions_are_written_between_pages(
    writer: Writer, http: httpx.AsyncClient, sort: str
) -> None:
    """Sessions shown and not yet shown move (last event, wake time), new ones start,
    one not yet shown is deleted: a listing begun before shows each session that was
    there exactly once, in the order of its first page."""
    ids = [f"ses-{n:03d}" for n in range(120)]
    for n, sid in enumerate(ids):
        await writer.create(sid, at=BASE + n)
        await writer.touch(sid, at=BASE + 10_000 + n * 10, wake=BASE + 50_000 - n * 10)
    before = ids[::-1]  # the order of both sorts when the listing begins
    seen: list[str] = []
    page = await _page(http, limit=25, sort=sort)
    seen += [i["session_id"] for i in page["items"]]
    now = BASE + 100_000
    step = 0
    while page["next_cursor"] is not None:
        step += 1
        shown = seen[step % len(seen)]
        ahead = [s for s in before if s not in seen and s in writer.logs]
        now += 1000
        await writer.touch(shown, at=now, wake=BASE + 3)  # shown: to the top of both
        if len(ahead) > 3:
            await writer.touch(ahead[2], at=now + 1, wake=BASE + 1)  # not yet shown: too
            await writer.touch(ahead[1], at=now + 1, wake=None)  # out of the wake sort
            new = f"ses-new-{step}"
            await writer.create(new, at=now + 2)
            await writer.touch(new, at=now + 3, wake=BASE + 2)
            view = await Client(writer.store).session(ahead[-1])
            assert view is not None
            assert await writer.store.delete_session(ahead[-1], view["seq"])
            writer.logs.pop(ahead[-1])
        page = await _page(http, limit=25, sort=sort, cursor=page["next_cursor"])
        seen += [i["session_id"] for i in page["items"]]
    assert step >= 4
    assert len(seen) == len(set(seen)), "a session shown twice"
    kept = [s for s in before if s in writer.logs]
    assert [s for s in seen if s in kept] == kept, "skipped or out of order"
    assert all(s in kept or s.startswith("ses-new-") for s in seen)
    # A listing begun now is in the order the writes left.
    if sort == "last_event_desc":
        now_scores = {s: at_ms(log[-1]) for s, log in writer.logs.items()}
    else:
        now_scores = {s: w for s, w in writer.wakes.items() if w is not None and s in writer.logs}
    fresh = await _walk(http, limit=500, sort=sort)
    assert fresh == _ordered(now_scores, desc=sort == "last_event_desc")


@on_both_redis
async def test_the_cursor_pages_on_a_cluster_too(writer: Writer, http: httpx.AsyncClient) -> None:
    ids = [f"ses-c{n:03d}" for n in range(60)]
    for n, sid in enumerate(ids):
        await writer.create(sid, at=BASE + n, agent="oncall" if n % 2 else "triage")
        await writer.touch(sid, at=BASE + 1000 + n, wake=BASE + 5000 - n)
    page = await _page(http, limit=20)
    shown = [i["session_id"] for i in page["items"]]
    await writer.touch(ids[0], at=BASE + 9000)  # not yet shown: moves to the top
    await writer.touch(shown[0], at=BASE + 9001)  # shown: moves to the top again
    rest = await _walk_from(http, page["next_cursor"], limit=20)
    assert shown + rest == ids[::-1]
    assert await _walk(http, limit=7, sort="wake_at_asc", agent_id="triage") == [
        s for s in ids[::-1] if ids.index(s) % 2 == 0 and s != ids[0]
    ]


async def _walk_from(http: httpx.AsyncClient, cursor: str | None, **query: Any) -> list[str]:
    ids: list[str] = []
    while cursor is not None:
        page = await _page(http, cursor=cursor, **query)
        ids += [i["session_id"] for i in page["items"]]
        cursor = page["next_cursor"]
    return ids


async def test_a_bad_parameter_is_one_400_naming_it(
    writer: Writer, http: httpx.AsyncClient
) -> None:
    for n in range(3):
        await writer.create(f"ses-{n}", at=BASE + n)
    cursor = (await _page(http, limit=1))["next_cursor"]
    assert cursor is not None
    cases = [
        ({"sort": "newest"}, "sort", "is not one of last_event_desc, first_event_asc"),
        ({"limit": "0"}, "limit", "expected an integer 1..500"),
        ({"limit": "501"}, "limit", "expected an integer 1..500"),
        ({"limit": "lots"}, "limit", "expected an integer"),
        ({"top_level": "maybe"}, "top_level", "is not one of true, false"),
        ({"status": "broken"}, "status", "is not one of idle, running"),
        ({"offset": "2"}, "offset", "pages by cursor now"),
        ({"cursor": "not-a-cursor"}, "cursor", "not a cursor this server made"),
        ({"cursor": "x" * 5000}, "cursor", "send next_cursor as the previous page gave it"),
        ({"cursor": cursor, "sort": "first_event_asc"}, "cursor", "made for another sort"),
        ({"cursor": cursor, "agent_id": "triage"}, "cursor", "other filters"),
    ]
    for query, param, words in cases:
        answer = await http.get("/api/admin/sessions", params=query, headers=auth(ROOT))
        assert answer.status_code == 400, (query, answer.text)
        body = answer.json()
        assert (body["code"], body["param"]) == ("invalid_query", param), body
        assert words in body["error"] and param in body["error"], body
        assert "Traceback" not in answer.text


async def test_deleted_removed_and_restored_sessions_keep_the_indexes_exact(
    writer: Writer,
) -> None:
    store = writer.store
    for n, sid in enumerate(["ses-a", "ses-b", "ses-c"]):
        await writer.create(sid, at=BASE + n, agent="triage")
        await writer.touch(sid, at=BASE + 10 + n, wake=BASE + 20 + n)

    async def members() -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        async for key in store.redis.scan_iter(match="subs:{*}:ix:*"):
            name = key.decode()
            if name.endswith(":moves") or name.endswith(":mark"):
                continue
            for m in await store.redis.zrange(name, 0, -1):
                out.setdefault(m.decode(), set()).add(name.split(":ix:")[1])
        return out

    every = {"first:t", "last:t", "wake:t", "first:a:triage:t", "last:a:triage:t"}
    every.add("wake:a:triage:t")
    assert await members() == {"ses-a": every, "ses-b": every, "ses-c": every}
    assert await store.delete_session("ses-a", 3)
    assert await store.remove_session("ses-b", 3) == REMOVED  # retention's removal
    assert await members() == {"ses-c": every}
    # Written back from an archive: indexed again as it was (runtime/retention.py).
    events = [compact_json(e).encode() for e in writer.logs["ses-b"]]
    state = fold(writer.logs["ses-b"])
    assert state is not None
    snapshot = compact_json(state_to_json(state)).encode()
    assert await store.restore_session("ses-b", events, snapshot, state.created_at)

    assert await index_sessions(store, ["ses-b"], default_kinds()) == 1
    back = await members()
    assert back["ses-b"] == {n for n in every if not n.startswith("wake")}  # no deadline armed
    assert (
        await store.redis.zscore(store.index_key(store.partition_of("ses-b"), "last", "t"), "ses-b")
        == BASE + 11
    )


async def test_sessions_an_older_version_wrote_are_indexed_once(writer: Writer) -> None:
    store = writer.store
    logs = [old_log(f"ses-old-{n}", {"role": "user", "content": "hi"}, minute=n) for n in range(5)]
    for log in logs:
        await store_log(store, log, indexed=False)  # the stream, snapshot and creation index only
    await store.redis.hdel(META, DONE_FIELD)
    await ensure_indexes(store)
    assert await store.redis.hget(META, DONE_FIELD) == b"1"
    client = Client(store)
    page = await client.list_page(sort="first_event_asc", limit=50)
    assert [i["session_id"] for i in page["items"]] == [log[0]["session_id"] for log in logs]
    page = await client.list_page(limit=50)
    assert [i["last_event_at"] for i in page["items"]] == [
        log[-1]["occurred_at"] for log in logs[::-1]
    ]


async def test_subs_sessions_list_pages_by_cursor_locally_and_over_the_api(
    writer: Writer, http: httpx.AsyncClient, redis_url: str, config: Path
) -> None:
    """`--limit` pages; the next page's command is said on stderr; the same over `--url`."""
    ids = [f"ses-cli-{n}" for n in range(3)]
    for n, sid in enumerate(ids):
        await writer.create(sid, at=BASE + n)
    for where in (("-c", str(config), "--redis", redis_url), ("--url", str(http.base_url))):
        env = {"SUBS_API_KEY": ROOT} if where[0] == "--url" else None
        shown: list[str] = []
        more: list[str] = []
        for _ in range(4):
            code, out, err = await subs(
                "sessions", "list", "-o", "jsonl", "--limit", "2", *more, *where, env=env
            )
            assert code == 0, err
            shown += [json.loads(line)["session_id"] for line in out.splitlines()]
            if not err:
                break
            assert err.startswith("subs: more: subs sessions list --cursor "), err
            more = ["--cursor", err.split()[-1]]
        assert shown == ids[::-1], where
        code, out, err = await subs("sessions", "list", "--cursor", "nonsense", *where, env=env)
        assert code == 1 and "cursor: not a cursor this server made" in err, err
