"""The conversation tree (SPEC §10): edit, regenerate, append, head moves, state along the path."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.machine import DecisionAnswered, LlmCallSettled, MachineError, RunLlmCall
from engine.machine.request import control_request
from engine.machine.tree import path_to
from tests.machine_helpers import Session, text_reply


def reply_to_open_call(s: Session, text: str) -> None:
    call = next(c for c in s.state.calls.values() if c.kind == "llm")
    s.apply(LlmCallSettled(call.id, call.attempt, response=text_reply(text)))


def two_turns() -> tuple[Session, dict[str, str]]:
    """u1 → a1 → u2 → a2, ids by name."""
    s = Session()
    s.say("first")
    reply_to_open_call(s, "answer one")
    s.say("second")
    reply_to_open_call(s, "answer two")
    ids = {}
    for node_id in [n["id"] for n in path_to(s.state.nodes, s.state.head_id)]:
        msg = s.state.nodes[node_id].message
        ids[
            {"first": "u1", "answer one": "a1", "second": "u2", "answer two": "a2"}[msg["content"]]
        ] = node_id
    return s, ids


def view(s: Session, ids: dict[str, str], *names: str) -> list[dict]:
    return [dict(s.state.nodes[ids[n]].message) for n in names]


def contents(s: Session) -> list[str]:
    return [m.get("content") for m in path_to(s.state.nodes, s.state.head_id)]


def submit_view(s: Session, messages: list[dict]):
    return s.client({"type": "client.messages", "agent_id": "a", "messages": messages})


CASES = {
    "edit branches at the edited message and runs": (
        lambda s, ids: submit_view(
            s, [*view(s, ids, "u1", "a1"), {"role": "user", "content": "second, edited"}]
        ),
        ["turn.started", "head.moved", "message.new", "llm.call.requested", "llm.call.dispatched"],
        ["first", "answer one", "second, edited", "reply"],
        6,  # u2/a2 stay in the tree beside the new branch
    ),
    "regenerate records a sibling reply": (
        lambda s, ids: submit_view(s, view(s, ids, "u1", "a1", "u2")),
        ["turn.started", "head.moved", "llm.call.requested", "llm.call.dispatched"],
        ["first", "answer one", "second", "reply"],
        5,
    ),
    "a view ending at an earlier reply only moves the head": (
        lambda s, ids: submit_view(s, view(s, ids, "u1", "a1")),
        ["head.moved"],
        ["first", "answer one"],
        4,
    ),
    "append drops known ids and never branches": (
        lambda s, ids: s.client(
            {
                "type": "client.append",
                "agent_id": "a",
                "messages": [*view(s, ids, "u1"), {"id": "m3", "role": "user", "content": "third"}],
            }
        ),
        ["turn.started", "message.new", "llm.call.requested", "llm.call.dispatched"],
        ["first", "answer one", "second", "answer two", "third", "reply"],
        6,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_tree_cases(case):
    act, new_events, final_path, nodes = CASES[case]
    s, ids = two_turns()
    t = act(s, ids)
    assert s.types(t) == new_events
    if any(isinstance(e, RunLlmCall) for e in t.effects):
        reply_to_open_call(s, "reply")
    assert contents(s) == final_path
    assert len(s.state.nodes) == nodes
    s.check_fold()


def test_regenerated_reply_is_a_sibling_of_the_old_one():
    s, ids = two_turns()
    submit_view(s, view(s, ids, "u1", "a1", "u2"))
    reply_to_open_call(s, "answer two, again")
    children_of_u2 = [n for n in s.state.nodes.values() if n.parent_id == ids["u2"]]
    assert sorted(n.message["content"] for n in children_of_u2) == [
        "answer two",
        "answer two, again",
    ]


def test_moving_the_head_away_voids_the_running_turn():
    s, ids = two_turns()
    s.say("third")
    running = s.state.turn.id
    t = submit_view(s, view(s, ids, "u1", "a1"))
    assert s.types(t) == ["head.moved", "llm.call.errored", "turn.failed"]
    assert s.state.turns[running] == "failed" and s.state.calls == {}
    assert contents(s) == ["first", "answer one"]
    s.check_fold()


def test_an_edit_while_a_turn_runs_is_refused():
    s, ids = two_turns()
    s.say("third")
    with pytest.raises(MachineError) as err:
        submit_view(s, [*view(s, ids, "u1", "a1"), {"role": "user", "content": "edited"}])
    assert err.value.code == "turn_already_active"


def test_worker_state_is_read_along_the_active_path():
    s = Session(decider="worker")
    s.say("first")

    def answer(extra: dict | None = None) -> None:
        req = control_request(s.state)
        resp = {**req["proposed"], **(extra or {})}
        s.apply(DecisionAnswered(req["decision_id"], req["attempts"], resp))

    answer()  # session.start
    answer()  # client.messages: record u1, call the model
    reply_to_open_call(s, "one")
    answer({"state": {"stage": 1}})  # llm.finished, at a1
    answer()  # turn.finished
    first_reply = s.state.head_id
    s.say("second")
    answer()
    reply_to_open_call(s, "two")
    answer({"state": {"stage": 2}})
    answer()
    assert s.state.worker_state == {"stage": 2}
    back = [dict(m) for m in path_to(s.state.nodes, first_reply)]
    t = submit_view(s, back)
    assert s.types(t) == ["head.moved"]
    assert s.state.worker_state == {"stage": 1}
    s.say("from the branch")  # the next decision sees the state as of the branch point
    assert control_request(s.state)["state"] == {"stage": 1}
    s.check_fold()


views = st.lists(
    st.tuples(st.sampled_from(["say", "prefix", "edit", "reply"]), st.integers(0, 12)),
    min_size=1,
    max_size=30,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(views)
def test_random_views_never_lose_a_node_and_keep_messages_a_path(program):
    s = Session()
    s.say("start")
    for n, (kind, k) in enumerate(program):
        seen = set(s.state.nodes)
        path = path_to(s.state.nodes, s.state.head_id)
        try:
            if kind == "reply" and any(c.kind == "llm" for c in s.state.calls.values()):
                reply_to_open_call(s, f"reply {n}")
            elif kind == "say":
                s.say(f"say {n}", queue=True)
            elif kind == "prefix":
                submit_view(s, [dict(m) for m in path[: k % (len(path) + 1)]])
            elif kind == "edit":
                prefix = [dict(m) for m in path[: k % (len(path) + 1)]]
                submit_view(s, [*prefix, {"role": "user", "content": f"edit {n}"}])
        except MachineError:
            pass
        assert seen <= set(s.state.nodes), "no node is ever lost"
        messages = path_to(s.state.nodes, s.state.head_id)
        for parent, child in itertools.pairwise(messages):
            assert s.state.nodes[child["id"]].parent_id == parent["id"]
        assert not messages or s.state.nodes[messages[0]["id"]].parent_id is None
    s.check_fold()


def _done(s: Session) -> None:
    run = next(e for e in s.last.effects if isinstance(e, RunLlmCall))
    s.apply(LlmCallSettled(run.call_id, 1, response=text_reply("ok")))


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (
            {"type": "client.message", "message": {"id": "u1", "role": "user", "content": "x"}},
            "message 'u1' is already recorded",
        ),
        (
            {
                "type": "client.messages",
                "messages": [
                    {"id": "u1", "role": "user", "content": "hi"},
                    {"id": "new", "role": "user", "content": "x"},
                    {"id": "u1", "role": "user", "content": "again"},
                ],
            },
            "message 'u1' is already recorded",
        ),
        (
            {
                "type": "client.append",
                "messages": [
                    {"id": "a", "role": "user", "content": "x"},
                    {"id": "a", "role": "user", "content": "y"},
                ],
            },
            "message 'a' appears twice",
        ),
    ],
)
def test_a_message_id_recorded_again_is_refused_before_it_can_make_a_cycle(body, problem):
    s = Session()
    s.last = s.client(
        {
            "type": "client.message",
            "agent_id": "a",
            "message": {"id": "u1", "role": "user", "content": "hi"},
        }
    )
    _done(s)
    with pytest.raises(MachineError) as err:
        s.client({**body, "agent_id": "a"})
    assert err.value.code == "duplicate_message_id" and problem in err.value.message
    assert path_to(s.state.nodes, s.state.head_id)[0]["id"] == "u1"
    s.check_fold()


def test_a_worker_answer_reusing_a_message_id_is_a_failed_attempt():
    s = Session(decider="worker")
    s.client(
        {
            "type": "client.message",
            "agent_id": "a",
            "message": {"id": "u1", "role": "user", "content": "hi"},
        }
    )
    req = control_request(s.state)
    twins = {
        "messages": [
            {"id": "twin", "role": "user", "content": "a"},
            {"id": "twin", "role": "user", "content": "b"},
        ]
    }
    t = s.apply(DecisionAnswered(req["decision_id"], req["attempts"], twins))
    (errored,) = [e["payload"] for e in t.events if e["payload"]["type"] == "decision.errored"]
    assert errored["error"]["code"] == "invalid_response"
    assert "message 'twin' appears twice" in errored["error"]["message"]
    assert "twin" not in s.state.nodes
    s.check_fold()


def test_a_cycle_an_older_version_recorded_does_not_hang_a_path():
    from engine.machine.state import Node

    nodes = {"a": Node({"id": "a"}, "b"), "b": Node({"id": "b"}, "a")}
    assert [m["id"] for m in path_to(nodes, "a")] == ["a", "b"][::-1]
