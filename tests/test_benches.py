"""Every script in bench/ runs once, tiny, as a subprocess: it exits 0 and prints its figures.

No figure is held to a bound: at this size, on a shared machine, they are noise. What
this catches is a bench that no longer runs against today's engine, or stopped printing
what the README says it prints. A bench's own checks (turns lost, schema errors, the
vendor's request count) still fail it. A new bench must add its tiny run here.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engine_helpers import ROOT

BENCH = ROOT / "bench"
NUMBER = r"[\d.]+"
LANGGRAPH = importlib.util.find_spec("langgraph") is not None

# script -> (tiny arguments, patterns its stdout must match, each at the start of a line)
TINY: dict[str, tuple[str, list[str]]] = {
    "step_overhead.py": (
        "--sessions 2 --turns 2 --repeat 1",
        [
            r"median of 1 repeats",
            rf"  step overhead \(engine apply\+commit\): median {NUMBER} ms",
            rf"  throughput: {NUMBER} steps/s",
            rf"  engine cpu \(its own thread; target <= 0\.5 ms\): {NUMBER} ms per step",
            rf"  Redis round trips per step, engine: {NUMBER} \(.*evalsha {NUMBER}",
            rf"  Redis round trips per step, clients: {NUMBER} \(",
            rf"  Redis commands run per step \(INFO commandstats.*\): {NUMBER} \(.*evalsha",
        ],
    ),
    "worker_decisions.py": (
        "--sessions 2 --turns 2 --solo-sessions 1 --solo-turns 2 --repeat 1",
        [
            rf"  decision round-trip overhead \(engine side\): median {NUMBER} ms",
            rf"  throughput: {NUMBER} decisions/s",
        ],
    ),
    "api_stream.py": (
        (
            "--repeat 1 --latency-sessions 1 --latency-turns 1 --tokens 3 --token-delay-ms 1 "
            "--sessions 1 --watchers 2 --load-tokens 3 --warmup 0.5 --window 1"
        ),
        [
            rf"token latency, median of 1 repeats .*: median {NUMBER} ms, p99 {NUMBER} ms",
            rf"fan-out, 2 watchers .*: {NUMBER} frames/s",
        ],
    ),
    "stream_reuse.py": (
        "--calls 10 --rounds 1",
        [
            rf"  drain: cpu {NUMBER} ms/call, wall {NUMBER} ms/call, "
            rf"1 connections per {NUMBER} calls"
        ],
    ),
    "slack_stream.py": (
        "--threads 1 --seconds 1 --chunks 3 --chunk-ms 5",
        [rf"1 thread .*first visible text median {NUMBER} ms.*updates of a reply every"],
    ),
    "slack_storm.py": (
        "--n 6 --limits 2 --latency 0.05",
        [
            rf"N=6 max_concurrent_turns=2: ack max {NUMBER} s; first reply {NUMBER} s, "
            rf"last reply {NUMBER} s; max model calls in flight [12] \(model call median "
            rf"{NUMBER} s\); Web API calls \d+ \(.*429s \d+\)"
        ],
    ),
    "chaos.py": (
        (
            "--serves 2 --sessions 2 --kills 1 --redis-restarts 0 --min-gap 0.5 --max-gap 0.5 "
            "--drain 20 --turns-per-session 2 --lease-ms 1000"
        ),
        [
            r"turns submitted: [1-9]\d*",
            r"turns lost \(never ended\): 0",
            r"duplicated: 0",
            rf"lease handoff after a serve kill: median {NUMBER} s",
        ],
    ),
    "cluster.py": (
        "--redis cluster --serves 2 --sessions 2 --turns 2 --repeat 1 --wait-replicas 1",
        [
            rf"cluster: 2 serves, 2 sessions x 2 turns, 16 partitions, wait_replicas 1: "
            rf"median {NUMBER} turns/s"
        ],
    ),
    "vs_langgraph.py": (
        "--sessions 2 --turns 2 --repeat 1",
        [
            r"2 sessions x 2 turns, 1 repeat",
            *(
                rf"  {row} +{NUMBER} +{NUMBER} +{NUMBER} +{NUMBER} +{NUMBER} +{NUMBER}"
                for row in (
                    r"HTTP calls alone \(aiohttp\)",
                    r"subs, engine decides \(client tool\)",
                    r"subs, HTTP worker decides \(worker tool\)",
                )
            ),
            *(
                [
                    rf"  LangGraph {NUMBER} \+ AsyncSqliteSaver +{NUMBER}",
                    rf"  subs, engine decides \(client tool\) / LangGraph: turns/s {NUMBER}x",
                    rf"  subs, HTTP worker decides \(worker tool\) / LangGraph: turns/s {NUMBER}x",
                ]
                if LANGGRAPH
                else [r"  LangGraph not measured: .*\[bench\]"]
            ),
        ],
    ),
    "console_list.py": (
        "--sessions 12 --repeat 1",
        [
            r"console list: 12 sessions made in [\d.]+ s; median of 1 requests each",
            *(
                rf"  {what} +{NUMBER} ms  {rows} rows  \d+ bytes"
                for what, rows in (
                    ("first page", 12),
                    ("agent filter", 6),
                    ("status=failed", 2),
                    ("status=running", 0),
                )
            ),
            rf"  /console +{NUMBER} ms  \d+ bytes",
        ],
    ),
    "cli_start.py": (
        "--runs 1",
        [
            r"cli start: median of 1 runs, wall ms \(median, slowest\)",
            *(
                rf"  {what} +{NUMBER} +{NUMBER}"
                for what in (
                    r"python -c pass \(floor\)",
                    "subs --version",
                    "subs --help",
                    r"subs sessions list --url",
                    "subs sessions list",
                    r"subs serve \(to its line\)",
                )
            ),
        ],
    ),
    "retention.py": (
        "--sessions 5 --turns 1 --words 5 --load-turns 4",
        [
            r"retention: one on-call session, 1 turns \(5-word answers\)",
            *(rf"  {kind} +\d+ bytes +{NUMBER} per turn" for kind in ("log", "snapshot", "deltas")),
            rf"  rate: {NUMBER} sessions/s",
            rf"  archive on disk: {NUMBER} bytes per session",
            rf"  Redis used_memory: empty {NUMBER} MB, full {NUMBER} MB, "
            rf"after the sweep {NUMBER} MB",
            rf"load: 4 on-call turns over 4 sessions at once: {NUMBER} turns/s alone, "
            rf"{NUMBER} turns/s while the sweep ran",
        ],
    ),
    "prompt_cache.py": (
        "--turns 2 --tool-every 2",
        [
            r"prompt cache: the example agent \(anthropic/claude-sonnet-4-5 on OpenRouter, "
            r"fake\), 2 turns, a tool call every 2",
            rf"  +1 +\d+ +0 +[1-9]\d* +\${NUMBER} +\${NUMBER}",
            rf"  +2 +\d+ +[1-9]\d* +\d+ +\${NUMBER} +\${NUMBER}",
            rf"  total: \${NUMBER} cached, \${NUMBER} uncached: \d+% saved; \d+% of input read",
            r"  tools offered: \d+ \(.*confirm.*\)",
            rf"  turn 2: \${NUMBER} against turn 1's \${NUMBER}; breakpoints on system, "
            r"messages\[2\] \(assistant\), messages\[3\] \(user\)",
        ],
    ),
    "history.py": (
        "--turns 6 --tool-every 3",
        [
            r"history: one session, 6 turns \(a tool call every 3 turns\)",
            rf"  turn time, ms \(target: ratio <= 1\.5x\) +{NUMBER} +{NUMBER} +{NUMBER}x",
            rf"  written to Redis per step, KB +{NUMBER} +{NUMBER} +{NUMBER}x",
            rf" +6-6 +16 +{NUMBER} +4 +{NUMBER}",  # the last turn: a tool call, 16 messages
        ],
    ),
}


def run_bench(script: str, args: str, env: dict[str, str] | None = None) -> str:
    """Runs one bench; on a timeout SIGTERM (it cleans up), then SIGKILL. Returns stdout."""
    proc = subprocess.Popen(
        [sys.executable, str(BENCH / script), *args.split()],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        pytest.fail(f"{script} ran past 120 s:\n{out}\n{err[-3000:]}")
    assert proc.returncode == 0, f"{script} exited {proc.returncode}:\n{out}\n{err[-3000:]}"
    return out


def assert_printed(out: str, patterns: list[str]) -> None:
    for pattern in patterns:
        assert re.search(f"^{pattern}", out, re.MULTILINE), f"no line {pattern!r} in:\n{out}"


def test_every_bench_has_a_tiny_run() -> None:
    scripts = {p.name for p in BENCH.glob("*.py") if '__name__ == "__main__"' in p.read_text()}
    assert scripts == set(TINY)


@pytest.mark.parametrize("script", sorted(TINY))
def test_bench_runs_tiny_and_prints_its_figures(script: str) -> None:
    args, patterns = TINY[script]
    assert_printed(run_bench(script, args), patterns)


def test_vs_langgraph_without_langgraph_runs_subs_and_says_why(tmp_path: Path) -> None:
    """As where the [bench] extra is not installed: a `langgraph` that cannot be imported
    shadows the real one."""
    stub = tmp_path / "langgraph"
    stub.mkdir()
    (stub / "__init__.py").write_text('raise ImportError("langgraph hidden by the test")\n')
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    args, patterns = TINY["vs_langgraph.py"]
    out = run_bench("vs_langgraph.py", args, env)
    assert_printed(out, [p for p in patterns if "LangGraph" not in p])
    assert_printed(out, [r"LangGraph not measured: langgraph hidden by the test .*\[bench\]"])
    assert "LangGraph 1" not in out


@pytest.mark.parametrize(
    ("args", "patterns"),
    [
        (
            "--turns 1 --words 5 --scale 40 --live 5",
            [
                r"scale: 40 idle sessions x 1 turns written in bulk in \d+ s \(with token "
                r"deltas\), 5 live",
                rf"  sweep: 40 archived in \d+ s \({NUMBER} sessions/s\)",
                rf"  Redis used_memory: empty {NUMBER} MB, with 5 live {NUMBER} MB, full "
                rf"{NUMBER} MB, after the sweep {NUMBER} MB \(within 10 %",
            ],
        ),
        (
            "--turns 1 --words 5 --rss 30 --cache-mb 4 --touchers 4",
            [
                r"rss: 30 sessions x 1 turns written in bulk",
                rf"  serve \(state_cache_mb = 4\): RSS {NUMBER} MB after start",
                rf"  30 touched in \d+ s \({NUMBER}/s\): RSS peak {NUMBER} MB, end {NUMBER} MB; "
                rf"peak - state_cache_mb = {NUMBER} MB",
            ],
        ),
    ],
    ids=["scale", "rss"],
)
def test_retention_bench_at_scale_and_a_serves_rss_run_tiny(args: str, patterns: list[str]) -> None:
    assert_printed(run_bench("retention.py", args), patterns)
