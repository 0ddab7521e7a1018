"""npm packages a test installs from the registry.

A machine that cannot reach the registry (offline, a proxy that is not set up) cannot
run such a test, and that is no defect of ours: it is a skip that says why. One that
reaches it and still fails the install is a failure, as before. The registry is asked
first with `npm ping` under a few seconds' bound, so an unreachable one costs seconds,
not an install's timeout.
"""

from __future__ import annotations

import contextlib
import fcntl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

PING_SECS = 10  # the whole probe, process start included; npm's own fetch gives up at 5


def registry_unreachable(npm: str) -> str | None:
    """Why npm cannot reach its registry from here (its configured one), or None."""
    try:
        done = subprocess.run(
            [npm, "ping", "--fetch-timeout=5000", "--fetch-retries=0"],
            capture_output=True,
            text=True,
            timeout=PING_SECS,
        )
    except subprocess.TimeoutExpired:
        return f"`npm ping` got no answer from the registry in {PING_SECS} s"
    if done.returncode == 0:
        return None
    errors = [line for line in done.stderr.splitlines() if line.lower().startswith("npm err")]
    reason = [line for line in errors if "reason:" in line] or errors or ["(it said nothing)"]
    return f"`npm ping` failed: {reason[0].split(' ', 2)[-1].strip()}"


def npm_install(npm: str, folder: Path, *packages: str, timeout: float = 300) -> None:
    """`npm install` the packages into `folder` (its node_modules, where node and npx look
    first). Skips, saying so, when the registry cannot be reached; fails when it can and
    the install fails."""
    unreachable = registry_unreachable(npm)
    if unreachable is not None:
        pytest.skip(
            f"cannot install {' '.join(packages)}: the npm registry is out of reach ({unreachable})"
        )
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [npm, "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(folder), *packages],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        pytest.fail(f"npm install {' '.join(packages)} failed:\n{done.stderr[-2000:]}")


@contextlib.contextmanager
def only_installer(folder: Path) -> Iterator[None]:
    """Held while checking for, and making, an install in a folder kept between runs:
    xdist's workers, and other runs of the suite on the machine, share that folder, and
    two `npm install`s into one prefix at once leave it broken."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f"{folder.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        yield
