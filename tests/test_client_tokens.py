"""Client tokens and the machine API's submit, through real HTTP on loopback: PyJWT-made
tokens (good and bad) against the client API, the AG-UI channel's auth and CORS, and
upstream's example bodies (AlexWiles/substructure docs/250-api.md and docs/190-auth.md,
pointed at our test agents), kept in docs/upstream-api.md."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest

from engine.api import ApiKeys, make_app
from engine.api.client_tokens import ClientTokens, TokenConfigError
from engine.client import Client
from engine.runtime.engine import Engine
from engine.store.snapshots import load_state
from tests.agui_helpers import run_input, user
from tests.api_helpers import ALICE, INPUT, KEYS_ENV, ROOT, auth, read_stream, serve
from tests.engine_helpers import ENV, make_project
from tests.fakes.llm_vendor import FakeVendor, Text

SECRET = "s" * 64
TOKENS = ClientTokens.from_env({"CLIENT_TOKEN_HS256_SECRET": SECRET})
ORIGIN = "https://app.example"
MINT = "/api/machine/client-tokens"
SUBMIT = "/api/machine/sessions/submit"


@pytest.fixture
async def engine(redis, vendor: FakeVendor, tmp_path: Path) -> AsyncIterator[Engine]:
    eng = Engine(make_project(tmp_path, vendor.url), redis, env=ENV, lease_ms=3000)
    await eng.start()
    yield eng
    await eng.stop()


@asynccontextmanager
async def api(engine: Engine, **kw: Any) -> AsyncIterator[httpx.AsyncClient]:
    kw.setdefault("tokens", TOKENS)
    app = make_app(Client(engine.store), engine.store, keys=ApiKeys.from_env(KEYS_ENV), **kw)
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=10) as http:
        yield http


def token(**over: Any) -> str:
    """A token as the engine mints them, with `over` claims changed (None: left out)."""
    now = int(time.time())
    claims: dict[str, Any] = {
        "iss": "subs",
        "aud": "subs-client",
        "sub": "user_42",
        "iat": now,
        "nbf": now,
        "exp": now + 600,
        "metadata": {"plan": "pro"},
    }
    key = over.pop("key", SECRET)
    alg = over.pop("alg", "HS256")
    claims.update(over)
    claims = {k: v for k, v in claims.items() if v is not None}
    return jwt.encode(claims, key, algorithm=alg)


def say(text: str, agent: str = "ops_openai") -> dict[str, Any]:
    return {
        "type": "client.message",
        "agent_id": agent,
        "message": {"role": "user", "content": text},
    }


BAD_TOKENS = [
    ("expired", lambda: token(exp=int(time.time()) - 60), "expired"),
    ("not yet valid", lambda: token(nbf=int(time.time()) + 600), "not yet valid"),
    ("wrong audience", lambda: token(aud="someone-else"), "wrong audience"),
    ("wrong issuer", lambda: token(iss="evil"), "wrong issuer"),
    ("wrong signature", lambda: token(key="x" * 40), "signature does not match"),
    ("alg none", lambda: token(alg="none", key=None), "not signed with HS256"),
    ("HS512", lambda: token(alg="HS512"), "not signed with HS256"),
    ("missing sub", lambda: token(sub=None), "'sub'"),
    ("empty sub", lambda: token(sub=""), "sub"),
    ("missing exp", lambda: token(exp=None), "'exp'"),
    ("metadata not strings", lambda: token(metadata={"n": 1}), "metadata"),
    ("garbage", lambda: "aaa.bbb.ccc", "invalid"),
]


async def test_bad_tokens_are_401_with_a_reason(engine: Engine) -> None:
    wrong = []
    async with api(engine) as http:
        for name, make, reason in BAD_TOKENS:
            for method, path, body in (
                ("POST", INPUT, {"input": say("hi")}),
                ("POST", "/api/channels/ag-ui/agents/ops_openai/run", {"threadId": "t"}),
            ):
                resp = await http.request(method, path, json=body, headers=auth(make()))
                got = (resp.status_code, resp.json().get("code"))
                if got != (401, "invalid_token") or reason not in resp.json()["error"]:
                    wrong.append(f"{name} {path}: {resp.status_code} {resp.text[:160]}")
                elif resp.headers.get("WWW-Authenticate") != "Bearer":
                    wrong.append(f"{name}: no WWW-Authenticate")
    assert not wrong, "\n".join(wrong)


async def test_tokens_off_without_the_secret(engine: Engine) -> None:
    async with api(engine, tokens=ClientTokens()) as http:
        resp = await http.post(INPUT, json={"input": say("hi")}, headers=auth(token()))
        assert resp.status_code == 401
        assert "CLIENT_TOKEN_HS256_SECRET" in resp.json()["error"]
        resp = await http.post(MINT, json={"identity": {"id": "u"}}, headers=auth(ROOT))
        assert resp.status_code == 503 and resp.json()["code"] == "client_tokens_off"


def test_a_short_secret_is_refused() -> None:
    with pytest.raises(TokenConfigError, match="at least 32"):
        ClientTokens.from_env({"CLIENT_TOKEN_HS256_SECRET": "short"})
    assert not ClientTokens.from_env({}).enabled


async def test_a_minted_token_owns_its_sessions_only(engine: Engine, vendor: FakeVendor) -> None:
    vendor.default = Text("hello")
    async with api(engine) as http:
        # upstream's body (docs/250-api.md, POST /api/machine/client-tokens), unchanged
        body = {"identity": {"id": "user_42", "metadata": {"plan": "pro"}}, "ttl_seconds": 600}
        before = int(time.time())
        resp = await http.post(MINT, json=body, headers=auth(ROOT))
        assert resp.status_code == 200, resp.text
        minted = resp.json()
        assert set(minted) == {"token", "expires_at"}
        assert before + 600 <= minted["expires_at"] <= int(time.time()) + 600
        default = await http.post(MINT, json={"identity": {"id": "u"}}, headers=auth(ROOT))
        assert default.json()["expires_at"] - int(time.time()) in range(595, 601)
        mine = auth(minted["token"])
        resp = await http.post(INPUT, json={"input": say("hi")}, headers=mine)
        assert resp.status_code == 202, resp.text
        sid = resp.json()["session_id"]
        state = await load_state(engine.store, sid)
        assert state is not None
        assert state.identity["subject"] == {"issuer": "app", "id": "user_42"}
        assert state.identity["metadata"] == {"plan": "pro"}  # the worker's identity
        assert (await http.get(f"/api/client/sessions/{sid}", headers=mine)).status_code == 200
        other = auth(token(sub="user_43"))
        resp = await http.get(f"/api/client/sessions/{sid}", headers=other)
        assert resp.status_code == 403 and resp.json()["code"] == "forbidden"
        resp = await http.post(INPUT, json={"session_id": sid, "input": say("x")}, headers=other)
        assert resp.status_code == 403
        # a KEY:own key with the same id as nothing: keys and tokens never share owners
        resp = await http.get(f"/api/client/sessions/{sid}", headers=auth(ALICE))
        assert resp.status_code == 403
        # a token reaches neither the machine nor the admin API, and mints nothing
        for method, path in (
            ("POST", MINT),
            ("POST", f"/api/machine/sessions/{sid}/calls/settle"),
            ("GET", "/api/admin/sessions"),
        ):
            resp = await http.request(method, path, json={"identity": {"id": "x"}}, headers=mine)
            assert resp.status_code == 403, (path, resp.text)
        # only a full key mints: a KEY:own key could name any user
        resp = await http.post(MINT, json={"identity": {"id": "x"}}, headers=auth(ALICE))
        assert resp.status_code == 403
        # a token cannot set its identity
        resp = await http.post(
            INPUT, json={"input": say("x"), "identity": {"metadata": {}}}, headers=mine
        )
        assert resp.status_code == 403


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "identity"),
        ({"identity": {}}, "identity.id"),
        ({"identity": {"id": ""}}, "identity.id"),
        ({"identity": {"id": "u", "metadata": {"a": 1}}}, "identity.metadata.a"),
        ({"identity": {"id": "u"}, "ttl_seconds": 0}, "ttl_seconds"),
        ({"identity": {"id": "u"}, "ttl_seconds": "600"}, "ttl_seconds"),
        ({"identity": {"id": "u"}, "ttl_seconds": 86_401}, "ttl_seconds"),
        ({"identity": {"id": "u"}, "tenant_id": "t"}, "tenant_id"),
    ],
)
async def test_mint_validates_its_body(engine: Engine, body: dict[str, Any], param: str) -> None:
    async with api(engine) as http:
        resp = await http.post(MINT, json=body, headers=auth(ROOT))
        assert (resp.status_code, resp.json()["param"]) == (422, param), resp.text


async def test_cors_preflight_for_configured_origins_only(engine: Engine) -> None:
    preflight = {"Access-Control-Request-Method": "POST"}
    async with api(engine, cors_origins=[ORIGIN]) as http:
        for path in (INPUT, "/api/channels/ag-ui/agents/ops_openai/run"):
            ok = await http.options(path, headers=preflight | {"Origin": ORIGIN})
            assert ok.status_code == 204 and ok.headers["access-control-allow-origin"] == ORIGIN
            assert "authorization" in ok.headers["access-control-allow-headers"].lower()
            no = await http.options(path, headers=preflight | {"Origin": "https://evil.example"})
            assert no.status_code == 403 and "access-control-allow-origin" not in no.headers
        # a token's own answers carry the header for the listed origin only
        resp = await http.get(
            "/api/client/sessions/none", headers=auth(token()) | {"Origin": ORIGIN}
        )
        assert resp.headers["access-control-allow-origin"] == ORIGIN


async def test_machine_submit_upstream_example(engine: Engine, vendor: FakeVendor) -> None:
    vendor.default = Text("hello there")
    async with api(engine) as http:
        # upstream's body (docs/250-api.md, POST /api/machine/sessions/submit), its agent ours
        body = {
            "agent_id": "ops_openai",
            "identity": {"id": "user_42"},
            "session_id": "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
            "payload": {"type": "client.message", "message": {"role": "user", "content": "hi"}},
        }
        resp = await http.post(SUBMIT, json=body, headers=auth(ROOT))
        assert resp.status_code == 202, resp.text
        reply = resp.json()
        assert reply["session_id"] == body["session_id"] and reply["queued"] is False
        # the user's token owns what the backend started for them
        got = await http.get(f"/api/client/sessions/{body['session_id']}", headers=auth(token()))
        assert got.status_code == 200, got.text
        # the machine event stream, with the key
        frames = await read_stream(
            http,
            body["session_id"],
            key=ROOT,
            params={"turn_id": reply["turn_id"]},
            path=f"/api/machine/sessions/{body['session_id']}/events/stream",
        )
        assert frames[-1].event == "turn.completed"
        # upstream's second error shape: {"ok": false, "error"}
        bad = await http.post(SUBMIT, json={**body, "identity": {}}, headers=auth(ROOT))
        assert bad.status_code == 422 and bad.json()["ok"] is False and bad.json()["error"]
        scoped = await http.post(SUBMIT, json=body, headers=auth(ALICE))
        assert scoped.status_code == 403 and scoped.json()["ok"] is False


async def test_the_agui_channel_takes_a_token_as_its_owner(
    engine: Engine, vendor: FakeVendor
) -> None:
    vendor.default = Text("hello from the channel")
    body = run_input("token-thread-1", "run-1", [user("m1", "hi")])
    async with api(engine) as http:
        resp = await http.post(
            "/api/channels/ag-ui/agents/ops_openai/run",
            json=body,
            headers=auth(token()) | {"Accept": "text/event-stream"},
        )
        assert resp.status_code == 200, resp.text
        assert "RUN_FINISHED" in resp.text and "TEXT_MESSAGE_CONTENT" in resp.text
        state = await load_state(engine.store, "token-thread-1")
        assert state is not None
        assert state.identity["subject"] == {"issuer": "app", "id": "user_42"}
        # another user's token may not continue that thread
        again = run_input("token-thread-1", "run-2", [user("m1", "hi"), user("m2", "more")])
        resp = await http.post(
            "/api/channels/ag-ui/agents/ops_openai/run",
            json=again,
            headers=auth(token(sub="user_43")) | {"Accept": "text/event-stream"},
        )
        assert resp.status_code == 403, resp.text
