"""The pure machine, driven without Redis or HTTP."""

from __future__ import annotations

import pytest

from engine.machine import (
    CallDeadline,
    CallLost,
    CancelRequested,
    CancelTimer,
    LlmCallSettled,
    MachineError,
    RunLlmCall,
    StartTimer,
    TimerFired,
    build_llm_request,
    input_from_json,
    input_to_json,
    state_from_json,
    state_to_json,
)
from engine.machine.core import iso
from tests.machine_helpers import Session, text_reply, tool_reply


def test_every_attempt_in_flight_has_a_deadline_timer_that_ends_it():
    """A model call whose completion the shell lost is ended by its deadline timer."""
    s = Session()
    t = s.say("hi")
    run = only_llm(t)
    (timer,) = [e for e in t.effects if isinstance(e, StartTimer)]
    assert timer == StartTimer(run.deadline + 1000, CallDeadline(run.call_id, 1))
    t = s.apply(timer.input)
    assert s.types(t) == ["llm.call.errored", "call.retry_scheduled"]
    assert t.events[0]["payload"]["error"]["code"] == "deadline_exceeded"
    assert CancelTimer(timer.due, timer.input) in t.effects
    assert s.apply(timer.input).events == []  # fired twice: the attempt is over
    (backoff,) = [e for e in t.effects if isinstance(e, StartTimer)]
    t = s.apply(backoff.input)
    retry = only_llm(t)
    assert retry.attempt == 2
    assert StartTimer(retry.deadline + 1000, CallDeadline(run.call_id, 2)) in t.effects
    s.check_fold()


def only_llm(t) -> RunLlmCall:
    runs = [e for e in t.effects if isinstance(e, RunLlmCall)]
    assert len(runs) == 1, t.effects
    return runs[0]


def test_a_turn_from_first_message_to_reply():
    s = Session()
    t = s.say("what's paging?")
    assert s.types(t) == [
        "session.created",
        "turn.started",
        "agent.updated",
        "message.new",
        "llm.call.requested",
        "llm.call.dispatched",
    ]
    assert t.reply == {"session_id": "s1", "turn_id": "turn-1", "queued": False}
    run = only_llm(t)
    plan = build_llm_request(s.state, s.state.calls[run.call_id])
    assert plan.llm == "vendor" and plan.stream is True
    assert plan.request["messages"] == [
        {"role": "system", "content": "be brief"},
        {"id": "msg-2", "role": "user", "content": "what's paging?"},
    ]
    assert [tool["name"] for tool in plan.request["tools"]] == ["confirm", "lookup"]

    t = s.apply(LlmCallSettled(run.call_id, 1, response=text_reply("all quiet")))
    assert s.types(t) == ["llm.call.completed", "message.new", "turn.completed"]
    done = t.events[-1]["payload"]
    assert done["cost"] == "0.001" and done["usage"]["total"] == 15
    assert s.state.status == "idle" and s.state.cost == "0.001"
    reply = s.state.nodes[run.call_id].message
    assert reply == {"id": run.call_id, "role": "assistant", "content": "all quiet"}
    s.check_fold()


def test_second_message_while_running_is_refused_and_queue_runs_fifo():
    s = Session()
    first = only_llm(s.say("one"))
    with pytest.raises(MachineError) as err:
        s.say("two")
    assert err.value.code == "turn_already_active" and err.value.detail["turn_id"] == "turn-1"
    q2 = s.say("two", queue=True)
    q3 = s.say("three", queue=True)
    assert q2.reply["queued"] and q3.reply["queued"]
    assert s.types(q2) == ["turn.queued"]
    t = s.apply(LlmCallSettled(first.call_id, 1, response=text_reply("1")))
    assert s.types(t)[-4:] == [
        "turn.started",
        "message.new",
        "llm.call.requested",
        "llm.call.dispatched",
    ]
    assert s.state.turn.id == q2.reply["turn_id"]
    second = only_llm(t)
    t = s.apply(LlmCallSettled(second.call_id, 1, response=text_reply("2")))
    assert s.state.turn.id == q3.reply["turn_id"]
    user_texts = [
        n.message["content"] for n in s.state.nodes.values() if n.message["role"] == "user"
    ]
    assert user_texts == ["one", "two", "three"]
    s.check_fold()


def test_turn_id_is_an_idempotency_key():
    s = Session()
    first = s.say("once", turn_id="T1")
    run = only_llm(first)
    again = s.say("once", turn_id="T1")
    assert again.events == [] and again.reply["turn_id"] == "T1" and again.reply["existing"]
    s.apply(LlmCallSettled(run.call_id, 1, response=text_reply("ok")))
    after = s.say("once", turn_id="T1")
    assert after.events == [] and s.state.turns["T1"] == "completed"
    s.check_fold()


def test_client_tool_round_trip():
    s = Session()
    run = only_llm(s.say("restart the db?"))
    t = s.apply(LlmCallSettled(run.call_id, 1, response=tool_reply(("c1", "confirm", '{"q":1}'))))
    assert s.types(t) == [
        "llm.call.completed",
        "message.new",
        "tool.call.requested",
        "tool.call.dispatched",
    ]
    # Nothing to run for a client tool (it has no deadline); the model call's deadline goes.
    assert t.effects == [CancelTimer(run.deadline + 1000, CallDeadline(run.call_id, 1))]
    assert s.state.calls["c1"].handler == "client"
    with pytest.raises(MachineError) as err:
        s.client({"type": "tool.result", "id": "nope", "result": "x"})
    assert err.value.code == "call_not_open"
    t = s.client({"type": "tool.result", "id": "c1", "result": {"ok": True}})
    assert s.types(t) == [
        "tool.call.completed",
        "message.new",
        "llm.call.requested",
        "llm.call.dispatched",
    ]
    tool_msg = t.events[1]["payload"]["message"]
    assert tool_msg["role"] == "tool" and tool_msg["tool_call_id"] == "c1"
    assert tool_msg["content"] == '{"ok":true}'
    t = s.apply(LlmCallSettled(only_llm(t).call_id, 1, response=text_reply("restarted")))
    assert s.types(t)[-1] == "turn.completed"
    s.check_fold()


def test_parallel_calls_reprompt_only_when_all_are_settled():
    s = Session()
    run = only_llm(s.say("two things"))
    calls = (("c1", "confirm", "{}"), ("c2", "confirm", "{}"))
    s.apply(LlmCallSettled(run.call_id, 1, response=tool_reply(*calls)))
    t = s.client({"type": "tool.result", "id": "c2", "result": "b"})
    assert s.types(t) == ["tool.call.completed", "message.new"]
    t = s.client({"type": "tool.error", "id": "c1", "error": "no", "retryable": False})
    assert s.types(t) == [
        "tool.call.errored",
        "message.new",
        "llm.call.requested",
        "llm.call.dispatched",
    ]
    plan = build_llm_request(s.state, s.state.calls[only_llm(t).call_id])
    assert [m["role"] for m in plan.request["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
    ]
    s.check_fold()


def test_a_tool_nothing_can_run_becomes_an_error_result_for_the_model():
    s = Session()
    run = only_llm(s.say("look it up"))
    t = s.apply(
        LlmCallSettled(
            run.call_id, 1, response=tool_reply(("c1", "lookup", "{}"), ("c2", "ghost", "{}"))
        )
    )
    types = s.types(t)
    assert types.count("tool.call.errored") == 2 and types[-1] == "llm.call.dispatched"
    assert types.count("llm.call.requested") == 1
    errors = [
        e["payload"]["message"].get("content")
        for e in t.events
        if e["payload"]["type"] == "message.new"
    ]
    assert (
        "Error: no worker runs 'lookup'" in errors
        and "Error: tool 'ghost' is not declared" in errors
    )
    s.check_fold()


def test_retryable_error_backs_off_then_retries_and_final_error_fails_the_turn():
    s = Session()
    run = only_llm(s.say("hi"))
    err = {"message": "rate limited", "code": "rate_limited"}
    t = s.apply(LlmCallSettled(run.call_id, 1, error=err, retryable=True, retry_after=3))
    assert s.types(t) == ["llm.call.errored", "call.retry_scheduled"]
    timer, cancelled = t.effects
    assert cancelled == CancelTimer(run.deadline + 1000, CallDeadline(run.call_id, 1))
    assert isinstance(timer, StartTimer) and timer.due == s.now + 3000
    assert timer.input == TimerFired(run.call_id, 2)
    stale = s.apply(TimerFired(run.call_id, 5))
    assert stale.events == [] and stale.ignored
    t = s.apply(timer.input)
    assert s.types(t) == ["llm.call.dispatched"] and only_llm(t).attempt == 2
    late = s.apply(LlmCallSettled(run.call_id, 1, response=text_reply("late")))
    assert late.events == [] and "replaced" in late.ignored
    t = s.apply(
        LlmCallSettled(run.call_id, 2, error={"message": "bad key", "code": "provider_error"})
    )
    assert s.types(t) == ["llm.call.errored", "turn.failed"]
    assert t.events[-1]["payload"]["error"]["message"] == "bad key"
    assert s.state.status == "idle"
    s.check_fold()


def test_attempts_are_capped_by_the_policy():
    s = Session()
    s.agent["retry"] = {"llm": {"max_attempts": 2, "backoff_base_secs": 0}}
    run = only_llm(s.say("hi"))
    err = {"message": "overloaded", "code": "provider_error"}
    t = s.apply(LlmCallSettled(run.call_id, 1, error=err, retryable=True))
    assert s.types(t) == ["llm.call.errored", "llm.call.dispatched"]  # no backoff: at once
    t = s.apply(LlmCallSettled(run.call_id, 2, error=err, retryable=True))
    assert s.types(t) == ["llm.call.errored", "turn.failed"]
    s.check_fold()


def test_lost_call_is_sent_again_at_once_as_attempt_two():
    s = Session()
    run = only_llm(s.say("hi"))
    t = s.apply(CallLost(run.call_id, 1))
    assert s.types(t) == ["llm.call.errored", "llm.call.dispatched"]
    assert only_llm(t).attempt == 2
    assert s.apply(CallLost(run.call_id, 1)).events == []
    s.apply(LlmCallSettled(run.call_id, 2, response=text_reply("ok")))
    replies = [n for n in s.state.nodes.values() if n.message["role"] == "assistant"]
    assert len(replies) == 1
    s.check_fold()


@pytest.mark.parametrize(
    ("finish", "code"), [("length", "provider_error"), ("content_filter", "refused")]
)
def test_truncated_or_refused_reply_is_recorded_and_fails_the_turn(finish, code):
    s = Session()
    run = only_llm(s.say("hi"))
    reply = text_reply("partial") | {"finish_reason": finish}
    t = s.apply(LlmCallSettled(run.call_id, 1, response=reply))
    assert s.types(t) == ["llm.call.completed", "message.new", "turn.failed"]
    assert t.events[-1]["payload"]["error"]["code"] == code
    s.check_fold()


def test_failing_a_turn_closes_its_open_calls():
    s = Session()
    s.agent["retry"] = {"llm": {"max_attempts": 1}}
    run = only_llm(s.say("hi"))
    t = s.apply(LlmCallSettled(run.call_id, 1, response=tool_reply(("c1", "confirm", "{}"))))
    assert "c1" in s.state.calls
    # The client answers, the re-prompt fails for good: nothing stays open.
    t = s.client({"type": "tool.result", "id": "c1", "result": "yes"})
    t = s.apply(
        LlmCallSettled(only_llm(t).call_id, 1, error={"message": "x", "code": "provider_error"})
    )
    assert s.state.calls == {} and s.types(t)[-1] == "turn.failed"
    s.check_fold()


def test_a_cancel_fails_the_running_turn_and_the_queued_one_starts():
    s = Session()
    with pytest.raises(MachineError) as err:
        s.apply(CancelRequested("stop"))
    assert err.value.status == 404
    run = only_llm(s.say("hi"))
    s.say("next", queue=True)
    t = s.apply(input_from_json(input_to_json(CancelRequested("wrong question"))))
    assert s.types(t)[:3] == ["llm.call.errored", "turn.failed", "turn.started"]
    failed = t.events[1]
    assert t.reply == {"session_id": "s1", "turn_id": failed["turn_id"]}
    assert failed["payload"]["error"] == {
        "message": "cancelled by the client: wrong question",
        "code": "handler_error",
        "detail": {"cancelled": True, "reason": "wrong question"},
    }
    assert CancelTimer in {type(e) for e in t.effects}  # the call's deadline is disarmed
    late = s.apply(LlmCallSettled(run.call_id, 1, response=text_reply("late")))
    assert late.events == [] and late.ignored
    s.check_fold()
    s.apply(LlmCallSettled(only_llm(t).call_id, 1, response=text_reply("ok")))
    with pytest.raises(MachineError) as err:
        s.apply(CancelRequested())
    assert err.value.code == "no_turn_running" and err.value.status == 409


def test_unknown_session_and_agent_mismatch_are_refused():
    s = Session()
    with pytest.raises(MachineError) as err:
        s.client({"type": "tool.result", "id": "c1", "result": "x"})
    assert err.value.status == 404
    s.say("hi")
    body = {"type": "client.message", "agent_id": "b", "message": {"role": "user", "content": "x"}}
    from engine.machine import ClientSubmitted

    with pytest.raises(MachineError) as err:
        s.apply(ClientSubmitted(body, "b", {}, None))
    assert err.value.code == "agent_mismatch"


def test_snapshot_and_inputs_round_trip_through_json():
    s = Session()
    run = only_llm(s.say("hi"))
    assert state_to_json(state_from_json(state_to_json(s.state))) == state_to_json(s.state)
    inp = LlmCallSettled(run.call_id, 1, response=text_reply("x"), retry_after=1.5)
    assert input_from_json(input_to_json(inp)) == inp


def test_stored_inputs_carry_explicit_wire_names_and_old_items_still_read():
    """Inputs are stored by a name of their own, not their class's (a rename would strand
    every timer, outbox entry and dead letter in Redis); what an older version stored under
    the class's name reads all the same."""
    from typing import get_args

    from engine.machine import Input
    from engine.machine.inputs import WIRE_NAMES

    assert set(WIRE_NAMES) == set(get_args(Input)), "every input kind needs its wire name"
    assert len(set(WIRE_NAMES.values())) == len(WIRE_NAMES)
    assert all(name != cls.__name__ and "." in name for cls, name in WIRE_NAMES.items())
    fired = TimerFired("call_1", 2)
    stored = input_to_json(fired)
    assert stored == {"kind": "timer.fired", "call_id": "call_1", "attempt": 2}
    assert input_from_json(stored) == fired
    assert input_from_json({**stored, "kind": "TimerFired"}) == fired  # an older version's
    with pytest.raises(ValueError, match="unknown input kind"):
        input_from_json({**stored, "kind": "timer.fires"})


@pytest.mark.parametrize(
    ("name", "args", "recorded"),
    [
        ("oncall", {"text": "ack INC-42", "user_id": "U1"}, "/oncall ack INC-42"),
        ("oncall", {"text": ""}, "/oncall"),
        ("approve_button", {"value": "x"}, None),  # not a slash command: nothing proposed
    ],
)
def test_a_slash_command_action_records_the_command_and_calls_the_model(name, args, recorded):
    from engine.machine import ClientSubmitted

    s = Session()
    body = {"type": "client.action", "agent_id": "a", "name": name, "args": args}
    t = s.apply(ClientSubmitted(body, "a", {}, s.agent, slash_commands=("/oncall",)))
    users = [n.message["content"] for n in s.state.nodes.values() if n.message["role"] == "user"]
    if recorded is None:
        assert users == [] and s.types(t)[-1] == "turn.completed"
    else:
        assert users == [recorded] and s.types(t)[-1] == "llm.call.dispatched"
    s.check_fold()


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "1970-01-01T00:00:00.000Z"),
        (1, "1970-01-01T00:00:00.001Z"),
        (-1, "1969-12-31T23:59:59.999Z"),
        (1_764_770_000_999, "2025-12-03T13:53:20.999Z"),
        (253_402_300_799_999, "9999-12-31T23:59:59.999Z"),  # no float rounding
    ],
)
def test_occurred_at_is_rfc3339_utc_to_the_millisecond(ms: int, text: str) -> None:
    assert iso(ms) == text
