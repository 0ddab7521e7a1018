"""A question at the keyboard as a person meets it, through a pseudo-terminal that is the
command's controlling terminal (a typed Ctrl-C is the terminal's SIGINT): Ctrl-C leaves
at once saying how to resume, `--session` asks the open question again, and a run
whose `subs serve` goes away says so within seconds and goes on when it is back.

Real `subs` processes, a real `subs serve` child on loopback, real Redis; the LLM vendor
is the fake one (tests/fakes/llm_vendor/)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import termios
import time
from pathlib import Path

from engine.cli.remote import HttpClient
from engine.cli.terminal import open_turn
from tests.engine_helpers import EngineProcess, subs
from tests.fakes.llm_vendor import Text, ToolCalls
from tests.test_console_pty import Terminal, terminal

QUESTION = "confirm: Restart the db?\r\n> "
RESUME = re.compile(r"subs (run|chat) ops_openai --session (ses_\w+)")


async def _ctrl_c_leaves_at_once(term: Terminal) -> tuple[str, str]:
    """Types Ctrl-C; the command has exited within a second. Returns (command, session)."""
    assert term.proc is not None
    hit = time.monotonic()
    term.type("\x03")
    async with asyncio.timeout(1.0):
        code = await term.proc.wait()
    took = time.monotonic() - hit
    await term.expect("--session ")
    found = RESUME.search(term.screen)
    assert found, term.screen
    assert code == 130, (code, term.screen)
    assert took < 1.0, took
    return found.group(1), found.group(2)


def _tool_results(vendor) -> list[str]:
    """The `tool` messages the model was sent, in order (OpenAI chat format)."""
    out = []
    for request in vendor.requests:
        for message in (request.body or {}).get("messages", []):
            if message.get("role") == "tool":
                out.append(message.get("content"))
    return out


async def test_ctrl_c_at_a_question_leaves_and_run_session_asks_it_again(config: Path, vendor):
    vendor.push(ToolCalls([("confirm", {"question": "Restart the db?"})]), Text("Restarted."))
    async with terminal("run", "ops_openai", "fix it", "-c", str(config), ctty=True) as term:
        await term.expect(QUESTION)
        command, sid = await _ctrl_c_leaves_at_once(term)
    assert command == "run"
    assert "waits for your answer" in term.screen, term.screen
    # Picked up: the same question, asked again; its answer finishes the turn.
    args = ("run", "ops_openai", "--session", sid, "-c", str(config))
    async with terminal(*args, ctty=True) as again:
        await again.expect("is waiting for your answer")
        await again.expect(QUESTION)
        again.type("yes\n")
        await again.expect("Restarted.")
    assert again.proc is not None and again.proc.returncode == 0, again.screen
    assert "queued" not in again.screen, again.screen
    assert len(vendor.requests) == 2 and "yes" in str(_tool_results(vendor)), vendor.requests


async def test_a_message_with_session_waits_for_the_open_questions_then_runs(
    config: Path, vendor, serve_processes
):
    serve = await serve_processes()
    vendor.push(
        ToolCalls([("confirm", {"question": "Restart the db?"})]),
        Text("Restarted."),
        Text("All quiet now."),
    )
    async with terminal("run", "ops_openai", "fix it", "--url", serve.api, ctty=True) as term:
        await term.expect(QUESTION)
        _, sid = await _ctrl_c_leaves_at_once(term)
    assert "goes on in the engine" not in term.screen  # it waits on the person
    # And an interrupt on top, raised through the API, with options to choose from.
    remote = HttpClient(serve.api)
    try:
        options = [{"label": "Approve", "value": "approve"}, {"label": "Deny", "value": "deny"}]
        body = {"message": "Approve the restart?", "metadata": {"options": options}}
        raised = await remote.interrupt(sid, "needs a human", body)
    finally:
        await remote.aclose()
    args = ("run", "ops_openai", "and now?", "--session", sid, "--url", serve.api)
    async with terminal(*args, ctty=True) as again:
        await again.expect("your message is sent once it ends, as the next turn")
        await again.expect(QUESTION)
        again.type("yes\n")
        await again.expect("Approve the restart?\r\n  1. Approve\r\n  2. Deny\r\n> ")
        again.type("1\n")
        await again.expect("Restarted.")
        await again.expect("All quiet now.")
    assert again.proc is not None and again.proc.returncode == 0, again.screen
    assert "queued" not in again.screen, again.screen
    # The message went to the model after the answer, in a turn of its own.
    assert len(vendor.requests) == 3
    last = vendor.requests[2].body["messages"]
    assert last[-1] == {"role": "user", "content": "and now?"}, last
    events = await _events(serve.api, sid)
    resumed = [e["payload"] for e in events if e["payload"]["type"] == "session.interrupt_resumed"]
    assert [(r["interrupt_id"], r.get("payload")) for r in resumed] == [
        (raised["interrupt_id"], {"value": "approve"})
    ], resumed
    # Nothing open any more: `--session` alone has nothing to pick up, and says what to do.
    code, _, err = await subs("run", "ops_openai", "--session", sid, "--url", serve.api)
    assert code == 2 and f"session {sid} has no turn running: give a message" in err, err


async def _events(api: str, sid: str) -> list[dict]:
    remote = HttpClient(api)
    try:
        return await remote.events(sid)
    finally:
        await remote.aclose()


async def test_chat_ctrl_c_at_a_question_leaves_and_chat_session_asks_it_again(
    config: Path, vendor
):
    vendor.push(ToolCalls([("confirm", {"question": "Restart the db?"})]), Text("Restarted."))
    async with terminal("chat", "ops_openai", "-c", str(config), ctty=True) as term:
        await term.expect("you> ")
        term.type("fix it\r")
        await term.expect(QUESTION)
        command, sid = await _ctrl_c_leaves_at_once(term)
    assert command == "chat"
    async with terminal("chat", "ops_openai", "--session", sid, "-c", str(config), ctty=True) as t:
        await t.expect(QUESTION)
        t.type("yes\r")
        await t.expect("Restarted.")
        at = await t.expect("you> ")
        t.type("\x04")  # Ctrl-D at `you>`: leaves
    assert t.proc is not None and t.proc.returncode == 0, t.screen[at:]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_a_run_says_when_its_serve_is_gone_and_goes_on_when_it_is_back(
    config: Path, vendor, redis_url: str
):
    vendor.push(ToolCalls([("confirm", {"question": "Restart the db?"})]), Text("Restarted."))
    port = _free_port()
    first = await EngineProcess(config, redis_url, port=port).start()
    second: EngineProcess | None = None
    try:
        async with terminal("run", "ops_openai", "fix it", "--url", first.api, ctty=True) as term:
            await term.expect(QUESTION)
            stopped = time.monotonic()
            await first.stop()
            await term.expect("cannot reach the engine at", timeout=5.0)
            assert time.monotonic() - stopped < 5.0
            second = await EngineProcess(config, redis_url, port=port).start()
            await term.expect("answers again")
            term.type("yes\n")
            await term.expect("Restarted.")
        assert term.proc is not None and term.proc.returncode == 0, term.screen
        assert term.screen.count("→ confirm(") == 1, term.screen  # no event shown twice
        assert term.screen.count("cannot reach the engine") == 1, term.screen
    finally:
        await first.stop()
        if second is not None:
            await second.stop()


async def test_ctrl_c_while_the_engine_is_away_leaves_at_once(
    config: Path, vendor, serve_processes
):
    vendor.push(ToolCalls([("confirm", {"question": "Restart the db?"})]))
    serve = await serve_processes()
    async with terminal("run", "ops_openai", "fix it", "--url", serve.api, ctty=True) as term:
        await term.expect(QUESTION)
        await serve.stop()
        await term.expect("still trying (Ctrl-C stops)", timeout=5.0)
        _, sid = await _ctrl_c_leaves_at_once(term)
    assert sid.startswith("ses_")


async def test_ctrl_c_at_you_leaves_at_once_with_the_terminal_as_it_was(config: Path):
    # readline puts the terminal in a mode of its own while it reads `you>`; a chat that
    # leaves mid-line must hand it back as it found it (echo, line editing by the kernel).
    term = Terminal()
    found = termios.tcgetattr(term.master)
    await term.start("chat", "ops_openai", "-c", str(config), ctty=True)
    try:
        await term.expect("you> ")
        assert termios.tcgetattr(term.master) != found  # readline's own mode, meanwhile
        hit = time.monotonic()
        term.type("\x03")
        assert term.proc is not None
        async with asyncio.timeout(1.0):
            code = await term.proc.wait()
        assert time.monotonic() - hit < 1.0
        assert code == 130, term.screen
        assert termios.tcgetattr(term.master) == found
        await term.expect("subs: stopped")
    finally:
        await term.close()


def _e(seq: int, turn: str, **payload) -> dict:
    return {"seq": seq, "turn_id": turn, "payload": payload}


def test_the_open_turn_of_a_log_is_what_still_waits_on_a_person():
    confirm = {"type": "tool.call.requested", "id": "c1", "name": "confirm", "handler": "client"}
    lookup = {"type": "tool.call.requested", "id": "w1", "name": "lookup", "handler": "worker"}
    log = [
        _e(1, "t1", type="turn.started"),
        _e(2, "t1", **confirm),
        _e(3, "t1", type="tool.call.dispatched", id="c1", attempt=0),
        _e(4, "t1", type="turn.completed"),
        _e(5, "t2", type="turn.started"),
        _e(6, "t2", **{**confirm, "id": "c2"}),
        _e(7, "t2", **lookup),
        _e(8, "t2", type="tool.call.dispatched", id="w1", attempt=0),
        _e(9, "t2", type="tool.call.dispatched", id="c2", attempt=0),
        _e(10, "t2", type="session.interrupted", interrupt_id="i1", reason="r"),
    ]
    turn = open_turn(log)
    assert turn is not None and turn.turn_id == "t2" and turn.waits_on_a_person
    assert turn.asking == ["c2"] and [i["interrupt_id"] for i in turn.interrupts] == ["i1"]
    # A timed-out attempt is not out any more, but the call is open (it will be sent again).
    retried = [*log, _e(11, "t2", type="tool.call.errored", id="c2", attempt=0, final=False)]
    turn = open_turn(retried)
    assert turn is not None and turn.asking == [] and "c2" in turn.client_calls
    resumed = [*retried, _e(12, "t2", type="session.interrupt_resumed", interrupt_id="i1")]
    turn = open_turn(resumed)
    assert turn is not None and not turn.waits_on_a_person
    assert open_turn([*resumed, _e(13, "t2", type="turn.failed")]) is None
    assert open_turn(log[:4]) is None  # every turn ended


async def test_an_engine_that_accepts_and_never_answers_is_said_as_lost():
    # A host gone without closing its connections (a frozen VM, a dropped route) looks like
    # a listener that takes the connection and says nothing: the stream's silence bound
    # turns it into a failed attempt, said once, then retried.
    held: list[asyncio.StreamWriter] = []

    async def mute(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(mute, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    lost: list[str] = []
    said = asyncio.Event()

    def on_lost(err) -> None:
        lost.append(err.message)
        said.set()

    remote = HttpClient(f"http://127.0.0.1:{port}", stream_silence=0.3, on_lost=on_lost)
    following = asyncio.create_task(anext(aiter(remote.follow("ses_x"))))
    try:
        async with asyncio.timeout(5):
            await said.wait()
        assert not following.done()  # still trying
        assert len(lost) == 1 and "cannot reach" in lost[0], lost
    finally:
        following.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await following
        await remote.aclose()
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()
