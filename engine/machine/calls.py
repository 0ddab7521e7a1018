"""Calls (SPEC §5-§7, §11): a call's attempts, their retries and deadlines; a model's reply.

A call is requested (requesting.py), then each attempt is dispatched under its kind's
rules (the step's table, core.py `Kinds`: its effect, deadline and hooks) until it ends:
answered (a model's reply here; a tool's result is settling.py's), or failed for good
under its retry policy. How it ends is recorded, and what the model or the worker is to
be asked next is left to the decision slot (asking.py). Subagent calls are calls of
their own kind (subagents.py); so are MCP's (connectors.py).
"""

from __future__ import annotations

from typing import Any

from . import events as ev
from . import retry
from .asking import decide, decision_lost
from .core import Step, iso
from .effects import StartTimer
from .inputs import CallDeadline, CallLost, LlmCallSettled, TimerFired
from .retry import Fault, run_deadline
from .shapes import (
    Action,
    ErrorInfo,
    Fail,
    LlmFinished,
    RetryPolicy,
    SubagentSpawn,
    ToolCall,
)
from .spawns import subagent_named
from .state import Call
from .tool_messages import tool_finished
from .tools import arguments_of

# -- sending an attempt ----------------------------------------------------------


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


def unanswered_call(st: Step, call_id: str, attempt: int) -> Call | None:
    """The call a runner's or worker's answer is for, if that attempt is still out and
    not answered already (an async one waits for its settle); else ignored."""
    call = live_call(st, call_id, attempt, None)
    if call is not None and call.status == "waiting":
        st.ignore(f"call {call.id!r} was already answered (it is async)")
        return None
    return call


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


def _fail(message: str, code: str) -> Fail:
    return {"type": "fail", "error": {"message": message, "code": code}}
