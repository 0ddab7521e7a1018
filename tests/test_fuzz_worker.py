"""Worker-answer fuzz: whatever a worker answers, every turn ends and the session lives on.

One in-process Engine on the real redis-server, one real worker on 127.0.0.1 whose
answers come from `tests/fuzz_answers.py`: for each request it builds the valid answer
(JSON or SSE; neutral, Anthropic or OpenAI format, chosen per session) and, with a
seeded RNG, replaces it half the time with one of the bad-answer classes (wrong types,
missing fields, broken vendor bodies and stream events, lone surrogates, invalid UTF-8,
deep nesting, NaN, non-JSON, truncated, empty, wrong content type, HTTP errors, SSE
without `decision.result`, bad `decision.error`, unknown actions, actions for calls that
are not open, ...). Some sessions send `input_audio` to an Anthropic-format worker.

Each session runs one fuzzed turn, which must end (`turn.completed`, or `turn.failed`
with an error message and a known code), then, with the worker answering correctly, one
more turn that must complete with its reply and state kept byte for byte. Then: the log
is gapless from 1, the snapshot is the fold of the log, every stored token delta is a
well-formed neutral delta (what SSE clients receive), nothing the session took from the
worker holds U+FFFD (an invalid byte replaced instead of refused), every request the
engine sent validates against the schema, and the engine logged no internal failure.
A few sessions also send a client message under an id the session already holds.

    SUBS_FUZZ_SEED=123        the seed (default fixed; `random` picks one and prints it)
    SUBS_FUZZ_ANSWERS=3000    how many answers at least (default 1000; `-m slow`: 10,000)
    SUBS_FUZZ_ONLY=3,17       only these session indexes (to replay a failure)
    SUBS_FUZZ_BATCH=20        sessions run concurrently
    SUBS_FUZZ_SKIP=a,b        leave out these answer classes (fuzz_answers.CLASSES) or
                              `client_dup` (a client message reusing a recorded id)

A transition that never returns blocks the engine's event loop, and with it every
timeout: a watchdog thread notices the loop standing still, records where it stands and
raises `LoopStalled` there, so the test fails saying where the engine hung.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import sys
import textwrap
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from jsonschema import Draft202012Validator

from engine.client import Client, ClientError
from engine.config import parse_project
from engine.runtime.engine import Engine
from tests import fuzz_answers as fa
from tests.engine_helpers import ENV, assert_consistent, turn_ended, wait_for_event
from tests.workers import REQUEST_SCHEMA, SCHEMA_PATH, schema_errors

_SEED_ENV = os.environ.get("SUBS_FUZZ_SEED", "20250601")
SEED = random.SystemRandom().randrange(1 << 32) if _SEED_ENV == "random" else int(_SEED_ENV)
ANSWERS = int(os.environ.get("SUBS_FUZZ_ANSWERS", "1000"))
ONLY = [int(i) for i in os.environ.get("SUBS_FUZZ_ONLY", "").split(",") if i.strip()]
BATCH = int(os.environ.get("SUBS_FUZZ_BATCH", "20"))
SKIP = frozenset(c for c in os.environ.get("SUBS_FUZZ_SKIP", "").split(",") if c.strip())
TURN_TIMEOUT = 30.0
STALL_SECS = 10.0  # the event loop standing still this long is a hang
# Check every request the engine sends against the schema, or every k-th (CPU).
SCHEMA_EVERY = int(os.environ.get("SUBS_FUZZ_SCHEMA_EVERY", "1"))

pytestmark = pytest.mark.timeout(max(180, ANSWERS // 1000 * 90 + 120))

_DEFS = json.loads(SCHEMA_PATH.read_text())["$defs"]
STREAM_DELTA = Draft202012Validator({"$defs": _DEFS, "$ref": "#/$defs/StreamDelta"})
ERROR_CODES = frozenset(_DEFS["ErrorCode"]["enum"])  # the spec's, not the engine's, list
_DELTA_OURS = ("call_id", "attempt", "seq")


# -- the worker ------------------------------------------------------------------------


@dataclass
class Sent:
    n: int
    trigger: str
    attempt: Any
    label: str
    status: int
    content_type: str
    body: bytes

    def line(self) -> str:
        body = self.body if len(self.body) <= 600 else self.body[:600] + b"..."
        return (
            f"  #{self.n} {self.trigger} (attempt {self.attempt}) -> {self.label} "
            f"[{self.status} {self.content_type}] {body!r}"
        )


@dataclass
class SessionCtl:
    plan: fa.SessionPlan
    fuzz: bool = True
    n: int = 0
    sent: list[Sent] = field(default_factory=list)
    state_seen: list[Any] = field(default_factory=list)  # `state` of turn two's requests


class FuzzWorker:
    """A worker on a real socket answering from `fuzz_answers`, raw bytes and all."""

    def __init__(self) -> None:
        self.sessions: dict[str, SessionCtl] = {}
        self.answers = 0
        self.fuzz_answers = 0
        self.request_errors: list[str] = []
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._checked = 0

    async def start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/", self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}/"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError as exc:
            self.request_errors.append(f"a request body is not JSON ({exc}): {raw[:300]!r}")
            return web.Response(status=400, text="not JSON")
        sid = body.get("session_id")
        ctl = self.sessions.get(sid)
        if ctl is None:
            self.request_errors.append(f"a request for an unknown session {sid!r}")
            return web.Response(status=404, text="unknown session")
        self._checked += 1
        if self._checked % SCHEMA_EVERY == 0:
            for problem in schema_errors(REQUEST_SCHEMA, body)[:3]:
                self.request_errors.append(f"{sid} {body['trigger']['type']}: {problem}")
        if not ctl.fuzz:
            ctl.state_seen.append(body.get("state"))
        n = ctl.n
        ctl.n += 1
        answer = fa.answer(ctl.plan, body, n, fuzz=ctl.fuzz, skip=SKIP)
        trigger = body["trigger"]
        ctl.sent.append(
            Sent(
                n,
                trigger["type"],
                trigger.get("attempt", body.get("attempts")),
                answer.label,
                answer.status,
                answer.content_type,
                answer.body,
            )
        )
        self.answers += 1
        self.fuzz_answers += ctl.fuzz
        if not answer.streamed:
            return web.Response(
                status=answer.status,
                body=answer.body,
                headers={"Content-Type": answer.content_type},
            )
        response = web.StreamResponse(
            status=answer.status, headers={"Content-Type": answer.content_type}
        )
        await response.prepare(request)
        try:
            for chunk in answer.chunks:
                await response.write(chunk)
            await response.write_eof()
        except ConnectionResetError:
            pass  # the engine stopped reading: a bad frame, or it has its decision.result
        return response


# -- the engine's log ------------------------------------------------------------------


class Collect(logging.Handler):
    """Every warning or error the engine logs, for the failure report."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def internal(self) -> list[str]:
        """Records that mean an answer broke the engine itself: an exception inside an
        effect, a transition that raised, a dead-lettered input."""
        out = []
        for r in self.records:
            text = r.getMessage()
            if r.levelno >= logging.ERROR or "applying an input" in text:
                if r.exc_info:
                    text += "\n" + logging.Formatter().formatException(r.exc_info)
                out.append(f"{r.levelname} {r.name}: {text}")
        return out


# -- a hung event loop ------------------------------------------------------------------


class LoopStalled(BaseException):  # not an Exception: the engine must not catch it
    """Raised in the main thread when its event loop stood still for STALL_SECS."""


class Watchdog:
    """Notices the event loop standing still, records the stack (and the session the engine
    was working on), then raises LoopStalled in the main thread to unblock it; `fired` is
    set once the loop runs again."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.beat = time.monotonic()
        self.stalls: list[str] = []
        self.stalled_sessions: list[str] = []
        self.fired = asyncio.Event()
        self._active = False
        self._stop = threading.Event()
        self._main = threading.main_thread().ident
        self._thread = threading.Thread(target=self._watch, name="fuzz-watchdog", daemon=True)
        self._handle: asyncio.TimerHandle | None = None
        self._previous: Any = None

    def start(self) -> None:
        self._previous = signal.signal(signal.SIGUSR1, self._raise)
        self._active = True
        self._tick()
        self._thread.start()

    def stop(self) -> None:
        self._active = False
        self._stop.set()
        self._thread.join()
        if self._handle is not None:
            self._handle.cancel()
        signal.signal(signal.SIGUSR1, self._previous)

    def _tick(self) -> None:
        self.beat = time.monotonic()
        self._handle = self.loop.call_later(0.2, self._tick)

    def _raise(self, signum: int, frame: Any) -> None:
        if self._active and time.monotonic() - self.beat >= STALL_SECS:
            self.beat = time.monotonic()
            raise LoopStalled(f"the event loop stood still for {STALL_SECS:g} s")

    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            if time.monotonic() - self.beat < STALL_SECS:
                continue
            frame = sys._current_frames().get(self._main)
            stack = "".join(traceback.format_stack(frame)[-14:]) if frame else "(no frame)"
            sessions = []
            while frame is not None:
                sid = frame.f_locals.get("sid") or frame.f_locals.get("session_id")
                if isinstance(sid, str) and sid not in sessions:
                    sessions.append(sid)
                frame = frame.f_back
            self.stalled_sessions += [s for s in sessions if s not in self.stalled_sessions]
            self.stalls.append(
                f"the engine's event loop stood still for {STALL_SECS:g} s "
                f"(session {', '.join(sessions) or '?'}), in:\n{stack}"
            )
            self.loop.call_soon_threadsafe(self.fired.set)
            signal.pthread_kill(self._main, signal.SIGUSR1)


# -- one session -----------------------------------------------------------------------


class Wedged(AssertionError):
    pass


async def _events_tail(engine: Engine, sid: str, count: int = 25) -> str:
    events = await engine.store.read_log(sid)
    lines = []
    for e in events[-count:]:
        payload = json.dumps(e["payload"], ensure_ascii=False)
        if len(payload) > 400:
            payload = payload[:400] + "..."
        lines.append(f"  {e['seq']:>4} {e.get('turn_id') or '-':<28} {payload}")
    return "\n".join(lines)


async def _turn(engine: Engine, client: Client, sid: str, payload: dict[str, Any], which: str):
    reply = await client.submit(payload, session_id=sid)
    try:
        return await wait_for_event(client, sid, turn_ended(reply["turn_id"]), timeout=TURN_TIMEOUT)
    except TimeoutError:
        raise Wedged(
            f"{which} turn {reply['turn_id']} did not end within {TURN_TIMEOUT:g} s"
        ) from None


async def _client_dup(engine: Engine, client: Client, sid: str, plan: fa.SessionPlan) -> None:
    """A client message under a recorded id: refused, or a turn that ends."""
    log = await engine.store.read_log(sid)
    ids = [e["payload"]["message"]["id"] for e in log if e["payload"]["type"] == "message.new"]
    if not ids:
        return
    with contextlib.suppress(ClientError):  # refused: fine
        await _turn(engine, client, sid, plan.dup_input(ids[0]), "the duplicate-id")


# What a worker's answer puts into the session: it must hold exactly what was sent.
_ACCEPTED = ("message.new", "worker.state.updated", "tool.call.completed", "agent.updated")


def _check_replacement_chars(events: list[dict[str, Any]]) -> list[str]:
    """The worker never sends U+FFFD: one in the session is a byte the engine replaced
    instead of refusing (invalid UTF-8 taken as text)."""
    return [
        f"seq {e['seq']} {e['payload']['type']} holds U+FFFD: "
        + json.dumps(e["payload"], ensure_ascii=False)[:300]
        for e in events
        if e["payload"]["type"] in _ACCEPTED
        and "\ufffd" in json.dumps(e["payload"], ensure_ascii=False)
    ]


async def _check_audio(engine: Engine, sid: str) -> None:
    """input_audio cannot become an Anthropic request: a model call over the recorded audio
    message fails for good, saying why (the worker may have recorded something else)."""
    log = await engine.store.read_log(sid)
    audio = any(
        e["payload"]["type"] == "message.new"
        and "input_audio" in json.dumps(e["payload"]["message"].get("content"))
        for e in log
    )
    calls = [
        e["payload"]["id"]
        for e in log
        if e["payload"]["type"] == "llm.call.requested" and "messages" not in e["payload"]["params"]
    ]
    if not audio or not calls:
        return
    errors = {
        e["payload"]["id"]: e["payload"]["error"].get("message", "")
        for e in log
        if e["payload"]["type"] == "llm.call.errored" and e["payload"]["final"]
    }
    for call in calls:
        assert "input_audio" in errors.get(call, ""), (
            f"model call {call} over an input_audio message did not fail saying why: "
            f"{errors.get(call)!r}"
        )


def _check_deltas(deltas: list[dict[str, Any]], events: list[dict[str, Any]]) -> list[str]:
    """Each stored token delta: ours (call_id, attempt, seq 1.. per attempt) + a StreamDelta."""
    problems = []
    llm_calls = {e["payload"]["id"] for e in events if e["payload"]["type"] == "llm.call.requested"}
    last_seq: dict[tuple[Any, Any], int] = {}
    for d in deltas:
        key = (d.get("call_id"), d.get("attempt"))
        if not isinstance(d.get("call_id"), str) or d["call_id"] not in llm_calls:
            problems.append(f"delta for an unknown call: {d}")
        if not isinstance(d.get("attempt"), int) or not isinstance(d.get("seq"), int):
            problems.append(f"delta with a bad attempt or seq: {d}")
        elif d["seq"] != last_seq.get(key, 0) + 1:
            problems.append(f"delta seq {d['seq']} after {last_seq.get(key, 0)}: {d}")
        else:
            last_seq[key] = d["seq"]
        rest = {k: v for k, v in d.items() if k not in _DELTA_OURS}
        for e in STREAM_DELTA.iter_errors(rest):
            problems.append(f"delta is not a StreamDelta ({e.json_path}: {e.message}): {d}")
    return problems


async def run_session(engine: Engine, worker: FuzzWorker, plan: fa.SessionPlan) -> dict[str, Any]:
    sid = plan.session_id
    ctl = worker.sessions[sid] = SessionCtl(plan)
    client = Client(engine.store)
    end = await _turn(engine, client, sid, plan.first_input(), "the fuzzed")
    payload = end["payload"]
    if payload["type"] == "turn.failed":
        error = payload.get("error") or {}
        assert isinstance(error.get("message"), str) and error["message"].strip(), (
            f"turn.failed without an error message: {payload}"
        )
        assert error.get("code") in ERROR_CODES, f"turn.failed with an unknown code: {error}"
    if plan.audio:
        await _check_audio(engine, sid)
    ctl.fuzz = False
    first_outcome = payload["type"]
    if plan.client_dup and "client_dup" not in SKIP:
        await _client_dup(engine, client, sid, plan)
    end2 = await _turn(engine, client, sid, plan.second_input(), "the normal")
    assert end2["payload"]["type"] == "turn.completed", (
        f"the normal turn after the fuzzed one did not complete: {end2['payload']}"
    )
    events = await assert_consistent(engine.store, sid)
    # Turn two's reply and state are kept exactly, odd Unicode and all.
    last_turn = [e for e in events if e.get("turn_id") == end2["turn_id"]]
    replies = [
        e["payload"]["message"]
        for e in last_turn
        if e["payload"]["type"] == "message.new" and e["payload"]["message"]["role"] == "assistant"
    ]
    assert replies and replies[-1].get("content") == fa.final_text(plan), (
        f"turn two's reply was not kept: {replies[-1:] if replies else 'no reply'}"
    )
    assert fa.final_state(plan) in ctl.state_seen, (
        f"turn two's state was not kept: saw {ctl.state_seen!r}"
    )
    entries = await engine.store.redis.xrange(engine.store.delta_key(sid))
    deltas = [json.loads(fields[b"d"]) for _, fields in entries]
    problems = _check_deltas(deltas, events) + _check_replacement_chars(events)
    assert not problems, "\n".join(problems[:5])
    return {"first": first_outcome, "events": len(events)}


# -- the test --------------------------------------------------------------------------


def _project(tmp_path: Path, worker_url: str):
    text = textwrap.dedent(
        f"""\
        [agent.fuzz]
        worker = "{worker_url}"
        """
    )
    path = tmp_path / "subs.toml"
    path.write_text(text)
    return parse_project(text, str(path), env={})


async def test_no_worker_answer_wedges_a_session(redis, tmp_path):
    await fuzz(redis, tmp_path, ANSWERS)


@pytest.mark.slow
@pytest.mark.timeout(1500)
async def test_ten_thousand_worker_answers_wedge_no_session(redis, tmp_path):
    await fuzz(redis, tmp_path, max(ANSWERS, 10_000))


async def fuzz(redis, tmp_path, answers: int) -> None:
    print(f"\nfuzz seed {SEED} (SUBS_FUZZ_SEED={SEED}{_skip_env()} replays it), {answers} answers")
    worker = FuzzWorker()
    await worker.start()
    log = Collect()
    engine_log = logging.getLogger("subs")
    engine_log.addHandler(log)
    watchdog = Watchdog(asyncio.get_running_loop())
    watchdog.start()
    engine = Engine(_project(tmp_path, worker.url), redis, env=ENV, lease_ms=5000)
    await engine.start()
    started = time.monotonic()
    failures: list[str] = []
    outcomes: list[str] = []
    index = 0
    try:
        while worker.fuzz_answers < answers and (not ONLY or index < len(ONLY)):
            if ONLY:
                plans = [fa.session_plan(SEED, i) for i in ONLY[index : index + BATCH]]
            else:
                plans = [fa.session_plan(SEED, i) for i in range(index, index + BATCH)]
            index += BATCH
            batch = asyncio.gather(
                *(run_session(engine, worker, p) for p in plans), return_exceptions=True
            )
            stalled = asyncio.ensure_future(watchdog.fired.wait())
            await asyncio.wait({batch, stalled}, return_when=asyncio.FIRST_COMPLETED)
            stalled.cancel()
            if not batch.done():
                # The engine hung: report the batch as it stands and stop here.
                batch.cancel()
                with contextlib.suppress(BaseException):
                    await batch
                for plan in plans:
                    if plan.session_id in watchdog.stalled_sessions:
                        err = Wedged("the engine hung working on this session (see the stall)")
                        failures.append(await _report(engine, worker, plan, err))
                break
            results = batch.result()
            for plan, result in zip(plans, results, strict=True):
                if isinstance(result, BaseException):
                    failures.append(await _report(engine, worker, plan, result))
                else:
                    outcomes.append(result["first"])
            if len(failures) >= 50:
                break
    finally:
        try:
            await engine.stop()
            await worker.stop()
        finally:
            watchdog.stop()
            engine_log.removeHandler(log)
    elapsed = time.monotonic() - started
    sessions = len(worker.sessions)
    print(
        f"fuzz seed {SEED}: {sessions} sessions, {worker.fuzz_answers} fuzzed answers "
        f"({worker.answers} in all) in {elapsed:.1f} s; fuzzed turns: "
        f"{outcomes.count('turn.completed')} completed, {outcomes.count('turn.failed')} failed"
    )
    problems = list(watchdog.stalls[:3])
    if failures:
        summary = "\n".join(f.split("\n")[0] + "\n  " + f.split("\n")[1] for f in failures)
        problems.append(f"{len(failures)} sessions failed:\n{summary}")
        problems += failures[:10]
    if worker.request_errors:
        problems.append(
            "requests that break the schema:\n  " + "\n  ".join(worker.request_errors[:10])
        )
    internal = log.internal()
    if internal:
        problems.append(
            f"the engine logged {len(internal)} internal failures:\n" + "\n".join(internal[:5])
        )
    assert not problems, f"seed {SEED}:\n\n" + "\n\n".join(problems)
    assert worker.fuzz_answers >= answers or ONLY


def _skip_env() -> str:
    return f" SUBS_FUZZ_SKIP={','.join(sorted(SKIP))}" if SKIP else ""


async def _report(
    engine: Engine, worker: FuzzWorker, plan: fa.SessionPlan, err: BaseException
) -> str:
    sid = plan.session_id
    ctl = worker.sessions.get(sid)
    sent = "\n".join(s.line() for s in ctl.sent) if ctl else "  (none)"
    try:
        tail = await _events_tail(engine, sid)
    except Exception as exc:  # the report must not hide the failure
        tail = f"  (cannot read the log: {exc!r})"
    what = f"{type(err).__name__}: {err}"
    return (
        f"session {sid} (seed {SEED}, index {plan.index}, format {plan.format}, "
        f"stream {plan.stream}, audio {plan.audio}, client_dup {plan.client_dup}; replay: "
        f"SUBS_FUZZ_SEED={SEED} SUBS_FUZZ_ONLY={plan.index}{_skip_env()}):\n  {what}\n"
        f"answers sent:\n{sent}\nlast events:\n{tail}"
    )
