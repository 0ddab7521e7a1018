"""Shared pieces for tests that run the real engine on a real redis-server."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from engine.client import Client
from engine.config import Project, parse_project
from engine.machine import fold, state_to_json
from engine.store.snapshots import state_of
from engine.store.store import Store

# Runs a scenario test on a single redis-server and on a Redis Cluster (the `redis_url`
# fixture, and those built on it, follow the parameter).
on_both_redis = pytest.mark.parametrize("redis_url", ["single", "cluster"], indirect=True)

ENV = {"OPENAI_API_KEY": "test-openai", "ANTHROPIC_API_KEY": "test-anthropic"}
LEASE_MS = 1500  # short, for tests that kill engines on purpose
START_GUARD_SECS = 60  # EngineProcess.start gives up on a serve that has not started by then
ROOT = Path(__file__).resolve().parents[1]


def project_toml(vendor_url: str, *, retry: str = "") -> str:
    """Two agents, one per vendor format, each with a client tool."""
    tool = (
        '{ name = "confirm", description = "Ask the person", handler = "client", '
        'input = { type = "object", properties = { question = { type = "string" } } } }'
    )
    return textwrap.dedent(
        f"""\
        name = "test"

        [llm.openai]
        type = "openai"
        base_url = "{vendor_url}/v1"

        [llm.anthropic]
        type = "anthropic"
        base_url = "{vendor_url}"

        [agent.ops_openai]
        llm = "openai"
        model = "gpt-4.1-mini"
        system = "You are terse."
        tools = [{tool}]
        {retry}

        [agent.ops_anthropic]
        llm = "anthropic"
        model = "claude-haiku-4-5"
        system = "You are terse."
        tools = [{tool}]
        {retry}
        """
    )


def make_project(tmp_path: Path, vendor_url: str, **kw: Any) -> Project:
    path = tmp_path / "subs.toml"
    path.write_text(project_toml(vendor_url, **kw))
    return parse_project(path.read_text(), str(path), env={})


async def wait_for_event(
    client: Client, sid: str, predicate, *, timeout: float = 20.0, deltas: list | None = None
) -> dict[str, Any]:
    """Follow a session until an event matches; collects deltas on the way."""
    async with asyncio.timeout(timeout):
        async for kind, item in client.follow(sid, 0, delta_cursor="0-0", block_ms=500):
            if kind == "delta":
                if deltas is not None:
                    deltas.append(item)
            elif predicate(item):
                return item
    raise AssertionError("unreachable")


def turn_ended(turn_id: str):
    return lambda e: (
        e.get("turn_id") == turn_id
        and e["payload"]["type"]
        in (
            "turn.completed",
            "turn.failed",
        )
    )


async def assert_consistent(store: Store, sid: str) -> list[dict[str, Any]]:
    """seq is gapless from 1; the stored snapshot equals the fold of the log up to its
    seq, and with the log's tail folded on, the fold of the whole log."""
    events = await store.read_log(sid)
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    snap = await store.load_snapshot(sid)
    assert snap is not None and snap.seq == len(events)
    assert snap.tail == events[snap.at :]
    at_snapshot = fold(json.loads(json.dumps(events[: snap.at])))
    assert at_snapshot is not None and state_to_json(at_snapshot) == snap.state
    folded = fold(json.loads(json.dumps(events)))
    assert folded is not None and state_to_json(folded) == state_to_json(state_of(snap))
    return events


def payloads(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e["payload"] for e in events if e["payload"]["type"] == kind]


async def poll_until(predicate, timeout: float, what: str):
    """Poll an async predicate with a deadline, for state that has no event to wait on
    (lease ownership in Redis); fails naming what it waited for."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = await predicate()
        if result:
            return result
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.05)


class EngineProcess:
    """`subs serve` in its own process, on the test's Redis (None: the folder's embedded one).

    Everything it writes after its start line is read as it comes (into `stderr`, or
    the list given as `sink`): a pipe nobody reads fills up, and a process blocked
    writing its log stalls, and never exits on SIGTERM.
    """

    def __init__(
        self,
        config: Path,
        redis_url: str | None,
        env: dict[str, str] | None = None,
        *,
        sink: list[str] | None = None,
        port: int = 0,
    ) -> None:
        self.config = config
        self.port = port  # 0: any free one; a fixed one to stop a serve and start it again
        self.redis_url = redis_url
        self.extra_env = env or {}
        self.api = ""  # the API's base URL, read from the startup line
        self.proc: asyncio.subprocess.Process | None = None
        self.owner = ""
        self.stderr: list[str] = [] if sink is None else sink
        self._drain: asyncio.Task[None] | None = None

    async def start(self) -> EngineProcess:
        env = {
            **os.environ,
            **ENV,
            "SUBS_LEASE_MS": str(LEASE_MS),
            "PYTHONPATH": str(ROOT),
            **self.extra_env,
        }
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "engine.cli",
            "serve",
            "-c",
            str(self.config),
            *(["--redis", self.redis_url] if self.redis_url is not None else []),
            "--port",
            str(self.port),
            env=env,
            stderr=asyncio.subprocess.PIPE,
        )
        assert self.proc.stderr is not None
        try:
            # A guard against a serve that never starts, not a bound on how fast it does
            # (that is no test's subject here): a serve's imports alone take 15 s and more
            # on a shared 2-core machine at load 12 (bench/chaos.py's restarts, measured).
            async with asyncio.timeout(START_GUARD_SECS):
                # Lines before the start line (a Redis still loading) are kept, in order.
                while not (line := (await self.proc.stderr.readline()).decode()).startswith(
                    "subs: engine "
                ):
                    assert line, "subs serve exited before its start line:\n" + self.log_tail()
                    self.stderr.append(line.rstrip("\n"))
        except BaseException:
            self.proc.kill()  # a start that fails leaves no process behind
            await self.proc.wait()
            raise
        self.owner = line.split()[2]
        self.api = line.split("; api ")[1].split(";")[0]
        self._drain = asyncio.create_task(self._read_stderr(self.proc.stderr))
        return self

    async def _read_stderr(self, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            self.stderr.append(line.decode(errors="replace").rstrip("\n"))

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.stderr[-lines:])

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)

    async def drained(self) -> None:
        """Every line the process wrote is in `stderr` (call once it has exited)."""
        drain, self._drain = self._drain, None
        if drain is not None:
            try:
                await asyncio.wait_for(drain, 5)  # ends at EOF, once the process is gone
            except TimeoutError:
                drain.cancel()

    async def stop(self, within: float = 15) -> int:
        """SIGTERM, and the exit status; a serve still up `within` s later is SIGKILLed (so
        it cannot take work from the tests after this one) and the test fails with its log."""
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(within):
                code = await self.proc.wait()
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
            await self.drained()
            raise AssertionError(
                f"subs serve did not stop within {within:g} s of SIGTERM; its last lines:\n"
                f"{self.log_tail()}"
            ) from None
        await self.drained()
        return code


# -- the `subs` command as a user runs it ------------------------------------------------


async def subs(*args: str, stdin: bytes = b"", env: dict | None = None, timeout: float = 30):
    """Run `subs` to its end; one still running after `timeout` is killed, and fails the test."""
    proc = await start_subs(*args, env=env)
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
    except TimeoutError:
        proc.kill()  # a serve that should have refused to start must not outlive the test
        await proc.wait()
        raise AssertionError(f"subs {' '.join(args)} still ran after {timeout} s") from None
    return proc.returncode, out.decode(), err.decode()


async def start_subs(*args: str, env: dict | None = None) -> asyncio.subprocess.Process:
    full_env = {**os.environ, **ENV, "PYTHONPATH": str(ROOT), **(env or {})}
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "engine.cli",
        *args,
        env=full_env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


def session_of(stderr: str) -> str:
    match = re.search(r"session (ses_[0-9a-f]+)", stderr)
    assert match, stderr
    return match.group(1)
