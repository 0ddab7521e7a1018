"""bench/chaos.py works: a quick run SIGKILLs serves, and the redis-server once, mid-load
and finds every turn once."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.engine_helpers import ROOT


def figure(out: str, name: str) -> int:
    match = re.search(rf"^{re.escape(name)}: (\d+)", out, re.MULTILINE)
    assert match, f"no {name!r} line in:\n{out}"
    return int(match[1])


def test_quick_chaos_with_serve_and_redis_kills_loses_and_repeats_no_turn() -> None:
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "chaos.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=150,  # SIGKILLs the script; its serves and redis-server die with it
    )
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    out = run.stdout
    assert out.startswith("chaos: 2 serves, 5 sessions, 5 serve kills, 1 redis restarts"), out
    submitted = figure(out, "turns submitted")
    assert submitted > 0
    assert figure(out, "turns lost (never ended)") == 0
    assert figure(out, "duplicated") == 0
    assert figure(out, "snapshots that are not their log's fold") == 0
    ran = figure(out, "turns completed") + figure(out, "turns failed")
    assert ran >= submitted  # plus the unanswered submits that ran anyway
    assert re.search(r"^lease handoff after a serve kill: median [\d.]+ s", out, re.MULTILINE), out
    assert len(re.findall(r"SIGKILL serve", run.stderr)) == 5, run.stderr
    assert len(re.findall(r"SIGKILL redis-server", run.stderr)) == 1, run.stderr


def test_quick_chaos_on_a_cluster_with_a_serve_kill_and_master_failovers() -> None:
    """Two serves on a 3+3 Redis Cluster: one serve SIGKILLed, one master failed over
    gracefully and one SIGKILLed (its replica promoted), mid-load."""
    run = subprocess.run(
        [
            *(sys.executable, str(ROOT / "bench" / "chaos.py"), "--quick", "--cluster"),
            *("--sessions", "6", "--kills", "1", "--redis-restarts", "2"),
        ],
        capture_output=True,
        text=True,
        timeout=170,  # SIGKILLs the script; its serves and cluster nodes die with it
    )
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
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
