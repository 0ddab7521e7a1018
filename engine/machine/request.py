"""Project a model call onto the neutral LlmRequest it sends (SPEC §5 `llm.call`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .state import Call, SessionState
from .tree import path_to

_DRAFT_KEYS = ("id", "role", "content", "name", "tool_call_id", "tool_calls", "reasoning")


@dataclass(frozen=True)
class LlmCallPlan:
    """What the shell needs to run one model call."""

    llm: str | None  # the [llm.<id>] block; None when the config names none
    request: dict[str, Any]  # neutral LlmRequest
    stream: bool


def offered_tools(agent: dict[str, Any]) -> list[dict[str, Any]]:
    """The agent's tools as the model sees them (LlmTool)."""
    tools = []
    for tool in agent.get("tools") or ():
        offered = {"name": tool["name"], "description": tool.get("description") or ""}
        for key in ("input", "output", "defer"):
            if tool.get(key) is not None:
                offered[key] = tool[key]
        tools.append(offered)
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
    tools = params["tools"] if params.get("tools") is not None else offered_tools(agent)
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
