"""Connectors in the pure machine: syncs before the first decision, the filter and names
the model sees, calls run by the engine, credential failures, and a worker's view."""

from __future__ import annotations

import json

import pytest

from engine.machine import CallAnswered, CallLost, LlmCallSettled, RunLlmCall, build_llm_request
from engine.machine.connectors import RunConnectorSync, RunMcpCall
from engine.machine.request import control_request
from tests.machine_helpers import AGENT, Session, text_reply, tool_reply
from tests.test_machine_worker import REQUEST, WorkerSession

CLOCK_TOOLS = [
    {"name": "now", "description": "the time", "annotations": {"readOnlyHint": True}},
    {
        "name": "echo",
        "description": "say it back",
        "input": {"type": "object", "properties": {"text": {"type": "string"}}},
        "annotations": {"readOnlyHint": True, "destructiveHint": False},
    },
    {"name": "reset", "description": "start over", "annotations": {"destructiveHint": True}},
    {"name": "confirm", "description": "a name the agent's own tool holds"},
]


def agent(*mcp) -> dict:
    """The test agent drawing on these connections (a string: `{id}`, as the wire has it)."""
    entries = [{"id": m} if isinstance(m, str) else m for m in mcp]
    return {**json.loads(json.dumps(AGENT)), "mcp": entries}


def effects(t, kind):
    return [e for e in t.effects if isinstance(e, kind)]


def synced(s: Session, t, lists: dict[str, list], prefix: bool = True):
    """Answer every sync the transition started."""
    for run in effects(t, RunConnectorSync):
        path = s.state.calls[run.call_id].name
        result = {"tools": lists[path]}
        if prefix:
            result["prefix"] = path.removeprefix("mcp.").replace("-", "_")
        t = s.apply(CallAnswered(run.call_id, run.attempt, result=result))
    return t


def offered(s: Session, t) -> list[str]:
    [run] = effects(t, RunLlmCall)
    request = build_llm_request(s.state, s.state.calls[run.call_id]).request
    return [tool["name"] for tool in request.get("tools") or ()]


def test_the_first_decision_waits_for_every_connections_list():
    s = Session(agent=agent("mcp.clock", {"id": "mcp.my-docs"}))
    t = s.say("hi")
    assert s.types(t)[-5:] == [
        "decision.held",
        "connector.sync.requested",
        "connector.sync.dispatched",
        "connector.sync.requested",
        "connector.sync.dispatched",
    ]
    assert not effects(t, RunLlmCall)  # no model call before the lists are in
    [clock, docs] = effects(t, RunConnectorSync)
    t = s.apply(CallAnswered(clock.call_id, 1, result={"tools": CLOCK_TOOLS, "prefix": "clock"}))
    assert not effects(t, RunLlmCall)  # still waiting for the other
    t = s.apply(
        CallAnswered(docs.call_id, 1, result={"tools": [{"name": "now"}], "prefix": "my_docs"})
    )
    assert s.types(t)[:3] == ["connector.synced", "decision.released", "message.new"]
    # the agent's own tools first, then each server's, prefixed with its connection
    assert offered(s, t) == [
        "confirm",
        "lookup",
        "clock__now",
        "clock__echo",
        "clock__reset",
        "clock__confirm",
        "my_docs__now",
    ]
    s.check_fold()


@pytest.mark.parametrize(
    ("tools", "kept"),
    [
        ({}, ["clock__now", "clock__echo", "clock__reset", "clock__confirm"]),
        ({"read_only": True}, ["clock__now", "clock__echo"]),
        ({"non_destructive": True}, ["clock__echo"]),  # a missing annotation fails it
        ({"idempotent": True}, []),
        ({"include": ["e*", "now"]}, ["clock__now", "clock__echo"]),
        ({"exclude": ["re*"]}, ["clock__now", "clock__echo", "clock__confirm"]),
        ({"read_only": True, "include": ["*"], "exclude": ["now"]}, ["clock__echo"]),
    ],
)
def test_filters_run_in_upstreams_order_over_the_servers_own_names(tools, kept):
    s = Session(agent=agent({"id": "mcp.clock", "tools": tools}))
    t = synced(s, s.say("hi"), {"mcp.clock": CLOCK_TOOLS})
    assert offered(s, t) == ["confirm", "lookup", *kept]


def test_raw_names_clash_a_declared_tool_keeps_its_and_two_connections_both_lose_theirs():
    s = Session(agent=agent("mcp.a", "mcp.b"))
    t = synced(
        s,
        s.say("hi"),
        {"mcp.a": [{"name": "now"}, {"name": "x"}, {"name": "lookup"}], "mcp.b": [{"name": "now"}]},
        prefix=False,
    )
    assert offered(s, t) == ["confirm", "lookup", "x"]


def test_a_connector_tool_runs_on_the_engine_and_its_result_reaches_the_model():
    s = Session(agent=agent("mcp.clock"))
    t = synced(s, s.say("time?"), {"mcp.clock": CLOCK_TOOLS})
    [llm] = effects(t, RunLlmCall)
    t = s.apply(LlmCallSettled(llm.call_id, 1, response=tool_reply(("c1", "clock__now", "{}"))))
    assert effects(t, RunMcpCall)
    call = s.state.calls["c1"]
    assert (call.handler, call.params) == ("server", {"connector": "mcp.clock", "tool": "now"})
    # a dead engine's attempt is sent again (MCP has no idempotency key)
    t = s.apply(CallLost("c1", 1))
    [again] = effects(t, RunMcpCall)
    assert again.attempt == 2
    result = {"content": [{"type": "text", "text": "noon"}]}
    t = s.apply(CallAnswered("c1", 2, result=result))
    assert "tool.call.completed" in s.types(t)
    [llm] = effects(t, RunLlmCall)
    request = build_llm_request(s.state, s.state.calls[llm.call_id]).request
    assert request["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "c1",
        "name": "clock__now",
        "content": "noon",
        "id": request["messages"][-1]["id"],
    }
    s.check_fold()


def test_a_refused_credential_interrupts_and_resuming_syncs_afresh():
    s = Session(agent=agent("mcp.clock"))
    [run] = effects(s.say("hi"), RunConnectorSync)
    error = {
        "message": "mcp.clock refused the credential (HTTP 401)",
        "code": "handler_error",
        "detail": {"connector": "mcp.clock", "reason": "unauthorized"},
    }
    t = s.apply(CallAnswered(run.call_id, 1, error=error, retryable=False))
    assert s.types(t) == ["connector.sync.errored", "session.interrupted"]
    [interrupt] = s.state.interrupts.values()
    assert interrupt["payload"]["metadata"]["connector"] == "mcp.clock"
    assert [o["label"] for o in interrupt["payload"]["metadata"]["options"]] == ["Retry"]
    assert s.state.status == "interrupted" and s.state.held is not None
    t = s.client({"type": "interrupt.resume", "interrupt_id": interrupt["interrupt_id"]})
    [again] = effects(t, RunConnectorSync)
    assert s.state.calls[again.call_id].params == {"force": True}
    t = synced(s, t, {"mcp.clock": CLOCK_TOOLS})
    assert "clock__now" in offered(s, t)
    s.check_fold()


def test_degrade_and_other_failures_run_the_turn_without_the_tools():
    s = Session(agent=agent({"id": "mcp.clock", "auth_failure": "degrade"}, "mcp.down"))
    t = s.say("hi")
    clock, down = effects(t, RunConnectorSync)
    auth = {"message": "401", "code": "handler_error", "detail": {"reason": "unauthorized"}}
    s.apply(CallAnswered(clock.call_id, 1, error=auth, retryable=False))
    t = s.apply(
        CallAnswered(
            down.call_id, 1, error={"message": "refused", "code": "handler_error"}, retryable=False
        )
    )
    assert offered(s, t) == ["confirm", "lookup"]
    assert s.state.connectors["mcp.down"]["tools"] == []
    s.check_fold()


def test_a_worker_sees_connector_tools_and_syncs_and_may_ask_for_one():
    w = WorkerSession(agent=agent("mcp.clock"))
    w.start()
    [run] = effects(w.last, RunConnectorSync)
    # a sync in flight is on the worker's request as a connector_sync effect, schema-valid
    req = control_request(w.state)
    assert {
        "id": "mcp.clock",
        "kind": "connector_sync",
        "status": "running",
        "attempt": 1,
    }.items() <= next(c for c in req["calls"] if c["kind"] == "connector_sync").items()
    assert not list(REQUEST.iter_errors(json.loads(json.dumps(req))))
    w.apply(CallAnswered(run.call_id, 1, result={"tools": CLOCK_TOOLS, "prefix": "clock"}))
    w.answer()  # session.start: the file's config
    t = w.answer(
        {"actions": [{"type": "tool.call", "id": "t1", "name": "clock__echo", "arguments": "{}"}]}
    )
    assert effects(t, RunMcpCall)  # the name says where it runs: on the engine
    t = w.apply(CallAnswered("t1", 1, result={"content": [{"type": "text", "text": "hi"}]}))
    assert w.request()["trigger"]["type"] == "tool.finished"
    t = w.answer({"actions": [{"type": "connector.sync", "path": "mcp.clock"}]})
    [again] = effects(t, RunConnectorSync)
    assert w.state.calls[again.call_id].params == {"force": True}
    w.check_fold()


OFF = "its command names ONCALL_REPO, which is not set"


def _turn_with(s: Session, answer: dict) -> tuple[dict | None, list[str]]:
    """One turn whose one sync gets `answer` and whose model replies: what its
    `connector.synced` recorded (None: the unchanged form) and the tools offered."""
    t = s.say("hi")
    [run] = effects(t, RunConnectorSync)
    t = s.apply(CallAnswered(run.call_id, run.attempt, result=answer))
    [synced] = [e["payload"] for e in t.events if e["payload"]["type"] == "connector.synced"]
    names = offered(s, t)
    [llm] = effects(t, RunLlmCall)
    s.apply(LlmCallSettled(llm.call_id, 1, response=text_reply("ok")))
    assert s.state.status == "idle"
    kept = {k: v for k, v in synced.items() if k in ("tools", "prefix", "off")}
    return kept or None, names


@pytest.mark.parametrize(
    ("answers", "recorded"),
    [
        # off three turns running: said once, then the unchanged form
        ([{"off": OFF}] * 3, [{"tools": [], "off": OFF}, None, None]),
        # the variable set (serve restarted): the tools are recorded again
        (
            [{"off": OFF}, {"off": OFF}, {"tools": CLOCK_TOOLS, "prefix": "changes"}],
            [{"tools": [], "off": OFF}, None, {"tools": CLOCK_TOOLS, "prefix": "changes"}],
        ),
        # on, then off, then on with the same list: each change recorded
        (
            [{"tools": CLOCK_TOOLS}, {"off": OFF}, {"tools": CLOCK_TOOLS}],
            [{"tools": CLOCK_TOOLS}, {"tools": [], "off": OFF}, {"tools": CLOCK_TOOLS}],
        ),
        # another reason is another note; back on with no tools is not "off"
        (
            [{"off": OFF}, {"off": "'git' is not installed"}, {"tools": []}],
            [
                {"tools": [], "off": OFF},
                {"tools": [], "off": "'git' is not installed"},
                {"tools": []},
            ],
        ),
        # an off answer that lists tools anyway offers none
        ([{"off": OFF, "tools": CLOCK_TOOLS}], [{"tools": [], "off": OFF}]),
    ],
)
def test_an_off_connection_is_recorded_once_as_a_note_and_again_when_it_changes(answers, recorded):
    s = Session(agent=agent("mcp.changes"))
    turns = [_turn_with(s, answer) for answer in answers]
    assert [seen for seen, _ in turns] == recorded
    for answer, (_, names) in zip(answers, turns, strict=True):
        mcp_names = [n for n in names if n.startswith("changes__") or n in ("now", "echo")]
        assert bool(mcp_names) == bool(answer.get("tools") and not answer.get("off"))
    assert "connector.sync.errored" not in s.types()  # off is an answer, never a failed attempt
    assert s.state.connectors["mcp.changes"] == [r for r in recorded if r][-1]
    s.check_fold()


def test_an_off_connection_offers_no_tools_and_the_turn_goes_on():
    s = Session(agent=agent("mcp.clock", "mcp.changes"))
    t = s.say("hi")
    clock, changes = effects(t, RunConnectorSync)
    s.apply(CallAnswered(clock.call_id, 1, result={"tools": CLOCK_TOOLS, "prefix": "clock"}))
    t = s.apply(CallAnswered(changes.call_id, 1, result={"off": OFF}))
    assert s.types(t)[:2] == ["connector.synced", "decision.released"]
    assert s.state.connectors["mcp.changes"] == {"tools": [], "off": OFF}
    assert [n for n in offered(s, t) if "__" in n] == [
        "clock__now",
        "clock__echo",
        "clock__reset",
        "clock__confirm",
    ]
    s.check_fold()
