"""The work of the partitions this engine owns: their inputs, in order, into commits.

Per owned partition, a reader puts its work stream's inputs on the partition's queue
and one processor takes them off in order, through `Applier.settle`
(apply-and-commit, `apply.py`), and only then starts the committed transition's
effects (`engine/effects/runner.py`), whose answers come back on the same queue. One
loop for all of them puts the timers that fell due there too. Committed deliveries
(and a settled model call's usage, for its budget buckets) leave by the partition's
outbox, relayed after the commit.

Which partitions are owned is `partitions.py`'s: it starts a partition's tasks here
once it has taken it, and cancels them when it drops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from engine.effects.runner import EffectRunner
from engine.machine import Deliver, Input, Transition, input_to_json
from engine.machine import events as ev
from engine.retrying import Backoff, Trouble
from engine.runtime.apply import Applier
from engine.runtime.partitions import Partition
from engine.store.store import STORE_FAULTS, Store, StoreConflict, WorkItem

log = logging.getLogger("subs.engine")

# A stop waits this long for the inputs in hand to be committed before it cancels them.
SETTLE_PATIENCE_SECS = 2.0


class OwnedWork:
    """Reads, applies and follows up the inputs of each partition in `owned`."""

    def __init__(
        self,
        store: Store,
        applier: Applier,
        effects: EffectRunner,
        owned: Mapping[int, Partition],
        *,
        owner: str,
        timer_poll_ms: int,
        trouble: Trouble,
        now_ms: Callable[[], int],
    ) -> None:
        """`owned`: the engine's table of its partitions, read here (`partitions.py`
        writes it)."""
        self.store = store
        self.applier = applier
        self.effects = effects
        self.budgets = applier.budgets  # a model call's usage goes to its buckets
        self.owned = owned
        self.owner = owner
        self.timer_poll_ms = timer_poll_ms
        self.trouble = trouble
        self.now_ms = now_ms

    def start(self, part: Partition) -> list[asyncio.Task[None]]:
        """The tasks of a partition just taken: its work reader and its processor."""
        return [
            asyncio.create_task(self._read_work(part), name=f"subs-read-{part.p}"),
            asyncio.create_task(self._process(part), name=f"subs-apply-{part.p}"),
        ]

    async def finish(self) -> None:
        """Let each partition finish the input in hand (bounded), taking no more. Its commit
        may be seen already (a follower reads Redis, not us), so cancelling the wait for
        its reply would lose what follows it here: the commit's spans and counts."""
        for part in self.owned.values():
            part.stopping = True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(SETTLE_PATIENCE_SECS):
                for part in list(self.owned.values()):
                    await part.idle.wait()

    async def timers(self) -> None:
        """Put each owned partition's timers that fell due on its queue, once each."""
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

    async def _read_work(self, part: Partition) -> None:
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

    async def _process(self, part: Partition) -> None:
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

    async def _settle(self, part: Partition, item: WorkItem) -> None:
        """Apply and commit one input, then start what the committed transition asks for."""
        t = await self.applier.settle(part.p, part.lease, item)
        if t is not None:
            self._start_effects(part, t)

    def _start_effects(self, part: Partition, t: Transition) -> None:
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
        if self.budgets.policies and any(
            e["payload"]["type"] == ev.LLM_CALL_COMPLETED for e in t.events
        ):
            part.outbox_dirty = True  # the call's usage waits there for its buckets
        if part.outbox_dirty:
            task = asyncio.create_task(self._relay_outbox(part))
            part.calls.add(task)
            task.add_done_callback(part.calls.discard)

    async def _relay_outbox(self, part: Partition) -> None:
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
                for entry_id, message in await self.store.outbox(part.p):
                    try:
                        await self._hand_over(message)
                    except STORE_FAULTS:
                        raise
                    except Exception as err:  # it would fail every relay after it too
                        await self._dead(part, entry_id, message, err)
                        continue
                    await self.store.outbox_done(part.p, entry_id)
        except STORE_FAULTS as err:
            part.outbox_dirty = True  # the work reader's next round tries again
            self.trouble(f"relaying the outbox of partition {part.p}", err)
        finally:
            part.relaying = False

    async def _hand_over(self, message: str) -> None:
        """One outbox entry: a delivery to its session's work stream, or a settled call's
        usage to its buckets (engine/store/buckets.py)."""
        body = json.loads(message)
        if "charge" in body:
            await self.store.charge(body["charge"], self.now_ms())
        else:
            await self.store.enqueue(body["to"], body["input"], None)

    async def _dead(self, part: Partition, entry_id: str, message: str, err: Exception) -> None:
        """An entry that cannot be handed over (a bug's, or a key of the wrong type in its
        way) leaves the outbox for the dead-letter stream, logged once with its traceback,
        so the entries after it still go; `subs sessions dead` lists it."""
        reason = f"{type(err).__name__}: {err}"
        log.error(
            "outbox entry %s of partition %d dead-lettered: %s",
            entry_id,
            part.p,
            reason,
            exc_info=err,
        )
        to = ""
        with contextlib.suppress(Exception):
            to = str(json.loads(message).get("to") or "")
        letter = {
            "session_id": to,
            "entry_id": entry_id,
            "outbox": message,
            "reason": reason,
            "at_ms": self.now_ms(),
        }
        await self.store.outbox_dead(part.p, entry_id, letter)
