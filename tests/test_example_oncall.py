"""The example on-call agent (subs.toml) with its connections for real: the reference
filesystem server (npm) over ./runbooks and mcp-server-git (PyPI) over a repository the
test makes; and, with neither installed, the same agent running without them."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine.client import Client
from engine.config import parse_project
from engine.runtime.engine import Engine
from engine.store.store import Store
from tests.engine_helpers import (
    ENV,
    ROOT,
    EngineProcess,
    assert_consistent,
    payloads,
    turn_ended,
    wait_for_event,
)
from tests.fakes.llm_vendor import FakeVendor, Text, ToolCalls
from tests.npm_helpers import npm_install

FILESYSTEM = "@modelcontextprotocol/server-filesystem@2026.8.31"


def example(tmp_path: Path, vendor: FakeVendor) -> Path:
    """The repo's subs.toml and runbooks in a folder of the test's, its model on the fake."""
    text = (ROOT / "subs.toml").read_text()
    text = text.replace(
        '[llm.openrouter]\ntype = "openrouter"',
        f'[llm.openrouter]\ntype = "openrouter"\nbase_url = "{vendor.openrouter_base()}"',
    )
    assert vendor.openrouter_base() in text
    shutil.copytree(ROOT / "runbooks", tmp_path / "runbooks")
    (tmp_path / "subs.toml").write_text(text)
    return tmp_path / "subs.toml"


def text_of(content: str | list[dict]) -> str:
    """A Chat Completions content's text: a string, or its text parts (the newest message
    is sent as parts, the last carrying a cache breakpoint: docs/prompt-caching.md)."""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content)


def git_repo(path: Path) -> Path:
    path.mkdir()
    env = {**os.environ, "GIT_AUTHOR_NAME": "Dana", "GIT_AUTHOR_EMAIL": "dana@example.com"}
    env |= {"GIT_COMMITTER_NAME": "Dana", "GIT_COMMITTER_EMAIL": "dana@example.com"}
    for args in (
        ["init", "-q", "-b", "main"],
        ["commit", "-q", "--allow-empty", "-m", "Lower the API's pool size to 5"],
    ):
        subprocess.run(["git", *args], cwd=path, env=env, check=True)
    return path


def install_filesystem_server(folder: Path) -> None:
    """The filesystem server, installed where npx finds it without the registry."""
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail(
            "npm is needed for the filesystem MCP server (Node.js 20: apt install nodejs npm)"
        )
    npm_install(npm, folder, FILESYSTEM, timeout=240)


async def test_the_example_agent_reads_a_runbook_and_recent_changes(
    redis, vendor, tmp_path, monkeypatch
):
    (tmp_path / "project").mkdir()
    config = example(tmp_path / "project", vendor)
    await asyncio.to_thread(install_filesystem_server, config.parent)
    repo = git_repo(tmp_path / "app")
    # mcp-server-git is a test dependency, next to this Python
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    vendor.push(
        ToolCalls(
            [
                ("runbooks__read_text_file", {"path": "database-connections.md"}),
                ("changes__git_log", {"repo_path": ".", "max_count": 3}),
            ]
        ),
        Text("Follow the pool runbook; the pool was lowered to 5 in the last commit."),
    )
    project = parse_project(config.read_text(), str(config), env={})
    engine = Engine(
        project, redis, env={**ENV, "OPENROUTER_API_KEY": "k", "ONCALL_REPO": str(repo)}
    )
    await engine.start()
    try:
        client = Client(engine.store)
        reply = await client.submit(
            {
                "type": "client.message",
                "agent_id": "oncall",
                "message": {"role": "user", "content": "pg_pool_waiting_clients is firing"},
            }
        )
        sid = reply["session_id"]
        end = await wait_for_event(client, sid, turn_ended(reply["turn_id"]), timeout=120)
        assert end["payload"]["type"] == "turn.completed", end
        events = await assert_consistent(engine.store, sid)
    finally:
        await engine.stop()
    offered = [t["function"]["name"] for t in vendor.requests[0].body["tools"]]
    # read-only tools only, as the servers annotate them
    assert "runbooks__read_text_file" in offered and "runbooks__write_file" not in offered
    assert "changes__git_log" in offered and "changes__git_commit" not in offered
    tool_messages = [
        text_of(m["content"]) for m in vendor.requests[1].body["messages"] if m["role"] == "tool"
    ]
    assert any("Postgres connection pool exhausted" in m for m in tool_messages), tool_messages
    assert any("Lower the API's pool size to 5" in m for m in tool_messages), tool_messages
    assert not payloads(events, "tool.call.errored")


async def test_without_the_servers_installed_serve_says_which_are_off_and_the_agent_runs(
    redis, redis_url, vendor, tmp_path
):
    (tmp_path / "project").mkdir()
    config = example(tmp_path / "project", vendor)
    bare = tmp_path / "bin"  # a PATH with python and nothing else
    bare.mkdir()
    (bare / "python3").symlink_to(sys.executable)
    vendor.push(Text("Check the pool first."))
    engine = EngineProcess(config, redis_url, {"PATH": str(bare), "OPENROUTER_API_KEY": "k"})
    await engine.start()
    try:
        store = await Store.open(redis)
        client = Client(store)
        reply = await client.submit(
            {
                "type": "client.message",
                "agent_id": "oncall",
                "message": {"role": "user", "content": "pg_pool_waiting_clients is firing"},
            }
        )
        sid = reply["session_id"]
        end = await wait_for_event(client, sid, turn_ended(reply["turn_id"]), timeout=60)
        assert end["payload"]["type"] == "turn.completed"
        events = await assert_consistent(store, sid)
    finally:
        await engine.stop()
    # Off is a note in the log, once each, never a failed attempt.
    assert not payloads(events, "connector.sync.errored")
    assert sorted(p["path"] for p in payloads(events, "connector.synced") if p.get("off")) == [
        "mcp.changes",
        "mcp.runbooks",
    ]
    log = "\n".join(engine.stderr)
    assert "mcp.runbooks is off: 'npx' is not installed (not found on PATH)" in log, log
    assert "mcp.changes is off: its command names ONCALL_REPO, which is not set" in log, log
    assert [t["function"]["name"] for t in vendor.requests[0].body["tools"]] == ["confirm"]
