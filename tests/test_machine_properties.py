"""Property tests: random input sequences keep the machine's invariants."""

from __future__ import annotations

import copy

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.machine import (
    CallLost,
    CallSettled,
    DecisionAnswered,
    DecisionFailed,
    DecisionTimerFired,
    ExecuteAnswered,
    ExecuteFailed,
    LlmCallSettled,
    MachineError,
    TimerFired,
    state_to_json,
)
from tests.machine_helpers import Session, text_reply, tool_reply

ERR = {"message": "boom", "code": "provider_error"}

outcomes = st.sampled_from(["text", "client_tools", "mixed_tools", "retryable", "final", "length"])
ops = st.one_of(
    st.tuples(st.just("say"), st.booleans(), st.sampled_from([None, "T1", "T2", "T3"])),
    st.tuples(st.just("settle"), st.integers(0, 3), outcomes, st.integers(-1, 1)),
    st.tuples(st.just("timer"), st.integers(0, 3), st.integers(0, 2)),
    st.tuples(st.just("lost"), st.integers(0, 3), st.integers(-1, 0)),
    st.tuples(st.just("tool"), st.integers(0, 3), st.booleans()),
    st.tuples(st.just("view"), st.integers(0, 4)),
)
worker_ops = st.one_of(
    ops,
    # Mostly accept the proposal, so programs get past the first decisions.
    st.tuples(st.just("answer"), st.sampled_from([0, 0, 0, 0, 0, 1, 2, 3, 4, 5])),
    st.tuples(st.just("auto"), outcomes),
    st.tuples(st.just("auto"), outcomes),
    st.tuples(st.just("auto"), outcomes),
    st.tuples(st.just("exec"), st.integers(0, 3), st.integers(0, 4)),
    st.tuples(st.just("dtimer"), st.integers(1, 3)),
    st.tuples(st.just("resume"), st.sampled_from(["i1", "i2", "nope"])),
)


def pick(s: Session, i: int, kind: str | None = None) -> tuple[str, int]:
    calls = sorted(
        (c for c in s.state.calls.values() if kind is None or c.kind == kind),
        key=lambda c: c.id,
    )
    if not calls:
        return (f"ghost-{i}", 1)
    c = calls[i % len(calls)]
    return c.id, c.attempt


def reply_for(outcome: str, n: int) -> dict:
    if outcome == "text":
        return text_reply(f"reply {n}")
    if outcome == "client_tools":
        return tool_reply((f"c{n}a", "confirm", "{}"), (f"c{n}b", "confirm", "{}"))
    if outcome == "mixed_tools":
        return tool_reply((f"c{n}a", "confirm", "{}"), (f"c{n}b", "lookup", "{}"))
    return text_reply("cut") | {"finish_reason": "length"}


def run_op(s: Session, op: tuple, n: int) -> None:
    kind = op[0]
    if kind == "say":
        extra = {"queue": op[1]}
        if op[2]:
            extra["turn_id"] = op[2]
        s.say(f"message {n}", **extra)
    elif kind == "settle":
        cid, attempt = pick(s, op[1], "llm")
        attempt += op[3]
        outcome = op[2]
        if outcome == "retryable":
            s.apply(LlmCallSettled(cid, attempt, error=ERR, retryable=True))
        elif outcome == "final":
            s.apply(LlmCallSettled(cid, attempt, error=ERR))
        else:
            s.apply(LlmCallSettled(cid, attempt, response=reply_for(outcome, n)))
    elif kind == "timer":
        cid, attempt = pick(s, op[1], "llm")
        s.apply(TimerFired(cid, attempt + op[2]))
    elif kind == "lost":
        cid, attempt = pick(s, op[1], "llm")
        s.apply(CallLost(cid, attempt + op[2]))
    elif kind == "tool":
        cid, _ = pick(s, op[1], "tool")
        if op[2]:
            s.client({"type": "tool.result", "id": cid, "result": "done"})
        else:
            s.client({"type": "tool.error", "id": cid, "error": "no", "retryable": False})
    elif kind == "answer":
        answer_decision(s, op[1])
    elif kind == "auto":
        step_forward(s, op[1], n)
    elif kind == "exec":
        calls = sorted(
            (c for c in s.state.calls.values() if c.handler == "worker" and c.status == "running"),
            key=lambda c: c.id,
        )
        if calls:
            c = calls[op[1] % len(calls)]
            if op[2] == 0 and c.kind == "tool":
                s.apply(
                    ExecuteAnswered(
                        c.id, c.attempt, {"actions": [{"type": "tool.result", "result": "r"}]}
                    )
                )
            elif op[2] == 0:
                resp = {"actions": [{"type": "llm.result", "response": text_reply("w")}]}
                s.apply(ExecuteAnswered(c.id, c.attempt, resp))
            elif op[2] == 1:
                s.apply(ExecuteAnswered(c.id, c.attempt, {}))
            elif op[2] == 2:
                s.apply(ExecuteFailed(c.id, c.attempt, ERR, retryable=True))
            elif op[2] == 3:
                s.apply(CallSettled(c.id, c.attempt, result="late"))
            else:
                s.apply(ExecuteAnswered(c.id, c.attempt + 1, {}))
    elif kind == "dtimer":
        d = s.state.decision
        if d is not None:
            s.apply(DecisionTimerFired(d.id, d.attempt + op[1] - 1))
    elif kind == "resume":
        s.client({"type": "interrupt.resume", "interrupt_id": op[1]})
    elif kind == "view":
        ids = [i for i, n_ in s.state.nodes.items() if n_.message["role"] == "user"]
        view = [{"id": i, "role": "user", "content": "x"} for i in ids[: op[1]]]
        s.client({"type": "client.messages", "agent_id": "a", "messages": view})


def step_forward(s: Session, outcome: str, n: int) -> None:
    """Do the natural next thing, so random programs reach deep states."""
    calls = sorted(s.state.calls.values(), key=lambda c: c.id)
    if s.state.decision is not None and s.state.decision.status == "running":
        answer_decision(s, 0)
    elif running := [c for c in calls if c.status == "running" and c.handler == "server"]:
        c = running[0]
        s.apply(LlmCallSettled(c.id, c.attempt, response=reply_for(outcome, n)))
    elif running := [c for c in calls if c.status == "running" and c.handler == "worker"]:
        c = running[0]
        result = {"actions": [{"type": "tool.result", "result": "r"}]}
        s.apply(ExecuteAnswered(c.id, c.attempt, result))


def answer_decision(s: Session, choice: int) -> None:
    d = s.state.decision
    if d is None:
        return
    if choice == 0:
        s.apply(DecisionAnswered(d.id, d.attempt, d.proposed))
    elif choice == 1:
        s.apply(DecisionAnswered(d.id, d.attempt, {}))
    elif choice == 2:
        bad = {"actions": [{"type": "tool.result", "id": "ghost", "result": 1}]}
        s.apply(DecisionAnswered(d.id, d.attempt, bad))
    elif choice == 3:
        s.apply(DecisionFailed(d.id, d.attempt, ERR, retryable=True))
    elif choice == 4:
        pause = {"actions": [{"type": "interrupt", "interrupt_id": "i1", "reason": "ok?"}]}
        s.apply(DecisionAnswered(d.id, d.attempt, pause))
    else:
        s.apply(DecisionAnswered(d.id, d.attempt - 1, d.proposed))


def check_invariants(s: Session, opened: dict[str, int]) -> None:
    st_ = s.state
    assert [e["seq"] for e in s.log] == list(range(1, len(s.log) + 1)), "seq is gapless from 1"
    if st_.turn is None:
        assert not st_.calls, "no call outlives its turn"
        assert not st_.queue, "a queued turn starts as soon as the session is idle"
    running = [t for t, status in st_.turns.items() if status == "running"]
    assert len(running) == (0 if st_.turn is None else 1), "at most one live turn"
    # Every opened call is closed exactly once, or is still open.
    closes: dict[str, int] = {}
    for e in s.log:
        p = e["payload"]
        if p["type"].endswith(".call.requested"):
            opened[p["id"]] = opened.get(p["id"], 0) + 1
        elif p["type"] in ("llm.call.completed", "tool.call.completed") or (
            p["type"].endswith(".call.errored") and p["final"]
        ):
            closes[p["id"]] = closes.get(p["id"], 0) + 1
    assert all(n == 1 for n in opened.values()), "a call id is opened once"
    assert all(n == 1 for n in closes.values()), "a call is closed once"
    still_open = set(opened) - set(closes)
    assert still_open == set(st_.calls), "open calls are exactly those not yet closed"
    # At most one decision is live, and a free slot never leaves a trigger waiting.
    if st_.decision is None:
        assert not st_.pending or st_.turn is None, "a waiting trigger takes the free slot"
    live = set()
    for e in s.log:
        p = e["payload"]
        if p["type"] == "decision.dispatched":
            live.add(p["decision_id"])
        elif p["type"] == "decision.completed" or (p["type"] == "decision.errored" and p["final"]):
            live.discard(p["decision_id"])
        elif p["type"] in ("turn.completed", "turn.failed"):
            live.clear()
    assert live == ({st_.decision.id} if st_.decision else set()), "one live decision"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ops, min_size=1, max_size=40))
def test_random_inputs_keep_the_invariants(program):
    run_program(Session(), program)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(worker_ops, min_size=1, max_size=60))
def test_random_inputs_keep_the_invariants_with_a_worker_deciding(program):
    run_program(Session(decider="worker"), program)


def run_program(s: Session, program: list) -> None:
    s.say("start")
    for n, op in enumerate(program):
        before = state_to_json(s.state)
        log_len = len(s.log)
        try:
            run_op(s, op, n)
        except MachineError:
            assert state_to_json(s.state) == before, "a refused input changes nothing"
            assert len(s.log) == log_len
        check_invariants(s, {})
    s.check_fold()
    # Folding any prefix of the log is a valid state too.
    half = copy.deepcopy(s.log[: len(s.log) // 2])
    if half:
        from engine.machine import fold

        assert fold(half).seq == len(half)
