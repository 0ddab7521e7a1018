"""Apply-and-commit: one input through the machine into one atomic Redis commit.

The session's state is loaded (cached while this engine owns its partition), the
pure machine turns the input into events, effects and timers, and one Lua call
commits them with the work item's ack, fenced by the partition's lease. Only a
committed transition's effects may start: the caller starts them.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.config import Project
from engine.effects.llm.prices import with_prices
from engine.errors import ErrorInfo, describe
from engine.ids import new_id
from engine.jsonedge import encode
from engine.machine import (
    Call,
    CallLost,
    CancelTimer,
    ChildSpawned,
    ClientSubmitted,
    Deliver,
    Input,
    InputRejected,
    Kinds,
    MachineError,
    SessionState,
    StartTimer,
    Transition,
    input_from_json,
    input_to_json,
    state_to_json,
    step,
)
from engine.machine import events as ev
from engine.machine.deadlines import wake_ms
from engine.machine.evolve import at_ms
from engine.machine.policies import Bucket, BucketRef, buckets_for, charges, context_of
from engine.metrics import Metrics
from engine.retrying import Backoff, Trouble
from engine.runtime.cache import StateCache
from engine.store.buckets import charge_message
from engine.store.index import IndexWrite, scopes_of
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
ROOTS_KEPT = 10_000  # root sessions' identities kept for their subagents' budget buckets


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
        self.project = project
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
        # Built once: the machine only reads these (events carry them by reference).
        # An agent's budget carries its model's price (the machine estimates a call with it).
        self.agent_configs = {
            a.id: with_prices(project, a.wire_config(project), a) for a in project.agents.values()
        }
        self.llm_routes = {b.id: {"type": b.type, "format": b.format} for b in project.llm.values()}
        self.policies = project.budgets
        self._roots: dict[str, dict[str, Any]] = {}  # root session -> identity (subagents')

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

    async def bucket_refs(
        self, sid: str, state: SessionState | None, inp: Input
    ) -> list[BucketRef]:
        """The budget-policy buckets a session counts toward (policies.py): from its agent
        and identity, or, for a session this input creates, the input's; `user` is whoever
        submitted the turn the step works on (in a shared Slack thread each person spends
        their own bucket, not the thread starter's). A subagent's
        session counts toward its root session's person and channel (its own agent and
        id): a user's subagents spend that user's budget. Worked out each step (a few
        comparisons); only a root's identity is kept, as it never changes."""
        if not self.policies:
            return []
        if state is not None:
            agent_id, identity, ancestry = state.agent_id, state.identity, state.ancestry
        elif isinstance(inp, ClientSubmitted):
            agent_id, identity, ancestry = inp.agent_id, inp.identity, list(inp.ancestry or ())
        elif isinstance(inp, ChildSpawned):
            agent_id, identity, ancestry = inp.agent_id, {}, inp.ancestry
        else:
            return []
        if ancestry:
            identity = await self._root_identity(ancestry[0])
        else:
            identity = _as_submitted(identity, state, inp)
        return buckets_for(self.policies, context_of(sid, agent_id, identity))

    async def _root_identity(self, root: str) -> dict[str, Any]:
        """A root session's identity (read once, from its snapshot: it never changes)."""
        known = self._roots.get(root)
        if known is None:
            known = (await self.store.identities([root]))[root]
            if len(self._roots) >= ROOTS_KEPT:
                self._roots.pop(next(iter(self._roots)))
            self._roots[root] = known
        return known

    async def buckets(self, refs: list[BucketRef], now: int) -> tuple[Bucket, ...]:
        """The buckets' usage as the machine is to check a model call against it."""
        if not refs:
            return ()
        uses = await self.store.read_buckets(refs, now)
        return tuple(
            Bucket(u.policy, u.group, u.dimension, u.limit, u.used, u.frees_at, ref.policy.strategy)
            for ref, u in zip(refs, uses, strict=True)
        )

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

    def _decider(self, agent_id: str) -> str:
        """Who decides for an agent: its worker when it names one, else the engine."""
        decl = self.project.agents.get(agent_id)
        return "worker" if decl and decl.worker else "engine"

    def _machine_input(self, state: SessionState | None, body: dict[str, Any]) -> Input:
        if body.get("kind") != "client":
            inp = input_from_json(body)
            if isinstance(inp, ChildSpawned):
                # A child starts with its agent's file config, like a client's first input.
                return dataclasses.replace(
                    inp,
                    agent_config=self.agent_configs.get(inp.agent_id),
                    decider=self._decider(inp.agent_id),
                    llm_routes=self.llm_routes,
                )
            return inp
        inp = body["input"]
        agent_id = inp.get("agent_id") or (state.agent_id if state else "")
        decl = self.project.agents.get(agent_id)
        if decl is None and state is None:
            raise MachineError(
                f"no agent {agent_id!r} in {self.project.path}; "
                f"declared: {', '.join(sorted(self.project.agents)) or 'none'}",
                code="unknown_agent",
                status=404,
            )
        config = self.agent_configs.get(agent_id)
        decider = self._decider(agent_id)
        identity = body.get("identity") or {}
        commands = tuple(decl.slack.commands) if decl and decl.slack else ()
        return ClientSubmitted(
            inp,
            agent_id,
            identity,
            config,
            decider,
            self.llm_routes,
            owner=body.get("owner"),
            slash_commands=commands,
            traceparent=body.get("traceparent"),
            tracestate=body.get("tracestate"),
        )

    async def _plan(self, item: WorkItem) -> _Planned:
        """Load the session and run the machine: the commit to write and what follows it."""
        started = time.perf_counter()
        sid = item.session_id
        state = await self.load(sid)
        seq = state.seq if state else 0
        before = None if self.tracing is None else Before.of(state, sid, self.tracing.capture)
        now = self.now_ms()
        try:
            inp = self._machine_input(state, item.input)
            refs = await self.bucket_refs(sid, state, inp)
            buckets = await self.buckets(refs, now) if refs else ()
            t = step(state, sid, inp, now, new_id, self.kinds, buckets=buckets)
        except MachineError as err:
            reply = {"ok": False, "status": err.status, **err.body()}
            commit = Commit(sid, seq, seq, (), None, reply=reply)
            return _Planned(self._finish(commit, item), None, started)
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
        return _commit_of(sid, seq, t, mark, min_bytes, item, self.kinds)

    @staticmethod
    def _finish(commit: Commit, item: WorkItem) -> Commit:
        """The parts of a commit that come from the work item: its ack, reply list and timer."""
        done = commit.timers_done + ((item.timer_member,) if item.timer_member else ())
        return dataclasses.replace(
            commit, ack_id=item.entry_id, reply_to=item.reply_to, timers_done=done
        )

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
            commit = self._finish(Commit(sid, seq, seq, (), None), item)
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


def lost_work(state: SessionState | None, kinds: Kinds) -> list[CallLost]:
    """What a dead engine had out for this session: to be sent again."""
    if state is None:
        return []
    lost = [
        CallLost(c.id, c.attempt)
        for c in state.calls.values()
        if c.status == "running" and _in_flight(c, kinds)
    ]
    if state.decision is not None and state.decision.status == "running":
        lost.append(CallLost(state.decision.id, state.decision.attempt))
    return lost


def has_inflight(state: SessionState | None, kinds: Kinds) -> bool:
    """Whether a crash would leave one of this session's requests unanswered (every step
    asks: `lost_work`'s answer, without building it)."""
    if state is None:
        return False
    if state.decision is not None and state.decision.status == "running":
        return True
    return any(c.status == "running" and _in_flight(c, kinds) for c in state.calls.values())


def _in_flight(call: Call, kinds: Kinds) -> bool:
    """Whether the call's attempt is a request of this engine's (its kind says, kinds.py)."""
    kind = kinds.of(call.kind, call.handler)
    return kind is not None and kind.in_flight


def _commit_of(
    sid: str,
    seq: int,
    t: Transition,
    mark: Mark | None,
    min_bytes: int,
    item: WorkItem,
    kinds: Kinds,
) -> tuple[Commit, Mark | None]:
    """What a transition writes: its events, the snapshot when it is due, its timers and
    deliveries, and what comes from the work item (see `_finish`); and the snapshot's
    mark once it is written."""
    new_state = t.state
    created = t.events[0] if t.events else None
    events = tuple(map(encode, t.events))
    snapshot = None
    if events and new_state:
        mark = mark.after(sum(map(len, events)), min_bytes) if mark else None
        if mark is None:
            snapshot = encode(state_to_json(new_state))
            mark = Mark(len(snapshot), 0)
    commit = Commit(
        session_id=sid,
        expected_seq=seq,
        new_seq=new_state.seq if new_state else 0,
        events=events,
        snapshot=snapshot,
        inflight=has_inflight(new_state, kinds) if t.events else None,
        timers=tuple(
            (e.due, _timer_member(sid, e.due, e.input))
            for e in t.effects
            if isinstance(e, StartTimer)
        ),
        timers_done=tuple(
            _timer_member(sid, e.due, e.input) for e in t.effects if isinstance(e, CancelTimer)
        )
        + ((item.timer_member,) if item.timer_member else ()),
        ack_id=item.entry_id,
        reply_to=item.reply_to,
        outbox=tuple(
            json.dumps({"to": e.to, "input": input_to_json(e.input)})
            for e in t.effects
            if isinstance(e, Deliver)
        ),
        reply={"ok": True, **t.reply} if t.reply else {"ok": True, "ignored": t.ignored},
        created_ms=at_ms(created)
        if created and created["payload"]["type"] == ev.SESSION_CREATED
        else None,
        index=_index_of(new_state, t, kinds),
    )
    return commit, mark


def _index_of(state: SessionState | None, t: Transition, kinds: Kinds) -> IndexWrite | None:
    """The session's entry in the listing indexes after a step that wrote events."""
    if state is None or not t.events:
        return None
    return IndexWrite(
        created_ms=state.created_at,
        last_ms=at_ms(t.events[-1]),
        wake_ms=wake_ms(state, kinds),
        scopes=scopes_of(state.agent_id, not state.ancestry),
    )


def _timer_member(sid: str, due: int, inp: Input) -> str:
    """A timer's entry in the partition's set; the same timer always gives the same bytes."""
    return json.dumps({"sid": sid, "input": input_to_json(inp), "due": due})


def _as_submitted(
    identity: dict[str, Any], state: SessionState | None, inp: Input
) -> dict[str, Any]:
    """`identity` with the subject of the turn a step works on: the running turn's
    submitter, or, when the step's input starts the turn, the input's own subject."""
    subject: Any = None
    if state is not None and state.turn is not None and state.turn.by:
        subject = state.turn.by.get("subject")
    elif isinstance(inp, ClientSubmitted):
        subject = (inp.identity or {}).get("subject")
    if not isinstance(subject, dict) or not subject.get("id"):
        return identity
    return {**identity, "subject": subject}
