"""subs.toml -> a typed, frozen Project (SPEC §1): the order of the checks.

Every mistake is a ConfigError naming the file and the key's dotted path, raised
at load time so nothing starts on a half-valid file. Order of checks: TOML
syntax, literal secrets (the most urgent mistake), shape and types (pydantic,
strict: nothing is coerced), then the rules that span keys; the environment's
overrides last.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from collections.abc import Collection, Mapping
from pathlib import Path

from pydantic import ValidationError

from engine.config.build import build
from engine.config.checks import check
from engine.config.model import ConfigError, Project
from engine.config.schema import Root, redis_url
from engine.config.secrets import scan_secrets
from engine.config.wording import from_pydantic


def load_project(
    path: str | os.PathLike[str],
    env: Mapping[str, str] | None = None,
    *,
    tool_handlers: Collection[str] | None = None,
) -> Project:
    """Read, check and build subs.toml; every mistake is a ConfigError naming its key."""
    file = os.fspath(path)
    try:
        raw = Path(file).read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read: {e.strerror}", file=file, key="") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError("not UTF-8 text", file=file, key="") from None
    return parse_project(text, file, env, tool_handlers=tool_handlers)


def parse_project(
    text: str,
    file: str,
    env: Mapping[str, str] | None = None,
    *,
    tool_handlers: Collection[str] | None = None,
) -> Project:
    """The project `text` (read from `file`) declares. `tool_handlers` are the handlers a
    tool may name: those of the engine's table of call kinds (the default one's if None)."""
    env = os.environ if env is None else env
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"invalid TOML: {e}", file=file, key="") from None
    scan_secrets(data, (), file, data)
    try:
        root = Root.model_validate(data, context={"tool_handlers": tool_handlers})
    except ValidationError as e:
        raise from_pydantic(file, e) from None
    check(root, file)
    return _apply_env(build(root, os.path.abspath(file)), env)


def _apply_env(project: Project, env: Mapping[str, str]) -> Project:
    """Environment beats the file: SUBS_REDIS, SUBS_HOST, SUBS_PORT, SUBS_MAX_STREAMS_PER_KEY."""
    redis = env.get("SUBS_REDIS") or project.redis
    if env.get("SUBS_REDIS"):
        try:
            redis_url(env["SUBS_REDIS"])
        except ValueError as e:
            raise ConfigError(str(e), file="environment", key="SUBS_REDIS") from None
    host = env.get("SUBS_HOST") or project.serve.host
    port = project.serve.port
    if env.get("SUBS_PORT"):
        raw = env["SUBS_PORT"]
        if not re.fullmatch(r"[0-9]{1,5}", raw) or int(raw) > 65535:
            raise ConfigError(
                f"expected a port number 0-65535, got {raw!r}", file="environment", key="SUBS_PORT"
            )
        port = int(raw)
    streams = project.serve.max_streams_per_key
    if env.get("SUBS_MAX_STREAMS_PER_KEY"):
        raw = env["SUBS_MAX_STREAMS_PER_KEY"]
        if not re.fullmatch(r"[0-9]{1,9}", raw) or int(raw) < 1:
            raise ConfigError(
                f"expected a count of 1 or more, got {raw!r}",
                file="environment",
                key="SUBS_MAX_STREAMS_PER_KEY",
            )
        streams = int(raw)
    serve = dataclasses.replace(project.serve, host=host, port=port, max_streams_per_key=streams)
    return dataclasses.replace(project, redis=redis, serve=serve)
