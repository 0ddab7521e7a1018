"""The pure machine with a worker deciding: decisions, worker calls, interrupts, messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from engine.machine import (
    CallDeadline,
    CallLost,
    CallSettled,
    CancelTimer,
    ClientSubmitted,
    DecisionAnswered,
    DecisionDeadline,
    DecisionFailed,
    Deliver,
    ExecuteAnswered,
    LlmCallSettled,
    MachineError,
    MessageDelivered,
    RunDecision,
    RunExecute,
    RunLlmCall,
    StartTimer,
)
from engine.machine.request import control_request, execute_request
from tests.machine_helpers import Session, text_reply, tool_reply

SCHEMA = json.loads((Path(__file__).parents[1] / "spec" / "protocol.schema.json").read_text())
REQUEST = Draft202012Validator({"$ref": "#/properties/decision_request", **SCHEMA})

WORKER_AGENT = {
    "llm": "vendor",
    "model": "m1",
    "system": "be brief",
    "tools": [
        {
            "name": "lookup",
            "description": "worker tool",
            "input": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
            "output": {"type": "object", "required": ["hits"]},
        },
        {"name": "confirm", "description": "ask a person", "handler": "client"},
    ],
}


class WorkerSession(Session):
    """A session whose agent has a worker; answers come as inputs."""

    def start(self, text: str = "hello", **extra) -> None:
        body = {
            "type": "client.message",
            "agent_id": "a",
            "message": {"role": "user", "content": text},
            **extra,
        }
        self.last = self.apply(ClientSubmitted(body, "a", {}, self.agent, "worker"))

    def request(self) -> dict:
        req = control_request(self.state)
        errors = list(REQUEST.iter_errors(json.loads(json.dumps(req))))
        assert not errors, [e.message for e in errors]
        return req

    def answer(self, response: dict | None = None):
        """Answer the live decision; None echoes the proposal."""
        req = self.request()
        resp = req["proposed"] if response is None else response
        return self.apply(DecisionAnswered(req["decision_id"], req["attempts"], resp))

    def execute_plan(self, call_id: str) -> dict:
        """The LlmRequest an engine-run model call sends."""
        from engine.machine import build_llm_request

        return build_llm_request(self.state, self.state.calls[call_id]).request

    def execute(self, call_id: str) -> dict:
        req = execute_request(self.state, self.state.calls[call_id])
        errors = list(REQUEST.iter_errors(json.loads(json.dumps(req))))
        assert not errors, [e.message for e in errors]
        return req


def effects(t, kind):
    return [e for e in t.effects if isinstance(e, kind)]


@pytest.fixture
def w() -> WorkerSession:
    return WorkerSession(agent=json.loads(json.dumps(WORKER_AGENT)))


def test_every_trigger_waits_for_the_one_live_decision(w):
    w.start()
    assert w.types(w.last) == [
        "session.created",
        "turn.started",
        "decision.dispatched",
        "decision.queued",
    ]
    (run,) = effects(w.last, RunDecision)
    req = w.request()
    assert req["trigger"] == {"type": "session.start"} and req["decision_id"] == run.decision_id
    assert req["proposed"]["agent"]["model"] == "m1"
    t = w.answer()  # accept the file's config
    assert w.types(t) == ["decision.completed", "agent.updated", "decision.dispatched"]
    req = w.request()
    assert req["trigger"]["type"] == "client.messages"
    assert req["trigger"]["new_from"] == 0 and req["trigger"]["messages"][0]["content"] == "hello"
    assert req["proposed"] == {
        "messages": [{"role": "user", "content": "hello"}],
        "actions": [{"type": "llm.call"}],
    }
    t = w.answer()
    assert w.types(t) == [
        "decision.completed",
        "message.new",
        "llm.call.requested",
        "llm.call.dispatched",
    ]
    (llm,) = effects(t, RunLlmCall)
    t = w.apply(LlmCallSettled(llm.call_id, 1, response=text_reply("hi there")))
    assert w.request()["trigger"]["type"] == "llm.finished"
    assert w.request()["proposed"]["actions"] == [{"type": "done"}]
    w.answer()
    req = w.request()
    assert req["trigger"]["type"] == "turn.finished" and req["trigger"]["cost"] == "0.001"
    t = w.answer()
    assert w.types(t) == ["decision.completed", "turn.completed"]
    assert w.state.status == "idle"
    w.check_fold()


def _nested(levels: int) -> str:
    """`lookup` arguments `levels` deep: the object, and arrays nested in its `deep`."""
    return '{"q": "db", "deep": ' + "[" * (levels - 1) + "]" * (levels - 1) + "}"


# A model's tool-call arguments, and the input report the call gets: refused at the JSON
# edge like a client's body (engine/jsonedge.py), by name, never an engine error.
ARGUMENTS = [
    ("64 levels: the edge's limit", _nested(64), "valid", None),
    ("65 levels", _nested(65), "malformed", "arguments refused: nested deeper than 64 levels"),
    ("3000 levels", _nested(3000), "malformed", "arguments refused: nested deeper than 64 levels"),
    ("a NaN", '{"q": NaN}', "malformed", "arguments refused: NaN is not a JSON number"),
    ("a lone surrogate", '{"q": "\\ud800"}', "malformed", "arguments refused: a lone UTF-16"),
    ("not JSON", '{"q": ', "malformed", "arguments are not JSON: "),
    ("not an object", '["db"]', "malformed", "arguments are a JSON list, not an object"),
    ("off the schema", '{"q": 1}', "invalid", "q: 1 is not of type 'string'"),
]


@pytest.mark.parametrize(
    ("arguments", "status", "error"),
    [case[1:] for case in ARGUMENTS],
    ids=[case[0] for case in ARGUMENTS],
)
def test_tool_arguments_the_edge_refuses_are_a_tool_error_naming_why(w, arguments, status, error):
    w.start()
    w.answer()
    (llm,) = effects(w.answer(), RunLlmCall)
    w.apply(LlmCallSettled(llm.call_id, 1, response=tool_reply(("t1", "lookup", arguments))))
    w.answer()  # llm.finished: the call starts
    execute = w.execute("t1")
    report = execute["trigger"]["input"]
    assert report["status"] == status, report
    if error is None:
        assert "error" not in report and execute["proposed"] == {}
        return
    assert error in report["error"], report
    (action,) = execute["proposed"]["actions"]
    assert action["type"] == "tool.error" and action["error"] == report["error"]
    t = w.apply(ExecuteAnswered("t1", 1, execute["proposed"]))
    (errored,) = [e["payload"] for e in t.events if e["payload"]["type"] == "tool.call.errored"]
    assert errored["error"]["message"] == report["error"] and errored["final"]
    w.check_fold()


def test_worker_tools_run_concurrently_and_validate_input_and_output(w):
    w.start()
    w.answer()
    (llm,) = effects(w.answer(), RunLlmCall)
    reply = tool_reply(
        ("t1", "lookup", '{"q":"db"}'), ("t2", "lookup", '{"x":1}'), ("t3", "ghost", "[1]")
    )
    w.apply(LlmCallSettled(llm.call_id, 1, response=reply))
    t = w.answer()  # llm.finished: record and start the three calls
    assert sorted(e.call_id for e in effects(t, RunExecute)) == ["t1", "t2", "t3"]
    assert len(effects(t, StartTimer)) == 3  # each worker call has a deadline
    assert w.execute("t1")["trigger"]["input"] == {"status": "valid", "value": {"q": "db"}}
    bad = w.execute("t2")
    assert bad["trigger"]["input"]["status"] == "invalid"
    assert bad["proposed"]["actions"][0]["type"] == "tool.error"
    ghost = w.execute("t3")
    assert ghost["trigger"]["input"]["status"] == "malformed"
    assert "not declared" in ghost["proposed"]["actions"][0]["error"]

    # t1 answers with a result that breaks the output schema: a non-retryable tool error.
    t = w.apply(
        ExecuteAnswered("t1", 1, {"actions": [{"type": "tool.result", "result": {"no": 1}}]})
    )
    errored = [e["payload"] for e in t.events if e["payload"]["type"] == "tool.call.errored"]
    assert errored and "output schema" in errored[0]["error"]["message"] and errored[0]["final"]
    # t2 takes the proposed error; t3 answers a valid result.
    w.apply(ExecuteAnswered("t2", 1, bad["proposed"]))
    t = w.apply(
        ExecuteAnswered(
            "t3",
            1,
            {
                "actions": [
                    {
                        "type": "tool.result",
                        "structured_content": {"hits": 1},
                        "content": [{"type": "text", "text": "1 hit"}],
                    }
                ]
            },
        )
    )
    # Three tool.finished triggers went through the one decision slot, in order.
    finished = []
    while w.state.decision is not None and w.state.decision.trigger["type"] == "tool.finished":
        finished.append(w.state.decision.trigger["id"])
        proposed = w.request()["proposed"]
        last = w.answer()
    assert finished == ["t1", "t2", "t3"]
    assert proposed["actions"] == [{"type": "llm.call"}]  # only the last re-prompts
    assert effects(last, RunLlmCall)
    w.check_fold()


def test_async_tool_waits_for_a_settle_and_refuses_bad_ones(w):
    w.start()
    w.answer()
    (llm,) = effects(w.answer(), RunLlmCall)
    w.apply(LlmCallSettled(llm.call_id, 1, response=tool_reply(("t1", "lookup", '{"q":"a"}'))))
    w.answer()
    t = w.apply(ExecuteAnswered("t1", 1, {}))
    assert w.types(t) == ["tool.call.waiting"]
    assert w.apply(CallLost("t1", 1)).events == []  # a waiting call survives a restart
    with pytest.raises(MachineError) as err:
        w.apply(CallSettled("t1", 2, result={"hits": 0}))
    assert err.value.code == "stale_attempt"
    with pytest.raises(MachineError) as err:
        w.apply(CallSettled("nope", None, result="x"))
    assert err.value.code == "call_not_open"
    t = w.apply(CallSettled("t1", 1, result={"hits": 3}))
    assert "tool.call.completed" in w.types(t)
    with pytest.raises(MachineError):
        w.apply(CallSettled("t1", 1, result={"hits": 3}))
    w.check_fold()


def test_async_tool_deadline_ends_the_call(w):
    w.start()
    w.answer()
    (llm,) = effects(w.answer(), RunLlmCall)
    w.apply(LlmCallSettled(llm.call_id, 1, response=tool_reply(("t1", "lookup", '{"q":"a"}'))))
    t = w.answer()
    (timer,) = effects(t, StartTimer)
    w.apply(ExecuteAnswered("t1", 1, {}))
    t = w.apply(timer.input)
    errored = [e["payload"] for e in t.events if e["payload"]["type"] == "tool.call.errored"]
    assert errored[0]["error"]["code"] == "deadline_exceeded" and errored[0]["final"]
    assert w.apply(CallDeadline("t1", 1)).events == []
    w.check_fold()


@pytest.mark.parametrize(
    ("response", "reason"),
    [
        ({"actions": [{"type": "tool.result", "id": "nope", "result": 1}]}, "not open"),
        ({"actions": [{"type": "llm.result", "response": {"model": "m"}}]}, "must name the call"),
        (
            {"actions": [{"type": "connector.sync", "path": "mcp.conn-1"}]},
            "the agent names no connection 'mcp.conn-1'",
        ),
    ],
)
def test_an_answer_that_does_not_fit_the_session_is_a_failed_attempt(w, response, reason):
    w.agent["retry"] = {"default": {"backoff_base_secs": 0}}
    w.start()
    before = w.request()
    t = w.answer(response)
    assert w.types(t) == ["decision.errored", "decision.dispatched"]
    errored = t.events[0]["payload"]
    assert errored["error"]["code"] == "invalid_response" and reason in errored["error"]["message"]
    again = w.request()
    assert again["decision_id"] == before["decision_id"] and again["attempts"] == 2
    w.answer()  # the next attempt recovers
    assert w.state.agent["model"] == "m1"
    w.check_fold()


def test_a_worker_that_keeps_failing_fails_the_turn_cleanly(w):
    w.agent["retry"] = {"default": {"backoff_base_secs": 0, "max_attempts": 3}}
    w.start()
    error = {"message": "worker answered 401: bad signature", "code": "worker_unreachable"}
    for _ in range(3):
        req = w.request()
        t = w.apply(DecisionFailed(req["decision_id"], req["attempts"], error))
    assert w.types(t)[-2:] == ["decision.errored", "turn.failed"]
    assert t.events[-1]["payload"]["error"]["code"] == "worker_unreachable"
    assert w.state.decision is None and w.state.pending == [] and w.state.status == "idle"
    w.check_fold()


def test_a_decision_nobody_answers_is_ended_by_its_deadline_timer(w):
    """The engine waiting for the worker lost the answer (a crash, Redis gone): the
    timer started with the decision fails the attempt, and the next one goes out."""
    w.start()
    (run,) = effects(w.last, RunDecision)
    (timer,) = effects(w.last, StartTimer)
    assert timer == StartTimer(run.deadline + 1000, DecisionDeadline(run.decision_id, 1))
    t = w.apply(timer.input)
    assert w.types(t) == ["decision.errored", "call.retry_scheduled"]
    assert t.events[0]["payload"]["error"]["code"] == "deadline_exceeded"
    assert CancelTimer(timer.due, timer.input) in t.effects
    assert w.apply(timer.input).events == []  # a second firing finds nothing to end
    w.check_fold()


def test_a_worker_that_never_answers_fails_the_turn_by_deadlines_alone(w):
    w.agent["retry"] = {"default": {"backoff_base_secs": 0, "max_attempts": 3}}
    w.start()
    for _ in range(3):
        (timer,) = effects(w.last, StartTimer)
        w.last = w.apply(timer.input)
    assert w.types(w.last)[-2:] == ["decision.errored", "turn.failed"]
    assert w.last.events[-1]["payload"]["error"]["code"] == "deadline_exceeded"
    assert w.state.status == "idle" and w.state.decision is None
    w.check_fold()


def test_a_lost_decision_is_sent_again_with_the_same_id(w):
    w.start()
    req = w.request()
    t = w.apply(CallLost(req["decision_id"], 1))
    (run,) = effects(t, RunDecision)
    assert run.decision_id == req["decision_id"] and run.attempt == 2
    late = w.apply(DecisionAnswered(req["decision_id"], 1, {}))
    assert late.events == [] and late.ignored
    w.answer()
    assert w.apply(DecisionAnswered(req["decision_id"], 2, {})).events == []  # never applied twice
    w.check_fold()


def test_interrupt_pauses_refuses_messages_and_resumes_once(w):
    w.start()
    w.answer()
    payload = {
        "message": "Restart prod?",
        "metadata": {"options": [{"label": "Yes", "value": "y"}]},
    }
    t = w.answer(
        {
            "actions": [
                {
                    "type": "interrupt",
                    "interrupt_id": "i1",
                    "reason": "approval",
                    "payload": payload,
                }
            ]
        }
    )
    assert "session.interrupted" in w.types(t) and w.state.status == "interrupted"
    assert not effects(t, RunLlmCall)
    with pytest.raises(MachineError) as err:
        w.client(
            {
                "type": "client.message",
                "agent_id": "a",
                "message": {"role": "user", "content": "x"},
                "queue": True,
            }
        )
    assert err.value.code == "session_interrupted" and err.value.detail["interrupt_id"] == "i1"
    t = w.client({"type": "interrupt.resume", "interrupt_id": "i1", "payload": {"value": "y"}})
    assert w.types(t) == ["session.interrupt_resumed", "decision.dispatched"]
    req = w.request()
    assert req["trigger"] == {
        "type": "interrupt.resumed",
        "interrupt_id": "i1",
        "payload": {"value": "y"},
    }
    assert req["proposed"] == {"actions": [{"type": "llm.call"}]}
    again = w.client({"type": "interrupt.resume", "interrupt_id": "i1"})
    assert again.events == [] and again.reply["resumed"] is False
    w.check_fold()


def test_message_send_leaves_through_an_effect_and_arrives_once():
    sender = WorkerSession(agent=json.loads(json.dumps(WORKER_AGENT)))
    sender.start()
    sender.answer()
    t = sender.answer(
        {
            "actions": [
                {
                    "type": "message.send",
                    "session_id": "s2",
                    "message": {"role": "user", "content": "ping"},
                },
                {"type": "done"},
            ]
        }
    )
    (send,) = effects(t, Deliver)
    assert send.to == "s2" and isinstance(send.input, MessageDelivered)
    assert send.input.message["id"].startswith("s1:")

    target = Session(session_id="s2")
    run = next(e for e in target.say("hi").effects if isinstance(e, RunLlmCall))
    t = target.apply(send.input)
    assert target.types(t) == ["turn.queued"]  # busy: it waits its turn
    assert target.apply(send.input).events == []  # a duplicate
    target.apply(LlmCallSettled(run.call_id, 1, response=text_reply("ok")))
    contents = [
        n.message["content"] for n in target.state.nodes.values() if n.message["role"] == "user"
    ]
    assert contents == ["hi", "ping"]
    assert target.apply(send.input).events == []
    assert Session(session_id="s3").apply(send.input).ignored
    target.check_fold()


def test_worker_run_model_call_from_the_seed_config(w):
    w.start()
    seed_agent = {
        "model": "claude-haiku-4-5",
        "stream": True,
        "handler": "worker",
        "format": "anthropic",
    }
    t = w.answer({"agent": seed_agent})
    t = w.answer()
    (run,) = effects(t, RunExecute)
    req = w.execute(run.call_id)
    assert req["trigger"]["type"] == "llm.execute" and req["trigger"]["format"] == "anthropic"
    assert req["trigger"]["stream"] is True
    assert "handler" not in (req["agent"] or {})  # our extension stays off the wire
    resp = {"actions": [{"type": "llm.result", "response": text_reply("from the worker")}]}
    t = w.apply(ExecuteAnswered(run.call_id, 1, resp))
    assert w.request()["trigger"]["type"] == "llm.finished"
    assert w.request()["trigger"]["message"]["content"] == "from the worker"
    empty = w.apply(ExecuteAnswered(run.call_id, 1, {}))
    assert empty.events == [] and empty.ignored
    w.check_fold()


def test_a_client_interrupts_the_running_turn(w):
    from engine.machine import InterruptRequested

    with pytest.raises(MachineError):
        Session().apply(InterruptRequested("stop"))
    w.start()
    t = w.apply(InterruptRequested("hold on", {"message": "Wait for me"}))
    assert w.types(t) == ["session.interrupted"]
    assert t.events[0]["payload"]["origin"] == "client"
    iid = t.reply["interrupt_id"]
    assert w.state.status == "interrupted"
    t = w.client({"type": "interrupt.resume", "interrupt_id": iid})
    assert t.reply["resumed"] is True
    w.check_fold()


def test_a_worker_call_lost_or_unreachable_is_sent_again_despite_one_attempt(w):
    from engine.machine import ExecuteFailed

    w.agent["retry"] = {"default": {"backoff_base_secs": 0}}
    w.start()
    w.answer()
    (llm,) = effects(w.answer(), RunLlmCall)
    w.apply(LlmCallSettled(llm.call_id, 1, response=tool_reply(("t1", "lookup", '{"q":"a"}'))))
    w.answer()
    assert w.state.calls["t1"].retry["max_attempts"] == 1
    t = w.apply(CallLost("t1", 1))
    assert [e.attempt for e in effects(t, RunExecute)] == [2]
    error = {"message": "cannot reach the worker", "code": "worker_unreachable"}
    t = w.apply(ExecuteFailed("t1", 2, error))
    assert [e.attempt for e in effects(t, RunExecute)] == [3]  # the decision policy: 10 attempts
    w.check_fold()


def test_failing_the_parents_turn_stops_its_running_child(w):
    from engine.machine import ChildCancelled, ChildSpawned, SubagentFinished

    w.agent["subagents"] = [{"id": "helper", "description": "helps"}]
    w.agent["max_subagent_depth"] = 5
    w.start()
    w.answer()
    (llm,) = effects(w.answer(), RunLlmCall)
    assert "helper" in [t["name"] for t in w.execute_plan(llm.call_id)["tools"]]
    spawn = tool_reply(("c1", "helper", '{"message":"go"}'), ("c2", "confirm", "{}"))
    w.apply(LlmCallSettled(llm.call_id, 1, response=spawn))
    assert w.request()["proposed"]["actions"][0]["type"] == "subagent.spawn"
    t = w.answer()
    (spawned,) = [e for e in effects(t, Deliver) if isinstance(e.input, ChildSpawned)]
    assert spawned.to == "s1~c1" and spawned.input.ancestry == ["s1"]

    child = Session(session_id="s1~c1")
    child_run = next(e for e in child.apply(spawned.input).effects if isinstance(e, RunLlmCall))
    assert child.state.ancestry == ["s1"] and child.state.turn.parent["call_id"] == "c1"

    # The client answers its tool; the worker, deciding on that, fails the turn.
    w.client({"type": "tool.result", "id": "c2", "result": "no"})
    error = {"message": "giving up", "code": "handler_error"}
    t = w.answer({"actions": [{"type": "fail", "error": error}]})
    (cancel,) = [e for e in effects(t, Deliver) if isinstance(e.input, ChildCancelled)]
    assert cancel.to == "s1~c1"
    t = child.apply(cancel.input)
    assert child.types(t)[-1] == "turn.failed" and child_run.call_id not in child.state.calls
    (back,) = [e for e in t.effects if isinstance(e, Deliver)]
    assert isinstance(back.input, SubagentFinished) and not back.input.ok
    late = w.apply(back.input)
    assert late.events == [] and late.ignored  # the parent's call is already closed
    w.check_fold()
    child.check_fold()


def test_a_subagent_past_its_total_timeout_is_a_tool_error_and_its_child_stops(w):
    from engine.machine import ChildCancelled, SubagentStarted

    w.agent["subagents"] = [{"id": "helper", "description": "helps"}]
    w.agent["retry"] = {"subagent": {"total_timeout_secs": 60}}
    w.start()
    w.answer()
    (llm,) = effects(w.answer(), RunLlmCall)
    w.apply(
        LlmCallSettled(llm.call_id, 1, response=tool_reply(("c1", "helper", '{"message":"go"}')))
    )
    w.answer()
    # Once the child's turn has started, only the call's total timeout is left.
    t = w.apply(SubagentStarted("s1~c1", "c1"))
    (timer,) = [e for e in effects(t, StartTimer) if e.input == CallDeadline("c1", 1)]
    assert timer.due == w.state.calls["c1"].started_at + 60_000
    t = w.apply(timer.input)
    (errored,) = [e["payload"] for e in t.events if e["payload"]["type"] == "tool.call.errored"]
    assert errored["final"] and errored["error"]["code"] == "deadline_exceeded"
    (cancel,) = [e for e in effects(t, Deliver) if isinstance(e.input, ChildCancelled)]
    assert cancel.to == "s1~c1"
    assert "c1" not in w.state.calls and w.request()["trigger"]["type"] == "tool.finished"
    w.check_fold()


def test_a_spawn_naming_a_busy_or_unknown_child_is_a_tool_error(w):
    w.agent["subagents"] = [{"id": "helper", "description": "helps"}]
    w.agent["max_subagent_depth"] = 5
    w.start()
    w.answer()
    (llm,) = effects(w.answer(), RunLlmCall)
    calls = (("c1", "helper", '{"message":"a"}'), ("c2", "confirm", "{}"))
    w.apply(LlmCallSettled(llm.call_id, 1, response=tool_reply(*calls)))
    w.answer()  # spawn c1's child, open the client tool c2
    child = next(iter(w.state.children))
    w.client({"type": "tool.result", "id": "c2", "result": "ok"})

    def spawn(call_id: str, session: str) -> dict:
        return {
            "type": "subagent.spawn",
            "agent_id": "helper",
            "tool_call_id": call_id,
            "message": {"role": "user", "content": "again"},
            "session_id": session,
        }

    t = w.answer({"actions": [spawn("c3", child), spawn("c4", "elsewhere")]})
    errors = {
        e["payload"]["id"]: e["payload"]["error"]["message"]
        for e in t.events
        if e["payload"]["type"] == "tool.call.errored"
    }
    assert "busy with call 'c1'" in errors["c3"]
    assert "not an earlier child" in errors["c4"]
    assert list(w.state.children) == [child]
    w.check_fold()


def test_a_turns_events_stay_the_same_size_as_the_session_grows(w):
    """The `client.messages` trigger keeps where the recorded path ends, not the path: the
    worker still gets the whole view (path, then the new message), and each turn writes
    about the same bytes at turn 2 as at turn 30."""
    written = []
    for turn in range(30):
        text = f"question {turn}"
        if turn == 0:
            w.start(text)
        else:
            body = {"type": "client.message", "agent_id": "a"}
            body["message"] = {"role": "user", "content": text}
            w.last = w.apply(ClientSubmitted(body, "a", {}, w.agent, "worker"))
        size = sum(len(json.dumps(e)) for e in w.last.events)
        while w.state.decision is not None:
            req = w.request()
            if req["trigger"]["type"] == "client.messages":
                path = [n["message"] for n in req["message_tree"]["nodes"]]
                assert req["trigger"]["messages"] == [*path, {"role": "user", "content": text}]
                assert req["trigger"]["new_from"] == len(path) == 2 * turn
                reply = {"role": "assistant", "content": f"answer {turn}"}
                response = {"messages": [*req["proposed"]["messages"], reply]}
            else:
                response = {}
            t = w.apply(DecisionAnswered(req["decision_id"], req["attempts"], response))
            size += sum(len(json.dumps(e)) for e in t.events)
        assert w.state.turn is None
        written.append(size)
    w.check_fold()
    assert max(written[1:]) < 1.2 * min(written[1:]), written


def test_actions_after_done_do_not_run_in_the_next_queued_turn(w):
    """`done` ends the turn: the answer's later actions have no turn to act in, and the
    queued turn starts afterwards with its own first decision, not with them."""
    w.start()
    w.answer()  # session.start
    w.answer({"actions": [{"type": "done"}]})  # the worker is asked `turn.finished`
    assert w.request()["trigger"]["type"] == "turn.finished"
    w.say("second", queue=True)
    t = w.answer({"actions": [{"type": "done"}, {"type": "llm.call"}]})
    assert w.types(t) == [
        "decision.completed",
        "turn.completed",
        "turn.started",
        "decision.dispatched",
    ]
    assert not effects(t, RunLlmCall)
    assert w.request()["trigger"]["type"] == "client.messages"
    w.check_fold()


def test_a_call_that_cannot_run_beside_fail_closes_with_the_turn(w):
    """A call the answer starts that cannot run (a spawn of an agent that is no subagent)
    and a `fail`: the turn ends and closes the call once; the input is not a crash."""
    w.start()
    w.answer()  # session.start
    spawn = {"type": "subagent.spawn", "agent_id": "ghost", "tool_call_id": "x1"}
    spawn["message"] = {"role": "user", "content": "hi"}
    error = {"message": "given up", "code": "handler_error"}
    t = w.answer({"actions": [spawn, {"type": "fail", "error": error}]})
    assert w.types(t) == [
        "decision.completed",
        "tool.call.requested",
        "tool.call.errored",
        "turn.failed",
    ]
    [errored] = [e["payload"] for e in t.events if e["payload"]["type"] == "tool.call.errored"]
    assert errored["error"]["detail"] == {"reason": "turn_ended"}
    assert w.state.status == "idle"
    w.check_fold()
