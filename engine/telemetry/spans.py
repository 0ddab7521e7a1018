"""Committed events, read as finished spans (pure: no clock, no I/O).

A span ends when its closing fact is committed: a turn at `turn.completed|failed`, a
worker decision's attempt at `decision.completed|errored`, a call's attempt at
`*.call.completed|errored`. Its start is the `occurred_at` of its opening fact when this
process committed that too, and otherwise (the turn began in a process that died) the
start the session's state recorded before the step (`Before`). Ids come from `ids`, so the
same span has the same id whichever process ends it. Names and attributes follow the
OpenTelemetry GenAI conventions (docs/telemetry.md); `subs.*` attributes are ours.
"""

from __future__ import annotations

import dataclasses
import json
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.machine import events as ev
from engine.machine.evolve import at_ms
from engine.machine.state import SessionState
from engine.machine.tree import path_to
from engine.telemetry.ids import SpanContext, parse_traceparent, span_id, trace_id_for_turn

__all__ = ["Before", "Projector", "SpanEvent", "SpanRecord", "turn_context"]

Attributes = dict[str, str | int | float | bool | list[str]]


@dataclass(frozen=True)
class SpanEvent:
    """Something that happened during a span (a retry scheduled, a deadline)."""

    name: str
    at_ms: int
    attributes: Attributes = field(default_factory=dict)


@dataclass(frozen=True)
class SpanRecord:
    """One finished span, ready to export."""

    name: str
    context: SpanContext
    parent_id: str | None  # None: a root span
    kind: str  # "internal" | "client" (a call to another service) | "server" (an intake)
    start_ms: int
    end_ms: int
    attributes: Attributes
    error: str | None = None  # the error's type when the span failed
    message: str | None = None
    events: tuple[SpanEvent, ...] = ()


@dataclass(frozen=True)
class _CallBefore:
    kind: str
    turn_id: str
    attempt: int
    started_at: int
    name: str | None
    handler: str
    params: Mapping[str, Any]


@dataclass(frozen=True)
class Before:
    """What a step's closing facts need from the state as it was before the step."""

    session_id: str
    agent_id: str
    turn: tuple[str, int, str | None] | None  # (turn id, started_at ms, client traceparent)
    decision: tuple[str, int, str] | None  # (decision id, started_at ms, trigger type)
    calls: Mapping[str, _CallBefore]
    model: str | None
    provider: str | None
    # With content captured: each open model call's input messages (its path to its anchor).
    inputs: Mapping[str, list[dict[str, Any]]] = field(default_factory=dict)

    @classmethod
    def of(cls, state: SessionState | None, session_id: str, capture: bool = False) -> Before:
        """What the projector needs of `state` before a step (None: the session is new);
        with `capture`, the messages of its open model calls too."""
        if state is None:
            return cls(session_id, "", None, None, {}, None, None)
        agent = state.agent or {}
        route = state.llm_routes.get(str(agent.get("llm", ""))) or {}
        d = state.decision
        return cls(
            session_id,
            state.agent_id,
            (state.turn.id, state.turn.started_at, state.turn.trace) if state.turn else None,
            (d.id, d.started_at, str(d.trigger.get("type", "?"))) if d else None,
            {
                c.id: _CallBefore(
                    c.kind, c.turn_id, c.attempt, c.started_at, c.name, c.handler, c.params
                )
                for c in state.calls.values()
            },
            agent.get("model") if isinstance(agent.get("model"), str) else None,
            route.get("type") if isinstance(route.get("type"), str) else None,
            {c.id: path_to(state.nodes, c.anchor) for c in state.calls.values() if c.kind == "llm"}
            if capture
            else {},
        )


def turn_context(
    session_id: str, turn_id: str, sampled: bool = True, traceparent: str | None = None
) -> SpanContext:
    """The turn's own span: in the trace its client named, else the root of its own."""
    client = parse_traceparent(traceparent)
    trace = client.trace_id if client else trace_id_for_turn(session_id, turn_id)
    return SpanContext(trace, span_id(trace, "turn", turn_id), sampled)


def intake_context(session_id: str, turn_id: str) -> SpanContext:
    """The span of a turn's intake by a client that traces it (the Slack bot): the root of
    the turn's own trace, the turn's span its child. Derived, so a resumed follower names it
    again."""
    trace = trace_id_for_turn(session_id, turn_id)
    return SpanContext(trace, span_id(trace, "intake", turn_id))


def attempt_context(turn: SpanContext, what: str, ident: str, attempt: int) -> SpanContext:
    """A decision's or a call's attempt, inside its turn's trace."""
    return SpanContext(turn.trace_id, span_id(turn.trace_id, what, ident, str(attempt)))


def effect_context(state: SessionState, effect: object) -> SpanContext | None:
    """The span an effect runs in: its call's attempt, or the live decision's attempt."""
    call_id, attempt = getattr(effect, "call_id", None), getattr(effect, "attempt", None)
    if isinstance(call_id, str) and isinstance(attempt, int):
        return call_context(state, call_id, attempt)
    decision_id = getattr(effect, "decision_id", None)
    if isinstance(decision_id, str) and isinstance(attempt, int) and state.turn is not None:
        turn = turn_context(state.session_id, state.turn.id, traceparent=state.turn.trace)
        return attempt_context(turn, "decision", decision_id, attempt)
    return None


def call_context(state: SessionState, call_id: str, attempt: int) -> SpanContext | None:
    """The span of one attempt of an open call of `state` (None: no such call)."""
    call = state.calls.get(call_id)
    if call is None:
        return None
    trace = state.turn.trace if state.turn and state.turn.id == call.turn_id else None
    turn = turn_context(state.session_id, call.turn_id, traceparent=trace)
    return attempt_context(turn, "call", call_id, attempt)


def _usage_attributes(usage: Mapping[str, Any] | None) -> Attributes:
    if not usage:
        return {}
    out: Attributes = {}
    for key, name in (
        ("input", "gen_ai.usage.input_tokens"),
        ("output", "gen_ai.usage.output_tokens"),
        ("cache_read", "gen_ai.usage.cache_read.input_tokens"),
        ("cache_write", "gen_ai.usage.cache_creation.input_tokens"),
    ):
        value = usage.get(key)
        if isinstance(value, int):
            out[name] = value
    return out


def _cost(text: Any) -> Attributes:
    try:
        return {"subs.cost_usd": float(text)}
    except (TypeError, ValueError):
        return {}


class Projector:
    """Reads each commit's events as the spans they end, remembering when open ones began.

    The memory of starts is bounded (`max_open`, oldest forgotten first): a span whose start
    was forgotten starts where the state before its closing step says it did.
    """

    def __init__(self, max_open: int = 50_000, *, capture: bool = False) -> None:
        self.max_open = max_open
        self.capture = capture  # prompts and completions on chat spans (capture_content)
        self._starts: OrderedDict[tuple[str, ...], int] = OrderedDict()
        self._turn_events: OrderedDict[tuple[str, str], list[SpanEvent]] = OrderedDict()
        self._clients: OrderedDict[tuple[str, str], str] = OrderedDict()  # turns' traceparents
        # A retry's schedule, kept for the attempt it schedules: (sid, what, id, attempt).
        self._waits: OrderedDict[tuple[str, ...], SpanEvent] = OrderedDict()

    def _remember(self, key: tuple[str, ...], at: int) -> None:
        self._starts[key] = at
        while len(self._starts) > self.max_open:
            self._starts.popitem(last=False)

    def _note(self, sid: str, turn_id: str, event: SpanEvent) -> None:
        self._turn_events.setdefault((sid, turn_id), []).append(event)
        while len(self._turn_events) > self.max_open:
            self._turn_events.popitem(last=False)

    def project(
        self,
        before: Before,
        envelopes: Iterable[Mapping[str, Any]],
        decided: Sequence[str] = (),
    ) -> list[SpanRecord]:
        """The spans that the committed `envelopes` of one step end, and one for each
        trigger the engine decided itself in the step (`decided`)."""
        sid = before.session_id
        out: list[SpanRecord] = []
        turn_id = before.turn[0] if before.turn else None
        at: int | None = None
        replies: dict[str, dict[str, Any]] = {}  # assistant messages by call id (capture)
        for env in envelopes:
            p = env["payload"]
            kind = p["type"]
            at = at_ms(env)  # type: ignore[arg-type]
            if kind == ev.TURN_STARTED:
                turn_id = p["turn_id"]
                self._remember((sid, "turn", p["turn_id"]), at)
                if p.get("traceparent"):
                    self._clients[(sid, p["turn_id"])] = p["traceparent"]
                    while len(self._clients) > self.max_open:
                        self._clients.popitem(last=False)
            elif kind in ev.TURN_ENDS:
                out.append(self._turn(before, p, at))
            elif kind == ev.DECISION_DISPATCHED:
                self._remember((sid, "decision", p["decision_id"], str(p["attempt"])), at)
            elif kind in (ev.DECISION_COMPLETED, ev.DECISION_ERRORED) and turn_id:
                out.append(self._decision(before, turn_id, p, at))
            elif kind in (ev.LLM_CALL_DISPATCHED, ev.TOOL_CALL_DISPATCHED):
                self._remember((sid, "call", p["id"], str(p["attempt"])), at)
            elif kind == ev.MESSAGE_NEW and self.capture:
                message = p["message"]
                if message.get("role") == "assistant" and message.get("id"):
                    replies[message["id"]] = message
            elif kind in ev.CALL_ENDS:
                record = self._call(before, p, at)
                if record is not None:
                    out.append(record)
            elif kind == ev.CALL_RETRY_SCHEDULED and turn_id:
                attrs: Attributes = {
                    "subs.call.id": p["id"],
                    "subs.attempt": p["attempt"],
                    "subs.due_at": p["due_at"],
                }
                retry = SpanEvent("retry_scheduled", at, attrs)
                self._note(sid, turn_id, retry)
                # ... and on the attempt it schedules: the wait before that span began.
                what = "decision" if p.get("kind") == "decision" else "call"
                self._waits[(sid, what, p["id"], str(p["attempt"]))] = retry
                while len(self._waits) > self.max_open:
                    self._waits.popitem(last=False)
        if self.capture:
            out = [_with_content(r, before, replies) for r in out]
        if decided and turn_id and at is not None:
            turn = self._context(before, turn_id)
            for n, trigger in enumerate(decided):
                ident = span_id(turn.trace_id, "engine-decision", str(at), str(n), trigger)
                made: Attributes = {
                    "subs.decider": "engine",
                    "subs.trigger.type": trigger,
                    "gen_ai.conversation.id": sid,
                }
                ctx = SpanContext(turn.trace_id, ident)
                out.append(
                    SpanRecord(f"decision {trigger}", ctx, turn.span_id, "internal", at, at, made)
                )
        return out

    def _waited(self, sid: str, what: str, ident: str, attempt: int) -> tuple[SpanEvent, ...]:
        """The retry that scheduled this attempt, as an event of its span (if it was one)."""
        wait = self._waits.pop((sid, what, ident, str(attempt)), None)
        return () if wait is None else (wait,)

    def _context(self, before: Before, turn_id: str) -> SpanContext:
        """The turn's span, in the trace its client named when it named one."""
        client = self._clients.get((before.session_id, turn_id))
        if client is None and before.turn and before.turn[0] == turn_id:
            client = before.turn[2]
        return turn_context(before.session_id, turn_id, traceparent=client)

    def _turn(self, before: Before, p: Mapping[str, Any], at: int) -> SpanRecord:
        sid, tid = before.session_id, p["turn_id"]
        start = self._starts.pop((sid, "turn", tid), None)
        if start is None:
            start = before.turn[1] if before.turn and before.turn[0] == tid else at
        ctx = self._context(before, tid)
        client = parse_traceparent(self._clients.pop((sid, tid), None)) or parse_traceparent(
            before.turn[2] if before.turn and before.turn[0] == tid else None
        )
        error = p.get("error") if p["type"] == ev.TURN_FAILED else None
        attrs: Attributes = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": before.agent_id,
            "gen_ai.conversation.id": sid,
            "subs.turn.id": tid,
            **_usage_attributes(p.get("usage")),
            **_cost(p.get("cost")),
        }
        if error:
            attrs["error.type"] = str(error.get("code", "error"))
        return SpanRecord(
            f"invoke_agent {before.agent_id}",
            ctx,
            client.span_id if client else None,
            "internal",
            start,
            at,
            attrs,
            error=str(error.get("code", "error")) if error else None,
            message=str(error.get("message", "")) if error else None,
            events=tuple(self._turn_events.pop((sid, tid), ())),
        )

    def _decision(self, before: Before, turn_id: str, p: Mapping[str, Any], at: int) -> SpanRecord:
        sid, did, attempt = before.session_id, p["decision_id"], p["attempt"]
        start = self._starts.pop((sid, "decision", did, str(attempt)), None)
        trigger = "?"
        if before.decision and before.decision[0] == did:
            trigger = before.decision[2]
            start = before.decision[1] if start is None else start
        turn = self._context(before, turn_id)
        error = p.get("error") if p["type"] == ev.DECISION_ERRORED else None
        attrs: Attributes = {
            "subs.decider": "worker",
            "subs.decision.id": did,
            "subs.attempt": attempt,
            "subs.trigger.type": trigger,
            "gen_ai.conversation.id": sid,
        }
        if error:
            attrs["error.type"] = str(error.get("code", "error"))
            attrs["subs.retryable"] = bool(p.get("retryable"))
        return SpanRecord(
            f"decision {trigger}",
            attempt_context(turn, "decision", did, attempt),
            turn.span_id,
            "client",
            at if start is None else start,
            at,
            attrs,
            error=str(error.get("code", "error")) if error else None,
            message=str(error.get("message", "")) if error else None,
            events=self._waited(sid, "decision", did, attempt),
        )

    def _call(self, before: Before, p: Mapping[str, Any], at: int) -> SpanRecord | None:
        sid = before.session_id
        call = before.calls.get(p["id"])
        if call is None:
            return None
        attempt = int(p.get("attempt", call.attempt))
        start = self._starts.pop((sid, "call", p["id"], str(attempt)), None)
        if start is None:
            start = call.started_at
        turn = self._context(before, call.turn_id)
        ctx = attempt_context(turn, "call", p["id"], attempt)
        error = p.get("error") if p["type"] in (ev.LLM_CALL_ERRORED, ev.TOOL_CALL_ERRORED) else None
        if call.kind == "llm":
            model = call.params.get("model") or before.model or "unknown"
            attrs: Attributes = {
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": str(model),
                "subs.call.id": p["id"],
                "subs.attempt": attempt,
                "subs.handler": call.handler,
            }
            if before.provider:
                attrs["gen_ai.provider.name"] = before.provider
            if p["type"] == ev.LLM_CALL_COMPLETED:
                if p.get("model"):
                    attrs["gen_ai.response.model"] = p["model"]
                if p.get("finish_reason"):
                    attrs["gen_ai.response.finish_reasons"] = [p["finish_reason"]]
                attrs.update(_usage_attributes(p.get("usage")))
                attrs.update(_cost(p.get("cost")))
            name = f"chat {model}"
        elif call.kind == "tool":
            tool = call.name or "?"
            attrs = {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": tool,
                "gen_ai.tool.call.id": p["id"],
                "subs.attempt": attempt,
                "subs.handler": call.handler,
            }
            connector = call.params.get("connector")
            if isinstance(connector, str):
                attrs["subs.mcp.server"] = connector
            name = f"execute_tool {tool}"
        else:
            return None
        if error:
            attrs["error.type"] = str(error.get("code", "error"))
            attrs["subs.retryable"] = bool(p.get("retryable"))
        return SpanRecord(
            name,
            ctx,
            turn.span_id,
            "client" if call.handler != "client" else "internal",
            start,
            at,
            attrs,
            error=str(error.get("code", "error")) if error else None,
            message=str(error.get("message", "")) if error else None,
            events=self._waited(sid, "call", p["id"], attempt),
        )


def _parts(message: Mapping[str, Any]) -> dict[str, Any]:
    """A message as the GenAI conventions spell one: its role and its parts (a file's
    bytes never: only its part's type)."""
    content = message.get("content")
    parts: list[dict[str, Any]] = []
    if message.get("role") == "tool":
        parts.append(
            {"type": "tool_call_response", "id": message.get("tool_call_id"), "response": content}
        )
    elif isinstance(content, str):
        parts.append({"type": "text", "content": content})
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append({"type": "text", "content": part.get("text", "")})
            elif isinstance(part, dict):
                parts.append({"type": str(part.get("type", "?"))})
    for call in message.get("tool_calls") or ():
        fn = call.get("function") or {}
        parts.append(
            {
                "type": "tool_call",
                "id": call.get("id"),
                "name": fn.get("name"),
                "arguments": fn.get("arguments"),
            }
        )
    return {"role": message.get("role"), "parts": parts}


def _with_content(
    record: SpanRecord, before: Before, replies: Mapping[str, dict[str, Any]]
) -> SpanRecord:
    """A chat span with its input and output messages (`capture_content = true`)."""
    if record.attributes.get("gen_ai.operation.name") != "chat":
        return record
    call_id = str(record.attributes.get("subs.call.id", ""))
    attributes = dict(record.attributes)
    inputs = before.inputs.get(call_id)
    if inputs is not None:
        attributes["gen_ai.input.messages"] = json.dumps([_parts(m) for m in inputs])
    if call_id in replies:
        attributes["gen_ai.output.messages"] = json.dumps([_parts(replies[call_id])])
    return dataclasses.replace(record, attributes=attributes)
