"""Requesting calls (SPEC §5-§7): a model or tool call the agent asked for, recorded
and sent, or held first.

A call over a budget that refuses is not made (budgets.py). Any other is recorded
(`*.call.requested`, with its retry policy) before anything is sent, so that it can be
held: over a budget that asks, it waits on an interrupt; a connector's tool that changes
things waits for a person's approval (its connection's `approve`). Either way it is sent
once someone approves (resuming.py). A tool nothing here can run is recorded but not
sent: the caller is told why (decisions.py records it as a call nothing can run, and
the model reads the tool's error). Sending an attempt is calls.py's.
"""

from __future__ import annotations

import json
from typing import Any

from . import budgets
from . import events as ev
from .calls import dispatch
from .connections import call_params, entries
from .core import Step, iso
from .interrupts import raise_interrupt
from .shapes import LlmCall, Raise, ToolCall
from .state import Call, SessionState
from .tools import arguments_of, find_tool

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
        over = budgets.check_policies(st, est)
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
        budgets.ask(st, over, call_id)  # sent once a person approves (resuming.py)
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
            budgets.ask(st, over, call_id)  # `send_tool` once a person approves (resuming.py)
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
        ask_approval(st, call, tool)  # sent once a person approves (resuming.py)
        return
    dispatch(st, call, 1)
