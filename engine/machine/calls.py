"""Calls (SPEC §5-§7, §11): model and tool calls, their attempts, retries and deadlines.

A call is requested, then each attempt is dispatched under its kind's rules (the
step's table, core.py `Kinds`: its effect, deadline and hooks) until it ends: answered,
or failed for good under its retry policy. How it ends is recorded, and what the model
or the worker is to be asked next is left to the decision slot (asking.py). Subagent
calls are calls of their own kind (subagents.py); so are MCP's (connectors.py).
"""

from __future__ import annotations

import json
from typing import Any

from . import budgets, retry
from . import events as ev
from .asking import decide, decision_lost
from .connections import call_params, entries
from .core import MachineError, Step, iso
from .effects import StartTimer
from .inputs import (
    CallAnswered,
    CallDeadline,
    CallLost,
    CallSettled,
    LlmCallSettled,
    TimerFired,
)
from .interrupts import raise_interrupt
from .retry import Fault, run_deadline
from .shapes import (
    Action,
    Answer,
    ErrorInfo,
    Fail,
    LlmCall,
    LlmFinished,
    Raise,
    RetryPolicy,
    SubagentSpawn,
    ToolCall,
    ToolErrorInput,
    ToolFinished,
    ToolResultInput,
    Trigger,
)
from .spawns import subagent_named
from .state import Call, SessionState
from .tools import arguments_of, check_output, find_tool, result_text, tool_result_of

_LLM_PARAMS = (
    "llm",
    "model",
    "messages",
    "tools",
    "temperature",
    "max_completion_tokens",
    "reasoning",
    "stream",
)


# -- starting --------------------------------------------------------------------


APPROVE_OPTIONS = [
    {"label": "Approve", "value": "approve", "style": "primary"},
    {"label": "Decline", "value": "decline", "style": "danger"},
]


def needs_approval(state: SessionState, tool: dict[str, Any]) -> bool:
    """Whether a connector call stops for a person first, by its connection's `approve`:
    `always`, `never`, or `destructive` (the default: least privilege) for a tool whose
    MCP annotations do not rule it out. MCP's own defaults apply: a tool is destructive
    unless it says `readOnlyHint: true` or `destructiveHint: false`."""
    entry = next((e for e in entries(state.agent) if e["id"] == tool["connector"]), {})
    policy = entry.get("approve") or "destructive"
    if policy != "destructive":
        return bool(policy == "always")
    known = state.connectors.get(tool["connector"])
    synced = (known.get("tools") if known else None) or ()
    listed: dict[str, Any] = next((t for t in synced if t.get("name") == tool["tool"]), {})
    notes = listed.get("annotations") or {}
    return notes.get("readOnlyHint") is not True and notes.get("destructiveHint") is not False


# How long a call may wait for approval when its connection's sync named no timeout.
APPROVE_TIMEOUT_MS = 3_600_000


def ask_approval(st: Step, call: Call, tool: dict[str, Any]) -> None:
    """Hold a connector call behind an interrupt naming the tool and its arguments. It
    expires (`expiresAt`) after the connection's `approve_timeout`, so an unanswered
    prompt cannot hold the turn open forever: expired, the model reads a tool error."""
    parsed = arguments_of(call.arguments or "")
    shown = json.dumps(parsed, ensure_ascii=False) if parsed not in (None, {}) else "no arguments"
    synced = st.s.connectors.get(tool["connector"])
    timeout = (synced.get("approve_timeout_ms") if synced else None) or APPROVE_TIMEOUT_MS
    action: Raise = {
        "interrupt_id": f"approve-{call.id}",
        "reason": f"{call.name} changes things: approve it first",
        "payload": {
            "message": f"Run `{call.name}` ({tool['connector']}) with {shown}?",
            "toolCallId": call.id,
            "expiresAt": iso(st.now + timeout),
            "metadata": {
                "options": APPROVE_OPTIONS,
                "tool": call.name,
                "arguments": parsed,
                "connection": tool["connector"],
            },
        },
    }
    raise_interrupt(st, action, "approval")


def llm_handler(st: Step, block: str | None) -> tuple[str, str | None]:
    """Where a model call runs, and in which wire format (SPEC §7, seed 002)."""
    agent = st.s.agent or {}
    if agent.get("handler") == "worker":
        return "worker", agent.get("format")
    route = st.s.llm_routes.get(block or "")
    if route and route.get("type") == "worker":
        return "worker", route.get("format")
    return "server", None


def start_llm_call(st: Step, action: LlmCall) -> None:
    """Record and dispatch a model call the agent asked for."""
    call_id = action.get("id") or st.ids("llm")
    params: dict[str, Any] = {k: action.get(k) for k in _LLM_PARAMS if action.get(k) is not None}
    handler, fmt = llm_handler(st, params.get("llm") or (st.s.agent or {}).get("llm"))
    if fmt:
        params["format"] = fmt
    est = budgets.estimate(st.s, params, st.now, policies=bool(st.buckets))
    over: budgets.Exceeded | budgets.PolicyExceeded | None = budgets.check(st.s, "llm", est)
    if over is None:  # the turn's own limits allow it: then the `[[budgets]]` buckets
        over = budgets.check_policies(st.s, st.buckets, est)
    if over is not None and over.on_exceeded != "ask":
        budgets.refuse(st, over)  # the call is not made
        return
    requested: ev.LlmCallRequested = {
        "type": ev.LLM_CALL_REQUESTED,
        "id": call_id,
        "handler": handler,
        "anchor": st.s.head_id,
        "params": params,
        "retry": st.kinds.policy("llm", st.s.agent, action.get("retry")),
    }
    if est is not None:
        requested["estimate"] = est
    st.emit(requested)
    if over is not None:
        budgets.ask(st, over, call_id)  # sent once a person approves (turns.py)
        return
    dispatch(st, st.s.calls[call_id], 1)


def start_tool_call(st: Step, action: ToolCall, unrunnable: list[tuple[Call, str]]) -> None:
    """Record and dispatch a tool call, or note why it cannot run."""
    call_id = action.get("id") or st.ids("tool")
    name = action["name"]
    arguments = action.get("arguments")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments if arguments is not None else {}, separators=(",", ":"))
    tool = find_tool(st.s.agent, name, st.s.turn_tools) or call_params(st.s, name)
    handler = (tool or {}).get("handler") or "worker"
    kind = st.kinds.of("tool", handler)
    over = budgets.check(st.s, "tool", None)
    if over is not None and over.on_exceeded != "ask":
        budgets.refuse(st, over)  # the call is not made
        return
    requested: ev.ToolCallRequested = {
        "type": ev.TOOL_CALL_REQUESTED,
        "id": call_id,
        "name": name,
        "arguments": arguments,
        "handler": handler,
        "retry": st.kinds.policy(kind.retry if kind else "tool", st.s.agent, action.get("retry")),
    }
    if tool is not None and "connector" in tool:
        requested["params"] = {"connector": tool["connector"], "tool": tool["tool"]}
    st.emit(requested)
    call = st.s.calls[call_id]
    if kind is not None and kind.runnable(st.s):
        if over is not None:
            budgets.ask(st, over, call_id)  # `send_tool` once a person approves (turns.py)
            return
        send_tool(st, call)
        return
    # An engine-decided agent has no worker to run it: the model learns that.
    if tool is None:
        reason = f"tool {name!r} is not declared"
    elif kind is None:
        reason = f"no handler {handler!r} runs {name!r}"
    else:
        reason = f"no {handler} runs {name!r}"
    unrunnable.append((call, reason))


def send_tool(st: Step, call: Call) -> None:
    """Send a recorded, runnable tool call: a connector's that needs a person's approval
    asks for it first."""
    tool = find_tool(st.s.agent, call.name or "", st.s.turn_tools) or call_params(
        st.s, call.name or ""
    )
    if tool is not None and "connector" in tool and needs_approval(st.s, tool):
        ask_approval(st, call, tool)  # sent once a person approves (turns.py)
        return
    dispatch(st, call, 1)


def dispatch(st: Step, call: Call, attempt: int) -> None:
    """Send a call's attempt under its kind's deadline."""
    kind = st.kinds.of(call.kind, call.handler)
    if kind is not None and kind.attempt_deadline is not None:
        deadline = kind.attempt_deadline(call, st.now)
    else:
        deadline = run_deadline(call.retry, st.now)
    st.emit(
        {
            "type": ev.call_event(call.kind, "dispatched"),
            "id": call.id,
            "attempt": attempt,
            "deadline_ms": deadline,
        }
    )
    if kind is not None and kind.effect is not None:
        st.out.effects.append(kind.effect(call.id, attempt, deadline))
    if kind is not None and kind.dispatched is not None:
        kind.dispatched(st, call, attempt)


# -- finding the attempt an answer belongs to ------------------------------------


def live_call(st: Step, call_id: str, attempt: int, kind: str | None) -> Call | None:
    """The call an answer is for, if that attempt is still out; else ignored."""
    call = st.s.calls.get(call_id)
    if call is None or (kind is not None and call.kind != kind):
        st.ignore(f"call {call_id!r} is not open")
        return None
    if call.status not in ("running", "waiting") or call.attempt != attempt:
        st.ignore(f"call {call_id!r} attempt {attempt} was replaced (now {call.attempt})")
        return None
    return call


# -- answers of a kind's runner ----------------------------------------------------


def call_answered(st: Step, inp: CallAnswered) -> None:
    """A kind's runner ended an attempt: the kind settles it (kinds.py)."""
    call = live_call(st, inp.call_id, inp.attempt, None)
    if call is None:
        return
    if call.status == "waiting":
        st.ignore(f"call {call.id!r} was already answered (it is async)")
        return
    kind = st.kinds.of(call.kind, call.handler)
    settle = kind.settle if kind is not None and kind.settle is not None else answered
    settle(st, call, inp)


def answered(st: Step, call: Call, inp: CallAnswered) -> None:
    """How an answer settles by default: a model reply, or a tool's result."""
    if inp.error is not None:
        call_failed(st, call, inp.error, inp.retryable, inp.retry_after)
    elif call.kind == "llm":
        llm_completed(st, call, inp.result)
    else:
        settle_tool(st, call, tool_result_of(inp.result), None, False)


# -- model calls -----------------------------------------------------------------


def llm_settled(st: Step, inp: LlmCallSettled) -> None:
    """A model call's answer or failure for the attempt still out."""
    call = live_call(st, inp.call_id, inp.attempt, "llm")
    if call is None:
        return
    if inp.response is not None:
        llm_completed(st, call, inp.response)
    else:
        error = inp.error or {"message": "the model call failed", "code": "provider_error"}
        call_failed(st, call, error, inp.retryable, inp.retry_after)


def llm_completed(st: Step, call: Call, resp: dict[str, Any]) -> None:
    """`llm.finished`: record the reply, then start its tool calls or end the turn."""
    usage, cost = resp.get("usage"), resp.get("cost") or "0"
    st.emit(
        {
            "type": ev.LLM_CALL_COMPLETED,
            "id": call.id,
            "attempt": call.attempt,
            "usage": usage,
            "cost": cost,
            "finish_reason": resp.get("finish_reason"),
            "model": resp.get("model"),
        }
    )
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
    truncated = finish == "length"
    refused = finish == "content_filter"
    actions: list[Action]
    if truncated:
        actions = [_fail("the model's reply was cut off at its length limit", "provider_error")]
    elif refused:
        actions = [_fail("the model declined to answer", "refused")]
    elif tool_calls:
        actions = [tool_call_action(st, tc) for tc in tool_calls]
    else:
        actions = [{"type": "done"}]
    trigger: LlmFinished = {
        "type": "llm.finished",
        "id": call.id,
        "ok": True,
        "message": {k: v for k, v in message.items() if v is not None},
        "truncated": truncated,
        "refused": refused,
        "cost": cost,
    }
    if usage:
        trigger["usage"] = usage
    decide(st, trigger, {"messages": [message], "actions": actions})


def tool_call_action(st: Step, tc: dict[str, Any]) -> ToolCall | SubagentSpawn:
    """A model's tool call: a plain `tool.call`, or a `subagent.spawn` for a child's tool."""
    name, arguments = tc["function"]["name"], tc["function"]["arguments"]
    child = subagent_named(st.s.agent, name)
    if child is None:
        return {"type": "tool.call", "id": tc["id"], "name": name, "arguments": arguments}
    parsed = arguments_of(arguments or "")
    args = parsed if isinstance(parsed, dict) else {}
    spawn: SubagentSpawn = {
        "type": "subagent.spawn",
        "agent_id": child,
        "tool_call_id": tc["id"],
    }
    if isinstance(args.get("message"), str):
        spawn["message"] = {"role": "user", "content": args["message"]}
    if isinstance(args.get("session"), str):
        spawn["session_id"] = args["session"]
    if args.get("mode") is not None:
        spawn["mode"] = args["mode"]
    return spawn


# -- failed attempts -------------------------------------------------------------


def call_failed(
    st: Step,
    call: Call,
    error: ErrorInfo,
    retryable: bool,
    retry_after: float | None,
    *,
    at_once: bool = False,
    policy: RetryPolicy | None = None,
    counted: bool = True,
    message_id: str | None = None,
) -> None:
    """Retry under the call's policy (or `policy`), or end it for good (its tool message
    recorded under `message_id` when given).

    An attempt lost with its engine is not `counted` against max_attempts: the
    call did not fail, the engine did. The total timeout still bounds it.
    """
    nxt = retry.after_failure(
        policy or call.retry,
        call.attempt,
        call.started_at,
        st.now,
        retryable=retryable,
        retry_after=retry_after,
        at_once=at_once,
        counted=counted,
        total=call.retry,
    )
    final = nxt.final
    if nxt.timed_out:
        error = {
            "message": f"gave up after {call.attempt} attempts: the call's total timeout "
            f"({call.retry['total_timeout_secs']} s) would pass before the next one",
            "code": "deadline_exceeded",
            "detail": {"last_error": error},
        }
    st.emit(
        {
            "type": ev.call_event(call.kind, "errored"),
            "id": call.id,
            "attempt": call.attempt,
            "error": error,
            "retryable": retryable,
            "final": final,
        }
    )
    if final:
        ending = st.kinds.of(call.kind, call.handler)
        if ending is not None and ending.failed is not None:
            ending.failed(st, call, error)
        elif call.kind == "llm":
            trigger: LlmFinished = {
                "type": "llm.finished",
                "id": call.id,
                "ok": False,
                "truncated": False,
                "error": error,
            }
            decide(st, trigger, {"actions": [{"type": "fail", "error": error}]})
        else:
            tool_finished(st, call, None, error, message_id=message_id)
        return
    next_attempt = call.attempt + 1
    if nxt.due <= st.now:
        dispatch(st, call, next_attempt)
        return
    st.emit(
        {
            "type": ev.CALL_RETRY_SCHEDULED,
            "id": call.id,
            "attempt": next_attempt,
            "due_at": iso(nxt.due),
        }
    )
    st.out.effects.append(StartTimer(nxt.due, TimerFired(call.id, next_attempt)))


def timer_fired(st: Step, inp: TimerFired) -> None:
    """A backoff ended: dispatch the call's next attempt, unless the timer is stale."""
    call = st.s.calls.get(inp.call_id)
    if call is None or call.status != "retry_scheduled" or inp.attempt != call.attempt + 1:
        st.ignore(f"timer for {inp.call_id!r} attempt {inp.attempt} is stale")
        return
    dispatch(st, call, inp.attempt)


def call_lost(st: Step, inp: CallLost) -> None:
    """The engine running an attempt stopped: a failed attempt, retried at once."""
    decision = st.s.decision
    if decision is not None and decision.id == inp.call_id:
        decision_lost(st, inp)
        return
    call = live_call(st, inp.call_id, inp.attempt, None)
    if call is None or call.status == "waiting":
        return
    lost = Fault.LOST
    error = lost.error("the engine running this call stopped")
    call_failed(st, call, error, lost.retryable, None, at_once=True, counted=False)


def delivery_failed(st: Step, call: Call, error: ErrorInfo, retryable: bool) -> None:
    """The worker was not reached or answered nonsense: retried like a decision
    (SPEC §11, worker decision row), not under the tool's own attempts."""
    policy = st.kinds.policy("decision", st.s.agent)
    call_failed(st, call, error, retryable, None, policy=policy)


def call_deadline(st: Step, inp: CallDeadline) -> None:
    """An attempt's deadline timer fired: it failed, as its kind says (a subagent's may be
    over its queue time or its whole run), and whom it involves is told (a child)."""
    call = live_call(st, inp.call_id, inp.attempt, None)
    if call is None:
        return
    kind = st.kinds.of(call.kind, call.handler)
    if kind is not None and kind.overdue is not None:
        error, retryable = kind.overdue(call, st.now)
    else:
        late = Fault.DEADLINE
        error, retryable = (
            late.error(f"{call.name or call.id} ran past its deadline"),
            late.retryable,
        )
    if kind is not None and kind.stop is not None:
        kind.stop(st, call)
    call_failed(st, call, error, retryable, None)


# -- tool results ----------------------------------------------------------------


def settle_tool(
    st: Step,
    call: Call,
    result: dict[str, Any] | None,
    error: str | None,
    retryable: bool,
    message_id: str | None = None,
) -> None:
    """A tool attempt ended: check the output, retry a retryable error, or finish."""
    if error is None:
        assert result is not None
        mismatch = check_output(find_tool(st.s.agent, call.name or "", st.s.turn_tools), result)
        if mismatch is not None:
            bad = Fault.BAD_OUTPUT
            call_failed(st, call, bad.error(mismatch), bad.retryable, None)
            return
        st.emit({"type": ev.TOOL_CALL_COMPLETED, "id": call.id, "result": result})
        tool_finished(st, call, result, None, message_id=message_id)
        return
    error_info: ErrorInfo = {"message": error, "code": "handler_error"}
    call_failed(st, call, error_info, retryable, None, message_id=message_id)


def tool_finished(
    st: Step,
    call: Call,
    result: dict[str, Any] | None,
    error: ErrorInfo | None,
    *,
    trigger: Trigger | None = None,
    message_id: str | None = None,
) -> None:
    """`tool.finished` (or `subagent.finished`): record the tool message (under
    `message_id` when the client named it); re-prompt once no other call is open."""
    if result is not None:
        content = result_text(result)
    else:
        assert error is not None  # a tool ends with a result or an error
        content = f"Error: {error['message']}"
    message = {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": content}
    if message_id is not None:
        message["id"] = message_id
    if trigger is None:
        finished: ToolFinished = {
            "type": "tool.finished",
            "id": call.id,
            "ok": error is None,
            "name": call.name,
        }
        if result is not None:
            finished["result"] = result
        if error is not None:
            finished["error"] = error
        trigger = finished
    proposed = reprompt_or_nothing(st)
    proposed["messages"] = [message]
    decide(st, trigger, proposed)


def reprompt_or_nothing(st: Step) -> Answer:
    """Re-prompt only once nothing else is open and the branch is not paused."""
    s = st.s
    if s.interrupts or any(c.turn_id == (s.turn.id if s.turn else None) for c in s.calls.values()):
        return {}
    return {"actions": [{"type": "llm.call"}]}


def client_settles_tool(st: Step, body: ToolResultInput | ToolErrorInput) -> None:
    """A client's `tool.result` / `tool.error` for one of its own tool calls."""
    call = settleable(st, body["id"], body.get("attempt"), client_input=True)
    if body["type"] == "tool.result":
        result = tool_result_of(
            body.get("result"),
            body.get("content"),
            body.get("structured_content"),
            bool(body.get("is_error")),
        )
        settle_tool(st, call, result, None, False)
    else:
        settle_tool(st, call, None, body["error"], bool(body.get("retryable")))
    st.out.reply = {"session_id": st.session_id, "turn_id": call.turn_id, "queued": False}


def api_settles_call(st: Step, inp: CallSettled) -> None:
    """The settle API: ends an async (waiting) worker call or a client call."""
    call = settleable(st, inp.call_id, inp.attempt, client_input=False)
    if inp.client_only and call.handler != "client":
        raise MachineError(
            f"tool call {call.id!r} runs on the {call.handler}, not the client: only a "
            "full-access key may settle it (a KEY:own key answers its client tools)",
            code="forbidden",
            status=403,
        )
    if inp.message_id is not None and inp.message_id in st.s.nodes:
        raise MachineError(
            f"message {inp.message_id!r} is already recorded", code="duplicate_message_id"
        )
    if inp.error is None:
        result = tool_result_of(inp.result, inp.content)
        settle_tool(st, call, result, None, False, inp.message_id)
    else:
        settle_tool(st, call, None, inp.error, inp.retryable, inp.message_id)
    st.out.reply = {
        "session_id": st.session_id,
        "call_id": call.id,
        "attempt": call.attempt,
    }


def settleable(st: Step, call_id: str, attempt: int | None, *, client_input: bool) -> Call:
    """The open call a settle names, or a MachineError that says why not."""
    call = st.state.calls.get(call_id) if st.state is not None else None
    if call is None or call.kind != "tool" or call.status not in ("running", "waiting"):
        raise MachineError(f"tool call {call_id!r} is not open", code="call_not_open", status=409)
    if client_input and call.handler != "client":
        raise MachineError(
            f"tool call {call.id!r} runs on the {call.handler}, not the client",
            code="call_not_open",
        )
    kind = st.kinds.of(call.kind, call.handler)
    if not client_input and call.status != "waiting" and not (kind and kind.outside_settles):
        raise MachineError(
            f"tool call {call.id!r} is being run by the {call.handler}; only an async call "
            "(answered with an empty decision) can be settled",
            code="call_not_open",
        )
    if attempt is not None and attempt != call.attempt:
        raise MachineError(
            f"tool call {call.id!r} is at attempt {call.attempt}, not {attempt}",
            code="stale_attempt",
        )
    return call


def _fail(message: str, code: str) -> Fail:
    return {"type": "fail", "error": {"message": message, "code": code}}
