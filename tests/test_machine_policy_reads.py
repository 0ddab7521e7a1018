"""A step run with its budget-policy buckets unread (engine/machine/policies.py `UNREAD`)
lets each model call through and records its check; the shell reads the buckets only
then and runs the step again when `budgets.first_over` says their figures refuse or
hold a call. These tests hold that the verdict is the machine's own: for the same
figures, `first_over` refuses exactly the steps the machine refuses (or holds) with the
figures read first, with the same figures in the error, and a step it lets through is
the same transition either way. Pure."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from engine.machine import LlmCallSettled, RunLlmCall, Transition
from engine.machine.budgets import first_over
from engine.machine.policies import UNREAD, Bucket
from tests.machine_helpers import Session, text_reply, tool_reply
from tests.test_machine_budgets import resume


def bucket(used: str, limit: str = "1000", strategy: str = "reject", **kw: Any) -> Bucket:
    dimension = kw.get("dimension", "total_tokens")
    frees = 1_767_000_900_000 if float(used) >= float(limit) else None
    return Bucket("p", "user=cli:alice", dimension, limit, used, frees, strategy)


def runs(t: Transition) -> list[RunLlmCall]:
    return [e for e in t.effects if isinstance(e, RunLlmCall)]


def stopped(t: Transition) -> dict[str, Any] | None:
    """What a step that refused or held a model call recorded of the policy's figures."""
    for e in t.events:
        p = e["payload"]
        if p["type"] == "turn.failed" and p["error"]["code"] == "budget_exceeded":
            return dict(p["error"]["detail"])
        if p["type"] == "session.interrupted" and p["origin"] == "budget":
            meta = dict(p["payload"]["metadata"])
            return {k: v for k, v in meta.items() if k not in ("call_id", "raise_by", "options")}
    return None


def same_verdict(s: Session, last: Callable[[Session], Transition], figures: Bucket) -> None:
    """The step `last` on `s`, once with `figures` read first and once with them unread
    and checked after, as the applier does."""
    read, unread = copy.deepcopy(s), copy.deepcopy(s)
    read.buckets, unread.buckets = (figures,), UNREAD
    first, deferred = last(read), last(unread)
    over = first_over((figures,), deferred.policy_checks)
    refused = stopped(first)
    if refused is None:
        assert over is None
        assert deferred.events == first.events and deferred.effects == first.effects
    else:
        assert over is not None and over.detail() == refused
        assert stopped(deferred) is None  # the first pass let it through: run again


def say(s: Session) -> Transition:
    return s.say("hi")


# The first call of a turn, against a bucket: spent, crossed by the call's estimate,
# with room, in dollars, and held for a person (the interrupt strategy).
FIRST_CALL = [
    bucket("1000"),
    bucket("995"),
    bucket("10"),
    bucket("0"),
    bucket("5.01", "5", dimension="cost_usd"),
    bucket("4.999999", "5", dimension="cost_usd"),
    bucket("0.1", "5", dimension="cost_usd"),
    bucket("1000", strategy="interrupt"),
    bucket("10", strategy="interrupt"),
]


@pytest.mark.parametrize("figures", FIRST_CALL, ids=lambda b: f"{b.used}of{b.limit}-{b.strategy}")
def test_a_turns_first_call_is_refused_after_the_step_exactly_as_before_it(figures):
    same_verdict(Session(), say, figures)


def _approved() -> tuple[Session, str]:
    """A turn whose call a person let past a spent bucket (its allowance raised once), the
    model then asking the client's tool: the next step answers it and asks the model."""
    s = Session(buckets=(bucket("1000", strategy="interrupt"),))
    t = s.say("hi")
    [asked] = [e["payload"] for e in t.events if e["payload"]["type"] == "session.interrupted"]
    [run] = runs(resume(s, asked["interrupt_id"], "approve"))
    s.apply(LlmCallSettled(run.call_id, 1, response=tool_reply(("c1", "confirm", "{}"))))
    return s, "c1"


@pytest.mark.parametrize("used", ["1500", "1995", "2000", "2500"])
def test_a_raise_approved_earlier_in_the_turn_counts_in_the_check_after_the_step(used):
    s, call = _approved()
    assert s.state is not None and s.state.turn is not None
    assert s.state.turn.raised == {"policy:p": 1}

    def answer(s: Session) -> Transition:
        return s.client({"type": "tool.result", "id": call, "result": "ok"})

    same_verdict(s, answer, bucket(used, strategy="interrupt"))
    same_verdict(s, answer, bucket(used))


def test_a_step_that_starts_no_model_call_leaves_nothing_to_check():
    s = Session(buckets=UNREAD)
    [run] = runs(s.say("hi"))
    t = s.apply(LlmCallSettled(run.call_id, 1, response=tool_reply(("c1", "confirm", "{}"))))
    assert "tool.call.requested" in s.types(t) and t.policy_checks == []
    t = s.client({"type": "tool.result", "id": "c1", "result": "ok"})
    [check] = t.policy_checks  # the re-prompt: one call let through, its check kept
    assert check.raised == () and check.estimate is not None and check.estimate["tokens"] > 0
    [run] = runs(t)
    t = s.apply(LlmCallSettled(run.call_id, 1, response=text_reply("done")))
    assert "turn.completed" in s.types(t) and t.policy_checks == []
    s.check_fold()


def test_without_policies_a_step_records_no_check():
    s = Session()
    t = s.say("hi")
    assert runs(t) and t.policy_checks == []
