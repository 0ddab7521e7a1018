"""subs.toml parsing: every broken file names its key path; good files give the right Project."""

import dataclasses
import json
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from engine.config import (
    ConfigError,
    MissingEnv,
    ServeConfig,
    SlackOff,
    load_project,
    parse_project,
    slack_env_suffix,
)

ROOT = Path(__file__).parents[1]
SCHEMA = json.loads((ROOT / "spec" / "protocol.schema.json").read_text())
AGENT_CONFIG = Draft202012Validator({"$ref": "#/$defs/AgentConfig", "$defs": SCHEMA["$defs"]})

LLM = '[llm.openrouter]\ntype = "openrouter"\n'
AGENT = '[agent.oncall]\nllm = "openrouter"\nmodel = "m"\n'
OK = LLM + AGENT


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "subs.toml"
    path.write_text(text)
    return path


def load(tmp_path: Path, text: str, env: dict[str, str] | None = None):
    return load_project(write(tmp_path, text), env={} if env is None else env)


BROKEN = [
    # (id, file, key path, message fragment)
    ("syntax", "name = \n", "", "line 1"),
    ("top-level typo", 'redsi = "redis://x"\n', "redsi", "unknown key"),
    ("serve typo", "[serve]\nhots = 'x'\n", "serve.hots", "unknown key (did you mean host?)"),
    ("agent typo", OK + 'modle = "m2"\n', "agent.oncall.modle", "did you mean model?"),
    ("llm typo", '[llm.x]\ntype = "worker"\nformatt = "openai"\n', "llm.x.formatt", "unknown key"),
    ("port type", '[serve]\nport = "80"\n', "serve.port", "expected an integer, got a string"),
    ("port range", "[serve]\nport = 70000\n", "serve.port", "65535 or less"),
    (
        "public_url not a URL",
        '[serve]\npublic_url = "subs.example.com"\n',
        "serve.public_url",
        "must be an http(s) URL with no query",
    ),
    (
        "cors not a list",
        '[serve]\ncors_origins = "https://a.example"\n',
        "serve.cors_origins",
        "a list",
    ),
    (
        "cors wildcard",
        '[serve]\ncors_origins = ["*"]\n',
        "serve.cors_origins.0",
        "must be an origin",
    ),
    (
        "cors with a path",
        '[serve]\ncors_origins = ["https://a.example", "https://b.example/app"]\n',
        "serve.cors_origins.1",
        "no path",
    ),
    (
        "cors trailing slash",
        '[serve]\ncors_origins = ["https://a.example/"]\n',
        "serve.cors_origins.0",
        "origin",
    ),
    ("cors no scheme", '[serve]\ncors_origins = ["a.example"]\n', "serve.cors_origins.0", "origin"),
    (
        "cors userinfo",
        '[serve]\ncors_origins = ["https://u@a.example"]\n',
        "serve.cors_origins.0",
        "origin",
    ),
    (
        "cors query",
        '[serve]\ncors_origins = ["https://a.example?x"]\n',
        "serve.cors_origins.0",
        "origin",
    ),
    (
        "cors bad port",
        '[serve]\ncors_origins = ["http://a.example:99999"]\n',
        "serve.cors_origins.0",
        "origin",
    ),
    ("cors null", '[serve]\ncors_origins = ["null"]\n', "serve.cors_origins.0", "origin"),
    (
        "cors typo",
        '[serve]\ncors_origin = ["https://a.example"]\n',
        "serve.cors_origin",
        "did you mean cors_origins",
    ),
    (
        "stream limit range",
        "[serve]\nmax_streams_per_key = 0\n",
        "serve.max_streams_per_key",
        "1 or more",
    ),
    ("tools type", OK + 'tools = "x"\n', "agent.oncall.tools", "expected a list, got a string"),
    ("tool entry type", OK + 'tools = ["x"]\n', "agent.oncall.tools.0", "expected a table"),
    (
        "tool without name",
        OK + 'tools = [{ description = "d", handler = "client" }]\n',
        "agent.oncall.tools.0.name",
        "required",
    ),
    ("llm without type", '[llm.x]\nbase_url = "https://x"\n', "llm.x.type", "required"),
    ("llm bad type", '[llm.x]\ntype = "gemini"\n', "llm.x.type", "must be one of"),
    (
        "format on engine block",
        LLM + 'format = "openai"\n',
        "llm.openrouter.format",
        'only allowed with type = "worker"',
    ),
    (
        "api_key_env on worker",
        '[llm.byo]\ntype = "worker"\napi_key_env = "K"\n',
        "llm.byo.api_key_env",
        "the worker makes the call",
    ),
    (
        "base_url on worker",
        '[llm.byo]\ntype = "worker"\nbase_url = "https://x"\n',
        "llm.byo.base_url",
        "the worker makes the call",
    ),
    (
        "auth on worker",
        '[llm.byo]\ntype = "worker"\nauth = "none"\n',
        "llm.byo.auth",
        "the worker makes the call",
    ),
    ("llm bad auth", LLM + 'auth = "token"\n', "llm.openrouter.auth", "must be one of"),
    (
        "auth none with a key variable",
        LLM + 'auth = "none"\nbase_url = "http://localhost:11434/v1"\napi_key_env = "K"\n',
        "llm.openrouter.api_key_env",
        'not allowed with auth = "none"',
    ),
    (
        "auth none at the vendor's own URL",
        '[llm.o]\ntype = "openai"\nauth = "none"\n',
        "llm.o.base_url",
        'required with auth = "none": the openai API itself takes a key',
    ),
    (
        "bad base_url",
        LLM + 'base_url = "openrouter.ai"\n',
        "llm.openrouter.base_url",
        "http(s) URL",
    ),
    (
        "undeclared llm",
        LLM + '[llm.byo]\ntype = "worker"\n[agent.oncall]\nllm = "foo"\nmodel = "m"\n',
        "agent.oncall.llm",
        "no [llm.foo] block; declared: openrouter, byo",
    ),
    (
        "llm without model",
        LLM + '[agent.oncall]\nllm = "openrouter"\n',
        "agent.oncall.model",
        "missing model",
    ),
    (
        "system only",
        '[agent.oncall]\nsystem = "hi"\nworker = "http://localhost:1"\n',
        "agent.oncall.llm",
        "missing llm and model: an agent that sets system",
    ),
    (
        "nothing set",
        '[agent.oncall]\ndescription = "d"\n',
        "agent.oncall",
        "missing llm and model, or worker",
    ),
    ("bad effort", OK + 'effort = "max"\n', "agent.oncall.effort", "must be one of"),
    (
        "negative depth",
        OK + "max_subagent_depth = -1\n",
        "agent.oncall.max_subagent_depth",
        "must be 0 or more",
    ),
    (
        "subagent without prefix",
        OK + 'subagents = ["helper"]\n',
        "agent.oncall.subagents.0",
        'must be "agent.<id>"',
    ),
    (
        "undeclared subagent",
        OK + 'subagents = ["agent.nobody"]\n',
        "agent.oncall.subagents.0",
        "no [agent.nobody]; declared: oncall",
    ),
    (
        "self subagent",
        OK + 'subagents = ["agent.oncall"]\n',
        "agent.oncall.subagents.0",
        "its own subagent",
    ),
    (
        "subagent mode",
        OK + 'subagents = [{ id = "agent.oncall", mode = "sideways" }]\n',
        "agent.oncall.subagents.0.mode",
        "must be one of 'blocking', 'detached' or 'any'",
    ),
    (
        "subagent key",
        OK + 'subagents = [{ id = "agent.oncall", mod = "any" }]\n',
        "agent.oncall.subagents.0.mod",
        "unknown key (did you mean mode?)",
    ),
    (
        "duplicate tool",
        OK + 'tools = [{ name = "a", handler = "client" }, { name = "a", handler = "client" }]\n',
        "agent.oncall.tools.1.name",
        "duplicate",
    ),
    (
        "server handler",
        OK + 'tools = [{ name = "a", handler = "server" }]\n',
        "agent.oncall.tools.0.handler",
        "must be one of",
    ),
    (
        "worker tool, no worker",
        OK + 'tools = [{ name = "a" }]\n',
        "agent.oncall.tools.0",
        "needs the agent to have a worker",
    ),
    (
        "bad tool schema",
        OK + 'tools = [{ name = "a", handler = "client", input = { type = 5 } }]\n',
        "agent.oncall.tools.0.input",
        "not a valid JSON Schema",
    ),
    (
        "retry kind",
        OK + "retry = { decision = { max_attempts = 1 } }\n",
        "agent.oncall.retry.decision",
        "unknown key",
    ),
    (
        "retry field",
        OK + "retry = { tool = { attempts = 3 } }\n",
        "agent.oncall.retry.tool.attempts",
        "did you mean max_attempts?",
    ),
    (
        "retry negative",
        OK + "retry = { llm = { max_attempts = -2 } }\n",
        "agent.oncall.retry.llm.max_attempts",
        "must be 0 or more",
    ),
    ("worker url", OK + 'worker = "localhost:4444"\n', "agent.oncall.worker", "http(s) URL"),
    (
        "slack name",
        OK + f'[agent.oncall.slack]\nname = "{"n" * 36}"\n',
        "agent.oncall.slack.name",
        "at most 35 characters",
    ),
    (
        "slack description",
        OK + f'[agent.oncall.slack]\ndescription = "{"d" * 141}"\n',
        "agent.oncall.slack.description",
        "at most 140 characters",
    ),
    (
        "slack answers",
        OK + '[agent.oncall.slack]\nanswers = "all"\n',
        "agent.oncall.slack.answers",
        "must be one of",
    ),
    (
        "slack command slash",
        OK + '[agent.oncall.slack]\ncommands = ["/ok", "oncall"]\n',
        "agent.oncall.slack.commands.1",
        "must start with '/'",
    ),
    (
        "slack command case",
        OK + '[agent.oncall.slack]\ncommands = ["/OnCall"]\n',
        "agent.oncall.slack.commands.0",
        "lowercase",
    ),
    (
        "slack stream",
        OK + '[agent.oncall.slack]\nstream = "fast"\n',
        "agent.oncall.slack.stream",
        "must be one of",
    ),
    (
        "slack max_concurrent_turns",
        OK + "[agent.oncall.slack]\nmax_concurrent_turns = 0\n",
        "agent.oncall.slack.max_concurrent_turns",
        "1 or more",
    ),
    (
        "watch match not a regex",
        OK + '[[agent.oncall.slack.watch]]\nchannel = "C0ALERTS"\nmatch = "FIRING:(["\n',
        "agent.oncall.slack.watch.0.match",
        "not a valid regular expression",
    ),
    (
        "watch second entry's match",
        OK + '[[agent.oncall.slack.watch]]\nchannel = "C0A1"\n'
        '[[agent.oncall.slack.watch]]\nchannel = "C0A2"\nmatch = "*down"\n',
        "agent.oncall.slack.watch.1.match",
        "not a valid regular expression",
    ),
    (
        "watch channel name",
        OK + '[[agent.oncall.slack.watch]]\nchannel = "#alerts"\n',
        "agent.oncall.slack.watch.0.channel",
        "must be a channel id",
    ),
    (
        "watch channel missing",
        OK + '[[agent.oncall.slack.watch]]\nfrom = ["Grafana"]\n',
        "agent.oncall.slack.watch.0.channel",
        "required",
    ),
    (
        "watch from a string",
        OK + '[[agent.oncall.slack.watch]]\nchannel = "C0A1"\nfrom = "Grafana"\n',
        "agent.oncall.slack.watch.0.from",
        "expected a list",
    ),
    (
        "watch from empty name",
        OK + '[[agent.oncall.slack.watch]]\nchannel = "C0A1"\nfrom = [""]\n',
        "agent.oncall.slack.watch.0.from.0",
        "must not be empty",
    ),
    (
        "watch typo",
        OK + '[[agent.oncall.slack.watch]]\nchannel = "C0A1"\nposter = ["Grafana"]\n',
        "agent.oncall.slack.watch.0.poster",
        "unknown key",
    ),
    (
        "slack follow",
        OK + '[agent.oncall.slack]\nfollow = "yes"\n',
        "agent.oncall.slack.follow",
        "expected true or false",
    ),
    (
        "long id, default slack name",
        LLM + f'[agent.{"a" * 36}]\nllm = "openrouter"\nmodel = "m"\n[agent.{"a" * 36}.slack]\n',
        f"agent.{'a' * 36}.slack.name",
        "longer than 35",
    ),
    (
        "agent id",
        LLM + '[agent."on call"]\nllm = "openrouter"\nmodel = "m"\n',
        "agent.on call",
        "only letters, digits",
    ),
    ("redis url", 'redis = "localhost:6379"\n', "redis", "redis://"),
    ("store fsync", '[store]\nfsync = "no"\n', "store.fsync", "one of 'always' or 'everysec'"),
    ("store typo", "[store]\nwait_replica = 1\n", "store.wait_replica", "did you mean"),
    ("wait_replicas sign", "[store]\nwait_replicas = -1\n", "store.wait_replicas", "0 or more"),
    ("partitions", "[store]\npartitions = 0\n", "store.partitions", "1 or more"),
    ("partitions max", "[store]\npartitions = 20000\n", "store.partitions", "16384"),
    ("wait_timeout_ms 0", "[store]\nwait_timeout_ms = 0\n", "store.wait_timeout_ms", "1 or more"),
    (
        "literal api key",
        LLM + 'api_key = "abc"\n',
        "llm.openrouter.api_key",
        'api_key_env = "OPENROUTER_API_KEY"',
    ),
    (
        "literal bot token",
        OK + '[agent.oncall.slack]\nbot_token = "abc"\n',
        "agent.oncall.slack.bot_token",
        "SLACK_BOT_TOKEN_ONCALL",
    ),
    (
        "literal app token",
        OK + '[agent.oncall.slack]\napp_token = "abc"\n',
        "agent.oncall.slack.app_token",
        "SLACK_APP_TOKEN_ONCALL",
    ),
    (
        "literal signing secret",
        OK + 'signing_secret = "abc"\n',
        "agent.oncall.signing_secret",
        'signing_secret_env = "ONCALL_SIGNING_SECRET"',
    ),
    (
        "literal password",
        "[serve]\npassword = 'hunter2'\n",
        "serve.password",
        "literal secrets are not allowed",
    ),
    (
        "secret in *_env",
        OK + 'signing_secret_env = "sk-abc123"\n',
        "agent.oncall.signing_secret_env",
        "looks like a literal secret; put the secret in the environment and name the variable here",
    ),
    (
        "slack token in api_key_env",
        LLM + 'api_key_env = "xoxb-1-2"\n',
        "llm.openrouter.api_key_env",
        "name the variable here",
    ),
    (
        "env name",
        OK + 'signing_secret_env = "my-secret"\n',
        "agent.oncall.signing_secret_env",
        "must be an environment variable name",
    ),
    (
        "secret value anywhere",
        OK + 'system = "sk-ant-api03-xyz"\n',
        "agent.oncall.system",
        "looks like a literal secret",
    ),
    (
        "secret value in a list",
        OK + '[agent.oncall.slack]\ncommands = ["xapp-1-A"]\n',
        "agent.oncall.slack.commands.0",
        "looks like a literal secret",
    ),
    (
        "secret beats unknown key",
        OK + 'modle = "x"\n[agent.oncall.slack]\ntoken = "t"\n',
        "agent.oncall.slack.token",
        "SLACK_BOT_TOKEN_ONCALL",
    ),
    # [mcp.<id>] connections and the agents that name them
    (
        "mcp typo",
        '[mcp.c]\ncommand = ["x"]\ncomand = ["y"]\n',
        "mcp.c.comand",
        "did you mean command?",
    ),
    ("mcp both", '[mcp.c]\ncommand = ["x"]\nurl = "http://h/mcp"\n', "mcp.c", "exactly one of url"),
    ("mcp neither", "[mcp.c]\nprefix_tools = false\n", "mcp.c", "exactly one of url"),
    (
        "mcp approve_timeout",
        '[mcp.c]\ncommand = ["x"]\napprove_timeout = "soon"\n',
        "mcp.c.approve_timeout",
        "duration",
    ),
    ("mcp empty command", "[mcp.c]\ncommand = []\n", "mcp.c.command", "at least 1"),
    (
        "mcp env with url",
        '[mcp.c]\nurl = "http://h/mcp"\nenv = { A = "1" }\n',
        "mcp.c.env",
        "only allowed with command",
    ),
    (
        "mcp token with command",
        '[mcp.c]\ncommand = ["x"]\ntoken_env = "T"\n',
        "mcp.c.token_env",
        "only allowed with url",
    ),
    (
        "mcp literal token",
        '[mcp.c]\nurl = "http://h/mcp"\ntoken = "abc"\n',
        "mcp.c.token",
        "literal secrets",
    ),
    (
        "mcp secret in env",
        '[mcp.c]\ncommand = ["x"]\nenv = { GITHUB_TOKEN = "ghp_x" }\n',
        "mcp.c.env.GITHUB_TOKEN",
        "literal secrets",
    ),
    (
        "mcp header without token",
        '[mcp.c]\nurl = "http://h/mcp"\nheader = "X-Key"\n',
        "mcp.c.header",
        "needs token_env",
    ),
    (
        "mcp token auth without env",
        '[mcp.c]\nurl = "http://h/mcp"\nauth = "token"\n',
        "mcp.c.token_env",
        "required",
    ),
    (
        "mcp oauth",
        '[mcp.c]\nurl = "http://h/mcp"\nauth = "oauth"\n',
        "mcp.c.auth",
        "must be one of",
    ),
    (
        "mcp bad env_from",
        '[mcp.c]\ncommand = ["x"]\nenv_from = ["lower"]\n',
        "mcp.c.env_from.0",
        "environment variable name",
    ),
    (
        "agent names no block",
        OK + 'mcp = ["mcp.nope"]\n',
        "agent.oncall.mcp.0",
        "no [mcp.nope] block",
    ),
    (
        "agent mcp typo",
        OK + 'mcp = [{ id = "mcp.c", tool = {} }]\n[mcp.c]\ncommand = ["x"]\n',
        "agent.oncall.mcp.0.tool",
        "did you mean tools?",
    ),
    (
        "agent mcp filter typo",
        OK + 'mcp = [{ id = "mcp.c", tools = { includ = ["a"] } }]\n[mcp.c]\ncommand = ["x"]\n',
        "agent.oncall.mcp.0.tools.includ",
        "did you mean include?",
    ),
    (
        "agent mcp twice",
        OK + 'mcp = ["mcp.c", "c"]\n[mcp.c]\ncommand = ["x"]\n',
        "agent.oncall.mcp.1",
        "listed twice",
    ),
    (
        "agent auth_failure",
        OK + 'mcp = [{ id = "mcp.c", auth_failure = "ask" }]\n[mcp.c]\ncommand = ["x"]\n',
        "agent.oncall.mcp.0.auth_failure",
        "must be one of",
    ),
]


@pytest.mark.parametrize(
    ("text", "key", "fragment"), [c[1:] for c in BROKEN], ids=[c[0] for c in BROKEN]
)
def test_broken_file_names_key_and_file(tmp_path: Path, text: str, key: str, fragment: str):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_project(path, env={})
    err = caught.value
    assert (err.file, err.key) == (str(path), key)
    assert fragment in err.message
    assert str(err) == (f"{path}: {key}: {err.message}" if key else f"{path}: {err.message}")
    assert "pydantic" not in err.message and "Input should" not in err.message


def test_example_project_loads():
    project = load_project(ROOT / "subs.toml", env={})
    assert project.name == "oncall-bot"
    assert project.path == str(ROOT / "subs.toml")
    assert project.redis is None
    assert (project.serve.host, project.serve.port) == ("127.0.0.1", 8080)
    oncall = project.agents["oncall"]
    assert oncall.slack is not None and oncall.slack.commands == ("/oncall",)
    assert [t["name"] for t in oncall.tools] == ["confirm"]
    wire = oncall.wire_config(project)
    assert wire is not None
    AGENT_CONFIG.validate(wire)


def test_cors_origins_as_a_browser_sends_them(tmp_path: Path):
    text = (
        "[serve]\ncors_origins = ["
        '"HTTPS://App.Example:443", "http://localhost:3000", "http://[::1]:80", '
        '"https://app.example", "chrome-extension://abcdef"]\n'
    )
    project = load(tmp_path, text, {"SUBS_PORT": "9000"})  # an override keeps them
    assert project.serve.cors_origins == (
        "https://app.example",
        "http://localhost:3000",
        "http://[::1]",
        "chrome-extension://abcdef",
    )
    assert project.serve.port == 9000
    assert load(tmp_path, "").serve.cors_origins == ()


def test_console_links_use_public_url_else_the_serve_address(tmp_path: Path):
    text = '[serve]\npublic_url = "https://subs.example.com/ops/"\n'
    serve = load(tmp_path, text).serve
    assert serve.public_url == "https://subs.example.com/ops"
    assert (
        serve.console_url("ses 1/x") == "https://subs.example.com/ops/console/sessions/ses%201%2Fx"
    )
    serve = load(tmp_path, '[serve]\nhost = "0.0.0.0"\nport = 9090\n').serve
    assert serve.console_url("ses_1") == "http://127.0.0.1:9090/console/sessions/ses_1"
    serve = load(tmp_path, '[serve]\nhost = "::1"\n').serve
    assert serve.console_url("ses_1") == "http://[::1]:8080/console/sessions/ses_1"


def test_defaults(tmp_path: Path):
    text = (
        '[llm.a]\ntype = "anthropic"\n[llm.o]\ntype = "openai"\n'
        '[llm.r]\ntype = "openrouter"\n[llm.w]\ntype = "worker"\nformat = "openai"\n'
        '[agent.oncall]\nllm = "a"\nmodel = "m"\n[agent.oncall.slack]\n'
    )
    project = load(tmp_path, text)
    assert project.name == tmp_path.name
    assert project.redis is None
    assert (project.serve.host, project.serve.port) == ("127.0.0.1", 8080)
    blocks = {k: (b.type, b.api_key_env, b.base_url, b.format) for k, b in project.llm.items()}
    assert blocks == {
        "a": ("anthropic", "ANTHROPIC_API_KEY", "https://api.anthropic.com", None),
        "o": ("openai", "OPENAI_API_KEY", "https://api.openai.com/v1", None),
        "r": ("openrouter", "OPENROUTER_API_KEY", "https://openrouter.ai/api/v1", None),
        "w": ("worker", None, None, "openai"),
    }
    agent = project.agents["oncall"]
    assert agent.max_subagent_depth == 5
    assert (agent.tools, agent.subagents, agent.retry, agent.worker) == ((), (), None, None)
    assert agent.slack is not None
    assert dataclasses.asdict(agent.slack) == {
        "name": "oncall",
        "description": "",
        "answers": "both",
        "commands": (),
        "stream": "edit",
        "max_concurrent_turns": 4,
        "files": True,
        "file_text_limit": 256 * 1024,
        "follow": True,
        "show_cost": False,  # a team's costs stay out of its channels unless it asks
        "watch": (),
        "allow_teams": (),
        "allow_channels": (),
        "allow_users": (),
        "external": False,  # least privilege: no Slack Connect guests
    }
    assert agent.approvers == ()  # the person who started the turn
    with pytest.raises(dataclasses.FrozenInstanceError):
        agent.model = "other"  # type: ignore[misc]
    # A step is acknowledged only once on disk: the engine's promise, not Redis's default.
    assert dataclasses.asdict(project.store) == {
        "fsync": "always",
        "wait_replicas": 0,
        "wait_timeout_ms": 1000,
        "partitions": 16,
        "retention_ms": 30 * 86_400_000,  # sessions do not stay in RAM forever by default
        "archive_dir": ".subs/archive",
        "max_memory": "auto",
    }


@pytest.mark.parametrize(
    ("text", "retention_ms", "archive_dir"),
    [
        ('retention = "forever"\narchive = "none"', None, None),
        (
            'retention = "12h"\narchive = "dir:/var/subs/archive"',
            12 * 3_600_000,
            "/var/subs/archive",
        ),
        ('retention = "90m"', 90 * 60_000, ".subs/archive"),
        ('retention = "45s"', 45_000, ".subs/archive"),
    ],
)
def test_retention_settings(tmp_path: Path, text, retention_ms, archive_dir):
    store = load(tmp_path, f"[store]\n{text}\n").store
    assert (store.retention_ms, store.archive_dir) == (retention_ms, archive_dir)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('retention = "30 days"', 'like "30d"'),
        ('retention = "0d"', "more than 0"),
        ('archive = "s3://bucket"', '"dir:<folder>"'),
        ('archive = "dir:"', '"dir:<folder>"'),
        ('max_memory = "lots"', '"512mb"'),
    ],
)
def test_bad_retention_settings_name_the_fix(tmp_path: Path, text, says):
    with pytest.raises(ConfigError) as err:
        load(tmp_path, f"[store]\n{text}\n")
    assert says in str(err.value)


def test_store_settings(tmp_path: Path):
    text = (
        '[store]\nfsync = "everysec"\nwait_replicas = 2\nwait_timeout_ms = 250\npartitions = 48\n'
    )
    store = load(tmp_path, text).store
    assert (store.fsync, store.wait_replicas, store.wait_timeout_ms) == ("everysec", 2, 250)
    assert store.partitions == 48


def test_a_server_that_takes_no_key_needs_no_variable(tmp_path: Path):
    text = (
        '[llm.local]\ntype = "openai"\nbase_url = "http://localhost:11434/v1"\nauth = "none"\n'
        '[llm.proxy]\ntype = "openai"\nbase_url = "http://localhost:4000"\n'
        '[agent.a]\nllm = "local"\nmodel = "m"\n[agent.b]\nllm = "proxy"\nmodel = "m"\n'
    )
    project = load(tmp_path, text)
    assert project.llm["local"].api_key_env is None
    # A server of your own that does take a key: the hint names the way out.
    assert project.missing_env({}) == [
        MissingEnv(
            "OPENAI_API_KEY",
            "llm.proxy",
            'openai API key, used by b; a server of your own that takes no key: auth = "none"',
        )
    ]


def test_explicit_llm_settings_win(tmp_path: Path):
    text = '[llm.r]\ntype = "openrouter"\napi_key_env = "MY_KEY"\nbase_url = "http://proxy:1"\n'
    block = load(tmp_path, text).llm["r"]
    assert (block.api_key_env, block.base_url) == ("MY_KEY", "http://proxy:1")


def test_wire_config_full(tmp_path: Path):
    text = OK + (
        'system = "s"\neffort = "low"\nworker = "https://w.example/hook"\n'
        'signing_secret_env = "ONCALL_SIGNING_SECRET"\nsubagents = ["agent.researcher"]\n'
        "max_subagent_depth = 2\n"
        "retry = { default = { max_attempts = 2 }, tool = { run_timeout_secs = 30 } }\n"
        'tools = [{ name = "lookup", description = "Find it", '
        'input = { type = "object", properties = { token = { type = "string" } } } },'
        ' { name = "confirm", handler = "client" }]\n'
        '[agent.researcher]\nllm = "openrouter"\nmodel = "r"\ndescription = "Digs."\n'
        '[agent.hooked]\nworker = "http://localhost:4444"\n'
    )
    project = load(tmp_path, text)
    wire = project.agents["oncall"].wire_config(project)
    assert wire == {
        "model": "m",
        "llm": "openrouter",
        "system": "s",
        "effort": "low",
        "tools": [
            {
                "name": "lookup",
                "description": "Find it",
                "input": {"type": "object", "properties": {"token": {"type": "string"}}},
            },
            {"name": "confirm", "handler": "client"},
        ],
        "subagents": [{"id": "researcher", "description": "Digs."}],
        "max_subagent_depth": 2,
        "retry": {"default": {"max_attempts": 2}, "tool": {"run_timeout_secs": 30}},
    }
    AGENT_CONFIG.validate(wire)
    researcher = project.agents["researcher"].wire_config(project)
    assert researcher == {"model": "r", "llm": "openrouter", "max_subagent_depth": 5}
    AGENT_CONFIG.validate(researcher)
    # A worker-only agent gets its config from the worker at session.start.
    assert project.agents["hooked"].wire_config(project) is None
    # The wire dict is a copy: changing it leaves the declaration alone.
    wire["tools"][0]["name"] = "changed"
    assert project.agents["oncall"].tools[0]["name"] == "lookup"


def test_missing_env(tmp_path: Path):
    text = (
        '[llm.r]\ntype = "openrouter"\n[llm.r2]\ntype = "openrouter"\n'
        '[llm.unused]\ntype = "anthropic"\n[llm.w]\ntype = "worker"\n'
        '[agent.on-call]\nllm = "r"\nmodel = "m"\nworker = "http://localhost:1"\n'
        'signing_secret_env = "SIGN"\n[agent.on-call.slack]\n'
        '[agent.other]\nllm = "r2"\nmodel = "m"\n'
        '[agent.byo]\nllm = "w"\nmodel = "m"\n'
    )
    project = load(tmp_path, text)
    # Slack's variables are not among them: the engine runs without (Project.slack_off).
    assert project.missing_env({}) == [
        MissingEnv("OPENROUTER_API_KEY", "llm.r, llm.r2", "openrouter API key, used by on-call"),
        MissingEnv("SIGN", "on-call", "signs requests to the agent's worker"),
    ]
    full = {"OPENROUTER_API_KEY": "k", "SIGN": "s"}
    assert project.missing_env(full) == []
    # An empty variable is as good as unset.
    assert [m.var for m in project.missing_env({**full, "SIGN": ""})] == ["SIGN"]


def test_a_slack_app_is_off_without_its_variables_and_a_mistake_with_some(tmp_path: Path):
    text = (
        '[llm.r]\ntype = "openrouter"\n[agent.on-call]\nllm = "r"\nmodel = "m"\n'
        '[agent.on-call.slack]\n[agent.api]\nllm = "r"\nmodel = "m"\n'
    )
    project = load(tmp_path, text)  # `api` has no Slack block: nothing to say of it
    bot, app, secret = (f"SLACK_{v}_ON_CALL" for v in ("BOT_TOKEN", "APP_TOKEN", "SIGNING_SECRET"))
    assert project.slack_off({}) == [
        SlackOff(
            "on-call",
            f"Slack app on-call off: set {bot} and {app} (Socket Mode) or {secret} (HTTP)",
            partial=False,
        )
    ]
    assert project.slack_off({bot: "", app: "", secret: ""})[0].partial is False  # empty: unset
    assert project.slack_off({bot: "b", app: "a"}) == []
    assert project.slack_off({bot: "b", secret: "s"}) == []
    (alone,) = project.slack_off({bot: "b"})
    assert alone.partial and alone.why == (
        f"Slack app on-call off: {bot} is set, but neither {app} (Socket Mode) nor "
        f"{secret} (HTTP): set one"
    )
    for other in (app, secret):
        (headless,) = project.slack_off({other: "x"})
        assert headless.partial
        assert (
            headless.why == f"Slack app on-call off: {other} is set, but {bot} is not: set it too"
        )


def test_env_overrides_file(tmp_path: Path):
    text = (
        'redis = "redis://file:6379/0"\n[serve]\nhost = "0.0.0.0"\nport = 9000\n'
        "max_streams_per_key = 7\n"
    )
    project = load(tmp_path, text)
    assert (project.redis, project.serve) == (
        "redis://file:6379/0",
        ServeConfig("0.0.0.0", 9000, max_streams_per_key=7),
    )
    env = {
        "SUBS_REDIS": "redis://env:6380/1",
        "SUBS_PORT": "0",
        "SUBS_HOST": "127.0.0.2",
        "SUBS_MAX_STREAMS_PER_KEY": "1000",
    }
    project = load(tmp_path, text, env)
    assert (project.redis, project.serve) == (
        "redis://env:6380/1",
        ServeConfig("127.0.0.2", 0, max_streams_per_key=1000),
    )
    assert load(tmp_path, "").serve.max_streams_per_key == 100
    # Without a redis key the env still wins over the embedded default.
    assert load(tmp_path, "", {"SUBS_REDIS": "redis://env:1"}).redis == "redis://env:1"


@pytest.mark.parametrize(
    ("var", "value", "fragment"),
    [
        ("SUBS_PORT", "eighty", "expected a port number"),
        ("SUBS_PORT", "70000", "expected a port number"),
        ("SUBS_MAX_STREAMS_PER_KEY", "0", "expected a count of 1 or more"),
        ("SUBS_MAX_STREAMS_PER_KEY", "-5", "expected a count of 1 or more"),
        ("SUBS_REDIS", "localhost:6379", "redis://"),
    ],
)
def test_bad_env_override(tmp_path: Path, var: str, value: str, fragment: str):
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, OK, {var: value})
    assert (caught.value.file, caught.value.key) == ("environment", var)
    assert fragment in caught.value.message


def test_a_bad_url_is_named_without_its_password(tmp_path: Path):
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, OK, {"SUBS_REDIS": "http://user:hunter22@redis.internal:6379"})
    assert "hunter22" not in str(caught.value)
    assert "http://user:***@redis.internal:6379" in caught.value.message
    worker = '[agent.w]\nworker = "ftp://u:wpass99@w/d?token=tok99"\n'
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, worker)
    assert caught.value.key == "agent.w.worker"
    assert "wpass99" not in str(caught.value) and "tok99" not in str(caught.value)


def test_parse_project_and_missing_file(tmp_path: Path):
    project = parse_project(OK, "nowhere/subs.toml", env={})
    assert project.name == "nowhere"
    assert Path(project.path).is_absolute()
    missing = tmp_path / "absent.toml"
    with pytest.raises(ConfigError) as caught:
        load_project(missing, env={})
    assert (caught.value.file, caught.value.key) == (str(missing), "")


def test_slack_env_suffix():
    assert slack_env_suffix("oncall") == "ONCALL"
    assert slack_env_suffix("on-call_2") == "ON_CALL_2"


def test_max_subagent_depth_defaults_from_the_top_level(tmp_path):
    text = (
        "max_subagent_depth = 2\n"
        '[llm.o]\ntype = "openai"\n'
        '[agent.a]\nllm = "o"\nmodel = "m"\n'
        '[agent.b]\nllm = "o"\nmodel = "m"\nmax_subagent_depth = 0\n'
    )
    project = parse_project(text, str(tmp_path / "subs.toml"), env={})
    assert project.agents["a"].max_subagent_depth == 2
    assert project.agents["b"].max_subagent_depth == 0
    assert project.agents["b"].wire_config(project)["max_subagent_depth"] == 0


def test_mcp_connections_their_agents_and_what_check_lists(tmp_path: Path):
    text = OK + (
        'mcp = ["mcp.clock", { id = "mcp.tickets", tools = { read_only = true }, '
        'auth_failure = "degrade" }]\n'
        '[mcp.clock]\ncommand = ["clock-server", "--tz", "${CLOCK_TZ}"]\nenv = { A = "1" }\n'
        'env_from = ["CLOCK_KEY"]\ncwd = "ops"\n'
        '[mcp.tickets]\nurl = "https://t.example/mcp"\ntoken_env = "TICKETS_TOKEN"\n'
        'header = "X-Api-Key"\nprefix_tools = false\n'
    )
    project = load(tmp_path, text, {"OPENROUTER_API_KEY": "k"})
    clock, tickets = project.mcp["clock"], project.mcp["tickets"]
    assert clock.command == ("clock-server", "--tz", "${CLOCK_TZ}") and clock.url is None
    assert clock.argv({"CLOCK_TZ": "UTC"}) == ["clock-server", "--tz", "UTC"]
    assert clock.workdir({}, "/srv/p") == "/srv/p/ops"
    assert (tickets.header, tickets.prefix_tools) == ("X-Api-Key", False)
    wire = project.agents["oncall"].wire_config(project)
    assert wire is not None and wire["mcp"] == [
        {"id": "mcp.clock"},
        {"id": "mcp.tickets", "tools": {"read_only": True}, "auth_failure": "degrade"},
    ]
    AGENT_CONFIG.validate(wire)  # no url, command or token on the wire
    assert [(m.var, m.needed_by) for m in project.missing_env({"OPENROUTER_API_KEY": "k"})] == [
        ("CLOCK_KEY", "oncall"),
        ("TICKETS_TOKEN", "oncall"),
    ]
    assert clock.off_reason({}, str(tmp_path)) == "its command names CLOCK_TZ, which is not set"
    (tmp_path / "ops").mkdir()
    assert clock.off_reason({"CLOCK_TZ": "UTC"}, str(tmp_path)) == (
        "'clock-server' is not installed (not found on PATH)"
    )
    assert tickets.off_reason({}, str(tmp_path)) is None


def test_a_subagent_entry_may_set_the_mode_its_calls_use(tmp_path: Path):
    text = OK + (
        'subagents = ["agent.a", { id = "agent.b", mode = "detached" }, { id = "agent.c" }]\n'
        '[agent.a]\nllm = "openrouter"\nmodel = "r"\n'
        '[agent.b]\nllm = "openrouter"\nmodel = "r"\n'
        '[agent.c]\nllm = "openrouter"\nmodel = "r"\n'
    )
    project = load(tmp_path, text)
    wire = project.agents["oncall"].wire_config(project)
    assert wire is not None
    assert wire["subagents"] == [
        {"id": "a", "description": ""},
        {"id": "b", "description": "", "mode": "detached"},
        {"id": "c", "description": ""},
    ]
    AGENT_CONFIG.validate(wire)


def test_watch_entries_and_the_variable_naming_a_channel(tmp_path: Path):
    text = OK + (
        "[agent.oncall.slack]\nfollow = false\n"
        '[[agent.oncall.slack.watch]]\nchannel = "C0ALERTS"\nfrom = ["Alertmanager", "B0GRAF"]\n'
        'match = "FIRING"\n'
        '[[agent.oncall.slack.watch]]\nchannel = "${ONCALL_ALERTS_CHANNEL}"\n'
    )
    slack = load(tmp_path, text).agents["oncall"].slack
    assert slack is not None and slack.follow is False
    first, second = slack.watch
    assert (first.channel, first.posters, first.match) == (
        "C0ALERTS",
        ("Alertmanager", "B0GRAF"),
        "FIRING",
    )
    assert (second.posters, second.match, second.channel_var) == ((), None, "ONCALL_ALERTS_CHANNEL")
    assert second.channel_id({"ONCALL_ALERTS_CHANNEL": "C0X"}) == "C0X"
    assert second.channel_id({}) is None and first.channel_id({}) == "C0ALERTS"
    missing = load(tmp_path, text).missing_env({"OPENROUTER_API_KEY": "k"})
    assert [(m.var, m.needed_by) for m in missing] == [("ONCALL_ALERTS_CHANNEL", "oncall")]
    assert "watch.1" in missing[0].why


def test_approvers_allow_and_approve_load_and_bad_ids_are_named(tmp_path: Path):
    text = (
        '[llm.a]\ntype = "anthropic"\n[mcp.db]\nurl = "http://127.0.0.1:9/mcp"\n'
        '[agent.oncall]\nllm = "a"\nmodel = "m"\napprovers = ["U1ABC", "S0GROUP"]\n'
        'mcp = [{ id = "mcp.db", approve = "always" }]\n'
        '[agent.oncall.slack]\nallow = { teams = ["T1"], channels = ["C1"] }\nexternal = true\n'
    )
    agent = load(tmp_path, text).agents["oncall"]
    assert agent.approvers == ("U1ABC", "S0GROUP")
    assert agent.mcp == ({"id": "mcp.db", "approve": "always"},)
    assert agent.slack is not None
    assert (agent.slack.allow_teams, agent.slack.allow_channels, agent.slack.allow_users) == (
        ("T1",),
        ("C1",),
        (),
    )
    assert agent.slack.external is True
    with pytest.raises(ConfigError, match="approvers"):
        load(tmp_path, text.replace('"S0GROUP"', '"#oncall"'))
    with pytest.raises(ConfigError, match="approve"):
        load(tmp_path, text.replace('"always"', '"sometimes"'))


def test_the_alertmanager_hook_names_an_agent_with_a_slack_app_and_a_channel_id(
    tmp_path: Path,
):
    hook = '[hooks.alertmanager]\nagent = "oncall"\nchannel = "C0ALERTS"\n'
    project = load(tmp_path, OK + "[agent.oncall.slack]\n" + hook)
    assert project.alertmanager is not None
    assert (project.alertmanager.agent, project.alertmanager.channel) == ("oncall", "C0ALERTS")
    assert load(tmp_path, OK).alertmanager is None
    with pytest.raises(ConfigError) as caught:  # its app posts the threads: it needs one
        load(tmp_path, OK + hook)
    assert caught.value.key == "hooks.alertmanager.agent"
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, OK + "[agent.oncall.slack]\n" + hook.replace("C0ALERTS", "#alerts"))
    assert caught.value.key == "hooks.alertmanager.channel"
