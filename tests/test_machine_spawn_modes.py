"""Spawn modes in the pure machine (SPEC §9, the wire's SpawnMode / SubagentMode).

`blocking`: the call stays open until the child's turn ends. `detached`: answered once
the child's turn has started; the child's end is a fact on the parent's log, no new
turn. `wait`: collects a detached child's result. The subagent's configured mode says
which a call may use.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from engine.machine import (
    ChildSpawned,
    Deliver,
    LlmCallSettled,
    RunLlmCall,
    SubagentFinished,
    SubagentStarted,
    build_llm_request,
)
from engine.machine.spawns import spawn_mode
from tests.machine_helpers import AGENT, Session, text_reply, tool_reply


def parent(mode: str | None) -> Session:
    agent = copy.deepcopy(AGENT)
    sub: dict[str, Any] = {"id": "helper", "description": "helps"}
    if mode is not None:
        sub["mode"] = mode
    agent["subagents"] = [sub]
    return Session(session_id="p", agent=agent)


def run_of(t) -> RunLlmCall:
    (run,) = [e for e in t.effects if isinstance(e, RunLlmCall)]
    return run


def call_helper(s: Session, run: RunLlmCall, call_id: str, **args: Any):
    reply = tool_reply((call_id, "helper", json.dumps(args)))
    return s.apply(LlmCallSettled(run.call_id, run.attempt, response=reply))


def payloads(t, kind: str) -> list[dict[str, Any]]:
    return [e["payload"] for e in t.events if e["payload"]["type"] == kind]


def tool_results(s: Session) -> list[Any]:
    return [
        json.loads(n.message["content"])
        for n in s.state.nodes.values()
        if n.message["role"] == "tool" and n.message["content"].startswith("{")
    ]


@pytest.mark.parametrize(
    ("configured", "asked", "mode", "problem"),
    [
        (None, None, "blocking", None),
        (None, "blocking", "blocking", None),
        (None, "detached", "detached", "mode is 'blocking' (allowed: blocking)"),
        ("blocking", "wait", "wait", "mode is 'blocking' (allowed: blocking)"),
        ("detached", None, "detached", None),
        ("detached", "detached", "detached", None),
        ("detached", "wait", "wait", None),
        ("detached", "blocking", "blocking", "(allowed: detached, wait)"),
        ("any", None, "blocking", None),
        ("any", "detached", "detached", None),
        ("any", "wait", "wait", None),
        ("any", "fast", "blocking", "mode 'fast' is not one of blocking, detached, wait"),
    ],
)
def test_the_configured_mode_decides_which_spawn_modes_a_call_may_use(
    configured, asked, mode, problem
):
    got, why = spawn_mode(configured, asked)
    assert got == mode
    if problem is None:
        assert why is None
    else:
        assert why is not None and problem in why


@pytest.mark.parametrize(
    ("configured", "offered"),
    [
        (None, None),
        ("blocking", None),
        ("detached", ["detached", "wait"]),
        ("any", ["blocking", "detached", "wait"]),
    ],
)
def test_the_subagent_tool_offers_a_mode_only_when_the_config_leaves_a_choice(configured, offered):
    s = parent(configured)
    run = run_of(s.say("go"))
    request = build_llm_request(s.state, s.state.calls[run.call_id]).request
    (tool,) = [t for t in request["tools"] if t["name"] == "helper"]
    mode = tool["input"]["properties"].get("mode")
    assert (None if mode is None else mode["enum"]) == offered
    assert tool["input"]["required"] == (["message"] if offered is None else [])


@pytest.mark.parametrize(
    ("configured", "asked", "outcome"),
    [
        (None, None, "blocking"),
        ("any", "blocking", "blocking"),
        ("detached", None, "detached"),
        ("any", "detached", "detached"),
        (None, "detached", "refused"),
        ("detached", "blocking", "refused"),
        ("any", "sideways", "refused"),
    ],
)
def test_a_models_call_runs_in_the_mode_it_may_use_or_is_a_tool_error(configured, asked, outcome):
    s = parent(configured)
    run = run_of(s.say("go"))
    args: dict[str, Any] = {"message": "look"}
    if asked is not None:
        args["mode"] = asked
    t = call_helper(s, run, "c1", **args)
    if outcome == "refused":
        (errored,) = payloads(t, "tool.call.errored")
        assert errored["final"] and "mode" in errored["error"]["message"]
        assert not [e for e in t.effects if isinstance(e, Deliver)]
        assert s.types(t)[-1] == "llm.call.dispatched"  # the model hears why
        s.check_fold()
        return
    (requested,) = payloads(t, "subagent.requested")
    assert requested.get("mode", "blocking") == outcome
    (spawned,) = [e for e in t.effects if isinstance(e, Deliver)]
    assert spawned.to == "p~c1" and isinstance(spawned.input, ChildSpawned)
    t = s.apply(SubagentStarted("p~c1", "c1"))
    if outcome == "blocking":
        assert s.types(t) == ["subagent.started"] and "c1" in s.state.calls
    else:  # answered now, and the model is asked again
        assert s.types(t) == [
            "subagent.started",
            "tool.call.completed",
            "message.new",
            "llm.call.requested",
            "llm.call.dispatched",
        ]
        assert tool_results(s) == [{"session": "p~c1", "status": "started"}]
        assert "c1" not in s.state.calls
    s.check_fold()


def detached_then_reply(s: Session) -> None:
    """The model starts the helper detached, hears it started, and ends its turn."""
    run = run_of(s.say("go"))
    call_helper(s, run, "c1", message="look", mode="detached")
    t = s.apply(SubagentStarted("p~c1", "c1"))
    t = s.apply(LlmCallSettled(run_of(t).call_id, 1, response=text_reply("started it")))
    assert s.types(t)[-1] == "turn.completed" and s.state.turn is None


def test_a_detached_childs_end_is_a_fact_on_the_parent_and_starts_no_turn():
    s = parent("any")
    detached_then_reply(s)
    assert tool_results(s) == [{"session": "p~c1", "status": "started"}]
    assert s.state.children["p~c1"]["detached"] == "c1"
    cost_before = s.state.cost
    usage = {"input": 3, "output": 2, "uncached_input": 3}
    usage |= {"cache_read": 0, "cache_write": 0, "total": 5}
    done = SubagentFinished(
        "p~c1", "c1", "helper", ok=True, result="found it", usage=usage, cost="0.5"
    )
    t = s.apply(done)
    assert s.types(t) == ["subagent.completed"]
    ended = t.events[0]
    assert "turn_id" not in ended  # no turn runs, none starts
    assert ended["payload"]["detached"] and ended["payload"]["result"] == "found it"
    assert s.state.turn is None and not t.effects
    assert s.state.cost != cost_before and s.state.usage["total"] > 5  # its cost rolls in
    assert s.state.children["p~c1"]["last"] == {"ok": True, "result": "found it", "error": None}
    assert s.apply(done).ignored  # delivered twice: recorded once
    s.check_fold()


def test_wait_answers_at_once_when_the_detached_run_has_ended():
    s = parent("detached")
    detached_then_reply(s)
    s.apply(SubagentFinished("p~c1", "c1", "helper", ok=True, result="found it"))
    run = run_of(s.say("what did it find?"))
    t = call_helper(s, run, "w1", session="p~c1", mode="wait")
    assert "subagent.requested" not in s.types(t)  # it starts nothing
    assert not [e for e in t.effects if isinstance(e, Deliver)]
    assert s.types(t)[-5:] == [
        "tool.call.requested",
        "tool.call.completed",
        "message.new",
        "llm.call.requested",
        "llm.call.dispatched",
    ]
    assert tool_results(s)[-1] == {"session": "p~c1", "result": "found it"}
    assert "w1" not in s.state.calls and s.state.turn is not None
    s.check_fold()


def test_wait_stays_open_until_the_detached_run_ends_then_answers():
    s = parent("any")
    detached_then_reply(s)
    run = run_of(s.say("wait for it"))
    t = call_helper(s, run, "w1", session="p~c1", mode="wait")
    assert s.types(t)[-2:] == ["tool.call.requested", "tool.call.dispatched"]
    assert payloads(t, "tool.call.dispatched")[0]["deadline_ms"] is None
    assert s.state.calls["w1"].status == "running"
    error = {"message": "gave up", "code": "handler_error"}
    t = s.apply(SubagentFinished("p~c1", "c1", "helper", ok=False, error=error))
    assert s.types(t)[:2] == ["subagent.errored", "tool.call.completed"]
    assert t.events[0]["payload"]["detached"]
    assert tool_results(s)[-1] == {"session": "p~c1", "result": "Error: gave up"}
    assert s.types(t)[-1] == "llm.call.dispatched"  # the model is asked again
    s.check_fold()


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        ({"mode": "wait", "message": "x"}, "names the `session`"),
        ({"mode": "wait", "session": "p~c1", "message": "x"}, "sends no `message`"),
        ({"mode": "wait", "session": "elsewhere"}, "not an earlier child"),
        ({"mode": "wait", "session": "p~b1"}, "no detached run to wait for"),
        ({"mode": "detached", "message": "more", "session": "p~c1"}, "busy with call 'c1'"),
    ],
)
def test_a_wait_or_spawn_that_cannot_run_is_a_tool_error_naming_why(args, problem):
    s = parent("any")
    detached_then_reply(s)  # p~c1 runs detached
    run = run_of(s.say("first a blocking one"))
    call_helper(s, run, "b1", message="quick")
    t = s.apply(SubagentStarted("p~b1", "b1"))
    t = s.apply(SubagentFinished("p~b1", "b1", "helper", ok=True, result="quick answer"))
    run = run_of(t)
    t = call_helper(s, run, "x1", **args)
    (errored,) = payloads(t, "tool.call.errored")
    assert errored["id"] == "x1" and problem in errored["error"]["message"]
    s.check_fold()


def test_a_workers_spawn_carries_its_own_mode_checked_against_the_config():
    from tests.test_machine_worker import WORKER_AGENT, WorkerSession

    w = WorkerSession(session_id="p", agent=copy.deepcopy(WORKER_AGENT), decider="worker")
    w.agent["subagents"] = [{"id": "helper", "description": "helps", "mode": "detached"}]
    w.start()
    w.answer()
    (llm,) = [e for e in w.answer().effects if isinstance(e, RunLlmCall)]
    calls = (("c1", "helper", '{"message":"a"}'), ("c2", "helper", '{"message":"b"}'))
    w.apply(LlmCallSettled(llm.call_id, 1, response=tool_reply(*calls)))
    proposed = w.request()["proposed"]["actions"]
    assert [a.get("mode") for a in proposed] == [None, None]  # the config's default applies
    spawns = [
        {**proposed[0], "mode": "blocking"},
        {**proposed[1], "mode": "detached"},
    ]
    t = w.answer({"actions": spawns})
    (errored,) = payloads(t, "tool.call.errored")
    assert errored["id"] == "c1"
    assert errored["error"]["message"] == (
        "a 'blocking' call is not allowed: the subagent's mode is 'detached' "
        "(allowed: detached, wait)"
    )
    (requested,) = payloads(t, "subagent.requested")
    assert requested["tool_call_id"] == "c2" and requested["mode"] == "detached"
    # Started, c2 is answered; the worker's request (schema-checked) says so.
    w.apply(SubagentStarted("p~c2", "c2"))
    first = w.request()["trigger"]
    assert (first["type"], first["id"], first["ok"]) == ("tool.finished", "c1", False)
    w.answer({})
    second = w.request()["trigger"]
    assert (second["type"], second["id"], second["ok"]) == ("tool.finished", "c2", True)
    text = second["result"]["content"][0]["text"]
    assert json.loads(text) == {"session": "p~c2", "status": "started"}
    w.check_fold()


def test_a_subagent_call_with_arguments_too_deep_to_parse_is_a_tool_error_not_a_crash():
    """Parsed at the JSON edge (tools.arguments_of): refused there, they hold no message."""
    s = parent(None)
    run = run_of(s.say("go"))
    deep = '{"message":' * 3000 + '"x"' + "}" * 3000
    t = s.apply(
        LlmCallSettled(run.call_id, run.attempt, response=tool_reply(("c1", "helper", deep)))
    )
    assert not [e for e in t.effects if isinstance(e, ChildSpawned | Deliver)]
    (errored,) = payloads(t, "tool.call.errored")
    assert errored["final"] and "needs a `message`" in errored["error"]["message"]
