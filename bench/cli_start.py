"""How long does a `subs` command take before it answers?

Starts one `subs serve` (in a temp folder, on its embedded Redis) and times, as a
person would see it, `--runs` (10) fresh processes of each command: the interpreter
alone (the floor), `subs --version`, `subs --help`, `subs sessions list --url` against
that serve, `subs sessions list` reading the serve's Redis itself (it loads the config,
the store and redis-py), and `subs serve` itself in a folder of its own, from its start
to its "subs: engine ..." line (its embedded redis-server started, its API listening).
Printed: the median and the slowest wall time of each, in ms, in the same shape at any
commit, so a before and an after can be set side by side. The target for
`sessions list --url` is under 400 ms.

The serve is stopped on the way out, also on Ctrl-C or SIGTERM (and dies with this
script if it is SIGKILLed).

    .venv/bin/python bench/cli_start.py [--runs 10]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # engine, tests, bench

import argparse
import os
import select
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from engine.store.embedded import die_with_parent
from tests.engine_helpers import ENV, ROOT, project_toml

TARGET_MS = 400
START_SECONDS = 60.0
SUBS = [sys.executable, "-m", "engine.cli"]
# Nowhere: the serve starts, lists and never calls a model.
VENDOR = "http://127.0.0.1:9"


class BenchError(Exception):
    """The serve did not start, or a timed command failed: no figure would be true."""


def _env() -> dict[str, str]:
    env = {**os.environ, **ENV, "PYTHONPATH": str(ROOT)}
    env.pop("SUBS_LOG", None)  # logging on would time the log, not the start
    return env


@contextmanager
def serving(folder: Path) -> Iterator[str]:
    """`subs serve` on the folder's embedded Redis, until the block ends; its API URL."""
    config = folder / "subs.toml"
    config.write_text(project_toml(VENDOR))
    log = folder / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*SUBS, "serve", "-c", str(config), "--port", "0"],
            env=_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=out,
            preexec_fn=die_with_parent(),
        )
    try:
        deadline = time.monotonic() + START_SECONDS
        while (api := _api(log)) is None:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"subs serve did not start:\n{log.read_text()[-2000:]}")
            time.sleep(0.05)  # the line is in a file: nothing to wait on but time
        yield api
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _api(log: Path) -> str | None:
    """The API's address from the serve's start line, once it is written."""
    for line in log.read_text(errors="replace").splitlines(keepends=True):
        if line.startswith("subs: engine ") and line.endswith("\n"):
            return line.split("; api ")[1].split(";")[0]
    return None


def timed(argv: list[str], runs: int) -> list[float]:
    """Wall milliseconds of `runs` fresh processes, each of which must exit 0."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        done = subprocess.run(argv, env=_env(), capture_output=True, text=True, timeout=60)
        times.append((time.perf_counter() - started) * 1000)
        if done.returncode != 0:
            command = " ".join(argv[1:])
            raise BenchError(f"{command} exited {done.returncode}: {done.stderr[-2000:]}")
    return times


def serve_start(folder: Path) -> float:
    """Wall milliseconds from starting `subs serve` in `folder` to its start line; the serve
    is stopped again."""
    folder.mkdir()
    config = folder / "subs.toml"
    config.write_text(project_toml(VENDOR))
    argv = [*SUBS, "serve", "-c", str(config), "--port", "0"]
    started = time.perf_counter()
    proc = subprocess.Popen(
        argv,
        env=_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=die_with_parent(),
    )
    assert proc.stderr is not None
    said = b""
    try:
        deadline = started + START_SECONDS
        while time.perf_counter() < deadline:  # raw reads: a buffered line hides from select
            ready, _, _ = select.select([proc.stderr], [], [], deadline - time.perf_counter())
            chunk = os.read(proc.stderr.fileno(), 65536) if ready else b""
            if not chunk:  # exited, or the deadline
                break
            said += chunk
            whole_lines = said.split(b"\n")[:-1]
            if any(line.startswith(b"subs: engine ") for line in whole_lines):
                return (time.perf_counter() - started) * 1000
        tail = said.decode(errors="replace")[-2000:]
        raise BenchError(f"subs serve did not start:\n{tail}")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=15)  # reads what it says while stopping
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def _stop(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # SIGTERM unwinds like Ctrl-C: the serve is stopped


def main(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, _stop)
    try:
        with (
            tempfile.TemporaryDirectory(prefix="subs-cli-start-") as tmp,
            serving(Path(tmp)) as api,
        ):
            config = Path(tmp) / "subs.toml"
            rows = [
                ("python -c pass (floor)", [sys.executable, "-c", "pass"]),
                ("subs --version", [*SUBS, "--version"]),
                ("subs --help", [*SUBS, "--help"]),
                ("subs sessions list --url", [*SUBS, "sessions", "list", "--url", api]),
                ("subs sessions list", [*SUBS, "sessions", "list", "-c", str(config)]),
            ]
            print(f"cli start: median of {args.runs} runs, wall ms (median, slowest)")
            for what, argv in rows:
                times = timed(argv, args.runs)
                target = f"  (target < {TARGET_MS} ms)" if "--url" in what else ""
                print(f"  {what:26s} {statistics.median(times):7.0f} {max(times):7.0f}{target}")
            times = [serve_start(Path(tmp) / f"serve-{n}") for n in range(args.runs)]
            what = "subs serve (to its line)"
            print(f"  {what:26s} {statistics.median(times):7.0f} {max(times):7.0f}")
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BenchError as err:
        print(f"FAILED: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    sys.exit(main(parser.parse_args()))
