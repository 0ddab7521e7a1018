"""Secrets: literal ones refused in the file (the most urgent mistake, checked before the
schema), and the values a project's variables and URLs hold, for masking.

project_secrets is here, not in engine/redact.py, which stays below the config (it masks
what the config's own errors print).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from engine.config.model import LLM_DEFAULTS, ConfigError, Project, slack_env_suffix
from engine.config.wording import dotted
from engine.redact import url_secrets

_SECRET_KEY = re.compile(r"(?:.*_)?(?:(?:api|secret|private)_?key|token|secret|password)")
# Values that are secrets whatever key holds them.
_SECRET_PREFIXES = ("xoxb-", "xoxp-", "xoxa-", "xoxe-", "xapp-", "sk-ant-", "sk-or-v1-")
# An *_env key should hold a name; these mean the secret itself was pasted in.
_ENV_SECRET_PREFIXES = ("sk-", "xox", "xapp-")
_LITERAL_IN_ENV = (
    "looks like a literal secret; put the secret in the environment and name the variable here"
)


def scan_secrets(node: Any, path: tuple[str | int, ...], file: str, data: dict[str, Any]) -> None:
    """Refuse literal secrets: by key name, by value prefix, and in *_env values.

    Inside a tool's input/output JSON Schema, keys are property names, not
    config, so only values are checked there.
    """
    in_schema = (
        len(path) >= 5
        and path[0] == "agent"
        and path[2] == "tools"
        and (path[4] in ("input", "output"))
    )
    if isinstance(node, dict):
        for key, value in node.items():
            child = (*path, key)
            if not in_schema and _SECRET_KEY.fullmatch(key.lower()):
                raise ConfigError(
                    f"literal secrets are not allowed in subs.toml; {_secret_hint(child, data)}",
                    file=file,
                    key=dotted(child),
                )
            if (
                not in_schema
                and key.endswith("_env")
                and isinstance(value, str)
                and value.startswith(_ENV_SECRET_PREFIXES + _SECRET_PREFIXES)
            ):
                raise ConfigError(_LITERAL_IN_ENV, file=file, key=dotted(child))
            scan_secrets(value, child, file, data)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            scan_secrets(value, (*path, i), file, data)
    elif isinstance(node, str) and node.startswith(_SECRET_PREFIXES):
        raise ConfigError(
            "looks like a literal secret; put the secret in the environment, not in subs.toml",
            file=file,
            key=dotted(path),
        )


def _secret_hint(path: tuple[str | int, ...], data: dict[str, Any]) -> str:
    """Which environment variable should hold the secret at `path`."""
    key = str(path[-1]).lower()
    if path[0] == "llm" and len(path) == 3:
        kind = data["llm"][path[1]].get("type")
        known = isinstance(kind, str) and kind in LLM_DEFAULTS
        var = LLM_DEFAULTS[kind][0] if known else "YOUR_KEY_VAR"
        return f'put the key in the environment and name it with api_key_env = "{var}"'
    if path[0] == "agent" and len(path) >= 3:
        suffix = slack_env_suffix(str(path[1]))
        if len(path) == 4 and path[2] == "slack":
            kind = (
                "APP_TOKEN"
                if "app" in key
                else ("SIGNING_SECRET" if "secret" in key else "BOT_TOKEN")
            )
            return f"put it in the environment as SLACK_{kind}_{suffix}"
        if len(path) == 3 and "key" not in key:
            return (
                "put it in the environment and name it with "
                f'signing_secret_env = "{suffix}_SIGNING_SECRET"'
            )
        if len(path) == 3:
            return "API keys belong in the environment, named by an [llm.*] block's api_key_env"
    return "put it in the environment"


def project_secrets(project: Project, env: Mapping[str, str], *urls: str | None) -> list[str]:
    """The secrets a project names (vendor keys, signing secrets, MCP tokens and what
    `env_from` hands a server) and the credentials inside its URLs and `urls` (the Redis
    URL given on the command line). Here, not in engine/redact.py, which stays below the
    config (it masks what the config's own errors print)."""
    values = [env.get(b.api_key_env, "") for b in project.llm.values() if b.api_key_env]
    for agent in project.agents.values():
        if agent.signing_secret_env:
            values.append(env.get(agent.signing_secret_env, ""))
    for conn in project.mcp.values():  # a server's token, and what it is handed from ours
        handed = (conn.token_env, *conn.env_from, *conn.command_vars())  # `${VAR}`s too
        values += [env.get(var, "") for var in handed if var]
    for url in (project.redis, *urls, *(a.worker for a in project.agents.values())):
        if url:
            values += url_secrets(url)
    return values
