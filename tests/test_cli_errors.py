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
class Case:
    name: str
    args: Callable[[Path, int], list[str]]  # (config, a closed port) -> argv
    status: int
    words: tuple[str, ...]  # each must appear in the output
    env: dict[str, str] = field(default_factory=dict)


def _c(config: Path) -> list[str]:
    return ["-c", str(config)]


CLIENT_INPUT_WITHOUT_MESSAGE = json.dumps({"type": "client.message"})

CASES = [
    Case(
        "run --url to a closed port",
        lambda cfg, port: ["run", "ops_openai", "hi", "--url", f"http://127.0.0.1:{port}"],
        1,
        ("cannot reach http://127.0.0.1:", "is an engine serving there"),
    ),
    Case(
        "--url without http://",
        lambda cfg, port: ["run", "ops_openai", "hi", "--url", "127.0.0.1:8080"],
        2,
        ("--url must start with http://", "--url http://127.0.0.1:8080"),
    ),
    Case(
        "sessions list --url without http://",
        lambda cfg, port: ["sessions", "list", "--url", "localhost:8080"],
        2,
        ("--url must start with http://",),
    ),
    Case(
        "serve with --redis pointing nowhere",
        lambda cfg, port: [
            "serve",
            *_c(cfg),
            "--port",
            "0",
            "--redis",
            f"redis://127.0.0.1:{port}",
        ],
        1,
        ("cannot reach Redis at redis://127.0.0.1:", "start it, or fix --redis"),
    ),
    Case(
        "serve with --redis that is no URL",
        lambda cfg, port: ["serve", *_c(cfg), "--port", "0", "--redis", "nowhere"],
        2,
        ("--redis must be a redis://", "e.g. --redis redis://"),
    ),
    Case(
        "sessions list on a Redis that is not there",
        lambda cfg, port: ["sessions", "list", *_c(cfg), "--redis", f"redis://127.0.0.1:{port}"],
        1,
        ("cannot reach Redis",),
    ),
    Case(
        "SUBS_LOG in lower case works",
        lambda cfg, port: ["sessions", "list", *_c(cfg), "-o", "jsonl"],
        0,
        (),
        env={"SUBS_LOG": "info"},
    ),
    Case(
        "SUBS_LOG that is no level",
        lambda cfg, port: ["sessions", "list", *_c(cfg)],
        2,
        ("SUBS_LOG='loud' is not a level", "INFO"),
        env={"SUBS_LOG": "loud"},
    ),
    Case(
        "--input that is not JSON",
        lambda cfg, port: ["run", "ops_openai", *_c(cfg), "--input", "{not json"],
        2,
        ("--input is not JSON", "e.g. --input '{"),
    ),
    Case(
        "--input that is no ClientInput, in process",
        lambda cfg, port: ["run", "ops_openai", *_c(cfg), "--input", CLIENT_INPUT_WITHOUT_MESSAGE],
        2,
        ("--input: input.message: required field is missing",),
    ),
    Case(
        "--input that is a list",
        lambda cfg, port: ["run", "ops_openai", *_c(cfg), "--input", "[1]"],
        2,
        ("--input must be a JSON object",),
    ),
    Case(
        "a bad SUBS_API_KEYS entry",
        lambda cfg, port: ["serve", *_c(cfg), "--port", "0"],
        2,
        ("SUBS_API_KEYS entry 2: empty", "separate keys with single commas"),
        env={"SUBS_API_KEYS": "k1,,k2"},
    ),
    Case(
        "SUBS_LEASE_MS that is no number",
        lambda cfg, port: ["run", "ops_openai", "hi", *_c(cfg)],
        2,
        ("SUBS_LEASE_MS must be a whole number",),
        env={"SUBS_LEASE_MS": "soon"},
    ),
    Case(
        "a mistyped --session",
        lambda cfg, port: ["run", "ops_openai", "hi", *_c(cfg), "--session", "ses_typo"],
        1,
        ("no session 'ses_typo'", "leave out --session to start a new one"),
    ),
    Case(
        "cancel of an unknown session",
        lambda cfg, port: ["sessions", "cancel", "ses_typo", *_c(cfg)],
        1,
        ("session 'ses_typo' does not exist",),
    ),
    Case(
        "delete of an unknown session",
        lambda cfg, port: ["sessions", "delete", "ses_typo", *_c(cfg)],
        1,
        ("session 'ses_typo' does not exist",),
    ),
    Case(
        "run with neither message nor --input",
        lambda cfg, port: ["run", "ops_openai", *_c(cfg)],
        2,
        ("give a message or --input",),
    ),
    Case(
        "a missing argument",
        lambda cfg, port: ["run"],
        2,
        ("the following arguments are required: agent", "see 'subs run --help'"),
    ),
    Case("--version", lambda cfg, port: ["--version"], 0, ("subs 0.",)),
]


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_each_mistake_is_one_line_with_its_fix(case: Case, config: Path, closed_port: int):
    code, out, err = await subs(*case.args(config, closed_port), env=case.env)
    output = out + err
    assert "Traceback" not in output, output
    assert code == case.status, output
    for words in case.words:
        assert words in output, output
    if case.status:
        assert len(err.strip().splitlines()) == 1, err


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
