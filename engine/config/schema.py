"""The file's schema: the pydantic tables subs.toml may hold, each key checked alone.

Strict (nothing is coerced) and closed (an unknown key is an error). The rules that span
keys are checks.py's; turning these tables into the engine's model is build.py's. The
tables keep their leading underscore: pydantic names a union's branches by class name,
and wording.py reads those names to tell a branch from a key.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
)

from engine.config.budgets import BudgetEntry
from engine.config.model import COMMAND_VAR, DEFAULT_FSYNC, Fsync, duration_ms, size_bytes
from engine.machine import default_kinds
from engine.redact import redact_url

ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
_SLASH_COMMAND = re.compile(r"/[a-z0-9_-]+")
_CHANNEL_ID = re.compile(r"[CG][A-Z0-9]{2,}")  # a public (C) or private (G, legacy) channel
# A browser's Origin: scheme://host[:port], nothing after; hosts as names, IPv4 or [IPv6].
_ORIGIN = re.compile(r"([a-z][a-z0-9+.-]*)://([a-z0-9.-]+|\[[0-9a-f:.]+\])(?::([0-9]{1,5}))?")
_DEFAULT_PORTS = {"http": "80", "https": "443"}
_UINT32_MAX = 2**32 - 1


def _env_name(value: str) -> str:
    if not ENV_NAME.fullmatch(value):
        raise ValueError(
            "must be an environment variable name (capitals, digits and '_', "
            "like ONCALL_SIGNING_SECRET)"
        )
    return value


def _http_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"must be an http(s) URL, got {redact_url(value)!r}")
    return value


def _retention(value: str) -> str:
    if value != "forever":
        duration_ms(value)
    return value


def _approve_timeout(value: str) -> str:
    if duration_ms(value) <= 0:
        raise ValueError(f'must be a positive duration like "1h", got {value!r}')
    return value


def _archive(value: str) -> str:
    if value != "none" and not (value.startswith("dir:") and value[4:].strip()):
        raise ValueError(
            f'must be "dir:<folder>" (like "dir:.subs/archive") or "none", got {value!r}'
        )
    return value


def _max_memory(value: str) -> str:
    if value != "auto":
        size_bytes(value)
    return value


def redis_url(value: str) -> str:
    """A Redis URL as given (the file's `redis`, or SUBS_REDIS): redis, rediss or unix."""
    if urlsplit(value).scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"must be a redis://, rediss:// or unix:// URL, got {redact_url(value)!r}")
    return value


def _origin(value: str) -> str:
    """Lower-cased, default port dropped: the form a browser sends in `Origin`."""
    match = _ORIGIN.fullmatch(value.lower())
    if match is None or int(match.group(3) or 0) > 65535:
        raise ValueError(
            'must be an origin, scheme://host[:port] with no path (like "https://app.example" '
            f'or "http://localhost:3000"), got {value!r}'
        )
    scheme, host, port = match.groups()
    if port is None or _DEFAULT_PORTS.get(scheme) == port:
        return f"{scheme}://{host}"
    return f"{scheme}://{host}:{port}"


def _public_url(value: str) -> str:
    """An http(s) URL with no query or fragment, its trailing slash dropped."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        raise ValueError(
            f'must be an http(s) URL with no query, like "https://subs.example.com", got {value!r}'
        )
    return value.rstrip("/")


def _json_schema(value: dict[str, Any]) -> dict[str, Any]:
    try:
        Draft202012Validator.check_schema(value)
    except SchemaError as e:
        raise ValueError(f"not a valid JSON Schema: {e.message}") from None
    return value


def _tool_handler(value: str, info: ValidationInfo) -> str:
    """Who runs a declared tool: one of the tool handlers of the engine's table of call
    kinds (`parse_project(tool_handlers=)`; the default table's unless given)."""
    given = (info.context or {}).get("tool_handlers")
    known = sorted(default_kinds().tool_handlers() if given is None else given)
    if value not in known:
        raise ValueError(f"must be one of {', '.join(map(repr, known))}, got {value!r}")
    return value


def _regex(value: str) -> str:
    try:
        re.compile(value)
    except re.error as e:
        raise ValueError(f"not a valid regular expression: {e}") from None
    return value


def _channel(value: str) -> str:
    if not (_CHANNEL_ID.fullmatch(value) or COMMAND_VAR.fullmatch(value)):
        raise ValueError(
            'must be a channel id like "C0123ABCD" (or "${VAR}" naming the variable that '
            f"holds it), got {value!r}"
        )
    return value


def _slash_command(value: str) -> str:
    if not _SLASH_COMMAND.fullmatch(value):
        raise ValueError(
            f"must start with '/' and use only lowercase letters, digits, '-' and '_', "
            f"got {value!r}"
        )
    return value


NonEmpty = Annotated[str, Field(min_length=1)]
EnvName = Annotated[str, AfterValidator(_env_name)]
HttpUrl = Annotated[str, AfterValidator(_http_url)]
RedisUrl = Annotated[str, AfterValidator(redis_url)]
Origin = Annotated[str, AfterValidator(_origin)]
PublicUrl = Annotated[str, AfterValidator(_public_url)]
JsonSchema = Annotated[dict[str, Any], AfterValidator(_json_schema)]
UInt32 = Annotated[int, Field(ge=0, le=_UINT32_MAX)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class _Serve(_Model):
    host: NonEmpty = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 8080
    cors_origins: list[Origin] = Field(default_factory=list)
    max_streams_per_key: Annotated[int, Field(ge=1)] = 100
    max_streams: Annotated[int, Field(ge=1)] = 10_000
    public_url: PublicUrl | None = None
    header_timeout_secs: Annotated[float, Field(gt=0, le=3600)] = 10.0
    state_cache_mb: Annotated[int, Field(ge=1)] = 256
    state_cache_sessions: Annotated[int, Field(ge=1)] = 10_000
    client_token_issuer: NonEmpty = "subs"
    client_token_audience: NonEmpty = "subs-client"


class _Store(_Model):
    fsync: Fsync = DEFAULT_FSYNC
    wait_replicas: UInt32 = 0
    wait_timeout_ms: Annotated[int, Field(ge=1, le=_UINT32_MAX)] = 1000
    partitions: Annotated[int, Field(ge=1, le=16384)] = 16  # at most one a cluster slot
    retention: Annotated[str, AfterValidator(_retention)] = "30d"
    archive: Annotated[str, AfterValidator(_archive)] = "dir:.subs/archive"
    max_memory: Annotated[str, AfterValidator(_max_memory)] = "auto"


USD = Annotated[float, Field(ge=0)]


class _Price(_Model):
    """USD per million tokens of each kind; a cache price left out is the input price."""

    input: USD
    output: USD
    cache_read: USD | None = None
    cache_write: USD | None = None


class _Budget(_Model):
    max_cost_usd: USD | None = None
    max_model_calls: UInt32 | None = None
    max_tool_calls: UInt32 | None = None
    max_tokens: UInt32 | None = None
    on_exceeded: Literal["fail", "ask"] = "fail"


class _SessionBudget(_Model):
    max_cost_usd: USD
    on_exceeded: Literal["fail", "ask"] = "fail"


class _Llm(_Model):
    type: Literal["anthropic", "openai", "openrouter", "worker"]
    auth: Literal["key", "none"] = "key"  # "none": a server of your own that takes no key
    api_key_env: EnvName | None = None
    base_url: HttpUrl | None = None
    format: Literal["openai", "anthropic"] | None = None
    cache: bool = True  # prompt caching (docs/prompt-caching.md)
    prices: dict[NonEmpty, _Price] = Field(default_factory=dict)


class _Tool(_Model):
    name: str
    description: str | None = None
    input: JsonSchema | None = None
    output: JsonSchema | None = None
    handler: Annotated[str, AfterValidator(_tool_handler)] | None = None


class _RetryOverride(_Model):
    queue_timeout_secs: UInt32 | None = None
    run_timeout_secs: UInt32 | None = None
    total_timeout_secs: UInt32 | None = None
    max_attempts: UInt32 | None = None
    backoff_base_secs: UInt32 | None = None
    backoff_max_secs: UInt32 | None = None


class _Subagent(_Model):
    """`{ id = "agent.<id>", mode = ... }`: a subagent whose calls' mode is set (SPEC §9)."""

    id: str
    mode: Literal["blocking", "detached", "any"] | None = None


def _subagent_ref(value: Any) -> Any:
    """`"agent.<id>"` is short for `{ id = "agent.<id>" }`."""
    return {"id": value} if isinstance(value, str) else value


class _Retry(_Model):
    default: _RetryOverride | None = None
    llm: _RetryOverride | None = None
    tool: _RetryOverride | None = None
    subagent: _RetryOverride | None = None
    connector: _RetryOverride | None = None  # fetching a connection's tool list


def _slack_ids(prefixes: str, what: str) -> Any:
    def check(value: str) -> str:
        if not re.fullmatch(f"[{prefixes}][A-Z0-9]+", value):
            raise ValueError(f"{value!r} is not a Slack {what} id")
        return value

    return AfterValidator(check)


_UserOrGroup = Annotated[str, _slack_ids("UWS", "user (U…/W…) or user group (S…)")]


class _SlackAllow(_Model):
    teams: list[Annotated[str, _slack_ids("TE", "team (T…) or enterprise (E…)")]] = Field(
        default_factory=list
    )
    channels: list[Annotated[str, _slack_ids("CGD", "channel (C…/G…/D…)")]] = Field(
        default_factory=list
    )
    users: list[Annotated[str, _slack_ids("UW", "user (U…/W…)")]] = Field(default_factory=list)


class _Watch(_Model):
    channel: Annotated[str, AfterValidator(_channel)]
    from_: list[NonEmpty] = Field(default_factory=list, alias="from")
    match: Annotated[str, AfterValidator(_regex)] | None = None


class _Slack(_Model):
    name: Annotated[str, Field(min_length=1, max_length=35)] | None = None
    description: Annotated[str, Field(max_length=140)] = ""
    answers: Literal["both", "dm", "channels"] = "both"
    commands: list[Annotated[str, AfterValidator(_slash_command)]] = Field(default_factory=list)
    stream: Literal["edit", "native"] = "edit"
    max_concurrent_turns: Annotated[int, Field(ge=1, le=1000)] = 4
    files: bool = True
    file_text_limit: Annotated[int, Field(ge=1, le=16 * 1024 * 1024)] = 256 * 1024
    allow: _SlackAllow | None = None
    external: bool = False
    follow: bool = True
    show_cost: bool = False
    watch: list[_Watch] = Field(default_factory=list)


class _Mcp(_Model):
    url: HttpUrl | None = None
    command: Annotated[list[NonEmpty], Field(min_length=1)] | None = None
    auth: Literal["token", "none"] | None = None
    token_env: EnvName | None = None
    header: NonEmpty | None = None
    prefix_tools: bool = True
    env: dict[str, str] = Field(default_factory=dict)
    env_from: list[EnvName] = Field(default_factory=list)
    cwd: NonEmpty | None = None
    approve_timeout: Annotated[str, AfterValidator(_approve_timeout)] = "1h"


class _McpTools(_Model):
    include: list[NonEmpty] | None = None
    exclude: list[NonEmpty] | None = None
    read_only: bool | None = None
    non_destructive: bool | None = None
    idempotent: bool | None = None


class _McpRef(_Model):
    id: NonEmpty
    tools: _McpTools | None = None
    auth_failure: Literal["interrupt", "degrade"] | None = None
    approve: Literal["never", "destructive", "always"] | None = None


class _Agent(_Model):
    llm: NonEmpty | None = None
    model: NonEmpty | None = None
    system: str | None = None
    effort: Literal["xhigh", "high", "medium", "low", "minimal", "none"] | None = None
    description: str | None = None
    tools: list[_Tool] = Field(default_factory=list)
    subagents: list[Annotated[_Subagent, BeforeValidator(_subagent_ref)]] = Field(
        default_factory=list
    )
    max_subagent_depth: UInt32 | None = None  # None: the file's top-level value
    worker: HttpUrl | None = None
    signing_secret_env: EnvName | None = None
    retry: _Retry | None = None
    slack: _Slack | None = None
    mcp: list[NonEmpty | _McpRef] = Field(default_factory=list)
    approvers: list[_UserOrGroup] | None = None
    budget: _Budget | None = None
    session_budget: _SessionBudget | None = None


class _Telemetry(_Model):
    endpoint: HttpUrl | None = None
    service_name: NonEmpty = "subs"
    capture_content: bool = False


class _AlertmanagerHook(_Model):
    agent: NonEmpty
    channel: Annotated[str, _slack_ids("CG", "channel (C…/G…)")]


class _Hooks(_Model):
    alertmanager: _AlertmanagerHook | None = None


class Root(_Model):
    """The whole file: what subs.toml may hold."""

    name: NonEmpty | None = None
    redis: RedisUrl | None = None
    max_subagent_depth: UInt32 = 5  # every agent's default (SPEC §9)
    serve: _Serve = Field(default_factory=_Serve)
    store: _Store = Field(default_factory=_Store)
    llm: dict[str, _Llm] = Field(default_factory=dict)
    agent: dict[str, _Agent] = Field(default_factory=dict)
    mcp: dict[str, _Mcp] = Field(default_factory=dict)
    telemetry: _Telemetry = Field(default_factory=_Telemetry)
    hooks: _Hooks = Field(default_factory=_Hooks)
    budgets: list[BudgetEntry] = Field(default_factory=list)  # `[[budgets]]` (budgets.py)
