"""How a turn's message is laid out in Block Kit, within Slack's limits.

`message` turns what a turn has to show (answer, tool lines, failure, `channels.slack` view)
into the blocks and mrkdwn fallback of one Slack message; the fold that decides what there
is to show is bot/rendering/turn_view.py. Kept apart so Slack's limits live in one place.

Limits used (notes/slack-facts.md §1.7, §5; docs.slack.dev block references):
- `markdown` block: standard Markdown, 12,000 characters cumulative per payload.
- `msg_blocks_too_long` starts around 12-13k characters of block text (undocumented), so the
  answer gets `DEFAULT_LIMIT` and the tool lines `TOOL_LINES_LIMIT` of that budget.
- `chat.update` rejects `text` over 4,000 characters (`msg_too_long`): the fallback is shorter.
- context block: at most 10 elements; a text object at most 3,000 characters.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bot.rendering.mrkdwn import escape, to_mrkdwn
from bot.rendering.split import split_markdown
from engine.statuses import LineState

MARKDOWN_BLOCK_LIMIT = 12_000
DEFAULT_LIMIT = 9_000
TOOL_LINES_LIMIT = 2_500
FALLBACK_LIMIT = 3_000
BLOCKS_LIMIT = 50
_DETAIL_LIMIT = 100


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
class Line:
    """A tool call or subagent run, shown as one compact line."""

    kind: str
    name: str
    started_ms: int
    arguments: str | None = None
    state: LineState = "running"
    attempt: int = 1
    retrying: bool = False
    ended_ms: int | None = None
    result: str | None = None
    error: str | None = None


def message(
    answer: str,
    lines: Sequence[Line],
    *,
    done: bool,
    failed: str | None,
    view: Any,
    status: str | None,
    limit: int = DEFAULT_LIMIT,
    console: str | None = None,
    footer: str | None = None,
) -> Rendered:
    """One turn's message: tool lines, the answer's first piece (the rest as continuations),
    the failure (with a link to `console`, the session's page), the `footer` (a line of what
    the turn cost), then the `channels.slack` view blocks; `limit` caps the answer per message.

    Raises:
        ValueError: when `limit` does not fit a `markdown` block.
    """
    if not 200 <= limit <= MARKDOWN_BLOCK_LIMIT:
        raise ValueError(f"limit must be within 200..{MARKDOWN_BLOCK_LIMIT}, not {limit}")
    chunks = split_markdown(answer, limit) if answer else []
    blocks: list[dict[str, Any]] = []
    if lines:
        blocks.append(context(_fit_lines([_line_text(line, done) for line in lines])))
    if chunks:
        blocks.append({"type": "markdown", "text": chunks[0]})
    elif done and not failed:
        blocks.append(context("_No reply._"))
    if failed:
        link = f" · <{console}|open in the console>" if console else ""
        blocks.append(context(f":warning: {escape(failed)}{link}"))
    if footer:
        blocks.append(context(escape(footer)))
    if isinstance(view, list):
        blocks += [b for b in view if isinstance(b, dict)][: BLOCKS_LIMIT - len(blocks)]
    return Rendered(
        text=_fallback(chunks, done, failed),
        blocks=blocks,
        continuations=chunks[1:],
        status=status,
        done=done,
        failed=failed,
    )


def _fallback(chunks: list[str], done: bool, failed: str | None) -> str:
    parts = []
    if chunks:
        parts.append(to_mrkdwn(split_markdown(chunks[0], FALLBACK_LIMIT // 2)[0]))
    if failed:
        parts.append(f":warning: {escape(failed)}")
    if not parts:
        parts.append("No reply." if done else "…")
    return clip_mrkdwn("\n".join(parts), FALLBACK_LIMIT)


def message_content(value: Any) -> dict[str, Any] | None:
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


def clip(text: str, limit: int) -> str:
    """`text` cut to `limit` characters with an ellipsis: Slack refuses longer fields."""
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _code(text: str, limit: int) -> str:
    """Text as one mrkdwn code span: one line, no backticks, clipped, escaped."""
    flat = " ".join(text.split()).replace("`", "\u02cb")
    return f"`{escape(clip(flat, limit))}`" if flat else "` `"


def _duration(ms: int) -> str:
    secs = max(ms, 0) / 1000
    if secs < 10:
        return f"{secs:.1f} s"
    if secs < 60:
        return f"{secs:.0f} s"
    minutes, rest = divmod(round(secs), 60)
    return f"{minutes} min {rest} s"


def _line_text(line: Line, ended: bool) -> str:
    icon = {"running": "⏳", "ok": "✓", "error": "✗"}[line.state]
    who = f"subagent {_code(line.name, 60)}" if line.kind == "subagent" else _code(line.name, 60)
    parts = [icon, who]
    if line.state == "running":
        parts.append(f"retrying (attempt {line.attempt})" if line.retrying else "running")
    elif line.ended_ms is not None:
        parts.append(_duration(line.ended_ms - line.started_ms))
    text = " ".join(parts)
    if line.error:
        text += f" — {escape(clip(line.error, 120))}"
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


def context(mrkdwn: str) -> dict[str, Any]:
    """A context block of one mrkdwn element: the small grey line under a reply."""
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": mrkdwn}]}


def clip_mrkdwn(text: str, limit: int) -> str:
    """`text` cut to `limit` characters without splitting an entity or a `<…>` token."""
    if len(text) <= limit:
        return text
    cut = re.sub(r"&[a-z]*$", "", text[: limit - 1])
    lt = cut.rfind("<")
    if lt > cut.rfind(">"):
        cut = cut[:lt]
    return cut.rstrip() + "…"
