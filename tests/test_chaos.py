"""bench/chaos.py works: a quick run SIGKILLs serves, and the redis-server once, mid-load
and finds every turn once.

Each run comes in two sizes: the default run has the small one (fewer serve kills, events
closer together: the same faults, mid-load, each of them at least once); `-m slow` runs
the bench's own `--quick` size.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.engine_helpers import ROOT


def figure(out: str, name: str) -> int:
    match = re.search(rf"^{re.escape(name)}: (\d+)", out, re.MULTILINE)
    assert match, f"no {name!r} line in:\n{out}"
    return int(match[1])


def chaos(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "chaos.py"), "--quick", *args],
        capture_output=True,
        text=True,
        timeout=timeout,  # SIGKILLs the script; its serves and Redis servers die with it
    )
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    return run


@pytest.mark.parametrize(
    "kills",
    [2, pytest.param(5, marks=pytest.mark.slow)],
    ids=["2 kills", "5 kills"],
)
def test_quick_chaos_with_serve_and_redis_kills_loses_and_repeats_no_turn(kills: int) -> None:
    gaps = ("--min-gap", "0.5", "--max-gap", "1.5") if kills < 5 else ()
    run = chaos("--kills", str(kills), *gaps, timeout=150)
    out = run.stdout
    assert out.startswith(f"chaos: 2 serves, 5 sessions, {kills} serve kills, 1 redis restarts"), (
        out
    )
    submitted = figure(out, "turns submitted")
    assert submitted > 0
    assert figure(out, "turns lost (never ended)") == 0
    assert figure(out, "duplicated") == 0
    assert figure(out, "snapshots that are not their log's fold") == 0
    ran = figure(out, "turns completed") + figure(out, "turns failed")
    assert ran >= submitted  # plus the unanswered submits that ran anyway
    handoff = r"^lease handoff after a serve kill: median [\d.]+ s"
    assert re.search(handoff, out, re.MULTILINE), out + run.stderr[-3000:]
    assert len(re.findall(r"SIGKILL serve", run.stderr)) == kills, run.stderr
    assert len(re.findall(r"SIGKILL redis-server", run.stderr)) == 1, run.stderr


@pytest.mark.parametrize(
    "gaps",
    [("--min-gap", "0.5", "--max-gap", "1"), pytest.param((), marks=pytest.mark.slow)],
    ids=["close together", "quick gaps"],
)
def test_quick_chaos_on_a_cluster_with_a_serve_kill_and_master_failovers(
    gaps: tuple[str, ...],
) -> None:
    """Two serves on a 3+3 Redis Cluster: one serve SIGKILLed, one master failed over
    gracefully and one SIGKILLed (its replica promoted), mid-load."""
    run = chaos(
        *("--cluster", "--sessions", "6", "--kills", "1", "--redis-restarts", "2", *gaps),
        timeout=170,
    )
    out = run.stdout
    assert out.startswith(
        "chaos: 2 serves, 6 sessions, 1 serve kills, 2 master failovers on a cluster"
    ), out
    assert figure(out, "turns submitted") > 0
    assert figure(out, "turns lost (never ended)") == 0
    assert figure(out, "duplicated") == 0
    assert figure(out, "snapshots that are not their log's fold") == 0
    assert "masters holding sessions: 3 of 3" in out, out
    assert len(re.findall(r"SIGKILL serve", run.stderr)) == 1, run.stderr
    assert len(re.findall(r"CLUSTER FAILOVER of master", run.stderr)) == 1, run.stderr
    assert len(re.findall(r"SIGKILL master", run.stderr)) == 1, run.stderr
