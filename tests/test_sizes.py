"""The house's size bounds (#24 item 4), read from the source with `ast`:

- no class over CLASS_LINES lines: a class past that holds two ideas, and its seams are
  where to cut it;
- no module over MODULE_LINES lines unless its docstring says why in a paragraph that
  starts with REASON (a catalogue that mirrors a schema, one definition each, is long
  because what it mirrors is).

Checked over the product (`engine/`, `bot/`, `subs/`) and the fakes of outside services
(`tests/fakes/`), which are read as closely as the code they stand in for. A class is
counted from its `class` line to its last line, decorators aside.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SIZED = ("engine", "bot", "subs", "tests/fakes")
CLASS_LINES = 300
MODULE_LINES = 500
REASON = "Why one module:"


def oversized(source: str) -> list[str]:
    """What in `source` (one module's text) is past a bound, a line each."""
    tree = ast.parse(source)
    found = [
        f"class {node.name}: {length} lines (> {CLASS_LINES})"
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        and (length := (node.end_lineno or node.lineno) - node.lineno + 1) > CLASS_LINES
    ]
    lines = len(source.splitlines())
    if lines > MODULE_LINES and not _gives_a_reason(ast.get_docstring(tree) or ""):
        found.append(f"module: {lines} lines (> {MODULE_LINES}) and no '{REASON}' paragraph")
    return found


def _gives_a_reason(docstring: str) -> bool:
    """A paragraph of the docstring starts with REASON and goes on to say something."""
    for paragraph in docstring.split("\n\n"):
        text = " ".join(paragraph.split())
        if text.startswith(REASON) and len(text.removeprefix(REASON).split()) >= 8:
            return True
    return False


def test_no_class_or_module_past_its_bound() -> None:
    files = sorted(p for folder in SIZED for p in (ROOT / folder).rglob("*.py"))
    assert len(files) > 100, f"only {len(files)} files under {SIZED} from {ROOT}"
    found = {
        p.relative_to(ROOT).as_posix(): lines for p in files if (lines := oversized(p.read_text()))
    }
    assert not found, f"past the size bounds (split along a seam, or say why): {found}"


def _lines(n: int) -> str:
    return "".join(f"x{i} = {i}\n" for i in range(n))


def _class(name: str, body_lines: int) -> str:
    return f"class {name}:\n" + "".join(f"    a{i} = {i}\n" for i in range(body_lines))


WHY = "Why one module: the wire models mirror the schema, one definition each, in its order."


@pytest.mark.parametrize(
    ("source", "found"),
    [
        (_class("Big", CLASS_LINES), ["class Big: 301 lines (> 300)"]),
        (_class("Fits", CLASS_LINES - 1), []),
        # A nested class is a class too.
        (
            "class Outer:\n"
            + "".join(f"    {line}\n" for line in _class("Inner", CLASS_LINES).splitlines()),
            ["class Outer: 302 lines (> 300)", "class Inner: 301 lines (> 300)"],
        ),
        (
            _lines(MODULE_LINES + 1),
            ["module: 501 lines (> 500) and no 'Why one module:' paragraph"],
        ),
        (_lines(MODULE_LINES), []),
        (f'"""Wire models.\n\n{WHY}\n"""\n' + _lines(MODULE_LINES), []),
        # The reason is the docstring's, not a comment's; and it must say something.
        (
            f"# {WHY}\n" + _lines(MODULE_LINES),
            ["module: 501 lines (> 500) and no 'Why one module:' paragraph"],
        ),
        (
            '"""Wire models.\n\nWhy one module: it is long.\n"""\n' + _lines(MODULE_LINES),
            ["module: 504 lines (> 500) and no 'Why one module:' paragraph"],
        ),
        # A reason excuses a long module, never a long class.
        (
            f'"""Wire models.\n\n{WHY}\n"""\n' + _class("Big", CLASS_LINES) + _lines(300),
            ["class Big: 301 lines (> 300)"],
        ),
    ],
)
def test_the_size_rule_sees_each_breach(source: str, found: list[str]) -> None:
    assert oversized(source) == found
