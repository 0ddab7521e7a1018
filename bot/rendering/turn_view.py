"""What one turn's Slack message shows: a pure projection of its events and token deltas.

SPEC §14: one turn is one Slack message, streamed as it is written, with tool calls and
subagent runs as compact lines. `TurnView` folds events (SPEC §13, engine/machine/evolve.py)
and deltas; `render` reads the fold and hands it to bot/rendering/layout.py, which returns
data for the bot shell to send. Nothing here calls Slack (style anchor 7: reads cannot emit
effects).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import engine.machine.events as ev
from bot.rendering.layout import DEFAULT_LIMIT, Line, Rendered, clip, message, message_content
from bot.rendering.spend import budget_stop, spend_line
from bot.rendering.split import close_fence
from engine.messages import text_of

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
        ev.DECISION_WAITING,  # a worker answers later: the turn goes on when it does
        ev.MESSAGE_SENT,
        ev.INPUT_REJECTED,  # the turn.failed that follows says why
        ev.LLM_CALL_DISPATCHED,
        ev.TOOL_CALL_WAITING,
        # An agent's MCP tool lists, fetched before its first decision: a refused
        # credential shows as the interrupt that follows.
        ev.DECISION_HELD,
        ev.DECISION_RELEASED,
        ev.CONNECTOR_SYNC_REQUESTED,
        ev.CONNECTOR_SYNC_DISPATCHED,
        ev.CONNECTOR_SYNCED,
        ev.CONNECTOR_SYNC_ERRORED,
    }
)


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

    def __init__(
        self, turn_id: str, *, console: str | None = None, show_cost: bool = False
    ) -> None:
        self.turn_id = turn_id
        self.console = console  # the session's console page, linked when the turn fails
        self.show_cost = show_cost  # a line of what the turn cost under the ended reply
        self._model_calls: set[str] = set()  # the calls the turn asked for, by id
        self._tool_calls: set[str] = set()
        self._spent: tuple[Any, Any] | None = None  # the ended turn's (cost, usage)
        self._order: list[str] = []  # answer segments (model calls, recorded messages) in order
        self._shown: set[str] = set()
        self._llm: dict[str, _Llm] = {}
        self._lines: dict[str, Line] = {}
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
        self._model_calls.add(p["id"])
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
        self._llm.setdefault(msg["id"], _Llm()).recorded = text_of(msg.get("content"))

    def _line(self, p: dict[str, Any], kind: str, e: Event) -> Line:
        line = self._lines.get(p["id"])
        if line is None:
            name = p.get("name") or p.get("agent_id") or kind
            line = self._lines[p["id"]] = Line(kind=kind, name=str(name), started_ms=_ms(e))
        return line

    def _tool_requested(self, e: Event, p: dict[str, Any]) -> None:
        self._tool_calls.add(p["id"])
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

    def _finish(self, line: Line, e: Event, result: Any, error: Any) -> None:
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
        prompt = message_content(self._slack.get("prompt"))
        if prompt is not None:
            self._prompts.append((e["seq"], prompt))
        update = self._slack.get("update")
        content = message_content(update)
        if content is not None:
            ts = update.get("ts") if isinstance(update, dict) else None
            self._updates.append((e["seq"], str(ts) if ts else None, content))

    def _completed(self, e: Event, p: dict[str, Any]) -> None:
        self._done = True
        self._interrupts.clear()
        self._spent = (p.get("cost"), p.get("usage"))

    def _failed_turn(self, e: Event, p: dict[str, Any]) -> None:
        self._done = True
        self._interrupts.clear()
        self._spent = (p.get("cost"), p.get("usage"))
        error = p.get("error")
        self._failed = budget_stop(error) or _error_text(error) or "the turn failed"

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
        return "\n\n".join(close_fence(p) if closed else p for p in parts if p)

    def render(self, limit: int = DEFAULT_LIMIT) -> Rendered:
        """The message for the current fold; `limit` caps the answer per Slack message.

        Raises:
            ValueError: when `limit` does not fit a `markdown` block.
        """
        return message(
            self.answer(),
            list(self._lines.values()),
            done=self._done,
            failed=self._failed,
            view=self._slack.get("view"),
            status=self.status,
            limit=limit,
            console=self.console,
            footer=self.footer,
        )

    @property
    def footer(self) -> str | None:
        """The ended turn's cost line when the agent shows it (`show_cost`), else None."""
        if not self.show_cost or self._spent is None:
            return None
        cost, usage = self._spent
        return spend_line(cost, usage, len(self._model_calls), len(self._tool_calls))

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


# -- reading events ---------------------------------------------------------------------


def _ms(event: Event) -> int:
    return int(datetime.fromisoformat(event["occurred_at"]).timestamp() * 1000)


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
    return clip(first, _ERROR_LIMIT)
