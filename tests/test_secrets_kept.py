"""Secrets never leave the process (issue 26, item 6): a vendor's error that echoes the
key it was sent is scrubbed before it is recorded, so the session's events, the API's
reads and the logs hold `***`; a `KEY:read` key, an MCP server's token and the `${VAR}`
values of its command line are masked in the logs; `subs check` warns about a secret in
an MCP command line (every local user reads it in /proc/<pid>/cmdline)."""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import httpx

from engine.client import Client
from tests.api_helpers import INPUT, auth, read_stream
from tests.engine_helpers import ROOT, start_subs, subs, turn_ended, wait_for_event
from tests.fakes.llm_vendor import FakeVendor, HttpError, Text, ToolCalls
from tests.test_engine_worker import start_engine, worker_project

SERVER = str(ROOT / "tests" / "mcp_server.py")
SECRETS = {
    "vendor key": "sk-vendor-5b1e77aa",
    "full API key": "root-key-8c21f0",
    "read-only API key": "reader-key-4e9d2b",
    "MCP token (env_from)": "mcp-token-a3c9e1",
    "MCP ${VAR} value": "mcp-cmdline-7f0d42",
}


def project(vendor_url: str) -> str:
    argv = [sys.executable, SERVER, "--say", "${MCP_CMD_SECRET}", "--say-env", "MCP_TOKEN"]
    return textwrap.dedent(
        f"""\
        [llm.openai]
        type = "openai"
        base_url = "{vendor_url}/v1"

        [mcp.tools]
        command = {json.dumps(argv)}
        env_from = ["MCP_TOKEN"]

        [agent.ops]
        llm = "openai"
        model = "gpt-4.1-mini"
        mcp = [{{ id = "mcp.tools" }}]
        """
    )


async def test_a_vendor_error_echoing_the_key_is_recorded_and_logged_masked(
    vendor: FakeVendor, redis_url: str, tmp_path: Path
) -> None:
    key = SECRETS["vendor key"]
    # OpenAI's 401 names the key it was given (its error object: {message, type, param, code}).
    echo = {
        "error": {
            "message": f"Incorrect API key provided: {key}. You can find your API key at ...",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }
    vendor.default = HttpError(401, body=echo)
    config = tmp_path / "subs.toml"
    config.write_text(project(vendor.url))
    root, reader = SECRETS["full API key"], SECRETS["read-only API key"]
    env = {
        "SUBS_LOG": "INFO",
        "OPENAI_API_KEY": key,
        "SUBS_API_KEYS": f"{root},{reader}:read",
        "MCP_TOKEN": SECRETS["MCP token (env_from)"],
        "MCP_CMD_SECRET": SECRETS["MCP ${VAR} value"],
    }
    proc = await start_subs(
        "serve", "-c", str(config), "--redis", redis_url, "--port", "0", env=env
    )
    assert proc.stdout is not None and proc.stderr is not None
    try:
        async with asyncio.timeout(20):
            start = (await proc.stderr.readline()).decode()
        assert start.startswith("subs: engine "), start
        reading = asyncio.gather(proc.stdout.read(), proc.stderr.read())
        base = start.split("; api ")[1].split(";")[0]
        message = {"role": "user", "content": "hi"}
        said = {"type": "client.message", "agent_id": "ops", "message": message}
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            sent = await http.post(INPUT, json={"input": said}, headers=auth(root))
            assert sent.status_code == 202, sent.text
            sid, turn = sent.json()["session_id"], sent.json()["turn_id"]
            frames = await read_stream(http, sid, key=reader, params={"turn_id": turn})
            view = await http.get(f"/api/client/sessions/{sid}", headers=auth(reader))
            log = await http.get(f"/api/admin/sessions/{sid}/events", headers=auth(root))
            # The read key and the rest in what the access log writes (a leaky client).
            await http.get("/healthz", headers={"User-Agent": " ".join(SECRETS.values())})
    finally:
        if proc.returncode is None:
            proc.terminate()
        code = await asyncio.wait_for(proc.wait(), 15)
    out, err = (part.decode() for part in await reading)
    assert code == 0, err
    failed = [f for f in frames if f.event == "turn.failed"]
    assert failed and "Incorrect API key provided: ***" in failed[0].data
    reads = {"stream": "".join(f.data for f in frames), "view": view.text, "events": log.text}
    logs = [start, *out.splitlines(), *err.splitlines()]
    leaks = [
        f"{what} in the {where}"
        for where, text in reads.items()
        for what, s in SECRETS.items()
        if s in text
    ]
    leaks += [f"{what} in: {line}" for line in logs for what, s in SECRETS.items() if s in line]
    assert not leaks, "\n".join(leaks)
    # The lines that carried them are there, masked.
    assert any("[mcp.tools] my token is ***" in line for line in logs), err
    assert any("[mcp.tools] started with ***" in line for line in logs), err


async def test_check_warns_about_a_secret_in_an_mcp_command_line(tmp_path: Path) -> None:
    config = tmp_path / "subs.toml"
    config.write_text(
        textwrap.dedent(
            f"""\
            [mcp.db]
            command = [{json.dumps(sys.executable)}, "-c", "pass", "--dsn", "${{DB_API_KEY}}"]

            [mcp.files]
            command = [{json.dumps(sys.executable)}, "-c", "pass", "--password=hunter22"]

            [mcp.ok]
            command = [{json.dumps(sys.executable)}, "-c", "pass", "${{HOME}}"]
            env_from = ["DB_TOKEN"]
            """
        )
    )
    env = {"DB_API_KEY": "k-1234", "DB_TOKEN": "t-1234"}
    code, out, err = await subs("check", "-c", str(config), env=env)
    lines = [json.loads(line) for line in out.splitlines()]
    warned = {line["warning"]: line["why"] for line in lines if "warning" in line}
    assert set(warned) == {"mcp.db", "mcp.files"}, out
    assert "${DB_API_KEY}" in warned["mcp.db"] and "env_from" in warned["mcp.db"]
    assert "--password" in warned["mcp.files"] and "hunter22" not in warned["mcp.files"]
    assert code == 0, err  # a warning, not an error


async def test_a_workers_error_echoing_a_secret_is_recorded_masked(
    redis, vendor: FakeVendor, test_worker, tmp_path: Path
) -> None:
    """A worker's `tool.error` that quotes the signing secret (a backend's error passed on
    as it came) is stored masked: the model, the API and Slack read `***`."""
    secret = "worker-signing-9d8c7b"

    async def decide(request: dict[str, Any]) -> Any:
        if request["trigger"]["type"] == "tool.execute":
            error = f"backend said: bad credentials {secret}"
            return {"actions": [{"type": "tool.error", "error": error}]}
        return request["proposed"]

    worker = await test_worker(decide, secret=secret)
    engine = await start_engine(
        redis, worker_project(tmp_path, vendor.url, worker.url), secret=secret
    )
    vendor.push(ToolCalls([("lookup", {"q": "x"})]), Text("It failed."))
    try:
        client = Client(engine.store)
        message = {"role": "user", "content": "look"}
        sent = await client.submit(
            {"type": "client.message", "agent_id": "helper", "message": message}
        )
        await wait_for_event(client, sent["session_id"], turn_ended(sent["turn_id"]))
        events = json.dumps(await client.events(sent["session_id"]))
    finally:
        await engine.stop()
    assert secret not in events
    assert "backend said: bad credentials ***" in events
    assert secret not in json.dumps(vendor.requests[-1].body)  # nor what the model is told
