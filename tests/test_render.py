"""One turn's events and deltas project onto one Slack message (SPEC §14)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from slack_sdk.models.blocks import Block

from bot.rendering.layout import DEFAULT_LIMIT, Rendered
from bot.rendering.prompts import interrupt_prompt, parse_interrupt_action, resolved_prompt
from bot.rendering.split import split_markdown
from bot.rendering.turn_view import TurnView
from engine.machine.evolve import EVENT_TYPES

TURN = "turn_1"
T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def ev(kind: str, at: float = 0.0, turn: str | None = TURN, **payload: Any) -> dict[str, Any]:
    """An engine event `at` seconds after T0, shaped as engine/machine/core.py emits it."""
    stamp = (T0 + timedelta(seconds=at)).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    event = {
        "session_id": "s1",
        "seq": 1,
        "occurred_at": stamp,
        "payload": {"type": kind, **payload},
    }
    if turn is not None:
        event["turn_id"] = turn
    return event


def delta(call: str, seq: int, text: str | None = None, attempt: int = 1, **more: Any) -> dict:
    return {"call_id": call, "attempt": attempt, "seq": seq, "text": text, **more}


def assistant(call: str, content: Any, at: float = 0.0) -> dict[str, Any]:
    message = {"id": call, "role": "assistant", "content": content}
    return ev("message.new", at, message=message, parent_id="m0")


def llm(call: str, at: float = 0.0) -> list[dict[str, Any]]:
    return [
        ev("llm.call.requested", at, id=call, handler="server", params={}, retry={}),
        ev("llm.call.dispatched", at, id=call, attempt=1, deadline_ms=None),
    ]


def tool(call: str, name: str, at: float, args: str = '{"q":"x"}') -> list[dict[str, Any]]:
    return [
        ev("tool.call.requested", at, id=call, name=name, arguments=args, handler="worker"),
        ev("tool.call.dispatched", at, id=call, attempt=1, deadline_ms=None),
    ]


def completed(at: float = 9.0) -> dict[str, Any]:
    return ev("turn.completed", at, turn_id=TURN, cost="0", usage={})


def llm_errored(call: str, attempt: int, final: bool, at: float = 1.0) -> dict[str, Any]:
    error = {"message": "x", "code": "provider_error"}
    return ev("llm.call.errored", at, id=call, attempt=attempt, error=error, final=final)


def tool_errored(call: str, message: str, final: bool, at: float) -> dict[str, Any]:
    error = {"message": message, "code": "handler_error"}
    return ev("tool.call.errored", at, id=call, attempt=1, error=error, final=final)


def interrupted(iid: str, payload: Any, at: float = 1.0, turn: str | None = TURN) -> dict:
    return ev(
        "session.interrupted", at, turn, interrupt_id=iid, origin="worker", reason="r",
        payload=payload,
    )  # fmt: skip


def failed_turn(message: str, at: float = 1.0) -> dict[str, Any]:
    error = {"message": message, "code": "provider_error"}
    return ev("turn.failed", at, turn_id=TURN, error=error, cost="0", usage={})


def ok_result(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}]}


def run(steps: list[dict[str, Any]]) -> tuple[TurnView, Rendered]:
    """Fold events and deltas (deltas are the dicts without `payload`)."""
    view = TurnView(TURN)
    for step in steps:
        if "payload" in step:
            view.apply_event(step)
        else:
            view.apply_delta(step)
    return view, view.render()


def answer_of(r: Rendered) -> str | None:
    texts = [b["text"] for b in r.blocks if b["type"] == "markdown"]
    return texts[0] if texts else None


def context_of(r: Rendered) -> list[str]:
    return [e["text"] for b in r.blocks if b["type"] == "context" for e in b["elements"]]


USER = ev("message.new", 0, message={"id": "m0", "role": "user", "content": "hi"})
SEQUENCES = [
    # (name, steps, answer markdown, status, done, failed)
    ("nothing yet", [ev("turn.started", 0, turn_id=TURN), USER], None, "is thinking…", False, None),
    (
        "streaming a partial answer",
        [*llm("c1"), delta("c1", 1, "Hel"), delta("c1", 2, "lo **wor")],
        "Hello **wor",
        "is writing…",
        False,
        None,
    ),
    (
        "reasoning only",
        [*llm("c1"), delta("c1", 1, reasoning="hmm")],
        None,
        "is thinking…",
        False,
        None,
    ),
    (
        "duplicate and out-of-order deltas",
        [*llm("c1"), *(delta("c1", n, t) for n, t in [(2, "b"), (1, "a"), (2, "b"), (3, "c")])],
        "abc",
        "is writing…",
        False,
        None,
    ),
    (
        "an open fence is closed while streaming",
        [*llm("c1"), delta("c1", 1, "Code:\n```py\nx = 1")],
        "Code:\n```py\nx = 1\n```",
        "is writing…",
        False,
        None,
    ),
    (
        "an errored attempt's deltas are dropped, late ones too",
        [
            *llm("c1"),
            delta("c1", 1, "garbage"),
            llm_errored("c1", 1, final=False),
            delta("c1", 2, " late"),
            ev("llm.call.dispatched", 2, id="c1", attempt=2, deadline_ms=None),
            delta("c1", 1, "Good", attempt=2),
        ],
        "Good",
        "is writing…",
        False,
        None,
    ),
    (
        "a late delta of an errored attempt stays dropped",
        [*llm("c1"), delta("c1", 1, "a"), llm_errored("c1", 1, final=False), delta("c1", 2, "b")],
        None,
        "is thinking…",
        False,
        None,
    ),
    (
        "the recorded message replaces the streamed text",
        [
            *llm("c1"),
            delta("c1", 1, "Draft"),
            ev("llm.call.completed", 2, id="c1", attempt=1),
            assistant("c1", "Final **answer**", 2),
            completed(),
        ],
        "Final **answer**",
        None,
        True,
        None,
    ),
    (
        "content parts",
        [*llm("c1"), assistant("c1", [{"type": "text", "text": t} for t in "ab"]), completed()],
        "ab",
        None,
        True,
        None,
    ),
    (
        "text before a tool call and the final answer",
        [
            *llm("c1"),
            delta("c1", 1, "Let me look."),
            assistant("c1", "Let me look.", 1),
            *tool("t1", "lookup", 1),
            ev("tool.call.completed", 2, id="t1", result=ok_result("42")),
            *llm("c2", 2),
            delta("c2", 1, "It is 42."),
        ],
        "Let me look.\n\nIt is 42.",
        "is writing…",
        False,
        None,
    ),
    (
        "a tool running",
        [*llm("c1"), assistant("c1", None), *tool("t1", "lookup", 1), *tool("t2", "search", 1)],
        None,
        "is calling lookup, search…",
        False,
        None,
    ),
    (
        "a paused turn shows no working status",
        [*llm("c1"), assistant("c1", "Need approval."), interrupted("i1", {"message": "Go?"})],
        "Need approval.",
        None,
        False,
        None,
    ),
    (
        "a worker's status override",
        [*llm("c1"), ev("channels.updated", 1, channels={"slack": {"status": "is paging…"}})],
        None,
        "is paging…",
        False,
        None,
    ),
    (
        "a failed turn",
        [
            *llm("c1"),
            delta("c1", 1, "partial"),
            llm_errored("c1", 1, final=True),
            failed_turn("the model call failed\nTraceback (most recent call last):\n  File x"),
        ],
        None,
        None,
        True,
        "the model call failed",
    ),
    (
        "another turn's events are not ours",
        [
            *llm("c1"),
            delta("c1", 1, "mine"),
            ev("turn.completed", 3, turn="turn_2", turn_id="turn_2", cost="0", usage={}),
            interrupted("i9", None, turn=None),
        ],
        "mine",
        "is writing…",
        False,
        None,
    ),
]


@pytest.mark.parametrize(
    ("steps", "answer", "status", "done", "failed"),
    [s[1:] for s in SEQUENCES],
    ids=[s[0] for s in SEQUENCES],
)
def test_event_sequences(
    steps: list[dict[str, Any]],
    answer: str | None,
    status: str | None,
    done: bool,
    failed: str | None,
) -> None:
    _, r = run(steps)
    assert answer_of(r) == answer
    assert (r.status, r.done, r.failed) == (status, done, failed)
    assert r.text
    _assert_valid_blocks(r.blocks)


def test_the_raw_answer_only_grows_while_a_reply_streams() -> None:
    view, _ = run([*llm("c1"), delta("c1", 1, "Run:\n```sh\nls")])
    assert view.answer(closed=False) == "Run:\n```sh\nls"
    assert view.answer() == "Run:\n```sh\nls\n```"
    view.apply_delta(delta("c1", 2, " -l\n```\nDone."))
    assert view.answer(closed=False) == view.answer() == "Run:\n```sh\nls -l\n```\nDone."


def test_tool_lines_show_state_and_duration_and_details_only_at_the_end() -> None:
    steps = [
        *llm("c1"),
        assistant("c1", None),
        *tool("t1", "lookup", 1.0, args='{"q": "<weather>"}'),
        ev("tool.call.completed", 2.5, id="t1", result=ok_result("sunny & warm")),
        *tool("t2", "search", 3.0),
        tool_errored("t2", "timeout", final=False, at=3.5),
        ev("call.retry_scheduled", 3.5, id="t2", attempt=2, due_at="x"),
        *tool("t3", "fetch", 4.0),
        tool_errored("t3", "404 not found", final=True, at=4.2),
        *tool("t4", "run", 5.0),
    ]
    view, r = run(steps)
    assert context_of(r) == [
        "✓ `lookup` 1.5 s\n"
        "⏳ `search` retrying (attempt 2)\n"
        "✗ `fetch` 0.2 s — 404 not found\n"
        "⏳ `run` running"
    ]
    assert r.status == "is calling search, run…"
    view.apply_event(ev("tool.call.dispatched", 6, id="t2", attempt=2, deadline_ms=None))
    view.apply_event(
        ev("tool.call.completed", 73.0, id="t2", result={"content": [], "isError": True})
    )
    view.apply_event(
        ev("tool.call.completed", 6.0, id="t4", result={"structuredContent": {"n": 1}})
    )
    view.apply_event(ev("llm.call.requested", 7, id="c2", handler="server", params={}, retry={}))
    view.apply_event(assistant("c2", "Done.", 8))
    view.apply_event(completed())
    r = view.render()
    assert context_of(r)[0] == (
        '✓ `lookup` 1.5 s · `{"q": "&lt;weather&gt;"}` → `sunny &amp; warm`\n'
        '✗ `search` 1 min 10 s · `{"q":"x"}`\n'
        '✗ `fetch` 0.2 s — 404 not found · `{"q":"x"}`\n'
        '✓ `run` 1.0 s · `{"q":"x"}` → `{"n":1}`'
    )
    assert r.status is None and answer_of(r) == "Done."
    _assert_valid_blocks(r.blocks)


def test_subagents_show_as_lines() -> None:
    steps = [
        ev("subagent.requested", 1, id="child-1", name="researcher"),
        ev("subagent.started", 1, id="child-1"),
    ]
    _, r = run(steps)
    assert context_of(r) == ["⏳ subagent `researcher` running"]
    assert r.status == "is calling researcher…"
    view, _ = run([*steps, ev("subagent.completed", 4, id="child-1", result=ok_result("found"))])
    assert context_of(view.render())[0].startswith("✓ subagent `researcher` 3.0 s")


def test_many_tool_calls_stay_within_one_context_block() -> None:
    steps = [e for i in range(200) for e in tool(f"t{i}", f"tool_number_{i}", i)]
    _, r = run([*steps, completed(300)])
    text, no_reply = context_of(r)
    assert no_reply == "_No reply._"
    assert len(text) <= 3000
    assert text.startswith("_… ") and "earlier calls_" in text
    assert text.endswith("`tool_number_199` running")  # the latest calls are the ones kept
    _assert_valid_blocks(r.blocks)


def test_a_finished_turn_without_text_says_so() -> None:
    _, r = run([*llm("c1"), assistant("c1", None), completed()])
    assert context_of(r) == ["_No reply._"] and r.text == "No reply."
    assert r.continuations == [] and r.done


def test_a_failure_is_shown_in_the_message_and_the_fallback() -> None:
    err = {"message": "x" * 1000}
    _, r = run([failed_turn(err["message"])])
    assert r.failed is not None and len(r.failed) <= 300 and r.failed.endswith("…")
    assert context_of(r) == [f":warning: {r.failed}"]
    assert r.text == f":warning: {r.failed}"


def test_fallback_text_is_mrkdwn_and_short() -> None:
    long_answer = "**Summary** with a [link](https://x.io).\n\n" + "word & more\n" * 2000
    _, r = run([*llm("c1"), assistant("c1", long_answer), completed()])
    assert r.text.startswith("*Summary* with a <https://x.io|link>.")
    assert len(r.text) <= 3000  # chat.update rejects text over 4,000 characters
    assert "&amp;" in r.text and " & " not in r.text


def test_interrupts_are_tracked_until_resumed() -> None:
    payload = {"message": "Deploy?"}
    event = interrupted("i1", payload)
    view, _ = run([event])
    assert view.interrupts == {"i1": event["payload"]}
    view.apply_event(ev("session.interrupt_resumed", 2, interrupt_id="i1", payload={"ok": True}))
    assert view.interrupts == {}


def test_unknown_event_types_are_errors_but_every_engine_type_is_known() -> None:
    view = TurnView(TURN)
    with pytest.raises(ValueError, match="unknown event type"):
        view.apply_event(ev("llm.call.exploded", 0, id="c1"))
    for kind in sorted(EVENT_TYPES):
        view.apply_event(ev(kind, 0, turn="other"))  # known types of another turn: skipped


def test_an_off_mcp_connection_shows_nothing_in_slack() -> None:
    """The note is for the CLI and the console; the channel sees the reply only."""
    off = "its command names ONCALL_REPO, which is not set"
    _, r = run(
        [
            ev("decision.held", 0, trigger={}, proposed={}),
            ev(
                "connector.sync.requested",
                0,
                id="s1",
                name="mcp.changes",
                handler="server",
                retry={},
            ),
            ev("connector.sync.dispatched", 0, id="s1", attempt=1, deadline_ms=None),
            ev("connector.synced", 0, id="s1", path="mcp.changes", tools=[], off=off),
            ev("decision.released", 0),
            *llm("c1"),
            assistant("c1", "Check the pool."),
            completed(),
        ]
    )
    assert answer_of(r) == "Check the pool."
    assert not [t for t in context_of(r) if "mcp" in t or "off" in t]
    assert "mcp" not in r.text


def test_render_refuses_a_limit_a_markdown_block_cannot_take() -> None:
    with pytest.raises(ValueError):
        TurnView(TURN).render(limit=12_001)


# -- long answers -----------------------------------------------------------------------

LONG = (
    "# Plan\n\n"
    + "\n\n".join(f"Paragraph {i}: " + "lorem ipsum dolor " * 12 for i in range(30))
    + "\n\n```python\n"
    + "\n".join(f"print('line {i}')  # {'x' * 20}" for i in range(60))
    + "\n```\n\n"
    + "A-very-long-token-without-spaces-" * 40
    + "\n\nThe end."
)


def test_a_long_answer_is_split_into_continuations() -> None:
    _, r = run([*llm("c1"), assistant("c1", LONG), completed()])
    pieces = [answer_of(r), *r.continuations]
    assert len(pieces) >= 2 and all(p is not None for p in pieces)
    for piece in pieces:
        assert piece is not None and 0 < len(piece) <= DEFAULT_LIMIT
        _assert_fences_balanced(piece)
    small = split_markdown(LONG, 500)
    assert len(small) > 10
    for piece in small:
        assert len(piece) <= 500
        _assert_fences_balanced(piece)
    # Nothing is lost or duplicated: the pieces, minus the fences added at cuts, are the text.
    assert _content(LONG) == "".join(_content(p) for p in small)
    code = [p for p in small if "print(" in p]
    assert len(code) >= 2 and all(p.startswith("```python") or "```python" in p for p in code)


def test_split_prefers_paragraphs_then_lines_then_spaces() -> None:
    paragraphs = "a" * 120 + "\n\n" + "b" * 50 + "\n" + "c" * 50
    assert split_markdown(paragraphs, 200) == ["a" * 120, "b" * 50 + "\n" + "c" * 50]
    lines = "a" * 40 + "\n\n" + "b" * 100 + "\n" + "c" * 100
    assert split_markdown(lines, 200) == ["a" * 40 + "\n\n" + "b" * 100, "c" * 100]
    words = ("word " * 60).strip()
    pieces = split_markdown(words, 200)
    assert all(p.startswith("word") and p.endswith("word") for p in pieces)
    assert " ".join(pieces) == words
    blob = "x" * 450
    assert split_markdown(blob, 200) == ["x" * 200, "x" * 200, "x" * 50]


def test_split_closes_and_reopens_a_code_block() -> None:
    text = "Intro\n\n```sql\n" + "\n".join(f"select {i};" for i in range(40)) + "\n```\nAfter."
    pieces = split_markdown(text, 200)
    assert pieces[0].startswith("Intro\n\n```sql\n") and pieces[0].endswith("\n```")
    for piece in pieces[1:-1]:
        assert piece.startswith("```sql\n") and piece.endswith("\n```")
    assert pieces[-1].endswith("```\nAfter.")


def test_streaming_never_moves_a_cut_once_made() -> None:
    view = TurnView(TURN)
    for e in llm("c1"):
        view.apply_event(e)
    fixed: dict[int, str] = {}
    for seq, start in enumerate(range(0, len(LONG), 23), start=1):
        view.apply_delta(delta("c1", seq, LONG[start : start + 23]))
        r = view.render(limit=500)
        pieces = [answer_of(r) or "", *r.continuations]
        for i, piece in enumerate(pieces[:-1]):
            assert fixed.setdefault(i, piece) == piece, f"piece {i} changed at seq {seq}"
            assert len(piece) <= 500
        _assert_valid_blocks(r.blocks)
    assert len(fixed) > 10


def _content(markdown: str) -> str:
    """The text without whitespace or fences: what a split must keep, once and in order."""
    return "".join(w for w in markdown.split() if not w.startswith("```"))


def _assert_fences_balanced(piece: str) -> None:
    assert sum(1 for line in piece.split("\n") if line.startswith("```")) % 2 == 0, piece


# -- interrupt prompts ------------------------------------------------------------------

OPTIONS = [
    {"label": "Approve", "value": {"ok": True}, "style": "primary"},
    {"label": "Reject", "value": {"ok": False}, "style": "danger"},
    {"label": "Also primary " + "z" * 100, "value": 3, "style": "primary"},
    {"label": "Odd style", "value": "x", "style": "purple"},
]


def test_interrupt_prompt_shape() -> None:
    payload = {
        "message": "Deploy **prod**?",
        "expiresAt": "2026-01-02T04:00:00Z",
        "metadata": {"options": OPTIONS},
    }
    prompt = interrupt_prompt("int_7", payload, "approval")
    assert prompt["text"] == "Deploy *prod*?"
    markdown, actions, expiry = prompt["blocks"]
    assert markdown == {"type": "markdown", "text": "Deploy **prod**?"}
    assert actions["type"] == "actions" and actions["block_id"] == "subs_interrupt:int_7"
    buttons = actions["elements"]
    assert [b["action_id"] for b in buttons] == [f"subs_interrupt:int_7:{i}" for i in range(4)]
    assert [b["value"] for b in buttons] == ["0", "1", "2", "3"]  # indexes, never the values
    assert [b.get("style") for b in buttons] == ["primary", "danger", None, None]
    assert buttons[2]["text"]["text"].endswith("…") and len(buttons[2]["text"]["text"]) == 75
    stamp = int(datetime(2026, 1, 2, 4, tzinfo=UTC).timestamp())
    assert expiry["elements"][0]["text"] == (
        f"Expires <!date^{stamp}^{{date_short_pretty}} at {{time}}|2026-01-02T04:00:00Z>"
    )
    _assert_valid_blocks(prompt["blocks"])


def test_interrupt_prompt_without_a_message_says_why_it_paused() -> None:
    prompt = interrupt_prompt("int_8", None, "budget <exceeded>")
    assert prompt["blocks"] == [
        {"type": "section", "text": {"type": "mrkdwn", "text": "*Paused:* budget &lt;exceeded&gt;"}}
    ]
    assert prompt["text"] == "*Paused:* budget &lt;exceeded&gt;"
    _assert_valid_blocks(prompt["blocks"])


def test_interrupt_prompt_limits() -> None:
    many = {
        "message": "m" * 20_000,
        "metadata": {"options": [{"label": "", "value": i} for i in range(40)]},
    }
    prompt = interrupt_prompt("int_9", many, "r")
    markdown, actions = prompt["blocks"]
    assert len(markdown["text"]) <= 12_000 and markdown["text"].endswith("…")
    assert len(actions["elements"]) == 25 and actions["elements"][0]["text"]["text"] == "Option 1"
    assert len(prompt["text"]) <= 3000
    _assert_valid_blocks(prompt["blocks"])
    with pytest.raises(ValueError, match="too long"):
        interrupt_prompt("i" * 250, many, "r")
    bad_expiry = interrupt_prompt("int_10", {"expiresAt": "soon <ish>"}, "r")
    assert bad_expiry["blocks"][-1]["elements"][0]["text"] == "Expires soon &lt;ish&gt;"


def test_a_click_names_an_option_by_index_only() -> None:
    prompt = interrupt_prompt("sess:int:7", {"metadata": {"options": OPTIONS}}, "r")
    button = prompt["blocks"][1]["elements"][1]
    action = {"action_id": button["action_id"], "value": button["value"], "type": "button"}
    assert parse_interrupt_action(action) == ("sess:int:7", 1)
    assert parse_interrupt_action({**action, "value": '{"ok": true}'}) is None  # forged value
    assert parse_interrupt_action({"action_id": "approve", "value": "1"}) is None
    assert parse_interrupt_action({"action_id": "subs_interrupt:x:one", "value": "one"}) is None


def test_resolved_prompt_drops_buttons_and_says_who_answered() -> None:
    payload = {
        "message": "Deploy?",
        "expiresAt": "2026-01-02T04:00:00Z",
        "metadata": {"options": OPTIONS},
    }
    original = interrupt_prompt("int_7", payload, "approval")
    done = resolved_prompt(original, "Approve", "U123ABC", approved=True)
    assert done["blocks"] == [
        {"type": "markdown", "text": "Deploy?"},
        {
            "type": "context",
            "elements": [{"type": "mrkdwn", "text": "✅ Approved by <@U123ABC> · Approve"}],
        },
    ]
    assert done["text"] == "Deploy?\n✅ Approved by <@U123ABC> · Approve"
    no = resolved_prompt(original, None, "U9", approved=False)
    assert no["blocks"][-1]["elements"][0]["text"] == "❌ Declined by <@U9>"
    assert all(b["type"] != "actions" for b in no["blocks"])
    _assert_valid_blocks(done["blocks"])
    assert resolved_prompt(done, "Approve", "U123ABC", True)["blocks"][:1] == done["blocks"][:1]


def _assert_valid_blocks(blocks: list[dict[str, Any]]) -> None:
    """slack_sdk's own Block Kit validation (lengths, element counts) plus the limits it does
    not check: markdown blocks share 12,000 characters; at most 50 blocks."""
    assert len(blocks) <= 50
    assert sum(len(b["text"]) for b in blocks if b["type"] == "markdown") <= 12_000
    for block in blocks:
        parsed = Block.parse(block)
        assert parsed is not None
        parsed.validate_json()
        for element in block.get("elements", []):
            if element.get("type") == "mrkdwn":
                assert len(element["text"]) <= 3000
