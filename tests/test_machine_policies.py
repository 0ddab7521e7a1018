"""Budget policies as machine rules (issue #28 item 2, engine/machine/budgets.py and
policies.py): the machine checks a model call against the buckets the shell read before
the step, and records what it decided in the events, so a replay folds the same. Pure."""

from __future__ import annotations

from engine.machine import LlmCallSettled, RunLlmCall, iso
from engine.machine.policies import (
    Bucket,
    BucketRef,
    BudgetPolicy,
    buckets_for,
    charges,
    context_of,
    usage_in_window,
)
from tests.machine_helpers import Session, text_reply

HOUR = 3_600_000


def bucket(used: str, limit: str = "1000", strategy: str = "reject", **kw) -> Bucket:
    fields = {"policy": "p", "group": "user=cli:alice", "dimension": "total_tokens"}
    fields.update(kw)
    return Bucket(
        fields["policy"],
        fields["group"],
        fields["dimension"],
        limit,
        used,
        1_767_000_900_000 if float(used) >= float(limit) else None,
        strategy,
    )


def runs(t) -> list[RunLlmCall]:
    return [e for e in t.effects if isinstance(e, RunLlmCall)]


def test_a_spent_bucket_stops_the_call_and_the_turn_says_which_and_when():
    s = Session(buckets=(bucket("1000"),))
    t = s.say("hi")
    assert runs(t) == [] and "llm.call.requested" not in s.types(t)
    [end] = [e["payload"] for e in t.events if e["payload"]["type"] == "turn.failed"]
    assert end["error"]["code"] == "budget_exceeded"
    detail = end["error"]["detail"]
    assert detail["policy"] == "p" and detail["group"] == "user=cli:alice"
    assert detail["allowed"] == "1000" and detail["spent"] == "1000"
    assert detail["frees_at"] == iso(1_767_000_900_000)
    assert "frees up at" in end["error"]["message"]
    s.check_fold()


def test_the_call_whose_estimate_would_cross_is_refused_and_one_that_fits_is_made():
    s = Session(buckets=(bucket("995", "1000"),))  # the request alone is more than 5 tokens
    s.say("hi")
    assert "turn.failed" in s.types()
    s = Session(buckets=(bucket("10", "1000"),))
    t = s.say("hi")
    assert len(runs(t)) == 1
    [requested] = [e["payload"] for e in t.events if e["payload"]["type"] == "llm.call.requested"]
    assert requested["estimate"]["tokens"] > 0  # what it was checked with, recorded
    s.check_fold()


def test_a_cost_bucket_counts_dollars():
    s = Session(buckets=(bucket("5.01", "5", dimension="cost_usd"),))
    s.say("hi")
    [end] = [e["payload"] for e in s.log if e["payload"]["type"] == "turn.failed"]
    assert end["error"]["detail"]["dimension"] == "cost_usd"
    assert "$5.01 of $5" in end["error"]["message"]


def test_the_interrupt_strategy_holds_the_call_and_an_approval_raises_it_for_this_turn():
    s = Session(buckets=(bucket("1000", strategy="interrupt"),))
    t = s.say("hi")
    assert runs(t) == []
    [asked] = [e["payload"] for e in t.events if e["payload"]["type"] == "session.interrupted"]
    assert asked["origin"] == "budget"
    meta = asked["payload"]["metadata"]
    assert meta["limit"] == "policy:p" and meta["raise_by"] == "1000"
    resume = {"type": "interrupt.resume", "interrupt_id": asked["interrupt_id"]}
    t = s.client({**resume, "payload": {"value": "approve"}})
    [run] = runs(t)  # the held call is sent
    assert s.state is not None and s.state.turn is not None
    assert s.state.turn.raised == {"policy:p": 1}
    # Still this turn: the bucket's allowance is now twice its limit.
    t = s.apply(LlmCallSettled(run.call_id, 1, response=text_reply("done")))
    assert "turn.completed" in s.types(t)
    # The next turn starts from the policy's own limit: it asks again.
    t = s.say("more")
    assert "session.interrupted" in s.types(t)
    s.check_fold()


def test_a_session_falls_in_the_buckets_its_keys_and_matches_name():
    per_user = BudgetPolicy("u", ("user",), "total_tokens", "10", "1h", HOUR, "reject")
    per_channel = BudgetPolicy("c", ("channel",), "total_tokens", "10", "1h", HOUR, "reject")
    only_b = BudgetPolicy("b", (), "cost_usd", "1", "1h", HOUR, "reject", (("agent", "b"),))
    slack = {"subject": {"issuer": "slack", "id": "U1"}, "metadata": {"slack_channel": "C1"}}
    refs = buckets_for((per_user, per_channel, only_b), context_of("s1", "a", slack))
    assert [(r.policy.name, r.group) for r in refs] == [("u", "user=slack:U1"), ("c", "channel=C1")]
    api = {"subject": {"issuer": "api", "id": "k1"}}
    refs = buckets_for((per_user, per_channel, only_b), context_of("s1", "b", api))
    assert [(r.policy.name, r.group) for r in refs] == [("u", "user=api:k1"), ("b", "")]


def test_a_settled_call_is_charged_in_each_buckets_unit():
    tokens = BudgetPolicy("t", (), "total_tokens", "10", "1h", HOUR, "reject")
    dollars = BudgetPolicy("d", (), "cost_usd", "1", "1h", HOUR, "reject")
    refs = [BucketRef(tokens, ""), BucketRef(dollars, "")]
    s = Session()
    [run] = runs(s.say("hi"))
    reply = text_reply("done")
    reply["cost"] = "0.0012"
    t = s.apply(LlmCallSettled(run.call_id, 1, response=reply))
    [charge] = charges(refs, "s1", t.events, 5)
    total = next(e for e in t.events if e["payload"]["type"] == "llm.call.completed")["payload"]
    assert charge.id == f"s1/{run.call_id}/1" and charge.at_ms == 5
    assert [n for _, n in charge.buckets] == [total["usage"]["total"], 1_200_000]


def test_a_window_counts_its_last_sixty_sub_buckets_and_frees_up_from_the_oldest():
    policy = BudgetPolicy("t", (), "total_tokens", "100", "1h", HOUR, "reject")
    slot = policy.slot_ms  # a minute
    now = 1_000 * slot
    slots = {1_000 - 59: 60, 1_000 - 30: 50, 1_000 - 60: 999}  # the last is out already
    used, frees_at = usage_in_window(slots, policy, now)
    assert used == 110
    assert frees_at == (1_000 - 59 + 60) * slot  # the oldest leaving brings it to 50 < 100
    assert usage_in_window({1_000: 99}, policy, now) == (99, None)
