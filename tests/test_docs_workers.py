"""The example workers of docs/workers.md, run as a reader would run them.

docs/examples/worker.py (with this interpreter) and docs/examples/worker.mjs (with `node`)
each serve one real turn of a real `subs serve`: the model (the only fake part) calls the
worker tool `runbook`, the worker answers it, the model answers. Each must refuse a request
that is not signed with the agent's secret. worker.ts is not run (Node 20 runs no
TypeScript); `test_worker_ts_is_worker_mjs_with_types` holds it to its JavaScript twin.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from engine.cli.remote import HttpClient
from engine.effects.delivery import sign
from tests.engine_helpers import ROOT, EngineProcess
from tests.fakes.llm_vendor import FakeVendor, Text, ToolCalls
from tests.workers import RESPONSE_SCHEMA, schema_errors

EXAMPLES = ROOT / "docs" / "examples"
SECRET = "example-worker-secret"
RUNBOOK = "kubectl rollout restart deploy/checkout"  # what the examples' runbook says


def worker_command(kind: str) -> list[str]:
    if kind == "python":
        return [sys.executable, str(EXAMPLES / "worker.py")]
    node = shutil.which("node")
    assert node is not None, "node is not on PATH: the JavaScript example cannot run"
    return [node, str(EXAMPLES / "worker.mjs")]


@pytest.fixture
async def example_worker(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """The example worker of the kind the test names, on a port of its own; yields its URL."""
    proc = await asyncio.create_subprocess_exec(
        *worker_command(request.param),
        env={"PATH": "/usr/bin:/bin", "ONCALL_WORKER_SECRET": SECRET, "PORT": "0"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        async with asyncio.timeout(20):
            line = (await proc.stdout.readline()).decode()
        match = re.search(r"listening on (http://\S+)", line)
        assert match, f"the worker did not say where it listens: {line!r}" + (
            (await proc.stderr.read()).decode() if proc.returncode is not None else ""
        )
        yield match.group(1)
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                async with asyncio.timeout(10):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()


def worker_toml(vendor_url: str, worker_url: str) -> str:
    """docs/workers.md's agent: engine-run model calls, the worker decides and runs `runbook`."""
    return textwrap.dedent(
        f"""\
        [llm.openrouter]
        type = "openai"
        base_url = "{vendor_url}/v1"

        [agent.oncall]
        llm = "openrouter"
        model = "anthropic/claude-sonnet-4-5"
        system = "You are the on-call assistant."
        worker = "{worker_url}"
        signing_secret_env = "ONCALL_WORKER_SECRET"
        tools = [{{ name = "runbook", description = "The runbook of a service", input = {{ type = "object", properties = {{ service = {{ type = "string" }} }}, required = ["service"] }} }}]
        """  # noqa: E501
    )


@pytest.mark.parametrize("example_worker", ["python", "node"], indirect=True)
async def test_the_example_worker_serves_a_turn(
    example_worker: str, tmp_path: Path, redis_url: str
) -> None:
    async with aiohttp.ClientSession() as http:
        body = json.dumps({"trigger": {"type": "session.start"}, "proposed": {}}).encode()
        for headers in ({}, {"X-Substructure-Signature": sign("another-secret", body)}):
            async with http.post(example_worker, data=body, headers=headers) as response:
                assert response.status == 401, await response.text()
    async with FakeVendor() as vendor:
        vendor.push(
            ToolCalls([("runbook", {"service": "checkout"})]),
            Text("Restart checkout with a rollout restart."),
        )
        config = tmp_path / "subs.toml"
        config.write_text(worker_toml(vendor.url, example_worker))
        serve = await EngineProcess(config, redis_url, {"ONCALL_WORKER_SECRET": SECRET}).start()
        client = HttpClient(serve.api)
        try:
            message = {"role": "user", "content": "Checkout is paging."}
            reply = await client.submit(
                {"type": "client.message", "agent_id": "oncall", "message": message}
            )
            sid, turn_id = reply["session_id"], reply["turn_id"]
            async with asyncio.timeout(30):
                events = [
                    item
                    async for kind, item in client.follow(sid, turn_id=turn_id)
                    if kind == "event"
                ]
        finally:
            await client.aclose()
            await serve.stop()
        kinds = [e["payload"]["type"] for e in events]
        assert kinds[-1] == "turn.completed", f"{kinds}\n{serve.log_tail()}"
        assert "decision.errored" not in kinds, serve.log_tail()
        [done] = [e["payload"] for e in events if e["payload"]["type"] == "tool.call.completed"]
        assert RUNBOOK in json.dumps(done["result"])
        assert RUNBOOK in json.dumps(vendor.requests[1].body["messages"][-1])
        decisions = [e for e in events if e["payload"]["type"] == "decision.completed"]
        assert decisions, "the worker decided nothing"


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
