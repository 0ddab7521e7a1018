"""The project as the engine reads it: frozen dataclasses built from a checked subs.toml.

Everything here is already valid (schema.py and checks.py saw to it), so nothing here
raises on its own fields; what it still answers is what depends on the machine it runs
on (the environment, installed programs). ConfigError, the one error of loading, lives
here too so that every layer above can raise it.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import quote

from engine.errors import SubsError
from engine.machine.policies import BudgetPolicy

LLM_DEFAULTS: dict[str, tuple[str, str]] = {
    "anthropic": ("ANTHROPIC_API_KEY", "https://api.anthropic.com"),
    "openai": ("OPENAI_API_KEY", "https://api.openai.com/v1"),
    "openrouter": ("OPENROUTER_API_KEY", "https://openrouter.ai/api/v1"),
}

COMMAND_VAR = re.compile(r"\$\{([A-Z_][A-Z0-9_]*)\}")  # `${VAR}` in an MCP command line
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
    show_cost: bool = False  # a line of each turn's cost under its reply
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
        found = COMMAND_VAR.fullmatch(self.channel)
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
        return [m for part in parts for m in COMMAND_VAR.findall(part)]

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
            for var in COMMAND_VAR.findall(arg):
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
    return COMMAND_VAR.sub(lambda m: env.get(m.group(1), ""), text)


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
    budgets: tuple[BudgetPolicy, ...] = ()  # `[[budgets]]` (budgets.py)

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
