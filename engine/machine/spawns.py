"""Subagent spawns, read: which tool names are the agent's subagents, the modes a spawn may
run in (SPEC §9, the wire's SpawnMode), a subagent call's recorded arguments.

Pure views of the agent config and the call, for the rules (calls.py turns a model's tool
call into a spawn, subagents.py runs it) and for the model's request (request.py).
"""

from __future__ import annotations

import json
from typing import Any

from .state import Call

MODES = ("blocking", "detached", "wait")


# The spawn modes a subagent's configured `mode` allows, its default first. `wait`
# collects a child started detached, so it goes wherever `detached` does.
ALLOWED_MODES: dict[str, tuple[str, ...]] = {
    "blocking": ("blocking",),
    "detached": ("detached", "wait"),
    "any": MODES,
}


def spawn_mode(configured: str | None, asked: Any) -> tuple[str, str | None]:
    """The mode a spawn runs in under its subagent's configured mode, and the problem
    with the mode it asked for (None: it may run)."""
    allowed = ALLOWED_MODES.get(configured or "blocking", ("blocking",))
    if asked is None:
        return allowed[0], None
    if asked not in MODES:
        return "blocking", f"mode {asked!r} is not one of {', '.join(MODES)}"
    if asked not in allowed:
        return asked, (
            f"a {asked!r} call is not allowed: the subagent's mode is "
            f"{configured or 'blocking'!r} (allowed: {', '.join(allowed)})"
        )
    return asked, None


def spawn_args(call: Call) -> dict[str, Any]:
    """A subagent call's recorded arguments: `message`, `session?`, `mode?`."""
    args = json.loads(call.arguments or "{}")
    return args if isinstance(args, dict) else {}


def subagent_entry(agent: dict[str, Any] | None, agent_id: str) -> dict[str, Any] | None:
    """The agent config's subagent entry a spawn names (by id, or by its offered name)."""
    named = subagent_named(agent, agent_id) or agent_id
    return next((sub for sub in (agent or {}).get("subagents") or () if sub["id"] == named), None)


def subagent_named(agent: dict[str, Any] | None, tool_name: str) -> str | None:
    """The child agent a tool name offers (`<id>`, or `agent__<id>` with `prefix`)."""
    for sub in (agent or {}).get("subagents") or ():
        offered = f"agent__{sub['id']}" if sub.get("prefix") else sub["id"]
        if offered == tool_name:
            child: str = sub["id"]
            return child
    return None
