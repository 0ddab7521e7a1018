"""Queue timeouts in the pure machine (SPEC §11): what waits in a queue, for how long,
and what happens when the wait is over.

Two waits are queues here: a turn sent with `queue: true` behind a running one (no limit
unless `retry.default.queue_timeout_secs` sets one), and a subagent call between its
dispatch and the child's turn starting (the `subagent` policy's).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from engine.machine import (
    CallDeadline,
    CancelTimer,
    ChildCancelled,
    ChildSpawned,
    ClientSubmitted,
    Deliver,
    LlmCallSettled,
    QueueDeadline,
    RunLlmCall,
    StartTimer,
    SubagentFinished,
    SubagentStarted,
    TimerFired,
)
from tests.machine_helpers import AGENT, Session, text_reply, tool_reply


def timers(t, kind: type) -> list[StartTimer]:
    return [e for e in t.effects if isinstance(e, StartTimer) and isinstance(e.input, kind)]


def payloads(t, kind: str) -> list[dict[str, Any]]:
    return [e["payload"] for e in t.events if e["payload"]["type"] == kind]


def only_llm(t) -> RunLlmCall:
    (run,) = [e for e in t.effects if isinstance(e, RunLlmCall)]
    return run


@pytest.mark.parametrize(
    ("retry", "secs"),
    [
        ({"default": {"queue_timeout_secs": 7}}, 7),
        ({"default": {"queue_timeout_secs": 7}, "llm": {"queue_timeout_secs": 3}}, 7),
        ({"default": {"queue_timeout_secs": 60}, "tool": {"queue_timeout_secs": 1}}, 60),
    ],
)
def test_a_queued_turn_waits_at_most_its_queue_timeout_then_fails_unrun(retry, secs):
    agent = copy.deepcopy(AGENT)
    if retry is not None:
        agent["retry"] = retry
    s = Session(agent=agent)
    first = only_llm(s.say("one"))
    q = s.say("two", queue=True)
    queued_id = q.reply["turn_id"]
    (timer,) = timers(q, QueueDeadline)
    assert timer == StartTimer(s.now + secs * 1000, QueueDeadline(queued_id))
    assert payloads(q, "turn.queued")[0]["deadline_ms"] == timer.due

    s.now = timer.due
    t = s.apply(timer.input)
    assert s.types(t) == ["turn.failed"]
    failed = t.events[0]
    assert failed["turn_id"] == queued_id
    error = failed["payload"]["error"]
    assert error["code"] == "deadline_exceeded"
    assert error["detail"] == {
        "timeout": "queue",
        "reason": "queue_timeout",
        "queue_timeout_secs": secs,
    }
    assert f"({secs} s)" in error["message"]
    assert CancelTimer(timer.due, timer.input) in t.effects
    # It never ran; the running turn runs on, and ends with nothing queued behind it.
    assert s.state.turns[queued_id] == "failed" and not s.state.queue
    assert s.state.turn is not None and s.state.turn.id == "turn-1"
    assert [n.message["content"] for n in s.state.nodes.values()] == ["one"]
    t = s.apply(LlmCallSettled(first.call_id, 1, response=text_reply("1")))
    assert s.types(t)[-1] == "turn.completed" and s.state.turn is None
    # A client asking for that turn again is told it failed, not run a second time.
    again = s.say("two", queue=True, turn_id=queued_id)
    assert again.reply["existing"] and again.events == []
    s.check_fold()


@pytest.mark.parametrize(
    "retry",
    [None, {"llm": {"queue_timeout_secs": 5}}, {"subagent": {"queue_timeout_secs": 5}}],
)
def test_without_retry_default_a_queued_turn_waits_as_long_as_it_takes(retry):
    agent = copy.deepcopy(AGENT)
    if retry is not None:
        agent["retry"] = retry
    s = Session(agent=agent)
    first = only_llm(s.say("one"))
    q = s.say("two", queue=True)
    assert not timers(q, QueueDeadline) and "deadline_ms" not in payloads(q, "turn.queued")[0]
    s.now += 3_600_000  # an hour later the first turn ends, and the second runs
    t = s.apply(LlmCallSettled(first.call_id, 1, response=text_reply("1")))
    assert s.state.turn is not None and s.state.turn.id == q.reply["turn_id"]
    assert only_llm(t)
    s.check_fold()


def test_a_queued_turn_that_starts_in_time_cancels_its_timer_and_a_late_one_is_ignored():
    agent = copy.deepcopy(AGENT)
    agent["retry"] = {"default": {"queue_timeout_secs": 60}}
    s = Session(agent=agent)
    first = only_llm(s.say("one"))
    q2 = s.say("two", queue=True)
    q3 = s.say("three", queue=True)
    (t2,) = timers(q2, QueueDeadline)
    (t3,) = timers(q3, QueueDeadline)
    t = s.apply(LlmCallSettled(first.call_id, 1, response=text_reply("1")))
    assert s.state.turn.id == q2.reply["turn_id"]
    assert CancelTimer(t2.due, t2.input) in t.effects  # started: its queue is over
    assert CancelTimer(t3.due, t3.input) not in t.effects  # still waiting
    late = s.apply(t2.input)
    assert late.events == [] and "no longer queued" in late.ignored
    # The third still fails at its own deadline; the second keeps running.
    s.now = t3.due
    t = s.apply(t3.input)
    assert [e["turn_id"] for e in t.events] == [q3.reply["turn_id"]]
    assert s.state.turn.id == q2.reply["turn_id"] and not s.state.queue
    s.check_fold()


def test_a_turn_run_for_a_parents_call_is_timed_by_the_parent_not_its_own_queue():
    child = Session(session_id="p~c1")
    child.say("busy with a client")
    spawned = ChildSpawned("p", "c1", "a", {"role": "user", "content": "go"}, ["p"], AGENT)
    t = child.apply(spawned)
    assert child.types(t) == ["turn.queued"]
    assert "deadline_ms" not in t.events[0]["payload"] and not timers(t, QueueDeadline)
    # The parent's call ended (its queue timeout): the queued turn is dropped, unrun.
    t = child.apply(ChildCancelled("p", "c1"))
    assert child.types(t) == ["turn.failed"]
    assert t.events[0]["turn_id"] == "sub~p~c1" and not child.state.queue
    assert child.state.turn.id == "turn-1"  # the client's turn runs on
    child.check_fold()


def subagent_session(retry: dict[str, Any] | None = None) -> Session:
    agent = copy.deepcopy(AGENT)
    agent["subagents"] = [{"id": "helper", "description": "helps"}]
    if retry is not None:
        agent["retry"] = retry
    return Session(session_id="p", agent=agent)


def spawn(s: Session) -> Any:
    run = only_llm(s.say("delegate"))
    reply = tool_reply(("c1", "helper", '{"message":"go"}'))
    return s.apply(LlmCallSettled(run.call_id, 1, response=reply))


@pytest.mark.parametrize(
    ("retry", "queue", "total"),
    [
        (None, 30, 3600),  # the engine's subagent-start defaults
        ({"subagent": {"queue_timeout_secs": 4}}, 4, 3600),
        ({"subagent": {"queue_timeout_secs": 90, "total_timeout_secs": 60}}, 90, 60),
    ],
)
def test_a_subagent_call_is_queued_until_its_child_starts(retry, queue, total):
    s = subagent_session(retry)
    t = spawn(s)
    dispatched = payloads(t, "tool.call.dispatched")[0]
    (timer,) = timers(t, CallDeadline)
    assert timer.input == CallDeadline("c1", 1)
    assert timer.due == s.now + min(queue, total) * 1000
    assert dispatched["deadline_ms"] == s.now + queue * 1000
    # The child's turn starts: out of the queue, only the total timeout is left.
    t = s.apply(SubagentStarted("p~c1", "c1"))
    assert s.state.calls["c1"].deadline is None
    whole = s.state.calls["c1"].started_at + total * 1000
    if queue < total:
        assert CancelTimer(timer.due, timer.input) in t.effects
        assert timers(t, CallDeadline) == [StartTimer(whole, timer.input)]
    else:  # the total timeout came first all along: the timer stays
        assert timer.due == whole and t.effects == []
    s.check_fold()


def test_a_subagent_start_past_its_queue_timeout_is_retried_then_fails_for_good():
    s = subagent_session({"subagent": {"queue_timeout_secs": 5, "backoff_base_secs": 1}})
    t = spawn(s)
    (first,) = [e.input for e in t.effects if isinstance(e, Deliver)]
    assert isinstance(first, ChildSpawned) and first.attempt == 1
    for attempt in (1, 2, 3):
        (timer,) = timers(t, CallDeadline)
        assert timer.input == CallDeadline("c1", attempt)
        s.now = timer.due
        t = s.apply(timer.input)
        (errored,) = payloads(t, "tool.call.errored")
        assert errored["attempt"] == attempt
        assert errored["error"]["detail"]["reason"] == "queue_timeout"
        (cancel,) = [e for e in t.effects if isinstance(e, Deliver)]
        assert cancel == Deliver("p~c1", ChildCancelled("p", "c1", attempt))
        if attempt == 3:
            break
        assert errored["retryable"] and not errored["final"]
        (backoff,) = timers(t, TimerFired)
        s.now = backoff.due
        t = s.apply(backoff.input)
        (again,) = [e.input for e in t.effects if isinstance(e, Deliver)]
        assert isinstance(again, ChildSpawned) and again.attempt == attempt + 1
        assert again.message == {"role": "user", "content": "go"}
    # max_attempts (3) spent: the call ends with the queue error, the model is asked again.
    assert errored["final"] and errored["error"]["code"] == "deadline_exceeded"
    assert s.types(t)[-2:] == ["llm.call.requested", "llm.call.dispatched"]
    tool = [n.message for n in s.state.nodes.values() if n.message["role"] == "tool"]
    assert "queue timeout (5 s)" in tool[0]["content"]
    # The call is over, so its child is free: the model may try that session again.
    again = tool_reply(("c2", "helper", '{"message":"retry","session":"p~c1"}'))
    t = s.apply(LlmCallSettled(only_llm(t).call_id, 1, response=again))
    assert payloads(t, "subagent.requested")[0]["id"] == "p~c1"
    assert not payloads(t, "tool.call.errored")
    s.check_fold()


def test_a_retried_spawn_is_a_turn_of_its_own_and_the_old_attempts_answers_are_fenced():
    s = subagent_session({"subagent": {"queue_timeout_secs": 5, "backoff_base_secs": 0}})
    t = spawn(s)
    (first,) = [e.input for e in t.effects if isinstance(e, Deliver)]
    child = Session(session_id="p~c1")
    body = {"type": "client.message", "agent_id": "helper", "message": {"role": "user"}}
    body["message"]["content"] = "busy with a client"
    child.apply(ClientSubmitted(body, "helper", {}, AGENT))
    assert child.types(child.apply(first)) == ["turn.queued"]
    (timer,) = timers(t, CallDeadline)
    s.now = timer.due
    t = s.apply(timer.input)  # queue timeout; backoff 0: attempt 2 goes out at once
    deliveries = [e.input for e in t.effects if isinstance(e, Deliver)]
    cancel, second = deliveries
    assert isinstance(cancel, ChildCancelled) and isinstance(second, ChildSpawned)
    assert second.attempt == 2 and cancel.attempt == 1
    # Delivered out of order: the retry's spawn first; the cancel drops attempt 1 only.
    t = child.apply(second)
    assert [e["turn_id"] for e in t.events] == ["sub~p~c1~2"]
    t = child.apply(cancel)
    assert [(e["payload"]["type"], e["turn_id"]) for e in t.events] == [("turn.failed", "sub~p~c1")]
    assert child.state.queue[0]["input"]["parent"] == {
        "session_id": "p",
        "call_id": "c1",
        "attempt": 2,
    }
    # Answers from attempt 1 (a child that started just as it timed out) change nothing.
    assert s.apply(SubagentStarted("p~c1", "c1", 1)).ignored
    stale = SubagentFinished("p~c1", "c1", "helper", ok=True, result="old", attempt=1)
    assert s.apply(stale).ignored
    # The client's turn ends; attempt 2's turn starts and tells the parent so.
    (run,) = [e for e in child.log if e["payload"]["type"] == "llm.call.dispatched"]
    t = child.apply(LlmCallSettled(run["payload"]["id"], 1, response=text_reply("hi")))
    (started,) = [e.input for e in t.effects if isinstance(e, Deliver)]
    assert started == SubagentStarted("p~c1", "c1", 2)
    t = s.apply(started)
    assert s.types(t) == ["subagent.started"]
    s.check_fold()
    child.check_fold()
