"""Tracing: one trace per turn, read from the log, exported over OTLP/HTTP.

A real engine on a real Redis exports to a receiver on a real port that decodes with
the official opentelemetry-proto messages; a real HTTP worker records the traceparent
headers it was sent.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from engine.client import Client
from engine.config import parse_project
from engine.machine.state import Call, Decision, SessionState, Turn
from engine.runtime.engine import Engine
from engine.store.store import Store
from engine.telemetry.ids import (
    SpanContext,
    parse_traceparent,
    parse_tracestate,
    span_id,
    trace_id_for_turn,
)
from engine.telemetry.spans import Before, Projector, turn_context
from engine.telemetry.tracing import tracing_from
from tests.engine_helpers import (
    ENV,
    EngineProcess,
    payloads,
    poll_until,
    project_toml,
    turn_ended,
    wait_for_event,
)
from tests.fakes.llm_vendor import Text, ToolCalls
from tests.otlp_receiver import otlp_receiver
from tests.test_engine_worker import SECRET, run_turn, start_engine, worker_project
from tests.workers import echo_proposed

ROOT = Path(__file__).resolve().parents[1]

# -- ids (W3C Trace Context, level 1, §3.2) ----------------------------------------------

T = "4bf92f3577b34da6a3ce929d0e0e4736"
P = "00f067aa0ba902b7"


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (f"00-{T}-{P}-01", SpanContext(T, P, True)),
        (f"00-{T}-{P}-00", SpanContext(T, P, False)),
        (f"00-{T.upper()}-{P}-01", SpanContext(T, P, True)),  # read leniently, as lowercase
        (f"  00-{T}-{P}-01 ", SpanContext(T, P, True)),
        (f"01-{T}-{P}-01-future", SpanContext(T, P, True)),  # a later version's first fields
        (f"00-{T}-{P}-01-extra", None),  # version 00 has exactly four fields
        (f"ff-{T}-{P}-01", None),  # ff is forbidden
        (f"00-{'0' * 32}-{P}-01", None),  # all-zero trace id
        (f"00-{T}-{'0' * 16}-01", None),  # all-zero parent id
        (f"00-{T[:-1]}-{P}-01", None),
        ("", None),
        (None, None),
        ("garbage", None),
    ],
)
def test_traceparent_headers_are_read_as_the_spec_says(header, expected):
    assert parse_traceparent(header) == expected


def test_ids_are_the_same_in_every_process_and_differ_per_turn():
    a = trace_id_for_turn("ses_1", "turn_1")
    assert a == trace_id_for_turn("ses_1", "turn_1") and len(a) == 32
    assert a != trace_id_for_turn("ses_1", "turn_2")
    assert a != trace_id_for_turn("ses_2", "turn_1")
    assert span_id(a, "call", "c1", "1") != span_id(a, "call", "c1", "2")
    assert len(span_id(a, "turn", "turn_1")) == 16
    # Run in another interpreter: nothing random or per-process goes into an id.
    code = "from engine.telemetry.ids import trace_id_for_turn as t; print(t('ses_1', 'turn_1'))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert other.stdout.strip() == a


# -- the projection (pure) -----------------------------------------------------------


def envelope(seq: int, at: str, payload: dict) -> dict:
    return {"session_id": "ses_1", "seq": seq, "occurred_at": at, "payload": payload}


def state_mid_turn() -> SessionState:
    s = SessionState("ses_1", "oncall", "worker", 0)
    s.agent = {"model": "gpt-4.1-mini", "llm": "openai"}
    s.llm_routes = {"openai": {"type": "openai", "format": None}}
    s.turn = Turn("turn_1", 1_700_000_000_000)
    s.calls["call_1"] = Call(
        "call_1", "llm", "turn_1", "server", 2, "running", 1_700_000_000_100, {}
    )
    s.calls["tool_1"] = Call(
        "tool_1",
        "tool",
        "turn_1",
        "server",
        1,
        "running",
        1_700_000_000_300,
        {},
        name="db__query",
        params={"connector": "mcp.db", "tool": "query"},
    )
    s.decision = Decision(
        "dec_1", {"type": "llm.finished"}, {}, 1, "running", 1_700_000_000_200, {}
    )
    return s


def test_a_step_ending_spans_names_them_under_the_turn_even_in_a_fresh_process():
    """A projector that saw none of the opening facts (the engine that began the turn died)
    still ends every span under the same ids, starting where the state says it began."""
    before = Before.of(state_mid_turn(), "ses_1")
    usage = {"input": 120, "output": 30, "cache_read": 100, "cache_write": 0, "total": 150}
    spans = Projector().project(
        before,
        [
            envelope(
                9,
                "2023-11-14T22:13:21.000Z",
                {
                    "type": "llm.call.completed",
                    "id": "call_1",
                    "attempt": 2,
                    "usage": usage,
                    "cost": "0.0021",
                    "finish_reason": "stop",
                    "model": "gpt-4.1-mini-2025",
                },
            ),
            envelope(
                10,
                "2023-11-14T22:13:21.500Z",
                {
                    "type": "tool.call.errored",
                    "id": "tool_1",
                    "attempt": 1,
                    "error": {"code": "handler_error", "message": "no such table"},
                    "retryable": False,
                    "final": True,
                },
            ),
            envelope(
                11,
                "2023-11-14T22:13:22.000Z",
                {
                    "type": "decision.completed",
                    "decision_id": "dec_1",
                    "attempt": 1,
                },
            ),
            envelope(
                12,
                "2023-11-14T22:13:23.000Z",
                {
                    "type": "turn.completed",
                    "turn_id": "turn_1",
                    "cost": "0.0021",
                    "usage": usage,
                },
            ),
        ],
    )
    chat, tool, decision, turn = spans
    root = turn_context("ses_1", "turn_1")
    assert turn.context == root and turn.parent_id is None
    assert turn.name == "invoke_agent oncall" and turn.start_ms == 1_700_000_000_000
    assert turn.attributes["gen_ai.conversation.id"] == "ses_1"
    assert turn.attributes["gen_ai.usage.input_tokens"] == 120
    for span in (chat, tool, decision):
        assert span.context.trace_id == root.trace_id and span.parent_id == root.span_id
    assert chat.name == "chat gpt-4.1-mini" and chat.start_ms == 1_700_000_000_100
    assert chat.attributes["gen_ai.provider.name"] == "openai"
    assert chat.attributes["gen_ai.response.model"] == "gpt-4.1-mini-2025"
    assert chat.attributes["gen_ai.response.finish_reasons"] == ["stop"]
    assert chat.attributes["gen_ai.usage.cache_read.input_tokens"] == 100
    assert chat.attributes["subs.cost_usd"] == pytest.approx(0.0021)
    assert chat.context.span_id == span_id(root.trace_id, "call", "call_1", "2")
    assert tool.name == "execute_tool db__query" and tool.error == "handler_error"
    assert tool.attributes["subs.mcp.server"] == "mcp.db"
    assert decision.name == "decision llm.finished" and decision.start_ms == 1_700_000_000_200
    assert len({s.context.span_id for s in spans}) == 4


def test_a_span_opened_in_this_process_starts_at_its_opening_fact():
    state = state_mid_turn()
    projector = Projector()
    opened = envelope(
        8,
        "2023-11-14T22:13:20.750Z",
        {
            "type": "llm.call.dispatched",
            "id": "call_1",
            "attempt": 2,
            "deadline_ms": None,
        },
    )
    assert projector.project(Before.of(state, "ses_1"), [opened]) == []
    closed = envelope(
        9,
        "2023-11-14T22:13:21.000Z",
        {
            "type": "llm.call.errored",
            "id": "call_1",
            "attempt": 2,
            "error": {"code": "rate_limited", "message": "429"},
            "retryable": True,
            "final": False,
        },
    )
    (span,) = projector.project(Before.of(state, "ses_1"), [closed])
    assert span.start_ms == 1_700_000_000_750 and span.end_ms == 1_700_000_001_000
    assert span.error == "rate_limited" and span.attributes["subs.retryable"] is True


# -- configuration -----------------------------------------------------------------------


def project_with(tmp_path: Path, vendor_url: str, telemetry: str = ""):
    text = project_toml(vendor_url, retry="retry = { llm = { backoff_base_secs = 0 } }")
    text += textwrap.dedent(telemetry)
    path = tmp_path / "subs.toml"
    path.write_text(text)
    return parse_project(text, str(path), env={})


@pytest.mark.parametrize(
    ("block", "env", "on"),
    [
        ("", {}, False),
        ('[telemetry]\nendpoint = "http://127.0.0.1:4318"\n', {}, True),
        ("", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
        ("", {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, True),
        ("", {"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, False),
        ('[telemetry]\nendpoint = "http://127.0.0.1:4318"\n', {"OTEL_SDK_DISABLED": "true"}, False),
        (
            '[telemetry]\nendpoint = "http://127.0.0.1:4318"\n',
            {"OTEL_TRACES_EXPORTER": "none"},
            False,
        ),
    ],
)
async def test_tracing_is_on_only_when_an_endpoint_is_named(tmp_path, block, env, on):
    tracing = tracing_from(project_with(tmp_path, "http://127.0.0.1:9", block), env)
    assert (tracing is not None) is on
    if tracing is not None:
        await tracing.aclose()


def test_an_engine_without_telemetry_loads_no_tracing_sdk():
    """redis-py imports OpenTelemetry's metrics SDK when it is installed; the tracing SDK,
    the exporter and our export module load only when tracing is on."""
    code = (
        "import sys, engine.runtime.engine, engine.cli;"
        "print(sorted(m for m in sys.modules if m.startswith("
        "('opentelemetry.sdk.trace', 'opentelemetry.exporter', 'engine.telemetry.export'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


async def test_an_engine_without_telemetry_starts_no_exporter_thread(redis, vendor, tmp_path):
    engine = Engine(project_with(tmp_path, vendor.url), redis, env=ENV, lease_ms=3000)
    await engine.start()
    try:
        assert engine.tracing is None and engine.applier.tracing is None
        assert not [t for t in threading.enumerate() if "SpanProcessor" in t.name]
    finally:
        await engine.stop()


def test_a_telemetry_endpoint_that_is_not_a_url_is_refused_naming_the_key(tmp_path):
    from engine.config import ConfigError

    with pytest.raises(ConfigError) as refused:
        project_with(tmp_path, "http://127.0.0.1:9", '[telemetry]\nendpoint = "collector"\n')
    assert "telemetry.endpoint" in str(refused.value)


# -- through the engine ------------------------------------------------------------------


async def test_an_engine_turn_with_a_tool_call_is_one_trace(redis, vendor, tmp_path):
    async with otlp_receiver() as receiver:
        project = project_with(tmp_path, vendor.url, f'[telemetry]\nendpoint = "{receiver.url}"\n')
        engine = Engine(project, redis, env=ENV, lease_ms=3000)
        await engine.start()
        try:
            assert engine.tracing is not None
            vendor.push(ToolCalls([("confirm", {"question": "restart?"})]), Text("Restarted."))
            client = Client(engine.store)
            message = {"role": "user", "content": "restart the api"}
            reply = await client.submit(
                {"type": "client.message", "agent_id": "ops_openai", "message": message}
            )
            sid, tid = reply["session_id"], reply["turn_id"]
            requested = await wait_for_event(
                client, sid, lambda e: e["payload"]["type"] == "tool.call.requested"
            )
            call_id = requested["payload"]["id"]
            await client.submit(
                {"type": "tool.result", "id": call_id, "result": "yes"}, session_id=sid
            )
            end = await wait_for_event(client, sid, turn_ended(tid))
            assert end["payload"]["type"] == "turn.completed"
            metrics = engine.metrics.render()
        finally:
            await engine.stop()  # flushes the exporter's queue
    labels = (
        'gen_ai_operation_name="chat",gen_ai_provider_name="openai",'
        'gen_ai_request_model="gpt-4.1-mini"'
    )
    assert f"gen_ai_client_operation_duration_seconds_count{{{labels}}} 2\n" in metrics
    for kind in ("input", "output"):
        assert f'gen_ai_client_token_usage_count{{{labels},gen_ai_token_type="{kind}"}} 2\n' in (
            metrics
        )
    spans = receiver.spans
    (turn,) = receiver.named("invoke_agent")
    assert turn["name"] == "invoke_agent ops_openai" and turn["parent_id"] is None
    assert turn["trace_id"] == trace_id_for_turn(sid, tid)
    assert {s["trace_id"] for s in spans} == {turn["trace_id"]}
    chats = receiver.named("chat ")
    (tool,) = receiver.named("execute_tool")
    assert [c["name"] for c in chats] == ["chat gpt-4.1-mini"] * 2
    assert all(s["parent_id"] == turn["span_id"] for s in [*chats, tool])
    assert tool["attributes"]["gen_ai.tool.name"] == "confirm"
    assert tool["attributes"]["gen_ai.tool.call.id"] == call_id
    assert all(c["attributes"]["gen_ai.provider.name"] == "openai" for c in chats)
    assert all(c["attributes"]["gen_ai.usage.output_tokens"] > 0 for c in chats)
    assert chats[0]["attributes"]["gen_ai.response.finish_reasons"] == ["tool_calls"]
    # In time order, each inside the turn.
    assert turn["start_ns"] <= chats[0]["start_ns"] <= chats[0]["end_ns"] <= tool["start_ns"]
    assert tool["end_ns"] <= chats[1]["start_ns"] <= chats[1]["end_ns"] <= turn["end_ns"]
    assert turn["resource"]["service.name"] == "subs"
    # The engine's own decisions, one span each, under the turn.
    decided = receiver.named("decision ")
    assert all(d["attributes"]["subs.decider"] == "engine" for d in decided)
    assert all(d["parent_id"] == turn["span_id"] for d in decided)
    triggers = [d["attributes"]["subs.trigger.type"] for d in decided]
    assert {"client.messages", "llm.finished", "tool.finished"} <= set(triggers), triggers
    assert triggers.count("llm.finished") == 2
    # Each vendor request named its call attempt's span.
    sent = [parse_traceparent(r.headers.get("traceparent")) for r in vendor.requests]
    assert [(c.trace_id, c.span_id) for c in sent if c] == [
        (c["trace_id"], c["span_id"]) for c in sorted(chats, key=lambda c: c["start_ns"])
    ]


async def test_a_worker_turn_nests_the_workers_requests_under_its_decisions(
    redis, vendor, test_worker, tmp_path
):
    worker = await test_worker(echo_proposed, secret=SECRET)
    vendor.push(ToolCalls([("lookup", {"q": "disk"})]), Text("Disk is at 91%."))

    async def decide(request):
        if request["trigger"]["type"] == "tool.execute":
            return {"actions": [{"type": "tool.result", "result": {"disk": "91%"}}]}
        return request["proposed"]

    worker.decide = decide
    async with otlp_receiver() as receiver:
        project = worker_project(tmp_path, vendor.url, worker.url)
        text = Path(project.path).read_text() + f'\n[telemetry]\nendpoint = "{receiver.url}"\n'
        project = parse_project(text, project.path, env={})
        engine = await start_engine(redis, project)
        try:
            sid, end = await run_turn(engine, "how full is the disk?")
            assert end["payload"]["type"] == "turn.completed"
            events = await Client(engine.store).events(sid)
        finally:
            await engine.stop()
    (turn,) = receiver.named("invoke_agent")
    trace = turn["trace_id"]
    assert trace == trace_id_for_turn(sid, end["payload"]["turn_id"])
    decisions = receiver.named("decision ")
    by_id = {s["span_id"]: s for s in receiver.spans}
    # The session's first decision (session.start) comes before the turn; every other
    # request names a span of the turn's trace as its parent.
    in_turn = [
        (request, parse_traceparent(headers.get("traceparent")))
        for request, headers in zip(worker.requests, worker.headers, strict=True)
    ]
    for request, ctx in in_turn:
        assert ctx is not None and ctx.sampled
        assert ctx.trace_id == trace, request["trigger"]["type"]
        parent = by_id[ctx.span_id]
        if request["trigger"]["type"] == "tool.execute":
            assert parent["name"] == "execute_tool lookup"
        else:
            assert parent["name"] == f"decision {request['trigger']['type']}"
        assert parent["parent_id"] == turn["span_id"]
    dispatched = payloads(events, "decision.dispatched")
    assert len(decisions) == len(dispatched) == len(worker.requests) - 1
    assert all(d["attributes"]["subs.decider"] == "worker" for d in decisions)


async def test_a_turn_finished_by_another_serve_after_a_sigkill_is_one_trace(
    redis, redis_url, vendor, config
):
    """The first `subs serve` exports the turn's first model call and its tool call, and is
    SIGKILLed while the second call streams; the next one ends the turn: one trace."""
    vendor.push(
        ToolCalls([("confirm", {"question": "restart?"})]),
        Text(" ".join(f"word{i}" for i in range(60)), chunk_delay=0.05),
        Text("Restarted.", chunks=3),
    )
    async with otlp_receiver() as receiver:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "50"}
        first = await EngineProcess(config, redis_url, env).start()
        second = None
        try:
            store = await Store.open(redis)
            client = Client(store)
            message = {"role": "user", "content": "restart the api"}
            reply = await client.submit(
                {"type": "client.message", "agent_id": "ops_openai", "message": message}
            )
            sid, tid = reply["session_id"], reply["turn_id"]
            requested = await wait_for_event(
                client, sid, lambda e: e["payload"]["type"] == "tool.call.requested"
            )
            await client.submit(
                {"type": "tool.result", "id": requested["payload"]["id"], "result": "yes"},
                session_id=sid,
            )

            async def first_spans_out() -> bool:
                return bool(receiver.named("execute_tool")) and bool(receiver.named("chat"))

            await poll_until(first_spans_out, 20, "the first serve's spans")

            async def streaming() -> bool:
                return len(await redis.xrange(store.delta_key(sid))) >= 5

            await poll_until(streaming, 20, "the second call's deltas")
            first.kill()
            assert await first.stop() == -signal.SIGKILL
            from_first = list(receiver.spans)
            second = await EngineProcess(config, redis_url, env).start()
            end = await wait_for_event(client, sid, turn_ended(tid), timeout=30)
            assert end["payload"]["type"] == "turn.completed"
        finally:
            if second is not None:
                await second.stop()  # SIGTERM: the exporter's queue is flushed
            await first.stop()
    trace = trace_id_for_turn(sid, tid)
    assert {s["trace_id"] for s in receiver.spans} == {trace}
    assert {s["resource"]["service.name"] for s in receiver.spans} == {"subs"}
    (turn,) = receiver.named("invoke_agent")
    assert turn not in from_first  # the second process ended it
    chats = receiver.named("chat")
    # The first call, the second call's attempt lost with the first serve, and its retry.
    assert len(chats) == 3 and all(c["parent_id"] == turn["span_id"] for c in chats)
    lost = [c for c in chats if c["status"] == 2]
    assert len(lost) == 1 and lost[0]["attributes"]["subs.attempt"] == 1
    assert turn["start_ns"] <= min(s["start_ns"] for s in receiver.spans)


def test_the_genai_metrics_use_the_conventions_buckets():
    from engine.metrics import Metrics

    m = Metrics()
    m.observe_chat(0.3, provider="anthropic", model="claude", tokens={"input": 100, "output": 5})
    m.observe_chat(2.0, provider="anthropic", model="claude", tokens={}, error="rate_limited")
    text = m.render()
    ok = (
        'gen_ai_operation_name="chat",gen_ai_provider_name="anthropic",'
        'gen_ai_request_model="claude"'
    )
    assert f'gen_ai_client_operation_duration_seconds_bucket{{{ok},le="0.32"}} 1\n' in text
    assert f'gen_ai_client_operation_duration_seconds_bucket{{{ok},le="0.16"}} 0\n' in text
    failed = f'error_type="rate_limited",{ok}'
    assert f'gen_ai_client_operation_duration_seconds_bucket{{{failed},le="2.56"}} 1\n' in text
    tokens = f'{ok},gen_ai_token_type="input"'
    assert f'gen_ai_client_token_usage_bucket{{{tokens},le="64"}} 0\n' in text
    assert f'gen_ai_client_token_usage_bucket{{{tokens},le="256"}} 1\n' in text
    assert "# TYPE gen_ai_client_token_usage histogram" in text


async def test_a_turn_submitted_with_a_traceparent_joins_the_callers_trace(redis, vendor, tmp_path):
    import httpx

    from engine.api import ApiKeys, make_app
    from tests.api_helpers import INPUT, serve

    caller = SpanContext("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")
    vendor.push(Text("Nothing is paging."))
    async with otlp_receiver() as receiver:
        project = project_with(tmp_path, vendor.url, f'[telemetry]\nendpoint = "{receiver.url}"\n')
        engine = Engine(project, redis, env=ENV, lease_ms=3000)
        await engine.start()
        try:
            app = make_app(Client(engine.store), engine.store, keys=ApiKeys.from_env({}))
            async with serve(app) as base, httpx.AsyncClient(base_url=base) as http:
                message = {"role": "user", "content": "what's paging?"}
                body = {
                    "input": {
                        "type": "client.message",
                        "agent_id": "ops_openai",
                        "message": message,
                    }
                }
                answer = await http.post(
                    INPUT, json=body, headers={"traceparent": caller.traceparent()}
                )
                assert answer.status_code == 202, answer.text
                sid, tid = answer.json()["session_id"], answer.json()["turn_id"]
                await wait_for_event(Client(engine.store), sid, turn_ended(tid))
                # A header that is not a traceparent is ignored, as the spec asks.
                body["session_id"] = sid
                vendor.push(Text("Still nothing."))
                again = await http.post(INPUT, json=body, headers={"traceparent": "00-zz"})
                assert again.status_code == 202, again.text
                await wait_for_event(Client(engine.store), sid, turn_ended(again.json()["turn_id"]))
        finally:
            await engine.stop()
    first, second = receiver.named("invoke_agent")
    assert first["trace_id"] == caller.trace_id and first["parent_id"] == caller.span_id
    (chat,) = [s for s in receiver.named("chat") if s["trace_id"] == caller.trace_id]
    assert chat["parent_id"] == first["span_id"]
    assert second["trace_id"] == trace_id_for_turn(sid, again.json()["turn_id"])
    assert second["parent_id"] is None


async def test_a_subagents_turn_nests_under_its_parents_tool_call(redis, vendor, tmp_path):
    def model(body: dict):
        first = body["messages"][0]
        if first.get("content") == "You lead.":
            if body["messages"][-1]["role"] == "tool":
                return Text("The child answered.")
            return ToolCalls([("researcher", {"message": "find it"})])
        return Text("found")

    vendor.responder = model
    async with otlp_receiver() as receiver:
        text = textwrap.dedent(
            f"""\
            [llm.openai]
            type = "openai"
            base_url = "{vendor.url}/v1"

            [agent.lead]
            llm = "openai"
            model = "gpt-4.1-mini"
            system = "You lead."
            subagents = ["agent.researcher"]

            [agent.researcher]
            llm = "openai"
            model = "gpt-4.1-mini"
            system = "You research."
            description = "Finds things out."

            [telemetry]
            endpoint = "{receiver.url}"
            """
        )
        path = tmp_path / "subs.toml"
        path.write_text(text)
        engine = Engine(parse_project(text, str(path), env={}), redis, env=ENV, lease_ms=3000)
        await engine.start()
        try:
            client = Client(engine.store)
            message = {"role": "user", "content": "look into it"}
            reply = await client.submit(
                {"type": "client.message", "agent_id": "lead", "message": message}
            )
            end = await wait_for_event(client, reply["session_id"], turn_ended(reply["turn_id"]))
            assert end["payload"]["type"] == "turn.completed"
        finally:
            await engine.stop()
    lead = next(s for s in receiver.named("invoke_agent") if s["name"] == "invoke_agent lead")
    child = next(s for s in receiver.named("invoke_agent") if s["name"] != lead["name"])
    (call,) = receiver.named("execute_tool researcher")
    assert child["name"] == "invoke_agent researcher"
    assert {s["trace_id"] for s in receiver.spans} == {lead["trace_id"]}
    assert call["parent_id"] == lead["span_id"] and child["parent_id"] == call["span_id"]
    (child_chat,) = [s for s in receiver.named("chat") if s["parent_id"] == child["span_id"]]
    assert call["start_ns"] <= child["start_ns"] <= child_chat["end_ns"] <= call["end_ns"]


# -- logs --------------------------------------------------------------------------------

LOG_SCRIPT = textwrap.dedent(
    """\
    import logging
    from engine.cli.logs import start_logging
    from engine.telemetry.ids import SpanContext
    from engine.telemetry.logs import CURRENT
    start_logging()
    log = logging.getLogger("subs.engine")
    log.warning("outside any span")
    CURRENT.set(SpanContext("%s", "%s"))
    log.warning("the vendor answered 529; trying again")
    """
) % (T, P)


def run_logging(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("SUBS_LOG")}
    return subprocess.run(
        [sys.executable, "-c", LOG_SCRIPT],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**full, **env},
        timeout=60,
    )


def test_json_log_lines_name_the_span_they_happened_in():
    out = run_logging({"SUBS_LOG_FORMAT": "json"})
    first, second = [json.loads(line) for line in out.stderr.splitlines()]
    assert first["message"] == "outside any span" and "trace_id" not in first
    assert second["level"] == "WARNING" and second["logger"] == "subs.engine"
    assert (second["trace_id"], second["span_id"]) == (T, P)
    assert second["time"].endswith("+00:00")


def test_full_records_carry_the_span_and_the_default_lines_do_not():
    full = run_logging({"SUBS_LOG": "info"}).stderr.splitlines()
    assert full == [
        "WARNING:subs.engine:outside any span",
        f"WARNING:subs.engine:the vendor answered 529; trying again trace_id={T} span_id={P}",
    ]
    default = run_logging({}).stderr.splitlines()
    assert default == ["subs: outside any span", "subs: the vendor answered 529; trying again"]


def test_an_unknown_log_format_is_one_line_naming_it(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "engine.cli", "check", "-c", str(tmp_path / "none.toml")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        env={**os.environ, "SUBS_LOG_FORMAT": "xml"},
    )
    assert out.returncode == 2
    said = "subs: SUBS_LOG_FORMAT='xml' is not a format; the one there is: json"
    assert out.stderr.strip() == said


async def test_an_effect_logs_inside_its_calls_span(vendor, tmp_path):
    """The runner starts each effect in its span's context: what it logs names the span."""
    from engine.effects.runner import EffectRunner
    from engine.machine import RunLlmCall
    from engine.metrics import Metrics
    from engine.telemetry.logs import SpanFields
    from engine.telemetry.spans import call_context

    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    handler = Keep()
    handler.addFilter(SpanFields())
    logging.getLogger("subs.test").addHandler(handler)

    def runner(er, state, effect, done, tasks):
        async def work() -> None:
            logging.getLogger("subs.test").warning("inside the call")

        task = asyncio.create_task(work())
        tasks.add(task)

    state = state_mid_turn()
    project = project_with(tmp_path, vendor.url)
    effects = EffectRunner(project, None, {}, {}, Metrics(), lambda: 0.0, {RunLlmCall: runner})
    tasks: set[asyncio.Task[None]] = set()
    try:
        effect = RunLlmCall("call_1", 2, None)
        effects.start(state, effect, lambda *_: None, tasks)
        await asyncio.gather(*tasks)
        effects.sampled = True
        effects.start(state, effect, lambda *_: None, tasks)
        await asyncio.gather(*tasks)
    finally:
        logging.getLogger("subs.test").removeHandler(handler)
        await effects.aclose()
    span = call_context(state, "call_1", 2)
    assert span is not None
    assert [(r.trace_id, r.span_id) for r in seen] == [("", ""), (span.trace_id, span.span_id)]


async def test_a_slack_mentions_turn_joins_the_bots_intake_span(redis, vendor, tmp_path):
    from tests.bot_helpers import AGENT, serve_bots

    async with otlp_receiver() as receiver:
        text = project_toml(vendor.url, retry="retry = { llm = { backoff_base_secs = 0 } }")
        text += f'\n[agent.{AGENT}.slack]\nanswers = "both"\n'
        text += f'\n[telemetry]\nendpoint = "{receiver.url}"\n'
        project = parse_project(text, str(tmp_path / "subs.toml"), env={})
        vendor.push(Text("The database is fine.", chunks=4, chunk_delay=0.02))
        async with serve_bots(redis, vendor, project, AGENT) as world:
            fake = world.fake
            mention = fake.post_as_user(fake.general, fake.mention("is the db ok?"))
            await fake.send_event(world.url, fake.event_for(mention, kind="app_mention"))
            await world.reply_to(mention)
            (started,) = await world.turns(fake.general.id, mention.ts)
    (intake,) = receiver.named("slack intake")
    (turn,) = receiver.named("invoke_agent")
    assert intake["name"] == f"slack intake {AGENT}" and intake["kind"] == "server"
    assert intake["parent_id"] is None and turn["parent_id"] == intake["span_id"]
    assert turn["trace_id"] == intake["trace_id"]
    assert started["payload"]["traceparent"].split("-")[2] == intake["span_id"]
    assert intake["attributes"]["slack.channel"] == fake.general.id
    # Intake runs from the person's message to the first words posted, inside the trace.
    assert intake["start_ns"] <= turn["start_ns"] and intake["end_ns"] <= turn["end_ns"]
    calls = [s for s in receiver.spans if s["name"].startswith("slack chat.")]
    assert calls and all(s["parent_id"] == intake["span_id"] for s in calls)
    assert {s["trace_id"] for s in receiver.spans} == {intake["trace_id"]}
    assert "slack chat.update" in {s["name"] for s in calls}


@pytest.mark.parametrize("capture", [False, True])
async def test_prompts_and_completions_reach_spans_only_when_captured_and_masked(
    redis, vendor, tmp_path, capture
):
    key = ENV["OPENAI_API_KEY"]  # a secret the engine knows, typed by a person
    vendor.push(Text("Rotate it now."))
    async with otlp_receiver() as receiver:
        block = f'[telemetry]\nendpoint = "{receiver.url}"\n'
        block += f"capture_content = {str(capture).lower()}\n"
        engine = Engine(project_with(tmp_path, vendor.url, block), redis, env=ENV, lease_ms=3000)
        await engine.start()
        try:
            client = Client(engine.store)
            message = {"role": "user", "content": f"is {key} leaked?"}
            reply = await client.submit(
                {"type": "client.message", "agent_id": "ops_openai", "message": message}
            )
            await wait_for_event(client, reply["session_id"], turn_ended(reply["turn_id"]))
        finally:
            await engine.stop()
    (chat,) = receiver.named("chat")
    attributes = chat["attributes"]
    if not capture:
        assert "gen_ai.input.messages" not in attributes
        assert "gen_ai.output.messages" not in attributes
        return
    inputs = json.loads(attributes["gen_ai.input.messages"])
    assert inputs[-1] == {"role": "user", "parts": [{"type": "text", "content": "is *** leaked?"}]}
    outputs = json.loads(attributes["gen_ai.output.messages"])
    said = {"type": "text", "content": "Rotate it now."}
    assert outputs == [{"role": "assistant", "parts": [said]}]
    assert key not in json.dumps(receiver.spans)


async def test_a_stop_that_lands_mid_commit_still_sends_that_commits_spans(redis, vendor, tmp_path):
    """The flake of the test above, made certain: a follower saw the turn's last commit
    before the engine read Redis's reply to it, and the engine was stopped right then.
    The commit's reply is held back until the stop has begun."""
    vendor.push(Text("Rotate it now."))
    async with otlp_receiver() as receiver:
        block = f'[telemetry]\nendpoint = "{receiver.url}"\n'
        engine = Engine(project_with(tmp_path, vendor.url, block), redis, env=ENV, lease_ms=3000)
        landed, reply = asyncio.Event(), asyncio.Event()

        async def held_commit(p, lease, commit, deltas=()):
            seq = await real_commit(p, lease, commit, deltas)
            if any(b'"turn.completed"' in e for e in commit.events):
                landed.set()
                await reply.wait()  # Redis took it; its reply is not read yet
            return seq

        await engine.start()
        real_commit = engine.store.commit
        engine.store.commit = held_commit  # type: ignore[method-assign]
        stopping = None
        try:
            client = Client(engine.store)
            reply_ = await client.submit(
                {
                    "type": "client.message",
                    "agent_id": "ops_openai",
                    "message": {"role": "user", "content": "rotate?"},
                }
            )
            await wait_for_event(client, reply_["session_id"], turn_ended(reply_["turn_id"]))
            await asyncio.wait_for(landed.wait(), 10)
            stopping = asyncio.create_task(engine.stop())

            async def stopping_now() -> bool:
                return all(part.stopping for part in engine.owned.values())

            await poll_until(stopping_now, 10, "the stop to begin")
            reply.set()
        finally:
            reply.set()
            await (stopping if stopping is not None else engine.stop())
    names = [s["name"] for s in receiver.spans]
    assert len(receiver.named("chat")) == 1, names


def test_a_retried_attempts_span_carries_the_retry_that_scheduled_it():
    state = state_mid_turn()
    projector = Projector()
    failed = envelope(
        8,
        "2023-11-14T22:13:20.000Z",
        {
            "type": "llm.call.errored",
            "id": "call_1",
            "attempt": 1,
            "error": {"code": "rate_limited", "message": "429"},
            "retryable": True,
            "final": False,
        },
    )
    retry = envelope(
        9,
        "2023-11-14T22:13:20.000Z",
        {
            "type": "call.retry_scheduled",
            "id": "call_1",
            "attempt": 2,
            "due_at": "2023-11-14T22:13:21.000Z",
        },
    )
    state.calls["call_1"].attempt = 1
    (first,) = projector.project(Before.of(state, "ses_1"), [failed, retry])
    assert first.error == "rate_limited" and first.events == ()
    state.calls["call_1"].attempt = 2
    done = envelope(
        11,
        "2023-11-14T22:13:23.000Z",
        {
            "type": "llm.call.completed",
            "id": "call_1",
            "attempt": 2,
            "usage": None,
            "cost": "0",
            "finish_reason": "stop",
            "model": None,
        },
    )
    (second,) = projector.project(Before.of(state, "ses_1"), [done])
    (wait,) = second.events
    assert wait.name == "retry_scheduled" and wait.attributes["subs.due_at"].endswith("21.000Z")
    assert second.context.span_id != first.context.span_id


@pytest.mark.parametrize(
    ("header", "kept"),
    [
        ("congo=t61rcWkgMzE", "congo=t61rcWkgMzE"),
        ("rojo=00f067aa0ba902b7, congo=t61rcWkgMzE", "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"),
        ("vendor@tenant=a/b*c", "vendor@tenant=a/b*c"),
        ("", None),
        (None, None),
        ("Upper=1", None),  # keys are lowercase
        ("k=v,=x", None),
        ("k=a,b", None),  # a member without `=`
        ("k=" + "x" * 600, None),  # past what a vendor must pass on
    ],
)
def test_tracestate_headers_are_passed_on_or_dropped_whole(header, kept):
    assert parse_tracestate(header) == kept


async def test_a_clients_tracestate_goes_to_the_turns_worker_with_its_trace(
    redis, vendor, test_worker, tmp_path
):
    worker = await test_worker(echo_proposed, secret=SECRET)
    vendor.push(Text("Fine."))
    engine = await start_engine(redis, worker_project(tmp_path, vendor.url, worker.url))
    caller = SpanContext("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")
    try:
        client = Client(engine.store)
        message = {"role": "user", "content": "status?"}
        reply = await client.submit(
            {"type": "client.message", "agent_id": "helper", "message": message},
            traceparent=caller.traceparent(),
            tracestate="rojo=00f067aa0ba902b7",
        )
        await wait_for_event(client, reply["session_id"], turn_ended(reply["turn_id"]))
    finally:
        await engine.stop()
    assert worker.headers
    for headers in worker.headers:
        sent = parse_traceparent(headers.get("traceparent"))
        assert sent is not None and sent.trace_id == caller.trace_id
        assert headers.get("tracestate") == "rojo=00f067aa0ba902b7"
