"""Budgets as machine rules (issue #28, engine/machine/budgets.py): each limit is checked
before the call that would cross it, which is then not made; `fail` fails the turn with
the figures, `ask` holds the call behind an interrupt whose approval raises the limit for
that turn only. Pure: no clock, no I/O; `Session.now` moves by hand."""

from __future__ import annotations

import copy
from decimal import Decimal
from typing import Any

import pytest

from engine.machine import (
    ClientSubmitted,
    DecisionAnswered,
    LlmCallSettled,
    RunLlmCall,
    SubagentFinished,
)
from engine.machine.request import decision_request
from tests.machine_helpers import AGENT, Session, text_reply, tool_reply


def agent(budget: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    a = copy.deepcopy(AGENT)
    if budget is not None:
        a["budget"] = budget
    a.update(extra)
    return a


def llm_runs(t) -> list[RunLlmCall]:
    return [e for e in t.effects if isinstance(e, RunLlmCall)]


def one_llm(t) -> RunLlmCall:
    [run] = llm_runs(t)
    return run


def loop_once(s: Session, run: RunLlmCall, n: int, cost: str = "0.002"):
    """The model calls the client tool `confirm`; the client answers; the model is asked again."""
    reply = tool_reply((f"c{n}", "confirm", "{}"))
    reply["cost"] = cost
    s.apply(LlmCallSettled(run.call_id, 1, response=reply))
    return s.client({"type": "tool.result", "id": f"c{n}", "result": "ok"})


def failed(s: Session) -> dict[str, Any]:
    [end] = [e["payload"] for e in s.log if e["payload"]["type"] == "turn.failed"]
    return end


def test_the_model_call_that_would_cross_max_model_calls_is_not_made():
    s = Session(agent=agent({"max_model_calls": 2}))
    run = one_llm(s.say("loop"))
    run = one_llm(loop_once(s, run, 1))
    t = loop_once(s, run, 2)
    assert llm_runs(t) == []  # the third call is not dispatched ...
    assert "llm.call.requested" not in s.types(t)  # ... nor recorded
    end = failed(s)
    assert end["error"]["code"] == "budget_exceeded"
    assert end["error"]["detail"] == {
        "limit": "max_model_calls",
        "allowed": "2",
        "spent": "2",
        "next": "1",
    }
    assert "2 model calls" in end["error"]["message"]
    s.check_fold()


def test_the_tool_call_that_would_cross_max_tool_calls_is_not_made():
    s = Session(agent=agent({"max_tool_calls": 1}))
    run = one_llm(s.say("two tools"))
    reply = tool_reply(("c1", "confirm", "{}"), ("c2", "confirm", "{}"))
    t = s.apply(LlmCallSettled(run.call_id, 1, response=reply))
    requested = [
        e["payload"]["id"] for e in t.events if e["payload"]["type"] == "tool.call.requested"
    ]
    assert requested == ["c1"]  # c2 is never opened
    assert failed(s)["error"]["detail"]["limit"] == "max_tool_calls"
    s.check_fold()


def test_max_cost_counts_the_estimate_of_the_next_call():
    # 1 USD per million input tokens: the estimate of the second call is tiny but not zero.
    budget = {"max_cost_usd": 0.003, "price": {"input": "1"}}
    s = Session(agent=agent(budget))
    run = one_llm(s.say("x"))
    t = loop_once(s, run, 1, cost="0.003")  # spent exactly the limit: the next call crosses it
    assert llm_runs(t) == []
    detail = failed(s)["error"]["detail"]
    assert detail["limit"] == "max_cost_usd" and detail["spent"] == "0.003"
    assert detail["next"] != "0"


def test_max_tokens_is_checked_against_the_estimate_then_reconciled_with_the_vendor():
    s = Session(agent=agent({"max_tokens": 1000}))
    t = s.say("hello")
    run = one_llm(t)
    [req] = [e["payload"] for e in t.events if e["payload"]["type"] == "llm.call.requested"]
    estimated = req["estimate"]["tokens"]
    assert 0 < estimated < 200  # system, tools and one message: characters / 4
    assert s.state is not None and s.state.turn is not None
    assert s.state.turn.estimates == {run.call_id: [estimated, "0"]}
    # The vendor reports far more than the estimate: its figure replaces the estimate.
    reply = tool_reply(("c1", "confirm", "{}"))
    reply["usage"] = {
        "input": 990,
        "output": 5,
        "uncached_input": 990,
        "cache_read": 0,
        "cache_write": 0,
        "total": 995,
    }
    s.apply(LlmCallSettled(run.call_id, 1, response=reply))
    assert s.state.turn.estimates == {}
    t = s.client({"type": "tool.result", "id": "c1", "result": "ok"})
    assert llm_runs(t) == []  # 995 reported + the next estimate > 1000
    detail = failed(s)["error"]["detail"]
    assert detail["limit"] == "max_tokens" and detail["spent"] == "995"
    s.check_fold()


def test_a_vendor_reporting_less_than_the_estimate_leaves_room_for_the_next_call():
    s = Session(agent=agent({"max_tokens": 400}))
    t = s.say("hello")
    run = one_llm(t)
    reply = tool_reply(("c1", "confirm", "{}"))
    reply["usage"] = {
        "input": 10,
        "output": 5,
        "uncached_input": 10,
        "cache_read": 0,
        "cache_write": 0,
        "total": 15,
    }
    s.apply(LlmCallSettled(run.call_id, 1, response=reply))
    t = s.client({"type": "tool.result", "id": "c1", "result": "ok"})
    assert len(llm_runs(t)) == 1  # 15 reported + the estimate fits


def test_a_session_budget_spans_turns():
    s = Session(agent=agent(session_budget={"max_cost_usd": 0.0015}))
    run = one_llm(s.say("one"))
    s.apply(LlmCallSettled(run.call_id, 1, response=text_reply("ok")))  # costs 0.001
    run = one_llm(s.say("two"))
    t = s.apply(LlmCallSettled(run.call_id, 1, response=text_reply("ok")))  # 0.002 now
    assert "turn.completed" in s.types(t)
    t = s.say("three")
    assert llm_runs(t) == []
    assert failed(s)["error"]["detail"]["limit"] == "session.max_cost_usd"


def _ask_session() -> tuple[Session, str]:
    s = Session(agent=agent({"max_model_calls": 1, "on_exceeded": "ask"}))
    run = one_llm(s.say("loop"))
    t = loop_once(s, run, 1)
    assert llm_runs(t) == []  # held, not sent
    assert s.state is not None and s.state.status == "interrupted"
    [raised] = [e["payload"] for e in t.events if e["payload"]["type"] == "session.interrupted"]
    assert raised["origin"] == "budget"
    assert raised["payload"]["message"] == (
        "this turn has spent 1 model calls of 1 model calls (max_model_calls); "
        "continue with another 1?"
    )
    return s, raised["interrupt_id"]


def resume(s: Session, iid: str, value: str):
    body = {"type": "interrupt.resume", "interrupt_id": iid, "payload": {"value": value}}
    return s.apply(ClientSubmitted(body, "a", {}, None))


def test_ask_holds_the_call_and_an_approval_sends_it_raising_that_turns_limit_once():
    s, iid = _ask_session()
    t = resume(s, iid, "approve")
    run = one_llm(t)  # the held call goes out now
    assert s.state is not None and s.state.turn is not None
    assert s.state.turn.raised == {"max_model_calls": 1}
    # Raised once: 2 calls this turn; the third asks again.
    t = loop_once(s, run, 2)
    assert llm_runs(t) == [] and s.state.status == "interrupted"
    s.check_fold()


def test_a_raise_by_approval_applies_to_that_turn_only():
    s, iid = _ask_session()
    run = one_llm(resume(s, iid, "approve"))
    s.apply(LlmCallSettled(run.call_id, 1, response=text_reply("done")))
    assert "turn.completed" in s.types()
    t = s.say("again")
    assert len(llm_runs(t)) == 1  # a new turn: one call allowed
    assert s.state is not None and s.state.turn is not None and s.state.turn.raised == {}
    run = one_llm(t)
    t = loop_once(s, run, 9)
    assert llm_runs(t) == [] and s.state.status == "interrupted"  # back to the file's limit


def test_declining_the_ask_fails_the_turn_over_budget():
    s, iid = _ask_session()
    t = resume(s, iid, "decline")
    assert llm_runs(t) == []
    error = failed(s)["error"]
    assert error["code"] == "budget_exceeded"
    assert error["detail"]["limit"] == "max_model_calls" and error["detail"]["declined"] is True
    s.check_fold()


def test_a_subagents_spend_counts_toward_its_parents_turn():
    parent = agent(
        {"max_cost_usd": 0.01, "price": {"input": "0"}},
        subagents=[{"id": "helper", "description": "d"}],
    )
    s = Session(agent=parent)
    run = one_llm(s.say("delegate"))
    reply = tool_reply(("k1", "helper", '{"message": "go"}'))
    reply["cost"] = "0.001"
    s.apply(LlmCallSettled(run.call_id, 1, response=reply))
    assert s.state is not None and "k1" in s.state.calls
    usage = {
        "input": 100,
        "output": 10,
        "uncached_input": 100,
        "cache_read": 0,
        "cache_write": 0,
        "total": 110,
    }
    child = SubagentFinished("s1~k1", "k1", "helper", True, "done", usage=usage, cost="0.0095")
    t = s.apply(child)
    assert llm_runs(t) == []  # the re-prompt would cross 0.01
    end = failed(s)
    assert end["cost"] == "0.0105"  # 0.001 + the child's
    detail = end["error"]["detail"]
    assert detail["limit"] == "max_cost_usd" and detail["spent"] == "0.0105"


def _request(s: Session) -> dict[str, Any]:
    assert s.state is not None and s.state.decision is not None
    d = s.state.decision
    return decision_request(s.state, d.id, d.trigger, d.proposed, d.attempt, None)


def test_a_worker_sets_its_sessions_budget_at_start_and_sees_it_on_its_decision_requests():
    """A worker agent's budget is its session's: the agent config it returns at
    `session.start` (an engine extension, never sent back on the wire)."""
    s = Session(agent=None, decider="worker")
    s.say("hi")
    req = _request(s)
    assert req["trigger"]["type"] == "session.start"
    assert not any(k.startswith("budget.") for k in req["identity"]["metadata"])
    config = agent({"max_model_calls": 3, "max_cost_usd": 1})
    s.apply(DecisionAnswered(req["decision_id"], 1, {"agent": config}))
    req = _request(s)
    meta = req["identity"]["metadata"]
    assert meta["budget.max_model_calls"] == "3" and meta["budget.spent.max_model_calls"] == "0"
    assert meta["budget.max_cost_usd"] == "1" and meta["budget.spent.max_cost_usd"] == "0"
    assert "budget" not in (req["agent"] or {})
    # It asks for model calls; the fourth is refused before it is made.
    for n in range(3):
        t = s.apply(DecisionAnswered(req["decision_id"], 1, {"actions": [{"type": "llm.call"}]}))
        s.apply(LlmCallSettled(one_llm(t).call_id, 1, response=text_reply(f"{n}")))
        req = _request(s)
        assert req["identity"]["metadata"]["budget.spent.max_model_calls"] == str(n + 1)
    s.apply(DecisionAnswered(req["decision_id"], 1, {"actions": [{"type": "llm.call"}]}))
    assert failed(s)["error"]["detail"]["limit"] == "max_model_calls"


def test_a_tool_call_held_by_its_budget_still_asks_its_connections_approval():
    """Approving more budget is not approving a destructive MCP call: that is asked next."""
    from engine.machine.connectors import RunMcpCall
    from tests.test_machine_connectors import CLOCK_TOOLS, effects, synced
    from tests.test_machine_connectors import agent as mcp_agent

    config = mcp_agent("mcp.clock")
    config["budget"] = {"max_tool_calls": 0, "on_exceeded": "ask"}
    s = Session(agent=config)
    t = synced(s, s.say("go"), {"mcp.clock": CLOCK_TOOLS})
    [llm] = effects(t, RunLlmCall)
    t = s.apply(LlmCallSettled(llm.call_id, 1, response=tool_reply(("c1", "clock__reset", "{}"))))
    assert not effects(t, RunMcpCall)
    assert s.state is not None and list(s.state.interrupts) == ["budget-c1"]
    # max_tool_calls = 0 raised by its own size is still 0: the point here is the order.
    t = resume(s, "budget-c1", "approve")
    assert not effects(t, RunMcpCall)
    assert list(s.state.interrupts) == ["approve-c1"]  # the connection's own approval
    t = resume(s, "approve-c1", "approve")
    [run] = effects(t, RunMcpCall)
    assert run.call_id == "c1"
    s.check_fold()


# --- the estimate prices what the vendor's prompt cache holds at the read rate -----------

# About 10,000 estimated tokens of system prompt: a long thread's worth of input.
LONG = "be brief. " * 4000
# $10 input, $1 cache read per million tokens: the first call is estimated near $0.10.
CACHE_PRICE = {"input": "10", "cache_read": "1"}


def cached_loop(budget: dict[str, Any], *, wait_ms: int = 0, model: str | None = None):
    """A turn whose first call (estimated near $0.10, reported at $0.125: written to the
    cache at 1.25x) left 10,000 tokens in the vendor's prompt cache; the client answers its
    tool call `wait_ms` later. Returns the session and the step that asks the model again."""
    s = Session(agent=agent(budget, system=LONG))
    run = one_llm(s.say("the db is paging"))
    reply = tool_reply(("c1", "confirm", "{}"))
    reply["usage"] = {
        "input": 10_050,
        "output": 20,
        "uncached_input": 50,
        "cache_read": 0,
        "cache_write": 10_000,
        "total": 10_070,
    }
    reply["cost"] = "0.125"
    s.apply(LlmCallSettled(run.call_id, 1, response=reply))
    s.now += wait_ms
    if model is not None:
        assert s.state is not None and s.state.agent is not None
        s.state.agent["model"] = model  # as an agent.updated would
    return s, s.client({"type": "tool.result", "id": "c1", "result": "ok"})


def requested(t) -> dict[str, Any]:
    [p] = [e["payload"] for e in t.events if e["payload"]["type"] == "llm.call.requested"]
    return p


def test_input_the_previous_call_left_in_the_cache_is_estimated_at_the_read_rate():
    """$0.125 spent + the next call at full price (~$0.10) would cross $0.20; with the
    10,000 cached tokens at the read rate (~$0.01) it fits, and the call is made."""
    budget = {"max_cost_usd": 0.2, "price": CACHE_PRICE}
    s, t = cached_loop(budget)
    assert len(llm_runs(t)) == 1
    est = requested(t)["estimate"]
    assert est["cached"] == 10_000
    full = Decimal(est["tokens"]) * 10 / 1_000_000
    assert Decimal("0.125") + full > Decimal("0.2")  # the old estimate would have refused it
    assert (
        Decimal(est["cost"])
        == (Decimal(est["tokens"] - 10_000) * 10 + Decimal(10_000) * 1) / 1_000_000
    )
    s.check_fold()


def test_without_a_cache_read_price_the_estimate_is_the_full_input_price():
    s, t = cached_loop({"max_cost_usd": 0.2, "price": {"input": "10"}})
    assert llm_runs(t) == []
    assert failed(s)["error"]["detail"]["limit"] == "max_cost_usd"


@pytest.mark.parametrize(
    ("wait_ms", "model", "why"),
    [
        (5 * 60 * 1000 + 1, None, "the cache has expired"),
        (0, "m2", "another model has no cache of this prompt"),
    ],
)
def test_a_cache_the_next_call_cannot_read_is_priced_in_full(wait_ms, model, why):
    s, t = cached_loop({"max_cost_usd": 0.2, "price": CACHE_PRICE}, wait_ms=wait_ms, model=model)
    assert llm_runs(t) == [], why
    detail = failed(s)["error"]["detail"]
    assert detail["limit"] == "max_cost_usd" and Decimal(detail["next"]) > Decimal("0.075")


def test_a_session_budget_reads_the_previous_turns_cache():
    """The first call of the next turn reads what the last turn's call left in the cache."""
    whole = {"max_cost_usd": 0.2, "price": CACHE_PRICE}
    s = Session(agent=agent(session_budget=whole, system=LONG))
    run = one_llm(s.say("one"))
    reply = text_reply("ok", input=10_050, uncached_input=50, cache_write=10_000)
    reply["cost"] = "0.125"
    t = s.apply(LlmCallSettled(run.call_id, 1, response=reply))
    assert "turn.completed" in s.types(t)
    assert s.state is not None and s.state.cached is not None
    assert s.state.cached["tokens"] == 10_000
    t = s.say("two")
    assert len(llm_runs(t)) == 1 and requested(t)["estimate"]["cached"] == 10_000
    s.check_fold()


def test_a_call_that_leaves_nothing_in_the_cache_clears_what_an_earlier_one_left():
    s, t = cached_loop({"max_cost_usd": 5, "price": CACHE_PRICE})
    run = one_llm(t)
    s.apply(LlmCallSettled(run.call_id, 1, response=tool_reply(("c2", "confirm", "{}"))))
    assert s.state is not None and s.state.cached is None
    t = s.client({"type": "tool.result", "id": "c2", "result": "ok"})
    assert "cached" not in requested(t)["estimate"]


def test_a_worker_echoing_its_proposed_config_keeps_the_files_budget():
    """The wire's agent config has no `budget` (an engine extension): a worker that echoes
    `session.start`'s proposal was never sent it, so it keeps the file's; a worker that
    sends one sets its own."""
    s = Session(agent=agent({"max_model_calls": 1}), decider="worker")
    s.say("hi")
    req = _request(s)
    assert "budget" not in req["proposed"]["agent"]  # not on the wire
    s.apply(DecisionAnswered(req["decision_id"], 1, req["proposed"]))
    assert s.state is not None and s.state.agent is not None
    assert s.state.agent["budget"] == {"max_model_calls": 1}
    assert _request(s)["identity"]["metadata"]["budget.max_model_calls"] == "1"
    # A later config without it keeps it too; one that names it sets it.
    req = _request(s)
    s.apply(DecisionAnswered(req["decision_id"], 1, {"agent": req["agent"]}))
    assert s.state.agent["budget"] == {"max_model_calls": 1}
    req = _request(s)
    own = {**req["agent"], "budget": {"max_model_calls": 5}}
    s.apply(DecisionAnswered(req["decision_id"], 1, {"agent": own}))
    assert s.state.agent["budget"] == {"max_model_calls": 5}
    s.check_fold()


def test_a_worker_that_names_another_model_keeps_the_budget_but_not_its_price():
    """The file's price is its model's: a worker moving to another model keeps the limits
    but not that price (the engine cannot price the other model), and `budget: {}`, sent
    by the worker itself, lifts the limits."""
    priced = {"max_cost_usd": 1, "price": {"input": "10", "cache_read": "1"}}
    s = Session(agent=agent(priced), decider="worker")
    s.say("hi")
    req = _request(s)
    s.apply(DecisionAnswered(req["decision_id"], 1, {"agent": {**req["proposed"]["agent"]}}))
    assert s.state is not None and s.state.agent is not None
    assert s.state.agent["budget"] == priced  # same model: the price holds
    req = _request(s)
    other = {**req["agent"], "model": "m2"}
    s.apply(DecisionAnswered(req["decision_id"], 1, {"agent": other}))
    assert s.state.agent["budget"] == {"max_cost_usd": 1}
    req = _request(s)
    s.apply(DecisionAnswered(req["decision_id"], 1, {"agent": {**req["agent"], "budget": {}}}))
    assert s.state.agent["budget"] == {}
    s.check_fold()
