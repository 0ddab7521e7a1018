"""`subs run` and `subs chat`: one turn, or a conversation, with an agent (in this
process or on a `--url` engine), Ctrl-C saying how to pick the session up."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import json
import signal
import sys
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from engine.cli.common import Usage, http_url, project_from, wants_jsonl
from engine.cli.connect import engine_client, remote_client, say_when_lost
from engine.errors import ClientError

if TYPE_CHECKING:
    from engine.session_client import SessionClient


def _identity() -> dict[str, Any]:
    """Who sends from this terminal: the login name, as the CLI's subject."""
    return {"subject": {"issuer": "cli", "id": getpass.getuser()}, "metadata": {}}


def _message(agent: str, text: str) -> dict[str, Any]:
    # Queued: a turn still running in this session (say, one a killed run left
    # behind) finishes first, then this one runs.
    message = {"role": "user", "content": text}
    return {"type": "client.message", "agent_id": agent, "message": message, "queue": True}


@contextlib.asynccontextmanager
async def _session_client(args: argparse.Namespace) -> AsyncIterator[SessionClient]:
    """A remote engine's HTTP API with `--url`, else an engine in this process. An
    agent that is not there is a command-line mistake either way (exit 2)."""
    if getattr(args, "url", None):
        try:
            async with remote_client(args.url) as client:
                yield client
        except ClientError as err:
            if err.code != "unknown_agent":
                raise
            raise Usage(f"{args.url}: {err.message}") from None
        return
    project = project_from(args)
    if args.agent not in project.agents:
        declared = ", ".join(sorted(project.agents)) or "none"
        raise Usage(f"no agent {args.agent!r} in {project.path}; declared: {declared}")
    async with engine_client(project, args.redis) as client:
        yield client


def _client_input(args: argparse.Namespace) -> dict[str, Any]:
    """`--input`, checked here as the API would check it: one error naming the field."""
    from engine.client import validate_client_input

    example = (
        """--input '{"type": "client.message", "message": {"role": "user", "content": "hi"}}'"""
    )
    try:
        payload = json.loads(args.input)
    except json.JSONDecodeError as err:
        raise Usage(
            f"--input is not JSON ({err.msg} at column {err.colno}); e.g. {example}"
        ) from None
    if not isinstance(payload, dict):
        raise Usage(f"--input must be a JSON object (a ClientInput); e.g. {example}")
    payload.setdefault("agent_id", args.agent)
    try:
        validate_client_input(payload)
    except ClientError as err:
        raise Usage(f"--input: {err.message}; e.g. {example}") from None
    return payload


def _console_link(args: argparse.Namespace) -> Callable[[str], str] | None:
    """A session's console page: on the `--url` engine, else at `[serve] public_url`.
    None without either: the engine runs in this process, and serves no console."""
    if getattr(args, "url", None):
        base = http_url(args.url).rstrip("/")
        return lambda sid: f"{base}/console/sessions/{quote(sid, safe='')}"
    serve = project_from(args).serve
    return serve.console_url if serve.public_url else None


class _CtrlC:
    """Ctrl-C cancels the command's task, wherever it waits (a prompt, a stream, a lost
    engine), every time, so the command can say how to pick the session up; once it is
    on its way out, more Ctrl-C are ignored: the engine in this process is handing back
    its work and must not be cut off half-way."""

    def __init__(self) -> None:
        self.task = asyncio.current_task()
        self.leaving = False
        self.loop = asyncio.get_running_loop()
        # Not in the main thread: asyncio's own handling (the first Ctrl-C cancels).
        with contextlib.suppress(RuntimeError, ValueError):
            self.loop.add_signal_handler(signal.SIGINT, self._hit)

    def _hit(self) -> None:
        if not self.leaving and self.task is not None:
            self.task.cancel()

    def caught(self) -> None:
        """The cancel was Ctrl-C, and is handled: the task goes on (to its way out)."""
        if self.task is not None:
            self.task.uncancel()


def _pick_up(command: str, agent: str, sid: str | None, remote: bool, *, asked: bool) -> str:
    """The line Ctrl-C leaves: what happens to the turn, and the command that resumes it."""
    if sid is None:
        return "subs: stopped before a session was made"
    if asked:
        what = "the turn waits for your answer, and asks again"
    elif remote:
        what = "the turn goes on in the engine"
    else:
        what = "the turn is kept, and goes on once an engine runs (subs serve, or"
        return f"subs: stopped; {what} this): subs {command} {agent} --session {sid}"
    return f"subs: stopped; {what}: subs {command} {agent} --session {sid}"


async def run(args: argparse.Namespace) -> int:
    """`subs run`: send one message (or pick up a session's open turn) and follow the turn
    to its end; exit 0 when it completed, 1 when it failed, 130 on Ctrl-C."""
    from engine.cli.keyboard import keyboard
    from engine.cli.terminal import (
        OpenTurn,
        Printer,
        TurnOutcome,
        finish_open_turn,
        require_session,
        watch_turn,
    )

    payload: dict[str, Any] | None = None
    if args.input:
        payload = _client_input(args)
    elif args.message is not None:
        payload = _message(args.agent, args.message)
    elif not args.session:
        raise Usage(
            'give a message or --input, e.g. subs run oncall "what\'s paging?" '
            "(or --session ID alone, to pick up a session's running turn)"
        )
    printer = Printer(sys.stdout, wants_jsonl(args.output), sys.stderr)
    console = _console_link(args)
    sid: str | None = args.session
    sent = payload is None  # nothing to send, or sent
    ctrl_c = _CtrlC()

    def announce(session: str, queued: bool) -> None:
        nonlocal sid
        sid = session
        if not printer.jsonl:
            waiting = " (queued behind the running turn)" if queued else ""
            print(f"session {session}{waiting}", file=sys.stderr)
            if console is not None:
                print(f"console: {console(session)}", file=sys.stderr, flush=True)

    def waiting_on(turn: OpenTurn) -> None:
        if printer.jsonl:
            return
        announce(args.session, False)
        later = "; your message is sent once it ends, as the next turn" if not sent else ""
        print(f"its turn {turn.turn_id} is waiting for your answer{later}", file=sys.stderr)

    async with _session_client(args) as client:
        say_when_lost(client, printer)
        try:
            outcome: TurnOutcome | None = None
            if args.session:
                turn_sid = args.session
                await require_session(client, turn_sid)
                outcome = await finish_open_turn(
                    client, turn_sid, printer, waiting_only=payload is not None, on_open=waiting_on
                )
                if outcome is None and payload is None:
                    raise Usage(
                        f"session {turn_sid} has no turn running: give a message, e.g. "
                        f'subs run {args.agent} "and now?" --session {turn_sid}'
                    )
                if outcome is not None and outcome.status == "failed" and payload is not None:
                    print(f"subs: the turn failed: {outcome.error}", file=sys.stderr)
            if payload is not None:
                sent = True
                outcome = await watch_turn(
                    client,
                    payload,
                    printer,
                    session_id=args.session,
                    identity=_identity(),
                    on_session=announce,
                )
        except asyncio.CancelledError:
            ctrl_c.caught()
            ctrl_c.leaving = True
            asked = keyboard().stopped_asking
            line = _pick_up("run", args.agent, sid, bool(args.url), asked=asked)
            if not sent:
                line += " (your message was not sent)"
            printer.notice(line)
            return 130
        ctrl_c.leaving = True
    assert outcome is not None
    if not printer.jsonl:
        print(
            f'continue: subs run {args.agent} "..." --session {outcome.session_id}', file=sys.stderr
        )
    if outcome.status == "failed":
        print(f"subs: the turn failed: {outcome.error}", file=sys.stderr)
        return 1
    return 0 if outcome.status == "completed" else 1


async def _read_message() -> str | None:
    """One message from the keyboard; a line ending in a backslash continues it."""
    from engine.cli.keyboard import keyboard

    lines: list[str] = []
    prompt = "you> "
    while True:
        line = await keyboard().edited_line(prompt)
        if line is None:
            return None if not lines else "\n".join(lines)
        if line.endswith("\\"):
            lines.append(line[:-1])
            prompt = "...> "
            continue
        lines.append(line)
        return "\n".join(lines)


async def chat(args: argparse.Namespace) -> int:
    """Talk to an agent; Ctrl-C while a turn streams stops watching it (it goes on), at a
    question or at `you>` it leaves, saying how to pick the session up; Ctrl-D leaves."""
    from engine.cli.keyboard import keyboard
    from engine.cli.terminal import OpenTurn, Printer, finish_open_turn, require_session, watch_turn

    with contextlib.suppress(ImportError):
        import readline  # noqa: F401  (line editing and history for input())
    printer = Printer(sys.stdout, False, sys.stderr)
    sid: str | None = args.session
    ctrl_c = _CtrlC()
    board = keyboard()
    at_you = False  # waiting at `you>`

    def known(session: str, queued: bool) -> None:
        nonlocal sid
        sid = session

    def waiting_on(turn: OpenTurn) -> None:
        print(f"session {sid}: its turn is waiting for your answer", file=sys.stderr)

    try:
        async with _session_client(args) as client:
            say_when_lost(client, printer)
            try:
                if sid:
                    await require_session(client, sid)
                    await finish_open_turn(client, sid, printer, on_open=waiting_on)
                while True:
                    at_you = True
                    text = await _read_message()
                    at_you = False
                    if text is None:
                        break
                    if not text.strip():
                        continue
                    watching = asyncio.create_task(
                        watch_turn(
                            client,
                            _message(args.agent, text),
                            printer,
                            session_id=sid,
                            identity=_identity(),
                            on_session=known,
                        )
                    )
                    try:
                        outcome = await watching
                    except asyncio.CancelledError:
                        ctrl_c.caught()
                        watching.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await watching
                        if board.stopped_asking:
                            raise  # at a question: leave, below
                        # Stop watching; keep the session (and the turn) going.
                        printer.notice("(stopped watching; the turn goes on)")
                        continue
                    if outcome.status == "failed":
                        print(f"subs: the turn failed: {outcome.error}", file=sys.stderr)
            except asyncio.CancelledError:
                ctrl_c.caught()
                ctrl_c.leaving = True
                asked = board.stopped_asking
                line = _pick_up("chat", args.agent, sid, bool(args.url), asked=asked)
                printer.notice(("\n" if at_you else "") + line)  # `you> ` has no newline
                return 130
            ctrl_c.leaving = True
    finally:
        board.restore()
    if sid:
        print(f"session {sid}", file=sys.stderr)
    return 0
