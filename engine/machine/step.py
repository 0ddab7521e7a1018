"""The transition function: `step(state, input, now, ids) -> Transition`.

Pure: no I/O, no clock, no randomness; `now` (epoch ms) and `ids` are
injected. Every change to the state is an event applied through `evolve`,
so the new state is by construction the fold of the log.

An input the machine refuses raises `MachineError` before any event is
emitted, leaving the state untouched. Internal completions that arrive late
(a stale attempt, a call that already closed) are ignored with a recorded
reason in `Transition.ignored`: that is the normal shape of at-least-once
delivery, not an error.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from .effects import Effect, RunLlmCall, StartTimer
from .evolve import Event, evolve
from .inputs import CallLost, ClientSubmitted, Input, LlmCallSettled, TimerFired
from .retry import backoff_ms, past_total, resolve_policy, run_deadline
from .state import Call, SessionState
from .tree import match_view

TURN_STARTS = ("client.message", "client.messages", "client.append", "client.action")
QUEUEABLE = ("client.message", "client.append")


class Ids(Protocol):
    def __call__(self, prefix: str) -> str: ...


class MachineError(Exception):
    """An input the session refuses. `status` is the HTTP status hint."""

    def __init__(self, code: str, message: str, status: int = 409, **detail: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.detail = detail


@dataclass
class Transition:
    state: SessionState | None
    events: list[Event] = field(default_factory=list)
    effects: list[Effect] = field(default_factory=list)
    reply: dict[str, Any] | None = None
    ignored: str | None = None


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class _Step:
    """One transition in the making: emits events and collects effects."""

    def __init__(self, state: SessionState | None, session_id: str, now: int, ids: Ids) -> None:
        self.state = state
        self.session_id = session_id
        self.now = now
        self.occurred_at = iso(now)
        self.ids = ids
        self.out = Transition(state=state)

    @property
    def s(self) -> SessionState:
        assert self.state is not None
        return self.state

    def emit(self, payload: dict[str, Any], turn_id: str | None = None) -> None:
        seq = (self.state.seq if self.state else 0) + 1
        if turn_id is None and self.state is not None and self.state.turn is not None:
            turn_id = self.state.turn.id
        event: Event = {
            "session_id": self.session_id,
            "seq": seq,
            "occurred_at": self.occurred_at,
            "payload": payload,
        }
        if turn_id is not None:
            event["turn_id"] = turn_id
        self.state = evolve(self.state, event)
        self.out.state = self.state
        self.out.events.append(event)

    # -- client inputs ---------------------------------------------------------

    def client_submitted(self, inp: ClientSubmitted) -> None:
        body = inp.input
        kind = body["type"]
        if kind in TURN_STARTS:
            self.submit_turn(inp)
        elif kind in ("tool.result", "tool.error"):
            self.client_settles_tool(body)
        else:
            raise MachineError("invalid_input", f"unsupported input type {kind!r}", status=422)

    def submit_turn(self, inp: ClientSubmitted) -> None:
        body = inp.input
        s = self.state
        if s is not None and s.agent_id != inp.agent_id:
            raise MachineError(
                "agent_mismatch",
                f"session {self.session_id} runs agent {s.agent_id!r}, not {inp.agent_id!r}",
                status=409,
            )
        turn_id = body.get("turn_id")
        if s is not None and turn_id and turn_id in s.turns:
            status = s.turns[turn_id]
            self.out.reply = self._reply(turn_id, queued=status == "queued", existing=True)
            return
        if s is not None and s.turn is not None:
            if body.get("queue") and body["type"] in QUEUEABLE:
                turn_id = turn_id or self.ids("turn")
                self.emit({"type": "turn.queued", "turn_id": turn_id, "input": body}, turn_id)
                self.out.reply = self._reply(turn_id, queued=True)
                return
            raise MachineError(
                "turn_already_active",
                f"turn {s.turn.id} is still running in session {self.session_id}",
                turn_id=s.turn.id,
            )
        if s is None:
            self.emit(
                {
                    "type": "session.created",
                    "agent_id": inp.agent_id,
                    "decider": inp.decider,
                    "identity": inp.identity,
                }
            )
            # session.start: the engine's proposal is the file's agent config.
            if inp.agent_config is not None:
                self.emit({"type": "agent.updated", "agent": inp.agent_config})
        if body["type"] == "client.messages" and self.view_only_moves_head(body["messages"]):
            return
        turn_id = turn_id or self.ids("turn")
        self.out.reply = self._reply(turn_id, queued=False)
        self.start_turn(turn_id, body)

    def view_only_moves_head(self, view: list[dict[str, Any]]) -> bool:
        """A view with nothing new moves the head there and writes nothing else."""
        s = self.s
        match = match_view(s.nodes, view)
        if match.new_from < len(view):
            return False
        if match.known != s.head_id:
            self.emit({"type": "head.moved", "head_id": match.known})
        self.out.reply = {"session_id": self.session_id, "turn_id": None, "queued": False}
        return True

    def _reply(self, turn_id: str, *, queued: bool, existing: bool = False) -> dict[str, Any]:
        reply = {"session_id": self.session_id, "turn_id": turn_id, "queued": queued}
        if existing:
            reply["existing"] = True
        return reply

    def start_turn(self, turn_id: str, body: dict[str, Any]) -> None:
        self.emit({"type": "turn.started", "turn_id": turn_id}, turn_id)
        kind = body["type"]
        if kind == "client.message":
            self.record_messages([body["message"]])
            self.decide_engine({"actions": [{"type": "llm.call"}]})
        elif kind == "client.append":
            fresh = [m for m in body["messages"] if not (m.get("id") and m["id"] in self.s.nodes)]
            self.record_messages(fresh)
            self.decide_engine({"actions": [{"type": "llm.call"}]})
        elif kind == "client.messages":
            match = match_view(self.s.nodes, body["messages"])
            if match.known != self.s.head_id:
                self.emit({"type": "head.moved", "head_id": match.known})
            self.record_messages(body["messages"][match.new_from :])
            self.decide_engine({"actions": [{"type": "llm.call"}]})
        else:  # client.action: the engine proposes nothing.
            self.decide_engine({})
        self.settle_turn()

    def record_messages(self, drafts: list[dict[str, Any]]) -> None:
        for draft in drafts:
            msg = {k: v for k, v in draft.items() if v is not None}
            msg["id"] = msg.get("id") or self.ids("msg")
            self.emit({"type": "message.new", "message": msg, "parent_id": self.s.head_id})

    def client_settles_tool(self, body: dict[str, Any]) -> None:
        s = self.state
        call = s.calls.get(body["id"]) if s is not None else None
        if call is None or call.kind != "tool" or call.status != "running":
            raise MachineError("call_not_open", f"tool call {body['id']!r} is not open", status=409)
        if call.handler != "client":
            raise MachineError(
                "call_not_open",
                f"tool call {call.id!r} runs on the {call.handler}, not the client",
                status=409,
            )
        attempt = body.get("attempt")
        if attempt is not None and attempt != call.attempt:
            raise MachineError(
                "stale_attempt",
                f"tool call {call.id!r} is at attempt {call.attempt}, not {attempt}",
                status=409,
            )
        if body["type"] == "tool.result":
            self.finish_tool(call, result=tool_result_of(body), error=None)
        else:
            self.finish_tool(call, result=None, error=body["error"])
        self.out.reply = {"session_id": self.session_id, "turn_id": call.turn_id, "queued": False}
        self.settle_turn()

    # -- decisions -------------------------------------------------------------

    def decide_engine(self, proposed: dict[str, Any]) -> None:
        """The engine decides: accept its own proposal."""
        self.apply_decision(proposed)

    def apply_decision(self, resp: dict[str, Any]) -> None:
        if resp.get("messages"):
            self.record_messages(resp["messages"])
        if resp.get("state") is not None:
            self.emit({"type": "worker.state.updated", "state": resp["state"]})
        if resp.get("agent") is not None:
            self.emit({"type": "agent.updated", "agent": resp["agent"]})
        if resp.get("channels"):
            self.emit({"type": "channels.updated", "channels": resp["channels"]})
        unrunnable: list[tuple[Call, str]] = []
        for action in resp.get("actions") or ():
            if self.s.turn is None:
                break  # `done`/`fail` ended the turn: later actions have no turn to act in.
            if action["type"] == "tool.call":
                self.start_tool_call(action, unrunnable)
            else:
                self.apply_action(action)
        # Fail the calls nothing can run only once all of the decision's calls are
        # open, so the re-prompt waits for every one of them.
        for call, reason in unrunnable:
            self.finish_tool(call, result=None, error=reason)

    def apply_action(self, action: dict[str, Any]) -> None:
        kind = action["type"]
        if kind == "llm.call":
            self.start_llm_call(action)
        elif kind == "done":
            self.end_turn(action.get("data"))
        elif kind == "fail":
            self.fail_turn(action["error"])
        else:
            raise MachineError("invalid_action", f"action {kind!r} is not supported yet", 422)

    # -- model calls -----------------------------------------------------------

    def start_llm_call(self, action: dict[str, Any]) -> None:
        call_id = action.get("id") or self.ids("llm")
        params = {
            k: action[k]
            for k in (
                "llm",
                "model",
                "messages",
                "tools",
                "temperature",
                "max_completion_tokens",
                "reasoning",
                "stream",
            )
            if action.get(k) is not None
        }
        policy = resolve_policy("llm", self.s.agent, action.get("retry"))
        self.emit(
            {
                "type": "llm.call.requested",
                "id": call_id,
                "handler": "server",
                "anchor": self.s.head_id,
                "params": params,
                "retry": policy,
            }
        )
        self.dispatch(self.s.calls[call_id], 1)

    def dispatch(self, call: Call, attempt: int) -> None:
        deadline = run_deadline(call.retry, self.now)
        self.emit(
            {
                "type": f"{call.kind}.call.dispatched",
                "id": call.id,
                "attempt": attempt,
                "deadline_ms": deadline,
            }
        )
        if call.kind == "llm":
            self.out.effects.append(RunLlmCall(call.id, attempt, deadline))

    def llm_settled(self, inp: LlmCallSettled) -> None:
        call = self.live_call(inp.call_id, inp.attempt, "llm")
        if call is None:
            return
        if inp.response is not None:
            resp = inp.response
            self.emit(
                {
                    "type": "llm.call.completed",
                    "id": call.id,
                    "attempt": call.attempt,
                    "usage": resp.get("usage"),
                    "cost": resp.get("cost") or "0",
                    "finish_reason": resp.get("finish_reason"),
                    "model": resp.get("model"),
                }
            )
            self.llm_finished(call, resp)
        else:
            error = inp.error or {"message": "the model call failed", "code": "provider_error"}
            self.call_failed(call, error, inp.retryable, inp.retry_after)
        self.settle_turn()

    def call_failed(
        self,
        call: Call,
        error: dict[str, Any],
        retryable: bool,
        retry_after: float | None,
        *,
        at_once: bool = False,
    ) -> None:
        """Retry under the call's policy, or end it for good."""
        next_attempt = call.attempt + 1
        wait = 0 if at_once else backoff_ms(call.retry, next_attempt)
        if retry_after is not None:
            wait = max(wait, int(retry_after * 1000))
        due = self.now + wait
        final = not retryable or next_attempt > call.retry["max_attempts"]
        if not final and past_total(call.retry, call.started_at, due):
            final = True
            error = {
                "message": f"gave up after {call.attempt} attempts: the call's total timeout "
                f"({call.retry['total_timeout_secs']} s) would pass before the next one",
                "code": "deadline_exceeded",
                "detail": {"last_error": error},
            }
        kind = call.kind
        self.emit(
            {
                "type": f"{kind}.call.errored",
                "id": call.id,
                "attempt": call.attempt,
                "error": error,
                "retryable": retryable,
                "final": final,
            }
        )
        if final:
            if kind == "llm":
                self.fail_turn(error)
            return
        if wait <= 0:
            self.dispatch(call, next_attempt)
            return
        self.emit(
            {
                "type": "call.retry_scheduled",
                "id": call.id,
                "attempt": next_attempt,
                "due_at": iso(due),
            }
        )
        self.out.effects.append(StartTimer(due, TimerFired(call.id, next_attempt)))

    def llm_finished(self, call: Call, resp: dict[str, Any]) -> None:
        """`llm.finished`: record the reply, then start its tool calls or end the turn."""
        message: dict[str, Any] = {
            "id": call.id,
            "role": "assistant",
            "content": resp.get("content"),
        }
        tool_calls = resp.get("tool_calls") or []
        if tool_calls:
            message["tool_calls"] = tool_calls
        if resp.get("reasoning"):
            message["reasoning"] = resp["reasoning"]
        finish = resp.get("finish_reason")
        actions: list[dict[str, Any]]
        if finish == "length":
            actions = [
                fail_action("the model's reply was cut off at its length limit", "provider_error")
            ]
        elif finish == "content_filter":
            actions = [fail_action("the model declined to answer", "refused")]
        elif tool_calls:
            actions = [
                {
                    "type": "tool.call",
                    "id": tc["id"],
                    "name": tc["function"]["name"],
                    "arguments": tc["function"]["arguments"],
                }
                for tc in tool_calls
            ]
        else:
            actions = [{"type": "done"}]
        self.decide_engine({"messages": [message], "actions": actions})

    def timer_fired(self, inp: TimerFired) -> None:
        call = self.s.calls.get(inp.call_id)
        if call is None or call.status != "retry_scheduled" or inp.attempt != call.attempt + 1:
            self.out.ignored = f"timer for {inp.call_id!r} attempt {inp.attempt} is stale"
            return
        self.dispatch(call, inp.attempt)

    def call_lost(self, inp: CallLost) -> None:
        call = self.live_call(inp.call_id, inp.attempt, None)
        if call is None:
            return
        error = {"message": "the engine running this call stopped", "code": "internal"}
        self.call_failed(call, error, retryable=True, retry_after=None, at_once=True)
        self.settle_turn()

    def live_call(self, call_id: str, attempt: int, kind: str | None) -> Call | None:
        call = self.s.calls.get(call_id)
        if call is None or (kind is not None and call.kind != kind):
            self.out.ignored = f"call {call_id!r} is not open"
            return None
        if call.status != "running" or call.attempt != attempt:
            self.out.ignored = (
                f"call {call_id!r} attempt {attempt} was replaced (now {call.attempt})"
            )
            return None
        return call

    # -- tool calls ------------------------------------------------------------

    def start_tool_call(self, action: dict[str, Any], unrunnable: list[tuple[Call, str]]) -> None:
        call_id = action.get("id") or self.ids("tool")
        name = action["name"]
        arguments = action.get("arguments")
        if not isinstance(arguments, str):
            arguments = json.dumps(
                arguments if arguments is not None else {}, separators=(",", ":")
            )
        tool = find_tool(self.s.agent, name)
        handler = (tool or {}).get("handler") or "worker"
        kind = "client_tool" if handler == "client" else "tool"
        self.emit(
            {
                "type": "tool.call.requested",
                "id": call_id,
                "name": name,
                "arguments": arguments,
                "handler": handler,
                "retry": resolve_policy(kind, self.s.agent, action.get("retry")),
            }
        )
        call = self.s.calls[call_id]
        if handler == "client":
            self.dispatch(call, 1)  # open until the client answers
            return
        # No worker can run it: the model learns that from the tool result.
        reason = f"tool {name!r} is not declared" if tool is None else f"no worker runs {name!r}"
        unrunnable.append((call, reason))

    def finish_tool(self, call: Call, *, result: dict[str, Any] | None, error: str | None) -> None:
        """`tool.finished`: record the tool message; re-prompt once no other call is open."""
        if error is None:
            assert result is not None
            self.emit({"type": "tool.call.completed", "id": call.id, "result": result})
            content = result_text(result)
        else:
            info = {"message": error, "code": "handler_error"}
            self.emit(
                {
                    "type": "tool.call.errored",
                    "id": call.id,
                    "attempt": call.attempt,
                    "error": info,
                    "retryable": False,
                    "final": True,
                }
            )
            content = f"Error: {error}"
        self.record_messages(
            [{"role": "tool", "tool_call_id": call.id, "name": call.name, "content": content}]
        )
        if not self.open_calls(call.turn_id):
            self.decide_engine({"actions": [{"type": "llm.call"}]})

    def open_calls(self, turn_id: str) -> list[Call]:
        return [c for c in self.s.calls.values() if c.turn_id == turn_id]

    # -- turn end --------------------------------------------------------------

    def settle_turn(self) -> None:
        """An engine-decided turn with nothing left in flight is over."""
        s = self.state
        if s is not None and s.turn is not None and not self.open_calls(s.turn.id):
            self.end_turn(None)

    def close_open_calls(self, turn_id: str) -> None:
        """A turn that ends closes what it still has open, each with an event of its own."""
        for call in self.open_calls(turn_id):
            self.emit(
                {
                    "type": f"{call.kind}.call.errored",
                    "id": call.id,
                    "attempt": call.attempt,
                    "error": {
                        "message": "the turn ended before the call finished",
                        "code": "internal",
                        "detail": {"reason": "turn_ended"},
                    },
                    "retryable": False,
                    "final": True,
                }
            )

    def end_turn(self, data: Any) -> None:
        """`done`, then `turn.finished`, whose proposal (`done`) the engine accepts."""
        turn = self.s.turn
        assert turn is not None
        self.close_open_calls(turn.id)
        payload: dict[str, Any] = {
            "type": "turn.completed",
            "turn_id": turn.id,
            "cost": turn.cost,
            "usage": turn.usage,
        }
        if data is not None:
            payload["data"] = data
        self.emit(payload)
        self.next_queued()

    def fail_turn(self, error: dict[str, Any]) -> None:
        turn = self.s.turn
        assert turn is not None
        self.close_open_calls(turn.id)
        self.emit(
            {
                "type": "turn.failed",
                "turn_id": turn.id,
                "error": error,
                "cost": turn.cost,
                "usage": turn.usage,
            }
        )
        self.next_queued()

    def next_queued(self) -> None:
        if self.s.queue:
            nxt = self.s.queue[0]
            self.start_turn(nxt["turn_id"], nxt["input"])


def fail_action(message: str, code: str) -> dict[str, Any]:
    return {"type": "fail", "error": {"message": message, "code": code}}


def find_tool(agent: dict[str, Any] | None, name: str) -> dict[str, Any] | None:
    for tool in (agent or {}).get("tools") or ():
        if tool.get("name") == name:
            return tool
    return None


def tool_result_of(body: dict[str, Any]) -> dict[str, Any]:
    """A tool result as MCP content blocks: a string or other JSON becomes one text block."""
    if body.get("content") is not None:
        content = body["content"]
    else:
        value = body.get("result")
        text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
        content = [{"type": "text", "text": text}]
    result: dict[str, Any] = {"content": content}
    if body.get("structured_content") is not None:
        result["structuredContent"] = body["structured_content"]
    if body.get("is_error"):
        result["isError"] = True
    return result


def result_text(result: dict[str, Any]) -> str:
    parts = [b.get("text", "") for b in result.get("content") or () if b.get("type") == "text"]
    return "\n".join(parts)


_DISPATCH: dict[type, Callable[[_Step, Any], None]] = {
    ClientSubmitted: _Step.client_submitted,
    LlmCallSettled: _Step.llm_settled,
    TimerFired: _Step.timer_fired,
    CallLost: _Step.call_lost,
}


def step(state: SessionState | None, session_id: str, inp: Input, now: int, ids: Ids) -> Transition:
    """Apply one input. Mutates `state` (when it emits) and returns the transition.

    Raises:
        MachineError: the input is refused; nothing was emitted.
    """
    handler = _DISPATCH.get(type(inp))
    if handler is None:
        raise TypeError(f"unknown input {type(inp).__name__}")
    if state is None and not isinstance(inp, ClientSubmitted):
        return Transition(state=None, ignored=f"session {session_id!r} does not exist")
    if state is None and inp.input["type"] not in TURN_STARTS:  # type: ignore[union-attr]
        raise MachineError("unknown_session", f"session {session_id!r} does not exist", 404)
    st = _Step(state, session_id, now, ids)
    handler(st, inp)
    return st.out
