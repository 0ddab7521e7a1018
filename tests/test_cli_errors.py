"""Every mistake a person makes with `subs` is one line naming it and the fix: the real
command in a process, one row per mistake, each checked for its exit status, for the
words that name the problem, and for the absence of a traceback."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.engine_helpers import ROOT, subs


@dataclass(frozen=True)
class At:
    """What a row's command line may name."""

    config: Path  # two agents, ops_openai and ops_anthropic, neither in Slack
    closed_port: int  # a loopback port nothing listens on
    api: str  # a running `subs serve`'s URL, for rows with `serve` set; else ""


@dataclass(frozen=True)
class Case:
    name: str
    args: Callable[[At], list[str]]
    status: int
    words: tuple[str, ...]  # each must appear in the output
    env: dict[str, str] = field(default_factory=dict)
    absent: tuple[str, ...] = ()  # none may appear in the output
    serve: bool = False  # start a `subs serve` on the test's Redis for it
    stderr_lines: int | None = None  # default: one for a failure, any for a success


def _c(config: Path) -> list[str]:
    return ["-c", str(config)]


EXAMPLE = ["-c", str(ROOT / "subs.toml")]  # the shipped example: oncall, with a Slack block
NO_SLACK = {f"SLACK_{v}_ONCALL": "" for v in ("BOT_TOKEN", "APP_TOKEN", "SIGNING_SECRET")}


CLIENT_INPUT_WITHOUT_MESSAGE = json.dumps({"type": "client.message"})
USER_MESSAGE_WITHOUT_CONTENT = json.dumps({"type": "client.message", "message": {"role": "user"}})

CASES = [
    Case(
        "run --url to a closed port",
        lambda at: ["run", "ops_openai", "hi", "--url", f"http://127.0.0.1:{at.closed_port}"],
        1,
        ("cannot reach http://127.0.0.1:", "is an engine serving there"),
    ),
    Case(
        "--url without http://",
        lambda at: ["run", "ops_openai", "hi", "--url", "127.0.0.1:8080"],
        2,
        ("--url must start with http://", "--url http://127.0.0.1:8080"),
    ),
    Case(
        "sessions list --url without http://",
        lambda at: ["sessions", "list", "--url", "localhost:8080"],
        2,
        ("--url must start with http://",),
    ),
    Case(
        "serve with --redis pointing nowhere",
        lambda at: [
            "serve",
            *_c(at.config),
            "--port",
            "0",
            "--redis",
            f"redis://127.0.0.1:{at.closed_port}",
        ],
        1,
        ("cannot reach Redis at redis://127.0.0.1:", "start it, or fix --redis"),
    ),
    Case(
        "serve with --redis that is no URL",
        lambda at: ["serve", *_c(at.config), "--port", "0", "--redis", "nowhere"],
        2,
        ("--redis must be a redis://", "e.g. --redis redis://"),
    ),
    Case(
        "sessions list on a Redis that is not there",
        lambda at: [
            "sessions",
            "list",
            *_c(at.config),
            "--redis",
            f"redis://127.0.0.1:{at.closed_port}",
        ],
        1,
        ("cannot reach Redis",),
    ),
    Case(
        "SUBS_LOG in lower case works",
        lambda at: ["sessions", "list", *_c(at.config), "-o", "jsonl"],
        0,
        (),
        env={"SUBS_LOG": "info"},
    ),
    Case(
        "SUBS_LOG that is no level",
        lambda at: ["sessions", "list", *_c(at.config)],
        2,
        ("SUBS_LOG='loud' is not a level", "INFO"),
        env={"SUBS_LOG": "loud"},
    ),
    Case(
        "--input that is not JSON",
        lambda at: ["run", "ops_openai", *_c(at.config), "--input", "{not json"],
        2,
        ("--input is not JSON", "e.g. --input '{"),
    ),
    Case(
        "--input that is no ClientInput, in process",
        lambda at: ["run", "ops_openai", *_c(at.config), "--input", CLIENT_INPUT_WITHOUT_MESSAGE],
        2,
        ("--input: input.message: required field is missing",),
    ),
    Case(
        "--input whose user message has no content, before --url is reached",
        lambda at: [
            "run",
            "ops_openai",
            "--url",
            f"http://127.0.0.1:{at.closed_port}",
            "--input",
            USER_MESSAGE_WITHOUT_CONTENT,
        ],
        2,
        ("--input: input.message.content: a user message needs content",),
    ),
    Case(
        "--input that is a list",
        lambda at: ["run", "ops_openai", *_c(at.config), "--input", "[1]"],
        2,
        ("--input must be a JSON object",),
    ),
    Case(
        "a bad SUBS_API_KEYS entry",
        lambda at: ["serve", *_c(at.config), "--port", "0"],
        2,
        ("SUBS_API_KEYS entry 2: empty", "separate keys with single commas"),
        env={"SUBS_API_KEYS": "k1,,k2"},
    ),
    Case(
        "SUBS_LEASE_MS that is no number",
        lambda at: ["run", "ops_openai", "hi", *_c(at.config)],
        2,
        ("SUBS_LEASE_MS must be a whole number",),
        env={"SUBS_LEASE_MS": "soon"},
    ),
    Case(
        "a mistyped --session",
        lambda at: ["run", "ops_openai", "hi", *_c(at.config), "--session", "ses_typo"],
        1,
        ("no session 'ses_typo'", "leave out --session to start a new one"),
    ),
    Case(
        "cancel of an unknown session",
        lambda at: ["sessions", "cancel", "ses_typo", *_c(at.config)],
        1,
        ("session 'ses_typo' does not exist",),
    ),
    Case(
        "delete of an unknown session",
        lambda at: ["sessions", "delete", "ses_typo", *_c(at.config)],
        1,
        ("session 'ses_typo' does not exist",),
    ),
    Case(
        "run with neither message nor --input",
        lambda at: ["run", "ops_openai", *_c(at.config)],
        2,
        ("give a message or --input",),
    ),
    Case(
        "a missing argument",
        lambda at: ["run"],
        2,
        ("the following arguments are required: agent", "see 'subs run --help'"),
    ),
    Case("--version", lambda at: ["--version"], 0, ("subs 0.",)),
    Case(
        "serve --port past 65535",
        lambda at: ["serve", *_c(at.config), "--port", "99999"],
        2,
        ("argument --port: expected a whole number from 0 to 65535, got '99999'",),
    ),
    Case(
        "serve --port below 0",
        lambda at: ["serve", *_c(at.config), "--port", "-1"],
        2,
        ("argument --port: expected a whole number from 0 to 65535, got '-1'",),
        absent=("host",),
    ),
    Case(
        "manifest --url that is not https",
        lambda at: ["manifest", "oncall", *EXAMPLE, "--url", "http://x"],
        0,
        ("Slack only calls public https URLs, and --url http://x is not one",),
        absent=("pass --url",),
        stderr_lines=1,
    ),
    Case(
        "an unknown agent, in process",
        lambda at: ["run", "nosuch", "hi", *_c(at.config)],
        2,
        ("no agent 'nosuch'", "declared: ops_anthropic, ops_openai"),
    ),
    Case(
        "an unknown agent, over --url",
        lambda at: ["run", "nosuch", "hi", "--url", at.api],
        2,
        ("no agent 'nosuch'", "declared: ops_anthropic, ops_openai"),
        serve=True,
    ),
    Case(
        "sessions list --limit below 1",
        lambda at: ["sessions", "list", *_c(at.config), "--limit", "-3"],
        2,
        ("argument --limit: expected a whole number of at least 1, got '-3'",),
    ),
    Case(
        "sessions dead --limit 0",
        lambda at: ["sessions", "dead", *_c(at.config), "--limit", "0"],
        2,
        ("argument --limit: expected a whole number of at least 1, got '0'",),
    ),
    Case(
        "sessions events --from below 0",
        lambda at: ["sessions", "events", "ses_x", *_c(at.config), "--from", "-1"],
        2,
        ("argument --from: expected a whole number of at least 0, got '-1'",),
    ),
    Case(
        "check of an API-only set-up: no Slack variables is a note",
        lambda at: ["check", *EXAMPLE],
        0,
        (
            "Slack app oncall off: set SLACK_BOT_TOKEN_ONCALL and SLACK_APP_TOKEN_ONCALL "
            "(Socket Mode) or SLACK_SIGNING_SECRET_ONCALL (HTTP)",
            '"partial": false',
        ),
        env={"OPENROUTER_API_KEY": "k", **NO_SLACK},
        absent=('"missing"',),
    ),
    Case(
        "check of a Slack app with a bot token alone",
        lambda at: ["check", *EXAMPLE],
        1,
        (
            "Slack app oncall off: SLACK_BOT_TOKEN_ONCALL is set, but neither "
            "SLACK_APP_TOKEN_ONCALL (Socket Mode) nor SLACK_SIGNING_SECRET_ONCALL (HTTP): set one",
            '"partial": true',
        ),
        env={"OPENROUTER_API_KEY": "k", **NO_SLACK, "SLACK_BOT_TOKEN_ONCALL": "xoxb-1"},
        stderr_lines=0,  # check's findings are its output, on stdout
    ),
    Case(
        "check of a Slack app with a signing secret alone",
        lambda at: ["check", *EXAMPLE],
        1,
        ("SLACK_SIGNING_SECRET_ONCALL is set, but SLACK_BOT_TOKEN_ONCALL is not: set it too",),
        env={"OPENROUTER_API_KEY": "k", **NO_SLACK, "SLACK_SIGNING_SECRET_ONCALL": "s3cr3t"},
        stderr_lines=0,
    ),
]


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_each_mistake_is_one_line_with_its_fix(
    case: Case, config: Path, closed_port: int, serve_processes
):
    api = (await serve_processes()).api if case.serve else ""
    code, out, err = await subs(*case.args(At(config, closed_port, api)), env=case.env)
    output = out + err
    assert "Traceback" not in output, output
    assert code == case.status, output
    for words in case.words:
        assert words in output, output
    for words in case.absent:
        assert words not in output, output
    lines = case.stderr_lines if case.stderr_lines is not None else (1 if case.status else None)
    if lines is not None:
        assert len(err.strip().splitlines()) == lines, err


@pytest.fixture
def port_in_use() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


async def test_serve_on_a_port_in_use(config: Path, port_in_use: int):
    code, _, err = await subs("serve", "-c", str(config), "--port", str(port_in_use))
    assert code == 1 and "Traceback" not in err, err
    assert f"cannot listen on 127.0.0.1:{port_in_use}: the port is in use" in err
    assert "--port 0 picks a free one" in err


async def test_serve_where_the_embedded_redis_cannot_keep_its_data(config: Path):
    """`.subs` cannot be made (here a file has its name; a read-only folder, which root
    would not notice, fails alike)."""
    (config.parent / ".subs").write_text("not a folder")
    code, _, err = await subs("serve", "-c", str(config), "--port", "0")
    assert code == 1 and "Traceback" not in err, err
    assert f"cannot use {config.parent / '.subs'} for the embedded Redis" in err
    assert "--redis or SUBS_REDIS" in err


SUBCOMMANDS = [
    ["run"],
    ["chat"],
    ["check"],
    ["serve"],
    ["manifest"],
    ["sessions"],
    ["sessions", "list"],
    ["sessions", "dead"],
    ["sessions", "events"],
    ["sessions", "cancel"],
    ["sessions", "delete"],
]


@pytest.mark.parametrize("command", SUBCOMMANDS, ids=" ".join)
def test_each_help_says_what_the_command_does_with_an_example(command: list[str]):
    done = subprocess.run(
        [sys.executable, "-m", "engine.cli", *command, "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=30,
        check=True,
    )
    description = done.stdout.split("\n\n")[1]
    assert len(description.split()) >= 3, done.stdout
    examples = done.stdout.split("examples:\n")[1]
    assert f"subs {' '.join(command)}" in examples, done.stdout


def test_help_loads_neither_the_slack_stack_nor_the_engine():
    """`subs --help` used to import Slack's SDK (0.9 s); parsing imports nothing heavy."""
    probe = (
        "import sys\nfrom engine.cli import main\n"
        "try:\n    main(['run', '--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('slack_bolt', 'slack_sdk', 'redis', 'aiohttp',"
        " 'engine.runtime.engine')"
        " if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_a_command_leaves_its_imports_out_of_the_collections_at_exit():
    """The interpreter's collections at exit walk every object the SDKs' imports made:
    0.5-1 s per `subs` run (a serve's SIGTERM, every CLI call) unless the heap is frozen."""
    probe = (
        "import atexit, gc, sys\nfrom engine.cli import main\n"
        "atexit.register(lambda: print('frozen', gc.get_freeze_count()))\n"
        "sys.exit(main(['sessions', 'list', '--url', sys.argv[1]]))"
    )
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"  # nothing listens: exit 1
    done = subprocess.run(
        [sys.executable, "-c", probe, url], capture_output=True, text=True, cwd=ROOT, timeout=30
    )
    assert done.returncode == 1, done.stderr
    assert int(done.stdout.split("frozen ")[-1]) > 0, done.stdout  # 0: nothing was frozen
