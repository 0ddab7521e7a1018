"""RunTranslator alone: our events and deltas in the orders one read may hand them over,
out as AG-UI events (each checked against `ag_ui.core`, as the endpoint's are)."""

from __future__ import annotations

from typing import Any

from engine.api.agui_events import RunTranslator, sse
from tests.agui_helpers import frames, squeeze

TURN = "turn-1"
CALL = "llm_1"


def event(seq: int, payload: dict[str, Any], turn: str = TURN) -> dict[str, Any]:
    return {"session_id": "s", "seq": seq, "occurred_at": "…", "turn_id": turn, "payload": payload}


def requested(seq: int = 1, call: str = CALL) -> dict[str, Any]:
    return event(seq, {"type": "llm.call.requested", "id": call, "handler": "server"})


def reply(seq: int, text: str, call: str = CALL, **more: Any) -> dict[str, Any]:
    message = {"id": call, "role": "assistant", "content": text, **more}
    return event(seq, {"type": "message.new", "message": message})


def delta(seq: int, text: str, attempt: int = 1, **more: Any) -> dict[str, Any]:
    return {"call_id": CALL, "attempt": attempt, "seq": seq, "text": text, **more}


def completed(seq: int) -> dict[str, Any]:
    usage = {"input": 3, "output": 2, "total": 5, "cache_read": 0, "cache_write": 0}
    return event(seq, {"type": "turn.completed", "turn_id": TURN, "cost": "0", "usage": usage})


def run(*batches: tuple[list[dict[str, Any]], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The translator fed `(events, deltas)` batches; its output as checked wire events."""
    translator = RunTranslator("s", "run-1", TURN)
    out = translator.started()
    for events, deltas in batches:
        out += translator.feed(events, deltas)
    return frames(b"".join(sse(e) for e in out))


def text(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")


def test_deltas_a_read_hands_over_after_the_reply_still_stream_before_its_end():
    events = run(
        ([requested(), reply(2, "Hi there"), completed(3)], [delta(1, "Hi"), delta(2, " there")])
    )
    assert squeeze([e["type"] for e in events]) == [
        "RUN_STARTED",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "RUN_FINISHED",
    ]
    assert text(events) == "Hi there"


def test_deltas_before_their_call_is_known_wait_for_it():
    events = run(([], [delta(1, "Early")]), ([requested()], [delta(2, " bird")]))
    assert text(events) == "Early bird"


def test_a_retry_or_a_late_join_streams_nothing_new_and_the_reply_completes_the_text():
    # Attempt 1 streamed "Hel"; attempt 2's deltas cannot be shown (no take-backs).
    events = run(
        ([requested()], [delta(1, "Hel")]),
        ([], [delta(1, "Hello", attempt=2), delta(2, " world", attempt=2)]),
        ([reply(2, "Hello world"), completed(3)], []),
    )
    assert text(events) == "Hello world"
    # A stream joined late (its first delta is not seq 1): the recorded reply, whole.
    late = run(([requested()], [delta(3, "lo")]), ([reply(2, "Hello"), completed(3)], []))
    assert text(late) == "Hello"


def test_other_turns_and_the_clients_own_messages_are_not_streamed():
    user = event(
        1, {"type": "message.new", "message": {"id": "u1", "role": "user", "content": "q"}}
    )
    other = reply(2, "old answer", call="llm_0")
    other["turn_id"] = "turn-0"
    events = run(([user, other, requested(3), reply(4, "new"), completed(5)], []))
    assert text(events) == "new"
    assert [e["messageId"] for e in events if e["type"] == "TEXT_MESSAGE_START"] == [CALL]


def test_tool_calls_hang_on_their_message_and_a_client_calls_result_is_not_echoed():
    call = {"id": "c1", "type": "function", "function": {"name": "pick", "arguments": '{"a":1}'}}
    tool_requested = event(3, {"type": "tool.call.requested", "id": "c1", "handler": "client"})
    result = event(
        5,
        {
            "type": "message.new",
            "message": {"id": "t1", "role": "tool", "tool_call_id": "c1", "content": "x"},
        },
    )
    translator = RunTranslator("s", "run-1", TURN)
    out = translator.feed([requested(), reply(2, "", tool_calls=[call]), tool_requested], [])
    assert translator.open_client_calls == {"c1"}
    out += translator.paused(["c1"], [])
    wire = frames(b"".join(sse(e) for e in out))
    assert [e["type"] for e in wire] == [
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "RUN_FINISHED",
    ]
    assert wire[0]["parentMessageId"] == CALL and wire[1]["delta"] == '{"a":1}'
    assert wire[-1]["outcome"] == {"type": "success", "pendingToolCallIds": ["c1"]}
    # The next run on the same turn: the client's result is its own, never sent back.
    resumed = RunTranslator("s", "run-2", TURN, client_calls={"c1"})
    assert resumed.feed([result], []) == []


def test_nothing_follows_the_end_of_a_run():
    failed = event(
        2, {"type": "turn.failed", "turn_id": TURN, "error": {"message": "no", "code": "refused"}}
    )
    events = run(([requested(), failed, reply(3, "late")], [delta(1, "x")]))
    assert [e["type"] for e in events] == ["RUN_STARTED", "RUN_ERROR"]
    assert events[-1] == {"type": "RUN_ERROR", "message": "no", "code": "refused"}
