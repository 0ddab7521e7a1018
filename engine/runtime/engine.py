"""The engine process: owns partitions, and per partition applies inputs in order.

Partitions are leased (fenced, renewed by heartbeat, shared fairly across live
engines: `partitions.py`). Per owned partition, one processor task takes inputs in
order — client inputs from the partition's work stream, timers that fell due, effect
completions handed over in process — through `Applier.settle` (apply-and-commit,
`apply.py`), and only then starts the committed transition's effects
(`engine/effects/runner.py`; the loop is `work.py`'s). A completion that outlives its
lease is fenced off at commit; a call whose engine died is re-sent by the next owner.

`Engine` is the composition root: it builds the table of call kinds the machine steps
by and the table of effect runners once, and hands them to the parts that read them;
a caller with a kind of its own passes both (tests/test_effect_kinds.py). It holds the
table of the partitions it owns (`owned`), which its leases fill and its work reads,
and starts and stops them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from engine.config import Project
from engine.effects.builtin import builtin_runners
from engine.effects.mcp.runners import McpRunners
from engine.effects.runner import EffectRunner, Runners, worker_targets
from engine.ids import new_id
from engine.machine import Kinds, default_kinds
from engine.metrics import Metrics
from engine.retrying import Trouble
from engine.runtime.apply import Applier, EngineStats
from engine.runtime.cancelling import cancel_and_wait
from engine.runtime.partitions import Leases, Partition
from engine.runtime.retention import Sweeper
from engine.runtime.work import OwnedWork
from engine.store.durability import check_server
from engine.store.reindex import ensure_indexes
from engine.store.retention import PurgeHooks, Removals
from engine.store.store import RedisClient, Store
from engine.telemetry.tracing import Tracing, tracing_from

log = logging.getLogger("subs.engine")


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


class Engine:
    """One engine process's share of the work on one Redis."""

    applier: Applier
    effects: EffectRunner
    mcp: McpRunners
    leases: Leases
    work: OwnedWork

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
        self.owned: dict[int, Partition] = {}  # the leases fill it, the work reads it
        self._background: list[asyncio.Task[None]] = []
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
        self.work = OwnedWork(
            self.store,
            self.applier,
            self.effects,
            self.owned,
            owner=self.owner,
            timer_poll_ms=self.timer_poll_ms,
            trouble=self.trouble,
            now_ms=self.now_ms,
        )
        self.leases = Leases(
            self.store,
            self.applier,
            self.owned,
            owner=self.owner,
            lease_ms=self.lease_ms,
            kinds=self.kinds,
            metrics=self.metrics,
            trouble=self.trouble,
            now_ms=self.now_ms,
            start=self.work.start,
        )
        await self.leases.balance()
        self._background = [
            asyncio.create_task(self.leases.run(), name="subs-leases"),
            asyncio.create_task(self.work.timers(), name="subs-timers"),
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
        await self.work.finish()
        await self.leases.release_all()
        with contextlib.suppress(Exception):
            await self.store.leave(self.owner)
        await self.mcp.aclose()
        await self.effects.aclose()
        if self.tracing is not None:
            await self.tracing.aclose()

    def now_ms(self) -> int:
        """The engine's clock in ms; injected so tests can move it."""
        return int(self.clock() * 1000)
