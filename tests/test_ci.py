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


def test_the_test_command_type_checks_lints_and_checks_the_format_before_the_tests() -> None:
    steps = [s.strip() for s in _readme_command().split("&&")]
    assert steps[-4:-1] == [
        ".venv/bin/ruff check",
        ".venv/bin/ruff format --check",
        ".venv/bin/mypy",
    ]
    assert steps[-1].startswith(".venv/bin/pytest -q")


def test_the_suite_runs_in_two_workers_with_xdist_pinned() -> None:
    """The default run in two pytest-xdist workers (README "Test it" says why two), with
    the plugin in the test extra at a version that has `--dist worksteal`."""
    assert _readme_command().split("&&")[-1].split() == [
        ".venv/bin/pytest",
        "-q",
        "-n",
        "2",
        "--dist",
        "worksteal",
    ]
    extra = (ROOT / "pyproject.toml").read_text().split("test = [", 1)[1].split("]", 1)[0]
    assert '"pytest-xdist>=' in extra, extra
