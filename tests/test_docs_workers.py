"""The example workers of docs/workers.md, run as a reader would run them.

The commands in docs/workers.md are run as they are written, from the repository's root:
docs/examples/worker.py and docs/examples/worker.mjs each serve one real turn of a real
`subs serve` on docs/examples/worker.toml (the file the page shows), sent by the page's
`subs run`: the model (the only fake part) calls the worker tool `runbook`, the worker
answers it, the model answers. Each must refuse a request that is not signed with the
agent's secret, and stop quietly on Ctrl-C. worker.ts is not run (Node 20 runs no
TypeScript); `test_worker_ts_is_worker_mjs_with_types` holds it to its JavaScript twin.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import shlex
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from engine.config import load_project
from engine.effects.delivery import (
    Delivery,
    deliver,
    sign,
    sign_timestamped,
    verify_timestamped,
)
from subs.worker import SignatureError, aiohttp_app, verify
from tests.api_helpers import serve as serve_app
from tests.engine_helpers import ROOT, EngineProcess
from tests.fakes.llm_vendor import FakeVendor, Text, ToolCalls
from tests.workers import REQUEST_SCHEMA, RESPONSE_SCHEMA, schema_errors

EXAMPLES = ROOT / "docs" / "examples"
WORKERS_MD = ROOT / "docs" / "workers.md"
SECRET = "example-worker-secret"
RUNBOOK = "kubectl rollout restart deploy/checkout"  # what the examples' runbook says
EXAMPLE_WORKER_URL = "http://127.0.0.1:8787/"  # where worker.toml sends the requests
# The smallest whole request the engine sends (a new session), to knock at a worker with.
SESSION_START = {
    "session_id": "docs-1",
    "decision_id": "dec-1",
    "agent_id": "oncall",
    "turn_id": None,
    "identity": {"metadata": {}},
    "trigger": {"type": "session.start"},
    "proposed": {},
    "state": None,
    "calls": [],
    "pending_calls": 0,
    "messages": [],
    "message_tree": {"nodes": [], "head_id": None},
    "ancestry": [],
    "attempts": 1,
}


def page_commands() -> dict[str, str]:
    """The commands docs/workers.md gives: each example's (by file name), `serve`, `run`."""
    text = WORKERS_MD.read_text()
    found = dict(re.findall(r"^\| \[`examples/(worker\.\w+)`\].*\| `([^`]+)` \|$", text, re.M))
    for block in re.findall(r"^```sh\n(.*?)\n```", text, re.M | re.S):
        words = block.split()
        subcommand = next(words[i + 1] for i, w in enumerate(words) if w.endswith("bin/subs"))
        found[subcommand] = block
    return found


def as_written(command: str) -> tuple[dict[str, str], list[str]]:
    """A command of the page as a shell runs it from the repository's root: its leading
    `VAR=value` words (`...`, the page's placeholder, as the test's secret) and its argv.
    The page's `.venv/bin/` is the README's venv; a suite run from another one uses its own."""
    words = shlex.split(command)
    env = {}
    while "=" in words[0] and re.fullmatch(r"[A-Z_][A-Z0-9_]*", words[0].split("=")[0]):
        name, value = words.pop(0).split("=", 1)
        env[name] = SECRET if value == "..." else value
    if words[0].startswith(".venv/bin/") and not (ROOT / words[0]).exists():
        words[0] = str(Path(sys.executable).parent / words[0].removeprefix(".venv/bin/"))
    return env, words


async def start_example(kind: str) -> tuple[asyncio.subprocess.Process, str]:
    """The page's command for the example worker of `kind` on a port of its own, in a
    process group of its own (as a terminal runs it); returns it and its URL."""
    env, argv = as_written(page_commands()[kind])
    assert env.keys() == {"ONCALL_WORKER_SECRET"}, env
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=ROOT,
        env={"PATH": os.environ["PATH"], **env, "PORT": "0"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    try:
        async with asyncio.timeout(20):
            line = (await proc.stdout.readline()).decode()
        match = re.search(r"listening on (http://\S+)", line)
        assert match, f"the worker did not say where it listens: {line!r}" + (
            (await proc.stderr.read()).decode() if proc.returncode is not None else ""
        )
    except BaseException:
        await stop(proc)
        raise
    return proc, match.group(1)


async def stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.terminate()
        try:
            async with asyncio.timeout(10):
                await proc.wait()
        except TimeoutError:
            proc.kill()
            await proc.wait()


@pytest.fixture
async def example_worker(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """The example worker the test names, started as the page says; yields its URL."""
    proc, url = await start_example(request.param)
    try:
        yield url
    finally:
        await stop(proc)


EXAMPLES_RUN = pytest.mark.parametrize("example_worker", ["worker.py", "worker.mjs"], indirect=True)


@EXAMPLES_RUN
async def test_the_example_worker_serves_a_turn(
    example_worker: str, tmp_path: Path, redis_url: str
) -> None:
    async with aiohttp.ClientSession() as http:
        assert not schema_errors(REQUEST_SCHEMA, SESSION_START)
        body = json.dumps(SESSION_START).encode()
        now = int(time.time())
        for headers in (
            {},
            {"X-Subs-Signature": sign_timestamped("another-secret", body, now)},
            # A request captured six minutes ago and sent again: signed right, too old.
            {"X-Subs-Signature": sign_timestamped(SECRET, body, now - 360)},
            {"X-Subs-Signature": sign_timestamped(SECRET, body, now + 360)},
            # The original engine's header alone proves no time: not enough.
            {"X-Substructure-Signature": sign(SECRET, body)},
        ):
            async with http.post(example_worker, data=body, headers=headers) as response:
                assert response.status == 401, (headers, await response.text())
        fresh = {"X-Subs-Signature": sign_timestamped(SECRET, body, now)}
        async with http.post(example_worker, data=body, headers=fresh) as response:
            assert response.status == 200, await response.text()
    commands = page_commands()
    serve_env, serve_argv = as_written(commands["serve"])
    config = ROOT / serve_argv[serve_argv.index("-c") + 1]
    # The page's serve command sets exactly what the file needs (what `subs check` lists).
    assert serve_env.keys() == {m.var for m in load_project(config, env={}).missing_env({})}
    async with FakeVendor() as vendor:
        vendor.push(
            ToolCalls([("runbook", {"service": "checkout"})]),
            Text("Restart checkout with a rollout restart."),
        )
        text = config.read_text().replace(EXAMPLE_WORKER_URL, example_worker)
        text = text.replace(
            'type = "openrouter"', f'type = "openrouter"\nbase_url = "{vendor.openrouter_base()}"'
        )
        assert example_worker in text and vendor.openrouter_base() in text
        (tmp_path / "subs.toml").write_text(text)
        serve = await EngineProcess(tmp_path / "subs.toml", redis_url, serve_env).start()
        try:
            env, argv = as_written(commands["run"].replace("http://127.0.0.1:8080", serve.api))
            assert serve.api in argv
            run = await asyncio.create_subprocess_exec(
                *argv,
                cwd=ROOT,
                env={**os.environ, **env},
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            async with asyncio.timeout(60):
                out, err = await run.communicate()
        finally:
            await serve.stop()
        assert run.returncode == 0, f"{err.decode()}\n{serve.log_tail()}"
        events = [json.loads(line) for line in out.decode().splitlines()]
        kinds = [e["payload"]["type"] for e in events if "payload" in e]
        assert kinds[-1] == "turn.completed", f"{kinds}\n{serve.log_tail()}"
        assert "decision.errored" not in kinds, serve.log_tail()
        [done] = [
            e["payload"]
            for e in events
            if e.get("payload", {}).get("type") == "tool.call.completed"
        ]
        assert RUNBOOK in json.dumps(done["result"])
        assert RUNBOOK in json.dumps(vendor.requests[1].body["messages"][-1])
        assert "decision.completed" in kinds, "the worker decided nothing"


@pytest.mark.parametrize("kind", ["worker.py", "worker.mjs"])
async def test_ctrl_c_stops_the_example_worker_quietly(kind: str) -> None:
    proc, _ = await start_example(kind)
    try:
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends
        async with asyncio.timeout(10):
            _, err = await proc.communicate()
    finally:
        await stop(proc)
    # 0, or ended by the signal itself (a shell says 130), as `node` is by default
    assert proc.returncode in (0, 130, -signal.SIGINT), (proc.returncode, err.decode())
    assert err.decode() == "", f"{kind} wrote on Ctrl-C:\n{err.decode()}"


def test_the_python_examples_check_refuses_a_replay_outside_the_window(monkeypatch) -> None:
    """docs/examples/worker.py's worker (its SDK `Worker`, with the secret from the
    environment), on what the engine sends (`deliver`'s headers): good within 5 minutes
    either way of the worker's clock, refused past them, refused for another body or
    secret; the engine's `verify_timestamped` agrees."""
    monkeypatch.setenv("ONCALL_WORKER_SECRET", SECRET)
    spec = importlib.util.spec_from_file_location("example_worker", EXAMPLES / "worker.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert example.worker.secret == SECRET

    def signed(body: bytes, headers: dict[str, str], now: float) -> bool:
        try:
            verify(example.worker.secret, body, headers, now=now, window=example.worker.window)
        except SignatureError:
            return False
        return True

    body = b'{"trigger": {"type": "session.start"}, "proposed": {}}'
    sent_at = 1_800_000_000
    header = sign_timestamped(SECRET, body, sent_at)
    both = {"X-Subs-Signature": header, "X-Substructure-Signature": sign(SECRET, body)}
    for delay, good in [(0, True), (299, True), (-299, True), (301, False), (3600, False)]:
        now = sent_at + delay
        assert signed(body, both, now) is good, delay
        assert signed(body, {"X-Subs-Signature": header}, now) is good, delay
        assert verify_timestamped(SECRET, body, header, now) is good, delay
    assert not signed(body + b" ", both, sent_at)
    other = {"X-Subs-Signature": sign_timestamped("another", body, sent_at)}
    assert not signed(body, other, sent_at)
    moved = {"X-Subs-Signature": header.replace(f"t={sent_at}", f"t={sent_at + 1}")}
    assert not signed(body, moved, sent_at)
    assert not signed(body, {"X-Substructure-Signature": sign(SECRET, body)}, sent_at)


def test_the_page_shows_the_example_config_whole() -> None:
    """The TOML of "Set one up" is docs/examples/worker.toml, the file the commands use."""
    [shown] = re.findall(r"^```toml\n(.*?)^```", WORKERS_MD.read_text(), re.M | re.S)
    assert shown == (EXAMPLES / "worker.toml").read_text()


def test_the_answers_shown_in_workers_md_are_valid_decision_responses() -> None:
    text = (ROOT / "docs" / "workers.md").read_text()
    answers = [b for b in re.findall(r"^```json\n(.*?)^```", text, re.M | re.S) if '"actions"' in b]
    answers += re.findall(r"^event: decision\.result\ndata: (.*)$", text, re.M)
    assert len(answers) >= 3
    for answer in answers:
        errors = schema_errors(RESPONSE_SCHEMA, json.loads(answer))
        assert not errors, f"docs/workers.md shows an answer no worker may send: {answer}\n{errors}"


# --- the TypeScript example --------------------------------------------------------------------

_NAMES = r"(?:Json|Trigger|DecisionRequest|IncomingMessage|ServerResponse|Buffer|string|number|boolean|void)"  # noqa: E501
_TYPE = rf"(?:{_NAMES}(?:\[\])?|Promise<{_NAMES}>|\{{ \[\w+: string\]: {_NAMES} \}})"
_ANNOTATION = re.compile(rf": {_TYPE}(?: \| (?:{_TYPE}|undefined|null))*(?=[,)=;{{ ])")


def without_types(ts: str) -> str:
    """worker.ts as JavaScript, for the subset of TypeScript it uses: `import type` lines,
    `type` and `interface` declarations, `: T` annotations and `as T` casts removed."""
    ts = re.sub(r"^import type .*\n", "", ts, flags=re.M)
    ts = re.sub(r"^type \w+ = .*;\n\n?", "", ts, flags=re.M)
    ts = re.sub(r"^interface \w+ \{\n(?:.*\n)*?\}\n\n?", "", ts, flags=re.M)
    ts = re.sub(rf" as {_NAMES}\b", "", ts)
    return _ANNOTATION.sub("", ts)


def program(source: str) -> str:
    """From the first import on (the header comments differ), whitespace runs as one space."""
    return " ".join(source[source.index("\nimport ") :].split())


def test_worker_ts_is_worker_mjs_with_types() -> None:
    ts = (EXAMPLES / "worker.ts").read_text()
    mjs = (EXAMPLES / "worker.mjs").read_text()
    stripped = without_types(ts)
    assert stripped != ts, "no types found in worker.ts"
    if program(stripped) != program(mjs):
        ours, theirs = program(stripped).split("; "), program(mjs).split("; ")
        first = next(
            (n for n, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b),
            min(len(ours), len(theirs)),
        )
        raise AssertionError(
            "worker.ts without its types is not worker.mjs; first difference:\n"
            f"  ts:  {'; '.join(ours[first : first + 2])}\n"
            f"  mjs: {'; '.join(theirs[first : first + 2])}"
        )


# --- the Python SDK's part of the page ------------------------------------------------------


def python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", WORKERS_MD.read_text(), re.M | re.S)


def test_the_heart_of_it_shown_is_the_python_example() -> None:
    """The page's excerpt of worker.py is worker.py's own text, not a paraphrase."""
    [heart] = [b for b in python_blocks() if '@worker.tool("runbook")' in b]
    assert heart in (EXAMPLES / "worker.py").read_text()


async def test_the_sdk_example_of_the_page_streams_and_answers_later() -> None:
    """The page's SDK block, run as written (its secret as the test's): a streamed
    `llm.execute` read by the engine's own delivery (deltas, then the `llm.result`), and a
    `deploy` tool call answered `{}` with the job queued for `settle`."""
    [block] = [b for b in python_blocks() if "stream_text" in b]
    namespace: dict = {}
    exec(
        compile(block.replace('secret="..."', f'secret="{SECRET}"'), "workers.md", "exec"),
        namespace,
    )
    worker = namespace["worker"]
    assert worker.secret == SECRET
    deltas: list[dict] = []

    async def on_delta(delta: dict) -> None:
        deltas.append(delta)

    llm = {"type": "llm.execute", "id": "llm_1", "request": {}, "stream": True, "attempt": 1}
    tool = {
        "type": "tool.execute",
        "id": "call_9",
        "name": "deploy",
        "arguments": '{"service": "checkout"}',
        "input": {"status": "valid", "value": {"service": "checkout"}},
        "attempt": 1,
    }
    async with serve_app(aiohttp_app(worker)) as url, aiohttp.ClientSession() as http:
        answers = []
        for trigger in (llm, tool):
            body = json.dumps({**SESSION_START, "trigger": trigger}).encode()
            delivery = Delivery(url + "/", body, SECRET, timeout=10)
            answers.append(await deliver(http, delivery, on_delta))
    streamed, later = answers
    assert "".join(d.get("text") or "" for d in deltas) == "Checkout restarts in a minute."
    [result] = streamed["actions"]
    assert result["response"]["content"] == "Checkout restarts in a minute."
    assert not schema_errors(RESPONSE_SCHEMA, streamed)
    assert later == {}
    assert namespace["jobs"].get_nowait() == ("docs-1", "call_9", {"service": "checkout"})
