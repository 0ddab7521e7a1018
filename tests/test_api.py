"""The HTTP API against the real engine: real redis-server, fake vendor, real ports."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from aiohttp import web
from httpx_sse import EventSource, aconnect_sse

from engine.api import ApiKeys, ApiKeysError, SseLimits, bind_warning, check_bind, make_app
from engine.api.stream import PING, sse_frame
from engine.client import Client, ClientError
from engine.metrics import Metrics
from engine.runtime.engine import Engine
from engine.store.store import Store
from tests.api_helpers import (
    ALICE,
    BOB,
    INPUT,
    KEYS_ENV,
    ROOT,
    auth,
    deltas_of,
    events_of,
    of_type,
    read_stream,
    serve,
    sse_frames,
    stream_path,
)
from tests.engine_helpers import on_both_redis, poll_until
from tests.fakes.llm_vendor import Text, ToolCalls

MAX_BODY = 64 * 1024


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


def app_for(engine: Engine, metrics: Metrics, **kw: Any):
    kw.setdefault("max_body", MAX_BODY)
    kw.setdefault("heartbeat", 0.2)
    keys = ApiKeys.from_env(KEYS_ENV)
    return make_app(Client(engine.store), engine.store, keys=keys, metrics=metrics, **kw)


@pytest.fixture
async def http(engine, metrics):
    """A client of the API (no credential by default: each call names its key)."""
    async with (
        serve(app_for(engine, metrics)) as url,
        httpx.AsyncClient(base_url=url, timeout=10) as client,
    ):
        yield client


def say(text: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": "client.message",
        "agent_id": "ops_openai",
        "message": {"role": "user", "content": text},
        **extra,
    }


async def submit(http: httpx.AsyncClient, inp: dict, *, key: str = ROOT, **envelope: Any) -> dict:
    resp = await http.post(INPUT, json={"input": inp, **envelope}, headers=auth(key))
    assert resp.status_code == 202, resp.text
    return resp.json()


async def counted(metrics: Metrics, name: str, n: int) -> bool:
    return metrics.value(name) == n


async def streams_open(metrics: Metrics, n: int) -> None:
    """Wait until the API holds `n` event streams (a stream ends when its handler does)."""
    await poll_until(lambda: counted(metrics, "subs_sse_streams_open", n), 5, f"{n} open streams")


async def settle(http: httpx.AsyncClient, sid: str, body: dict) -> httpx.Response:
    path = f"/api/machine/sessions/{sid}/calls/settle"
    return await http.post(path, json=body, headers=auth(ROOT))


# --- pure parts ---------------------------------------------------------------------------

EVENT = {
    "session_id": "s1",
    "seq": 7,
    "occurred_at": "2025-01-01T00:00:00.000Z",
    "turn_id": "t1",
    "payload": {"type": "message.new", "message": {"role": "assistant", "content": "a\nb é"}},
}
DELTA = {"call_id": "c1", "attempt": 1, "seq": 3, "text": "Hel"}

FRAMES = [
    (
        ("event", EVENT),
        b'id: 7\nevent: message.new\ndata: {"session_id":"s1","seq":7,'
        b'"occurred_at":"2025-01-01T00:00:00.000Z","turn_id":"t1","payload":'
        b'{"type":"message.new","message":{"role":"assistant","content":"a\\nb \xc3\xa9"}}}\n\n',
    ),
    (
        ("event", {"seq": 1, "payload": {"type": "session.created"}}),
        b'id: 1\nevent: session.created\ndata: {"seq":1,"payload":{"type":"session.created"}}\n\n',
    ),
    (
        ("delta", DELTA),
        b'event: llm.token.delta\ndata: {"call_id":"c1","attempt":1,"seq":3,"text":"Hel"}\n\n',
    ),
    (
        ("stream.overflow", {"reason": "slow", "resume_after_seq": 4}),
        b'event: stream.overflow\ndata: {"reason":"slow","resume_after_seq":4}\n\n',
    ),
]


@pytest.mark.parametrize(("item", "expected"), FRAMES)
def test_frame_encoder(item, expected):
    assert sse_frame(*item) == expected


def test_keys_and_binding():
    keys = ApiKeys.from_env({"SUBS_API_KEYS": " full , mine:own"})
    full, mine = keys.authenticate("Bearer full"), keys.authenticate("bearer mine")
    assert full is not None and full.full and len(full.key_id or "") == 12
    assert mine is not None and not mine.full and mine.key_id != full.key_id
    for header in (None, "", "Bearer", "Bearer nope", "Basic full", "Bearer mine:own"):
        assert keys.authenticate(header) is None, header
    assert mine.owns(mine.identity()) and not mine.owns(full.identity()) and full.owns({})
    with pytest.raises(ApiKeysError, match="KEY:own"):
        ApiKeys.parse("k:admin")
    open_keys = ApiKeys.from_env({})
    assert open_keys.open and open_keys.authenticate(None) is not None
    rows = [
        ("127.0.0.1", open_keys, False, True),
        ("::1", open_keys, False, True),
        ("localhost", open_keys, False, True),
        ("0.0.0.0", open_keys, True, False),
        ("10.1.2.3", open_keys, True, False),
        ("0.0.0.0", keys, False, False),
        ("127.0.0.1", keys, False, False),
    ]
    for host, k, refused, warned in rows:
        assert (check_bind(host, k) is not None, bind_warning(host, k) is not None) == (
            refused,
            warned,
        ), host


def test_metrics_text_format():
    m = Metrics()
    m.turn_started()
    m.steps_committed(3)
    m.observe_model_call(0.3)
    m.inc("subs_http_requests_total", method="GET", route='/a"b', status="200")
    text = m.render()
    assert "# TYPE subs_turns_started_total counter\nsubs_turns_started_total 1\n" in text
    assert "subs_steps_committed_total 3\n" in text
    assert 'subs_model_call_seconds_bucket{le="0.25"} 0\n' in text
    assert 'subs_model_call_seconds_bucket{le="0.5"} 1\n' in text
    assert 'subs_model_call_seconds_bucket{le="+Inf"} 1\nsubs_model_call_seconds_sum 0.3\n' in text
    assert 'subs_http_requests_total{method="GET",route="/a\\"b",status="200"} 1\n' in text
    assert "# TYPE subs_worker_call_seconds histogram\n" in text
    assert "subs_sse_streams_open 0\n" in text and "subs_partitions_owned 0\n" in text


def test_metrics_histogram_bounds_and_a_model_calls_series():
    """A bucket counts what is at or below its bound (Prometheus' `le`), cumulatively; past
    the last bound only +Inf counts. A model call's series add up per label set."""
    m = Metrics()
    for seconds in (0.005, 0.0051, 0.01, 0.3, 61.0):
        m.observe_model_call(seconds)
    text = m.render()
    counts = {"0.005": 1, "0.01": 3, "0.025": 3, "0.25": 3, "0.5": 4, "60": 4, "+Inf": 5}
    for le, n in counts.items():
        assert f'subs_model_call_seconds_bucket{{le="{le}"}} {n}\n' in text, le
    assert "subs_model_call_seconds_count 5\n" in text
    for error in (None, None, "rate_limited"):
        m.observe_chat(0.02, provider="openai", model="gpt", tokens={"input": 4}, error=error)
        usage = {"uncached_input": 10, "cache_read": 6, "cache_write": 0, "output": 3}
        m.model_input(usage, provider="openai", model="gpt")
    text = m.render()
    ok = 'gen_ai_operation_name="chat",gen_ai_provider_name="openai",gen_ai_request_model="gpt"'
    duration = "gen_ai_client_operation_duration_seconds"
    assert f'{duration}_bucket{{{ok},le="0.02"}} 2\n{duration}_bucket{{{ok},le="0.04"}} 2' in text
    assert f'{duration}_count{{error_type="rate_limited",{ok}}} 1\n' in text
    assert f'gen_ai_client_token_usage_bucket{{{ok},gen_ai_token_type="input",le="4"}} 2\n' in text
    assert f'gen_ai_client_token_usage_bucket{{{ok},gen_ai_token_type="input",le="1"}} 0\n' in text
    for cache, n in (("uncached", 30), ("cache_read", 18), ("cache_write", 0)):
        tokens = f'subs_model_input_tokens_total{{cache="{cache}",model="gpt",provider="openai"}}'
        assert f"{tokens} {n}\n" in text


# --- statuses -----------------------------------------------------------------------------


@dataclass
class Row:
    name: str
    method: str
    path: str
    status: int
    code: str | None = None
    key: str | None = ROOT
    json: Any = None
    content: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] | None = None
    check: Any = None


async def chunked(size: int):
    for _ in range(size // 8192 + 1):
        yield b"x" * 8192


async def test_statuses(http, vendor):
    vendor.push(ToolCalls([("confirm", {"question": "restart?"})]))
    busy = await submit(http, say("restart the db", turn_id="T-busy"))
    sid = busy["session_id"]
    frames = await read_stream(http, sid, stop=of_type("tool.call.dispatched"))
    call_id = frames[-1].json()["payload"]["id"]
    vendor.default = Text("fine")
    theirs = await submit(http, say("mine"), key=ALICE)
    alice_sid = theirs["session_id"]
    settle_path = f"/api/machine/sessions/{sid}/calls/settle"
    rows = [
        Row(
            "accepted",
            "POST",
            INPUT,
            202,
            json={"input": say("new")},
            check=lambda b: b["queued"] is False and b["turn_id"] and b["session_id"] != sid,
        ),
        Row(
            "turn already active",
            "POST",
            INPUT,
            409,
            "turn_already_active",
            json={"session_id": sid, "input": say("again")},
            check=lambda b: b["turn_id"] == "T-busy" and "T-busy" in b["error"],
        ),
        Row(
            "queued",
            "POST",
            INPUT,
            202,
            json={"session_id": sid, "input": say("later", queue=True)},
            check=lambda b: b["queued"] is True and b["turn_id"] != "T-busy",
        ),
        Row("unknown session", "GET", "/api/client/sessions/nope", 404, "unknown_session"),
        Row(
            "settle unknown session",
            "POST",
            "/api/machine/sessions/nope/calls/settle",
            404,
            "unknown_session",
            json={"id": call_id, "result": "x"},
        ),
        Row(
            "settle a call that is not open",
            "POST",
            settle_path,
            409,
            "call_not_open",
            json={"id": "call_nope", "result": "x"},
        ),
        Row(
            "settle a stale attempt",
            "POST",
            settle_path,
            409,
            "stale_attempt",
            json={"id": call_id, "attempt": 7, "result": "x"},
        ),
        Row("no key", "GET", f"/api/client/sessions/{sid}", 401, "unauthorized", key=None),
        Row("wrong key", "GET", f"/api/client/sessions/{sid}", 401, "unauthorized", key="guess"),
        Row("scoped key reads own", "GET", f"/api/client/sessions/{alice_sid}", 200, key=ALICE),
        Row(
            "scoped key reads another's",
            "GET",
            f"/api/client/sessions/{alice_sid}",
            403,
            "forbidden",
            key=BOB,
        ),
        Row(
            "scoped key writes another's",
            "POST",
            INPUT,
            403,
            "forbidden",
            key=BOB,
            json={"session_id": alice_sid, "input": say("hi")},
        ),
        Row("scoped key streams another's", "GET", stream_path(alice_sid), 403, "forbidden", BOB),
        Row("scoped key reads a root session", "GET", f"/api/client/sessions/{sid}", 403, key=BOB),
        Row("scoped key lists sessions", "GET", "/api/admin/sessions", 403, "forbidden", ALICE),
        Row(
            "scoped key sets an identity",
            "POST",
            INPUT,
            403,
            "forbidden",
            key=ALICE,
            json={"input": say("hi"), "identity": {"subject": {"issuer": "x", "id": "y"}}},
        ),
        Row(
            "malformed ClientInput",
            "POST",
            INPUT,
            400,
            "invalid_input",
            json={"input": {**say("x"), "message": {"role": "robot", "content": "x"}}},
            check=lambda b: (
                b["error"].startswith("input.message.role: ") and b["param"] == "input.message.role"
            ),
        ),
        Row(
            "no input",
            "POST",
            INPUT,
            422,
            "invalid_input",
            json={"session_id": sid},
            check=lambda b: b["error"] == "input: required field is missing",
        ),
        Row(
            "unknown envelope field",
            "POST",
            INPUT,
            422,
            "invalid_input",
            json={"input": say("x"), "sesion_id": "typo"},
            check=lambda b: b["error"] == "sesion_id: unknown field",
        ),
        Row(
            "unknown agent",
            "POST",
            INPUT,
            404,
            "unknown_agent",
            json={"input": {**say("x"), "agent_id": "nobody"}},
        ),
        Row(
            "body over max_body",
            "POST",
            INPUT,
            413,
            "too_large",
            content=b"{" + b" " * MAX_BODY + b"}",
            headers={"Content-Type": "application/json"},
        ),
        Row(
            "chunked body over max_body",
            "POST",
            INPUT,
            413,
            "too_large",
            content=chunked(MAX_BODY),
            headers={"Content-Type": "application/json"},
        ),
        Row(
            "not JSON",
            "POST",
            INPUT,
            400,
            "invalid_json",
            content=b"{nope",
            headers={"Content-Type": "application/json"},
        ),
        Row(
            "bad after_seq",
            "GET",
            stream_path(sid),
            400,
            "invalid_query",
            params={"after_seq": "x"},
        ),
        Row("unknown route", "GET", "/api/nothing", 404, "not_found"),
    ]
    for row in rows:
        resp = await http.request(
            row.method,
            row.path,
            json=row.json,
            content=row.content,
            params=row.params,
            headers={**auth(row.key), **row.headers},
        )
        got = resp.json()
        assert resp.status_code == row.status, f"{row.name}: {resp.status_code} {resp.text}"
        if row.code is not None:
            assert got["code"] == row.code, f"{row.name}: {resp.text}"
        if row.status >= 400:
            assert isinstance(got["error"], str) and got["error"], row.name
        if row.check is not None:
            assert row.check(got), f"{row.name}: {resp.text}"
    # The busy turn still waits for its call; settling it lets the queued turn run.
    assert (await settle(http, sid, {"id": call_id, "result": "yes"})).status_code == 202
    queued_turn = [t for t in await turn_ids(http, sid) if t != "T-busy"]
    await read_stream(http, sid, params={"turn_id": queued_turn[-1]})
    resp = await settle(http, sid, {"id": call_id, "result": "again"})
    assert resp.status_code == 409 and resp.json()["code"] == "call_not_open"


def _user(**fields: Any) -> dict[str, Any]:
    return {
        "type": "client.message",
        "agent_id": "ops_openai",
        "message": {"role": "user", **fields},
    }


def _view(*messages: dict[str, Any], kind: str = "client.messages") -> dict[str, Any]:
    return {"type": kind, "agent_id": "ops_openai", "messages": list(messages)}


AGENT = "ops_openai"
HI = {"role": "user", "content": "hi"}
CALL = {"id": "call_1", "type": "function", "function": {"name": "confirm", "arguments": "{}"}}
ASKED = {"id": "m2", "role": "assistant", "tool_calls": [CALL]}
# Inputs the protocol refuses: (name, input, the field named, words of the error). The
# first rows are schema-valid; the role's rules refuse them (protocol.ROLE_NEEDS).
REFUSED = [
    ("a user message without content", _user(), "input.message.content", "a user message"),
    ("a user message with content null", _user(content=None), "input.message.content", "null"),
    (
        "an appended system message without content",
        _view(HI, {"role": "system"}, kind="client.append"),
        "input.messages.1.content",
        "a system message needs content",
    ),
    (
        "a tool message without tool_call_id",
        _view({"id": "m1", **HI}, ASKED, {"role": "tool", "content": "yes"}),
        "input.messages.2.tool_call_id",
        "the id of the tool call it answers",
    ),
    (
        "a tool message without content",
        _view({"id": "m1", **HI}, ASKED, {"role": "tool", "tool_call_id": "call_1"}),
        "input.messages.2.content",
        "a tool message needs content",
    ),
    (
        "an unknown role",
        _user() | {"message": {"role": "robot", "content": "x"}},
        "input.message.role",
        "'robot'",
    ),
    ("content a number", _user(content=7), "input.message.content", "a string or an array"),
    (
        "a content part of no known type",
        _user(content=[{"type": "sticker", "text": "x"}]),
        "input.message.content.0.type",
        "'sticker'",
    ),
    ("no message", {"type": "client.message", "agent_id": AGENT}, "input.message", "required"),
    ("an unknown type", {"type": "client.mesage", "agent_id": AGENT}, "input.type", "'client.mes"),
    (
        "a tool.error without retryable",
        {"type": "tool.error", "id": "c", "error": "x"},
        "input.retryable",
        "required",
    ),
    (
        "an unknown field",
        {"type": "interrupt.resume", "interrupt_id": "i", "resume": 1},
        "input.resume",
        "unknown field",
    ),
]  # fmt: skip


async def test_inputs_the_protocol_refuses_are_a_400_naming_the_field(http, vendor):
    wrong = []
    for name, inp, param, words in REFUSED:
        resp = await http.post(INPUT, json={"input": inp}, headers=auth(ROOT))
        body = resp.json()
        if (resp.status_code, body.get("code"), body.get("param")) != (400, "invalid_input", param):
            wrong.append(f"{name}: {resp.status_code} {body}")
        elif not body["error"].startswith(f"{param}: ") or words not in body["error"]:
            wrong.append(f"{name}: {body['error']!r} lacks {words!r}")
    assert not wrong, "\n".join(wrong)
    # Refused before anything was stored or asked.
    listed = await http.get("/api/admin/sessions", headers=auth(ROOT))
    assert listed.json()["items"] == [] and vendor.requests == []


async def test_every_client_refuses_them_before_sending_anything(redis):
    """`Client.submit` is the one door of the API, AG-UI, the CLI and the Slack bot: no
    engine runs here, so an input it let through would wait for an answer, not raise."""
    store = await Store.open(redis)
    before = await redis.dbsize()
    for name, inp, param, _ in REFUSED:
        with pytest.raises(ClientError) as refused:
            await Client(store).submit(inp, timeout=5)
        assert (refused.value.status, refused.value.body()["param"]) == (400, param), name
    assert await redis.dbsize() == before, "nothing was enqueued"


async def test_the_routers_refusals_have_the_error_shape_and_keep_their_headers(http):
    """aiohttp's own 404 and 405 come through the error middleware like every refusal."""
    wrong = await http.put(INPUT, headers=auth(ROOT), json={})
    assert wrong.status_code == 405 and "POST" in wrong.headers["Allow"].split(",")
    assert wrong.json() == {"error": "Method Not Allowed", "code": "method_not_allowed"}
    missing = await http.get("/nothing/here", headers=auth(ROOT))
    assert missing.status_code == 404
    assert missing.json() == {"error": "Not Found", "code": "not_found"}


async def turn_ids(http: httpx.AsyncClient, sid: str) -> list[str]:
    resp = await http.get(f"/api/admin/sessions/{sid}/events", headers=auth(ROOT))
    return [e["turn_id"] for e in resp.json()["events"] if e["payload"]["type"] == "turn.queued"]


async def test_turn_id_is_idempotent(http, vendor):
    vendor.push(Text("once"))
    first = await submit(http, say("do it", turn_id="T-once"))
    sid = first["session_id"]
    await read_stream(http, sid, params={"turn_id": "T-once"})
    again = await submit(http, say("do it", turn_id="T-once"), session_id=sid)
    assert again["turn_id"] == "T-once" and again["existing"] is True
    view = (await http.get(f"/api/client/sessions/{sid}", headers=auth(ROOT))).json()
    assert [m["content"] for m in view["messages"]] == ["do it", "once"]
    assert len(vendor.requests) == 1


async def test_session_view(http, vendor):
    vendor.push(ToolCalls([("confirm", {"question": "sure?"})], text="Asking."), Text("Done."))
    reply = await submit(http, say("start"))
    sid = reply["session_id"]
    frames = await read_stream(http, sid, stop=of_type("tool.call.dispatched"))
    call_id = frames[-1].json()["payload"]["id"]
    view = (await http.get(f"/api/client/sessions/{sid}", headers=auth(ROOT))).json()
    assert view["status"] == "running" and view["turn_id"] == reply["turn_id"]
    assert view["agent_id"] == "ops_openai" and view["interrupts"] == []
    assert (await settle(http, sid, {"id": call_id, "result": "yes"})).status_code == 202
    await read_stream(http, sid, params={"turn_id": reply["turn_id"]})
    view = (await http.get(f"/api/client/sessions/{sid}", headers=auth(ROOT))).json()
    assert view["status"] == "idle" and view["turn_id"] is None
    assert [m["role"] for m in view["messages"]] == ["user", "assistant", "tool", "assistant"]
    tree = view["message_tree"]
    assert tree["head_id"] == view["messages"][-1]["id"]
    parents = {n["message"]["id"]: n["parent_id"] for n in tree["nodes"]}
    ids = [m["id"] for m in view["messages"]]
    assert [parents[i] for i in ids] == [None, *ids[:-1]]
    events = (await http.get(f"/api/admin/sessions/{sid}/events", headers=auth(ROOT))).json()
    assert view["seq"] == events["events"][-1]["seq"]


async def test_interrupt(http, vendor):
    vendor.push(ToolCalls([("confirm", {"question": "sure?"})]))
    reply = await submit(http, say("start"))
    sid = reply["session_id"]
    await read_stream(http, sid, stop=of_type("tool.call.dispatched"))
    path = f"/api/client/sessions/{sid}/interrupt"
    bad = await http.post(
        path, json={"reason": "x", "payload": {"mesage": "typo"}}, headers=auth(ROOT)
    )
    assert bad.status_code == 422 and bad.json()["error"] == "payload.mesage: unknown field"
    body = {"reason": "needs a human", "payload": {"message": "Approve the restart?"}}
    resp = await http.post(path, json=body, headers=auth(ROOT))
    assert resp.status_code == 202, resp.text
    iid = resp.json()["interrupt_id"]
    view = (await http.get(f"/api/client/sessions/{sid}", headers=auth(ROOT))).json()
    assert view["status"] == "interrupted"
    assert [(i["interrupt_id"], i["origin"], i["reason"]) for i in view["interrupts"]] == [
        (iid, "client", "needs a human")
    ]
    refused = await http.post(
        INPUT, json={"session_id": sid, "input": say("more")}, headers=auth(ROOT)
    )
    assert refused.status_code == 409 and refused.json()["code"] == "session_interrupted"
    assert refused.json()["interrupt_id"] == iid
    gone = await http.post("/api/client/sessions/nope/interrupt", json=body, headers=auth(ROOT))
    assert gone.status_code == 404
    frames = await read_stream(
        http, sid, params={"after_seq": view["seq"] - 1}, stop=of_type("session.interrupted")
    )
    assert events_of(frames)[-1]["payload"]["interrupt_id"] == iid


async def test_cancel_ends_the_running_turn_and_the_queued_one_runs(http, vendor):
    vendor.push(ToolCalls([("confirm", {"question": "sure?"})]), Text("The next one."))
    first = await submit(http, say("start"))
    sid = first["session_id"]
    frames = await read_stream(http, sid, stop=of_type("tool.call.dispatched"))
    call_id = frames[-1].json()["payload"]["id"]
    queued = await submit(http, say("later", queue=True), session_id=sid)
    path = f"/api/client/sessions/{sid}/cancel"
    typo = await http.post(path, json={"reson": "x"}, headers=auth(ROOT))
    assert typo.status_code == 422 and typo.json()["error"] == "reson: unknown field"
    theirs = await http.post(path, json={}, headers=auth(ALICE))
    assert theirs.status_code == 403 and theirs.json()["code"] == "forbidden"

    resp = await http.post(path, json={"reason": "wrong question"}, headers=auth(ROOT))
    assert resp.status_code == 202, resp.text
    assert resp.json() == {"session_id": sid, "turn_id": first["turn_id"]}
    ended = events_of(await read_stream(http, sid, params={"turn_id": first["turn_id"]}))
    errored, failed = ended[-2]["payload"], ended[-1]["payload"]
    assert errored["type"] == "tool.call.errored" and errored["id"] == call_id
    assert failed["type"] == "turn.failed" and failed["error"]["detail"]["cancelled"] is True
    assert failed["error"]["message"] == "cancelled by the client: wrong question"
    late = await settle(http, sid, {"id": call_id, "result": "yes"})
    assert late.status_code == 409 and late.json()["code"] == "call_not_open"
    done = events_of(await read_stream(http, sid, params={"turn_id": queued["turn_id"]}))
    assert done[-1]["payload"]["type"] == "turn.completed"

    idle = await http.post(path, headers=auth(ROOT))  # no body: no reason
    assert idle.status_code == 409 and idle.json()["code"] == "no_turn_running"
    gone = await http.post("/api/client/sessions/nope/cancel", headers=auth(ROOT))
    assert gone.status_code == 404 and gone.json()["code"] == "unknown_session"


@on_both_redis
async def test_delete_removes_an_idle_session_and_all_its_keys(http, vendor, engine):
    vendor.push(ToolCalls([("confirm", {"question": "sure?"})]))
    reply = await submit(http, say("start"))
    sid = reply["session_id"]
    await read_stream(http, sid, stop=of_type("tool.call.dispatched"))
    path = f"/api/client/sessions/{sid}"
    running = await http.delete(path, headers=auth(ROOT))
    assert running.status_code == 409 and running.json()["code"] == "turn_running"
    assert f"subs sessions cancel {sid}" in running.json()["error"]
    cancel = await http.post(f"{path}/cancel", headers=auth(ROOT))
    assert cancel.status_code == 202
    await read_stream(http, sid, params={"turn_id": reply["turn_id"]})
    theirs = await http.delete(path, headers=auth(BOB))
    assert theirs.status_code == 403

    resp = await http.delete(path, headers=auth(ROOT))
    assert resp.status_code == 204 and resp.content == b""
    assert (await http.get(path, headers=auth(ROOT))).status_code == 404
    listed = (await http.get("/api/admin/sessions", headers=auth(ROOT))).json()["items"]
    assert sid not in [s["session_id"] for s in listed]
    redis = engine.store.redis
    assert [k async for k in redis.scan_iter(match=f"*{sid}*")] == []
    for p in range(engine.store.partitions):
        assert not await redis.zscore(engine.store.sessions_key(p), sid)
    again = await http.delete(path, headers=auth(ROOT))
    assert again.status_code == 404 and again.json()["code"] == "unknown_session"


@on_both_redis
async def test_admin_lists_newest_first_and_pages_events(http, vendor):
    vendor.default = Text("ok")
    sids = []
    for n in range(3):
        reply = await submit(http, say(f"hi {n}", turn_id=f"T{n}"))
        sids.append(reply["session_id"])
        await read_stream(http, reply["session_id"], params={"turn_id": f"T{n}"})
    page1 = (await http.get("/api/admin/sessions?limit=2", headers=auth(ROOT))).json()
    more = {"limit": 2, "cursor": page1["next_cursor"]}
    page2 = (await http.get("/api/admin/sessions", params=more, headers=auth(ROOT))).json()
    assert [s["session_id"] for s in page1["items"] + page2["items"]] == sids[::-1]
    assert page2["next_cursor"] is None
    assert {s["status"] for s in page1["items"]} == {"idle"}
    path = f"/api/admin/sessions/{sids[0]}/events"
    first = (await http.get(path, params={"limit": 3}, headers=auth(ROOT))).json()
    rest = (await http.get(path, params={"after_seq": 3}, headers=auth(ROOT))).json()
    seqs = [e["seq"] for e in first["events"] + rest["events"]]
    assert seqs == list(range(1, len(seqs) + 1)) and first["next_after_seq"] == 3
    assert rest["next_after_seq"] is None


async def test_health_and_metrics(http, vendor, metrics):
    health = await http.get("/healthz")
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    assert (await http.get("/metrics")).status_code == 401
    vendor.push(Text("hello"))
    reply = await submit(http, say("hi", turn_id="T-m"))
    async with http.stream(
        "GET",
        stream_path(reply["session_id"]),
        headers={**auth(ROOT), "Origin": "https://app.example"},
    ) as resp:
        assert resp.headers["Content-Type"] == "text/event-stream"
        assert resp.headers["Cache-Control"] == "no-cache"
        assert resp.headers["X-Accel-Buffering"] == "no"
        assert "Access-Control-Allow-Origin" not in resp.headers  # no [serve] cors_origins
        during = (await http.get("/metrics", headers=auth(ROOT))).text
        assert "subs_sse_streams_open 1\n" in during
    await streams_open(metrics, 0)  # the client hung up: the handler cleaned up
    scraped = await http.get("/metrics", headers=auth(ROOT))
    assert scraped.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert 'route="/api/client/sessions/input",status="202"} 1' in scraped.text
    assert 'subs_http_requests_total{method="GET",route="/healthz",status="200"} 1' in scraped.text


# --- event streams --------------------------------------------------------------------------


@on_both_redis
async def test_catch_up_then_live_with_after_seq_and_last_event_id(http, vendor):
    vendor.push(Text("first answer"), Text("second answer"))
    first = await submit(http, say("one", turn_id="T1"))
    sid = first["session_id"]
    done = events_of(await read_stream(http, sid, params={"turn_id": "T1"}))
    end = done[-1]["seq"]
    assert [e["seq"] for e in done] == list(range(1, end + 1))
    assert done[-1]["payload"]["type"] == "turn.completed"

    frames = await read_stream(http, sid, params={"after_seq": 2, "turn_id": "T1"})
    assert [e["seq"] for e in events_of(frames)] == list(range(3, end + 1))

    # Last-Event-ID wins over after_seq; catch-up runs into the live tail.
    got: list[dict] = []
    async with asyncio.timeout(15):
        async with aconnect_sse(
            http,
            "GET",
            stream_path(sid),
            params={"after_seq": 1, "turn_id": "T2"},
            headers={**auth(ROOT), "Last-Event-ID": "4"},
        ) as source:
            async for frame in sse_frames(source):
                if frame.event == "llm.token.delta":
                    continue
                got.append(frame.json())
                if frame.json()["seq"] == end:  # caught up: the next turn is live
                    await submit(http, say("two", turn_id="T2"), session_id=sid)
    seqs = [e["seq"] for e in got]
    assert seqs == list(range(5, seqs[-1] + 1))
    assert got[-1]["payload"]["type"] == "turn.completed" and got[-1]["turn_id"] == "T2"
    full = events_of(await read_stream(http, sid, params={"turn_id": "T2"}))
    assert full[4:] == got


async def test_two_watchers_one_reconnects(http, vendor, metrics):
    vendor.push(ToolCalls([("confirm", {"question": "go?"})]), Text("Went.", chunks=3))
    reply = await submit(http, say("go", turn_id="T-w"))
    sid = reply["session_id"]
    steady = asyncio.create_task(read_stream(http, sid, params={"turn_id": "T-w"}))
    before = await read_stream(http, sid, stop=of_type("tool.call.dispatched"))
    last_id = events_of(before)[-1]["seq"]
    call_id = before[-1].json()["payload"]["id"]
    assert (await settle(http, sid, {"id": call_id, "result": "yes"})).status_code == 202
    after = await read_stream(
        http, sid, params={"turn_id": "T-w"}, headers={"Last-Event-ID": str(last_id)}
    )
    watcher_a = events_of(before) + events_of(after)
    watcher_b = events_of(await steady)
    assert watcher_a == watcher_b
    assert [e["seq"] for e in watcher_b] == list(range(1, len(watcher_b) + 1))
    assert watcher_b[-1]["payload"]["type"] == "turn.completed"
    # Already over: a stream for the turn from its end closes with nothing to send.
    assert (
        await read_stream(http, sid, params={"turn_id": "T-w", "after_seq": watcher_b[-1]["seq"]})
        == []
    )
    await streams_open(metrics, 0)


def assert_call_streamed(frames, call_id: str, text: str) -> None:
    """Every delta of the call once, in order, all before the event that ends it."""
    deltas = deltas_of(frames, call_id)
    assert [d["seq"] for d in deltas] == list(range(1, len(deltas) + 1)), frames
    assert "".join(d.get("text") or "" for d in deltas) == text
    kinds = [f.event for f in frames]
    completed = kinds.index("llm.call.completed")
    assert kinds[completed - len(deltas) : completed] == ["llm.token.delta"] * len(deltas)


@on_both_redis
async def test_deltas_interleave_and_a_reconnect_gets_the_missed_ones(http, vendor):
    text = " ".join(f"w{i}" for i in range(24))
    vendor.push(Text(text, chunks=24, chunk_delay=0.03))  # a model call of about 0.7 s
    reply = await submit(http, say("talk", turn_id="T-d"))
    sid = reply["session_id"]
    steady = asyncio.create_task(read_stream(http, sid, params={"turn_id": "T-d"}))
    before = await read_stream(http, sid, stop=of_type("llm.token.delta"))
    call_id = before[-1].json()["call_id"]
    dispatched = events_of(before)[-1]
    assert dispatched["payload"]["type"] == "llm.call.dispatched"
    # Back mid-call: the deltas it had (seq 1) come again, then the live ones.
    after = await read_stream(
        http, sid, params={"turn_id": "T-d"}, headers={"Last-Event-ID": str(dispatched["seq"])}
    )
    steady_frames = await steady
    kinds = [f.event for f in steady_frames]
    assert kinds.index("llm.call.dispatched") < kinds.index("llm.token.delta")
    # Back after the call ended: catch-up puts its deltas right before its end.
    late = await read_stream(http, sid, params={"turn_id": "T-d", "after_seq": dispatched["seq"]})
    for frames in (steady_frames, after, late):
        assert_call_streamed(frames, call_id, text)
    assert events_of(after) == events_of(late) == events_of(steady_frames)[dispatched["seq"] :]
    # Back after the call's end event: its deltas are not sent again.
    completed = next(e for e in events_of(late) if e["payload"]["type"] == "llm.call.completed")
    done = await read_stream(http, sid, params={"turn_id": "T-d", "after_seq": completed["seq"]})
    assert deltas_of(done, call_id) == [] and events_of(done)


async def test_a_ping_after_an_event_is_no_frame_to_the_test_reader():
    """The bytes the stream writes (an event with its id, a heartbeat, a delta, an event)
    read over loopback by the helpers every stream test uses: the heartbeat is no frame.
    httpx-sse alone yields one (event `message`, empty data) for a comment after an id."""
    started = {"seq": 1, "payload": {"type": "turn.started"}}
    delta = {"call_id": "llm_1", "attempt": 1, "seq": 1, "text": "hi"}
    ended = {"seq": 2, "payload": {"type": "turn.completed"}}
    body = sse_frame("event", started) + PING + sse_frame("delta", delta) + PING
    body += sse_frame("event", ended)

    async def stream(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="text/event-stream")

    app = web.Application()
    app.router.add_get("/s", stream)
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        frames = await read_stream(client, "s", path="/s")
    assert [f.event for f in frames] == ["turn.started", "llm.token.delta", "turn.completed"]
    assert events_of(frames) == [started, ended]


async def test_heartbeat_comments_keep_an_idle_stream_open(http, vendor):
    vendor.push(Text("quiet now"))
    reply = await submit(http, say("hi", turn_id="T-h"))
    sid = reply["session_id"]
    done = events_of(await read_stream(http, sid, params={"turn_id": "T-h"}))
    pings = 0
    async with asyncio.timeout(5):
        async with http.stream(
            "GET",
            stream_path(sid),
            params={"after_seq": done[-1]["seq"]},
            headers=auth(ROOT),
        ) as resp:
            async for line in resp.aiter_lines():
                assert line in (": ping", ""), line
                pings += line == ": ping"
                if pings == 2:
                    break
    assert pings == 2


async def test_a_slow_client_is_cut_off_and_others_keep_streaming(engine, vendor, metrics):
    limits = SseLimits(write_timeout=0.5, close_grace=10, send_buffer=16384)
    app = app_for(engine, metrics, max_body=1 << 20, sse=limits)
    big = "x" * 700_000  # more than the socket buffers hold for a client that does not read
    vendor.push(Text("read it"), Text("next"))
    async with (
        serve(app) as url,
        httpx.AsyncClient(base_url=url, timeout=10) as http,
        httpx.AsyncClient(base_url=url, timeout=10) as slow_http,
    ):
        reply = await submit(http, say(big, turn_id="T-big"))
        sid = reply["session_id"]
        await read_stream(http, sid, params={"turn_id": "T-big"})
        async with slow_http.stream("GET", stream_path(sid), headers=auth(ROOT)) as slow:
            assert slow.status_code == 200
            watcher = asyncio.create_task(read_stream(http, sid, params={"turn_id": "T-next"}))
            await streams_open(metrics, 2)
            await submit(http, say("next", turn_id="T-next"), session_id=sid)
            seen = events_of(await watcher)
            assert seen[-1]["turn_id"] == "T-next" and seen[-1]["payload"]["type"] == (
                "turn.completed"
            )
            await poll_until(
                lambda: counted(metrics, "subs_sse_overflows_total", 1), 5, "the overflow"
            )
            frames = [f async for f in sse_frames(EventSource(slow))]
        assert frames[-1].event == "stream.overflow"
        info = frames[-1].json()
        got = events_of(frames[:-1])
        assert [e["seq"] for e in got] == list(range(1, info["resume_after_seq"] + 1))
        assert info["resume_after_seq"] < seen[-1]["seq"] and info["reason"]
        assert info["code"] == "stream_overflow" and info["reason"] in info["error"]  # the shape
        rest = await read_stream(
            http,
            sid,
            params={"turn_id": "T-next"},
            headers={"Last-Event-ID": str(info["resume_after_seq"])},
        )
        assert got + events_of(rest) == seen


async def test_each_key_holds_a_bounded_number_of_streams(engine, vendor, metrics):
    app = app_for(engine, metrics, max_streams_per_key=2, heartbeat=30)
    vendor.push(Text("for root"), Text("for bob"))
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=10) as http:
        sid = (await submit(http, say("hi")))["session_id"]
        bobs = (await submit(http, say("hi"), key=BOB))["session_id"]
        vanishing = await raw_stream(url, sid, ROOT)
        async with http.stream("GET", stream_path(sid), headers=auth(ROOT)) as held:
            assert held.status_code == 200
            await streams_open(metrics, 2)
            refused = await http.get(stream_path(sid), headers=auth(ROOT))
            assert refused.status_code == 429 and refused.headers["Retry-After"] == "1"
            body = refused.json()
            assert (body["code"], body["limit"]) == ("too_many_streams", 2)
            assert "[serve] max_streams_per_key" in body["error"]
            assert "SUBS_MAX_STREAMS_PER_KEY" in body["error"]
            # Another key counts its own streams.
            async with http.stream("GET", stream_path(bobs), headers=auth(BOB)) as other:
                assert other.status_code == 200
            # A client that vanishes frees its slot at once, not at the next heartbeat (30 s).
            vanishing.transport.abort()

            async def opens() -> bool:
                async with http.stream("GET", stream_path(sid), headers=auth(ROOT)) as again:
                    return again.status_code == 200

            await poll_until(opens, 3, "the vanished stream's slot")
    await streams_open(metrics, 0)


async def test_an_open_api_bounds_streams_per_client_address(engine, vendor, metrics):
    app = make_app(
        Client(engine.store), engine.store, keys=ApiKeys(), metrics=metrics, max_streams_per_key=1
    )
    vendor.push(Text("hi"))
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=10) as http:
        sid = (await submit(http, say("hi"), key=None))["session_id"]
        async with http.stream("GET", stream_path(sid)) as held:
            assert held.status_code == 200
            refused = await http.get(stream_path(sid))
            assert refused.status_code == 429 and "this address" in refused.json()["error"]
        await streams_open(metrics, 0)
        async with http.stream("GET", stream_path(sid)) as again:
            assert again.status_code == 200


async def raw_stream(url: str, sid: str, key: str) -> asyncio.StreamWriter:
    """An event stream on a bare socket, its status line read: the caller can cut it."""
    host, port = httpx.URL(url).host, httpx.URL(url).port
    reader, writer = await asyncio.open_connection(host, port)
    auth_line = f"Authorization: Bearer {key}"
    request = f"GET {stream_path(sid)} HTTP/1.1\r\nHost: {host}\r\n{auth_line}\r\n\r\n"
    writer.write(request.encode())
    status = await asyncio.wait_for(reader.readline(), 10)
    assert status.startswith(b"HTTP/1.1 200"), status
    return writer


async def test_a_stream_of_an_unknown_session_is_404(http):
    resp = await http.get(stream_path("nope"), headers=auth(ROOT))
    assert resp.status_code == 404 and resp.json()["code"] == "unknown_session"
    assert json.loads(resp.text)["error"]


async def test_shutdown_ends_open_streams_cleanly(engine, vendor, metrics):
    vendor.push(Text("hi"))
    async with httpx.AsyncClient(timeout=10) as http:
        async with serve(app_for(engine, metrics)) as url:
            http.base_url = httpx.URL(url)
            reply = await submit(http, say("hi", turn_id="T-s"))
            reader = asyncio.create_task(read_stream(http, reply["session_id"]))
            await streams_open(metrics, 1)
        # The server stopped with the stream open: the stream ended, not broke.
        frames = await reader
    assert [e["seq"] for e in events_of(frames)] == list(range(1, len(events_of(frames)) + 1))
    assert metrics.value("subs_sse_streams_open") == 0


async def test_the_python_client_follows_through_heartbeats(engine, vendor, metrics):
    from engine.cli.remote import HttpClient

    vendor.push(Text("first"), Text("second"))
    async with serve(app_for(engine, metrics, heartbeat=0.05)) as url:
        client = HttpClient(url, ROOT)
        first = await client.submit(say("one"))
        sid = first["session_id"]
        seen: list[dict] = []

        async def follow() -> None:
            async for kind, item in client.follow(sid, 0):
                if kind == "event":
                    seen.append(item)
                    if (
                        item["payload"]["type"] == "turn.completed"
                        and len([e for e in seen if e["payload"]["type"] == "turn.completed"]) == 2
                    ):
                        return

        watcher = asyncio.create_task(follow())
        await poll_until(lambda: _has_turns(seen, 1), 10, "the first turn")
        await streams_open(metrics, 1)
        # Idle through several heartbeats (time itself is what we wait for), then a
        # second turn still arrives on the same stream.
        loop = asyncio.get_running_loop()
        idle_since = loop.time()

        async def heartbeats_passed() -> bool:
            return loop.time() - idle_since > 0.3

        await poll_until(heartbeats_passed, 5, "a few heartbeat intervals")
        assert not watcher.done(), watcher
        await client.submit(say("two"), session_id=sid)
        await asyncio.wait_for(watcher, 10)
        assert [e["seq"] for e in seen] == list(range(1, len(seen) + 1))
        await client.aclose()


async def _has_turns(seen: list[dict], n: int) -> bool:
    return sum(e["payload"]["type"] == "turn.completed" for e in seen) >= n


async def test_resuming_needs_the_privilege_of_the_key_that_raised_the_turn(http, vendor):
    """A `KEY:own` key may not answer an interrupt of a turn a full key started, even in a
    session it owns (upstream's InterruptOrigin rule); the full key may. Over real HTTP."""
    vendor.push(Text("Hi alice."), ToolCalls([("confirm", {"question": "sure?"})]))
    mine = await submit(http, say("hello"), key=ALICE)
    sid = mine["session_id"]
    await read_stream(http, sid, key=ALICE, params={"turn_id": mine["turn_id"]})
    await submit(http, say("restart prod"), session_id=sid)  # the full key's turn
    await read_stream(http, sid, stop=of_type("tool.call.dispatched"))
    path = f"/api/client/sessions/{sid}/interrupt"
    resp = await http.post(path, json={"reason": "the lead decides"}, headers=auth(ROOT))
    iid = resp.json()["interrupt_id"]
    resume = {"type": "interrupt.resume", "interrupt_id": iid, "payload": {"value": "yes"}}

    refused = await http.post(INPUT, json={"session_id": sid, "input": resume}, headers=auth(ALICE))
    assert refused.status_code == 403 and refused.json()["code"] == "forbidden"
    assert "privileged" in refused.json()["error"]
    view = (await http.get(f"/api/client/sessions/{sid}", headers=auth(ROOT))).json()
    assert [i["interrupt_id"] for i in view["interrupts"]] == [iid]
    assert view["interrupts"][0]["by"]["privilege"] == "operator"

    ok = await http.post(INPUT, json={"session_id": sid, "input": resume}, headers=auth(ROOT))
    assert ok.status_code == 202 and ok.json() == {"session_id": sid, "resumed": True}


async def test_an_interrupt_expires_at_its_expires_at_and_a_late_resume_is_refused(http, vendor):
    vendor.push(ToolCalls([("confirm", {"question": "sure?"})]))
    reply = await submit(http, say("start"))
    sid = reply["session_id"]
    await read_stream(http, sid, stop=of_type("tool.call.dispatched"))
    soon = time.time() + 0.5
    body = {
        "reason": "the lead decides",
        "payload": {
            "message": "Restart?",
            "expiresAt": datetime.fromtimestamp(soon, UTC).isoformat(),
        },
    }
    resp = await http.post(f"/api/client/sessions/{sid}/interrupt", json=body, headers=auth(ROOT))
    iid = resp.json()["interrupt_id"]
    frames = await read_stream(http, sid, stop=of_type("session.interrupt_resumed"))
    done = frames[-1].json()
    assert done["payload"] == {
        "type": "session.interrupt_resumed",
        "interrupt_id": iid,
        "payload": {"status": "cancelled", "reason": "expired"},
        "expired": True,
    }
    assert datetime.fromisoformat(done["occurred_at"]).timestamp() >= soon
    resume = {"type": "interrupt.resume", "interrupt_id": iid, "payload": {"value": "yes"}}
    late = await http.post(INPUT, json={"session_id": sid, "input": resume}, headers=auth(ROOT))
    assert late.status_code == 202 and late.json() == {"session_id": sid, "resumed": False}


async def test_an_expires_at_that_is_not_a_time_is_refused_at_the_edge(http, vendor):
    vendor.push(ToolCalls([("confirm", {"question": "sure?"})]))
    reply = await submit(http, say("start"))
    sid = reply["session_id"]
    await read_stream(http, sid, stop=of_type("tool.call.dispatched"))
    body = {"reason": "x", "payload": {"expiresAt": "tomorrow-ish"}}
    bad = await http.post(f"/api/client/sessions/{sid}/interrupt", json=body, headers=auth(ROOT))
    assert bad.status_code == 422 and bad.json()["code"] == "invalid_input"
    assert bad.json()["error"].startswith("payload.expiresAt: ")
    assert "RFC 3339" in bad.json()["error"]


async def test_both_clients_answer_alike_for_one_session(engine, vendor, metrics):
    """`SessionClient` has one return type per method: the in-process Client and the HTTP
    client give the same ids from `sessions()` and None from `session()` for one that is
    not there (the HTTP client used to give rows, and raise on a 404)."""
    from engine.cli.remote import HttpClient
    from engine.client import Client

    vendor.push(Text("hi back"))
    local = Client(engine.store)
    async with serve(app_for(engine, metrics)) as url:
        remote = HttpClient(url, ROOT)
        reply = await remote.submit(say("hi"))
        sid = reply["session_id"]
        assert await remote.sessions() == await local.sessions() == [sid]
        # A row says what SessionRow declares, no more and no less, over either client.
        from typing import get_type_hints

        from engine.session_client import SessionRow

        [(remote_row,), _], [(local_row,), _] = (
            await remote.session_rows(),
            await local.session_rows(),
        )
        assert set(remote_row) == set(local_row) == set(get_type_hints(SessionRow))
        assert await remote.session("ses_nope") is None
        assert await local.session("ses_nope") is None
        view = await remote.session(sid)
        assert view is not None and view["session_id"] == sid
        await remote.aclose()
