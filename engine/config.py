"""subs.toml -> a typed, frozen Project (SPEC §1).

Every mistake is a ConfigError naming the file and the key's dotted path, raised
at load time so nothing starts on a half-valid file. Order of checks: TOML
syntax, literal secrets (the most urgent mistake), shape and types (pydantic,
strict: nothing is coerced), then the rules that span keys.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import os
import re
import shutil
import tomllib
import types
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin
from urllib.parse import quote, urlsplit

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
)

import engine.budget_config as budget_config
from engine.errors import SubsError
from engine.machine import default_kinds
from engine.machine.policies import BudgetPolicy
from engine.redact import redact_url, url_secrets

LLM_DEFAULTS: dict[str, tuple[str, str]] = {
    "anthropic": ("ANTHROPIC_API_KEY", "https://api.anthropic.com"),
    "openai": ("OPENAI_API_KEY", "https://api.openai.com/v1"),
    "openrouter": ("OPENROUTER_API_KEY", "https://openrouter.ai/api/v1"),
}

_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
_AGENT_ID = re.compile(r"[A-Za-z0-9_-]+")
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # what the model vendors accept
_SLASH_COMMAND = re.compile(r"/[a-z0-9_-]+")
_CHANNEL_ID = re.compile(r"[CG][A-Z0-9]{2,}")  # a public (C) or private (G, legacy) channel
# A browser's Origin: scheme://host[:port], nothing after; hosts as names, IPv4 or [IPv6].
_ORIGIN = re.compile(r"([a-z][a-z0-9+.-]*)://([a-z0-9.-]+|\[[0-9a-f:.]+\])(?::([0-9]{1,5}))?")
_DEFAULT_PORTS = {"http": "80", "https": "443"}
_SECRET_KEY = re.compile(r"(?:.*_)?(?:(?:api|secret|private)_?key|token|secret|password)")
# Values that are secrets whatever key holds them.
_SECRET_PREFIXES = ("xoxb-", "xoxp-", "xoxa-", "xoxe-", "xapp-", "sk-ant-", "sk-or-v1-")
# An *_env key should hold a name; these mean the secret itself was pasted in.
_ENV_SECRET_PREFIXES = ("sk-", "xox", "xapp-")
_LITERAL_IN_ENV = (
    "looks like a literal secret; put the secret in the environment and name the variable here"
)
_UINT32_MAX = 2**32 - 1
_COMMAND_VAR = re.compile(r"\$\{([A-Z_][A-Z0-9_]*)\}")  # `${VAR}` in an MCP command line
# A variable or a command-line flag named like a credential (`OPS_API_KEY`, `--token=…`).
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASS|PWD|AUTH|CRED", re.IGNORECASE)
_SECRET_FLAG = re.compile(
    r"(--?[A-Za-z0-9_-]*(?:key|token|secret|pass|pwd|auth|cred)[A-Za-z0-9_-]*)(=.+)?$",
    re.IGNORECASE,
)


class ConfigError(SubsError):
    """A mistake in subs.toml. str() is '<file>: <key.path>: <message>'; `message` is
    the last part alone.

    `key` is "" for file-level errors. For a bad environment override
    (SUBS_PORT, SUBS_REDIS) `file` is "environment" and `key` the variable.
    """

    code = "invalid_config"
    exit_status = 2

    def __init__(self, message: str, *, file: str, key: str = "") -> None:
        where = f"{file}: {key}" if key else file
        super().__init__(f"{where}: {message}", param=key or None)
        self.file = file
        self.key = key
        self.message = message


# ---------------------------------------------------------------- public types


@dataclass(frozen=True)
class ServeConfig:
    """`[serve]`: where the API listens and what it allows browsers and streams."""

    host: str = "127.0.0.1"
    port: int = 8080
    cors_origins: tuple[str, ...] = ()  # browser origins the API answers; none: no CORS
    max_streams_per_key: int = 100  # event streams one API key (or address) may hold open
    max_streams: int = 10_000  # event streams the whole API may hold open
    public_url: str | None = None  # where people reach this API; links to the console use it
    header_timeout_secs: float = 10.0  # a request's headers must arrive within this (slow-loris)
    state_cache_mb: int = 256  # the engine's cache of session states, at most this big
    state_cache_sessions: int = 10_000  # and at most this many sessions
    client_token_issuer: str = "subs"  # the `iss` client tokens carry and must carry
    client_token_audience: str = "subs-client"  # and their `aud`

    def console_url(self, session_id: str) -> str:
        """The session's console page: at `public_url`, else where serve listens."""
        base = self.public_url or f"http://{_url_host(self.host)}:{self.port}"
        return f"{base}/console/sessions/{quote(session_id, safe='')}"


def _url_host(host: str) -> str:
    """A bind address as a URL's host: a wildcard becomes loopback, IPv6 gets brackets."""
    if host in ("0.0.0.0", "::", ""):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


Fsync = Literal["always", "everysec"]
DEFAULT_FSYNC: Fsync = "always"
DEFAULT_RETENTION_MS = 30 * 86_400_000
DEFAULT_ARCHIVE = ".subs/archive"

_DURATION = re.compile(r"(\d+)(ms|s|m|h|d)")
_DURATION_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_SIZE = re.compile(r"(\d+)(b|kb|mb|gb)")
_SIZE_BYTES = {"b": 1, "kb": 1024, "mb": 1024**2, "gb": 1024**3}


def duration_ms(text: str) -> int:
    """`"30d"`, `"12h"`, `"90m"`, `"45s"`, `"500ms"` as milliseconds."""
    match = _DURATION.fullmatch(text.strip().lower())
    if match is None or int(match.group(1)) == 0:
        raise ValueError(
            f'must be a duration like "30d", "12h", "90m" or "45s" (more than 0), or "forever", '
            f"got {text!r}"
        )
    return int(match.group(1)) * _DURATION_MS[match.group(2)]


def size_bytes(text: str) -> int:
    """`"512mb"`, `"2gb"` as bytes."""
    match = _SIZE.fullmatch(text.strip().lower())
    if match is None or int(match.group(1)) == 0:
        raise ValueError(f'must be a size like "512mb" or "2gb", or "auto", got {text!r}')
    return int(match.group(1)) * _SIZE_BYTES[match.group(2)]


@dataclass(frozen=True)
class StoreConfig:
    """How durable a commit is before the engine acts on it (README "Durability").

    `fsync` is the embedded server's `appendfsync` (and the level an external
    server is checked against); `wait_replicas` > 0 makes each commit wait for
    that many replicas to acknowledge it, for at most `wait_timeout_ms`. `partitions`
    is how many partitions a new store gets (the first engine on a Redis fixes it;
    README "Redis Cluster" says how to choose it).
    """

    fsync: Fsync = DEFAULT_FSYNC
    wait_replicas: int = 0
    wait_timeout_ms: int = 1000
    partitions: int = 16
    retention_ms: int | None = DEFAULT_RETENTION_MS  # None: "forever", nothing is swept
    archive_dir: str | None = DEFAULT_ARCHIVE  # None: "none", swept sessions are not kept
    max_memory: str = "auto"  # the embedded server's maxmemory ("auto": a share of the box)

    def max_memory_bytes(self) -> int:
        """`max_memory` in bytes; "auto" is a quarter of the machine's memory."""
        if self.max_memory != "auto":
            return size_bytes(self.max_memory)
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4


@dataclass(frozen=True)
class LlmBlock:
    """`[llm.<id>]`: one model vendor (or a worker) and how to reach it."""

    id: str
    type: str  # anthropic | openai | openrouter | worker
    api_key_env: str | None  # None for worker, and for a server that takes no key (auth = "none")
    base_url: str | None  # None for worker
    format: str | None  # worker only: openai | anthropic | None (neutral)
    cache: bool = True  # ask for prompt caching where the vendor needs asking (Anthropic)
    # Model -> {input, output, cache_read, cache_write}: USD per million tokens, decimal
    # strings, for models the built-in table (engine/effects/llm/prices.py) lacks.
    prices: Mapping[str, Mapping[str, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class SlackBlock:
    """`[agent.<id>.slack]`: how the agent appears and answers in Slack."""

    name: str
    description: str
    answers: str  # both | dm | channels
    commands: tuple[str, ...]
    stream: str  # edit | native
    max_concurrent_turns: int = 4  # this app's turns running at once, across processes
    files: bool = True  # read the files on messages (files:read), upload the agent's images
    file_text_limit: int = 256 * 1024  # bytes of a text file the model reads, then cut
    # Who may start turns (empty: anyone): Slack team, channel and user ids.
    allow_teams: tuple[str, ...] = ()
    allow_channels: tuple[str, ...] = ()
    allow_users: tuple[str, ...] = ()
    external: bool = False  # people of other organisations (Slack Connect) may use it
    follow: bool = True  # a person's reply in a thread the app answered starts a turn
    watch: tuple[WatchEntry, ...] = ()  # alert channels: new posts triaged without a mention


@dataclass(frozen=True)
class WatchEntry:
    """One `[[agent.<id>.slack.watch]]`: a channel whose new top-level posts (by one of
    `posters`, any when empty, and matching `match`, any when None) each start a turn."""

    channel: str  # a channel id, or `${VAR}` naming the variable that holds it
    posters: tuple[str, ...]  # an app's name, bot id or app id, or a user id
    match: str | None  # a regular expression searched in the message as the model reads it

    @property
    def channel_var(self) -> str | None:
        """The variable `channel` names (`${VAR}`), or None for a literal id."""
        found = _COMMAND_VAR.fullmatch(self.channel)
        return found.group(1) if found else None

    def channel_id(self, env: Mapping[str, str]) -> str | None:
        """The channel id, read from the environment when named by a variable (None: unset)."""
        var = self.channel_var
        return self.channel if var is None else (env.get(var) or None)


@dataclass(frozen=True)
class McpBlock:
    """One `[mcp.<id>]` connection: a streamable HTTP server (`url`) or a local one the
    engine starts over stdio (`command`). Secrets stay in the environment: `token_env`
    names the bearer token's variable, `env_from` the variables passed to a child."""

    id: str
    url: str | None
    command: tuple[str, ...] | None
    token_env: str | None  # url only: sent as `<header>: Bearer <value>` (raw if header set)
    header: str | None  # url only: the header the token goes in; None: Authorization
    prefix_tools: bool  # the model sees `<id>__<tool>`; False: the server's own names
    env: tuple[tuple[str, str], ...]  # command only: added to the child's environment
    env_from: tuple[str, ...]  # command only: variables copied from the engine's environment
    cwd: (
        str | None
    )  # command only: the child's working directory (default and relative: the file's)
    # How long a call waiting for approval (`approve`) may wait before it is declined.
    approve_timeout_ms: int = 3_600_000

    @property
    def path(self) -> str:
        """Its name in tool ids and errors: `mcp.<id>`."""
        return f"mcp.{self.id}"

    def command_vars(self) -> list[str]:
        """The variables the command line and cwd name as `${VAR}` (expanded at start)."""
        parts = (*(self.command or ()), self.cwd or "")
        return [m for part in parts for m in _COMMAND_VAR.findall(part)]

    def off_reason(self, env: Mapping[str, str], base_dir: str) -> str | None:
        """Why this stdio server cannot start here at all (its program is not installed,
        a variable its command names is unset), or None. Such a connection is off: its
        syncs fail at once and its agents run without its tools."""
        if not self.command:
            return None
        unset = [v for v in dict.fromkeys(self.command_vars()) if not env.get(v)]
        if unset:
            return f"its command names {', '.join(unset)}, which is not set"
        program, cwd = self.argv(env)[0], self.workdir(env, base_dir)
        if not os.path.isdir(cwd):
            return f"its cwd {cwd!r} is not a folder"
        if os.sep in program:
            if os.access(os.path.join(cwd, program), os.X_OK):
                return None
            return f"{program!r} is not an executable file"
        # The child's PATH: the block's own `env`, else what the SDK passes on (ours).
        path = dict(self.env).get("PATH") or os.environ.get("PATH") or os.defpath
        if shutil.which(program, path=path):
            return None
        return f"{program!r} is not installed (not found on PATH)"

    def secret_in_command(self) -> str | None:
        """Why this server's command line holds a secret, or None. Every local user reads
        a process's arguments (/proc/<pid>/cmdline, `ps`): a secret belongs in `env_from`.
        Says where it is (a `${VAR}` named like a secret, a credential flag), never it."""
        for n, arg in enumerate(self.command or ()):
            for var in _COMMAND_VAR.findall(arg):
                if _SECRET_NAME.search(var):
                    return (
                        f"its command line passes ${{{var}}} (argument {n}), which every local "
                        "user can read in /proc/<pid>/cmdline; pass it with env_from instead"
                    )
            flag = _SECRET_FLAG.match(arg)
            if flag is not None and (flag.group(2) or n + 1 < len(self.command or ())):
                return (
                    f"its command line gives {flag.group(1)} a value (argument {n}), which every "
                    "local user can read in /proc/<pid>/cmdline; pass it with env_from instead"
                )
        return None

    def argv(self, env: Mapping[str, str]) -> list[str]:
        """The command line with each `${VAR}` replaced by its value (unset: empty)."""
        return [_expand(a, env) for a in self.command or ()]

    def workdir(self, env: Mapping[str, str], base_dir: str) -> str:
        """Where the child runs: `cwd` expanded, relative to the project file's folder."""
        return os.path.join(base_dir, _expand(self.cwd or "", env))


def _expand(text: str, env: Mapping[str, str]) -> str:
    return _COMMAND_VAR.sub(lambda m: env.get(m.group(1), ""), text)


@dataclass(frozen=True)
class MissingEnv:
    """An environment variable the project needs and lacks, and who needs it."""

    var: str
    needed_by: str  # agent id(s) or "llm.<id>", comma-joined when several
    why: str


@dataclass(frozen=True)
class SlackOff:
    """An agent whose Slack app will not start, and what to set to start it."""

    agent: str
    why: str  # one line naming the variables to set
    partial: bool  # some of its variables are set, not enough: a mistake, not a choice


@dataclass(frozen=True)
class AgentDecl:
    """`[agent.<id>]`, checked: what the engine needs to run the agent."""

    id: str
    llm: str | None
    model: str | None
    system: str | None
    effort: str | None
    description: str | None
    tools: tuple[dict[str, Any], ...]
    subagents: tuple[str, ...]
    max_subagent_depth: int
    worker: str | None
    signing_secret_env: str | None
    retry: dict[str, Any] | None
    slack: SlackBlock | None
    # wire McpServer entries: {id: "mcp.<id>", tools?, auth_failure?}
    mcp: tuple[dict[str, Any], ...] = ()
    # Who may answer its interrupts in Slack: user ("U…"/"W…") and user group ("S…") ids;
    # empty: the person whose message started the turn.
    approvers: tuple[str, ...] = ()
    subagent_modes: dict[str, str] = field(default_factory=dict)  # child -> SubagentMode
    # Ours (engine/machine/budgets.py): per turn and over the session; None: no limit.
    budget: dict[str, Any] | None = None
    session_budget: dict[str, Any] | None = None

    def wire_config(self, project: Project) -> dict[str, Any] | None:
        """The protocol AgentConfig for this agent; None when its worker supplies it.

        Validation guarantees llm and model are set together, so `model` decides.
        """
        if self.model is None:
            return None
        out: dict[str, Any] = {"model": self.model}
        for key in ("llm", "system", "effort"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.tools:
            out["tools"] = copy.deepcopy(list(self.tools))
        if self.subagents:
            out["subagents"] = [
                {"id": child, "description": project.agents[child].description or ""}
                | ({"mode": self.subagent_modes[child]} if child in self.subagent_modes else {})
                for child in self.subagents
            ]
        out["max_subagent_depth"] = self.max_subagent_depth
        if self.mcp:
            out["mcp"] = copy.deepcopy(list(self.mcp))
        if self.retry is not None:
            out["retry"] = copy.deepcopy(self.retry)
        if self.budget is not None:
            out["budget"] = copy.deepcopy(self.budget)
        if self.session_budget is not None:
            out["session_budget"] = copy.deepcopy(self.session_budget)
        return out

    @property
    def cost_limited(self) -> bool:
        """Whether a limit of its is in USD (then its model must have a known price)."""
        return any(b and "max_cost_usd" in b for b in (self.budget, self.session_budget))


@dataclass(frozen=True)
class TelemetryConfig:
    """Where turns' traces go (docs/telemetry.md): an OTLP/HTTP collector's base URL.

    None, with no `OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT` in the environment: nothing is
    traced or exported.
    """

    endpoint: str | None = None
    service_name: str = "subs"
    capture_content: bool = False  # prompts and completions on the chat spans


@dataclass(frozen=True)
class AlertmanagerHookConfig:
    """`[hooks.alertmanager]`: POST /api/hooks/alertmanager triages each alert group in a
    thread of `channel`, answered by `agent`'s Slack app (docs/slack.md)."""

    agent: str
    channel: str


@dataclass(frozen=True)
class Project:
    """A whole subs.toml, checked against itself and the environment."""

    path: str
    name: str
    redis: str | None  # None: the embedded server
    serve: ServeConfig
    llm: dict[str, LlmBlock]
    agents: dict[str, AgentDecl]
    store: StoreConfig = StoreConfig()
    mcp: dict[str, McpBlock] = dataclasses.field(default_factory=dict)
    telemetry: TelemetryConfig = TelemetryConfig()
    alertmanager: AlertmanagerHookConfig | None = None
    budgets: tuple[BudgetPolicy, ...] = ()  # `[[budgets]]` (engine/budget_config.py)

    def connections_off(self, env: Mapping[str, str]) -> dict[str, str]:
        """The MCP connections that cannot start here, and why (McpBlock.off_reason)."""
        base = os.path.dirname(self.path)
        reasons = {b.path: b.off_reason(env, base) for b in self.mcp.values()}
        return {path: why for path, why in reasons.items() if why is not None}

    def missing_env(self, env: Mapping[str, str]) -> list[MissingEnv]:
        """Environment variables the project needs that are unset or empty."""
        found: dict[str, MissingEnv] = {}

        def need(var: str, who: str, why: str) -> None:
            if env.get(var):
                return
            seen = found.get(var)
            if seen is None:
                found[var] = MissingEnv(var, who, why)
            elif who not in seen.needed_by.split(", "):
                found[var] = dataclasses.replace(seen, needed_by=f"{seen.needed_by}, {who}")

        for block in self.llm.values():
            users = [a.id for a in self.agents.values() if a.llm == block.id]
            if block.api_key_env and users:
                why = f"{block.type} API key, used by {', '.join(users)}"
                if block.base_url != LLM_DEFAULTS[block.type][1]:
                    why += '; a server of your own that takes no key: auth = "none"'
                need(block.api_key_env, f"llm.{block.id}", why)
        for agent in self.agents.values():
            if agent.signing_secret_env:
                need(agent.signing_secret_env, agent.id, "signs requests to the agent's worker")
            for i, entry in enumerate(agent.slack.watch if agent.slack else ()):
                if entry.channel_var:
                    why = f"the alert channel agent.{agent.id}.slack.watch.{i} watches"
                    need(entry.channel_var, agent.id, why)
            for ref in agent.mcp:
                conn = self.mcp[ref["id"].removeprefix("mcp.")]
                if conn.token_env:
                    need(conn.token_env, agent.id, f"bearer token for {conn.path}")
                for var in conn.env_from:
                    need(var, agent.id, f"passed to {conn.path}'s server (env_from)")
        return list(found.values())

    def slack_off(self, env: Mapping[str, str]) -> list[SlackOff]:
        """The agents with a Slack block whose app cannot start here, and why.

        Slack's variables are not in `missing_env`: the engine and its API run without
        them. None set is an API-only set-up; some set but not enough is a mistake."""
        off = []
        for agent in self.agents.values():
            if agent.slack is None:
                continue
            suffix = slack_env_suffix(agent.id)
            bot, app = f"SLACK_BOT_TOKEN_{suffix}", f"SLACK_APP_TOKEN_{suffix}"
            signing = f"SLACK_SIGNING_SECRET_{suffix}"
            other = next((var for var in (app, signing) if env.get(var)), None)
            if env.get(bot) and other:
                continue
            head = f"Slack app {agent.id} off"
            if env.get(bot):
                why = f"{bot} is set, but neither {app} (Socket Mode) nor {signing} (HTTP): set one"
            elif other:
                why = f"{other} is set, but {bot} is not: set it too"
            else:
                why = f"set {bot} and {app} (Socket Mode) or {signing} (HTTP)"
            off.append(SlackOff(agent.id, f"{head}: {why}", partial=bool(env.get(bot) or other)))
        return off


def slack_env_suffix(agent_id: str) -> str:
    """The <AGENT> part of SLACK_*_<AGENT>: upper-cased, non-alphanumerics as '_'."""
    return re.sub(r"[^A-Za-z0-9]", "_", agent_id).upper()


# ---------------------------------------------------------------- file shape


def _env_name(value: str) -> str:
    if not _ENV_NAME.fullmatch(value):
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


def _redis_url(value: str) -> str:
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
    if not (_CHANNEL_ID.fullmatch(value) or _COMMAND_VAR.fullmatch(value)):
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
RedisUrl = Annotated[str, AfterValidator(_redis_url)]
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


class _Root(_Model):
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
    budgets: list[budget_config.BudgetEntry] = Field(default_factory=list)


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


# ---------------------------------------------------------------- loading


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
    _scan_secrets(data, (), file, data)
    try:
        root = _Root.model_validate(data, context={"tool_handlers": tool_handlers})
    except ValidationError as e:
        raise _from_pydantic(file, e) from None
    _check(root, file)
    return _apply_env(_build(root, os.path.abspath(file)), env)


def _dotted(path: tuple[str | int, ...]) -> str:
    return ".".join(str(p) for p in path)


def _scan_secrets(node: Any, path: tuple[str | int, ...], file: str, data: dict[str, Any]) -> None:
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
                    key=_dotted(child),
                )
            if (
                not in_schema
                and key.endswith("_env")
                and isinstance(value, str)
                and value.startswith(_ENV_SECRET_PREFIXES + _SECRET_PREFIXES)
            ):
                raise ConfigError(_LITERAL_IN_ENV, file=file, key=_dotted(child))
            _scan_secrets(value, child, file, data)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _scan_secrets(value, (*path, i), file, data)
    elif isinstance(node, str) and node.startswith(_SECRET_PREFIXES):
        raise ConfigError(
            "looks like a literal secret; put the secret in the environment, not in subs.toml",
            file=file,
            key=_dotted(path),
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


# How pydantic names the branches of a union in an error's location (`mcp = ["mcp.x",
# {id = ...}]`): not keys of the file.
_UNION_TAG = re.compile(r"constrained-str|str|_[A-Z][A-Za-z]*")


def _from_pydantic(file: str, error: ValidationError) -> ConfigError:
    """The first error, read as the file's key path. Where a value may be a string or a
    table, the branch of what was written speaks (not "expected a string" for a table)."""
    errors = error.errors()
    first = errors[0]
    tagged = [
        e for e in errors if any(isinstance(p, str) and _UNION_TAG.fullmatch(p) for p in e["loc"])
    ]
    if tagged:
        first = next((e for e in tagged if not e["type"].endswith("_type")), tagged[0])
    loc = tuple(
        p
        for p in first["loc"]
        if not (isinstance(p, str) and (_UNION_TAG.fullmatch(p) or p == "[key]"))
    )
    return ConfigError(_human(first, loc), file=file, key=_dotted(loc))


def _describe(value: Any) -> str:
    for kind, name in (
        (bool, "true/false"),
        (int, "an integer"),
        (float, "a number"),
        (str, "a string"),
        (list, "a list"),
        (dict, "a table"),
    ):
        if isinstance(value, kind):
            return name
    return "a date/time"


def _human(err: Any, loc: tuple[str | int, ...]) -> str:
    kind, ctx, got = err["type"], err.get("ctx") or {}, err.get("input")
    expected = {
        "string_type": "a string",
        "int_type": "an integer",
        "int_from_float": "an integer",
        "bool_type": "true or false",
        "list_type": "a list",
        "dict_type": "a table",
        "model_type": "a table",
    }
    if kind in expected:
        return f"expected {expected[kind]}, got {_describe(got)}"
    if kind == "extra_forbidden":
        known = _known_keys(loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        return "unknown key" + (
            f" (did you mean {close[0]}?)" if close else f"; known keys: {', '.join(known)}"
        )
    if kind == "missing":
        return "required"
    if kind == "literal_error":
        return f"must be one of {ctx['expected']}, got {got!r}"
    if kind == "greater_than_equal":
        return f"must be {ctx['ge']} or more"
    if kind == "less_than_equal":
        return f"must be {ctx['le']} or less"
    if kind == "string_too_short":
        return "must not be empty"
    if kind == "string_too_long":
        return f"must be at most {ctx['max_length']} characters (is {len(got)})"
    if kind == "value_error":
        return str(ctx["error"])
    return str(err["msg"])


def _unwrap(annotation: Any) -> Any:
    """Strip `X | None` down to X (and `str | Table` to the table)."""
    while get_origin(annotation) in (Union, types.UnionType):
        options = [a for a in get_args(annotation) if a is not type(None)]
        tables = [a for a in options if isinstance(a, type) and issubclass(a, BaseModel)]
        annotation = (tables or options)[0]  # `str | table`: a key path runs into the table
    return annotation


def _known_keys(parent: tuple[str | int, ...]) -> list[str]:
    """The keys the file may use at `parent`, for an unknown-key hint."""
    current: Any = _Root
    for part in parent:
        current = _unwrap(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            current = current.model_fields[str(part)].annotation
        else:  # a list index or a table key: step into the element type
            current = get_args(current)[-1]
    current = _unwrap(current)
    return [f.alias or name for name, f in current.model_fields.items()]


def _check(root: _Root, file: str) -> None:
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
    for key, why in budget_config.problems(root.budgets, set(root.agent)):
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
        if not _ENV_NAME.fullmatch(name):
            raise ConfigError(
                "must be an environment variable name", file=file, key=f"{at}.env.{name}"
            )


def _mcp_refs(root: _Root, file: str, at: str, agent: _Agent) -> list[dict[str, Any]]:
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


def _check_agent(root: _Root, file: str, aid: str, agent: _Agent) -> None:
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
    _mcp_refs(root, file, at, agent)
    if agent.slack is not None and agent.slack.name is None and len(aid) > 35:
        raise ConfigError(
            "required: the default, the agent id, is longer than 35 characters",
            file=file,
            key=f"{at}.slack.name",
        )


def _price_strings(p: _Price) -> dict[str, str]:
    """A block's price as decimal strings (the cost arithmetic is Decimal, never float)."""
    read = p.input if p.cache_read is None else p.cache_read
    write = p.input if p.cache_write is None else p.cache_write
    values = {"input": p.input, "output": p.output, "cache_read": read, "cache_write": write}
    return {k: repr(float(v)) for k, v in values.items()}


def _build(root: _Root, path: str) -> Project:
    llm = {
        lid: LlmBlock(
            id=lid,
            type=b.type,
            api_key_env=None
            if b.auth == "none"
            else b.api_key_env or LLM_DEFAULTS.get(b.type, (None, None))[0],
            base_url=b.base_url or LLM_DEFAULTS.get(b.type, (None, None))[1],
            format=b.format,
            cache=b.cache,
            prices={m: _price_strings(p) for m, p in b.prices.items()},
        )
        for lid, b in root.llm.items()
    }
    agents = {
        aid: AgentDecl(
            id=aid,
            llm=a.llm,
            model=a.model,
            system=a.system,
            effort=a.effort,
            description=a.description,
            tools=tuple(t.model_dump(exclude_none=True) for t in a.tools),
            subagents=tuple(e.id.removeprefix("agent.") for e in a.subagents),
            max_subagent_depth=root.max_subagent_depth
            if a.max_subagent_depth is None
            else a.max_subagent_depth,
            worker=a.worker,
            signing_secret_env=a.signing_secret_env,
            retry=None if a.retry is None else a.retry.model_dump(exclude_none=True),
            mcp=tuple(_mcp_refs(root, path, f"agent.{aid}", a)),
            subagent_modes={e.id.removeprefix("agent."): e.mode for e in a.subagents if e.mode},
            slack=None
            if a.slack is None
            else SlackBlock(
                name=a.slack.name or aid,
                description=a.slack.description,
                answers=a.slack.answers,
                commands=tuple(a.slack.commands),
                stream=a.slack.stream,
                max_concurrent_turns=a.slack.max_concurrent_turns,
                files=a.slack.files,
                file_text_limit=a.slack.file_text_limit,
                allow_teams=tuple(a.slack.allow.teams) if a.slack.allow else (),
                allow_channels=tuple(a.slack.allow.channels) if a.slack.allow else (),
                allow_users=tuple(a.slack.allow.users) if a.slack.allow else (),
                external=a.slack.external,
                follow=a.slack.follow,
                watch=tuple(WatchEntry(w.channel, tuple(w.from_), w.match) for w in a.slack.watch),
            ),
            approvers=tuple(a.approvers or ()),
            budget=None if a.budget is None else a.budget.model_dump(exclude_none=True),
            session_budget=None
            if a.session_budget is None
            else a.session_budget.model_dump(exclude_none=True),
        )
        for aid, a in root.agent.items()
    }
    return Project(
        path=path,
        name=root.name or Path(path).parent.name or "subs",
        redis=root.redis,
        serve=ServeConfig(
            host=root.serve.host,
            port=root.serve.port,
            cors_origins=tuple(dict.fromkeys(root.serve.cors_origins)),
            max_streams_per_key=root.serve.max_streams_per_key,
            max_streams=root.serve.max_streams,
            public_url=root.serve.public_url,
            header_timeout_secs=root.serve.header_timeout_secs,
            state_cache_mb=root.serve.state_cache_mb,
            state_cache_sessions=root.serve.state_cache_sessions,
            client_token_issuer=root.serve.client_token_issuer,
            client_token_audience=root.serve.client_token_audience,
        ),
        llm=llm,
        agents=agents,
        store=StoreConfig(
            fsync=root.store.fsync,
            wait_replicas=root.store.wait_replicas,
            wait_timeout_ms=root.store.wait_timeout_ms,
            partitions=root.store.partitions,
            retention_ms=None
            if root.store.retention == "forever"
            else duration_ms(root.store.retention),
            archive_dir=None if root.store.archive == "none" else root.store.archive[4:].strip(),
            max_memory=root.store.max_memory,
        ),
        mcp={
            mid: McpBlock(
                id=mid,
                url=b.url,
                command=None if b.command is None else tuple(b.command),
                token_env=b.token_env,
                header=b.header,
                prefix_tools=b.prefix_tools,
                env=tuple(b.env.items()),
                env_from=tuple(b.env_from),
                cwd=b.cwd,
                approve_timeout_ms=duration_ms(b.approve_timeout),
            )
            for mid, b in root.mcp.items()
        },
        telemetry=TelemetryConfig(
            endpoint=root.telemetry.endpoint,
            service_name=root.telemetry.service_name,
            capture_content=root.telemetry.capture_content,
        ),
        alertmanager=None
        if root.hooks.alertmanager is None
        else AlertmanagerHookConfig(root.hooks.alertmanager.agent, root.hooks.alertmanager.channel),
        budgets=budget_config.build(root.budgets),
    )


def _apply_env(project: Project, env: Mapping[str, str]) -> Project:
    """Environment beats the file: SUBS_REDIS, SUBS_HOST, SUBS_PORT, SUBS_MAX_STREAMS_PER_KEY."""
    redis = env.get("SUBS_REDIS") or project.redis
    if env.get("SUBS_REDIS"):
        try:
            _redis_url(env["SUBS_REDIS"])
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
