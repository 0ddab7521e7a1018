"""Property tests: random input sequences keep the machine's invariants."""

from __future__ import annotations

import copy

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.machine import (
    CallLost,
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
    elif kind == "view":
        ids = [i for i, n_ in s.state.nodes.items() if n_.message["role"] == "user"]
        view = [{"id": i, "role": "user", "content": "x"} for i in ids[: op[1]]]
        s.client({"type": "client.messages", "agent_id": "a", "messages": view})


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


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ops, min_size=1, max_size=40))
def test_random_inputs_keep_the_invariants(program):
    s = Session()
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
