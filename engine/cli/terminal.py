"""Watching a turn at a terminal: tokens as they stream, compact tool lines, a status line,
client tools and interrupt prompts answered at the keyboard.

Works with either client: `Client` (Redis, in process) or `HttpClient` (a remote engine).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TextIO

from engine.cli.keyboard import keyboard
from engine.cli.text import short
from engine.client import ClientError
from engine.machine import events as ev

_SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
_STEPS = {
    ev.LLM_CALL_DISPATCHED: "model call",
    ev.TOOL_CALL_DISPATCHED: "tool {name}",
    ev.DECISION_DISPATCHED: "worker decision",
    ev.SESSION_INTERRUPTED: "paused",
    ev.CONNECTOR_SYNC_DISPATCHED: "loading MCP tools",
}


class SessionClient(Protocol):
    async def submit(
        self,
        payload: dict[str, Any],
        *,
        session_id: str | None = None,
        identity: dict[str, Any] | None = None,
    ) -> dict[str, Any]: ...

    async def events(self, session_id: str, after_seq: int = 0) -> list[dict[str, Any]]: ...

    async def delta_cursor(self, session_id: str) -> str: ...

    def follow(
        self, session_id: str, after_seq: int = 0, *, delta_cursor: str | None = None
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]: ...


Ask = Callable[[str], "asyncio.Future[str] | Any"]


class Printer:
    """Pretty output (or JSON lines), with a status line on a terminal's stderr."""

    def __init__(self, out: TextIO, jsonl: bool, status: TextIO | None = None) -> None:
        self.out = out
        self.jsonl = jsonl
        self.colour = not jsonl and out.isatty()
        self.open_line = False
        self.status_out = status if status is not None and status.isatty() and not jsonl else None
        self.step: str | None = None
        self.step_since = 0.0
        self.status_shown = False
        self.tool_names: dict[str, str] = {}  # call id -> tool name, for the status line

    def clear_status(self) -> None:
        if self.status_shown and self.status_out is not None:
            self.status_out.write("\r\x1b[2K")
            self.status_out.flush()
            self.status_shown = False

    def pause(self) -> None:
        """Clear the status line and keep it away until the next step: a prompt is on screen."""
        self.clear_status()
        self.step = None

    def tick(self) -> None:
        """Redraw the status line: the running step and how long it has run."""
        if self.status_out is None or self.step is None or self.open_line:
            return
        elapsed = time.monotonic() - self.step_since
        frame = _SPINNER[int(elapsed * 10) % len(_SPINNER)]
        self.status_out.write(f"\r\x1b[2K{frame} {self.step} {elapsed:.1f}s")
        self.status_out.flush()
        self.status_shown = True

    def write(self, text: str) -> None:
        self.clear_status()
        self.out.write(text)
        self.out.flush()
        self.open_line = not text.endswith("\n")

    def line(self, text: str, style: str = "") -> None:
        """A whole line; `style` is an SGR code (2 dim, 31 red, 33 yellow), used on a TTY."""
        if self.open_line:
            self.write("\n")
        if style and self.colour:
            text = f"\x1b[{style}m{text}\x1b[0m"
        self.write(text + "\n")

    def notice(self, text: str) -> None:
        """A line on stderr (the status line cleared first): the engine lost, or back."""
        self.clear_status()
        if self.open_line:
            self.out.write("\n")
            self.out.flush()
            self.open_line = False
        asking = keyboard().asking  # a prompt is on screen: the line goes under it, and
        sys.stderr.write(("\n" if asking else "") + text + ("\n> " if asking else "\n"))
        sys.stderr.flush()  # the person types on where it says `>` again

    def delta(self, delta: dict[str, Any]) -> None:
        if self.jsonl:
            self.write(json.dumps({"type": "llm.token.delta", **delta}) + "\n")
        elif delta.get("text"):
            self.write(delta["text"])

    def event(self, event: dict[str, Any]) -> None:
        p = event["payload"]
        kind = p["type"]
        if kind == ev.TOOL_CALL_REQUESTED:
            self.tool_names[p["id"]] = p["name"]
        label = _STEPS.get(kind)
        if label is not None:
            name = self.tool_names.get(p.get("id", ""), "")
            self.step, self.step_since = label.format(name=name).strip(), time.monotonic()
        if self.jsonl:
            self.write(json.dumps(event) + "\n")
        elif kind == ev.TOOL_CALL_REQUESTED:
            self.line(f"→ {p['name']}({short(p.get('arguments') or '')})", "2")
        elif kind == ev.TOOL_CALL_ERRORED and p.get("final"):
            self.line(f"✗ {p['error']['message']}", "31")
        elif kind in (ev.LLM_CALL_ERRORED, ev.DECISION_ERRORED) and not p.get("final"):
            self.line(f"… retrying: {p['error']['message']}", "33")
        elif kind == ev.CONNECTOR_SYNCED and p.get("off"):  # recorded once while it stays off
            self.line(f"· {p['path']} is off: {p['off']}; the agent runs without its tools", "2")
        elif kind == ev.CONNECTOR_SYNC_ERRORED:  # final: the turn goes on without its tools
            final = p.get("final")
            self.line(f"{'✗' if final else '… retrying:'} {p['error']['message']}", "33")


@dataclass
class TurnOutcome:
    session_id: str
    turn_id: str | None
    status: str  # completed | failed | detached
    error: str | None = None


@dataclass
class OpenTurn:
    """A session's running turn as its log tells it, with what it waits on from a person:
    client tools sent out and not answered, interrupts not resumed."""

    turn_id: str
    client_calls: dict[str, dict[str, Any]]  # every unsettled client call, by id
    asking: list[str]  # ids of the client calls out now (dispatched), in order
    interrupts: list[dict[str, Any]]  # `session.interrupted` payloads still open

    @property
    def waits_on_a_person(self) -> bool:
        return bool(self.asking or self.interrupts)


def open_turn(events: list[dict[str, Any]]) -> OpenTurn | None:
    """The running turn of a session's log, or None when no turn runs."""
    turn: OpenTurn | None = None
    for event in events:
        p = event["payload"]
        kind = p["type"]
        if kind == ev.TURN_STARTED:
            turn = OpenTurn(event.get("turn_id") or "", {}, [], [])
        elif turn is None or event.get("turn_id") != turn.turn_id:
            continue
        elif kind in (ev.TURN_COMPLETED, ev.TURN_FAILED):
            turn = None
        elif kind == ev.TOOL_CALL_REQUESTED and p.get("handler") == "client":
            turn.client_calls[p["id"]] = p
        elif kind == ev.TOOL_CALL_DISPATCHED and p["id"] in turn.client_calls:
            turn.asking.append(p["id"])
        elif kind in (ev.TOOL_CALL_COMPLETED, ev.TOOL_CALL_ERRORED, ev.TOOL_CALL_WAITING):
            if p["id"] in turn.asking:
                turn.asking.remove(p["id"])
            if kind == ev.TOOL_CALL_COMPLETED or p.get("final"):
                turn.client_calls.pop(p["id"], None)
        elif kind == ev.SESSION_INTERRUPTED:
            turn.interrupts.append(p)
        elif kind == ev.SESSION_INTERRUPT_RESUMED:
            iid = p["interrupt_id"]
            turn.interrupts = [i for i in turn.interrupts if i["interrupt_id"] != iid]
    return turn


def the_question(payload: dict[str, Any]) -> str:
    """What a client tool asks: its `question` argument, else its arguments as sent."""
    question = payload.get("arguments") or "{}"
    with contextlib.suppress(ValueError, AttributeError):
        question = json.loads(question).get("question", question)
    return f"{payload['name']}: {question}"


async def _submit_answer(client: Any, sid: str, body: dict[str, Any], printer: Printer) -> None:
    """Send an answer; an engine that cannot be reached is waited for (said once), since
    the person's answer must not be dropped on the floor."""
    said = False
    while True:
        try:
            await client.submit(body, session_id=sid)
        except ClientError as err:
            if err.code != "unreachable":
                raise
            if not said:
                printer.notice(f"subs: {err.message}; keeping your answer and trying again")
                said = True
            await asyncio.sleep(0.5)
            continue
        if said:
            printer.notice("subs: the engine is back; your answer is in")
        return


async def answer_client_tool(
    client: Any, sid: str, payload: dict[str, Any], printer: Printer
) -> None:
    """A client tool runs here, at the keyboard: ask, and send the answer back."""
    answer = await keyboard().ask(the_question(payload) + "\n> ")
    if answer is not None:
        body = {"type": "tool.result", "id": payload["id"], "result": answer}
    else:
        body = {"type": "tool.error", "id": payload["id"], "error": "no answer", "retryable": False}
    await _submit_answer(client, sid, body, printer)


async def answer_interrupt(
    client: Any, sid: str, payload: dict[str, Any], printer: Printer
) -> None:
    """An interrupt prompt: show its message and options, resume with the chosen value."""
    body = payload.get("payload") or {}
    message = body.get("message") or f"Paused: {payload.get('reason') or 'no reason given'}"
    options = (body.get("metadata") or {}).get("options") or []
    lines = [message] + [
        f"  {i}. {o.get('label', o.get('value'))}" for i, o in enumerate(options, 1)
    ]
    if body.get("expiresAt"):
        lines.append(f"  (expires {body['expiresAt']})")
    answer = ((await keyboard().ask("\n".join(lines) + "\n> ")) or "").strip()
    chosen: Any = answer
    if options and answer.isdigit() and 1 <= int(answer) <= len(options):
        chosen = options[int(answer) - 1].get("value")
    resume = {"type": "interrupt.resume", "interrupt_id": payload["interrupt_id"]}
    resume["payload"] = {"value": chosen}
    await _submit_answer(client, sid, resume, printer)


async def require_session(client: SessionClient, session_id: str) -> None:
    """`--session` names a session that exists: a typo must not start a new one."""
    try:
        known = bool(await client.events(session_id))
    except ClientError as err:
        if err.code != "unknown_session":
            raise
        known = False
    if not known:
        raise ClientError(
            f"no session {session_id!r}: `subs sessions list` shows them; "
            "leave out --session to start a new one",
            code="unknown_session",
            status=404,
            detail={},
        )


async def watch_turn(
    client: SessionClient,
    payload: dict[str, Any],
    printer: Printer,
    *,
    session_id: str | None,
    identity: dict[str, Any] | None,
    on_session: Callable[[str, bool], None] | None = None,
) -> TurnOutcome:
    """Submit one input and print its turn until it ends."""
    after, cursor = 0, "0-0"
    if session_id:
        events = await client.events(session_id)
        after = events[-1]["seq"] if events else 0
        cursor = await client.delta_cursor(session_id)
    reply = await client.submit(payload, session_id=session_id, identity=identity)
    sid, turn_id = reply["session_id"], reply.get("turn_id")
    if on_session is not None:
        on_session(sid, bool(reply.get("queued")))
    if turn_id is None:
        return TurnOutcome(sid, None, "completed")
    return await _watching(client, sid, turn_id, after, cursor, printer, None)


async def finish_open_turn(
    client: SessionClient,
    sid: str,
    printer: Printer,
    *,
    waiting_only: bool = True,
    on_open: Callable[[OpenTurn], None] | None = None,
) -> TurnOutcome | None:
    """The session's running turn, followed to its end, and what it waits on from a person
    asked again first (a client tool, an interrupt: perhaps asked by a run that was
    stopped). None when no turn runs (or, `waiting_only`, when it waits on nobody)."""
    events = await client.events(sid)
    turn = open_turn(events)
    if turn is None or (waiting_only and not turn.waits_on_a_person):
        return None
    if on_open is not None:
        on_open(turn)
    cursor = await client.delta_cursor(sid)
    return await _watching(client, sid, turn.turn_id, events[-1]["seq"], cursor, printer, turn)


async def _watching(
    client: SessionClient,
    sid: str,
    turn_id: str,
    after: int,
    cursor: str,
    printer: Printer,
    turn: OpenTurn | None,
) -> TurnOutcome:
    ticker = asyncio.create_task(_tick(printer))
    try:
        return await _follow_turn(client, sid, turn_id, after, cursor, printer, turn)
    finally:
        ticker.cancel()
        printer.clear_status()


async def _tick(printer: Printer) -> None:
    while True:
        printer.tick()
        await asyncio.sleep(0.1)


async def _read_into(
    client: SessionClient, sid: str, after: int, cursor: str, items: asyncio.Queue[Any]
) -> None:
    """The session's stream into `items`, ended by None (or the error that ended it): read
    apart from the prompts, so an engine lost while a person thinks is said at once."""
    try:
        async for item in client.follow(sid, after, delta_cursor=cursor):
            items.put_nowait(item)
    except Exception as err:  # raised again by the reader of `items`
        items.put_nowait(err)
        return
    items.put_nowait(None)


async def _follow_turn(
    client: SessionClient,
    sid: str,
    turn_id: str,
    after: int,
    cursor: str,
    printer: Printer,
    turn: OpenTurn | None = None,
) -> TurnOutcome:
    # Client tools and interrupts of any turn of the session are asked: one ahead of
    # ours in the queue may wait on the person too.
    client_calls: dict[str, dict[str, Any]] = dict(turn.client_calls) if turn else {}
    # A reconnected stream replays the deltas of the call attempt still running: each is
    # printed once, by its (call, attempt) and seq.
    printed: dict[tuple[str, int], int] = {}
    ours: set[str] = set()  # model calls of this turn: only their tokens are printed
    early: dict[str, list[dict[str, Any]]] = {}  # deltas read before their call's event
    items: asyncio.Queue[Any] = asyncio.Queue()
    reader = asyncio.create_task(_read_into(client, sid, after, cursor, items))
    try:
        if turn is not None:  # asked before and not answered: asked again
            for call_id in turn.asking:
                printer.pause()
                await answer_client_tool(client, sid, client_calls.pop(call_id), printer)
            if not printer.jsonl:
                for interrupt in turn.interrupts:
                    printer.pause()
                    await answer_interrupt(client, sid, interrupt, printer)
        while True:
            got = await items.get()
            if got is None:
                return TurnOutcome(sid, turn_id, "detached")
            if isinstance(got, BaseException):
                raise got
            kind, item = got
            if kind == "delta":
                key, seq = (item["call_id"], item.get("attempt", 0)), item.get("seq", 0)
                if seq <= printed.get(key, -1):
                    continue
                printed[key] = seq
                if item["call_id"] in ours:
                    printer.delta(item)
                else:
                    early.setdefault(item["call_id"], []).append(item)
                continue
            p = item["payload"]
            mine = item.get("turn_id") == turn_id
            if mine or printer.jsonl:
                printer.event(item)
            if p["type"] == ev.TOOL_CALL_REQUESTED and p["handler"] == "client":
                client_calls[p["id"]] = p
            elif p["type"] == ev.TOOL_CALL_DISPATCHED and p["id"] in client_calls:
                printer.pause()
                await answer_client_tool(client, sid, client_calls.pop(p["id"]), printer)
            elif p["type"] == ev.SESSION_INTERRUPTED and not printer.jsonl:
                printer.pause()
                printer.line("")
                await answer_interrupt(client, sid, p, printer)
            if not mine:
                continue
            if p["type"] == ev.LLM_CALL_REQUESTED:
                ours.add(p["id"])
                for delta in early.pop(p["id"], ()):
                    printer.delta(delta)
            elif p["type"] in (ev.TURN_COMPLETED, ev.TURN_FAILED):
                if not printer.jsonl:
                    printer.line("")
                if p["type"] == ev.TURN_FAILED:
                    return TurnOutcome(sid, turn_id, "failed", p["error"]["message"])
                return TurnOutcome(sid, turn_id, "completed")
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
