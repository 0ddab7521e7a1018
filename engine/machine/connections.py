"""The agent's MCP connections, read: what it names, and the tools each offers the model.

Pure views of the config and of the session's last syncs (`SessionState.connectors`),
for the rules that start calls and turns and for the model's request; the syncs
themselves are connectors.py's.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Any

from .shapes import OpenInterrupt
from .state import SessionState


def entries(agent: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The agent's connections (wire McpServer), ids in the path form `mcp.<id>`."""
    out = []
    for entry in (agent or {}).get("mcp") or ():
        entry = {"id": entry} if isinstance(entry, str) else entry
        path = entry["id"] if entry["id"].startswith("mcp.") else f"mcp.{entry['id']}"
        out.append({**entry, "id": path})
    return out


def _kept(tool: dict[str, Any], spec: dict[str, Any]) -> bool:
    """Upstream's filter: capability predicates, then include, then exclude; each only
    removes. A predicate reads the tool's MCP annotation: a tool without it fails."""
    notes = tool.get("annotations") or {}
    if spec.get("read_only") and notes.get("readOnlyHint") is not True:
        return False
    if spec.get("non_destructive") and notes.get("destructiveHint") is not False:
        return False
    if spec.get("idempotent") and notes.get("idempotentHint") is not True:
        return False
    name = tool["name"]
    include = spec.get("include")
    if include is not None and not any(fnmatch.fnmatchcase(name, g) for g in include):
        return False
    return not any(fnmatch.fnmatchcase(name, g) for g in spec.get("exclude") or ())


def prefix_of(path: str) -> str:
    """`mcp.my-server` -> `my_server`: every non-alphanumeric as `_` (upstream's rule)."""
    return re.sub(r"[^A-Za-z0-9]", "_", path.removeprefix("mcp."))


def tools_of(state: SessionState, taken: set[str]) -> dict[str, dict[str, Any]]:
    """The connector tools the model is offered, by offered name, as tool contracts
    (`handler: server`, the connection and the server's own name for the call).

    A name the agent's own tools or subagents use stays theirs; a name two connections
    both offer is offered by neither.
    """
    found: dict[str, dict[str, Any]] = {}
    clashed: set[str] = set()
    for entry in entries(state.agent):
        synced = state.connectors.get(entry["id"])
        if not synced:
            continue
        prefix = synced.get("prefix")
        for tool in synced.get("tools") or ():
            if not _kept(tool, entry.get("tools") or {}):
                continue
            name = f"{prefix}__{tool['name']}" if prefix else tool["name"]
            if name in taken:
                continue
            if name in found:
                clashed.add(name)
                continue
            contract: dict[str, Any] = {
                "name": name,
                "description": tool.get("description") or "",
                "input": tool.get("input") or {"type": "object"},
                "handler": "server",
                "connector": entry["id"],
                "tool": tool["name"],
            }
            found[name] = contract
    for name in clashed:
        del found[name]
    return found


def own_names(agent: dict[str, Any] | None) -> set[str]:
    """Names the agent's declared tools and subagents hold (they keep them on a clash)."""
    agent = agent or {}
    names = {t["name"] for t in agent.get("tools") or ()}
    for sub in agent.get("subagents") or ():
        names.add(f"agent__{sub['id']}" if sub.get("prefix") else sub["id"])
    return names


def call_params(state: SessionState, name: str) -> dict[str, Any] | None:
    """The contract of the connector tool the model calls by `name`, or None."""
    return tools_of(state, own_names(state.agent)).get(name)


def connector_of(interrupt: OpenInterrupt) -> str | None:
    """The connection an interrupt waits on a person for (`sync_failed` raised it)."""
    connector = ((interrupt.get("payload") or {}).get("metadata") or {}).get("connector")
    return connector if isinstance(connector, str) else None


def connector_interrupt(s: SessionState) -> bool:
    """Whether a connection's question (sign in) holds the turn."""
    return any(connector_of(i) is not None for i in s.interrupts.values())
