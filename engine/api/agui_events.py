"""Our session events and token deltas as AG-UI events (notes: agui-facts §3-§5).

Pure: `RunTranslator` is fed what the log and the delta stream hold for one run and
answers `ag_ui.core` models, so every event is built and checked by the protocol's own
types. The ids streamed are the ids stored (a reply's message id is its model call id),
so the history `@ag-ui/client` assembles matches the conversation tree by id and the
client's next run continues it instead of branching it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ag_ui.core import (
    PROTOCOL_VERSION,
    AssistantMessage,
    BaseEvent,
    FunctionCall,
    Interrupt,
    Message,
    MessagesSnapshotEvent,
    ReasoningEndEvent,
    ReasoningMessageContentEvent,
    ReasoningMessageEndEvent,
    ReasoningMessageStartEvent,
    ReasoningStartEvent,
    RunErrorEvent,
    RunFinishedEvent,
    RunFinishedInterruptOutcome,
    RunFinishedSuccessOutcome,
    RunStartedEvent,
    SystemMessage,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    TokenUsage,
    ToolCall,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
    ToolMessage,
    UserMessage,
)

from engine.machine import events as ev
from engine.messages import text_of


def sse(event: BaseEvent) -> bytes:
    """One frame as upstream writes them: `event: TYPE`, one `data:` line, LF only;
    camelCase, optional fields left out (the models drop what is unset)."""
    return f"event: {event.type.value}\ndata: {event.model_dump_json(by_alias=True)}\n\n".encode()


def agui_message(message: Mapping[str, Any]) -> Message | None:
    """A stored message as AG-UI's; None for none it has (there is always an id)."""
    mid, role = message["id"], message["role"]
    if role == "user":
        return UserMessage(id=mid, role="user", content=text_of(message.get("content")))
    if role == "system":
        return SystemMessage(id=mid, role="system", content=text_of(message.get("content")))
    if role == "tool":
        return ToolMessage(
            id=mid,
            role="tool",
            content=text_of(message.get("content")),
            tool_call_id=message.get("tool_call_id") or "",
        )
    if role == "assistant":
        calls = [_tool_call(tc) for tc in message.get("tool_calls") or ()]
        return AssistantMessage(
            id=mid,
            role="assistant",
            content=text_of(message.get("content")) or None,
            tool_calls=calls or None,
        )
    return None


def _tool_call(tc: Mapping[str, Any]) -> ToolCall:
    fn = tc["function"]
    return ToolCall(
        id=tc["id"],
        type="function",
        function=FunctionCall(name=fn["name"], arguments=fn.get("arguments") or ""),
    )


def snapshot(messages: Iterable[Mapping[str, Any]]) -> MessagesSnapshotEvent:
    """`MESSAGES_SNAPSHOT` of a path (the active branch)."""
    out = [m for m in (agui_message(msg) for msg in messages) if m is not None]
    return MessagesSnapshotEvent(messages=out)


def usage_of(usage: Mapping[str, Any] | None) -> list[TokenUsage] | None:
    """Our normalised usage (SPEC §7) as one TokenUsage: input and output are totals,
    the cache counts parts of input, as AG-UI counts them."""
    if not usage or not usage.get("total"):
        return None
    return [
        TokenUsage(
            input_tokens=usage.get("input"),
            output_tokens=usage.get("output"),
            total_tokens=usage.get("total"),
            cached_input_tokens=usage.get("cache_read") or None,
            cache_write_input_tokens=usage.get("cache_write") or None,
        )
    ]


def interrupt_of(interrupt: Mapping[str, Any]) -> Interrupt:
    """An open interrupt (SPEC §8: its payload is already AG-UI's shape)."""
    payload = interrupt.get("payload")
    payload = payload if isinstance(payload, dict) else {}
    schema = payload.get("responseSchema")
    return Interrupt(
        id=interrupt["interrupt_id"],
        reason=interrupt.get("reason") or "interrupt",
        message=payload.get("message"),
        tool_call_id=payload.get("toolCallId"),
        expires_at=payload.get("expiresAt"),
        response_schema=schema if isinstance(schema, dict) else None,
        metadata=payload.get("metadata") if isinstance(payload.get("metadata"), dict) else None,
    )


@dataclass
class _Reply:
    """One model call's reply as it streams: what the client has been sent of it."""

    attempt: int
    next_seq: int = 1  # the delta seq that continues the stream; others are dropped
    text: str = ""
    text_open: bool = False
    reasoning_open: bool = False


@dataclass
class RunTranslator:
    """One AG-UI run over one turn of a session: events and deltas in, AG-UI events out.

    `client_calls` are tool calls the client runs: their results are the client's own
    tool messages, never streamed back as TOOL_CALL_RESULT.
    """

    thread_id: str
    run_id: str
    turn_id: str | None
    client_calls: set[str] = field(default_factory=set)
    open_client_calls: set[str] = field(default_factory=set)
    interrupted: bool = False  # an interrupt opened in this run's turn
    done: bool = False
    _llm_calls: set[str] = field(default_factory=set)
    _replies: dict[str, _Reply] = field(default_factory=dict)
    _recorded: set[str] = field(default_factory=set)  # replies whose message is in the log
    _waiting: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # early deltas

    def started(self) -> list[BaseEvent]:
        """RUN_STARTED: the first event of every AG-UI run."""
        return [
            RunStartedEvent(
                thread_id=self.thread_id, run_id=self.run_id, protocol_version=PROTOCOL_VERSION
            )
        ]

    def feed(
        self, events: Iterable[Mapping[str, Any]], deltas: Iterable[Mapping[str, Any]]
    ) -> list[BaseEvent]:
        """A batch as one read returned it. A call's deltas are written before the event
        that records its reply, but one read may hand them after it: each reply takes
        the batch's deltas for it before it is closed."""
        by_call: dict[str, list[Mapping[str, Any]]] = {}
        for delta in deltas:
            by_call.setdefault(delta["call_id"], []).append(delta)
        out: list[BaseEvent] = []
        for event in events:
            if self.done:
                break
            payload = event["payload"]
            if event.get("turn_id") != self.turn_id or self.turn_id is None:
                continue
            kind = payload["type"]
            if kind == ev.LLM_CALL_REQUESTED:
                self._llm_calls.add(payload["id"])
                out += self._deltas(payload["id"], self._waiting.pop(payload["id"], []))
            elif kind == ev.MESSAGE_NEW:
                message = payload["message"]
                out += self._deltas(message["id"], by_call.pop(message["id"], []))
                out += self._message(message)
            elif kind == ev.TOOL_CALL_REQUESTED and payload.get("handler") == "client":
                self.client_calls.add(payload["id"])
                self.open_client_calls.add(payload["id"])
            elif kind in (ev.TOOL_CALL_COMPLETED, ev.TOOL_CALL_ERRORED):
                self.open_client_calls.discard(payload["id"])
            elif kind == ev.SESSION_INTERRUPTED:
                self.interrupted = True
            elif kind == ev.TURN_COMPLETED:
                out += self._close_all()
                out.append(
                    RunFinishedEvent(
                        thread_id=self.thread_id,
                        run_id=self.run_id,
                        result=payload.get("data"),
                        usage=usage_of(payload.get("usage")),
                    )
                )
                self.done = True
            elif kind == ev.TURN_FAILED:
                out += self.failed(payload["error"]["message"], payload["error"].get("code"))
        for call_id, batch in by_call.items():
            if not self.done:
                out += self._deltas(call_id, batch)
        return out

    def failed(self, message: str, code: str | None) -> list[BaseEvent]:
        """`RUN_ERROR`: what was open is closed first; nothing may follow it."""
        out = self._close_all()
        out.append(RunErrorEvent(message=message, code=code))
        self.done = True
        return out

    def paused(
        self, pending_calls: list[str], interrupts: Sequence[Mapping[str, Any]]
    ) -> list[BaseEvent]:
        """The turn waits for the client: its tool calls' results, or an interrupt's
        answer. The run ends; the client's next run resumes the same turn."""
        out = self._close_all()
        outcome: RunFinishedSuccessOutcome | RunFinishedInterruptOutcome
        if interrupts:
            outcome = RunFinishedInterruptOutcome(
                type="interrupt", interrupts=[interrupt_of(i) for i in interrupts]
            )
        else:
            outcome = RunFinishedSuccessOutcome(
                type="success", pending_tool_call_ids=pending_calls or None
            )
        out.append(RunFinishedEvent(thread_id=self.thread_id, run_id=self.run_id, outcome=outcome))
        self.done = True
        return out

    def finished_idle(self) -> list[BaseEvent]:
        """A run that started no turn (nothing new to answer)."""
        self.done = True
        return [RunFinishedEvent(thread_id=self.thread_id, run_id=self.run_id)]

    # -- one reply ----------------------------------------------------------------

    def _deltas(self, call_id: str, deltas: Iterable[Mapping[str, Any]]) -> list[BaseEvent]:
        if call_id not in self._llm_calls:
            self._waiting.setdefault(call_id, []).extend(dict(d) for d in deltas)
            return []
        out: list[BaseEvent] = []
        for delta in deltas:
            if call_id in self._recorded:
                break
            reply = self._replies.get(call_id)
            if reply is None:
                reply = self._replies[call_id] = _Reply(attempt=delta["attempt"])
            # Only a gapless run of one attempt's deltas is streamed: a client cannot
            # take text back, so a retry's deltas (or a stream joined late) are left to
            # the recorded message.
            if delta["attempt"] != reply.attempt or delta["seq"] != reply.next_seq:
                continue
            reply.next_seq += 1
            if delta.get("reasoning"):
                out += self._reasoning(call_id, reply, delta["reasoning"])
            if delta.get("text"):
                out += self._text(call_id, reply, delta["text"])
        return out

    def _reasoning(self, call_id: str, reply: _Reply, text: str) -> list[BaseEvent]:
        rid = reasoning_id(call_id)
        out: list[BaseEvent] = []
        if not reply.reasoning_open:
            if reply.text_open:
                return []  # reasoning after the text began: the message shows the text
            reply.reasoning_open = True
            out += [
                ReasoningStartEvent(message_id=rid),
                ReasoningMessageStartEvent(message_id=rid, role="reasoning"),
            ]
        out.append(ReasoningMessageContentEvent(message_id=rid, delta=text))
        return out

    def _text(self, call_id: str, reply: _Reply, text: str) -> list[BaseEvent]:
        out = self._close_reasoning(call_id, reply)
        if not reply.text_open:
            reply.text_open = True
            out.append(TextMessageStartEvent(message_id=call_id, role="assistant"))
        reply.text += text
        out.append(TextMessageContentEvent(message_id=call_id, delta=text))
        return out

    def _close_reasoning(self, call_id: str, reply: _Reply) -> list[BaseEvent]:
        if not reply.reasoning_open:
            return []
        reply.reasoning_open = False
        rid = reasoning_id(call_id)
        return [ReasoningMessageEndEvent(message_id=rid), ReasoningEndEvent(message_id=rid)]

    def _close_all(self) -> list[BaseEvent]:
        out: list[BaseEvent] = []
        for call_id, reply in self._replies.items():
            out += self._close_reasoning(call_id, reply)
            if reply.text_open:
                reply.text_open = False
                out.append(TextMessageEndEvent(message_id=call_id))
        return out

    def _message(self, message: Mapping[str, Any]) -> list[BaseEvent]:
        role, mid = message["role"], message["id"]
        if role == "tool":
            call_id = message.get("tool_call_id") or ""
            if call_id in self.client_calls:
                return []  # the client's own result: it has the message already
            return [
                ToolCallResultEvent(
                    message_id=mid,
                    tool_call_id=call_id,
                    content=text_of(message.get("content")),
                    role="tool",
                )
            ]
        if role != "assistant":
            return []  # the client sent it
        self._recorded.add(mid)
        reply = self._replies.pop(mid, None) or _Reply(attempt=0)
        out = self._close_reasoning(mid, reply)
        content = text_of(message.get("content"))
        calls = message.get("tool_calls") or []
        if not reply.text_open and (content or not calls):
            reply.text_open = True
            out.append(TextMessageStartEvent(message_id=mid, role="assistant"))
        if reply.text_open:
            if content.startswith(reply.text) and content != reply.text:
                rest = content[len(reply.text) :]
                out.append(TextMessageContentEvent(message_id=mid, delta=rest))
            out.append(TextMessageEndEvent(message_id=mid))
        for tc in calls:
            fn = tc["function"]
            arguments = fn.get("arguments")
            if not isinstance(arguments, str):
                arguments = json.dumps(arguments)
            out.append(
                ToolCallStartEvent(
                    tool_call_id=tc["id"], tool_call_name=fn["name"], parent_message_id=mid
                )
            )
            if arguments:
                out.append(ToolCallArgsEvent(tool_call_id=tc["id"], delta=arguments))
            out.append(ToolCallEndEvent(tool_call_id=tc["id"]))
        return out


def reasoning_id(call_id: str) -> str:
    """The id of a reply's reasoning message (the tree keeps reasoning inside the reply)."""
    return f"{call_id}~reasoning"
