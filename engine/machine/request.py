"""Project a model call onto the neutral LlmRequest it sends (SPEC §5 `llm.call`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import connections
from .budgets import metadata as budget_metadata
from .core import iso
from .shapes import Answer
from .spawns import ALLOWED_MODES, spawn_args
from .state import Call, SessionState
from .tools import find_tool, validate_input
from .tree import path_to

_DRAFT_KEYS = ("id", "role", "content", "name", "tool_call_id", "tool_calls", "reasoning")


@dataclass(frozen=True)
class LlmCallPlan:
    """What the shell needs to run one model call."""

    llm: str | None  # the [llm.<id>] block; None when the config names none
    request: dict[str, Any]  # neutral LlmRequest
    stream: bool


_SUBAGENT_INPUT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "message": {"type": "string", "description": "What to ask the agent."},
        "session": {"type": "string", "description": "Continue an earlier call's session."},
    },
    "required": ["message"],
}
_MODE_HELP = {
    "blocking": "blocking: wait for the answer",
    "detached": "detached: start it and go on; you get its session at once",
    "wait": "wait: collect the answer of a detached `session` (no message)",
}


def _offered(tool: dict[str, Any]) -> dict[str, Any]:
    """One declared tool (or a turn's per-submit client tool) as the model sees it."""
    offered = {"name": tool["name"], "description": tool.get("description") or ""}
    for key in ("input", "output", "defer"):
        if tool.get(key) is not None:
            offered[key] = tool[key]
    return offered


def _subagent_input(configured: str | None) -> dict[str, Any]:
    """The subagent tool's input: `message`, `session?`, and a `mode` choice when the
    configured mode leaves the call one (a `wait` call sends no message)."""
    modes = ALLOWED_MODES.get(configured or "blocking", ("blocking",))
    if len(modes) == 1:
        return _SUBAGENT_INPUT
    mode = {
        "type": "string",
        "enum": list(modes),
        "description": "; ".join(_MODE_HELP[m] for m in modes) + f". Default: {modes[0]}.",
    }
    return {
        **_SUBAGENT_INPUT,
        "properties": {**_SUBAGENT_INPUT["properties"], "mode": mode},
        "required": [],
    }


def offered_tools(state: SessionState) -> list[dict[str, Any]]:
    """The agent's tools as the model sees them (LlmTool): its own, then one per
    subagent while the session is above the depth limit (SPEC §9), then its
    connections' (connections.py), then the running turn's per-submit client tools
    (SPEC §6: they hold their names against a connection's)."""
    agent = state.agent or {}
    tools = declared_tools(agent, len(state.ancestry))
    turn_tools = [_offered(tool) for tool in state.turn_tools]
    taken = connections.own_names(agent) | {t["name"] for t in turn_tools}
    for tool in connections.tools_of(state, taken).values():
        tools.append({k: tool[k] for k in ("name", "description", "input")})
    return tools + turn_tools


def declared_tools(agent: dict[str, Any], depth: int) -> list[dict[str, Any]]:
    """The agent's own tools and its subagents' as LlmTools."""
    tools = [_offered(tool) for tool in agent.get("tools") or ()]
    limit = agent.get("max_subagent_depth")
    if depth < (5 if limit is None else limit):
        for sub in agent.get("subagents") or ():
            name = f"agent__{sub['id']}" if sub.get("prefix") else sub["id"]
            description = sub.get("description") or f"Ask the {sub['id']} agent."
            offered_input = _subagent_input(sub.get("mode"))
            tools.append({"name": name, "description": description, "input": offered_input})
    return tools


def build_llm_request(state: SessionState, call: Call) -> LlmCallPlan:
    """Without `messages`, the config's system prompt plus the path to the call's anchor."""
    agent = state.agent or {}
    params = call.params
    if params.get("messages") is not None:
        messages = list(params["messages"])
    else:
        messages = []
        if agent.get("system"):
            messages.append({"role": "system", "content": agent["system"]})
        for msg in path_to(state.nodes, call.anchor):
            messages.append({k: msg[k] for k in _DRAFT_KEYS if k in msg})
    request: dict[str, Any] = {
        "model": params.get("model") or agent.get("model") or "",
        "messages": messages,
    }
    tools = params["tools"] if params.get("tools") is not None else offered_tools(state)
    if tools:
        request["tools"] = tools
    for key in ("temperature", "max_completion_tokens", "reasoning"):
        if params.get(key) is not None:
            request[key] = params[key]
    if "reasoning" not in request and agent.get("effort"):
        request["reasoning"] = {"effort": agent["effort"]}
    stream = params.get("stream")
    if stream is None:
        stream = agent.get("stream", True) is not False
    return LlmCallPlan(llm=params.get("llm") or agent.get("llm"), request=request, stream=stream)


# -- decision requests (SPEC §3) ------------------------------------------------------

_STATUS = {
    "requested": "pending",
    "running": "running",
    "waiting": "running",
    "retry_scheduled": "retry_scheduled",
    "failed": "failed",
}
# Our extensions to the agent config, kept in state but not on the wire (seed 002).
_NOT_ON_WIRE = ("handler", "format", "stream", "budget", "session_budget")


def wire_agent(agent: dict[str, Any] | None) -> dict[str, Any] | None:
    """The agent config as the protocol sends it, without engine-only keys; None without a model."""
    if not agent or "model" not in agent:
        return None
    return {k: v for k, v in agent.items() if k not in _NOT_ON_WIRE}


def with_engine_keys(current: dict[str, Any] | None, given: dict[str, Any]) -> dict[str, Any]:
    """A worker's agent config, with the engine-only keys of the current one carried
    over: it was never sent them (`wire_agent`), so leaving them out cannot mean "drop
    them". A worker echoing `session.start`'s proposal keeps the file's `budget`; one
    that sends a key itself sets it (`budget: {}` lifts the limits: the wire drops a
    null). A carried budget's `price` is its model's, so it goes when the worker names
    another model or LLM: the engine cannot price that one, and estimates nothing."""
    if not current:
        return given
    kept = {k: current[k] for k in _NOT_ON_WIRE if k in current and k not in given}
    if not kept:
        return given
    if any(given.get(k) != current.get(k) for k in ("model", "llm")):
        for key in ("budget", "session_budget"):
            if isinstance(kept.get(key), dict) and "price" in kept[key]:
                kept[key] = {k: v for k, v in kept[key].items() if k != "price"}
    return {**given, **kept}


def wire_proposed(proposed: Answer) -> Mapping[str, Any]:
    """A proposal as the protocol sends it, its agent cut to the wire's keys."""
    given = proposed.get("agent")
    if given is None:
        return proposed
    out: dict[str, Any] = dict(proposed)
    agent = wire_agent(given)
    if agent is None:
        del out["agent"]
    else:
        out["agent"] = agent
    return out


def _identity(identity: dict[str, Any], extra: dict[str, str]) -> dict[str, Any]:
    """The owner as a worker sees it: `{subject?, metadata, visibility?}`; `extra` (the
    turn's budget and spend, budgets.py) joins the metadata."""
    out: dict[str, Any] = {"metadata": {**(identity.get("metadata") or {}), **extra}}
    if identity.get("subject"):
        out["subject"] = identity["subject"]
    if identity.get("visibility"):
        out["visibility"] = identity["visibility"]
    return out


def _effect(state: SessionState, call: Call) -> dict[str, Any]:
    effect: dict[str, Any] = {
        "id": call.id,
        "kind": "llm_call" if call.kind == "llm" else "tool_call",
        "status": _STATUS[call.status],
        "attempt": call.attempt,
    }
    if call.kind == "connector":
        # A connector sync carries no fields of its own; its `id` is the connection.
        effect["id"] = call.name
        effect["kind"] = "connector_sync"
        return effect
    if call.handler == "subagent":
        # A subagent runs in a child session; its `id` is the tool call it answers.
        effect["kind"] = "subagent"
        effect["agent_id"] = call.name
        effect["session_id"] = next(
            (c for c, v in state.children.items() if v.get("call_id") == call.id),
            spawn_args(call).get("session"),  # a `wait` call names the child it collects
        )
    else:
        effect["handler"] = call.handler
    if call.name is not None:
        effect["name"] = call.name
    if call.arguments is not None:
        effect["arguments"] = call.arguments
    if call.anchor is not None:
        effect["anchor"] = call.anchor
    if call.deadline is not None:
        effect["deadline"] = iso(call.deadline)
    return effect


def decision_request(
    state: SessionState,
    decision_id: str,
    trigger: Mapping[str, Any],
    proposed: Answer,
    attempts: int,
    deadline: int | None,
) -> dict[str, Any]:
    """The DecisionRequest a worker receives (schema `decision_request`)."""
    messages = path_to(state.nodes, state.head_id)
    calls = [_effect(state, c) for c in state.calls.values()]
    return {
        "session_id": state.session_id,
        "decision_id": decision_id,
        "agent_id": state.agent_id,
        "identity": _identity(state.identity, budget_metadata(state)),
        "trigger": wire_trigger(state, trigger),
        "proposed": wire_proposed(proposed),
        "state": state.worker_state,
        "agent": wire_agent(state.agent),
        "calls": calls,
        "pending_calls": sum(
            1 for c in state.calls.values() if c.kind == "tool"
        ),  # tools, subagents
        "messages": messages,
        "message_tree": {
            "nodes": [
                {"message": n.message, "parent_id": n.parent_id} for n in state.nodes.values()
            ],
            "head_id": state.head_id,
        },
        "ancestry": list(state.ancestry),
        "attempts": attempts,
        "deadline": None if deadline is None else iso(deadline),
        "turn_id": state.turn.id if state.turn else None,
    }


def wire_trigger(state: SessionState, trigger: Mapping[str, Any]) -> Mapping[str, Any]:
    """A trigger as the worker gets it. A `client.messages` trigger recorded with `path_to`
    (a node id) holds only the new messages: the view is the path to that node, then them
    (recorded nodes never change, so the path is what it was when the trigger was)."""
    if "path_to" not in trigger:
        return trigger
    wire = {k: v for k, v in trigger.items() if k != "path_to"}
    wire["messages"] = path_to(state.nodes, trigger["path_to"]) + trigger["messages"]
    return wire


def control_request(state: SessionState) -> dict[str, Any]:
    """The request for the session's live decision."""
    d = state.decision
    assert d is not None
    return decision_request(state, d.id, d.trigger, d.proposed, d.attempt, d.deadline)


def execute_request(state: SessionState, call: Call) -> dict[str, Any]:
    """The `tool.execute` / `llm.execute` request of a worker call's current attempt.

    An `llm.execute` carries the neutral LlmRequest; the shell rewrites it into
    the vendor's body when the call has a `format`.
    """
    deadline = None if call.deadline is None else iso(call.deadline)
    if call.kind == "tool":
        tool = find_tool(state.agent, call.name or "", state.turn_tools)
        tool_input = validate_input(tool, call.arguments or "")
        trigger: dict[str, Any] = {
            "type": "tool.execute",
            "id": call.id,
            "name": call.name,
            "arguments": call.arguments or "",
            "input": tool_input,
            "attempt": call.attempt,
            "deadline": deadline,
        }
        problem = (
            f"tool {call.name!r} is not declared"
            if tool is None
            else tool_input.get("error")
            if tool_input["status"] != "valid"
            else None
        )
        proposed: Answer = (
            {}
            if problem is None
            else {"actions": [{"type": "tool.error", "id": call.id, "error": problem}]}
        )
    else:
        plan = build_llm_request(state, call)
        # A worker-run call streams only when asked to (seed 002: `stream` defaults to false).
        stream = call.params.get("stream", (state.agent or {}).get("stream", False)) is True
        trigger = {
            "type": "llm.execute",
            "id": call.id,
            "request": plan.request,
            "stream": stream,
            "attempt": call.attempt,
            "deadline": deadline,
        }
        if call.params.get("format"):
            trigger["format"] = call.params["format"]
        proposed = {}
    return decision_request(
        state, f"{call.id}/{call.attempt}", trigger, proposed, call.attempt, call.deadline
    )
