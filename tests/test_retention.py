"""Retention (issue 27): idle sessions are archived, then removed from Redis, fenced
against a turn that arrives meanwhile; an archive puts a session back whole.

Real redis-server, a real engine and the fake vendor over HTTP; the sweep's clock is
moved forward (injected), never slept on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import bot.turns.store as bot_store
from bot.app import PURGE_HOOKS
from bot.turns.checkpoint import Checkpoint
from engine.client import Client
from engine.config import parse_project
from engine.machine import SessionState, fold, state_to_json
from engine.runtime.engine import Engine
from engine.runtime.retention import RestoreRefused, Sweeper, held_by, restore
from engine.store import archive
from engine.store.snapshots import load_state
from engine.store.store import Store, connect
from tests.engine_helpers import (
    ENV,
    EngineProcess,
    assert_consistent,
    make_project,
    on_both_redis,
    payloads,
    poll_until,
    subs,
    turn_ended,
    wait_for_event,
)
from tests.fakes.llm_vendor import Text, ToolCalls

DAY_MS = 86_400_000
LATER = 40 * 86_400  # seconds past now: every session made in a test is idle past 30 days


def say(text: str, **extra) -> dict:
    return {
        "type": "client.message",
        "agent_id": "ops_openai",
        "message": {"role": "user", "content": text},
        **extra,
    }


class Clock:
    """The engine's clock, `shift` seconds off: sessions made with it set back are old."""

    def __init__(self) -> None:
        self.shift = 0.0

    def __call__(self) -> float:
        return time.time() + self.shift

    @contextlib.contextmanager
    def back(self, seconds: float = LATER):
        self.shift = -seconds
        try:
            yield
        finally:
            self.shift = 0.0


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def engine(redis, vendor, tmp_path, clock) -> AsyncIterator[Engine]:
    """An engine on the injected clock (`[store]` defaults: retention 30d, archives on),
    its sweep given the bot's purge hooks as serve gives them."""
    project = make_project(tmp_path, vendor.url)
    eng = Engine(project, redis, env=ENV, lease_ms=3000, clock=clock, purge=PURGE_HOOKS)
    await eng.start()
    yield eng
    await eng.stop()


def sweeper_of(engine: Engine) -> Sweeper:
    assert engine.sweeper is not None, "the default [store] retention is 30d"
    return engine.sweeper


async def keys_naming(store: Store, *needles: str) -> list[bytes]:
    """Every key whose name holds one of the needles, and every sorted-set member that
    does (the sessions' indexes): a full scan of the server."""
    found = []
    async for key in store.redis.scan_iter(count=1000):
        if any(n.encode() in key for n in needles):
            found.append(key)
        elif await store.redis.type(key) == b"zset":
            for n in needles:
                if await store.redis.zscore(key, n) is not None:
                    found.append(key + b" member " + n.encode())
    return found


async def old_turn(clock: Clock, client: Client, text: str, **kw) -> tuple[str, str]:
    with clock.back():
        return await one_turn(client, text, **kw)


async def one_turn(client: Client, text: str, **kw) -> tuple[str, str]:
    reply = await client.submit(say(text), **kw)
    sid, turn = reply["session_id"], reply["turn_id"]
    await wait_for_event(client, sid, turn_ended(turn))
    return sid, turn


@on_both_redis
async def test_an_idle_session_is_archived_gone_from_redis_and_import_brings_it_back(
    engine, vendor, tmp_path, clock
):
    vendor.push(Text("checked the disk"), Text("rebooted"))
    client = Client(engine.store)
    sid = "slack:ops_openai:C042:1700000000.000100"
    await old_turn(clock, client, "disk full?", session_id=sid)
    _, turn = await old_turn(clock, client, "reboot it", session_id=sid)
    before = await assert_consistent(engine.store, sid)
    # A checkpoint the bot left behind for a turn of it, with its follower's lease and
    # the turn's dedupe key: the bot's keys of this session.
    checkpoints = bot_store.Checkpoints(engine.store.redis, "bot-1", 60_000)
    cp = Checkpoint("ops_openai", "T1", "C042", "1700000000.000100", turn, "U1", None)
    assert await checkpoints.start([bot_store.seen_key("turn", cp.key)], 3600, cp)
    assert await checkpoints.open()
    # A session active now is not idle: it stays.
    vendor.push(Text("fresh"))
    young, _ = await one_turn(client, "still here")
    sweeper = engine.sweeper
    assert sweeper is not None
    report = await sweeper.sweep_once()
    assert report is not None and report.archived == 1 and report.seen == 1
    # Nothing of it is left but the bot's note that its thread was archived (said once).
    assert await keys_naming(engine.store, sid, cp.key) == [bot_store.archived_key(sid).encode()]
    assert await checkpoints.open() == []
    assert await load_state(engine.store, young) is not None  # active today: kept
    assert sid not in engine.applier.cache  # dropped the moment it was archived

    (path,) = report.files
    assert path.parent.parent == tmp_path / ".subs" / "archive"
    day = time.strftime("%Y-%m-%d", time.gmtime(time.time() - LATER))  # of its last activity
    assert path.parent.name == day and path.name == f"{sid}.jsonl.gz"
    kept = archive.read(path)
    assert kept.events == before

    state = await restore(engine.store, kept)
    after = await assert_consistent(engine.store, sid)
    assert after == before
    assert state_to_json(state) == state_to_json(fold(before))
    assert sid in await engine.store.list_sessions(0, 100)
    with pytest.raises(RestoreRefused, match="in Redis already"):
        await restore(engine.store, kept)
    # The restored session goes on like any other.
    vendor.push(Text("back"))
    await one_turn(client, "and now?", session_id=sid)
    events = await assert_consistent(engine.store, sid)
    assert events[: len(before)] == before


async def test_with_archive_none_a_swept_session_is_removed_and_no_file_written(
    redis, vendor, tmp_path, clock
):
    project = make_project(tmp_path, vendor.url)
    path = Path(project.path)
    path.write_text(path.read_text() + '\n[store]\narchive = "none"\n')
    project = parse_project(path.read_text(), str(path), env={})
    eng = Engine(project, redis, env=ENV, lease_ms=3000, clock=clock)
    await eng.start()
    try:
        vendor.push(Text("ok"))
        with clock.back():
            sid, _ = await one_turn(Client(eng.store), "hi")
        report = await sweeper_of(eng).sweep_once()
        assert report is not None and report.archived == 1 and report.files == []
        assert await keys_naming(eng.store, sid) == []
        assert not (tmp_path / ".subs" / "archive").exists()
    finally:
        await eng.stop()


def _state(**kw) -> SessionState:
    return SessionState(session_id="s", agent_id="a", decider="engine", created_at=0, **kw)


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        ({}, None),
        ({"queue": [{"turn_id": "t2"}]}, "a turn is queued"),
        ({"interrupts": {"i1": {}}}, "an interrupt is open"),
        ({"children": {"s~c1": {"agent_id": "h", "call_id": "c1"}}}, "child s~c1 is live"),
        ({"children": {"s~c1": {"agent_id": "h", "call_id": None, "detached": "c1"}}}, "live"),
        ({"children": {"s~c1": {"agent_id": "h", "call_id": None, "detached": None}}}, None),
    ],
)
def test_what_holds_a_session_in_redis(kw, reason):
    held = held_by(_state(**kw))
    assert (held is None) if reason is None else (reason in (held or ""))


async def test_sessions_with_a_running_or_queued_turn_or_an_open_call_are_never_archived(
    engine, vendor, clock
):
    """However old: a turn waiting on a client tool (running, a call open) and a second
    turn queued behind it stay in Redis; once both end, the session goes."""
    vendor.push(ToolCalls([("confirm", {"question": "ok?"})]), Text("done"), Text("two"))
    client = Client(engine.store)
    with clock.back():
        reply = await client.submit(say("go"))
        sid = reply["session_id"]
        call = await wait_for_event(
            client, sid, lambda e: e["payload"]["type"] == "tool.call.dispatched"
        )
        queued = await client.submit(say("next", queue=True), session_id=sid)
    assert queued["queued"]
    sweeper = sweeper_of(engine)
    report = await sweeper.sweep_once()
    assert report is not None and report.archived == 0 and report.kept == 1
    assert await load_state(engine.store, sid) is not None
    with clock.back():
        result = {"type": "tool.result", "id": call["payload"]["id"], "result": "y"}
        await client.submit(result, session_id=sid)
        await wait_for_event(client, sid, turn_ended(queued["turn_id"]))
    report = await sweeper.sweep_once()
    assert report is not None and report.archived == 1
    assert await keys_naming(engine.store, sid) == []


# --- a turn that arrives while its session is being archived ----------------------------


@pytest.mark.parametrize("step", ["read", "archived"])
@pytest.mark.parametrize("arrives", ["committed", "waiting"])
async def test_a_turn_arriving_mid_sweep_keeps_the_session_whole(
    redis, vendor, tmp_path, clock, step, arrives
):
    """At each step before the removal, a turn that arrives — committed already, or still
    waiting on the work stream for its engine — wins: the session stays whole (its log,
    snapshot and index), no archive is left for it, and the waiting turn then runs on it."""
    project = make_project(tmp_path, vendor.url)
    eng = Engine(project, redis, env=ENV, lease_ms=3000, clock=clock)
    await eng.start()
    vendor.push(Text("first"), Text("second"))
    client = Client(eng.store)
    sid, _ = await old_turn(clock, client, "one")
    before = await assert_consistent(eng.store, sid)
    sweeper = sweeper_of(eng)
    stopped = False

    async def interfere(name: str, at: str) -> None:
        nonlocal stopped
        if name != step or at != sid:
            return
        if arrives == "committed":
            await client.submit(say("two", turn_id="T2"), session_id=sid)
        else:  # no engine reads the partition now: the input waits on the work stream
            await eng.stop()
            stopped = True
            body = {"kind": "client", "input": say("two", turn_id="T2"), "identity": {}}
            await eng.store.enqueue(sid, {**body, "owner": None}, None)

    sweeper.step = interfere
    try:
        report = await sweeper.sweep_once()
        assert report is not None and report.archived == 0 and report.kept == 1
        assert report.files == [] and not list((tmp_path / ".subs").glob("archive/*/*"))
        after = await eng.store.read_log(sid)
        assert after[: len(before)] == before
        assert sid in await eng.store.list_sessions(0, 10)
        if stopped:
            eng = Engine(project, redis, env=ENV, lease_ms=3000, clock=clock)
            await eng.start()
            client = Client(eng.store)
        await wait_for_event(client, sid, turn_ended("T2"))
        events = await assert_consistent(eng.store, sid)
        assert events[: len(before)] == before
        said = [p["message"]["content"] for p in payloads(events, "message.new")]
        assert said == ["one", "first", "two", "second"]
    finally:
        await eng.stop()


async def test_a_turn_after_the_removal_runs_on_a_fresh_session(engine, vendor, clock):
    vendor.push(Text("first"), Text("fresh start"))
    client = Client(engine.store)
    sid, _ = await old_turn(clock, client, "one")
    sweeper = sweeper_of(engine)
    seen = []

    async def after_removal(name: str, at: str) -> None:
        if name == "removed" and at == sid:
            seen.append(name)
            await client.submit(say("two", turn_id="T2"), session_id=sid)

    sweeper.step = after_removal
    report = await sweeper.sweep_once()
    assert report is not None and report.archived == 1 and seen == ["removed"]
    await wait_for_event(client, sid, turn_ended("T2"))
    events = await assert_consistent(engine.store, sid)
    assert events[0]["payload"]["type"] == "session.created"
    said = [p["message"]["content"] for p in payloads(events, "message.new")]
    assert said == ["two", "fresh start"]
    (path,) = report.files
    kept = archive.read(path).events
    assert [p["message"]["content"] for p in payloads(kept, "message.new")] == ["one", "first"]


async def test_turns_racing_a_sweep_run_on_the_session_as_it_was_or_on_a_fresh_one(
    engine, vendor, clock
):
    """Sessions swept while second turns arrive at random moments: each ends either with
    both turns in one log (kept) or with an archive of the first and a fresh log holding
    the second; every log in Redis is whole (gapless, its snapshot its fold)."""
    n = 12
    vendor.push(*(Text(f"a{i}") for i in range(n)))
    client = Client(engine.store)
    sids = [(await old_turn(clock, client, f"q{i}"))[0] for i in range(n)]
    vendor.push(*(Text("b") for _ in range(n)))
    sweeper = sweeper_of(engine)
    sweeper.batch = 3
    rng = random.Random(27)

    async def second(sid: str) -> None:
        await asyncio.sleep(rng.random() * 0.05)  # jitter: the race's spread, not a wait
        reply = await client.submit(say("again", turn_id="T2"), session_id=sid)
        await wait_for_event(client, sid, turn_ended(reply["turn_id"]))

    results = await asyncio.gather(sweeper.sweep_once(), *(second(s) for s in sids))
    report = results[0]
    assert report is not None
    archived = {archive.read(p).session_id: archive.read(p) for p in report.files}
    for sid in sids:
        events = await assert_consistent(engine.store, sid)
        said = [p["message"]["content"] for p in payloads(events, "message.new")]
        if sid in archived:
            assert said == ["again", "b"]
            kept = [p["message"]["content"] for p in payloads(archived[sid].events, "message.new")]
            assert kept[0].startswith("q") and kept[1].startswith("a")
        else:
            assert said[0].startswith("q") and said[1].startswith("a")
            assert said[2:] == ["again", "b"]


async def test_cli_export_then_import_puts_a_session_back_equal(engine, vendor, config, redis_url):
    """`subs sessions export` a live session, delete it, `subs sessions import` it back:
    the same log and fold; a file that is not an archive is one clear error."""
    vendor.push(Text("all quiet"))
    client = Client(engine.store)
    sid, _ = await one_turn(client, "status?")
    store = engine.store
    before = await assert_consistent(store, sid)
    local = ("-c", str(config), "--redis", redis_url)
    out = config.parent / "kept.jsonl.gz"
    code, _, err = await subs("sessions", "export", sid, "-o", str(out), *local)
    assert code == 0 and f"{len(before)} events" in err, err
    assert archive.read(out).events == before
    await client.delete(sid)
    assert await keys_naming(store, sid) == []
    code, _, err = await subs("sessions", "import", str(out), *local)
    assert code == 0 and f"restored session {sid}" in err, err
    assert await assert_consistent(store, sid) == before
    code, _, err = await subs("sessions", "import", str(config), *local)
    assert code == 1 and "not a gzip file" in err and "Traceback" not in err, err


async def test_a_session_with_a_live_detached_child_is_never_archived(
    redis, vendor, tmp_path, clock
):
    """The parent's turn ended long ago, but the child it started detached still runs
    (waiting on a client tool): neither goes. Once the child ends, both do."""
    parent, child = "lead-old", "lead-old~c1"

    def model(body: dict):
        system = body["messages"][0]["content"]
        last = body["messages"][-1]
        if system == "You help.":
            return Text("found it") if last["role"] == "tool" else ToolCalls([("confirm", {})])
        if last["role"] == "user":
            return ToolCalls([("helper", {"message": "look", "mode": "detached"})], ids=["c1"])
        return Text("started the helper")

    vendor.responder = model
    text = (
        f'[llm.openai]\ntype = "openai"\nbase_url = "{vendor.url}/v1"\n\n'
        '[agent.lead]\nllm = "openai"\nmodel = "m"\nsystem = "You lead."\n'
        'subagents = [{ id = "agent.helper", mode = "detached" }]\n\n'
        '[agent.helper]\nllm = "openai"\nmodel = "m"\nsystem = "You help."\n'
        'tools = [{ name = "confirm", description = "Ask", handler = "client" }]\n'
    )
    (tmp_path / "subs.toml").write_text(text)
    project = parse_project(text, str(tmp_path / "subs.toml"), env={})
    eng = Engine(project, redis, env=ENV, lease_ms=3000, clock=clock)
    await eng.start()
    try:
        client = Client(eng.store)
        message = {"role": "user", "content": "go"}
        with clock.back():
            reply = await client.submit(
                {"type": "client.message", "agent_id": "lead", "message": message},
                session_id=parent,
            )
            await wait_for_event(client, parent, turn_ended(reply["turn_id"]))
            call = await wait_for_event(
                client, child, lambda e: e["payload"]["type"] == "tool.call.dispatched"
            )
        report = await sweeper_of(eng).sweep_once()
        assert report is not None and report.archived == 0 and report.kept == 2
        with clock.back():
            result = {"type": "tool.result", "id": call["payload"]["id"], "result": "ok"}
            await client.submit(result, session_id=child)
            await wait_for_event(
                client, parent, lambda e: e["payload"]["type"] == "subagent.completed"
            )
        report = await sweeper_of(eng).sweep_once()
        assert report is not None and report.archived == 2
        assert await keys_naming(eng.store, parent) == []
    finally:
        await eng.stop()


async def test_sigkill_of_serve_mid_sweep_loses_no_session_and_half_deletes_none(config, redis_url):
    """`subs serve` (retention 1 ms) sweeps copies of a golden log and is SIGKILLed once
    its first archives are on disk: every session is then either in Redis whole, or gone
    from it entirely with an archive holding its whole log."""
    golden = Path(__file__).parent / "golden" / "engine_client_tool.jsonl"
    original = [json.loads(line) for line in golden.read_text().splitlines()]
    config.write_text(config.read_text() + '\n[store]\nretention = "1ms"\n')
    redis = connect(redis_url)
    store = await Store.open(redis)
    logs = {}
    for n in range(300):
        sid = f"ses_kill{n:04d}"
        logs[sid] = [{**e, "session_id": sid} for e in original]
        await restore(store, archive.Archive(sid, logs[sid], 0, 0))
    folder = config.parent / ".subs" / "archive"
    serve = await EngineProcess(config, redis_url).start()
    try:
        await poll_until(lambda: _fewer(store, len(logs)), 20, "the sweep's first removals")
    finally:
        serve.kill()
        await serve.proc.wait() if serve.proc else None
        await serve.drained()
    try:
        gone = 0
        listed = set(await store.list_sessions(0, len(logs)))
        for sid, log in logs.items():
            snap = await store.load_snapshot(sid)
            if snap is not None:
                assert sid in listed and await store.read_log(sid) == log
                assert snap.seq == len(log)
                continue
            gone += 1
            assert await redis.exists(*store.session_keys(sid)) == 0
            assert sid not in listed
            (path,) = folder.glob(f"*/{sid}.jsonl.gz")
            assert archive.read(path).events == log
        assert 0 < gone < len(logs), f"killed after {gone} of {len(logs)}: try more sessions"
    finally:
        await redis.aclose()


async def test_serves_sweep_drops_the_bots_keys_of_a_session_it_removes(config, redis_url):
    """`subs serve` hands its sweep the bot's purge hooks (bot.app.PURGE_HOOKS), a Slack
    app running or not (an earlier serve's may have left keys): a session it removes takes
    the bot's checkpoint and dedupe key of its turn along, leaving the thread's note."""
    golden = Path(__file__).parent / "golden" / "engine_client_tool.jsonl"
    sid = "slack:ops_openai:C042:1700000000.000100"
    log = [{**json.loads(line), "session_id": sid} for line in golden.read_text().splitlines()]
    config.write_text(config.read_text() + '\n[store]\nretention = "1ms"\n')
    redis = connect(redis_url)
    store = await Store.open(redis)
    await restore(store, archive.Archive(sid, log, 0, 0))
    turn = log[1]["payload"]["turn_id"]
    checkpoints = bot_store.Checkpoints(redis, "bot-1", 60_000)
    cp = Checkpoint("ops_openai", "T1", "C042", "1700000000.000100", turn, "U1", None)
    assert await checkpoints.start([bot_store.seen_key("turn", cp.key)], 3600, cp)
    note = [bot_store.archived_key(sid).encode()]

    async def only_the_note_left() -> bool:
        return await keys_naming(store, sid, cp.key) == note

    serve = await EngineProcess(config, redis_url).start()
    try:
        await poll_until(only_the_note_left, 20, "the session and the bot's keys to go")
        assert await checkpoints.open() == []
    finally:
        assert await serve.stop() == 0
        await redis.aclose()


async def _fewer(store: Store, n: int) -> bool:
    return len(await store.list_sessions(0, n)) < n


async def test_a_sessions_files_are_archived_with_it_and_come_back_on_import(engine, vendor, clock):
    vendor.push(Text("seen it"))
    client = Client(engine.store)
    sid, _ = await old_turn(clock, client, "look at this screenshot")
    name = await engine.store.put_file(sid, b"\x89PNG not really")
    report = await sweeper_of(engine).sweep_once()
    assert report is not None and report.archived == 1
    assert await keys_naming(engine.store, sid) == []  # the files' hash went too
    (path,) = report.files
    kept = archive.read(path)
    assert kept.files == {name: b"\x89PNG not really"}
    await restore(engine.store, kept)
    assert await engine.store.get_files(sid, [name]) == [b"\x89PNG not really"]
