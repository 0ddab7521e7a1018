"""Event-stream fan-out: watchers of a session share one Redis reader, and each one gets
every event once, in order, also those committed while it was joining."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import httpx
import pytest
from httpx_sse import ServerSentEvent
from redis.asyncio import Redis

from engine.api import ApiKeys, SseLimits, make_app
from engine.api.fanout import Hub
from engine.api.state import API
from engine.api.stream import sse_frame
from engine.client import Client
from engine.jsonedge import compact_json
from engine.runtime.engine import Engine
from engine.store.embedded import EmbeddedRedis
from engine.store.store import Removals, Store, connect
from tests.api_helpers import INPUT, KEYS_ENV, ROOT, auth, events_of, read_stream, serve
from tests.api_helpers import stream_path as path_of
from tests.engine_helpers import ENV, make_project, poll_until, turn_ended, wait_for_event
from tests.fakes.llm_vendor import Text

API_POOL = "fanout-test-api"  # the API's connections, by name in CLIENT LIST


@pytest.fixture
async def engine(redis, vendor, tmp_path) -> AsyncIterator[Engine]:
    eng = Engine(make_project(tmp_path, vendor.url), redis, env=ENV, lease_ms=3000)
    await eng.start()
    yield eng
    await eng.stop()


@pytest.fixture
async def api_redis(redis_url: str) -> AsyncIterator[Redis]:
    """The API's own pool, as `subs serve` gives it one."""
    async with connect(redis_url, name=API_POOL) as client:
        yield client


async def blocked_reads(redis: Redis, pool: str | None = API_POOL) -> int:
    """Connections (of the API's pool, or of any with None) parked in a blocking read."""
    clients = await redis.client_list()
    return sum(pool in (None, c["name"]) and "b" in c["flags"] for c in clients)


async def finished_turn(engine: Engine, vendor, sid: str | None = None) -> tuple[str, int]:
    """Runs one turn to its end through the engine; returns the session and its last seq."""
    vendor.push(Text("ready"))
    reply = await Client(engine.store).submit(say("hi"), session_id=sid)
    sid = reply["session_id"]
    end = await wait_for_event(Client(engine.store), sid, turn_ended(reply["turn_id"]))
    return sid, end["seq"]


def in_partition(store: Store, stem: str, p: int, *, same: bool) -> str:
    """A session id whose partition is (or is not) `p`."""
    sid = stem
    while (store.partition_of(sid) == p) != same:
        sid += "x"
    return sid


async def test_watchers_of_one_session_share_one_reader(engine, vendor, api_redis, redis):
    store = await Store.open(api_redis)
    app = make_app(Client(store), store, keys=ApiKeys.from_env(KEYS_ENV), heartbeat=30)
    hub, metrics = app[API].hub, app[API].metrics
    sid, end = await finished_turn(engine, vendor)
    p = store.partition_of(sid)
    twin, _ = await finished_turn(engine, vendor, in_partition(store, "twin", p, same=True))
    apart, _ = await finished_turn(engine, vendor, in_partition(store, "apart", p, same=False))
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=10) as http:
        params = {"after_seq": end, "turn_id": "T-fan"}
        watchers = [asyncio.create_task(read_stream(http, sid, params=params)) for _ in range(40)]
        await poll_until(lambda: _is(metrics.value("subs_sse_streams_open"), 40), 10, "40 streams")
        assert len(hub.readers) == 1
        assert await blocked_reads(redis) == 1
        # Another session of the same partition shares the reader too.
        async with http.stream("GET", path_of(twin), headers=auth(ROOT)) as resp:
            assert resp.status_code == 200
            await poll_until(lambda: _is(metrics.value("subs_sse_streams_open"), 41), 10, "41")
            assert len(hub.readers) == 1
            assert await blocked_reads(redis) == 1
        # One of another partition gets its own: one blocking read a partition.
        async with http.stream("GET", path_of(apart), headers=auth(ROOT)) as resp:
            assert resp.status_code == 200
            await poll_until(lambda: _is(len(hub.readers), 2), 10, "a second reader")
            await poll_until(lambda: _blocked_is(redis, 2), 10, "two blocking reads")

        vendor.push(Text("one for all", chunks=3))
        body = {"session_id": sid, "input": say("again", turn_id="T-fan")}
        assert (await http.post(INPUT, json=body, headers=auth(ROOT))).status_code == 202
        seen = [events_of(frames) for frames in await asyncio.gather(*watchers)]
        log = (await store.read_log(sid))[end:]
        assert log[-1]["payload"]["type"] == "turn.completed"
        assert all(events == log for events in seen)
        # The last watcher gone, the reader stops and gives its connection back.
        await poll_until(lambda: _is(len(hub.readers), 0), 10, "the readers to stop")
        await poll_until(lambda: _blocked_is(redis, 0), 10, "no blocking read left")


class Writer:
    """Appends events to a session as a commit does (log entry and snapshot seq in one
    transaction), each after a token delta of a call the snapshot does not run (written
    first, as the engine writes a call's deltas before the event that ends it)."""

    def __init__(self, redis: Redis, store: Store, sid: str, seq: int) -> None:
        self.redis, self.store, self.sid, self.seq = redis, store, sid, seq
        self.deltas = 0
        self.on = False
        self.lock = asyncio.Lock()

    async def commit(self, *, always: bool = False, noting: list[int] | None = None) -> None:
        """One event (and delta) while `on`, or `always`; `noting` gets the event's seq
        before anyone can read it. `seq` is the last event committed."""
        async with self.lock:
            if not (self.on or always):
                return
            seq = self.seq + 1
            if noting is not None:
                noting.append(seq)
            self.deltas += 1
            delta = {"call_id": "synthetic", "attempt": 1, "seq": self.deltas, "text": "."}
            await self.redis.xadd(self.store.delta_key(self.sid), {"d": compact_json(delta)})
            event = {
                "session_id": self.sid,
                "seq": seq,
                "occurred_at": "2025-01-01T00:00:00.000Z",
                "payload": {"type": "channels.updated", "channels": {"n": seq}},
            }
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.xadd(self.store.log_key(self.sid), {"e": compact_json(event)}, f"{seq}-0")
                pipe.hset(self.store.snap_key(self.sid), "seq", seq)
                await pipe.execute()
            self.seq = seq


class CommittingStore(Store):
    """The API's store, committing one more event (and delta) to the watched session just
    before each cut and each catch-up page it reads: every watcher joins while the log
    grows, on both sides of its seam (before its cut: read twice; after: read live only)."""

    def __init__(self, redis: Redis, opened: Store, writer: Writer) -> None:
        super().__init__(redis, opened.partitions, tags=opened.tags)
        self.writer = writer

    async def read_cut(self, session_id: str):
        await self.writer.commit()
        return await super().read_cut(session_id)

    async def read_log(self, session_id: str, after_seq: int = 0, count: int | None = None):
        await self.writer.commit()
        return await super().read_log(session_id, after_seq, count)


async def test_each_watcher_gets_each_event_once_in_order_while_the_log_grows(
    engine, vendor, api_redis, redis
):
    sid, end = await finished_turn(engine, vendor)
    plain = await Store.open(api_redis)
    writer = Writer(redis, plain, sid, end)
    store = CommittingStore(api_redis, plain, writer)
    # Small catch-up pages: a long catch-up, with events committed between its reads.
    app = make_app(Client(store), store, keys=ApiKeys.from_env(KEYS_ENV), sse=SseLimits(page=3))
    final: list[int] = []  # the last event's seq, noted before it is committed

    async def background() -> None:
        """Commits on its own too, interleaving with the joins."""
        while writer.on:
            await writer.commit()
            await asyncio.sleep(0)  # a turn for the others, not a wait for anything

    async def watcher(http: httpx.AsyncClient, after: int, joined: asyncio.Event):
        def stop(frame: ServerSentEvent) -> bool:
            joined.set()
            return bool(final) and frame.id == str(final[0])

        return await read_stream(http, sid, params={"after_seq": after}, stop=stop, timeout=30)

    starts: list[int] = []
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
        writer.on = True
        pacer = asyncio.create_task(background())
        watchers = []
        for n in range(12):
            # One after another, each from the start or from where the log is now.
            starts.append(0 if n % 2 == 0 else writer.seq)
            joined = asyncio.Event()
            watchers.append(asyncio.create_task(watcher(http, starts[-1], joined)))
            await first_of(joined.wait(), watchers[-1])
        writer.on = False
        await pacer
        await writer.commit(always=True, noting=final)
        frames_of = await asyncio.gather(*watchers)
    log = await plain.read_log(sid)
    assert final[0] > end + 40 and log[final[0] - 1]["seq"] == final[0]
    for n, (after, frames) in enumerate(zip(starts, frames_of, strict=True)):
        events = events_of(frames)
        assert events == log[after : final[0]], f"watcher {n} lost, repeated or reordered events"
        deltas = [json.loads(f.data) for f in frames if f.event == "llm.token.delta"]
        mine = [d["seq"] for d in deltas if d["call_id"] == "synthetic"]  # the others: replayed
        assert mine == list(range(mine[0], writer.deltas + 1)), f"watcher {n}'s deltas"


async def test_a_watcher_that_falls_behind_is_dropped_and_the_others_are_not(redis):
    store = await Store.open(redis)
    sid = "behind"
    hub = Hub(store, sse_frame, block_ms=1000, buffer=3)
    writer = Writer(redis, store, sid, 0)
    try:
        async with hub.watch(sid) as slow, hub.watch(sid) as steady:
            seqs = []
            for _ in range(6):
                await writer.commit(always=True)
                taken = 0
                while taken < 2:  # the delta and its event
                    frames = await asyncio.wait_for(steady.take(), 10)
                    taken += len(frames)
                    seqs += [f.item["seq"] for f in frames if f.kind == "event"]
            assert seqs == [1, 2, 3, 4, 5, 6] and steady.ended is None
            assert slow.overflowed and "3 frames behind" in (slow.ended or "")
            # What it had stays readable, in order; then nothing.
            assert [f.item["seq"] for f in await slow.take()] == [1, 1, 2]
            assert await slow.take() == []
            (reader,) = hub.readers.values()
            assert reader.taps[sid].watches == {steady}
    finally:
        await hub.aclose()
    assert hub.readers == {}


async def test_closing_the_hub_ends_its_watches_and_stops_its_readers(redis):
    store = await Store.open(redis)
    hub = Hub(store, sse_frame, block_ms=30_000)
    writer = Writer(redis, store, "closing", 0)
    async with hub.watch("closing") as watch, hub.watch("other") as other:
        await writer.commit(always=True)
        assert len(await asyncio.wait_for(watch.take(), 10)) == 2  # live, in a blocking read
        readers = [reader.task for reader in hub.readers.values()]
        await hub.aclose()
        assert all(task.done() for task in readers) and hub.readers == {}
        assert await watch.take() == [] and await other.take() == []
        assert watch.ended == other.ended == "the server is shutting down"
        assert not watch.overflowed
    async with hub.watch("closing") as late:  # too late: ends at once, starts nothing
        assert late.ended and hub.readers == {}
    await poll_until(lambda: _blocked_is(redis, 0, None), 10, "no blocking read left")


async def first_of(waiting: Coroutine[Any, Any, Any], task: asyncio.Task[Any]) -> None:
    """Wait for `waiting` (10 s at most), unless `task` ends first: then raise what it raised."""
    waiter = asyncio.ensure_future(waiting)
    try:
        await asyncio.wait((waiter, task), timeout=10, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
    if task.done():
        task.result()
    assert waiter.done(), "timed out"


def say(text: str, **extra: Any) -> dict[str, Any]:
    message = {"role": "user", "content": text}
    return {"type": "client.message", "agent_id": "ops_openai", "message": message, **extra}


async def _is(value: object, expected: object) -> bool:
    return value == expected


async def _blocked_is(redis: Redis, n: int, pool: str | None = API_POOL) -> bool:
    return await blocked_reads(redis, pool) == n


async def test_a_redis_restart_under_open_streams_is_one_warning_per_reader(tmp_path, caplog):
    """Redis restarted under watchers of sessions in three partitions: each partition's
    reader says so in one warning line, with no traceback, and its watchers are told to
    reconnect; watching again after the restart works."""
    server = EmbeddedRedis(tmp_path / "redis")
    await asyncio.to_thread(server.start)
    redis = connect(server.url)
    hub: Hub | None = None
    try:
        store = await Store.open(redis)
        sids = [in_partition(store, f"restart-{p}", p, same=True) for p in (0, 1, 2)]
        hub = Hub(store, sse_frame, block_ms=30_000)
        async with contextlib.AsyncExitStack() as watching:
            watches = [await watching.enter_async_context(hub.watch(sid)) for sid in sids]
            await poll_until(lambda: _blocked_is(redis, 3, None), 10, "three blocking reads")
            await asyncio.to_thread(server.stop)
            server = EmbeddedRedis(tmp_path / "redis")
            await asyncio.to_thread(server.start)
            for watch in watches:
                assert await asyncio.wait_for(watch.take(), 10) == []
                assert "reconnect to resume" in (watch.ended or ""), watch.ended
        lines = [r for r in caplog.records if r.name == "subs.fanout"]
        assert len(lines) == 3, [r.getMessage() for r in lines]
        assert {r.levelname for r in lines} == {"WARNING"}
        assert all(r.exc_info is None and "Traceback" not in r.getMessage() for r in lines)
        said = sorted(r.getMessage() for r in lines)
        for p, line in enumerate(said):
            assert line.startswith(f"the event-stream reader of partition {p} lost Redis ("), line
        writer = Writer(redis, store, sids[0], 0)
        async with hub.watch(sids[0]) as again:
            await writer.commit(always=True)
            assert len(await asyncio.wait_for(again.take(), 10)) == 2
    finally:
        if hub is not None:
            await hub.aclose()
        await redis.aclose()
        await asyncio.to_thread(server.stop)


# -- bounded: a deleted session's tap goes at once; the streams have a ceiling ----------------


async def test_deleting_sessions_ends_their_streams_and_empties_the_hub(engine, vendor, api_redis):
    """Every watched session deleted over the API: its streams end at once (no turn end, no
    client leaving), and the hub holds nothing: no tap, no reader, no stream slot."""
    store = await Store.open(api_redis)
    app = make_app(Client(store), store, keys=ApiKeys.from_env(KEYS_ENV), heartbeat=30)
    api = app[API]
    sids = [(await finished_turn(engine, vendor))[0] for _ in range(3)]
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=10) as http:
        readers = [
            asyncio.create_task(read_stream(http, sid, params={"after_seq": 0}))
            for sid in sids
            for _ in range(2)
        ]
        await poll_until(lambda: _is(api.hub.taps(), 3), 10, "three watched sessions")
        for sid in sids:
            deleted = await http.delete(f"/api/client/sessions/{sid}", headers=auth(ROOT))
            assert deleted.status_code == 204, deleted.text
        streams = await asyncio.wait_for(asyncio.gather(*readers), 10)
        assert all(
            events_of(frames)[-1]["payload"]["type"] == "turn.completed" for frames in streams
        )
        await poll_until(lambda: _is(len(api.hub.readers), 0), 10, "the readers to stop")
        assert api.hub.taps() == 0 and api.streams == set()
        assert api.streams_by_caller == {} and api.streams_held == 0
    await app.cleanup()


async def test_the_api_holds_at_most_max_streams_whoever_asks(engine, vendor, api_redis):
    store = await Store.open(api_redis)
    keys = ApiKeys.from_env(KEYS_ENV)
    app = make_app(Client(store), store, keys=keys, heartbeat=30, max_streams=2)
    sid, _ = await finished_turn(engine, vendor)
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=10) as http:
        async with (
            http.stream("GET", path_of(sid), headers=auth(ROOT)) as one,
            http.stream("GET", path_of(sid), headers=auth(ROOT)) as two,
        ):
            assert one.status_code == two.status_code == 200
            third = await http.get(path_of(sid), headers=auth(ROOT))
            assert third.status_code == 503
            assert third.json()["code"] == "too_many_streams"
            assert "[serve] max_streams" in third.json()["error"]
        async with http.stream("GET", path_of(sid), headers=auth(ROOT)) as again:
            assert again.status_code == 200  # a slot came back when those closed
    await app.cleanup()


async def test_a_removal_through_another_store_ends_the_hubs_watches_when_they_share_removals(
    redis,
):
    """`subs serve` opens two stores on one `Removals` (the engine's, whose sweep removes
    sessions, and the API's, whose hub streams them): a session removed through either
    ends its watches at once. A store with removals of its own tells the hub nothing."""
    removals = Removals()
    api_store = await Store.open(redis, removals=removals)
    engine_store = await Store.open(redis, removals=removals)
    apart = await Store.open(redis)
    hub = Hub(api_store, sse_frame, block_ms=30_000)
    try:
        for sid in ("swept", "elsewhere"):
            await Writer(redis, api_store, sid, 0).commit(always=True)
        async with hub.watch("swept") as swept, hub.watch("elsewhere") as elsewhere:
            assert hub.taps() == 2
            assert await apart.delete_session("elsewhere", 1)
            assert elsewhere.ended is None  # gone from Redis, but nobody told this hub
            assert await engine_store.delete_session("swept", 1)
            assert swept.ended == "the session was deleted or archived"
            assert hub.taps() == 1
    finally:
        await hub.aclose()


async def test_the_hubs_taps_never_outlive_their_watchers_or_their_session(redis):
    """Random joins, leaves and removals (the store's hook, as a delete or the retention
    sweep calls it): after each, the hub taps exactly the sessions with a watcher that
    joined since the session was last removed, never more than its open watches; every
    watcher of a removed session is told why. At the end, all removed: nothing left."""
    import random

    store = await Store.open(redis)
    hub = Hub(store, sse_frame, block_ms=30_000)
    rng = random.Random(27)
    sids = [f"bound{i}" for i in range(6)]
    open_: list[tuple[str, Any, contextlib.AsyncExitStack]] = []
    try:
        for _ in range(150):
            op = rng.random()
            if op < 0.5 or not open_:
                sid = rng.choice(sids)
                stack = contextlib.AsyncExitStack()
                watch = await stack.enter_async_context(hub.watch(sid))
                open_.append((sid, watch, stack))
            elif op < 0.8:
                _sid, _watch, stack = open_.pop(rng.randrange(len(open_)))
                await stack.aclose()
            else:
                gone = rng.choice(sids)
                store.removals(gone)
                for sid, watch, _stack in open_:
                    if sid == gone:
                        assert watch.ended == "the session was deleted or archived"
            live = {sid for sid, watch, _ in open_ if watch.ended is None}
            tapped = {sid for reader in hub.readers.values() for sid in reader.taps}
            assert tapped == live
            assert hub.taps() <= len(open_)
        for sid in sids:
            store.removals(sid)
        assert hub.taps() == 0
        assert all(watch.ended for _, watch, _ in open_)
        await poll_until(lambda: _is(len(hub.readers), 0), 10, "the readers to stop")
        for _sid, _watch, stack in open_:
            await stack.aclose()
    finally:
        await hub.aclose()
