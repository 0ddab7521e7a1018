"""The rules that span keys: what pydantic, checking each key alone, cannot see (a
reference to a block that is not declared, keys that exclude each other, duplicates)."""

from __future__ import annotations

import re
from typing import Any

from engine.config.budgets import problems as budget_problems
from engine.config.model import ConfigError
from engine.config.schema import ENV_NAME, Root, _Agent, _Mcp, _McpRef

_AGENT_ID = re.compile(r"[A-Za-z0-9_-]+")
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # what the model vendors accept

# Setting any of these makes the file, not the worker, the source of the model config.
_MODEL_KEYS = (
    "llm",
    "model",
    "system",
    "effort",
    "tools",
    "subagents",
    "max_subagent_depth",
    "retry",
    "mcp",
    "budget",
    "session_budget",
)


def check(root: Root, file: str) -> None:
    """The rules that span keys (pydantic has checked each key alone)."""
    for lid, block in root.llm.items():
        if block.type == "worker":
            for key in ("auth", "api_key_env", "base_url"):
                if key in block.model_fields_set:
                    raise ConfigError(
                        'not allowed with type = "worker": the worker makes the call',
                        file=file,
                        key=f"llm.{lid}.{key}",
                    )
        elif block.format is not None:
            raise ConfigError(
                'only allowed with type = "worker"', file=file, key=f"llm.{lid}.format"
            )
        elif block.auth == "none" and block.api_key_env is not None:
            raise ConfigError(
                'not allowed with auth = "none": no key is sent',
                file=file,
                key=f"llm.{lid}.api_key_env",
            )
        elif block.auth == "none" and block.base_url is None:
            raise ConfigError(
                f'required with auth = "none": the {block.type} API itself takes a key, '
                "so name the server that needs none",
                file=file,
                key=f"llm.{lid}.base_url",
            )
    for mid, conn in root.mcp.items():
        _check_mcp(file, mid, conn)
    for aid, agent in root.agent.items():
        _check_agent(root, file, aid, agent)
    for key, why in budget_problems(root.budgets, set(root.agent)):
        raise ConfigError(why, file=file, key=key)
    hook = root.hooks.alertmanager
    if hook is not None and (hook.agent not in root.agent or root.agent[hook.agent].slack is None):
        raise ConfigError(
            f"names {hook.agent!r}, which is no agent with a [agent.<id>.slack] block "
            "(its app posts the alerts' threads)",
            file=file,
            key="hooks.alertmanager.agent",
        )


_URL_ONLY = ("auth", "token_env", "header")
_COMMAND_ONLY = ("env", "env_from", "cwd")


def _check_mcp(file: str, mid: str, block: _Mcp) -> None:
    at = f"mcp.{mid}"
    if not _AGENT_ID.fullmatch(mid):
        raise ConfigError(
            "a connection id may use only letters, digits, '_' and '-'", file=file, key=at
        )
    if (block.url is None) == (block.command is None):
        raise ConfigError(
            "set exactly one of url (a streamable HTTP server) or command "
            "(a local server the engine starts over stdio)",
            file=file,
            key=at,
        )
    wrong = _COMMAND_ONLY if block.url is not None else _URL_ONLY
    for key in wrong:
        if key in block.model_fields_set:
            other = "command" if block.url is not None else "url"
            raise ConfigError(f"only allowed with {other}", file=file, key=f"{at}.{key}")
    if block.auth == "none" and (block.token_env or block.header):
        key = "token_env" if block.token_env else "header"
        raise ConfigError('not allowed with auth = "none"', file=file, key=f"{at}.{key}")
    if block.auth == "token" and block.token_env is None:
        raise ConfigError(
            'required with auth = "token": name the token\'s variable',
            file=file,
            key=f"{at}.token_env",
        )
    if block.header is not None and block.token_env is None:
        raise ConfigError(
            "needs token_env: the header carries the token", file=file, key=f"{at}.header"
        )
    for name in block.env:
        if not ENV_NAME.fullmatch(name):
            raise ConfigError(
                "must be an environment variable name", file=file, key=f"{at}.env.{name}"
            )


def mcp_refs(root: Root, file: str, at: str, agent: _Agent) -> list[dict[str, Any]]:
    """The agent's connections as wire McpServer entries, ids in the path form."""
    refs: list[dict[str, Any]] = []
    for i, ref in enumerate(agent.mcp):
        key = f"{at}.mcp.{i}"
        entry = _McpRef(id=ref) if isinstance(ref, str) else ref
        mid = entry.id.removeprefix("mcp.")
        if mid not in root.mcp:
            declared = ", ".join(f"mcp.{m}" for m in root.mcp) or "none"
            raise ConfigError(f"no [mcp.{mid}] block; declared: {declared}", file=file, key=key)
        if any(r["id"] == f"mcp.{mid}" for r in refs):
            raise ConfigError(f"mcp.{mid} is listed twice", file=file, key=key)
        out = entry.model_dump(exclude_none=True)
        out["id"] = f"mcp.{mid}"
        refs.append(out)
    return refs


def _check_agent(root: Root, file: str, aid: str, agent: _Agent) -> None:
    at = f"agent.{aid}"
    if not _AGENT_ID.fullmatch(aid):
        raise ConfigError(
            "an agent id may use only letters, digits, '_' and '-'", file=file, key=at
        )
    if agent.llm is not None and agent.llm not in root.llm:
        declared = ", ".join(root.llm) or "none"
        raise ConfigError(
            f"no [llm.{agent.llm}] block; declared: {declared}", file=file, key=f"{at}.llm"
        )
    model_keys = [k for k in _MODEL_KEYS if k in agent.model_fields_set]
    if model_keys:
        missing = [k for k in ("llm", "model") if getattr(agent, k) is None]
        if missing:
            raise ConfigError(
                f"missing {' and '.join(missing)}: an agent that sets {', '.join(model_keys)} "
                "needs both llm and model (or leave all model config to its worker)",
                file=file,
                key=f"{at}.{missing[0]}",
            )
    elif agent.worker is None:
        raise ConfigError(
            "missing llm and model, or worker: set llm and model for the engine to run it, "
            "or worker to have a worker return its config",
            file=file,
            key=at,
        )
    children: list[str] = []
    for i, entry in enumerate(agent.subagents):
        key = f"{at}.subagents.{i}"
        ref = entry.id
        child = ref.removeprefix("agent.")
        if child == ref or not child:
            raise ConfigError(f'must be "agent.<id>", got {ref!r}', file=file, key=key)
        if child == aid:
            raise ConfigError("an agent cannot be its own subagent", file=file, key=key)
        if child not in root.agent:
            declared = ", ".join(root.agent)
            raise ConfigError(f"no [agent.{child}]; declared: {declared}", file=file, key=key)
        if child in children:
            raise ConfigError(f"agent.{child} is listed twice", file=file, key=key)
        children.append(child)
    names: set[str] = set()
    for i, tool in enumerate(agent.tools):
        key = f"{at}.tools.{i}"
        if not _TOOL_NAME.fullmatch(tool.name):
            raise ConfigError(
                "must be 1-64 letters, digits, '_' or '-'", file=file, key=f"{key}.name"
            )
        if tool.name in names:
            raise ConfigError(f"duplicate tool name {tool.name!r}", file=file, key=f"{key}.name")
        if tool.name in children:
            raise ConfigError(
                f"clashes with the tool offered for agent.{tool.name}", file=file, key=f"{key}.name"
            )
        names.add(tool.name)
        if tool.handler in (None, "worker") and agent.worker is None:
            raise ConfigError(
                'a worker tool needs the agent to have a worker; set handler = "client" '
                "or set worker",
                file=file,
                key=f"{key}.handler" if tool.handler else key,
            )
    mcp_refs(root, file, at, agent)
    if agent.slack is not None and agent.slack.name is None and len(aid) > 35:
        raise ConfigError(
            "required: the default, the agent id, is longer than 35 characters",
            file=file,
            key=f"{at}.slack.name",
        )
