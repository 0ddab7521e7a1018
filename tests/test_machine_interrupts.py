"""Interrupt rules in the pure machine: who may resume one (the turn's privilege), when it
expires (its payload's `expiresAt`, a timer derived from the state, time given as input),
and MCP calls that wait for approval. No clock: `Session.now` is moved by hand."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from engine.machine import (
    CallAnswered,
    ClientSubmitted,
    InterruptDeadline,
    InterruptRequested,
    LlmCallSettled,
    MachineError,
    RunLlmCall,
    StartTimer,
)
from engine.machine.connectors import RunConnectorSync, RunMcpCall
from engine.machine.effects import CancelTimer
from tests.machine_helpers import Session, tool_reply
from tests.test_machine_connectors import CLOCK_TOOLS, agent, effects, synced
from tests.test_machine_worker import WorkerSession

OWNER = {"issuer": "api", "id": "k-own"}


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat().replace("+00:00", "Z")


def started(s: Session, *, owner: dict[str, Any] | None = None) -> None:
    """A turn submitted by a full key (owner None) or a scoped one, running."""
    body = {"type": "client.message", "agent_id": "a", "message": {"role": "user", "content": "x"}}
    identity = {"subject": {"issuer": "slack", "id": "U1"}} if owner is None else {"subject": owner}
    s.apply(ClientSubmitted(body, "a", identity, s.agent, owner=owner))


def resume(s: Session, iid: str, *, owner: dict[str, Any] | None = None, value: str = "yes"):
    body = {"type": "interrupt.resume", "interrupt_id": iid, "payload": {"value": value}}
    return s.apply(ClientSubmitted(body, "a", {"subject": owner or {}}, None, owner=owner))


# -- who may resume ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("turn_by", "resumer", "allowed"),
    [
        ("full", "full", True),
        ("full", "own", False),  # a KEY:own key may not answer a full key's turn
        ("own", "own", True),
        ("own", "full", True),
    ],
)
def test_resuming_needs_the_privilege_of_the_key_that_raised_the_turn(turn_by, resumer, allowed):
    s = Session()
    started(s, owner=OWNER if turn_by == "own" else None)
    t = s.apply(InterruptRequested("asks", {"message": "ok?"}))
    iid = t.reply["interrupt_id"]
    assert s.state.interrupts[iid]["by"]["privilege"] == (
        "frontend" if turn_by == "own" else "operator"
    )
    if turn_by == "full" and resumer == "own":
        s.state.identity = {"subject": OWNER}  # the scoped key owns the session: only the rank
    owner = OWNER if resumer == "own" else None
    if allowed:
        assert resume(s, iid, owner=owner).reply["resumed"] is True
        assert iid not in s.state.interrupts
    else:
        with pytest.raises(MachineError) as refused:
            resume(s, iid, owner=owner)
        assert (refused.value.code, refused.value.status) == ("forbidden", 403)
        assert iid in s.state.interrupts
        assert "session.interrupt_resumed" not in s.types()


def test_an_interrupt_keeps_who_started_its_turn_queued_turns_included():
    s = Session()
    started(s)
    body = {
        "type": "client.message",
        "agent_id": "a",
        "message": {"role": "user", "content": "next"},
        "queue": True,
    }
    s.apply(ClientSubmitted(body, "a", {"subject": {"issuer": "slack", "id": "U2"}}, None))
    assert s.state.queue[0]["by"] == {
        "privilege": "operator",
        "subject": {"issuer": "slack", "id": "U2"},
    }
    t = s.apply(InterruptRequested("asks"))
    assert s.state.interrupts[t.reply["interrupt_id"]]["by"]["subject"]["id"] == "U1"
    s.check_fold()


# -- expiry ------------------------------------------------------------------------------------


def expiring(s: Session, in_ms: int) -> tuple[str, int]:
    started(s)
    due = s.now + in_ms
    t = s.apply(InterruptRequested("asks", {"message": "ok?", "expiresAt": iso(due)}))
    iid = t.reply["interrupt_id"]
    [timer] = [e for e in t.effects if isinstance(e, StartTimer)]
    assert timer == StartTimer(due, InterruptDeadline(iid))  # committed with the interrupt
    return iid, due


@pytest.mark.parametrize(
    ("what", "at", "resumed", "expired"),
    [
        ("click", -1_000, True, False),  # before expiresAt: an answer
        ("click", 0, False, True),  # at it (the timer not yet fired): expired instead
        ("click", 5_000, False, True),
        ("timer", 0, False, True),  # the timer: resolved as expired
    ],
)
def test_an_interrupt_past_its_expiry_resolves_as_expired(what, at, resumed, expired):
    s = Session()
    iid, due = expiring(s, 60_000)
    s.now = due + at - 10  # apply() adds 10
    if what == "click":
        t = resume(s, iid)
        assert t.reply["resumed"] is resumed
        assert t.reply.get("expired", False) is expired
    else:
        t = s.apply(InterruptDeadline(iid))
    [done] = [e["payload"] for e in t.events if e["payload"]["type"] == "session.interrupt_resumed"]
    assert done.get("expired", False) is expired
    if expired:
        assert done["payload"] == {"status": "cancelled", "reason": "expired"}
    else:
        assert done["payload"] == {"value": "yes"}
        assert CancelTimer(due, InterruptDeadline(iid)) in t.effects  # answered: timer dropped
    assert iid not in s.state.interrupts
    s.check_fold()


def test_a_timer_for_an_interrupt_already_answered_changes_nothing():
    s = Session()
    iid, due = expiring(s, 60_000)
    resume(s, iid)
    s.now = due
    t = s.apply(InterruptDeadline(iid))
    assert t.events == [] and t.ignored
    assert resume(s, iid).reply["resumed"] is False  # a later click: refused


def test_an_expiry_that_is_not_a_time_is_shown_but_never_enforced():
    s = Session()
    started(s)
    t = s.apply(InterruptRequested("asks", {"expiresAt": "tomorrow-ish"}))
    assert not [e for e in t.effects if isinstance(e, StartTimer)]


def test_the_engine_goes_on_after_an_expired_interrupt_as_after_a_declined_one():
    """Without a worker the engine proposes what it proposes for any resume: the model is
    asked again (it reads the `interrupt.resumed` trigger's payload); with nothing else
    open, the turn continues."""
    s = Session()
    iid, due = expiring(s, 1_000)
    before = len([e for e in s.log if e["payload"]["type"] == "llm.call.requested"])
    s.now = due
    s.apply(InterruptDeadline(iid))
    after = len([e for e in s.log if e["payload"]["type"] == "llm.call.requested"])
    assert after >= before  # never stuck: either re-asked or already answered
    assert s.state.status != "interrupted"


# -- MCP calls that ask first -----------------------------------------------------------------


def mcp_call(s: Session, name: str, args: str = '{"key": "k1"}'):
    t = synced(s, s.say("go"), {"mcp.clock": CLOCK_TOOLS})
    [llm] = effects(t, RunLlmCall)
    return s.apply(LlmCallSettled(llm.call_id, 1, response=tool_reply(("c1", name, args))))


@pytest.mark.parametrize(
    ("approve", "tool", "asks"),
    [
        (None, "clock__reset", True),  # destructiveHint, default "destructive"
        (None, "clock__now", False),  # readOnlyHint
        ("destructive", "clock__echo", False),  # destructiveHint false
        ("always", "clock__now", True),
        ("never", "clock__reset", False),
    ],
)
def test_which_calls_ask_first(approve, tool, asks):
    entry = {"id": "mcp.clock"} | ({"approve": approve} if approve else {})
    s = Session(agent=agent(entry))
    t = mcp_call(s, tool)
    assert bool(effects(t, RunMcpCall)) is not asks
    assert ("approve-c1" in s.state.interrupts) is asks


def test_an_unannotated_tool_counts_as_destructive():
    s = Session(agent=agent("mcp.clock"))
    tools = [*CLOCK_TOOLS, {"name": "mystery", "description": "?"}]
    t = synced(s, s.say("go"), {"mcp.clock": tools})
    [llm] = effects(t, RunLlmCall)
    t = s.apply(LlmCallSettled(llm.call_id, 1, response=tool_reply(("c1", "clock__mystery", "{}"))))
    assert not effects(t, RunMcpCall) and "approve-c1" in s.state.interrupts


def test_an_approved_call_is_sent_and_a_declined_one_is_a_tool_error_the_model_reads():
    s = Session(agent=agent("mcp.clock"))
    mcp_call(s, "clock__reset")
    interrupt = s.state.interrupts["approve-c1"]
    assert interrupt["payload"]["toolCallId"] == "c1"
    assert interrupt["payload"]["metadata"]["tool"] == "clock__reset"
    assert interrupt["payload"]["metadata"]["arguments"] == {"key": "k1"}
    assert "clock__reset" in interrupt["payload"]["message"]
    t = resume(s, "approve-c1", value="approve")
    [run] = effects(t, RunMcpCall)
    assert run.call_id == "c1"

    s = Session(agent=agent("mcp.clock"))
    mcp_call(s, "clock__reset")
    t = resume(s, "approve-c1", value="decline")
    assert not effects(t, RunMcpCall)
    assert effects(t, RunLlmCall)  # the model is asked again, with the error to read
    tool_msgs = [
        e["payload"]["message"]
        for e in s.log
        if e["payload"]["type"] == "message.new" and e["payload"]["message"]["role"] == "tool"
    ]
    assert "clock__reset was not run: a person declined it" in tool_msgs[-1]["content"]
    s.check_fold()


def test_an_approval_that_expires_is_declined():
    s = Session(agent=agent("mcp.clock"))
    mcp_call(s, "clock__reset")
    t = s.apply(InterruptDeadline("approve-c1"))  # as the timer of an `expiresAt` would
    assert not effects(t, RunMcpCall)
    assert effects(t, RunLlmCall)
    assert "before the prompt expired" in str(t.events)
    assert s.state.calls.get("c1") is None
    s.check_fold()


def test_a_worker_hears_an_approval_resumed_in_its_turn_one_decision_at_a_time():
    """A worker agent: the engine's approval, resumed while the worker decides something
    else, waits for the decision slot; then the worker gets `interrupt.resumed` with the
    answer and nothing proposed (the engine already sent the call), and the call's
    `tool.finished` after it."""
    w = WorkerSession(agent=agent("mcp.clock"))
    w.start()
    [sync] = effects(w.last, RunConnectorSync)
    w.apply(CallAnswered(sync.call_id, 1, result={"tools": CLOCK_TOOLS, "prefix": "clock"}))
    w.answer()  # session.start
    calls = [
        {"type": "tool.call", "id": "t1", "name": "clock__reset", "arguments": "{}"},
        {"type": "tool.call", "id": "t2", "name": "clock__now", "arguments": "{}"},
    ]
    t = w.answer({"actions": calls})
    assert [r.call_id for r in effects(t, RunMcpCall)] == ["t2"]  # t1 waits for a person
    w.apply(CallAnswered("t2", 1, result={"content": [{"type": "text", "text": "noon"}]}))
    assert w.request()["trigger"]["id"] == "t2"  # the worker is deciding t2's tool.finished
    t = resume(w, "approve-t1", value="approve")
    assert [r.call_id for r in effects(t, RunMcpCall)] == ["t1"]  # sent at once
    assert w.types(t) == ["session.interrupt_resumed", "decision.queued", "tool.call.dispatched"]
    w.answer({})  # t2's tool.finished
    req = w.request()
    assert req["trigger"] == {
        "type": "interrupt.resumed",
        "interrupt_id": "approve-t1",
        "payload": {"value": "approve"},
    }
    assert req["proposed"] == {}
    w.answer()
    w.apply(CallAnswered("t1", 1, result={"content": [{"type": "text", "text": "reset"}]}))
    assert w.request()["trigger"]["type"] == "tool.finished"
    assert w.request()["trigger"]["id"] == "t1"
    w.check_fold()


# -- a worker hears of the engine's other interrupts (SPEC §8) ---------------------------


def _worker_held_by_budget() -> tuple[WorkerSession, str]:
    """A worker agent with a one-model-call budget that asks: its second call is held."""
    w = WorkerSession(agent=agent())
    w.start()
    # session.start: the worker sets its session's budget (never sent back on the wire)
    w.answer({"agent": {**agent(), "budget": {"max_model_calls": 1, "on_exceeded": "ask"}}})
    t = w.answer()  # client.messages: the proposed model call
    [run] = effects(t, RunLlmCall)
    w.apply(LlmCallSettled(run.call_id, 1, response=tool_reply(("c1", "confirm", "{}"))))
    assert w.request()["trigger"]["type"] == "llm.finished"
    t = w.answer({"actions": [{"type": "llm.call"}]})
    assert not effects(t, RunLlmCall) and w.state.status == "interrupted"
    [iid] = w.state.interrupts
    return w, iid


def test_a_worker_hears_a_budget_raise_resumed_and_the_held_call_goes_out():
    w, iid = _worker_held_by_budget()
    t = resume(w, iid, value="approve")
    [run] = effects(t, RunLlmCall)  # the engine sends the held call itself
    req = w.request()
    assert req["trigger"] == {
        "type": "interrupt.resumed",
        "interrupt_id": iid,
        "payload": {"value": "approve"},
    }
    assert req["proposed"] == {}
    w.answer()
    w.apply(LlmCallSettled(run.call_id, 1, response=tool_reply(("c2", "confirm", "{}"))))
    assert w.request()["trigger"]["type"] == "llm.finished"
    w.check_fold()


@pytest.mark.parametrize("how", ["decline", "expire"])
def test_a_declined_budget_ends_the_turn_without_asking_the_worker(how):
    w, iid = _worker_held_by_budget()
    t = resume(w, iid, value="decline") if how == "decline" else w.apply(InterruptDeadline(iid))
    assert "turn.failed" in w.types(t)
    assert not [e for e in t.events if e["payload"]["type"] == "decision.dispatched"]
    assert w.state.decision is None
    w.check_fold()


UNAUTHORIZED = {
    "message": "mcp.clock refused the credential (HTTP 401)",
    "code": "handler_error",
    "detail": {"connector": "mcp.clock", "reason": "unauthorized"},
}


def test_a_worker_hears_a_credential_retry_on_a_sync_it_asked_for():
    """Mid-turn (the worker's own `connector.sync`), the refused credential's prompt is on
    the worker's branch: resumed, the worker hears it, nothing proposed, and the sync runs."""
    w = WorkerSession(agent=agent("mcp.clock"))
    w.start()
    [sync] = effects(w.last, RunConnectorSync)
    w.apply(CallAnswered(sync.call_id, 1, result={"tools": CLOCK_TOOLS, "prefix": "clock"}))
    w.answer()  # session.start
    t = w.answer({"actions": [{"type": "connector.sync", "path": "mcp.clock"}]})
    [again] = effects(t, RunConnectorSync)
    w.apply(CallAnswered(again.call_id, 1, error=UNAUTHORIZED, retryable=False))
    [iid] = w.state.interrupts
    t = resume(w, iid, value="retry")
    [third] = effects(t, RunConnectorSync)
    req = w.request()
    assert req["trigger"] == {
        "type": "interrupt.resumed",
        "interrupt_id": iid,
        "payload": {"value": "retry"},
    }
    assert req["proposed"] == {}
    w.answer()
    w.apply(CallAnswered(third.call_id, 1, result={"tools": CLOCK_TOOLS, "prefix": "clock"}))
    w.check_fold()


def test_a_credential_retry_before_the_turns_first_decision_reaches_the_worker_as_the_turn():
    """At the turn's start the worker has not heard of the turn (its first decision waits
    for the sync): resumed, the sync runs again and the turn's own trigger follows it."""
    w = WorkerSession(agent=agent("mcp.clock"))
    w.start()
    [sync] = effects(w.last, RunConnectorSync)
    w.apply(CallAnswered(sync.call_id, 1, error=UNAUTHORIZED, retryable=False))
    assert w.state.held is not None
    [iid] = w.state.interrupts
    t = resume(w, iid, value="retry")
    [again] = effects(t, RunConnectorSync)
    w.answer()  # session.start, asked before the sync failed
    assert w.state.decision is None  # the turn's own trigger waits for the sync
    w.apply(CallAnswered(again.call_id, 1, result={"tools": CLOCK_TOOLS, "prefix": "clock"}))
    assert w.request()["trigger"]["type"] == "client.messages"
    asked = [
        e["payload"]["trigger"]["type"]
        for e in w.log
        if e["payload"]["type"] == "decision.dispatched"
    ]
    assert asked == ["session.start", "client.messages"]
    w.check_fold()
