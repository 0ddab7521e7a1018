"""Seed 002 end to end: a worker runs the agent's model calls itself (`handler: "worker"`).

The Anthropic-format worker is the seed's Hono server in Python: it sends the engine's
`llm.execute` body to the (fake) vendor, streams the vendor's events back as
`llm.token.delta` frames and ends with the final Message in `llm.result`. The same
conversation run by the engine against the same vendor must record the same thing.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import textwrap
import tomllib
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from httpx_sse import aconnect_sse
from jsonschema import Draft202012Validator

from engine.client import Client
from engine.config import Project, parse_project
from engine.runtime.engine import Engine
from engine.store.store import Store
from tests.engine_helpers import ENV, assert_consistent, payloads, turn_ended, wait_for_event
from tests.fakes.llm_vendor import FakeVendor, Reply, Text, ToolCalls
from tests.workers import RESPONSE_SCHEMA, SCHEMA_PATH, Json, Stream, schema_errors

SECRET = "byo-secret-for-tests"
MODEL = "claude-haiku-4-5-20251001"
SYSTEM = "You are the on-call assistant."
REPLY = "The pager is quiet."
QUESTION = "is anything paging?"
CONFIRM_TOML = (
    '{ name = "confirm", description = "Ask the person", handler = "client", input = { '
    'type = "object", properties = { question = { type = "string" } }, required = ["question"] } }'
)
CONFIRM = tomllib.loads(f"tool = {CONFIRM_TOML}")["tool"]
# Seed 002's agent fields that the schema's AgentConfig does not list (engine/protocol.py
# keeps them as extensions).
SEED_EXTENSIONS = ("handler", "format", "stream")

_DEFS = json.loads(SCHEMA_PATH.read_text())["$defs"]


def defined_as(name: str, value: Any) -> list[str]:
    """What is wrong with `value` as the schema's `$defs/<name>`."""
    validator = Draft202012Validator({"$defs": _DEFS, "$ref": f"#/$defs/{name}"})
    return [f"{e.json_path}: {e.message}" for e in validator.iter_errors(value)]


def project(tmp_path: Path, vendor: FakeVendor, worker_url: str) -> Project:
    """`byo` takes its whole config from its worker; `direct` is run by the engine."""
    text = textwrap.dedent(
        f"""\
        [llm.anthropic]
        type = "anthropic"
        base_url = "{vendor.anthropic_base()}"

        [agent.byo]
        worker = "{worker_url}"
        signing_secret_env = "BYO_SECRET"

        [agent.direct]
        llm = "anthropic"
        model = "{MODEL}"
        system = "{SYSTEM}"
        tools = [{CONFIRM_TOML}]
        """
    )
    path = tmp_path / "subs.toml"
    path.write_text(text)
    return parse_project(text, str(path), env={})


@pytest.fixture
async def engine_for(redis):
    started: list[Engine] = []

    async def start(project: Project) -> Engine:
        engine = Engine(project, redis, env={**ENV, "BYO_SECRET": SECRET}, lease_ms=3000)
        await engine.start()
        started.append(engine)
        return engine

    yield start
    for engine in started:
        await engine.stop()


# --- the seed's worker ---------------------------------------------------------------


class FinalMessage:
    """Builds the Message a Messages stream describes: what the SDK's `finalMessage()` gives."""

    def __init__(self) -> None:
        self.message: dict[str, Any] = {}
        self._json: dict[int, list[str]] = {}

    def feed(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "message_start":
            self.message = copy.deepcopy(event["message"])
        elif kind == "content_block_start":
            assert event["index"] == len(self.message["content"])
            self.message["content"].append(copy.deepcopy(event["content_block"]))
        elif kind == "content_block_delta":
            block, delta = self.message["content"][event["index"]], event["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "input_json_delta":
                self._json.setdefault(event["index"], []).append(delta["partial_json"])
        elif kind == "content_block_stop":
            block = self.message["content"][event["index"]]
            if block["type"] == "tool_use":
                block["input"] = json.loads("".join(self._json.get(event["index"], [])) or "{}")
        elif kind == "message_delta":
            self.message.update(event["delta"])
            usage = {k: v for k, v in event["usage"].items() if v is not None}
            self.message["usage"] = {**self.message["usage"], **usage}


def seed_worker(vendor: FakeVendor, agent: dict[str, Any]):
    """The seed's `server.mjs`: config at session.start, model calls on llm.execute."""

    async def decide(request: dict[str, Any]) -> Any:
        trigger = request["trigger"]
        if trigger["type"] == "session.start":
            # Schema-checked in the test without the seed's extensions; see SEED_EXTENSIONS.
            return Json({"agent": agent}, invalid=True)
        if trigger["type"] == "llm.execute":
            return await stream_from_vendor(vendor, trigger["request"])
        return request["proposed"]

    return decide


async def stream_from_vendor(vendor: FakeVendor, request: dict[str, Any]) -> Stream:
    """`anthropic.messages.stream(request)`, each event re-sent as `llm.token.delta`."""
    body = {**request, "stream": True}  # the SDK's stream() adds it; the engine leaves it out
    headers = {"x-api-key": "worker-key", "anthropic-version": "2023-06-01"}
    frames: list[tuple[str, Any]] = []
    final = FinalMessage()
    url = vendor.anthropic_base() + "/v1/messages"
    async with (
        httpx.AsyncClient() as http,
        aconnect_sse(http, "POST", url, json=body, headers=headers) as source,
    ):
        source.response.raise_for_status()
        async for sse in source.aiter_sse():
            event = json.loads(sse.data)
            assert event["type"] == sse.event
            final.feed(event)
            frames.append(("llm.token.delta", event))  # pings too: the engine ignores them
    result = {"actions": [{"type": "llm.result", "response": final.message}]}
    return Stream([*frames, ("decision.result", result)])


# --- one conversation ----------------------------------------------------------------


def say(agent: str, text: str) -> dict[str, Any]:
    return {
        "type": "client.message",
        "agent_id": agent,
        "message": {"role": "user", "content": text},
    }


def asks_or_ends(turn_id: str, after_seq: int):
    """A client tool call dispatched, or the turn's end, after `after_seq`."""
    ended = turn_ended(turn_id)
    return lambda e: (
        e["seq"] > after_seq and (e["payload"]["type"] == "tool.call.dispatched" or ended(e))
    )


async def converse(engine: Engine, agent: str, sid: str) -> tuple[dict[str, Any], list[dict]]:
    """One turn; a `confirm` call is answered by the client. Returns turn end and log."""
    client = Client(engine.store)
    reply = await client.submit(say(agent, QUESTION), session_id=sid)
    seen = 0
    while True:
        event = await wait_for_event(client, sid, asks_or_ends(reply["turn_id"], seen))
        if event["payload"]["type"] != "tool.call.dispatched":
            return event, await assert_consistent(engine.store, sid)
        seen = event["seq"]
        answer = {"type": "tool.result", "id": event["payload"]["id"], "result": "yes"}
        await client.submit(answer, session_id=sid)


def transcript(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The recorded messages without the ids each run mints; tool arguments parsed."""
    out = []
    for p in payloads(events, "message.new"):
        message = p["message"]
        calls = [
            (c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in message.get("tool_calls") or ()
        ]
        out.append({"role": message["role"], "content": message.get("content"), "calls": calls})
    return out


async def deltas_of(store: Store, sid: str) -> list[dict[str, Any]]:
    entries = await store.redis.xrange(store.delta_key(sid))
    return [json.loads(fields[b"d"]) for _, fields in entries]


SCRIPTS: dict[str, list[Reply]] = {
    "text": [Text(REPLY, chunks=4)],
    "client_tool": [
        ToolCalls([("confirm", {"question": "Page the on-call?"})], text="Let me ask."),
        Text(REPLY, chunks=4),
    ],
}


@pytest.mark.parametrize("script", sorted(SCRIPTS))
async def test_the_seed_worker_records_what_the_engine_would(
    vendor, test_worker, engine_for, tmp_path, script
):
    agent = {
        "model": MODEL,
        "stream": True,
        "handler": "worker",  # run LLM calls here, not on the engine
        "format": "anthropic",  # trigger.request is a Messages API body
        "system": SYSTEM,
        "tools": [CONFIRM],
    }
    plain = {k: v for k, v in agent.items() if k not in SEED_EXTENSIONS}
    assert schema_errors(RESPONSE_SCHEMA, {"agent": plain}) == []
    worker = await test_worker(seed_worker(vendor, agent), secret=SECRET)
    engine = await engine_for(project(tmp_path, vendor, worker.url))

    vendor.push(*SCRIPTS[script])
    by_worker, worker_events = await converse(engine, "byo", "by-worker")
    by_worker_requests = len(vendor.requests)
    vendor.push(*SCRIPTS[script])
    by_engine, engine_events = await converse(engine, "direct", "by-engine")

    # Each llm.execute carried a Messages body, ready to send but for `stream`.
    executes = [r["trigger"] for r in worker.requests if r["trigger"]["type"] == "llm.execute"]
    assert len(executes) == by_worker_requests == len(SCRIPTS[script])
    for trigger in executes:
        assert trigger["format"] == "anthropic" and trigger["stream"] is True
        request = trigger["request"]
        assert request["model"] == MODEL and request["system"] == SYSTEM
        assert isinstance(request["max_tokens"], int) and "stream" not in request
        assert request["messages"][0] == {"role": "user", "content": QUESTION}
    # ... the very body the engine sends the vendor itself (tool ids are the vendor's own).
    sent = [re.sub(r"toolu_\w+", "toolu_…", json.dumps(r.body)) for r in vendor.requests]
    assert sent[:by_worker_requests] == sent[by_worker_requests:]

    assert by_worker["payload"]["type"] == by_engine["payload"]["type"] == "turn.completed"
    assert transcript(worker_events) == transcript(engine_events)
    assert transcript(worker_events)[-1] == {"role": "assistant", "content": REPLY, "calls": []}
    assert by_worker["payload"]["usage"] == by_engine["payload"]["usage"]
    assert by_worker["payload"]["usage"]["output"] > 0
    assert by_worker["payload"]["cost"] == by_engine["payload"]["cost"]

    # The vendor's events reached the session's delta stream as neutral deltas.
    deltas = await deltas_of(engine.store, "by-worker")
    for completed in payloads(worker_events, "llm.call.completed"):
        call_id = completed["id"]
        texts = [d["text"] for d in deltas if d["call_id"] == call_id and d.get("text")]
        (message,) = [
            p["message"]
            for p in payloads(worker_events, "message.new")
            if p["message"].get("id") == call_id
        ]
        assert "".join(texts) == (message["content"] or "")
        for call in message.get("tool_calls") or ():
            pieces = [
                chunk.get("arguments") or ""
                for d in deltas
                if d["call_id"] == call_id
                for chunk in d.get("tool_calls") or ()
                if chunk["id"] == call["id"]
            ]
            assert json.loads("".join(pieces)) == json.loads(call["function"]["arguments"])
    final_call = payloads(worker_events, "llm.call.completed")[-1]["id"]
    final_texts = [d for d in deltas if d["call_id"] == final_call and d.get("text")]
    assert len(final_texts) > 1


NEUTRAL_USAGE = {
    "input": 14,
    "output": 5,
    "uncached_input": 14,
    "cache_read": 0,
    "cache_write": 0,
    "total": 19,
}


async def test_a_neutral_worker_answer_is_checked_then_recorded(
    vendor, test_worker, engine_for, tmp_path
):
    good = {"model": MODEL, "content": REPLY, "finish_reason": "stop", "usage": NEUTRAL_USAGE}
    bad = {"content": REPLY, "finish_reason": "stop"}  # no model
    assert defined_as("LlmResponse", good) == []
    assert defined_as("LlmResponse", bad) != []
    agent = {
        "model": MODEL,
        "system": SYSTEM,
        "handler": "worker",
        "retry": {"default": {"backoff_base_secs": 0}},
    }

    async def decide(request: dict[str, Any]) -> Any:
        trigger = request["trigger"]
        if trigger["type"] == "session.start":
            return Json({"agent": agent}, invalid=True)  # the seed's `handler`: see above
        if trigger["type"] == "llm.execute":
            response = bad if trigger["attempt"] == 1 else good
            return {"actions": [{"type": "llm.result", "response": response}]}
        return request["proposed"]

    worker = await test_worker(decide, secret=SECRET)
    engine = await engine_for(project(tmp_path, vendor, worker.url))
    end, events = await converse(engine, "byo", "neutral")

    executes = [r["trigger"] for r in worker.requests if r["trigger"]["type"] == "llm.execute"]
    assert [t["attempt"] for t in executes] == [1, 2]
    assert executes[0]["id"] == executes[1]["id"]
    for trigger in executes:
        assert trigger.get("format") is None and trigger["stream"] is False
        assert defined_as("LlmRequest", trigger["request"]) == []
        assert trigger["request"]["model"] == MODEL
        messages = [(m["role"], m["content"]) for m in trigger["request"]["messages"]]
        assert messages == [("system", SYSTEM), ("user", QUESTION)]

    (errored,) = payloads(events, "llm.call.errored")
    assert errored["attempt"] == 1 and not errored["final"]
    assert errored["error"]["code"] == "invalid_response"
    assert "response.model" in errored["error"]["message"]
    assert [p["attempt"] for p in payloads(events, "llm.call.completed")] == [2]
    assert end["payload"]["type"] == "turn.completed"
    assert transcript(events) == [
        {"role": "user", "content": QUESTION, "calls": []},
        {"role": "assistant", "content": REPLY, "calls": []},
    ]
    assert end["payload"]["usage"] == NEUTRAL_USAGE
    assert vendor.requests == []  # the worker ran the call; the engine called no vendor


async def test_a_stored_image_reaches_a_worker_run_call_in_its_format(
    vendor, test_worker, engine_for, tmp_path
):
    """A file the session stores once (a Slack screenshot, say) is a `link` in the log; a
    worker that runs the model call in the Anthropic format gets it as the image block the
    engine would send the vendor itself."""
    agent = {"model": MODEL, "handler": "worker", "format": "anthropic", "system": SYSTEM}
    worker = await test_worker(seed_worker(vendor, agent), secret=SECRET)
    engine = await engine_for(project(tmp_path, vendor, worker.url))
    png = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64
    digest = await engine.store.put_file("shot", png)
    message = {
        "role": "user",
        "content": [
            {"type": "text", "text": "what does this graph say?"},
            {
                "type": "link",
                "uri": f"subs-file:sha256:{digest}",
                "mimeType": "image/png",
                "name": "graph.png",
            },
        ],
    }
    vendor.push(Text("It says the disk is full."))
    client = Client(engine.store)
    reply = await client.submit(
        {"type": "client.message", "agent_id": "byo", "message": message}, session_id="shot"
    )
    end = await wait_for_event(client, "shot", turn_ended(reply["turn_id"]))
    assert end["payload"]["type"] == "turn.completed", end["payload"]
    (execute,) = [r["trigger"] for r in worker.requests if r["trigger"]["type"] == "llm.execute"]
    blocks = execute["request"]["messages"][0]["content"]
    images = [b for b in blocks if b.get("type") == "image"]
    assert images and images[0]["source"]["media_type"] == "image/png"
    assert base64.b64decode(images[0]["source"]["data"]) == png
    assert "subs-file" not in json.dumps(execute["request"])


# About 1,600 of the fake's tokens: past Sonnet 4.5's 1,024-token minimum cacheable prefix.
LONG_SYSTEM = "You are the on-call assistant. " + " ".join(
    f"Rule {n}: answer briefly, cite the runbook, never guess about production." for n in range(80)
)
CACHED_MODEL = "claude-sonnet-4-5"


def marks(value: Any, path: str = "") -> list[str]:
    """Where a body carries cache_control, as paths."""
    if isinstance(value, dict):
        here = [path] if "cache_control" in value else []
        return here + [m for k, v in value.items() for m in marks(v, f"{path}.{k}")]
    if isinstance(value, list):
        return [m for i, v in enumerate(value) for m in marks(v, f"{path}[{i}]")]
    return []


def caching_project(tmp_path: Path, vendor: FakeVendor, worker_url: str, cache: bool) -> Project:
    """`byo`'s worker runs its calls in the Anthropic format; `direct` is the same agent run
    by the engine. `cache` is the `[llm.anthropic]` block's, which both name."""
    text = textwrap.dedent(
        f"""\
        [llm.anthropic]
        type = "anthropic"
        base_url = "{vendor.anthropic_base()}"
        cache = {str(cache).lower()}

        [agent.byo]
        worker = "{worker_url}"
        signing_secret_env = "BYO_SECRET"

        [agent.direct]
        llm = "anthropic"
        model = "{CACHED_MODEL}"
        system = "{LONG_SYSTEM}"
        """
    )
    path = tmp_path / "subs.toml"
    path.write_text(text)
    return parse_project(text, str(path), env={})


async def two_turns(engine: Engine, agent: str, sid: str) -> list[dict[str, Any]]:
    """Two turns of one session; their turn.completed payloads."""
    client = Client(engine.store)
    ends = []
    for text in ("the db is paging, what now?", "it is back; anything else?"):
        reply = await client.submit(say(agent, text), session_id=sid)
        end = await wait_for_event(client, sid, turn_ended(reply["turn_id"]))
        assert end["payload"]["type"] == "turn.completed", end["payload"]
        ends.append(end["payload"])
    return ends


@pytest.mark.parametrize("cache", [True, False])
async def test_a_worker_run_call_in_the_anthropic_format_gets_the_engines_cache_breakpoints(
    vendor, test_worker, engine_for, tmp_path, cache
):
    """The body a worker is handed to send carries the breakpoints the engine would send
    itself (system, the previous turn's end, the newest message), so the vendor's cache
    serves the worker's second turn from what its first wrote; `cache = false` on the
    agent's block sends none."""
    agent = {
        "model": CACHED_MODEL,
        "llm": "anthropic",
        "handler": "worker",
        "format": "anthropic",
        "system": LONG_SYSTEM,
    }
    worker = await test_worker(seed_worker(vendor, agent), secret=SECRET)
    engine = await engine_for(caching_project(tmp_path, vendor, worker.url, cache))
    vendor.push(Text("Check the runbook for disk alerts first."), Text("Watch it for an hour."))
    first, second = await two_turns(engine, "byo", "byo-cache")
    by_worker = [r.body for r in vendor.requests]
    vendor.push(Text("Check the runbook for disk alerts first."), Text("Watch it for an hour."))
    await two_turns(engine, "direct", "direct-cache")
    by_engine = [r.body for r in vendor.requests[len(by_worker) :]]

    # The very bodies the engine sends when it runs the calls itself, breakpoints and all.
    assert [{**b, "stream": True} for b in by_worker] == [{**b, "stream": True} for b in by_engine]
    if not cache:
        assert [marks(b) for b in by_worker] == [[], []]
        assert second["usage"]["cache_read"] == second["usage"]["cache_write"] == 0
        return
    assert [marks(b) for b in by_worker] == [
        [".system[0]", ".messages[0].content[0]"],
        [".system[0]", ".messages[1].content[0]", ".messages[2].content[0]"],
    ]
    # The worker's second turn reads what its first wrote, at the cache-read price.
    assert first["usage"]["cache_read"] == 0 and first["usage"]["cache_write"] > 0
    assert second["usage"]["cache_read"] == first["usage"]["cache_write"]
    assert Decimal(second["cost"]) < Decimal(first["cost"]) / 2
