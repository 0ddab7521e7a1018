"""The engine process: owns partitions, and per partition applies inputs in order.

Partitions are leased (fenced, renewed by heartbeat, shared fairly across live
engines). Per owned partition, one processor task takes inputs in order — client
inputs from the partition's work stream, timers that fell due, effect completions
handed over in process — through `Applier.settle` (apply-and-commit, `apply.py`),
and only then starts the committed transition's effects (`engine/effects/runner.py`). A
completion that outlives its lease is fenced off at commit; a call whose engine
died is re-sent by the next owner.

`Engine` is the composition root: it builds the table of call kinds the machine steps
by and the table of effect runners once, and hands them to the parts that read them;
a caller with a kind of its own passes both (tests/test_effect_kinds.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.config import Project
from engine.effects.builtin import builtin_runners
from engine.effects.mcp.runners import McpRunners
from engine.effects.runner import EffectRunner, Runners, worker_targets
from engine.ids import new_id
from engine.machine import Deliver, Input, Kinds, Transition, default_kinds, input_to_json
from engine.machine import events as ev
from engine.metrics import Metrics
from engine.retrying import Backoff, Trouble
from engine.runtime.apply import Applier, EngineStats, lost_work
from engine.runtime.retention import Sweeper
from engine.store.durability import check_server
from engine.store.reindex import ensure_indexes
from engine.store.retention import FULL_AT, PurgeHooks, Removals
from engine.store.store import STORE_FAULTS, RedisClient, Store, StoreConflict, WorkItem
from engine.telemetry.tracing import Tracing, tracing_from

log = logging.getLogger("subs.engine")


RECANCEL_SECONDS = 0.1
# A stop waits this long for the inputs in hand to be committed before it cancels them.
SETTLE_PATIENCE_SECS = 2.0


def new_event_loop() -> asyncio.AbstractEventLoop:
    """The loop `subs serve` runs the engine on: uvloop's (libuv), where it is installed.

    It took ~7% off the engine's CPU per step (`bench/step_overhead.py`); the engine
    is plain asyncio and runs on the standard loop too (the tests do).
    """
    try:
        import uvloop
    except ImportError:  # not built for this platform
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


async def cancel_and_wait(tasks: Iterable[asyncio.Task[Any]], *, patience: float | None) -> None:
    """Cancel the tasks and wait for them to end, cancelling again while they run.

    Once is not always enough on Python 3.11: a cancel that lands just as a
    `wait_for` (redis-py's socket timeout) completes its inner call is lost, and
    the task goes on sleeping; `subs serve` then never exited on SIGTERM. After
    `patience` seconds (None: no limit) a task still running is logged and left.
    """
    every = list(tasks)
    pending = {t for t in every if not t.done()}
    loop = asyncio.get_running_loop()
    give_up = None if patience is None else loop.time() + patience
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_SECONDS)
        if pending and give_up is not None and loop.time() >= give_up:
            log.warning("%d task(s) did not stop when cancelled: %s", len(pending), pending)
            break
    for task in every:
        if task.done() and not task.cancelled() and task.exception() is not None:
            log.warning("task %s had failed: %s", task.get_name(), task.exception())


@dataclass
class _Partition:
    p: int
    lease: str
    queue: asyncio.Queue[WorkItem] = field(default_factory=asyncio.Queue)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    calls: set[asyncio.Task[None]] = field(default_factory=set)
    timers_queued: set[str] = field(default_factory=set)
    entries: set[str | None] = field(default_factory=set)  # work entries in hand, not acked
    outbox_dirty: bool = False  # committed deliveries may wait in the outbox
    relaying: bool = False
    stopping: bool = False  # the engine stops: take no more work
    idle: asyncio.Event = field(default_factory=asyncio.Event)  # no input in hand


class Engine:
    """One engine process's share of the work on one Redis."""

    applier: Applier
    effects: EffectRunner
    mcp: McpRunners

    def __init__(
        self,
        project: Project,
        redis: RedisClient,
        *,
        env: Mapping[str, str] | None = None,
        owner: str | None = None,
        lease_ms: int = 10_000,
        timer_poll_ms: int = 50,
        partitions: int | None = None,
        clock: Callable[[], float] = time.time,
        metrics: Metrics | None = None,
        kinds: Kinds | None = None,
        runners: Runners | None = None,
        sweep: bool = False,
        tracing: Tracing | None = None,
        removals: Removals | None = None,
        purge: PurgeHooks | None = None,
    ) -> None:
        """`kinds`: the call kinds the machine runs by (default: defaults.py's);
        `runners`: runners of effects beside the built-in and MCP ones (a kind of its own);
        `sweep`: take part in the retention sweep (`subs serve` does; runtime/retention.py);
        `removals`: the process's watchers of removed sessions, shared with its other stores
        (the engine's cache is one); `purge`: the sweep's hooks for other layers' keys."""
        self.project = project
        self.redis = redis
        self.env = os.environ if env is None else env
        self.owner = owner or new_id("engine")
        self.lease_ms = lease_ms
        self.timer_poll_ms = timer_poll_ms
        self.clock = clock
        self.kinds = default_kinds() if kinds is None else kinds
        self._more_runners = dict(runners or {})
        self.stats = EngineStats()
        self.metrics = metrics or Metrics()
        self.trouble = Trouble(log)
        self._want_partitions = partitions
        self._sweep = sweep
        self.removals = Removals() if removals is None else removals
        self.purge = dict(purge or {})
        self.sweeper: Sweeper | None = None
        self.store: Store
        self.owned: dict[int, _Partition] = {}
        self._background: list[asyncio.Task[None]] = []
        self._ownership_changed = asyncio.Event()
        self.workers = worker_targets(project, self.env)  # a missing secret fails here
        # Given, or as [telemetry] and OTEL_* say (None: nothing traced, no SDK loaded).
        self.tracing = tracing if tracing is not None else tracing_from(project, self.env)

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Open the store and start taking partitions; returns once running."""
        durability = self.project.store
        self.store = await Store.open(
            self.redis,
            self._want_partitions or durability.partitions,
            wait_replicas=durability.wait_replicas,
            wait_timeout_ms=durability.wait_timeout_ms,
            removals=self.removals,
        )
        if self._want_partitions is None and self.store.partitions != durability.partitions:
            log.warning(
                "this Redis keeps %d partitions (fixed by the first engine on it); "
                "[store] partitions = %d applies to a new store only",
                self.store.partitions,
                durability.partitions,
            )
        await check_server(self.redis, durability.fsync)
        await ensure_indexes(self.store, self.kinds)  # sessions an older version wrote
        self.applier = Applier(
            self.project,
            self.store,
            kinds=self.kinds,
            clock=self.clock,
            metrics=self.metrics,
            stats=self.stats,
            trouble=self.trouble,
            tracing=self.tracing,
        )
        self.mcp = McpRunners(self.project, self.env)
        await self.mcp.start()
        runners = {**builtin_runners(), **self.mcp.runners(), **self._more_runners}
        self.effects = EffectRunner(
            self.project, self.store, self.env, self.workers, self.metrics, self.clock, runners
        )
        self.effects.sampled = self.tracing is not None
        if self.tracing is not None:
            self.tracing.scrub = self.effects.redactor.scrub
        await self._balance()
        self._background = [
            asyncio.create_task(self._lease_loop(), name="subs-leases"),
            asyncio.create_task(self._timer_loop(), name="subs-timers"),
        ]
        self.removals.watch(self.applier.drop)
        self.sweeper = self._sweeper()
        if self.sweeper is not None and self._sweep:
            self._background.append(asyncio.create_task(self.sweeper.run(), name="subs-sweep"))

    def _sweeper(self) -> Sweeper | None:
        """The retention sweep as `[store]` asks for it; None with `retention = "forever"`."""
        conf = self.project.store
        if conf.retention_ms is None:
            return None
        folder = None
        if conf.archive_dir is not None:
            folder = Path(conf.archive_dir)
            if not folder.is_absolute():  # beside the project file, as `.subs/` is
                folder = Path(self.project.path).resolve().parent / folder
        return Sweeper(
            self.store,
            retention_ms=conf.retention_ms,
            archive_dir=folder,
            clock=self.clock,
            owner=self.owner,
            on_removed=lambda sid: self.metrics.inc("subs_sessions_archived_total"),
            purge=self.purge,
        )

    async def stop(self) -> None:
        """Stop taking work, finish the inputs in hand (bounded), hand back in-flight calls,
        release leases."""
        await cancel_and_wait(self._background, patience=None)
        self.removals.unwatch(self.applier.drop)
        await self._finish_settles()
        # At once: a release on a connection Redis stopped answering costs a socket timeout.
        await asyncio.gather(*(self._drop(p, release=True) for p in list(self.owned)))
        with contextlib.suppress(Exception):
            await self.store.leave(self.owner)
        await self.mcp.aclose()
        await self.effects.aclose()
        if self.tracing is not None:
            await self.tracing.aclose()

    async def _finish_settles(self) -> None:
        """Let each partition finish the input in hand (bounded), taking no more. Its commit
        may be seen already (a follower reads Redis, not us), so cancelling the wait for
        its reply would lose what follows it here: the commit's spans and counts."""
        for part in self.owned.values():
            part.stopping = True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(SETTLE_PATIENCE_SECS):
                for part in list(self.owned.values()):
                    await part.idle.wait()

    def now_ms(self) -> int:
        """The engine's clock in ms; injected so tests can move it."""
        return int(self.clock() * 1000)

    async def wait_owned(self, count: int, timeout: float = 30.0) -> None:
        """Wait until this engine owns `count` partitions (tests, `subs run`)."""
        async with asyncio.timeout(timeout):
            while len(self.owned) < count:
                self._ownership_changed.clear()
                await self._ownership_changed.wait()

    # -- leases ----------------------------------------------------------------------

    async def _lease_loop(self) -> None:
        while True:
            await asyncio.sleep(self.lease_ms / 3000)
            try:
                await self._balance()
            except STORE_FAULTS as err:  # Redis away: the next round tries again
                self.trouble("a lease round", err)
            except Exception:
                log.exception("lease round failed")

    async def _balance(self) -> None:
        # Renewals first: a PEXPIRE is taken even by a Redis at maxmemory, which refuses
        # the heartbeat's ZADD; the partitions held stay held while room is made.
        leases = {p: part.lease for p, part in self.owned.items()}
        lost = await self.store.renew(leases, self.lease_ms)
        await self._read_memory()
        now = self.now_ms()
        live = await self.store.heartbeat(self.owner, now + self.lease_ms, now)
        share = math.ceil(self.store.partitions / max(live, 1))
        for p in lost:
            log.warning("lost the lease on partition %d", p)
            self.metrics.lease_lost()
            await self._drop(p, release=False)
        for p in sorted(self.owned, reverse=True)[: max(len(self.owned) - share, 0)]:
            await self._drop(p, release=True)  # another engine joined: hand back our surplus
        for p in range(self.store.partitions):
            if len(self.owned) >= share:
                break
            if p in self.owned:
                continue
            lease = await self.store.acquire(p, self.owner, self.lease_ms)
            if lease is not None:
                await self._take(p, lease)
        self.metrics.partitions_owned(len(self.owned))

    async def _read_memory(self) -> None:
        """Redis's memory for /metrics, each lease round; a server that will not say
        (INFO refused) shows 0."""
        try:
            used, limit = await self.store.memory()
        except Exception:  # Redis away (the round's other reads say so) or INFO refused
            return
        self.metrics.store_memory(used, limit, FULL_AT)

    async def _take(self, p: int, lease: str) -> None:
        part = _Partition(p, lease)
        try:
            await self.store.ensure_group(p)
            pending = await self.store.claim_pending(p, self.owner)
            # Calls the previous owner had out are lost with it: send them again.
            lost = []
            for sid in await self.store.inflight_sessions(p):
                state = await self.applier.load(sid)
                lost += [
                    WorkItem(None, sid, input_to_json(x)) for x in lost_work(state, self.kinds)
                ]
        except Exception:
            # Half taken is not taken: let the lease go so this or another engine retries.
            with contextlib.suppress(Exception):
                await self.store.release(p, lease)
            raise
        self.owned[p] = part
        part.entries.update(item.entry_id for item in pending)
        for item in [*pending, *lost]:
            part.queue.put_nowait(item)
        part.outbox_dirty = True
        part.tasks = [
            asyncio.create_task(self._read_work(part), name=f"subs-read-{p}"),
            asyncio.create_task(self._process(part), name=f"subs-apply-{p}"),
        ]
        self._ownership_changed.set()

    async def _drop(self, p: int, *, release: bool) -> None:
        part = self.owned.pop(p)
        # Bounded: a task stuck in a library must not hold up shutdown.
        await cancel_and_wait([*part.tasks, *part.calls], patience=5.0)
        self.applier.forget(p)
        if release:
            with contextlib.suppress(Exception):
                await self.store.release(p, part.lease)
        self._ownership_changed.set()

    # -- inputs ----------------------------------------------------------------------

    async def _read_work(self, part: _Partition) -> None:
        backoff = Backoff()
        recover = False
        while True:
            try:
                items = await self.store.read_work(part.p, self.owner, block_ms=2000, own=recover)
            except Exception as err:
                # A read can fail after Redis handed us entries: read our own next time.
                recover = True
                self.trouble(f"reading work of partition {part.p}", err)
                await backoff.wait()
                continue
            recover = False
            backoff.reset()
            for item in items:
                if item.entry_id not in part.entries:  # already in hand (a re-read)
                    part.entries.add(item.entry_id)
                    part.queue.put_nowait(item)
            if part.outbox_dirty:
                await self._relay_outbox(part)

    async def _timer_loop(self) -> None:
        backoff = Backoff()
        while True:
            await asyncio.sleep(self.timer_poll_ms / 1000)
            owned = list(self.owned)
            if not owned:
                continue
            try:
                members = await self.store.due_timers_all(owned, self.now_ms())
            except Exception as err:
                self.trouble("reading timers", err)
                await backoff.wait()
                continue
            backoff.reset()
            for member in members:
                body = json.loads(member)
                part = self.owned.get(self.store.partition_of(body["sid"]))
                if part is None or member in part.timers_queued:
                    continue
                part.timers_queued.add(member)
                part.queue.put_nowait(
                    WorkItem(None, body["sid"], body["input"], timer_member=member)
                )

    async def _process(self, part: _Partition) -> None:
        while not part.stopping:
            part.idle.set()
            item = await part.queue.get()
            part.idle.clear()
            try:
                await self._settle(part, item)
            except StoreConflict as err:  # fenced off: the partition is someone else's now
                log.warning("partition %d fenced off: %s", part.p, err)
                return
            finally:
                if item.timer_member:
                    part.timers_queued.discard(item.timer_member)
                part.entries.discard(item.entry_id)
        part.idle.set()

    async def _settle(self, part: _Partition, item: WorkItem) -> None:
        """Apply and commit one input, then start what the committed transition asks for."""
        t = await self.applier.settle(part.p, part.lease, item)
        if t is not None:
            self._start_effects(part, t)

    def _start_effects(self, part: _Partition, t: Transition) -> None:
        """No I/O here: effects run as tasks of the partition, deliveries leave by the outbox."""
        state = t.state
        assert state is not None
        sid = state.session_id

        def done(result: Input, deltas: tuple[dict[str, Any], ...]) -> None:
            part.queue.put_nowait(WorkItem(None, sid, input_to_json(result), deltas=deltas))

        for effect in t.effects:
            if self.effects.runs(effect):
                self.effects.start(state, effect, done, part.calls)
            elif isinstance(effect, Deliver):
                part.outbox_dirty = True
        if self.applier.policies and any(
            e["payload"]["type"] == ev.LLM_CALL_COMPLETED for e in t.events
        ):
            part.outbox_dirty = True  # the call's usage waits there for its buckets
        if part.outbox_dirty:
            task = asyncio.create_task(self._relay_outbox(part))
            part.calls.add(task)
            task.add_done_callback(part.calls.discard)

    async def _relay_outbox(self, part: _Partition) -> None:
        """Hand committed deliveries to their target sessions, then forget them.

        A crash or a Redis fault between the two relays them again later; every
        delivered input is idempotent at the receiver (message ids, turn ids derived
        from the parent's call). One relay at a time per partition.
        """
        if part.relaying:
            return
        part.relaying = True
        try:
            while part.outbox_dirty:
                part.outbox_dirty = False
                for entry_id, to, message in await self.store.outbox(part.p):
                    body = json.loads(message)
                    if "charge" in body:  # a settled call's usage (engine/store/buckets.py)
                        await self.store.charge(body["charge"], self.now_ms())
                    else:
                        await self.store.enqueue(to, body["input"], None)
                    await self.store.outbox_done(part.p, entry_id)
        except STORE_FAULTS as err:
            part.outbox_dirty = True  # the work reader's next round tries again
            self.trouble(f"relaying the outbox of partition {part.p}", err)
        finally:
            part.relaying = False
