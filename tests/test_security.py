"""Hardening at the edges, each as a table: CORS, media types, JSON the API refuses, stream
cursors, API key entries, credentials kept out of everything `subs serve` prints, health
while Redis is away, and the Slack endpoint's answers to whatever arrives."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from redis import Redis as SyncRedis

from bot.rendering.prompts import ACTION_PREFIX
from engine.api import ApiKeys, ApiKeysError, make_app
from engine.client import Client
from engine.config import parse_project
from engine.jsonedge import compact_json
from engine.runtime.engine import Engine
from engine.store.embedded import EmbeddedRedis
from engine.store.store import Store, connect
from tests.api_helpers import INPUT, KEYS_ENV, ROOT, auth, read_stream, serve, stream_path
from tests.bot_helpers import AGENT, serve_bots
from tests.engine_helpers import ENV, make_project, poll_until, project_toml, start_subs
from tests.fakes.llm_vendor import FakeVendor, Text
from tests.fakes.slack import FakeSlack, sign
from tests.slack_serve_helpers import slack_serve

ORIGIN = "https://app.example"
JSON_TYPE = {"Content-Type": "application/json"}


def say(text: str, agent: str = "ops_openai") -> dict[str, Any]:
    message = {"role": "user", "content": text}
    return {"type": "client.message", "agent_id": agent, "message": message}


@pytest.fixture
async def engine(redis, vendor: FakeVendor, tmp_path: Path) -> AsyncIterator[Engine]:
    eng = Engine(make_project(tmp_path, vendor.url), redis, env=ENV, lease_ms=3000)
    await eng.start()
    yield eng
    await eng.stop()


@asynccontextmanager
async def api(engine: Engine, **kw: Any) -> AsyncIterator[httpx.AsyncClient]:
    """The API over `engine` on a real port, with the test keys; `kw` goes to make_app."""
    app = make_app(Client(engine.store), engine.store, keys=ApiKeys.from_env(KEYS_ENV), **kw)
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=10) as http:
        yield http


@dataclass
class Call:
    """One request of a table and what must come back."""

    name: str
    path: str
    status: int
    code: str | None = None  # the JSON error's `code`
    param: str | None = None  # the JSON error's `param`
    fragment: str = ""  # in the JSON error's message
    method: str = "POST"
    content: bytes | None = None
    headers: dict[str, Any] = field(default_factory=dict)
    params: dict[str, str] | None = None


async def run_table(http: httpx.AsyncClient, calls: list[Call]) -> list[str]:
    """Every call of the table (all run); one line for each whose answer differed."""
    wrong = []
    for call in calls:
        resp = await http.request(
            call.method,
            call.path,
            content=call.content,
            params=call.params,
            headers={**auth(ROOT), **call.headers},
        )
        got = resp.json()
        if (resp.status_code, got.get("code"), got.get("param")) != (
            call.status,
            call.code,
            call.param,
        ) or call.fragment not in got.get("error", ""):
            wrong.append(f"{call.name}: {resp.status_code} {resp.text[:160]}")
    return wrong


def healthz_is(http: httpx.AsyncClient, status: int) -> Callable[[], Awaitable[Any]]:
    """A poll_until predicate: the /healthz answer, once it has `status`."""

    async def check() -> httpx.Response | None:
        resp = await http.get("/healthz")
        return resp if resp.status_code == status else None

    return check


# -- CORS ------------------------------------------------------------------------------------

PREFLIGHT = {
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization",
}


async def test_without_cors_origins_no_cors_headers_and_every_preflight_refused(
    engine: Engine,
) -> None:
    async with api(engine) as http:
        plain = await http.get("/healthz", headers={"Origin": ORIGIN})
        preflight = await http.options(INPUT, headers={"Origin": ORIGIN, **PREFLIGHT})
    assert plain.status_code == 200
    assert not [h for h in plain.headers if h.lower().startswith("access-control-")]
    assert "vary" not in plain.headers
    assert preflight.status_code == 403
    assert preflight.json()["code"] == "origin_not_allowed" and preflight.json()["error"]
    assert "access-control-allow-origin" not in preflight.headers


async def test_a_listed_origin_is_echoed_and_no_other(engine: Engine, vendor: FakeVendor) -> None:
    local = "http://localhost:3000"
    rows = [
        # (name, path, Origin, status, Access-Control-Allow-Origin)
        ("listed", "/healthz", ORIGIN, 200, ORIGIN),
        ("listed, other case", "/healthz", "https://App.example", 200, "https://App.example"),
        ("second listed", "/healthz", local, 200, local),
        ("unlisted", "/healthz", "https://evil.example", 200, None),
        ("listed host, other port", "/healthz", "https://app.example:8443", 200, None),
        ("listed host, other scheme", "/healthz", "http://app.example", 200, None),
        ("a suffix of a listed one", "/healthz", "https://app.example.evil", 200, None),
        ("the null origin", "/healthz", "null", 200, None),
        ("no Origin", "/healthz", None, 200, None),
        ("an error to a listed origin", "/api/client/sessions/nope", ORIGIN, 404, ORIGIN),
        ("a refusal to a listed origin", "/api/admin/sessions?limit=0", ORIGIN, 400, ORIGIN),
    ]
    preflights = [
        ("preflight, listed", ORIGIN, 204),
        ("preflight, unlisted", "https://evil.example", 403),
        ("preflight, no Origin", None, 403),
    ]
    wrong = []
    async with api(engine, cors_origins=[ORIGIN, local]) as http:
        for name, path, origin, status, echoed in rows:
            headers = auth(ROOT) | ({} if origin is None else {"Origin": origin})
            resp = await http.get(path, headers=headers)
            got = (resp.status_code, resp.headers.get("access-control-allow-origin"))
            if got != (status, echoed) or resp.headers.get("vary") != "Origin":
                wrong.append(f"{name}: {got}, Vary {resp.headers.get('vary')}")
        for name, origin, status in preflights:
            headers = PREFLIGHT | ({} if origin is None else {"Origin": origin})
            resp = await http.options(INPUT, headers=headers)  # no key: browsers send none
            echoed = origin if status == 204 else None
            got = (resp.status_code, resp.headers.get("access-control-allow-origin"))
            if got != (status, echoed):
                wrong.append(f"{name}: {got} {resp.text[:80]}")
            elif status == 204:
                allowed = resp.headers["access-control-allow-headers"].lower().split(",")
                assert {"authorization", "content-type", "last-event-id"} <= {
                    h.strip() for h in allowed
                }
                assert "POST" in resp.headers["access-control-allow-methods"]
            else:
                assert resp.json()["code"] == "origin_not_allowed", name
        vendor.push(Text("hello"))
        reply = await http.post(INPUT, json={"input": say("hi")}, headers=auth(ROOT))
        path = stream_path(reply.json()["session_id"])
        async with http.stream("GET", path, headers=auth(ROOT) | {"Origin": ORIGIN}) as stream:
            assert stream.headers["access-control-allow-origin"] == ORIGIN  # streams too
    assert not wrong, "\n".join(wrong)


# -- request bodies -----------------------------------------------------------------------------


def message_with(content: bytes) -> bytes:
    """A ClientInput body whose message content is the raw JSON `content`."""
    return (
        b'{"input": {"type": "client.message", "agent_id": "ops_openai", '
        b'"message": {"role": "user", "content": ' + content + b"}}}"
    )


async def test_bodies_must_say_they_are_json(engine: Engine, vendor: FakeVendor) -> None:
    vendor.default = Text("ok")
    good = message_with(b'"hi"')
    settle, interrupt = "/api/machine/sessions/s/calls/settle", "/api/client/sessions/s/interrupt"
    refused = "unsupported_media_type"

    def typed(value: str) -> dict[str, str]:
        return {"Content-Type": value}

    calls = [
        Call("no Content-Type", INPUT, 415, refused, fragment="application/json", content=good),
        Call("no body either", INPUT, 415, refused, fragment="no Content-Type"),
        Call(
            "text/plain",
            INPUT,
            415,
            refused,
            fragment="'text/plain'",
            content=good,
            headers=typed("text/plain"),
        ),
        Call(
            "a form",
            INPUT,
            415,
            refused,
            content=b"input=x",
            headers=typed("application/x-www-form-urlencoded"),
        ),
        Call(
            "multipart",
            INPUT,
            415,
            refused,
            content=good,
            headers=typed("multipart/form-data; boundary=x"),
        ),
        Call("a look-alike", INPUT, 415, refused, content=good, headers=typed("application/jsonx")),
        Call("+json", INPUT, 415, refused, content=good, headers=typed("application/vnd.x+json")),
        Call("settle", settle, 415, refused, content=b'{"id": "c"}', headers=typed("text/plain")),
        Call(
            "interrupt",
            interrupt,
            415,
            refused,
            content=b'{"reason": "r"}',
            headers=typed("text/plain"),
        ),
        Call("JSON", INPUT, 202, content=good, headers=JSON_TYPE),
        Call(
            "JSON; charset=utf-8",
            INPUT,
            202,
            content=good,
            headers=typed("application/json; charset=utf-8"),
        ),
        Call("JSON in capitals", INPUT, 202, content=good, headers=typed("Application/JSON")),
    ]
    async with api(engine) as http:
        wrong = await run_table(http, calls)
    assert not wrong, "\n".join(wrong)


def deep_input(levels: int) -> bytes:
    """A body `levels` containers deep: the envelope, `input`, then lists in `input.data`."""
    return b'{"input": {"data": ' + b"[" * (levels - 2) + b"]" * (levels - 2) + b"}}"


async def test_json_other_parsers_read_differently_is_refused_naming_the_path(
    engine: Engine, vendor: FakeVendor
) -> None:
    vendor.default = Text("ok")
    content = "input.message.content"
    bad = "invalid_json"
    settle = "/api/machine/sessions/s/calls/settle"
    calls = [
        Call(
            "NaN",
            INPUT,
            400,
            bad,
            content,
            "NaN is not a JSON number",
            content=message_with(b"NaN"),
        ),
        Call("Infinity", INPUT, 400, bad, content, "Infinity", content=message_with(b"Infinity")),
        Call(
            "-Infinity", INPUT, 400, bad, content, "-Infinity", content=message_with(b"-Infinity")
        ),
        Call("1e999", INPUT, 400, bad, content, "too large", content=message_with(b"1e999")),
        Call(
            "a lone surrogate",
            INPUT,
            400,
            bad,
            content,
            "surrogate",
            content=message_with(b'"a\\ud800"'),
        ),
        Call(
            "a lone surrogate in a key",
            INPUT,
            400,
            bad,
            "input.\\udfff",
            "key",
            content=b'{"input": {"\\udfff": 1}}',
        ),
        Call(
            "65 deep",
            INPUT,
            400,
            bad,
            "input.data" + ".0" * 62,
            "nested deeper than 64",
            content=deep_input(65),
        ),
        Call(
            "far too deep",
            INPUT,
            400,
            bad,
            None,
            "the body: nested deeper than 64",
            content=b"[" * 50_000,
        ),
        Call(
            "not UTF-8",
            INPUT,
            400,
            bad,
            None,
            "the body: not UTF-8",
            content=message_with(b'"\xff"'),
        ),
        Call(
            "NaN in a settle result",
            settle,
            400,
            bad,
            "result.v.0",
            "NaN",
            content=b'{"id": "c", "result": {"v": [NaN]}}',
        ),
        Call(
            "64 deep passes the edge",
            INPUT,
            400,
            "invalid_input",
            "input.type",
            content=deep_input(64),
        ),
        Call(
            "unicode is kept",
            INPUT,
            202,
            content=message_with('"na\\u00efve \\ud83d\\ude00 中"'.encode()),
        ),
    ]
    for call in calls:
        call.headers = JSON_TYPE
    async with api(engine) as http:
        wrong = await run_table(http, calls)
        [only] = (await http.get("/api/admin/sessions", headers=auth(ROOT))).json()["items"]
        view = await http.get(f"/api/client/sessions/{only['session_id']}", headers=auth(ROOT))
    assert not wrong, "\n".join(wrong)
    assert view.json()["messages"][0]["content"] == "naïve 😀 中"


async def test_a_nan_that_reached_the_store_is_a_logged_500_in_clean_json(
    engine: Engine, vendor: FakeVendor, redis, caplog: pytest.LogCaptureFixture
) -> None:
    vendor.push(Text("fine"))
    async with api(engine) as http:
        reply = (await http.post(INPUT, json={"input": say("mark")}, headers=auth(ROOT))).json()
        sid = reply["session_id"]
        await read_stream(http, sid, params={"turn_id": reply["turn_id"]})  # the turn is over
        key = engine.store.snap_key(sid)
        state = (await redis.hget(key, "state")).decode()
        assert '"content":"mark"' in state
        await redis.hset(key, "state", state.replace('"content":"mark"', '"content":NaN'))
        resp = await http.get(f"/api/client/sessions/{sid}", headers=auth(ROOT))
    assert resp.status_code == 500
    assert resp.json() == {"error": "internal error (logged by the API)", "code": "internal"}
    assert [r for r in caplog.records if r.name == "subs.api" and r.exc_info]
    with pytest.raises(ValueError, match="JSON compliant"):
        compact_json({"x": [float("-inf")]})


# -- stream cursors -------------------------------------------------------------------------------

# int() takes the last two (Arabic-Indic three, fullwidth five); a seq is ASCII digits only.
JUNK = ["-1", "1.5", "abc", "+1", "1_0", "0x10", "1e3", "1 2", str(2**63), "9" * 30]
JUNK += ["\u0663", "\uff15"]


async def test_junk_cursors_are_400_naming_the_header_or_parameter(engine: Engine) -> None:
    stream = stream_path("nope")  # cursors are read first: a good one gets as far as the 404
    events = "/api/admin/sessions/nope/events"

    def header(value: str | bytes) -> Call:
        return Call(
            f"Last-Event-ID {value!r}",
            stream,
            400,
            "invalid_header",
            "Last-Event-ID",
            "Last-Event-ID: expected an integer 0..",
            "GET",
            headers={"Last-Event-ID": value},
        )

    def query(path: str, name: str, value: str) -> Call:
        return Call(
            f"{path} {name}={value!r}",
            path,
            400,
            "invalid_query",
            name,
            f"{name}: expected an integer",
            "GET",
            params={name: value},
        )

    def found(name: str, **request: Any) -> Call:
        return Call(
            name, request.pop("path", stream), 404, "unknown_session", method="GET", **request
        )

    calls = [header(v if v.isascii() else v.encode()) for v in JUNK]
    calls += [query(stream, "after_seq", v) for v in [*JUNK, " 5", "5 ", "\t5", "5\n"]]
    calls += [query(events, "after_seq", v) for v in JUNK]
    calls += [query(events, "limit", v) for v in ["0", "1001", "-5", "ten"]]
    calls += [
        found("Last-Event-ID 0", headers={"Last-Event-ID": "0"}),
        found("Last-Event-ID 2**63-1", headers={"Last-Event-ID": str(2**63 - 1)}),
        found("after_seq 7", params={"after_seq": "7"}),
        found("after_seq empty", params={"after_seq": ""}),
        found("admin after_seq 2**63-1", path=events, params={"after_seq": str(2**63 - 1)}),
        found("admin limit 1000", path=events, params={"limit": "1000"}),
        # Last-Event-ID wins, so a junk after_seq beside it is never read.
        found("header beats after_seq", headers={"Last-Event-ID": "3"}, params={"after_seq": "x"}),
    ]
    calls.append(
        Call(
            "long junk is quoted cut short",
            stream,
            400,
            "invalid_query",
            "after_seq",
            "'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'...",
            "GET",
            params={"after_seq": "x" * 5000},
        )
    )
    async with api(engine) as http:
        wrong = await run_table(http, calls)
    assert not wrong, "\n".join(wrong)


# -- API key entries ---------------------------------------------------------------------------

BAD_KEYS = [
    # (SUBS_API_KEYS, the error, key material it must not show)
    (
        "goodkey-1,,goodkey-2",
        "SUBS_API_KEYS entry 2: empty (separate keys with single commas)",
        ["goodkey-1", "goodkey-2"],
    ),
    (":own", "SUBS_API_KEYS entry 1: empty key before ':own'", []),
    (
        "rootkey-1, adminkey-7:admin",
        "SUBS_API_KEYS entry 2: unknown suffix ':admin' (use KEY, KEY:own or KEY:read)",
        ["rootkey-1", "adminkey-7"],
    ),
    (
        "okkey-1,spaced key-9",
        "SUBS_API_KEYS entry 2: whitespace inside the key",
        ["okkey-1", "spaced", "key-9"],
    ),
    (
        "okkey-123,trailing-9,",
        "SUBS_API_KEYS entry 3: empty (separate keys with single commas)",
        ["okkey-123", "trailing-9"],
    ),
    (
        "abc-secret:def-secret",
        "SUBS_API_KEYS entry 1: unknown suffix after ':' (use KEY, KEY:own or KEY:read)",
        ["abc-secret", "def-secret"],
    ),
    (" ", "SUBS_API_KEYS entry 1: empty (separate keys with single commas)", []),
]


@pytest.mark.parametrize(("text", "message", "hidden"), BAD_KEYS)
def test_a_bad_key_entry_is_named_by_position(text: str, message: str, hidden: list[str]) -> None:
    with pytest.raises(ApiKeysError) as caught:
        ApiKeys.parse(text)
    assert str(caught.value) == message
    assert not [secret for secret in hidden if secret in message]


async def test_serve_refuses_bad_keys_and_urls_in_one_line_with_status_2(config: Path) -> None:
    rows = [({"SUBS_API_KEYS": keys}, message, hidden) for keys, message, hidden in BAD_KEYS]
    rows.append(
        (
            {"SUBS_API_KEYS": "goodkey-1", "SUBS_REDIS": "http://u:redispw-5@h:1"},
            "environment: SUBS_REDIS: must be a redis://, rediss:// or unix:// URL, got 'http://u:***@h:1'",
            ["redispw-5", "goodkey-1"],
        )
    )

    # Two at a time: each process's 30 s guard is for its own start, not for a queue of
    # all of them starting at once on a machine that is busy (or runs the suite in two).
    two_at_once = asyncio.Semaphore(2)

    async def serve_with(env: dict[str, str]) -> tuple[int | None, str]:
        async with two_at_once:
            proc = await start_subs("serve", "-c", str(config), "--port", "0", env=env)
            out, err = await asyncio.wait_for(proc.communicate(), 30)
        return proc.returncode, out.decode() + err.decode()

    results = await asyncio.gather(*(serve_with(env) for env, _, _ in rows))
    for (env, message, hidden), (code, output) in zip(rows, results, strict=True):
        assert code == 2, (env, output)
        assert output == f"subs: {message}\n", output  # one line: no traceback, no key
        assert not [secret for secret in hidden if secret in output]


# -- credentials in output -----------------------------------------------------------------------


async def test_serve_prints_and_logs_no_credential(
    redis_url: str, vendor: FakeVendor, tmp_path: Path
) -> None:
    secrets = {
        "redis password": "redis-pw-4d1c",
        "worker password": "worker-pw-77ab",
        "worker token": "worker-tok-91fe",
        "worker signing secret": "wsign-5e0d",
        "full API key": "root-key-3b8a",
        "scoped API key": "own-key-0c4f",
        "vendor key": "vendor-key-d00d",
        "Slack bot token": "xoxb-6a6a6a",
        "Slack signing secret": "slack-sign-2f2f",
    }
    closed = socket.socket()  # bound, never listening: the worker refuses every connection
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    worker = f"http://wuser:{secrets['worker password']}@127.0.0.1:{port}/decide"
    config = tmp_path / "subs.toml"
    config.write_text(
        project_toml(vendor.url)
        + f'\n[agent.remote]\nworker = "{worker}?token={secrets["worker token"]}"\n'
        + 'signing_secret_env = "REMOTE_SIGNING_SECRET"\n'
    )
    user, password = "subs-redact", secrets["redis password"]
    with SyncRedis.from_url(redis_url) as admin:
        admin.execute_command("ACL", "SETUSER", user, "on", f">{password}", "~*", "&*", "+@all")
    env = {
        "SUBS_LOG": "INFO",
        "SUBS_API_KEYS": f"{secrets['full API key']},{secrets['scoped API key']}:own",
        "OPENAI_API_KEY": secrets["vendor key"],
        "REMOTE_SIGNING_SECRET": secrets["worker signing secret"],
        "SLACK_BOT_TOKEN_REMOTE": secrets["Slack bot token"],
        "SLACK_SIGNING_SECRET_REMOTE": secrets["Slack signing secret"],
    }
    url = redis_url.replace("unix://", f"unix://{user}:{password}@", 1)
    proc = await start_subs("serve", "-c", str(config), "--redis", url, "--port", "0", env=env)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        async with asyncio.timeout(20):
            start = (await proc.stderr.readline()).decode()
        assert start.startswith("subs: engine "), start
        reading = asyncio.gather(proc.stdout.read(), proc.stderr.read())
        base = start.split("; api ")[1].split(";")[0]
        key = secrets["full API key"]
        vendor.push(Text("done"))
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            done = await http.post(INPUT, json={"input": say("hi")}, headers=auth(key))
            await read_stream(
                http, done.json()["session_id"], key=key, params={"turn_id": done.json()["turn_id"]}
            )
            failing = await http.post(INPUT, json={"input": say("hi", "remote")}, headers=auth(key))
            assert failing.status_code == 202
            # A client that leaks every secret into what the access log writes.
            leaky = " ".join(secrets.values())
            probe = await http.get(
                "/healthz",
                params={"access_token": key},
                headers={"User-Agent": leaky, "Referer": f"{worker}?sig=x"},
            )
            assert probe.status_code == 200
    finally:
        if proc.returncode is None:
            proc.terminate()
        code = await asyncio.wait_for(proc.wait(), 15)
        closed.close()
        with SyncRedis.from_url(redis_url) as admin:
            admin.execute_command("ACL", "DELUSER", user)
    out, err = (part.decode() for part in await reading)
    lines = [start, *out.splitlines(), *err.splitlines()]
    assert code == 0, err
    leaks = [f"{what} in: {line}" for line in lines for what, s in secrets.items() if s in line]
    assert not leaks, "\n".join(leaks)
    # The lines that carried them are there, masked.
    assert f"unix://{user}:***@/" in start
    assert f"worker http://wuser:***@127.0.0.1:{port}/decide?token=***" in start
    [access] = [line for line in lines if "GET /healthz?access_token=***" in line]
    assert access.count("***") >= len(secrets)


# -- health ------------------------------------------------------------------------------------


async def test_healthz_is_degraded_while_redis_is_away_and_handlers_answer_503(
    tmp_path: Path,
) -> None:
    server = EmbeddedRedis(tmp_path / "own-redis")
    redis = connect(server.start())
    try:
        store = await Store.open(redis)
        app = make_app(Client(store), store, keys=ApiKeys.from_env(KEYS_ENV))
        async with serve(app) as base, httpx.AsyncClient(base_url=base, timeout=10) as http:
            ok = await http.get("/healthz")
            assert (ok.status_code, ok.json()) == (200, {"status": "ok"})

            server.stop()
            started = time.monotonic()
            degraded = await poll_until(healthz_is(http, 503), 5, "/healthz to answer 503")
            assert time.monotonic() - started < 2
            assert degraded.json()["status"] == "degraded"
            assert degraded.json()["code"] == "store_unavailable"  # the error shape, too
            reason = degraded.json()["redis"]
            assert reason and len(reason) < 40 and "/" not in reason  # a word, no address
            for method, path, body in [
                ("GET", "/api/client/sessions/s", None),
                ("GET", stream_path("s"), None),
                ("GET", "/api/admin/sessions", None),
                ("POST", INPUT, {"input": say("hi")}),
            ]:
                resp = await http.request(method, path, json=body, headers=auth(ROOT))
                assert resp.status_code == 503, (path, resp.text)
                assert resp.json() == {
                    "error": "the store (Redis) is not reachable; retry shortly",
                    "code": "store_unavailable",
                }
                assert resp.headers["Retry-After"] == "1"

            server = EmbeddedRedis(tmp_path / "own-redis")  # a stopped one is stopped for good
            server.start()
            await poll_until(healthz_is(http, 200), 5, "/healthz to answer 200 again")
            back = await http.get("/api/client/sessions/s", headers=auth(ROOT))
            assert back.status_code == 404
    finally:
        await redis.aclose()
        server.stop()


# -- the Slack endpoint --------------------------------------------------------------------


@dataclass
class Endpoint:
    """`POST /slack/<agent>/events`, in a test's app or in `subs serve`, and its Slack."""

    url: str
    fake: FakeSlack
    client: Client


@pytest.fixture(params=["in-process", "subs-serve"])
async def slack_endpoint(
    request: pytest.FixtureRequest, redis, redis_url: str, vendor: FakeVendor, tmp_path: Path
) -> AsyncIterator[Endpoint]:
    if request.param == "in-process":
        text = project_toml(vendor.url) + f'\n[agent.{AGENT}.slack]\ncommands = ["/oncall"]\n'
        project = parse_project(text, str(tmp_path / "subs.toml"), env={})
        async with serve_bots(redis, vendor, project, AGENT) as world:
            yield Endpoint(world.url, world.fake, world.client)
    else:
        async with slack_serve(tmp_path, redis_url, vendor.url, transport="http") as app:
            yield Endpoint(app.events_url, app.fake, app.client)


FORM = "application/x-www-form-urlencoded"
JSON = "application/json"


@dataclass
class Delivery:
    name: str
    body: bytes
    status: int | tuple[int, ...]
    content_type: str = JSON
    signed: bool = True
    headers: dict[str, str | bytes] | None = None  # replace the signature headers
    age: float = 0.0  # how old the signature's timestamp is


def deep(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


def interaction(payload: dict[str, Any]) -> bytes:
    """An interactivity body as Slack posts it: form field `payload` holding JSON."""
    return urlencode({"payload": json.dumps(payload)}).encode()


def click(action_id: str = "go", **fields: Any) -> bytes:
    """A button click whose fields (channel, user, container, ...) the test chooses."""
    action = {"action_id": action_id, "action_ts": "1.2", "value": "v"}
    return interaction({"type": "block_actions", "actions": [action], **fields})


SLACK_GARBAGE = [
    # Not Slack's: refused before the body is read or parsed.
    Delivery("unsigned JSON", b'{"type":"event_callback"}', 401, signed=False),
    Delivery("unsigned binary", bytes(range(256)), 401, content_type="image/png", signed=False),
    Delivery("unsigned empty", b"", 401, signed=False),
    Delivery("stale", b'{"type":"event_callback"}', 401, age=600),
    Delivery("future", b'{"type":"event_callback"}', 401, age=-600),
    Delivery(
        "timestamp not a number",
        b"{}",
        401,
        headers={"X-Slack-Request-Timestamp": "soon", "X-Slack-Signature": "v0=00"},
    ),
    Delivery(
        "huge timestamp",
        b"{}",
        401,
        headers={"X-Slack-Request-Timestamp": "9" * 5000, "X-Slack-Signature": "v0=00"},
    ),
    Delivery(
        "signature not ASCII",
        b"{}",
        401,
        headers={"X-Slack-Request-Timestamp": "TS", "X-Slack-Signature": "v0=\xe9".encode()},
    ),
    Delivery(
        "huge signature header",
        b"{}",
        (400, 401, 431),
        headers={"X-Slack-Request-Timestamp": "TS", "X-Slack-Signature": "v0=" + "a" * 20000},
    ),
    # slack_sdk computes the signature of text: a body that is not UTF-8 cannot be verified.
    Delivery("not UTF-8", b'{"type":"\xff\xfe"}', 401),
    # Signed, but not a body Slack sends.
    Delivery("empty", b"", 400),
    Delivery("empty form", b"", 400, content_type=FORM),
    Delivery("control bytes", bytes(range(32)), 400, content_type="application/octet-stream"),
    Delivery("not JSON", b"{not json", 400),
    Delivery("JSON list", b"[1, 2]", 400),
    Delivery("JSON string", b'"event_callback"', 400),
    Delivery("JSON null", b"null", 400),
    Delivery("JSON nested deep", deep(100_000), 400),
    Delivery("no type", b'{"token": "x"}', 400),
    Delivery("type not a string", b'{"type": 5}', 400),
    Delivery("event not an object", b'{"type": "event_callback", "event": 7}', 400),
    Delivery("enterprise a number", b'{"type": "event_callback", "enterprise": 5}', 400),
    Delivery("authorizations a string", b'{"type": "event_callback", "authorizations": "x"}', 400),
    Delivery("form without payload", b"foo=bar&baz=1", 400, content_type=FORM),
    Delivery("form payload not JSON", b"payload=%7Bnope", 400, content_type=FORM),
    Delivery("form payload a list", b"payload=%5B1%5D", 400, content_type=FORM),
    Delivery("JSON sent as a form", b'{"type": 5}', 400, content_type=FORM),
    Delivery("a form sent as JSON", b"payload=%7B%7D", 400),
    Delivery("event without a type", b'{"type": "event_callback", "event": {}}', 400),
    Delivery("event type a number", b'{"type": "event_callback", "event": {"type": 5}}', 400),
    Delivery(
        "mention with odd fields",
        b'{"type": "event_callback", "event_id": "Ev4", "event": {"type": "app_mention",'
        b' "channel": 5, "user": [], "ts": {}, "text": 7, "thread_ts": null}}',
        400,
    ),
    Delivery(
        "actions not a list",
        interaction({"type": "block_actions", "actions": "x"}),
        400,
        content_type=FORM,
    ),
    Delivery(
        "action not an object",
        interaction({"type": "block_actions", "actions": [5]}),
        400,
        content_type=FORM,
    ),
    Delivery(
        "view not an object",
        interaction({"type": "view_submission", "view": 5}),
        400,
        content_type=FORM,
    ),
    Delivery("container a string", click(container="c"), 400, content_type=FORM),
    Delivery("user a number", click(user=7), 400, content_type=FORM),
    # Signed and shaped like Slack's, with odd values: acknowledged, and nothing starts.
    Delivery(
        "mention without fields",
        b'{"type": "event_callback", "event": {"type": "app_mention"}, "event_id": "Ev3"}',
        200,
    ),
    Delivery(
        "url verification as text/plain",
        b'{"type": "url_verification", "challenge": "c"}',
        200,
        content_type="text/plain",
    ),
    Delivery("command without fields", b"command=%2Foncall", 200, content_type=FORM),
    Delivery(
        "command with odd fields",
        b"command=%2Foncall&channel_id=&user_id=%00&trigger_id=%FF",
        200,
        content_type=FORM,
    ),
    Delivery(
        "button with odd values", click(channel={"id": 5}, user={"id": []}), 200, content_type=FORM
    ),
    Delivery(
        "prompt click with odd values",
        click(action_id=f"{ACTION_PREFIX}:x:0", container={"message_ts": 5}, user={"id": 5}),
        200,
        content_type=FORM,
    ),
    Delivery(
        "prompt click for no prompt",
        click(action_id=f"{ACTION_PREFIX}:nope:9", user={"id": "U1"}, channel={"id": "C1"}),
        200,
        content_type=FORM,
    ),
]


async def deliver(endpoint: Endpoint, row: Delivery, http: httpx.AsyncClient) -> httpx.Response:
    stamp = str(int(time.time() - row.age))
    headers: dict[str, str | bytes] = {"Content-Type": row.content_type}
    if row.headers is not None:
        headers |= {k: (stamp if v == "TS" else v) for k, v in row.headers.items()}
    elif row.signed:
        headers["X-Slack-Request-Timestamp"] = stamp
        headers["X-Slack-Signature"] = sign(endpoint.fake.signing_secret, stamp, row.body)
    return await http.post(endpoint.url, content=row.body, headers=headers)


async def test_the_slack_endpoint_answers_garbage_with_401_or_400_never_500(
    slack_endpoint: Endpoint, vendor: FakeVendor
) -> None:
    wrong = []
    async with httpx.AsyncClient(timeout=10) as http:
        for row in SLACK_GARBAGE:
            resp = await deliver(slack_endpoint, row, http)
            wanted = row.status if isinstance(row.status, tuple) else (row.status,)
            if resp.status_code not in wanted:
                wrong.append(f"{row.name}: {resp.status_code} {resp.text[:80]}")
    assert not wrong, "\n".join(wrong)
    assert await slack_endpoint.client.sessions() == []  # none of it started a turn

    fake = slack_endpoint.fake  # and Slack itself is still answered
    vendor.push(Text("still here"))
    dm = fake.post_as_user(fake.dm, "hello")
    assert (await fake.send_event(slack_endpoint.url, fake.event_for(dm))).status == 200
    await fake.until(lambda: [m for m in fake.thread(fake.dm.id, dm.ts) if m.bot_id] or None, 20)
