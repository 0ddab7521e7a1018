"""The AG-UI endpoint driven from node by `@ag-ui/client`'s HttpAgent (npm, installed
here at test time into a cached folder): a text run, a frontend tool round trip and a
further turn, with no client warning, and the history the client assembles equal to
the session's active path."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from engine.api.agui_events import agui_message
from engine.machine.tree import path_to
from engine.store.snapshots import load_state
from tests.agui_helpers import run_path
from tests.api_helpers import ROOT
from tests.engine_helpers import payloads
from tests.fakes.llm_vendor import Text, ToolCalls
from tests.npm_helpers import npm_install, only_installer

PACKAGES = ("@ag-ui/client@1.0.0", "@ag-ui/core@1.0.0")
SCRIPT = Path(__file__).with_name("agui_client.cjs")


@pytest.fixture(scope="module")
def node_exe() -> str:
    """node on PATH; without it the test is skipped, saying so."""
    found = shutil.which("node")
    if found is None:
        pytest.skip("node is needed to run the AG-UI client tests (not on PATH)")
    return found


@pytest.fixture(scope="module")
def node_modules(node_exe: str) -> Path:
    """`@ag-ui/client` installed with npm once per version into a folder kept between
    runs; no npm on the machine, or no registry in reach, skips (saying so), a failed
    install fails."""
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is needed to install @ag-ui/client (not on PATH)")
    folder = Path(tempfile.gettempdir()) / "subs-tests-agui-client-1.0.0"
    modules = folder / "node_modules"
    with only_installer(folder):
        if not (modules / "@ag-ui" / "client" / "package.json").exists():
            npm_install(npm, folder, *PACKAGES)
    return modules


CHAT = Path(__file__).resolve().parents[1] / "engine" / "console" / "chat"


async def node(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        "node",
        *args,
        env={**os.environ, **(env or {})},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(60):
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def comparable(message: dict[str, Any]) -> dict[str, Any]:
    """A message as both sides can spell it: no empty content, no unset field."""
    out = {k: v for k, v in message.items() if v not in (None, "", [])}
    return out


async def test_http_agent_runs_a_text_turn_a_frontend_tool_and_another_turn(
    agui_engine, agui_http, vendor, node_modules
):
    vendor.push(
        Text("Hello there, how can I help?"),
        ToolCalls([("pick_color", {"hint": "warm"})], text="Let me ask."),
        Text("Red it is."),
        Text("You are welcome."),
    )
    config = {"url": str(agui_http.base_url) + run_path("chat"), "key": ROOT, "threadId": "th-n"}
    code, out, stderr = await node(
        str(SCRIPT), json.dumps(config), env={"NODE_PATH": str(node_modules)}
    )
    assert code == 0, stderr
    assert "[ag-ui]" not in stderr and "warn" not in stderr.lower(), stderr
    seen = json.loads(out)

    runs = {r["runId"]: r["events"] for r in seen["runs"]}
    assert runs["run-1"][0] == "RUN_STARTED" and runs["run-1"][-1] == "RUN_FINISHED"
    assert "TOOL_CALL_START" in runs["run-2"] and "TOOL_CALL_RESULT" not in runs["run-2"]
    assert runs["run-2"][-1] == "RUN_FINISHED"
    assert "TEXT_MESSAGE_CONTENT" in runs["run-3"] and runs["run-3"][-1] == "RUN_FINISHED"
    assert runs["run-4"][-1] == "RUN_FINISHED"

    state = await load_state(agui_engine.store, "th-n")
    assert state is not None
    path = path_to(state.nodes, state.head_id)
    expected = [agui_message(m) for m in path]
    wire = [m.model_dump(by_alias=True, exclude_none=True) for m in expected if m is not None]
    assert [comparable(m) for m in seen["messages"]] == [comparable(m) for m in wire]
    assert [m["id"] for m in seen["messages"]][:2] == ["u1", path[1]["id"]]
    assert len(state.nodes) == len(path)  # nothing branched
    events = await agui_engine.store.read_log("th-n")
    assert [p["turn_id"] for p in payloads(events, "turn.started")] == [
        "run-1",
        "run-2",
        "run-4",
    ]


@pytest.mark.parametrize("name", ["chat.js", "agui.js"])
async def test_the_chat_page_modules_parse_as_modules(node_exe, name):
    code, _, err = await node("--experimental-default-type=module", "--check", str(CHAT / name))
    assert code == 0, err


async def test_the_chat_page_transport_keeps_the_threads_history(
    agui_engine, agui_http, vendor, node_exe
):
    vendor.push(Text("Hello from the page."), Text("Again, hello."))
    config = {"url": str(agui_http.base_url) + run_path("chat"), "key": ROOT, "threadId": "th-p"}
    script = str(Path(__file__).with_name("agui_page.mjs"))
    module = (CHAT / "agui.js").as_uri()
    code, out, err = await node(
        "--experimental-default-type=module", script, module, json.dumps(config)
    )
    assert code == 0, err
    kept = json.loads(out)
    state = await load_state(agui_engine.store, "th-p")
    assert state is not None
    path = path_to(state.nodes, state.head_id)
    wire = [agui_message(m).model_dump(by_alias=True, exclude_none=True) for m in path]
    assert [comparable(m) for m in kept] == [comparable(m) for m in wire]
    assert len(state.nodes) == 4 and len(state.turns) == 2
