"""MCP connectors end to end: the real engine, real Redis, the fake model vendor, and a
real MCP server (tests/mcp_server.py, the SDK's `MCPServer`) over stdio and HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta
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
        retry = {{ tool = {{ max_attempts = 3, backoff_base_secs = 0, run_timeout_secs = 20 }}, \
connector = {{ backoff_base_secs = 0 }} }}
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


async def say(
    client: Client, text: str, session: str | None = None, identity: dict[str, Any] | None = None
) -> tuple[str, str]:
    """Submit a user message to the `oncall` agent; its session and turn ids."""
    body: dict[str, Any] = {
        "type": "client.message",
        "agent_id": "oncall",
        "message": {"role": "user", "content": text},
    }
    reply = await client.submit(body, session_id=session, identity=identity)
    return reply["session_id"], reply["turn_id"]


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
        return await say(self.client, text, session, identity={"issuer": "cli"})

    async def turn(self, text: str, session: str | None = None) -> tuple[str, dict[str, Any]]:
        sid, turn_id = await self.say(text, session)
        end = await wait_for_event(self.client, sid, turn_ended(turn_id), timeout=60)
        return sid, end


@pytest.fixture
async def harness(redis, vendor, tmp_path):
    h = Harness(redis, vendor, tmp_path)
    yield h
    await h.stop()


async def lines(path: Path, n: int) -> list[str]:
    """The file's lines once it has `n` of them (else none): the test server appends one a
    call (MCP_CALLS_LOG) or a start (MCP_PIDS_LOG); a `poll_until` predicate."""
    found = path.read_text().splitlines() if path.exists() else []
    return found if len(found) >= n else []


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
            mcp='[{ id = "mcp.clock", tools = { include = ["now", "echo", "secret*", "boom"], '
            'exclude = ["secret*"] } }]',
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


def off_block(var: str = "CHANGES_DIR") -> str:
    """`mcp.changes`, the test server started in `${var}`: off while `var` is unset."""
    return textwrap.dedent(
        f"""\
        [mcp.changes]
        command = [{json.dumps(sys.executable)}, {json.dumps(SERVER)}]
        cwd = "${{{var}}}"
        """
    )


async def test_an_off_connection_is_a_note_once_not_a_failed_attempt_and_comes_back_on(
    harness, vendor, tmp_path
):
    vendor.push(Text("One."), Text("Two."), Text("Three."), Text("Four."))
    text = toml(vendor, blocks=stdio_block() + off_block(), mcp='["mcp.clock", "mcp.changes"]')
    await harness.start(text)
    sid, end = await harness.turn("one")
    for word in ("two", "three"):
        _, end = await harness.turn(word, sid)
        assert end["payload"]["type"] == "turn.completed"
    events = await assert_consistent(harness.engine.store, sid)
    assert not payloads(events, "connector.sync.errored")  # not one failed attempt
    changes = [p for p in payloads(events, "connector.synced") if p["path"] == "mcp.changes"]
    assert len(changes) == 3  # one sync a turn, answered at once
    off = "its command names CHANGES_DIR, which is not set"
    assert changes[0]["tools"] == [] and changes[0]["off"] == off
    assert all("tools" not in p and "off" not in p for p in changes[1:])  # said once
    assert all(not [n for n in offered(vendor, i) if n.startswith("changes__")] for i in range(3))
    assert "clock__now" in offered(vendor, 2)

    # The variable set, serve restarted: the next sync records the tools again.
    await harness.stop()
    await harness.start(text, env={"CHANGES_DIR": str(tmp_path)})
    _, end = await harness.turn("four", sid)
    assert end["payload"]["type"] == "turn.completed"
    events = await assert_consistent(harness.engine.store, sid)
    last = [p for p in payloads(events, "connector.synced") if p["path"] == "mcp.changes"][-1]
    assert "off" not in last and {t["name"] for t in last["tools"]} >= {"now", "echo"}
    assert "changes__now" in offered(vendor, 3)


async def test_subs_chat_says_an_off_connection_once_as_a_note(vendor, tmp_path):
    from tests.engine_helpers import subs

    vendor.push(Text("One."), Text("Two."), Text("Three."))
    config = tmp_path / "subs.toml"
    config.write_text(toml(vendor, blocks=off_block(), mcp='["mcp.changes"]'))
    code, out, err = await subs(
        "chat", "oncall", "-c", str(config), stdin=b"one\ntwo\nthree\n", timeout=60
    )
    assert code == 0, err
    note = (
        "· mcp.changes is off: its command names CHANGES_DIR, which is not set; "
        "the agent runs without its tools"
    )
    assert out.count(note) == 1, out  # once in the session, not every turn
    assert "✗" not in out + err and "One." in out and "Three." in out


async def test_a_stdio_server_that_exits_at_start_says_why_in_the_failed_attempt(
    harness, vendor, caplog
):
    """Its exit code and the last lines of its stderr, in the recorded error (which the CLI
    and the console show) and once in serve's log; a secret it prints is masked."""
    crash = (
        "import os, sys; print('starting up', file=sys.stderr); "
        "print('token is ' + os.environ['BROKEN_TOKEN'], file=sys.stderr); "
        "print('fatal: /nope is not a git repository', file=sys.stderr); sys.exit(3)"
    )
    blocks = textwrap.dedent(
        f"""\
        [mcp.broken]
        command = [{json.dumps(sys.executable)}, "-c", {json.dumps(crash)}]
        env_from = ["BROKEN_TOKEN"]
        """
    )
    vendor.push(Text("Without it, then."))
    await harness.start(
        toml(vendor, blocks=blocks, mcp='["mcp.broken"]'), env={"BROKEN_TOKEN": "tok-9f8e7d6c"}
    )
    with caplog.at_level("WARNING", logger="subs.mcp"):
        sid, end = await harness.turn("one")
    assert end["payload"]["type"] == "turn.completed"  # the turn runs without its tools
    events = await assert_consistent(harness.engine.store, sid)
    errors = payloads(events, "connector.sync.errored")
    assert len(errors) == 3  # the connector policy's 3 attempts
    for error in errors:
        message = error["error"]["message"]
        assert message.startswith("mcp.broken: its server exited with code 3"), message
        assert "fatal: /nope is not a git repository" in message, message
        assert "starting up" in message and "token is ***" in message, message
        assert "tok-9f8e7d6c" not in json.dumps(error)
    said = [r.getMessage() for r in caplog.records if "exited with code 3" in r.getMessage()]
    assert len(said) == 1, said  # once, not every attempt


async def test_a_tool_error_content_blocks_and_structured_content_are_recorded(harness, vendor):
    vendor.push(
        ToolCalls(
            [("clock__boom", {}), ("clock__picture", {}), ("clock__forecast", {"city": "Oslo"})]
        ),
        Text("The clock is broken, here is a pixel and the weather."),
    )
    await harness.start(toml(vendor, blocks=stdio_block(), mcp='["mcp.clock"]'))
    sid, end = await harness.turn("status?")
    assert end["payload"]["type"] == "turn.completed"
    events = await assert_consistent(harness.engine.store, sid)
    results = {p["id"]: p["result"] for p in payloads(events, "tool.call.completed")}
    names = {p["id"]: p["name"] for p in payloads(events, "tool.call.requested")}
    by_name = {names[i]: r for i, r in results.items()}
    # isError: a result the model sees, not a failed attempt
    assert by_name["clock__boom"]["isError"] is True
    assert "the clock is broken" in by_name["clock__boom"]["content"][0]["text"]
    text, image = by_name["clock__picture"]["content"]
    assert text == {"type": "text", "text": "a pixel"}
    assert image["type"] == "blob" and image["uri"].startswith("data:image/png;base64,")
    assert by_name["clock__forecast"]["structuredContent"] == {
        "city": "Oslo",
        "sky": "clear",
        "high_c": 21,
    }
    messages = [m for m in vendor.requests[1].body["messages"] if m["role"] == "tool"]
    assert any("the clock is broken" in m["content"] for m in messages)


async def test_input_that_breaks_the_servers_schema_is_a_tool_error_before_any_call(
    harness, vendor
):
    vendor.push(ToolCalls([("clock__echo", {"text": 42})]), Text("I sent a number."))
    await harness.start(toml(vendor, blocks=stdio_block(), mcp='["mcp.clock"]'))
    sid, end = await harness.turn("echo 42")
    assert end["payload"]["type"] == "turn.completed"
    events = await assert_consistent(harness.engine.store, sid)
    [errored] = payloads(events, "tool.call.errored")
    assert errored["final"] and "does not fit its schema" in errored["error"]["message"]
    assert "Error: the input of clock__echo" in tool_message(vendor, 1)


# -- streamable HTTP with a bearer token ------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class HttpServer:
    """tests/mcp_server.py over streamable HTTP, started and stopped by the test."""

    def __init__(self, token: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.token = token
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    async def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, SERVER, "--http", str(self.port), "--token", self.token],
            env={**os.environ, "CLOCK_TZ": "Europe/Oslo", **self.env},
            stderr=subprocess.DEVNULL,
        )

        async def up() -> bool:
            assert self.proc is not None and self.proc.poll() is None, "the MCP server died"
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                return False
            writer.close()
            return True

        await poll_until(up, 20, "the HTTP MCP server to listen")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
async def http_server():
    server = HttpServer("right-token")
    await server.start()
    yield server
    server.stop()


def http_block(server: HttpServer) -> str:
    return f'[mcp.clockhttp]\nurl = "{server.url}"\ntoken_env = "CLOCK_TOKEN"\n'


async def test_an_http_server_behind_a_bearer_token_answers(harness, vendor, http_server):
    vendor.push(ToolCalls([("clockhttp__now", {})]), Text("Noon in Oslo."))
    await harness.start(
        toml(vendor, blocks=http_block(http_server), mcp='["mcp.clockhttp"]'),
        env={"CLOCK_TOKEN": "right-token"},
    )
    sid, end = await harness.turn("time?")
    assert end["payload"]["type"] == "turn.completed"
    assert tool_message(vendor, 1) == "It is 12:00 in Europe/Oslo."
    await assert_consistent(harness.engine.store, sid)


async def test_a_refused_token_interrupts_naming_the_connection_and_resumes_once_fixed(
    harness, vendor, http_server
):
    env = {"CLOCK_TOKEN": "wrong-token"}
    vendor.push(ToolCalls([("clockhttp__now", {})]), Text("Noon in Oslo."))
    await harness.start(
        toml(vendor, blocks=http_block(http_server), mcp='["mcp.clockhttp"]'), env=env
    )
    sid, turn_id = await harness.say("time?")
    paused = await wait_for_event(
        harness.client, sid, lambda e: e["payload"]["type"] == "session.interrupted"
    )
    interrupt = paused["payload"]
    assert "mcp.clockhttp" in interrupt["reason"] and "401" in interrupt["reason"]
    assert interrupt["payload"]["metadata"]["connector"] == "mcp.clockhttp"
    assert vendor.requests == []  # the model was not asked without its tools
    harness.engine.effects.env["CLOCK_TOKEN"] = "right-token"  # the operator fixes the secret
    await harness.client.submit(
        {"type": "interrupt.resume", "interrupt_id": interrupt["interrupt_id"]}, session_id=sid
    )
    end = await wait_for_event(harness.client, sid, turn_ended(turn_id), timeout=60)
    assert end["payload"]["type"] == "turn.completed"
    assert "clockhttp__now" in offered(vendor, 0)
    events = await assert_consistent(harness.engine.store, sid)
    [failed_sync] = [p for p in payloads(events, "connector.sync.errored") if p["final"]]
    assert failed_sync["error"]["detail"] == {
        "connector": "mcp.clockhttp",
        "reason": "unauthorized",
    }
    assert len(payloads(events, "connector.synced")) == 1


async def test_degrade_runs_the_turn_without_the_refused_connection(harness, vendor, http_server):
    vendor.push(Text("I cannot read the clock."))
    await harness.start(
        toml(
            vendor,
            blocks=http_block(http_server) + stdio_block(),
            mcp='["mcp.clock", { id = "mcp.clockhttp", auth_failure = "degrade" }]',
        ),
        env={"CLOCK_TOKEN": "wrong-token"},
    )
    sid, end = await harness.turn("time?")
    assert end["payload"]["type"] == "turn.completed"
    names = offered(vendor, 0)
    assert "clock__now" in names and not any(n.startswith("clockhttp__") for n in names)
    await assert_consistent(harness.engine.store, sid)


# -- a server that dies, a list that changes ------------------------------------------


async def test_a_server_killed_mid_call_is_a_recorded_tool_error_then_the_call_recovers(
    harness, vendor, tmp_path
):
    calls_log, flag = tmp_path / "calls.log", tmp_path / "flag"
    vendor.push(ToolCalls([("clock__slow", {"flag": str(flag)})]), Text("Done at last."))
    await harness.start(
        toml(vendor, blocks=stdio_block(MCP_CALLS_LOG=str(calls_log)), mcp='["mcp.clock"]')
    )
    sid, turn_id = await harness.say("run the slow thing")

    [first] = await poll_until(lambda: lines(calls_log, 1), 20, "the first call to reach it")
    os.kill(int(first.split()[1]), 9)  # the server dies in the middle of the call
    second = await poll_until(lambda: lines(calls_log, 2), 30, "the call to be sent again")
    assert second[1].split()[1] != first.split()[1]  # to a restarted server
    flag.touch()
    end = await wait_for_event(harness.client, sid, turn_ended(turn_id), timeout=60)
    assert end["payload"]["type"] == "turn.completed"
    events = await assert_consistent(harness.engine.store, sid)
    [errored] = payloads(events, "tool.call.errored")
    assert errored["attempt"] == 1 and errored["retryable"] and not errored["final"]
    assert "mcp.clock" in errored["error"]["message"]
    [completed] = payloads(events, "tool.call.completed")
    assert completed["result"]["content"][0]["text"] == "slow is done"
    assert tool_message(vendor, 1) == "slow is done"


async def test_a_stdio_server_that_dies_between_calls_is_restarted_and_stopped_with_the_engine(
    harness, vendor, tmp_path
):
    pids_log = tmp_path / "pids.log"
    vendor.push(Text("First."), ToolCalls([("clock__now", {})]), Text("Second."))
    await harness.start(
        toml(vendor, blocks=stdio_block(MCP_PIDS_LOG=str(pids_log)), mcp='["mcp.clock"]')
    )
    sid, _ = await harness.turn("one")

    [first] = [int(pid) for pid in await lines(pids_log, 1)]
    os.kill(first, 9)  # no request out: the engine finds out by itself
    restarted = [
        int(pid)
        for pid in await poll_until(lambda: lines(pids_log, 2), 20, "the server to start again")
    ]
    _, end = await harness.turn("two", sid)
    assert end["payload"]["type"] == "turn.completed"
    events = await assert_consistent(harness.engine.store, sid)
    assert not payloads(events, "tool.call.errored")  # it was back before it was needed
    assert tool_message(vendor, 2) == "It is 12:00 in UTC."
    await harness.stop()
    with pytest.raises(ProcessLookupError):  # stopped with the engine
        os.kill(restarted[-1], 0)


async def test_list_changed_and_connector_sync_update_the_offered_tools(harness, vendor):
    vendor.push(
        ToolCalls([("clock__grow", {})]),
        Text("Grown."),
        Text("I see a new tool."),
        ToolCalls([("clock__grow_quietly", {})]),
        Text("Grown quietly."),
        Text("No news."),
        Text("Now I see hush."),
    )
    await harness.start(toml(vendor, blocks=stdio_block(), mcp='["mcp.clock"]'))
    sid, _ = await harness.turn("grow")
    assert "clock__later" not in offered(vendor, 0)
    # the server said its list changed: the next turn's sync fetches it
    await harness.turn("and now?", sid)
    assert "clock__later" in offered(vendor, 2)
    await harness.turn("grow quietly", sid)
    # no notification: the cached list holds, until someone asks for a sync
    await harness.turn("anything new?", sid)
    assert "clock__hush" not in offered(vendor, 5)
    sync = await harness.client.submit(
        {
            "type": "client.action",
            "agent_id": "oncall",
            "name": "connector.sync",
            "args": {"path": "mcp.clock"},
        },
        session_id=sid,
    )
    await wait_for_event(harness.client, sid, turn_ended(sync["turn_id"]))
    await harness.turn("and now?", sid)
    assert "clock__hush" in offered(vendor, 6)
    events = await assert_consistent(harness.engine.store, sid)
    synced = payloads(events, "connector.synced")
    assert len(synced) == 6  # one sync a turn; a list recorded only when it changed:
    lists = [sorted(t["name"] for t in p["tools"]) for p in synced if "tools" in p]
    assert len(lists) == 3  # the first, the one `grow` announced, the forced sync's
    assert "later" not in lists[0] and "later" in lists[1]
    assert "hush" in lists[-1] and "hush" not in lists[-2]
    forced = [p for p in payloads(events, "connector.sync.requested") if p.get("params")]
    assert [p["params"] for p in forced] == [{"force": True}]


# -- an engine killed in the middle of a call ------------------------------------------


def assert_sent_again_once(events: list[dict[str, Any]], sent: list[str], turn_id: str) -> None:
    """What a kill mid-call promises, and no more: the attempt out with the killed engine
    is recorded failed ("stopped", not final) and sent again; one attempt is out at a time,
    each after the first follows its predecessor's recorded failure; a server is sent at
    most one call an attempt; the call completes once and the turn ends once.

    Not promised: exactly two attempts. Under load the next engine's attempt can fail
    before it reaches the server (its deadline passes while that engine's server starts)
    and a third is sent: dispatched [1, 2, 3] with two calls at the servers is a fact of
    the log, not a double send (the flake this test had under `-n 2`)."""
    tool = [e["payload"] for e in events if e["payload"]["type"].startswith("tool.call.")]
    steps = [(p["type"], p.get("attempt")) for p in tool if p["type"] != "tool.call.requested"]
    attempts = [a for kind, a in steps if kind == "tool.call.dispatched"]
    assert len(attempts) >= 2 and attempts == list(range(1, len(attempts) + 1)), steps
    expected = [("tool.call.dispatched", 1)]
    for n in attempts[1:]:
        expected += [("tool.call.errored", n - 1), ("tool.call.dispatched", n)]
    assert steps == [*expected, ("tool.call.completed", None)], steps
    errored = payloads(events, "tool.call.errored")
    assert not any(e["final"] for e in errored)
    assert "stopped" in errored[0]["error"]["message"]  # attempt 1: lost with its engine
    assert 2 <= len(sent) <= len(attempts), (sent, steps)  # the killed one's, then one at most
    [completed] = payloads(events, "tool.call.completed")
    assert completed["result"]["content"][0]["text"] == "slow is done"
    assert len([e for e in events if turn_ended(turn_id)(e)]) == 1


def _kill_log(*steps: tuple[str, int | None, str]) -> list[dict[str, Any]]:
    """A session's tool-call events after a kill, as the engine records them."""
    out: list[dict[str, Any]] = []
    for kind, attempt, why in steps:
        payload: dict[str, Any] = {"type": f"tool.call.{kind}", "id": "call_1"}
        if kind in ("dispatched", "errored"):
            payload["attempt"] = attempt
        if kind == "errored":
            payload |= {"error": {"message": why}, "retryable": True, "final": False}
        if kind == "completed":
            payload["result"] = {"content": [{"type": "text", "text": "slow is done"}]}
        out.append({"seq": len(out) + 1, "turn_id": "T", "payload": payload})
    end = {"seq": len(out) + 1, "turn_id": "T", "payload": {"type": "turn.completed"}}
    return [*out, end]


STOPPED = "the engine running this call stopped"
LATE = "mcp.clock did not answer slow before the deadline"


@pytest.mark.parametrize(
    ("steps", "sent", "holds"),
    [
        ([("dispatched", 1, ""), ("errored", 1, STOPPED), ("dispatched", 2, "")], 2, True),
        (  # the flake: attempt 2 ran out of time before the new server was up
            [
                ("dispatched", 1, ""),
                ("errored", 1, STOPPED),
                ("dispatched", 2, ""),
                ("errored", 2, LATE),
                ("dispatched", 3, ""),
            ],
            2,
            True,
        ),
        (  # sent twice for one attempt
            [("dispatched", 1, ""), ("errored", 1, STOPPED), ("dispatched", 2, "")],
            3,
            False,
        ),
        (  # a second attempt out while the first was: a double dispatch
            [
                ("dispatched", 1, ""),
                ("errored", 1, STOPPED),
                ("dispatched", 2, ""),
                ("dispatched", 3, ""),
            ],
            2,
            False,
        ),
        ([("dispatched", 1, ""), ("dispatched", 2, "")], 2, False),  # no failure recorded
    ],
)
def test_what_a_kill_mid_call_promises(steps, sent, holds):
    events = _kill_log(*steps, ("completed", None, ""))
    lines = [f"slow {100 + i}" for i in range(sent)]
    if holds:
        assert_sent_again_once(events, lines, "T")
    else:
        with pytest.raises(AssertionError):
            assert_sent_again_once(events, lines, "T")


async def test_an_engine_killed_during_a_call_sends_it_again_once_and_the_turn_ends(
    redis, redis_url, vendor, tmp_path
):
    from engine.store.store import Store
    from tests.engine_helpers import EngineProcess

    calls_log, flag = tmp_path / "calls.log", tmp_path / "flag"
    vendor.push(ToolCalls([("clock__slow", {"flag": str(flag)})]), Text("Done at last."))
    config = tmp_path / "subs.toml"
    config.write_text(
        toml(vendor, blocks=stdio_block(MCP_CALLS_LOG=str(calls_log)), mcp='["mcp.clock"]')
    )
    engines = [EngineProcess(config, redis_url)]
    store = await Store.open(redis)
    client = Client(store)
    servers: list[int] = []
    try:
        await engines[0].start()
        sid, turn_id = await say(client, "run the slow thing")

        await poll_until(lambda: lines(calls_log, 1), 30, "the call to reach the server")
        engines[0].kill()  # SIGKILL, mid-call
        assert await engines[0].stop() == -9
        engines.append(EngineProcess(config, redis_url))
        await engines[1].start()
        sent = await poll_until(
            lambda: lines(calls_log, 2), 30, "the next engine to send the call again"
        )
        servers = [int(line.split()[1]) for line in sent]
        flag.touch()
        end = await wait_for_event(client, sid, turn_ended(turn_id), timeout=60)
        assert end["payload"]["type"] == "turn.completed"
        events = await assert_consistent(store, sid)
        assert_sent_again_once(events, calls_log.read_text().splitlines(), turn_id)
    finally:
        for engine in engines:
            if engine.proc is not None and engine.proc.returncode is None:
                await engine.stop()
        for pid in servers:  # the killed engine's server, if its closed stdin left it waiting
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)


@pytest.mark.slow  # the attempt's 20 s deadline runs out; the promise is checked each run
async def test_a_server_slow_to_start_after_a_kill_costs_an_attempt_not_a_second_send(
    redis, redis_url, vendor, tmp_path
):
    """The flake above made certain: the next engine's server is not up before attempt 2's
    deadline, so attempt 2 fails unsent and attempt 3 is the one the server gets."""
    from engine.store.store import Store
    from tests.engine_helpers import EngineProcess

    calls_log, flag, gate = tmp_path / "calls.log", tmp_path / "flag", tmp_path / "gate"
    gate.touch()
    vendor.push(ToolCalls([("clock__slow", {"flag": str(flag)})]), Text("Done at last."))
    config = tmp_path / "subs.toml"
    block = stdio_block(MCP_CALLS_LOG=str(calls_log), MCP_START_GATE=str(gate))
    config.write_text(toml(vendor, blocks=block, mcp='["mcp.clock"]'))
    engines = [EngineProcess(config, redis_url)]
    store = await Store.open(redis)
    client = Client(store)
    servers: list[int] = []
    try:
        await engines[0].start()
        sid, turn_id = await say(client, "run the slow thing")
        sent = await poll_until(lambda: lines(calls_log, 1), 30, "the call to reach the server")
        servers = [int(line.split()[1]) for line in sent]
        engines[0].kill()
        assert await engines[0].stop() == -9
        gate.unlink()  # the next engine's server hangs at its start
        engines.append(EngineProcess(config, redis_url))
        await engines[1].start()

        def third(e: dict[str, Any]) -> bool:
            p = e["payload"]
            return p["type"] == "tool.call.dispatched" and p["attempt"] == 3

        await wait_for_event(client, sid, third, timeout=60)
        gate.touch()
        await poll_until(lambda: lines(calls_log, 2), 30, "the third attempt to reach the server")
        flag.touch()
        end = await wait_for_event(client, sid, turn_ended(turn_id), timeout=60)
        assert end["payload"]["type"] == "turn.completed"
        events = await assert_consistent(store, sid)
        sent = calls_log.read_text().splitlines()
        assert_sent_again_once(events, sent, turn_id)
        late = payloads(events, "tool.call.errored")[1]
        assert late["attempt"] == 2 and late["error"]["code"] == "deadline_exceeded", late
        assert len(sent) == 2
    finally:
        for engine in engines:
            if engine.proc is not None and engine.proc.returncode is None:
                await engine.stop()
        for pid in servers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)


# -- an off-the-shelf server from PyPI, through `subs run` ---------------------------------


async def test_mcp_server_time_from_pypi_answers_through_subs_run(vendor, tmp_path):
    from tests.engine_helpers import subs

    program = Path(sys.executable).parent / "mcp-server-time"
    assert program.exists(), "mcp-server-time is a test dependency (pyproject's test extra)"
    vendor.push(
        ToolCalls([("time__get_current_time", {"timezone": "Europe/Oslo"})]),
        Text("It is evening in Oslo."),
    )
    config = tmp_path / "subs.toml"
    config.write_text(
        toml(
            vendor,
            blocks=f"[mcp.time]\ncommand = [{json.dumps(str(program))}, "
            '"--local-timezone", "UTC"]\n',
            mcp='[{ id = "mcp.time", tools = { read_only = true } }]',
        )
    )
    code, out, err = await subs(
        "run", "-o", "pretty", "oncall", "what time is it in Oslo?", "-c", str(config), timeout=90
    )
    assert code == 0, err
    assert out.strip().splitlines() == [
        '→ time__get_current_time({"timezone": "Europe/Oslo"})',
        "It is evening in Oslo.",
    ]
    assert sorted(offered(vendor, 0)) == ["time__convert_time", "time__get_current_time"]
    answer = json.loads(tool_message(vendor, 1))
    assert answer["timezone"] == "Europe/Oslo" and answer["datetime"][:2] == "20"


# -- in Slack ----------------------------------------------------------------------------


async def test_in_slack_a_refused_credential_asks_with_a_retry_button_that_resumes(
    redis, vendor, http_server, tmp_path
):
    from bot.turns.routing import session_id_for
    from tests.bot_helpers import serve_bots
    from tests.engine_helpers import project_toml

    agent = "ops_anthropic"
    text = project_toml(vendor.url).replace(
        "[agent.ops_anthropic]\n", '[agent.ops_anthropic]\nmcp = ["mcp.clockhttp"]\n'
    )
    text += http_block(http_server) + f'\n[agent.{agent}.slack]\nanswers = "both"\n'
    project = parse_project(text, str(tmp_path / "subs.toml"), env={})
    env = {**ENV, "CLOCK_TOKEN": "wrong-token"}
    vendor.push(ToolCalls([("clockhttp__now", {})]), Text("It is noon in Oslo."))
    async with serve_bots(redis, vendor, project, agent, engine_env=env) as world:
        fake = world.fake
        mention = fake.post_as_user(fake.general, fake.mention("what time is it?"))
        await fake.send_event(world.url, fake.event_for(mention, kind="app_mention"))

        def prompt_shown():
            mine = [m for m in fake.thread(mention.channel, mention.ts) if m.bot_id]
            return mine[0] if mine and "actions" in [b["type"] for b in mine[0].blocks] else None

        prompt = await fake.until(prompt_shown, timeout=20)
        assert "mcp.clockhttp" in str(prompt.blocks)
        [retry] = [e for b in prompt.blocks if b["type"] == "actions" for e in b["elements"]]
        assert retry["text"]["text"] == "Retry"
        env["CLOCK_TOKEN"] = "right-token"  # the secret is fixed; the person clicks Retry
        await fake.send_action(world.url, fake.block_action(prompt, retry["action_id"]))
        reply = await world.reply_to(mention, nth=2)
        assert reply.text == "It is noon in Oslo."
        events = await world.client.events(session_id_for(agent, fake.general.id, mention.ts))
    [completed] = payloads(events, "tool.call.completed")
    assert completed["result"]["content"][0]["text"] == "It is 12:00 in Europe/Oslo."
    kinds = [e["payload"]["type"] for e in events]
    assert kinds.count("session.interrupt_resumed") == 1 and kinds[-1] == "turn.completed"


# -- slow and garbled servers --------------------------------------------------------------


async def test_a_call_past_its_deadline_is_a_recorded_retryable_error_never_a_hang(
    harness, vendor, tmp_path
):
    calls_log, flag = tmp_path / "calls.log", tmp_path / "flag"
    vendor.push(ToolCalls([("clock__slow", {"flag": str(flag)})]), Text("Second time lucky."))
    text = toml(vendor, blocks=stdio_block(MCP_CALLS_LOG=str(calls_log)), mcp='["mcp.clock"]')
    text = text.replace("run_timeout_secs = 20", "run_timeout_secs = 1")
    await harness.start(text)
    sid, turn_id = await harness.say("run the slow thing")

    await poll_until(lambda: lines(calls_log, 2), 30, "the call to time out and be sent again")
    flag.touch()
    end = await wait_for_event(harness.client, sid, turn_ended(turn_id), timeout=60)
    assert end["payload"]["type"] == "turn.completed"
    events = await assert_consistent(harness.engine.store, sid)
    first = payloads(events, "tool.call.errored")[0]
    assert first["error"]["code"] == "deadline_exceeded" and first["retryable"]
    assert "did not answer slow before the deadline" in first["error"]["message"]
    assert payloads(events, "tool.call.completed")


async def test_a_server_answering_garbage_is_retried_then_the_turn_runs_without_it(harness, vendor):
    from aiohttp import web

    async def garbage(request: web.Request) -> web.Response:
        return web.Response(text="<html>502 Bad Gateway</html>", content_type="text/html")

    app = web.Application()
    app.router.add_route("*", "/mcp", garbage)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/mcp"
    try:
        vendor.push(Text("I could not reach the tickets."))
        await harness.start(
            toml(vendor, blocks=f'[mcp.tickets]\nurl = "{url}"\n', mcp='["mcp.tickets"]')
        )
        sid, end = await harness.turn("any tickets?")
    finally:
        await runner.cleanup()
    assert end["payload"]["type"] == "turn.completed"
    assert offered(vendor, 0) == []
    events = await assert_consistent(harness.engine.store, sid)
    errors = payloads(events, "connector.sync.errored")
    assert [e["final"] for e in errors] == [False, False, True]  # the connector policy: 3 tries
    assert all(e["retryable"] and "mcp.tickets" in e["error"]["message"] for e in errors)


async def test_subs_check_lists_the_connections_that_cannot_start_here(vendor, tmp_path):
    from tests.engine_helpers import subs

    config = tmp_path / "subs.toml"
    config.write_text(
        toml(
            vendor,
            blocks=stdio_block()
            + '[mcp.gone]\ncommand = ["no-such-mcp-server"]\n'
            + '[mcp.repo]\ncommand = ["mcp-server-git", "--repository", "${SOME_REPO}"]\n',
            mcp='["mcp.clock", "mcp.gone", "mcp.repo"]',
        )
    )
    code, out, err = await subs("check", "-c", str(config), env={"SOME_REPO": ""})
    assert code == 0, err  # nothing the file needs is missing: an off connection is not fatal
    assert [json.loads(line) for line in out.splitlines()] == [
        {"off": "mcp.gone", "why": "'no-such-mcp-server' is not installed (not found on PATH)"},
        {"off": "mcp.repo", "why": "its command names SOME_REPO, which is not set"},
    ]


# -- approval before a destructive call -----------------------------------------------------


async def test_a_destructive_tool_waits_for_approval_and_a_declined_one_is_a_tool_error(
    harness, vendor, tmp_path
):
    """`approve = "destructive"`: the server's `secret_rotate` (destructiveHint) is held at
    an interrupt naming it and its arguments; the server sees no call until a person
    approves; declined, the model reads a tool error and the server still sees nothing."""
    calls_log = tmp_path / "calls.log"
    await harness.start(
        toml(
            vendor,
            blocks=stdio_block(MCP_CALLS_LOG=str(calls_log)),
            mcp='[{ id = "mcp.clock", approve = "destructive" }]',
        )
    )
    client = harness.client

    async def asked(text: str, session: str | None = None) -> tuple[str, str, dict[str, Any]]:
        sid, turn_id = await harness.say(text, session)
        raised = await wait_for_event(
            client,
            sid,
            lambda e: e["payload"]["type"] == "session.interrupted" and e["turn_id"] == turn_id,
            timeout=60,
        )
        return sid, turn_id, raised["payload"]

    vendor.push(ToolCalls([("clock__secret_rotate", {"why": "leaked"})]), Text("Rotated."))
    sid, turn_id, interrupt = await asked("rotate the secret")
    assert interrupt["origin"] == "approval"
    metadata = interrupt["payload"]["metadata"]
    assert (metadata["tool"], metadata["arguments"]) == ("clock__secret_rotate", {"why": "leaked"})
    assert [o["value"] for o in metadata["options"]] == ["approve", "decline"]
    events = await client.events(sid)
    assert not payloads(events, "tool.call.dispatched")  # held, not sent
    assert not (calls_log.exists() and "secret_rotate" in calls_log.read_text())

    resume = {"type": "interrupt.resume", "interrupt_id": interrupt["interrupt_id"]}
    await client.submit({**resume, "payload": {"value": "approve"}}, session_id=sid)
    end = await wait_for_event(client, sid, turn_ended(turn_id), timeout=60)
    assert end["payload"]["type"] == "turn.completed"
    assert (await lines(calls_log, 1))[0].startswith("secret_rotate ")
    assert tool_message(vendor, 1) == "rotated"

    vendor.push(ToolCalls([("clock__secret_rotate", {})]), Text("Not rotated, then."))
    sid, turn_id, interrupt = await asked("rotate it again", sid)
    resume = {"type": "interrupt.resume", "interrupt_id": interrupt["interrupt_id"]}
    await client.submit({**resume, "payload": {"value": "decline"}}, session_id=sid)
    end = await wait_for_event(client, sid, turn_ended(turn_id), timeout=60)
    assert end["payload"]["type"] == "turn.completed"
    assert "clock__secret_rotate was not run: a person declined it" in tool_message(vendor, 3)
    assert len(calls_log.read_text().splitlines()) == 1  # the declined call never reached it
    await assert_consistent(harness.engine.store, sid)


async def test_an_approval_prompt_expires_after_approve_timeout_and_the_model_reads_why(
    harness, vendor, tmp_path
):
    """An approval interrupt carries its own `expiresAt` (`[mcp.<id>] approve_timeout`):
    nobody answering, the engine's timer resolves it as expired, the call is never sent,
    and the model reads a tool error saying so; the turn ends."""
    calls_log = tmp_path / "calls.log"
    block = stdio_block(MCP_CALLS_LOG=str(calls_log)) + 'approve_timeout = "800ms"\n'
    await harness.start(toml(vendor, blocks=block, mcp='[{ id = "mcp.clock" }]'))
    client = harness.client
    vendor.push(ToolCalls([("clock__secret_rotate", {"why": "leaked"})]), Text("It waited."))
    before = datetime.now(UTC)
    sid, turn_id = await harness.say("rotate the secret")
    raised = await wait_for_event(
        client, sid, lambda e: e["payload"]["type"] == "session.interrupted", timeout=60
    )
    expires = datetime.fromisoformat(raised["payload"]["payload"]["expiresAt"])
    assert (
        before + timedelta(milliseconds=800)
        <= expires
        <= datetime.now(UTC) + timedelta(milliseconds=800)
    )
    end = await wait_for_event(client, sid, turn_ended(turn_id), timeout=60)
    assert end["payload"]["type"] == "turn.completed"
    assert "nobody approved it before the prompt expired" in tool_message(vendor, 1)
    assert not (calls_log.exists() and "secret_rotate" in calls_log.read_text())
    await assert_consistent(harness.engine.store, sid)


async def test_an_mcp_call_carries_its_spans_trace_context_when_tracing(harness, vendor):
    """With tracing on, a tool call's `params._meta.traceparent` names the call attempt's
    span (the OpenTelemetry MCP conventions); with it off, the server gets none."""
    from engine.telemetry.ids import parse_traceparent
    from tests.otlp_receiver import otlp_receiver

    async with otlp_receiver() as receiver:
        text = toml(vendor, blocks=stdio_block(), mcp='[{ id = "mcp.clock" }]')
        await harness.start(text + f'\n[telemetry]\nendpoint = "{receiver.url}"\n')
        vendor.push(ToolCalls([("clock__traced", {})]), Text("Traced."))
        sid, end = await harness.turn("trace it")
        assert end["payload"]["type"] == "turn.completed"
        assert harness.engine is not None
        events = await harness.client.events(sid)
        [requested] = payloads(events, "tool.call.requested")
        sent = parse_traceparent(tool_message(vendor, 1))
        await harness.stop()
    assert sent is not None and sent.sampled
    (span,) = [s for s in receiver.spans if s["name"] == "execute_tool clock__traced"]
    assert (sent.trace_id, sent.span_id) == (span["trace_id"], span["span_id"])
    assert span["attributes"]["gen_ai.tool.call.id"] == requested["id"]


async def test_without_tracing_an_mcp_call_carries_no_trace_context(harness, vendor):
    await harness.start(toml(vendor, blocks=stdio_block(), mcp='[{ id = "mcp.clock" }]'))
    vendor.push(ToolCalls([("clock__traced", {})]), Text("Not traced."))
    _, end = await harness.turn("trace it")
    assert end["payload"]["type"] == "turn.completed"
    assert tool_message(vendor, 1) == "none"
