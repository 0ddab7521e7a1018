"""What one turn's Slack message shows: a pure projection of its events and token deltas.

SPEC §14: one turn is one Slack message, streamed as it is written, with tool calls and
subagent runs as compact lines. `TurnView` folds events (SPEC §13, engine/machine/evolve.py)
and deltas; `render` reads the fold and returns data for the bot shell to send. Nothing here
calls Slack (style anchor 7: reads cannot emit effects).

Limits used (notes/slack-facts.md §1.7, §5; docs.slack.dev block references):
- `markdown` block: standard Markdown, 12,000 characters cumulative per payload.
- `msg_blocks_too_long` starts around 12-13k characters of block text (undocumented), so the
  answer gets `DEFAULT_LIMIT` and the tool lines `TOOL_LINES_LIMIT` of that budget.
- `chat.update` rejects `text` over 4,000 characters (`msg_too_long`): the fallback is shorter.
- context block: at most 10 elements; a text object at most 3,000 characters.
- button: text <= 75 characters, `action_id` and `block_id` <= 255, `value` <= 2,000;
  actions block: at most 25 elements.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from engine.machine import events as ev

from .mrkdwn import escape, fence_marker, is_fence_close, to_mrkdwn

__all__ = [
    "DEFAULT_LIMIT",
    "Rendered",
    "TurnView",
    "interrupt_prompt",
    "parse_interrupt_action",
    "resolved_prompt",
    "split_markdown",
]

MARKDOWN_BLOCK_LIMIT = 12_000
DEFAULT_LIMIT = 9_000
TOOL_LINES_LIMIT = 2_500
FALLBACK_LIMIT = 3_000
BUTTON_TEXT_LIMIT = 75
ID_LIMIT = 255
ACTIONS_LIMIT = 25
BLOCKS_LIMIT = 50
ACTION_PREFIX = "subs_interrupt"
_EXPIRY_PREFIX = "subs_expiry"
_DETAIL_LIMIT = 100
_ERROR_LIMIT = 300

Event = dict[str, Any]

# Event types that change nothing a turn's message shows (SPEC §13). Anything not here and
# not in `_APPLY` is a type this module has not been taught: an error, never skipped.
_IGNORED = frozenset(
    {
        ev.SESSION_CREATED,
        ev.HEAD_MOVED,
        ev.TURN_QUEUED,
        ev.TURN_STARTED,
        ev.WORKER_STATE_UPDATED,
        ev.AGENT_UPDATED,
        ev.DECISION_QUEUED,
        ev.DECISION_DISPATCHED,
        ev.DECISION_COMPLETED,
        ev.DECISION_ERRORED,
        ev.MESSAGE_SENT,
        ev.INPUT_REJECTED,  # the turn.failed that follows says why
        ev.LLM_CALL_DISPATCHED,
        ev.TOOL_CALL_WAITING,
    }
)


@dataclass(frozen=True)
class Rendered:
    """One turn's message as Slack takes it.

    `text` is the mrkdwn fallback (notifications, screen readers); `blocks` the message body;
    `continuations` the rest of a long answer as Markdown for follow-up replies (send each
    as `markdown_text`); `status` the thread status (`assistant.threads.setStatus`), None to
    clear it; `failed` a short human error when the turn failed.
    """

    text: str
    blocks: list[dict[str, Any]]
    continuations: list[str]
    status: str | None
    done: bool
    failed: str | None


@dataclass
class _Line:
    """A tool call or subagent run, shown as one compact line."""

    kind: str
    name: str
    started_ms: int
    arguments: str | None = None
    state: str = "running"  # running | ok | error
    attempt: int = 1
    retrying: bool = False
    ended_ms: int | None = None
    result: str | None = None
    error: str | None = None


@dataclass
class _Llm:
    """One model call's text: deltas per attempt until the recorded message replaces them."""

    attempts: dict[int, dict[int, dict[str, Any]]] = field(default_factory=dict)
    errored: set[int] = field(default_factory=set)
    recorded: str | None = None
    running: bool = False

    def has_text(self) -> bool:
        if self.recorded is not None:
            return bool(self.recorded)
        latest = self.attempts[max(self.attempts)] if self.attempts else {}
        return any(d.get("text") for d in latest.values())

    def text(self) -> str:
        if self.recorded is not None:
            return self.recorded
        if not self.attempts:
            return ""
        deltas = self.attempts[max(self.attempts)]  # errored attempts were dropped
        return "".join(deltas[s].get("text") or "" for s in sorted(deltas))


class TurnView:
    """The fold of one turn's events and deltas. `apply_*` mutate; `render` only reads."""

    def __init__(self, turn_id: str) -> None:
        self.turn_id = turn_id
        self._order: list[str] = []  # answer segments (model calls, recorded messages) in order
        self._shown: set[str] = set()
        self._llm: dict[str, _Llm] = {}
        self._lines: dict[str, _Line] = {}
        self._interrupts: dict[str, dict[str, Any]] = {}
        self._slack: dict[str, Any] = {}
        self._prompts: list[tuple[int, dict[str, Any]]] = []
        self._updates: list[tuple[int, str | None, dict[str, Any]]] = []
        self._done = False
        self._failed: str | None = None

    # -- folding ----------------------------------------------------------------------

    def apply_event(self, event: Event) -> None:
        """Fold one event. Events of other turns (or of none) are skipped.

        Raises:
            ValueError: for an event type this view does not know.
        """
        payload = event["payload"]
        kind = payload["type"]
        apply = _APPLY.get(kind)
        if apply is None and kind not in _IGNORED:
            raise ValueError(f"unknown event type {kind!r}")
        if event.get("turn_id") != self.turn_id or apply is None:
            return
        apply(self, event, payload)

    def apply_delta(self, delta: dict[str, Any]) -> None:
        """Fold one token delta; a repeat of `(call_id, attempt, seq)` changes nothing, and
        deltas of an attempt that errored are dropped."""
        if delta.get("turn_id") not in (None, self.turn_id):
            return
        call = self._llm.setdefault(delta["call_id"], _Llm())
        attempt = delta["attempt"]
        if attempt in call.errored:
            return
        call.attempts.setdefault(attempt, {}).setdefault(delta["seq"], delta)

    def _show(self, segment: str) -> None:
        if segment not in self._shown:
            self._shown.add(segment)
            self._order.append(segment)

    def _llm_requested(self, e: Event, p: dict[str, Any]) -> None:
        self._show(p["id"])
        self._llm.setdefault(p["id"], _Llm()).running = True

    def _llm_completed(self, e: Event, p: dict[str, Any]) -> None:
        self._llm.setdefault(p["id"], _Llm()).running = False

    def _llm_errored(self, e: Event, p: dict[str, Any]) -> None:
        call = self._llm.setdefault(p["id"], _Llm())
        call.errored.add(p["attempt"])
        call.attempts.pop(p["attempt"], None)
        if p.get("final", True):
            call.running = False

    def _message_new(self, e: Event, p: dict[str, Any]) -> None:
        msg = p["message"]
        if msg.get("role") != "assistant":
            return
        self._show(msg["id"])
        self._llm.setdefault(msg["id"], _Llm()).recorded = _content_text(msg.get("content"))

    def _line(self, p: dict[str, Any], kind: str, e: Event) -> _Line:
        line = self._lines.get(p["id"])
        if line is None:
            name = p.get("name") or p.get("agent_id") or kind
            line = self._lines[p["id"]] = _Line(kind=kind, name=str(name), started_ms=_ms(e))
        return line

    def _tool_requested(self, e: Event, p: dict[str, Any]) -> None:
        self._line(p, "tool", e).arguments = p.get("arguments")

    def _tool_dispatched(self, e: Event, p: dict[str, Any]) -> None:
        line = self._line(p, "tool", e)
        line.attempt, line.retrying = p["attempt"], p["attempt"] > 1

    def _tool_completed(self, e: Event, p: dict[str, Any]) -> None:
        self._finish(self._line(p, "tool", e), e, p.get("result"), None)

    def _tool_errored(self, e: Event, p: dict[str, Any]) -> None:
        line = self._line(p, "tool", e)
        if p.get("final", True):
            self._finish(line, e, None, p.get("error"))
        else:
            line.attempt, line.retrying = p["attempt"] + 1, True

    def _retry_scheduled(self, e: Event, p: dict[str, Any]) -> None:
        line = self._lines.get(p.get("id") or "")
        if line is not None:
            line.attempt, line.retrying = p["attempt"], True

    def _subagent_started(self, e: Event, p: dict[str, Any]) -> None:
        self._line(p, "subagent", e)

    def _subagent_completed(self, e: Event, p: dict[str, Any]) -> None:
        self._finish(self._line(p, "subagent", e), e, p.get("result"), None)

    def _subagent_errored(self, e: Event, p: dict[str, Any]) -> None:
        if p.get("final", True):
            self._finish(self._line(p, "subagent", e), e, None, p.get("error"))

    def _finish(self, line: _Line, e: Event, result: Any, error: Any) -> None:
        line.ended_ms, line.retrying = _ms(e), False
        if error is not None:
            line.state, line.error = "error", _error_text(error)
            return
        line.result = _result_text(result)
        is_error = isinstance(result, dict) and result.get("isError")
        line.state = "error" if is_error else "ok"

    def _interrupted(self, e: Event, p: dict[str, Any]) -> None:
        self._interrupts[p["interrupt_id"]] = p

    def _interrupt_resumed(self, e: Event, p: dict[str, Any]) -> None:
        self._interrupts.pop(p["interrupt_id"], None)

    def _channels(self, e: Event, p: dict[str, Any]) -> None:
        slack = (p.get("channels") or {}).get("slack")
        self._slack = slack if isinstance(slack, dict) else {}
        prompt = _message_content(self._slack.get("prompt"))
        if prompt is not None:
            self._prompts.append((e["seq"], prompt))
        update = self._slack.get("update")
        content = _message_content(update)
        if content is not None:
            ts = update.get("ts") if isinstance(update, dict) else None
            self._updates.append((e["seq"], str(ts) if ts else None, content))

    def _completed(self, e: Event, p: dict[str, Any]) -> None:
        self._done = True
        self._interrupts.clear()

    def _failed_turn(self, e: Event, p: dict[str, Any]) -> None:
        self._done = True
        self._interrupts.clear()
        self._failed = _error_text(p.get("error")) or "the turn failed"

    # -- reading ----------------------------------------------------------------------

    @property
    def interrupts(self) -> dict[str, dict[str, Any]]:
        """Open interrupts of this turn: `session.interrupted` payloads by interrupt id."""
        return dict(self._interrupts)

    @property
    def slack_channel(self) -> dict[str, Any]:
        """The latest `channels.slack` a decision passed through (SPEC §14), or {}."""
        return dict(self._slack)

    @property
    def slack_prompts(self) -> list[tuple[int, dict[str, Any]]]:
        """Messages `channels.slack.prompt` asked to post, each `(seq, {"text", "blocks"?})`
        keyed by the seq of the event that carried it (post each once)."""
        return list(self._prompts)

    @property
    def slack_updates(self) -> list[tuple[int, str | None, dict[str, Any]]]:
        """Rewrites `channels.slack.update` asked for: `(seq, ts or None for the thread's
        root, {"text", "blocks"?})`."""
        return list(self._updates)

    @property
    def tasks(self) -> list[tuple[str, str, str]]:
        """Tool calls and subagent runs as `(id, title, running|ok|error)`, in order."""
        return [(key, line.name, line.state) for key, line in self._lines.items()]

    def answer(self, *, closed: bool = True) -> str:
        """The answer so far as Markdown: every model reply of the turn, in order.

        `closed` closes a code fence a reply left open (for a message shown whole); without
        it the text only grows while one reply streams (for `chat.appendStream`).
        """
        parts = (self._llm[s].text().strip() for s in self._order)
        return "\n\n".join(_closed(p) if closed else p for p in parts if p)

    def render(self, limit: int = DEFAULT_LIMIT) -> Rendered:
        """The message for the current fold; `limit` caps the answer per Slack message.

        Raises:
            ValueError: when `limit` does not fit a `markdown` block.
        """
        if not 200 <= limit <= MARKDOWN_BLOCK_LIMIT:
            raise ValueError(f"limit must be within 200..{MARKDOWN_BLOCK_LIMIT}, not {limit}")
        answer = self.answer()
        chunks = split_markdown(answer, limit) if answer else []
        blocks: list[dict[str, Any]] = []
        if self._lines:
            lines = [_line_text(line, self._done) for line in self._lines.values()]
            blocks.append(_context(_fit_lines(lines)))
        if chunks:
            blocks.append({"type": "markdown", "text": chunks[0]})
        elif self._done and not self._failed:
            blocks.append(_context("_No reply._"))
        if self._failed:
            blocks.append(_context(f":warning: {escape(self._failed)}"))
        view = self._slack.get("view")
        if isinstance(view, list):
            blocks += [b for b in view if isinstance(b, dict)][: BLOCKS_LIMIT - len(blocks)]
        return Rendered(
            text=self._fallback(chunks),
            blocks=blocks,
            continuations=chunks[1:],
            status=self.status,
            done=self._done,
            failed=self._failed,
        )

    def _fallback(self, chunks: list[str]) -> str:
        parts = []
        if chunks:
            parts.append(to_mrkdwn(split_markdown(chunks[0], FALLBACK_LIMIT // 2)[0]))
        if self._failed:
            parts.append(f":warning: {escape(self._failed)}")
        if not parts:
            parts.append("No reply." if self._done else "…")
        return _clip_mrkdwn("\n".join(parts), FALLBACK_LIMIT)

    @property
    def done(self) -> bool:
        """The turn ended (completed or failed)."""
        return self._done

    @property
    def status(self) -> str | None:
        """The thread status for the fold, None to clear it; cheap (no rendering)."""
        if self._done:
            return None
        override = self._slack.get("status")
        if isinstance(override, str):
            return override or None
        running = [ln.name for ln in self._lines.values() if ln.state == "running"]
        if running:
            names = list(dict.fromkeys(running))
            more = f" and {len(names) - 3} more" if len(names) > 3 else ""
            return f"is calling {', '.join(names[:3])}{more}…"
        if self._interrupts:
            return None  # waiting for a person; the prompt says so
        writing = any(c.running and c.has_text() for c in self._llm.values())
        return "is writing…" if writing else "is thinking…"


_APPLY = {
    ev.MESSAGE_NEW: TurnView._message_new,
    ev.LLM_CALL_REQUESTED: TurnView._llm_requested,
    ev.LLM_CALL_COMPLETED: TurnView._llm_completed,
    ev.LLM_CALL_ERRORED: TurnView._llm_errored,
    ev.TOOL_CALL_REQUESTED: TurnView._tool_requested,
    ev.TOOL_CALL_DISPATCHED: TurnView._tool_dispatched,
    ev.TOOL_CALL_COMPLETED: TurnView._tool_completed,
    ev.TOOL_CALL_ERRORED: TurnView._tool_errored,
    ev.CALL_RETRY_SCHEDULED: TurnView._retry_scheduled,
    ev.SUBAGENT_REQUESTED: TurnView._subagent_started,
    ev.SUBAGENT_STARTED: TurnView._subagent_started,
    ev.SUBAGENT_COMPLETED: TurnView._subagent_completed,
    ev.SUBAGENT_ERRORED: TurnView._subagent_errored,
    ev.SESSION_INTERRUPTED: TurnView._interrupted,
    ev.SESSION_INTERRUPT_RESUMED: TurnView._interrupt_resumed,
    ev.CHANNELS_UPDATED: TurnView._channels,
    ev.TURN_COMPLETED: TurnView._completed,
    ev.TURN_FAILED: TurnView._failed_turn,
}


# -- pieces of a message ---------------------------------------------------------------


def _message_content(value: Any) -> dict[str, Any] | None:
    """A `channels.slack` message as Slack takes it: a string is Markdown; a dict keeps its
    `text` (mrkdwn fallback) and `blocks`. None for anything else, or nothing to show."""
    if isinstance(value, str) and value.strip():
        return {"text": to_mrkdwn(value), "blocks": [{"type": "markdown", "text": value}]}
    if not isinstance(value, dict):
        return None
    content: dict[str, Any] = {}
    if isinstance(value.get("text"), str) and value["text"]:
        content["text"] = value["text"]
    if isinstance(value.get("blocks"), list):
        content["blocks"] = [b for b in value["blocks"] if isinstance(b, dict)][:BLOCKS_LIMIT]
    return content or None


def _ms(event: Event) -> int:
    return int(datetime.fromisoformat(event["occurred_at"]).timestamp() * 1000)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text") or "" for p in content if isinstance(p, dict))
    return ""


def _result_text(result: Any) -> str:
    if not isinstance(result, dict):
        return "" if result is None else json.dumps(result)
    texts = [b.get("text", "") for b in result.get("content") or () if b.get("type") == "text"]
    if texts:
        return "\n".join(texts)
    structured = result.get("structuredContent")
    return "" if structured is None else json.dumps(structured, separators=(",", ":"))


def _error_text(error: Any) -> str:
    """A short human error: the first line of the message, clipped; never a stack trace."""
    message = error.get("message") if isinstance(error, dict) else error
    first = str(message or "").strip().split("\n", 1)[0].strip()
    return _clip(first, _ERROR_LIMIT)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _code(text: str, limit: int) -> str:
    """Text as one mrkdwn code span: one line, no backticks, clipped, escaped."""
    flat = " ".join(text.split()).replace("`", "\u02cb")
    return f"`{escape(_clip(flat, limit))}`" if flat else "` `"


def _duration(ms: int) -> str:
    secs = max(ms, 0) / 1000
    if secs < 10:
        return f"{secs:.1f} s"
    if secs < 60:
        return f"{secs:.0f} s"
    minutes, rest = divmod(round(secs), 60)
    return f"{minutes} min {rest} s"


def _line_text(line: _Line, ended: bool) -> str:
    icon = {"running": "⏳", "ok": "✓", "error": "✗"}[line.state]
    who = f"subagent {_code(line.name, 60)}" if line.kind == "subagent" else _code(line.name, 60)
    parts = [icon, who]
    if line.state == "running":
        parts.append(f"retrying (attempt {line.attempt})" if line.retrying else "running")
    elif line.ended_ms is not None:
        parts.append(_duration(line.ended_ms - line.started_ms))
    text = " ".join(parts)
    if line.error:
        text += f" — {escape(_clip(line.error, 120))}"
    if ended and line.state != "running":
        details = []
        if line.arguments:
            details.append(_code(line.arguments, _DETAIL_LIMIT))
        if line.result:
            details.append(_code(line.result, _DETAIL_LIMIT))
        if details:
            text += " · " + " → ".join(details)
    return text


def _fit_lines(lines: list[str]) -> str:
    """All lines if they fit `TOOL_LINES_LIMIT`, else the latest ones and a count of the rest."""
    kept: list[str] = []
    size = 0
    for line in reversed(lines):
        if size + len(line) + 1 > TOOL_LINES_LIMIT - 40:
            break
        kept.append(line)
        size += len(line) + 1
    hidden = len(lines) - len(kept)
    head = [f"_… {hidden} earlier call{'s' if hidden > 1 else ''}_"] if hidden else []
    return "\n".join(head + kept[::-1])


def _context(mrkdwn: str) -> dict[str, Any]:
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": mrkdwn}]}


def _clip_mrkdwn(text: str, limit: int) -> str:
    """`text` cut to `limit` characters without splitting an entity or a `<…>` token."""
    if len(text) <= limit:
        return text
    cut = re.sub(r"&[a-z]*$", "", text[: limit - 1])
    lt = cut.rfind("<")
    if lt > cut.rfind(">"):
        cut = cut[:lt]
    return cut.rstrip() + "…"


# -- splitting long answers ------------------------------------------------------------


def _closed(markdown: str) -> str:
    """`markdown` with a fence the stream left open closed, so what follows is not code."""
    open_marker = None
    for line in markdown.split("\n"):
        if open_marker is None:
            fence = fence_marker(line)
            open_marker = fence[0] if fence else None
        elif is_fence_close(line, open_marker):
            open_marker = None
    return markdown if open_marker is None else f"{markdown}\n{open_marker}"


def split_markdown(text: str, limit: int) -> list[str]:
    """`text` in pieces of at most `limit` characters, cut at paragraph breaks, else at line
    breaks, else at a space. A piece that ends inside a code block closes it, and the next
    piece opens it again with the same fence. A piece depends only on the text up to the
    line it is cut in, so a growing stream does not move a cut once it exists.
    """
    pieces: list[str] = []
    reopen = ""
    rest = text
    while len(reopen + rest) > limit or len(_closed(reopen + rest)) > limit:
        body = reopen + rest
        cut, fence, at_line = _cut(body, limit, len(reopen))
        if fence is not None:
            head = body[:cut] if body[:cut].endswith("\n") else body[:cut] + "\n"
            pieces.append(head + fence[0])
            reopen, rest = fence[1] + "\n", body[cut:]
        else:
            pieces.append(body[:cut].rstrip())
            reopen, rest = "", body[cut:].lstrip("\n" if at_line else " ")
    pieces.append(_closed(reopen + rest))
    return pieces


def _cut(body: str, limit: int, floor: int) -> tuple[int, tuple[str, str] | None, bool]:
    """Where to cut `body` (past `floor`, which is the reopened fence), the fence
    `(marker, opening line)` open there, and whether the cut is at a line end."""
    fence: tuple[str, str] | None = None
    paragraph = line_end = 0
    line_fence: tuple[str, str] | None = None
    end = 0
    for line in body.split("\n"):
        start = end
        end = start + len(line) + 1
        before = fence
        if fence is None:
            opened = fence_marker(line)
            if opened is not None:
                marker, info = opened
                fence = (marker, marker + info if len(info) <= 40 else marker)
        elif is_fence_close(line, fence[0]):
            fence = None
        if end + (len(fence[0]) if fence else 0) > limit:
            break
        line_end, line_fence = min(end, len(body)), fence
        if fence is None and before is None and not line.strip() and end > floor:
            paragraph = min(end, len(body))
    if paragraph > floor and paragraph >= limit // 2:
        return paragraph, None, True
    if line_end > floor:
        return line_end, line_fence, True
    # Not one whole line fits: cut inside this one, at a space if there is one.
    reserve = len(before[0]) + 1 if before else 0
    hard = max(limit - reserve, floor + 1, start + 1)
    space = body.rfind(" ", max(start, floor) + 1, hard)
    return (space if space > 0 else hard), before, False


# -- interrupt prompts (SPEC §8, §14) ---------------------------------------------------


def interrupt_prompt(
    interrupt_id: str, payload: dict[str, Any] | None, reason: str
) -> dict[str, Any]:
    """The message asking a person to answer an interrupt: `{"text", "blocks"}`.

    One button per `metadata.options` entry. A button carries the option's index, never its
    value, so a click can only pick an option the engine recorded.

    Raises:
        ValueError: when the interrupt id makes an `action_id` longer than Slack takes.
    """
    payload = payload or {}
    longest = f"{ACTION_PREFIX}:{interrupt_id}:{ACTIONS_LIMIT}"
    if len(longest) > ID_LIMIT:
        raise ValueError(f"interrupt id too long for a Slack action_id: {interrupt_id!r}")
    message = payload.get("message")
    blocks: list[dict[str, Any]] = []
    if message:
        pieces = split_markdown(message, MARKDOWN_BLOCK_LIMIT - 100)
        shown = pieces[0] + ("\n\n…" if len(pieces) > 1 else "")
        blocks.append({"type": "markdown", "text": shown})
        text = to_mrkdwn(split_markdown(message, FALLBACK_LIMIT // 2)[0])
    else:
        text = f"*Paused:* {escape(_clip(reason, 2_900))}"
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": text}})
    buttons = _buttons(interrupt_id, payload.get("metadata"))
    if buttons:
        blocks.append(
            {"type": "actions", "block_id": f"{ACTION_PREFIX}:{interrupt_id}", "elements": buttons}
        )
    expires = payload.get("expiresAt")
    if expires:
        blocks.append(
            {
                "type": "context",
                "block_id": f"{_EXPIRY_PREFIX}:{interrupt_id}"[:ID_LIMIT],
                "elements": [{"type": "mrkdwn", "text": _expiry(str(expires))}],
            }
        )
    return {"text": _clip_mrkdwn(text, FALLBACK_LIMIT), "blocks": blocks}


def _buttons(interrupt_id: str, metadata: Any) -> list[dict[str, Any]]:
    options = metadata.get("options") if isinstance(metadata, dict) else None
    if not isinstance(options, list):
        return []
    buttons = []
    primary = False
    for index, option in enumerate(options[:ACTIONS_LIMIT]):
        if not isinstance(option, dict):
            continue
        label = _clip(" ".join(str(option.get("label") or "").split()), BUTTON_TEXT_LIMIT)
        button: dict[str, Any] = {
            "type": "button",
            "action_id": f"{ACTION_PREFIX}:{interrupt_id}:{index}",
            "value": str(index),
            "text": {"type": "plain_text", "text": label or f"Option {index + 1}", "emoji": True},
        }
        style = option.get("style")
        # Slack's guidance: one primary button per set; later ones show plain.
        if style == "danger" or (style == "primary" and not primary):
            button["style"] = style
            primary = primary or style == "primary"
        buttons.append(button)
    return buttons


def _expiry(expires: str) -> str:
    """`Expires …` in the reader's own time zone (Slack date token), the raw value as fallback."""
    try:
        at = datetime.fromisoformat(expires)
    except ValueError:
        return f"Expires {escape(expires)}"
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    stamp = int(at.timestamp())
    return f"Expires <!date^{stamp}^{{date_short_pretty}} at {{time}}|{escape(expires)}>"


def parse_interrupt_action(action: dict[str, Any]) -> tuple[str, int] | None:
    """`(interrupt_id, option index)` from a block_actions `actions[]` entry of a prompt
    button, or None when the action is not one (or its id and value disagree)."""
    action_id = str(action.get("action_id") or "")
    prefix = f"{ACTION_PREFIX}:"
    if not action_id.startswith(prefix):
        return None
    interrupt_id, _, index = action_id[len(prefix) :].rpartition(":")
    if not interrupt_id or not index.isdigit() or action.get("value") != index:
        return None
    return interrupt_id, int(index)


def resolved_prompt(
    original: dict[str, Any], label: str | None, user: str, approved: bool
) -> dict[str, Any]:
    """`original` (an `interrupt_prompt` result or the posted message) without its buttons
    and expiry, saying who answered: `{"text", "blocks"}` for `chat.update`."""
    verdict = f"{'✅ Approved' if approved else '❌ Declined'} by <@{escape(user)}>"
    if label:
        verdict += f" · {escape(_clip(label, BUTTON_TEXT_LIMIT))}"
    blocks = [
        b
        for b in original.get("blocks") or []
        if b.get("type") != "actions"
        and not str(b.get("block_id") or "").startswith(_EXPIRY_PREFIX)
    ]
    blocks.append(_context(verdict))
    text = _clip_mrkdwn(str(original.get("text") or ""), FALLBACK_LIMIT - 200)
    return {"text": f"{text}\n{verdict}" if text else verdict, "blocks": blocks}
