"""The partitions this engine owns, by lease: taken, renewed, shared fairly, handed back.

A partition's lease is fenced (every commit checks it) and lives `lease_ms`; each
round, a third of that apart, renews the leases held, says this engine is alive, and
takes or hands back partitions until each live engine holds its fair share. Taking a
partition reclaims the inputs its last owner had read but not committed, and sends
again the calls that owner had out (they died with it). Dropping one cancels its
tasks and forgets its cached states.

What happens inside an owned partition (its inputs read and applied in order) is
`work.py`'s; this module only says which partitions those are.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.machine import Kinds, input_to_json
from engine.metrics import Metrics
from engine.retrying import Trouble
from engine.runtime.apply import Applier
from engine.runtime.cancelling import cancel_and_wait
from engine.runtime.inflight import lost_work
from engine.store.retention import FULL_AT
from engine.store.store import STORE_FAULTS, Store, WorkItem

log = logging.getLogger("subs.engine")


@dataclass
class Partition:
    """One owned partition: its lease, its inputs in hand, the tasks that work on it."""

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


class Leases:
    """Keeps `owned` (the engine's table of its partitions) to this engine's fair share."""

    def __init__(
        self,
        store: Store,
        applier: Applier,
        owned: dict[int, Partition],
        *,
        owner: str,
        lease_ms: int,
        kinds: Kinds,
        metrics: Metrics,
        trouble: Trouble,
        now_ms: Callable[[], int],
        start: Callable[[Partition], list[asyncio.Task[None]]],
    ) -> None:
        """`owned` is written here only; `start` starts a partition's tasks once taken."""
        self.store = store
        self.applier = applier
        self.owned = owned
        self.owner = owner
        self.lease_ms = lease_ms
        self.kinds = kinds
        self.metrics = metrics
        self.trouble = trouble
        self.now_ms = now_ms
        self.start = start
        self._changed = asyncio.Event()

    async def wait_owned(self, count: int, timeout: float = 30.0) -> None:
        """Wait until this engine owns `count` partitions (the benches, before they measure)."""
        async with asyncio.timeout(timeout):
            while len(self.owned) < count:
                self._changed.clear()
                await self._changed.wait()

    async def run(self) -> None:
        """A lease round every third of a lease, for as long as the engine runs."""
        while True:
            await asyncio.sleep(self.lease_ms / 3000)
            try:
                await self.balance()
            except STORE_FAULTS as err:  # Redis away: the next round tries again
                self.trouble("a lease round", err)
            except Exception:
                log.exception("lease round failed")

    async def balance(self) -> None:
        """One lease round: renew, say we live, then take or hand back to a fair share."""
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
        for p in [p for p, part in self.owned.items() if _stalled(part)]:
            await self._drop(p, release=True)  # taken afresh below, by this engine or another
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

    async def release_all(self) -> None:
        """Hand back every partition (the engine stops)."""
        # At once: a release on a connection Redis stopped answering costs a socket timeout.
        await asyncio.gather(*(self._drop(p, release=True) for p in list(self.owned)))

    async def _read_memory(self) -> None:
        """Redis's memory for /metrics, each lease round; a server that will not say
        (INFO refused) shows 0."""
        try:
            used, limit = await self.store.memory()
        except Exception:  # Redis away (the round's other reads say so) or INFO refused
            return
        self.metrics.store_memory(used, limit, FULL_AT)

    async def _take(self, p: int, lease: str) -> None:
        part = Partition(p, lease)
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
        part.tasks = self.start(part)
        self._changed.set()

    async def _drop(self, p: int, *, release: bool) -> None:
        part = self.owned.pop(p)
        # Bounded: a task stuck in a library must not hold up shutdown.
        await cancel_and_wait([*part.tasks, *part.calls], patience=5.0)
        self.applier.forget(p)
        if release:
            with contextlib.suppress(Exception):
                await self.store.release(p, part.lease)
        self._changed.set()


def _stalled(part: Partition) -> bool:
    """A partition whose reader or processor ended while it is owned and the engine runs:
    nothing would read or apply its inputs again (a bug's exception, logged here with its
    traceback, or a processor fenced off), so it is dropped and taken afresh."""
    ended = [t for t in part.tasks if t.done()]
    if not ended or part.stopping:
        return False
    for task in ended:
        err = None if task.cancelled() else task.exception()
        log.error(
            "partition %d: its task %s ended%s; taking the partition afresh",
            part.p,
            task.get_name(),
            f": {err!r}" if err else "",
            exc_info=err,
        )
    return True
