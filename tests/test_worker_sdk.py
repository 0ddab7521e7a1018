"""The Python worker SDK (`subs.worker`) against the spec and the real engine.

- Its models are held to spec/protocol.schema.json: the same members, the same
  required ones, the same enums, for the request, the response, each trigger and
  each action (`drift` finds any difference; it is tried on a spec broken on purpose).
- Every answer it builds validates against `#/properties/decision_response`.
- Its signature check, through real HTTP (aiohttp app) and a real ASGI server
  (uvicorn, which the mcp SDK brings): good, wrong secret, stale, future, old header only.
- A real engine turn (real Redis, fake vendor) decided by an SDK worker: a tool, an
  async tool settled through the machine API, a streamed `llm.execute`.
"""

from __future__ import annotations

import asyncio
import copy
import json
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import httpx
import pytest
import uvicorn
from pydantic import BaseModel

import subs.worker as sdk
from engine.api import ApiKeys, make_app
from engine.client import Client
from engine.config import parse_project
from engine.effects.delivery import Delivery, deliver
from engine.runtime.engine import Engine
from subs.worker import (
    LATER,
    DecisionRequest,
    DecisionResponse,
    Reply,
    Stream,
    StreamDelta,
    SubsClient,
    ToolError,
    Worker,
    aiohttp_app,
    asgi_app,
    sign,
    stream_text,
)
from tests.api_helpers import KEYS_ENV, ROOT, serve
from tests.engine_helpers import ENV, assert_consistent, payloads, turn_ended, wait_for_event
from tests.fakes.llm_vendor import Text, ToolCalls
from tests.test_engine_worker import start_engine, worker_project
from tests.workers import REQUEST_SCHEMA, RESPONSE_SCHEMA, SCHEMA_PATH, schema_errors

SPEC = json.loads(SCHEMA_PATH.read_text())
SECRET = "sdk-worker-secret"

# --- the models are the spec's ------------------------------------------------------------


def _resolve(node: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = root["$defs"][node["$ref"].rsplit("/", 1)[-1]]
    return node


def enum_of(node: dict[str, Any], root: dict[str, Any]) -> frozenset[Any] | None:
    """The closed set of values a property takes (`enum`, `const`, or a union of
    them, `null` aside), or None when it is not closed."""
    node = _resolve(node, root)
    if "enum" in node:
        return frozenset(v for v in node["enum"] if v is not None)
    if "const" in node:
        return frozenset([node["const"]])
    branches = node.get("oneOf") or node.get("anyOf")
    if not branches:
        return None
    sets = [enum_of(b, root) for b in branches if _resolve(b, root).get("type") != "null"]
    if not sets or any(s is None for s in sets):
        return None
    return frozenset().union(*sets)  # type: ignore[arg-type]


def drift(spec_def: dict[str, Any], model: type[BaseModel], sent: bool) -> list[str]:
    """How `model` differs from the schema's object `spec_def`: members, required
    members (for a type the worker sends, `type` is written always, so counts as
    required) and each member's enum."""
    ours = model.model_json_schema(mode="validation")
    required = set(ours.get("required", []))
    if sent and "type" in model.model_fields:
        required.add("type")
    problems = []
    if set(ours["properties"]) != set(spec_def["properties"]):
        problems.append(f"members {sorted(ours['properties'])} != {sorted(spec_def['properties'])}")
    if required != set(spec_def.get("required", [])):
        problems.append(f"required {sorted(required)} != {sorted(spec_def.get('required', []))}")
    for name, node in spec_def["properties"].items():
        if name in ours["properties"]:
            want, have = enum_of(node, SPEC), enum_of(ours["properties"][name], ours)
            if want != have:
                problems.append(f"{name}: enum {have} != {want}")
    return problems


def variants(union: str) -> dict[str, dict[str, Any]]:
    return {v["properties"]["type"]["const"]: v for v in SPEC["$defs"][union]["oneOf"]}


def models_by_type(annotated: Any) -> dict[str, type[BaseModel]]:
    [union, *_] = annotated.__metadata__ and (annotated.__origin__,)
    return {m.model_fields["type"].annotation.__args__[0]: m for m in union.__args__}


PAIRS = [
    ("DecisionRequest", SPEC["$defs"]["DecisionRequest"], DecisionRequest, False),
    ("DecisionResponse", SPEC["$defs"]["DecisionResponse"], DecisionResponse, True),
    ("StreamDelta", SPEC["$defs"]["StreamDelta"], StreamDelta, True),
    ("ErrorInfo", SPEC["$defs"]["ErrorInfo"], sdk.ErrorInfo, True),
    ("WorkerIdentity", SPEC["$defs"]["WorkerIdentity"], sdk.WorkerIdentity, False),
]
PAIRS += [
    (f"trigger {t}", v, models_by_type(sdk.Trigger)[t], False)
    for t, v in variants("DecisionTrigger").items()
]
PAIRS += [
    (f"action {t}", v, models_by_type(sdk.Action)[t], True)
    for t, v in variants("DecisionAction").items()
]


def test_every_trigger_and_action_of_the_spec_has_a_model() -> None:
    assert set(models_by_type(sdk.Trigger)) == set(variants("DecisionTrigger"))
    assert set(sdk.TRIGGER_TYPES) == set(variants("DecisionTrigger"))
    assert set(models_by_type(sdk.Action)) == set(variants("DecisionAction"))
    statuses = {v["properties"]["status"]["const"] for v in SPEC["$defs"]["ToolInput"]["oneOf"]}
    assert enum_of(sdk.ToolInput.model_json_schema()["properties"]["status"], {}) == statuses


@pytest.mark.parametrize(("what", "spec_def", "model", "sent"), PAIRS, ids=[p[0] for p in PAIRS])
def test_the_model_is_the_specs(what, spec_def, model, sent) -> None:
    assert drift(spec_def, model, sent) == [], what


def test_drift_sees_a_spec_that_moved() -> None:
    """The check fails on a member added, a member made required, an enum grown."""
    tool_error = variants("DecisionAction")["tool.error"]
    added = copy.deepcopy(tool_error)
    added["properties"]["hint"] = {"type": "string"}
    required = copy.deepcopy(tool_error)
    required["required"].append("retryable")
    grown = copy.deepcopy(SPEC)
    grown["$defs"]["ErrorCode"]["enum"].append("teapot")
    model = models_by_type(sdk.Action)["tool.error"]
    assert drift(added, model, True) and drift(required, model, True)
    try:
        SPEC["$defs"]["ErrorCode"]["enum"].append("teapot")
        assert drift(tool_error, model, True)
    finally:
        SPEC["$defs"]["ErrorCode"]["enum"].remove("teapot")


# --- what it answers is a DecisionResponse ----------------------------------------------------

ANSWERS = [
    DecisionResponse(),
    DecisionResponse(state={"n": 1}, channels={"slack": {"text": "hi"}}),
    DecisionResponse(state={}),
    DecisionResponse(messages=[{"role": "assistant", "content": "hello"}]),
    DecisionResponse(agent={"model": "m", "llm": "openai"}),
    DecisionResponse(
        actions=[
            sdk.LlmCallAction(),
            sdk.LlmCallAction(model="m", temperature=0.2, stream=True, messages=None),
            sdk.ToolCallAction(name="lookup", arguments={"q": "x"}),
            sdk.ToolResultAction(result={"ok": True}),
            sdk.ToolResultAction(result=None, id="call_1", attempt=2),
            sdk.ToolResultAction(content=[{"type": "text", "text": "t"}], is_error=False),
            sdk.ToolErrorAction(error="boom", retryable=False, code="handler_error"),
            sdk.LlmResultAction(response={"model": "m", "content": "c"}),
            sdk.LlmErrorAction(error="rate limited", retryable=True),
            sdk.SubagentSpawnAction(agent_id="a", tool_call_id="c", mode="wait"),
            sdk.MessageSendAction(session_id="s", message={"role": "user", "content": "x"}),
            sdk.InterruptAction(reason="confirm", payload={"message": "ok?"}),
            sdk.InterruptResolveAction(interrupt_id="i1"),
            sdk.ConnectorSyncAction(path="mcp.git"),
            sdk.DoneAction(),
            sdk.DoneAction(data={"answer": 42}),
            sdk.FailAction(error=sdk.ErrorInfo(message="no", code="handler_error")),
        ]
    ),
    # None where the schema allows no null is left out, not sent as null.
    DecisionResponse(actions=[sdk.ToolErrorAction(error="e", retryable=None)], agent=None),
]


@pytest.mark.parametrize("answer", ANSWERS)
def test_every_answer_the_sdk_builds_is_a_decision_response(answer: DecisionResponse) -> None:
    wire = answer.to_wire()
    assert schema_errors(RESPONSE_SCHEMA, wire) == [], wire
    assert DecisionResponse.model_validate(wire) == DecisionResponse.model_validate(wire)


def test_a_typo_in_an_answer_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match="retryabel"):
        DecisionResponse.model_validate(
            {"actions": [{"type": "tool.error", "error": "e", "retryabel": 1}]}
        )


# --- signatures, through real HTTP --------------------------------------------------------------

REQUEST = {
    "session_id": "s-1",
    "decision_id": "d-1",
    "agent_id": "helper",
    "turn_id": None,
    "identity": {"metadata": {}},
    "trigger": {"type": "session.start"},
    "proposed": {"agent": {"model": "m", "llm": "openai"}},
    "state": None,
    "calls": [],
    "pending_calls": 0,
    "messages": [],
    "message_tree": {"nodes": [], "head_id": None},
    "ancestry": [],
    "attempts": 1,
}
BODY = json.dumps(REQUEST).encode()


def table(now: int) -> list[tuple[str, dict[str, str], int]]:
    good = sign(SECRET, BODY, now)
    legacy_only = {"X-Substructure-Signature": good["X-Substructure-Signature"]}
    return [
        ("good", good, 200),
        ("good, timestamped header only", {"X-Subs-Signature": good["X-Subs-Signature"]}, 200),
        ("wrong secret", sign("another-secret", BODY, now), 401),
        ("stale t", sign(SECRET, BODY, now - 360), 401),
        ("future t", sign(SECRET, BODY, now + 360), 401),
        ("old header only", legacy_only, 401),
        ("none", {}, 401),
        ("garbled", {"X-Subs-Signature": "t=now,v1=zz"}, 401),
        (
            "old header wrong beside a good one",
            {**good, "X-Substructure-Signature": sign("x", BODY, now)["X-Substructure-Signature"]},
            401,
        ),
    ]


@pytest.fixture
async def uvicorn_url() -> AsyncIterator[Any]:
    """Serve an ASGI app with a real uvicorn on 127.0.0.1, port 0; stopped at the end."""
    servers: list[tuple[uvicorn.Server, asyncio.Task[None]]] = []

    async def start(app: Any) -> str:
        config = uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="on", log_level="warning")
        server = uvicorn.Server(config)
        task = asyncio.create_task(server.serve())
        servers.append((server, task))
        async with asyncio.timeout(10):
            while not server.started:
                await asyncio.sleep(0.01)  # polling uvicorn's own flag, under a deadline
        port = server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/"

    yield start
    for server, task in servers:
        server.should_exit = True
        await task


@pytest.mark.parametrize("kind", ["aiohttp", "asgi"])
async def test_the_signature_table(kind: str, uvicorn_url) -> None:
    worker = Worker(secret=SECRET)
    now = int(time.time())
    cases = table(now)
    if kind == "aiohttp":
        context = serve(aiohttp_app(worker))
    else:
        context = _as_context(uvicorn_url(asgi_app(worker)))
    async with context as url, aiohttp.ClientSession() as http:
        for name, headers, status in cases:
            async with http.post(url, data=BODY, headers=headers) as response:
                text = await response.text()
                assert response.status == status, (name, text)
                if status == 200:
                    assert json.loads(text) == REQUEST["proposed"], name
                else:
                    assert (
                        "X-Subs-Signature" in json.loads(text)["error"] or "X-Substructure" in text
                    )


class _as_context:
    def __init__(self, url: Any) -> None:
        self._url = url

    async def __aenter__(self) -> str:
        return str(await self._url)

    async def __aexit__(self, *exc: object) -> None:
        return None


@pytest.mark.parametrize(
    ("name", "skew", "good"),
    [
        ("now", 0, True),
        ("299 s old", -299, True),
        ("301 s old", -301, False),
        ("299 s ahead", 299, True),
        ("301 s ahead", 301, False),
    ],
)
def test_the_window_is_five_minutes_either_way(name: str, skew: int, good: bool) -> None:
    sent = 1_800_000_000
    headers = sign(SECRET, BODY, sent + skew)
    try:
        sdk.verify(SECRET, BODY, headers, now=sent)
    except sdk.SignatureError:
        assert not good, name
    else:
        assert good, name


async def test_asgi_mounts_in_starlette_and_refuses_what_is_not_a_request() -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    app = Starlette(routes=[Mount("/worker", app=asgi_app(Worker(secret=None)))])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://w") as c:
        ok = await c.post("/worker/", content=BODY)
        assert ok.status_code == 200 and ok.json() == REQUEST["proposed"]
        bad = await c.post("/worker/", content=b'{"trigger": {"type": "nope"}}')
        assert bad.status_code == 400 and "not a DecisionRequest" in bad.json()["error"]
        get = await c.get("/worker/")
        assert get.status_code == 405


# --- handlers and streams, answered over HTTP as the engine reads them --------------------------


def _request(trigger: dict[str, Any], proposed: dict[str, Any] | None = None) -> bytes:
    return json.dumps({**REQUEST, "trigger": trigger, "proposed": proposed or {}}).encode()


async def _engine_reads(url: str, body: bytes) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """What the engine's own delivery makes of the worker's answer, and its deltas."""
    deltas: list[dict[str, Any]] = []

    async def on_delta(delta: dict[str, Any]) -> None:
        deltas.append(delta)

    async with aiohttp.ClientSession() as http:
        answer = await deliver(http, Delivery(url, body, SECRET, timeout=10), on_delta)
    return answer, deltas


TOOL_EXECUTE = {
    "type": "tool.execute",
    "id": "call_1",
    "name": "lookup",
    "arguments": '{"q": "disk"}',
    "input": {"status": "valid", "value": {"q": "disk"}},
    "attempt": 1,
}
LLM_EXECUTE = {"type": "llm.execute", "id": "llm_1", "request": {}, "stream": True, "attempt": 1}


async def test_handlers_by_trigger_and_tools_by_name() -> None:
    worker = Worker(secret=SECRET)

    @worker.tool("lookup")
    async def lookup(args: dict[str, Any], request: DecisionRequest) -> Any:
        if args["q"] == "secret":
            raise ToolError("not for you", retryable=False)
        return {"disk": "91%", "session": request.session_id}

    @worker.on("llm.execute")
    async def llm(request: DecisionRequest) -> Stream:
        async def chunks() -> AsyncIterator[str]:
            for chunk in ("Disk ", "is ", "full."):
                yield chunk

        return stream_text(chunks(), model="my-model")

    @worker.on("turn.finished")
    async def finished(request: DecisionRequest) -> Any:
        return {"state": {"turns": 1}, "actions": [{"type": "done"}]}

    with pytest.raises(ValueError, match=r"no trigger 'tool\.run'"):
        worker.on("tool.run")

    async with serve(aiohttp_app(worker)) as base:
        url = base + "/"
        answer, _ = await _engine_reads(url, _request(TOOL_EXECUTE))
        assert answer == {
            "actions": [{"type": "tool.result", "result": {"disk": "91%", "session": "s-1"}}]
        }
        refused = {**TOOL_EXECUTE, "input": {"status": "valid", "value": {"q": "secret"}}}
        answer, _ = await _engine_reads(url, _request(refused))
        assert answer["actions"] == [
            {"type": "tool.error", "error": "not for you", "retryable": False}
        ]
        unknown = {**TOOL_EXECUTE, "name": "nope"}
        answer, _ = await _engine_reads(url, _request(unknown))
        assert (
            answer["actions"][0]["type"] == "tool.error" and "nope" in answer["actions"][0]["error"]
        )
        # A call whose arguments failed the tool's schema: the engine's proposed tool.error.
        invalid = {**TOOL_EXECUTE, "input": {"status": "malformed", "error": "not JSON"}}
        proposed = {"actions": [{"type": "tool.error", "error": "arguments: not JSON"}]}
        answer, _ = await _engine_reads(url, _request(invalid, proposed))
        assert answer == proposed
        answer, deltas = await _engine_reads(url, _request(LLM_EXECUTE))
        assert [d.get("text") for d in deltas] == ["Disk ", "is ", "full.", None]
        assert answer["actions"][0]["response"]["content"] == "Disk is full."
        turn = {"type": "turn.finished", "turn_id": "t1"}
        answer, _ = await _engine_reads(url, _request(turn, {"actions": [{"type": "done"}]}))
        assert answer == {"state": {"turns": 1}, "actions": [{"type": "done"}]}
        # No handler: the engine's plan.
        answer, _ = await _engine_reads(
            url,
            _request({"type": "client.action", "name": "x"}, {"actions": [{"type": "llm.call"}]}),
        )
        assert answer == {"actions": [{"type": "llm.call"}]}


async def test_a_stream_that_fails_or_ends_early_is_a_decision_error() -> None:
    async def broken() -> AsyncIterator[Any]:
        yield StreamDelta(text="half")
        raise RuntimeError("model went away")

    async def short() -> AsyncIterator[Any]:
        yield {"text": "half"}

    for items, reason in [(broken(), "model went away"), (short(), "without a decision.result")]:
        frames = b"".join([f async for f in Stream(items).frames()]).decode()
        assert frames.startswith("event: llm.token.delta\n")
        assert "event: decision.error" in frames and reason in frames


async def test_a_handler_that_raises_is_a_500_with_its_reason() -> None:
    worker = Worker(secret=None)

    @worker.on("session.start")
    async def start(request: DecisionRequest) -> Any:
        raise KeyError("model")

    reply = await worker.handle(BODY, {})
    assert reply == Reply(500, reply.body) and b"KeyError" in reply.body


# --- a real turn --------------------------------------------------------------------------------


class CheckedWorker(Worker):
    """A Worker that holds each request it gets and each answer it gives to the schema."""

    def __init__(self, secret: str) -> None:
        super().__init__(secret)
        self.problems: list[str] = []
        self.triggers: list[str] = []

    async def handle(self, body: bytes, headers: Mapping[str, str]) -> Reply:
        request = json.loads(body)
        self.triggers.append(request["trigger"]["type"])
        self.problems += schema_errors(REQUEST_SCHEMA, request)
        reply = await super().handle(body, headers)
        if reply.stream is None:
            assert reply.status == 200, reply.body
            answer = json.loads(reply.body)
            self.problems += schema_errors(RESPONSE_SCHEMA, answer)
            trigger = request["trigger"]["type"]
            # With no handler, the engine's plan goes back as the engine wrote it.
            echoed = trigger not in self.handlers and trigger != "tool.execute"
            if echoed and answer != request["proposed"]:
                self.problems.append(f"{trigger}: {answer} != {request['proposed']}")
        return reply


@pytest.mark.parametrize("kind", ["aiohttp", "asgi"])
async def test_an_sdk_worker_decides_a_real_turn_with_an_async_tool(
    kind, redis, vendor, tmp_path, uvicorn_url
) -> None:
    """The model calls `lookup`; the worker answers LATER and settles it through the
    machine API with `SubsClient.settle`; the turn completes with the result. Served as
    the aiohttp app, and as the ASGI app under uvicorn."""
    worker = CheckedWorker(SECRET)
    later: asyncio.Queue[tuple[str, str]] = asyncio.Queue()

    @worker.tool("lookup")
    async def lookup(args: dict[str, Any], request: DecisionRequest) -> Any:
        assert isinstance(request.trigger, sdk.ToolExecuteTrigger)
        await later.put((request.session_id, request.trigger.id))
        return LATER

    vendor.push(ToolCalls([("lookup", {"q": "disk"})]), Text("Disk is at 91%."))
    if kind == "aiohttp":
        context = serve(aiohttp_app(worker))
    else:  # a real ASGI server (uvicorn) running `asgi_app`
        context = _as_context(uvicorn_url(asgi_app(worker)))
    async with context as worker_url:
        worker_url = worker_url.rstrip("/")
        project = worker_project(tmp_path, vendor.url, worker_url + "/")
        engine = await start_engine(redis, project, secret=SECRET)
        client = Client(engine.store)
        api = make_app(client, engine.store, keys=ApiKeys.from_env(KEYS_ENV))
        try:
            async with serve(api) as api_url:
                message = {"role": "user", "content": "how full is the disk?"}
                reply = await client.submit(
                    {"type": "client.message", "agent_id": "helper", "message": message}
                )
                async with asyncio.timeout(20):
                    sid, call_id = await later.get()
                assert sid == reply["session_id"]
                async with SubsClient(api_url, ROOT) as subs:
                    settled = await subs.settle(sid, call_id, result={"disk": "91%"})
                    assert settled["call_id"] == call_id
                    with pytest.raises(sdk.SubsApiError) as again:
                        await subs.settle(sid, call_id, result={"disk": "91%"})
                    assert again.value.status == 409
                end = await wait_for_event(client, sid, turn_ended(reply["turn_id"]))
                events = await assert_consistent(engine.store, sid)
        finally:
            await engine.stop()
    assert end["payload"]["type"] == "turn.completed"
    tool_message = payloads(events, "message.new")[2]["message"]
    assert tool_message["content"] == '{"disk":"91%"}'
    assert worker.triggers == [
        "session.start",
        "client.messages",
        "llm.finished",
        "tool.execute",
        "tool.finished",
        "llm.finished",
        "turn.finished",
    ]
    assert worker.problems == []


def test_the_sdk_loads_nothing_of_the_engine_or_the_bot() -> None:
    code = (
        "import sys, subs.worker\n"
        "ours = {'engine', 'bot', 'redis', 'slack_sdk', 'mcp', 'jsonschema'}\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & ours))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out


# The original engine's `POST /api/machine/workers/submit` example (AlexWiles/substructure,
# docs/250-api.md, "Machine API"): the body a worker sends, byte for byte as JSON.
ORIGINAL_SUBMIT = {
    "session_id": "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
    "decision_id": "dec_abc",
    "actions": [
        {
            "type": "tool.result",
            "id": "call_abc",
            "result": {"content": [{"type": "text", "text": "sunny"}]},
        }
    ],
}


async def test_submit_decision_sends_the_original_engines_body() -> None:
    """The body the client sends, byte for byte the original's (its docs/250-api.md),
    recorded on a loopback server that answers as that page says (`200 {"ok": true}`,
    and its second error shape for a refusal); our own route runs in
    `test_an_sdk_worker_decides_later_through_workers_submit`."""
    from aiohttp import web

    received: list[tuple[str, str, Any]] = []
    answers = [(200, {"ok": True}), (409, {"ok": False, "error": "decision is stale"})]

    async def submit(request: web.Request) -> web.Response:
        received.append((request.path, request.headers["Authorization"], await request.json()))
        status, body = answers[len(received) - 1]
        return web.json_response(body, status=status)

    app = web.Application()
    app.router.add_post("/api/machine/workers/submit", submit)
    action = sdk.ToolResultAction(
        id="call_abc", result={"content": [{"type": "text", "text": "sunny"}]}
    )
    async with serve(app) as url, SubsClient(url + "/", "the-key") as subs:
        sid, did = ORIGINAL_SUBMIT["session_id"], ORIGINAL_SUBMIT["decision_id"]
        assert await subs.submit_decision(sid, did, [action]) == {"ok": True}
        with pytest.raises(sdk.SubsApiError, match="409: decision is stale"):
            await subs.submit_decision(sid, did, DecisionResponse(actions=[action]))
    assert received[0] == ("/api/machine/workers/submit", "Bearer the-key", ORIGINAL_SUBMIT)
    assert received[1][2] == ORIGINAL_SUBMIT
    assert schema_errors(RESPONSE_SCHEMA, {"actions": ORIGINAL_SUBMIT["actions"]}) == []


def test_settle_takes_a_result_or_an_error() -> None:
    subs = SubsClient("http://127.0.0.1:1", "k")
    for kw in ({}, {"result": 1, "error": "e"}):
        with pytest.raises(ValueError, match="a result or an error"):
            asyncio.run(subs.settle("s", "c", **kw))


async def test_an_sdk_worker_runs_the_model_as_a_stream_in_a_real_turn(redis, tmp_path) -> None:
    """`[llm.w] type = "worker"`: the engine sends `llm.execute`; the SDK worker answers
    with `stream_text` (deltas, then `decision.result`); the turn records the reply."""
    worker = CheckedWorker(SECRET)
    executes: list[sdk.LlmExecuteTrigger] = []

    @worker.on("llm.execute")
    async def run_model(request: DecisionRequest) -> Stream:
        assert isinstance(request.trigger, sdk.LlmExecuteTrigger)
        executes.append(request.trigger)

        async def chunks() -> AsyncIterator[str]:
            for chunk in ("Disk ", "is ", "full."):
                yield chunk

        return stream_text(chunks(), model="my-model")

    async with serve(aiohttp_app(worker)) as worker_url:
        text = textwrap.dedent(
            f"""\
            [llm.w]
            type = "worker"

            [agent.helper]
            llm = "w"
            model = "my-model"
            system = "You help."
            worker = "{worker_url}/"
            signing_secret_env = "HELPER_SECRET"
            """
        )
        project = parse_project(text, str(tmp_path / "subs.toml"), env={})
        engine = Engine(project, redis, env={**ENV, "HELPER_SECRET": SECRET}, lease_ms=3000)
        await engine.start()
        client = Client(engine.store)
        try:
            message = {"role": "user", "content": "how full is the disk?"}
            reply = await client.submit(
                {"type": "client.message", "agent_id": "helper", "message": message}
            )
            sid = reply["session_id"]
            end = await wait_for_event(client, sid, turn_ended(reply["turn_id"]))
            events = await assert_consistent(engine.store, sid)
        finally:
            await engine.stop()
    assert end["payload"]["type"] == "turn.completed", end
    assert len(executes) == 1
    [_, answer] = [p["message"] for p in payloads(events, "message.new")]
    assert answer["role"] == "assistant" and answer["content"] == "Disk is full."
    assert "llm.execute" in worker.triggers and worker.problems == []


async def test_an_sdk_worker_decides_later_through_workers_submit(redis, vendor, tmp_path) -> None:
    """A handler answers LATER to `client.messages`: the SDK sends an empty body, the
    decision waits, and `SubsClient.submit_decision` (the original's body) completes the
    turn through our real `POST /api/machine/workers/submit`; a repeat is refused (409)."""
    worker = Worker(SECRET)
    held: asyncio.Queue[DecisionRequest] = asyncio.Queue()

    @worker.on("client.messages")
    async def later(request: DecisionRequest) -> Any:
        await held.put(request)
        return LATER

    vendor.default = Text("Disk is at 91%.")
    async with serve(aiohttp_app(worker)) as worker_url:
        text = textwrap.dedent(
            f"""\
            [llm.openai]
            type = "openai"
            base_url = "{vendor.url}/v1"

            [agent.helper]
            llm = "openai"
            model = "gpt-4.1-mini"
            worker = "{worker_url.rstrip("/")}/"
            signing_secret_env = "HELPER_SECRET"
            """
        )
        project = parse_project(text, str(tmp_path / "subs.toml"), env={})
        engine = Engine(project, redis, env={**ENV, "HELPER_SECRET": SECRET}, lease_ms=3000)
        await engine.start()
        client = Client(engine.store)
        try:
            async with serve(
                make_app(client, engine.store, keys=ApiKeys.from_env(KEYS_ENV))
            ) as api:
                message = {"role": "user", "content": "how full is the disk?"}
                reply = await client.submit(
                    {"type": "client.message", "agent_id": "helper", "message": message}
                )
                async with asyncio.timeout(20):
                    request = await held.get()
                await wait_for_event(
                    client, request.session_id, lambda e: e["payload"]["type"] == "decision.waiting"
                )
                async with SubsClient(api, ROOT) as subs:
                    answer = await subs.submit_decision(
                        request.session_id, request.decision_id, request.proposed
                    )
                    assert answer == {"ok": True}
                    with pytest.raises(sdk.SubsApiError) as again:
                        await subs.submit_decision(
                            request.session_id, request.decision_id, request.proposed
                        )
                    assert again.value.status == 409
                end = await wait_for_event(client, request.session_id, turn_ended(reply["turn_id"]))
        finally:
            await engine.stop()
    assert end["payload"]["type"] == "turn.completed"
