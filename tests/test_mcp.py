"""MCP connectors end to end: the real engine, real Redis, the fake model vendor, and a
real MCP server (tests/mcp_server.py, the SDK's `MCPServer`) over stdio and HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from engine.client import Client
from engine.config import parse_project
from engine.runtime.engine import Engine
from tests.engine_helpers import (
    ENV,
    ROOT,
    assert_consistent,
    payloads,
    poll_until,
    turn_ended,
    wait_for_event,
)
from tests.fakes.llm_vendor import FakeVendor, Text, ToolCalls

SERVER = str(ROOT / "tests" / "mcp_server.py")


def toml(vendor: FakeVendor, *, blocks: str, mcp: str, extra: str = "") -> str:
    return textwrap.dedent(
        f"""\
        name = "mcp-test"

        [llm.openai]
        type = "openai"
        base_url = "{vendor.url}/v1"

        {blocks}

        [agent.oncall]
        llm = "openai"
        model = "gpt-4.1-mini"
        system = "You are the on-call assistant."
        mcp = {mcp}
        retry = {{ tool = {{ max_attempts = 3, backoff_base_secs = 0, run_timeout_secs = 20 }}, connector = {{ backoff_base_secs = 0 }} }}
        {extra}
        """
    )


def stdio_block(name: str = "clock", **env: str) -> str:
    pairs = ", ".join(f'{k} = "{v}"' for k, v in {"CLOCK_TZ": "UTC", **env}.items())
    return textwrap.dedent(
        f"""\
        [mcp.{name}]
        command = [{json.dumps(sys.executable)}, {json.dumps(SERVER)}]
        env = {{ {pairs} }}
        """
    )


class Harness:
    """An engine over one project, and a client to talk to it."""

    def __init__(self, redis: Any, vendor: FakeVendor, tmp_path: Path) -> None:
        self.redis, self.vendor, self.tmp_path = redis, vendor, tmp_path
        self.engine: Engine | None = None

    async def start(self, text: str, env: dict[str, str] | None = None) -> Engine:
        path = self.tmp_path / "subs.toml"
        path.write_text(text)
        project = parse_project(text, str(path), env={})
        self.engine = Engine(project, self.redis, env={**ENV, **(env or {})}, lease_ms=3000)
        await self.engine.start()
        return self.engine

    async def stop(self) -> None:
        if self.engine is not None:
            await self.engine.stop()
            self.engine = None

    @property
    def client(self) -> Client:
        assert self.engine is not None
        return Client(self.engine.store)

    async def say(self, text: str, session: str | None = None) -> tuple[str, str]:
        body: dict[str, Any] = {
            "type": "client.message",
            "agent_id": "oncall",
            "message": {"role": "user", "content": text},
        }
        if session:
            body["session_id"] = session
        reply = await self.client.submit(body, identity={"issuer": "cli"})
        return reply["session_id"], reply["turn_id"]

    async def turn(self, text: str, session: str | None = None) -> tuple[str, dict[str, Any]]:
        sid, turn_id = await self.say(text, session)
        end = await wait_for_event(self.client, sid, turn_ended(turn_id), timeout=60)
        return sid, end


@pytest.fixture
async def harness(redis, vendor, tmp_path):
    h = Harness(redis, vendor, tmp_path)
    yield h
    await h.stop()


def offered(vendor: FakeVendor, i: int) -> list[str]:
    """The tool names the model was offered in request `i` (OpenAI body)."""
    return [t["function"]["name"] for t in vendor.requests[i].body.get("tools") or ()]


def tool_message(vendor: FakeVendor, i: int) -> str:
    [msg] = [m for m in vendor.requests[i].body["messages"] if m["role"] == "tool"][-1:]
    return msg["content"]


# -- stdio ------------------------------------------------------------------------------


async def test_a_stdio_server_started_from_command_answers_the_models_tool_call(harness, vendor):
    vendor.push(ToolCalls([("clock__now", {})]), Text("It is noon, UTC."))
    await harness.start(
        toml(
            vendor,
            blocks=stdio_block(),
            mcp='[{ id = "mcp.clock", tools = { include = ["now", "echo", "secret*", "boom"], exclude = ["secret*"] } }]',
        )
    )
    sid, end = await harness.turn("what time is it?")
    assert end["payload"]["type"] == "turn.completed"
    # include then exclude, over the server's own names; the model sees them prefixed
    assert sorted(offered(vendor, 0)) == ["clock__boom", "clock__echo", "clock__now"]
    [tool] = [t for t in vendor.requests[0].body["tools"] if t["function"]["name"] == "clock__now"]
    assert tool["function"]["description"] == "The current time at the clock."
    # env reached the child (the SDK passes almost none of ours)
    assert tool_message(vendor, 1) == "It is 12:00 in UTC."
    events = await assert_consistent(harness.engine.store, sid)
    [synced] = payloads(events, "connector.synced")
    assert synced["path"] == "mcp.clock" and synced["prefix"] == "clock"
    assert {t["name"] for t in synced["tools"]} >= {"now", "echo", "secret_rotate", "grow"}
    [requested] = payloads(events, "tool.call.requested")
    assert requested["handler"] == "server"
    assert requested["params"] == {"connector": "mcp.clock", "tool": "now"}
    [completed] = payloads(events, "tool.call.completed")
    assert completed["result"]["content"] == [{"type": "text", "text": "It is 12:00 in UTC."}]
    types = [e["payload"]["type"] for e in events]
    # recorded before it ran: the list before the first decision, the call before its result
    assert types.index("connector.synced") < types.index("llm.call.requested")
    assert types.index("tool.call.dispatched") < types.index("tool.call.completed")
