"""CI runs what the README tells a contributor to run: one command, in both places."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme_command() -> str:
    section = (ROOT / "README.md").read_text().split("## Test it", 1)[1]
    found = re.search(r"```sh\n(.+?)\n```", section, re.S)
    assert found, "README's Test it section has no sh block"
    return found.group(1).strip()


def test_ci_runs_exactly_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == _readme_command()


def test_the_test_command_type_checks_and_lints_before_the_tests() -> None:
    steps = [s.strip() for s in _readme_command().split("&&")]
    assert steps[-3:] == [".venv/bin/ruff check", ".venv/bin/mypy", ".venv/bin/pytest -q"]
