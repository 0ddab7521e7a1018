"""Apply-and-commit: one input through the machine into one atomic Redis commit.

The session's state is loaded (cached while this engine owns its partition), the
pure machine turns the input into events, effects and timers, and one Lua call
commits them with the work item's ack, fenced by the partition's lease. Only a
committed transition's effects may start: the caller starts them.

Here: the step's order, the retries and the dead letter, the cache and the counts.
Beside it, each its own idea: the stored input as the machine's (`intake.py`), the
budget buckets the step is checked against (`budgets.py`), the transition as the
store's `Commit` (`commits.py`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.config import Project
from engine.errors import ErrorInfo, describe
from engine.ids import new_id
from engine.jsonedge import encode
from engine.machine import (
    ChildSpawned,
    Deliver,
    InputRejected,
    Kinds,
    MachineError,
    SessionState,
    Transition,
    step,
)
from engine.machine import events as ev
from engine.machine.policies import UNREAD, charges
from engine.metrics import Metrics
from engine.retrying import Backoff, Trouble
from engine.runtime.budgets import Budgets
from engine.runtime.cache import StateCache
from engine.runtime.commits import commit_of, with_item
from engine.runtime.intake import Intake
from engine.store.buckets import charge_message
from engine.store.snapshots import SNAPSHOT_MIN_BYTES, Mark, current, load, mark_of
from engine.store.store import (
    STORE_FAULTS,
    Commit,
    OutOfMemoryError,
    Store,
    StoreConflict,
    WorkItem,
)
from engine.telemetry.spans import Before, call_context
from engine.telemetry.tracing import Tracing

log = logging.getLogger("subs.engine")

# An input whose transition fails this often (reloaded from Redis each time) is a bug,
# not bad luck: it goes to the dead-letter stream. One the work stream has handed out
# this often took its engine down each time (or never got an answer): the same.
POISON_FAILURES = 3
POISON_DELIVERIES = 10


@dataclass
class EngineStats:
    """Counters a benchmark or /metrics reads."""

    steps: int = 0
    step_seconds: list[float] = field(default_factory=list)
    record_steps: bool = False


@dataclass(frozen=True)
class _Planned:
    """One input's transition, ready to commit: what to write, and what follows it."""

    commit: Commit
    transition: Transition | None  # None: refused, nothing follows
    started: float  # perf_counter at the start of the step
    mark: Mark | None = None  # the stored snapshot's mark once this commit lands
    before: Before | None = None  # what the spans this commit ends need (tracing on)


class Applier:
    """Applies inputs to the sessions of the partitions its engine owns."""

    def __init__(
        self,
        project: Project,
        store: Store,
        *,
        kinds: Kinds,
        clock: Callable[[], float],
        metrics: Metrics,
        stats: EngineStats,
        trouble: Trouble,
        tracing: Tracing | None = None,
    ) -> None:
        self.tracing = tracing
        self.store = store
        self.kinds = kinds  # the call kinds every step runs by
        self.clock = clock
        self.metrics = metrics
        self.stats = stats
        self.trouble = trouble
        serve = project.serve
        self.cache = StateCache(serve.state_cache_mb * 1024 * 1024, serve.state_cache_sessions)
        self.snapshot_min_bytes = SNAPSHOT_MIN_BYTES
        self.intake = Intake(project)
        self.budgets = Budgets(project.budgets, store)

    def now_ms(self) -> int:
        """The clock steps are stamped with, in ms; injected so tests can move it."""
        return int(self.clock() * 1000)

    def forget(self, p: int) -> None:
        """The partition is no longer ours: its cached states may go stale."""
        for sid in [s for s in self.cache if self.store.partition_of(s) == p]:
            self.drop(sid)

    def drop(self, sid: str) -> None:
        """Forget a session's cached state (it was deleted, archived, or may be stale)."""
        self.cache.drop(sid)

    async def settle(self, p: int, lease: str, item: WorkItem) -> Transition | None:
        """Apply one input and commit it, however long Redis is away.

        A Redis fault is waited out with backoff, the same input kept in hand (so
        per-session order holds and nothing handed over in process is lost). A
        commit whose answer was lost with the connection is recognised by the
        snapshot's seq, so its effects start once. Any other failure is a bug:
        tried again from a fresh read, then dead-lettered (`_plan_rejection`).

        Returns the committed transition, whose effects the caller starts (None when
        the input was refused).

        Raises:
            StoreConflict: the lease moved; the partition is someone else's now.
        """
        sid = item.session_id
        planned: _Planned | None = None
        faulted = False
        failures = 0
        backoff = Backoff()
        rejection: tuple[str, str | None] | None = None  # (reason, traceback): dead-letter it
        if item.deliveries > POISON_DELIVERIES:
            rejection = (f"delivered {item.deliveries} times without an answer", None)
        deltas = item.deltas  # sent with the first commit attempt only: never twice
        while True:
            try:
                if planned is None:
                    planned = await (
                        self._plan_rejection(item, *rejection) if rejection else self._plan(item)
                    )
                try:
                    await self.store.commit(p, lease, planned.commit, deltas)
                except StoreConflict as err:
                    if err.lease_lost or not (faulted and await self._landed(planned)):
                        raise
                finally:
                    deltas = ()
                return self._committed(planned)
            except StoreConflict as err:
                self.drop(sid)
                if err.lease_lost:
                    raise
                planned, faulted = None, False  # another writer won: re-read and apply again
            except STORE_FAULTS as err:
                self.drop(sid)
                faulted = planned is not None
                if isinstance(err, OutOfMemoryError):  # waited out: turns end as room is made
                    self.metrics.inc("subs_store_oom_total")
                self.trouble(f"committing an input to {sid}", err)
                await backoff.wait()
            except Exception as err:  # not CancelledError: that one leaves
                self.drop(sid)
                planned, faulted = None, False
                failures += 1
                if failures >= POISON_FAILURES:
                    rejection = (describe(err), traceback.format_exc())
                else:
                    log.warning("applying an input to %s failed (%s); trying again", sid, err)

    async def _landed(self, planned: _Planned) -> bool:
        c = planned.commit
        return bool(c.events) and await self.store.committed_seq(c.session_id) == c.new_seq

    def _committed(self, planned: _Planned) -> Transition | None:
        """The transition is durable: remember the state, count it, hand it back."""
        t = planned.transition
        if t is None or t.state is None:
            return None
        mark = planned.mark
        size = None if mark is None else mark.state_bytes + mark.tail_bytes
        self.cache.put(t.state.session_id, t.state, mark, size)
        self._count(t.events)
        if self.tracing is not None and planned.before is not None:
            self.tracing.committed(planned.before, t.events, t.decided)
        self.stats.steps += 1
        if self.stats.record_steps:
            self.stats.step_seconds.append(time.perf_counter() - planned.started)
        return t

    async def load(self, sid: str) -> SessionState | None:
        """The session's state: cached, or its snapshot plus the log tail."""
        state = self.cache.get(sid)
        if state is None:
            snap = await self.store.load_snapshot(sid)
            if snap is not None:
                state = await load(self.store, sid, snap)
                # No mark for a snapshot another fold wrote: the next commit rewrites it.
                mark = mark_of(snap) if current(snap) else None
                self.cache.put(sid, state, mark, snap.state_bytes + snap.tail_bytes)
        return state

    async def _plan(self, item: WorkItem) -> _Planned:
        """Load the session and run the machine: the commit to write and what follows it."""
        started = time.perf_counter()
        sid = item.session_id
        state = await self.load(sid)
        seq = state.seq if state else 0
        before = None if self.tracing is None else Before.of(state, sid, self.tracing.capture)
        now = self.now_ms()
        try:
            inp = self.intake.input_of(state, item.input)
            refs = await self.budgets.refs(sid, state, inp)
            t = step(state, sid, inp, now, new_id, self.kinds, buckets=UNREAD if refs else ())
            again = await self.budgets.recheck(sid, inp, t, now)
            if again is not None:  # the buckets refuse or hold a model call it let through
                self.drop(sid)  # the step changed the cached state: again from the stored one
                state = await self.load(sid)
                seq = state.seq if state else 0
                inp = self.intake.input_of(state, item.input)
                t = step(state, sid, inp, now, new_id, self.kinds, buckets=again)
        except MachineError as err:
            reply = {"ok": False, "status": err.status, **err.body()}
            commit = Commit(sid, seq, seq, (), None, reply=reply)
            return _Planned(with_item(commit, item), None, started)
        if before is not None:
            _trace_spawns(t)
        commit, mark = self._commit_of(sid, seq, t, item)
        if refs:  # the settled calls' usage, to their buckets by the outbox (store/buckets.py)
            paid = charges(refs, sid, t.events, now)
            if paid:
                extra = tuple(encode(charge_message(c)).decode() for c in paid)
                commit = dataclasses.replace(commit, outbox=commit.outbox + extra)
        return _Planned(commit, t, started, mark, before)

    def _commit_of(
        self, sid: str, seq: int, t: Transition, item: WorkItem
    ) -> tuple[Commit, Mark | None]:
        mark, min_bytes = self.cache.mark(sid), self.snapshot_min_bytes
        return commit_of(sid, seq, t, mark, min_bytes, item, self.kinds)

    async def _plan_rejection(self, item: WorkItem, reason: str, trace: str | None) -> _Planned:
        """Dead-letter an input no transition can take, and fail the turn waiting on it.

        The traceback is logged once, here; the session records `input.rejected`, and
        what that starts (the next queued turn, a parent told) follows as usual.
        """
        started = time.perf_counter()
        sid = item.session_id
        kind = item.input.get("kind", "?")
        if kind == "client":
            kind = f"client {item.input.get('input', {}).get('type', '?')}"
        log.error("input %s to %s dead-lettered: %s\n%s", kind, sid, reason, trace or "")
        error: ErrorInfo = {
            "message": f"the engine could not apply an input ({kind}): {reason}; "
            "it is kept in the dead-letter stream",
            "code": "internal",
        }
        state = await self.load(sid)
        seq = state.seq if state else 0
        try:
            t: Transition | None = step(
                state, sid, InputRejected(kind, error), self.now_ms(), new_id, self.kinds
            )
        except Exception:  # the session cannot even record it: the dead letter still does
            log.exception("session %s cannot record the rejected input", sid)
            t = None
        mark = None
        if t:
            commit, mark = self._commit_of(sid, seq, t, item)
        else:
            commit = with_item(Commit(sid, seq, seq, (), None), item)
        letter = {
            "session_id": sid,
            "entry_id": item.entry_id,
            "input": item.input,
            "reason": reason,
            "deliveries": item.deliveries,
            "at_ms": self.now_ms(),
        }
        commit = dataclasses.replace(
            commit,
            reply={"ok": False, "error": error["message"], "code": "internal", "status": 500},
            dead_letter=encode(letter),
        )
        return _Planned(commit, t, started, mark)

    def _count(self, events: list[dict[str, Any]]) -> None:
        if not events:
            return
        self.metrics.steps_committed(1)
        for event in events:
            kind = event["payload"]["type"]
            if kind == ev.TURN_STARTED:
                self.metrics.turn_started()
            elif kind == ev.TURN_COMPLETED:
                self.metrics.turn_completed()
            elif kind == ev.TURN_FAILED:
                self.metrics.turn_failed()


def _trace_spawns(t: Transition) -> None:
    """Name each child this step spawns its parent call's span: the child's turn then sits
    under that call in the parent's trace (tracing on)."""
    if t.state is None:
        return
    for i, effect in enumerate(t.effects):
        if isinstance(effect, Deliver) and isinstance(effect.input, ChildSpawned):
            span = call_context(t.state, effect.input.call_id, effect.input.attempt)
            if span is not None:
                spawned = dataclasses.replace(effect.input, traceparent=span.traceparent())
                t.effects[i] = dataclasses.replace(effect, input=spawned)
