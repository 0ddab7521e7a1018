"""The engine process: owns partitions, applies inputs through the machine, runs effects.

Per partition, one processor task applies inputs in order (client inputs read
from the partition's work stream, effect completions handed over in
process), commits each transition with one Lua call, and only then starts
the transition's effects. A completion that outlives its lease is fenced off
at commit; a call whose engine died is re-sent by the next owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import os
import secrets
import time
import traceback
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import redis.asyncio as aioredis

from .config import Project
from .errors import SubsError
from .llm import LlmTarget, ProviderError, complete
from .machine import (
    CallLost,
    CancelTimer,
    ChildSpawned,
    ClientSubmitted,
    DecisionFailed,
    Deliver,
    ExecuteFailed,
    Input,
    InputRejected,
    LlmCallPlan,
    LlmCallSettled,
    MachineError,
    RunDecision,
    RunExecute,
    RunLlmCall,
    SessionState,
    StartTimer,
    Transition,
    build_llm_request,
    input_from_json,
    input_to_json,
    state_from_json,
    state_to_json,
    step,
)
from .machine.evolve import at_ms
from .metrics import Metrics
from .store import STORE_FAULTS, Commit, Store, StoreConflict, WorkItem, compact_json
from .worker_effects import DecisionRun, ExecuteRun, WorkerTarget

log = logging.getLogger("subs.engine")

# An input whose transition fails this often (reloaded from Redis each time) is a bug,
# not bad luck: it goes to the dead-letter stream. One the work stream has handed out
# this often took its engine down each time (or never got an answer): the same.
POISON_FAILURES = 3
POISON_DELIVERIES = 10


def new_id(prefix: str) -> str:
    """Time-ordered, unique: 48 bits of milliseconds, 64 random bits."""
    return f"{prefix}_{int(time.time() * 1000):012x}{secrets.token_hex(8)}"


class EngineConfigError(SubsError):
    """The project cannot run as configured (found at start, before any work)."""


@dataclass
class _Partition:
    p: int
    lease: str
    queue: asyncio.Queue[WorkItem] = field(default_factory=asyncio.Queue)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    calls: set[asyncio.Task[None]] = field(default_factory=set)
    timers_queued: set[str] = field(default_factory=set)
    outbox_dirty: bool = False  # committed deliveries may wait in the outbox
    relaying: bool = False


@dataclass
class EngineStats:
    """Counters a benchmark or /metrics reads."""

    steps: int = 0
    step_seconds: list[float] = field(default_factory=list)
    record_steps: bool = False


class Engine:
    """One engine process's share of the work on one Redis."""

    def __init__(
        self,
        project: Project,
        redis: aioredis.Redis,
        *,
        env: Mapping[str, str] | None = None,
        owner: str | None = None,
        lease_ms: int = 10_000,
        timer_poll_ms: int = 50,
        partitions: int | None = None,
        clock: Callable[[], float] = time.time,
        metrics: Metrics | None = None,
    ) -> None:
        self.project = project
        self.redis = redis
        self.env = os.environ if env is None else env
        self.owner = owner or new_id("engine")
        self.lease_ms = lease_ms
        self.timer_poll_ms = timer_poll_ms
        self.clock = clock
        self.stats = EngineStats()
        self.metrics = metrics or Metrics()
        self._want_partitions = partitions
        self.store: Store
        self.owned: dict[int, _Partition] = {}
        self.cache: dict[str, SessionState] = {}
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=None))
        self._background: list[asyncio.Task[None]] = []
        self._last_trouble_log = -math.inf
        self._ownership_changed = asyncio.Event()
        self.workers = self._worker_targets()
        # Built once: the machine only reads these (events carry them by reference).
        self.agent_configs = {a.id: a.wire_config(project) for a in project.agents.values()}
        self.llm_routes = {b.id: {"type": b.type, "format": b.format} for b in project.llm.values()}

    def _worker_targets(self) -> dict[str, WorkerTarget]:
        """Each worker agent's URL and signing secret; a named but empty secret is an error."""
        targets = {}
        for agent in self.project.agents.values():
            if agent.worker is None:
                continue
            secret = None
            if agent.signing_secret_env:
                secret = self.env.get(agent.signing_secret_env) or None
                if secret is None:
                    raise EngineConfigError(
                        f"agent.{agent.id}.signing_secret_env names {agent.signing_secret_env}, "
                        "which is not set (or empty) in the environment"
                    )
            targets[agent.id] = WorkerTarget(agent.worker, secret)
        return targets

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        self.store = await Store.open(self.redis, self._want_partitions)
        await self._balance()
        self._background = [
            asyncio.create_task(self._lease_loop(), name="subs-leases"),
            asyncio.create_task(self._timer_loop(), name="subs-timers"),
        ]

    async def stop(self) -> None:
        """Stop taking work, hand back in-flight calls, release leases."""
        for task in self._background:
            task.cancel()
        for task in self._background:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for p in list(self.owned):
            await self._drop(p, release=True)
        with contextlib.suppress(Exception):
            await self.store.leave(self.owner)
        await self.http.aclose()

    def now_ms(self) -> int:
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
            except Exception:
                log.exception("lease round failed")

    async def _balance(self) -> None:
        now = self.now_ms()
        live = await self.store.heartbeat(self.owner, now + self.lease_ms, now)
        share = math.ceil(self.store.partitions / max(live, 1))
        for p, part in list(self.owned.items()):
            if not await self.store.renew(p, part.lease, self.lease_ms):
                log.warning("lost the lease on partition %d", p)
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

    async def _take(self, p: int, lease: str) -> None:
        part = _Partition(p, lease)
        try:
            await self.store.ensure_group(p)
            pending = await self.store.claim_pending(p, self.owner)
            # Calls the previous owner had out are lost with it: send them again.
            lost = []
            for sid in await self.store.inflight_sessions(p):
                state = await self._load(sid)
                lost += [WorkItem(None, sid, input_to_json(x)) for x in _lost_work(state)]
        except Exception:
            # Half taken is not taken: let the lease go so this or another engine retries.
            with contextlib.suppress(Exception):
                await self.store.release(p, lease)
            raise
        self.owned[p] = part
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
        tasks = [*part.tasks, *part.calls]
        for task in tasks:
            task.cancel()
        if tasks:
            # Bounded: a task stuck in a library must not hold up shutdown.
            await asyncio.wait(tasks, timeout=5)
        for sid in [s for s in self.cache if self.store.partition_of(s) == p]:
            del self.cache[sid]
        if release:
            with contextlib.suppress(Exception):
                await self.store.release(p, part.lease)
        self._ownership_changed.set()

    # -- inputs ----------------------------------------------------------------------

    async def _read_work(self, part: _Partition) -> None:
        backoff = Backoff()
        while True:
            try:
                items = await self.store.read_work(part.p, self.owner, block_ms=2000)
            except asyncio.CancelledError:
                raise
            except Exception as err:
                self._store_trouble(f"reading work of partition {part.p}", err)
                await backoff.wait()
                continue
            backoff.reset()
            for item in items:
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
                self._store_trouble("reading timers", err)
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
        while True:
            item = await part.queue.get()
            try:
                await self._settle(part, item)
            except StoreConflict as err:  # fenced off: the partition is someone else's now
                log.warning("partition %d fenced off: %s", part.p, err)
                return
            finally:
                if item.timer_member:
                    part.timers_queued.discard(item.timer_member)

    async def _settle(self, part: _Partition, item: WorkItem) -> None:
        """Apply one input and commit it, however long Redis is away.

        A Redis fault is waited out with backoff, the same input kept in hand (so
        per-session order holds and nothing handed over in process is lost). A
        commit whose answer was lost with the connection is recognised by the
        snapshot's seq, so its effects start once. Any other failure is a bug:
        tried again from a fresh read, then dead-lettered (`_reject`).
        """
        sid = item.session_id
        planned: _Planned | None = None
        faulted = False
        failures = 0
        backoff = Backoff()
        rejection: tuple[str, str | None] | None = None  # (reason, traceback): dead-letter it
        if item.deliveries > POISON_DELIVERIES:
            rejection = (f"delivered {item.deliveries} times without an answer", None)
        while True:
            try:
                if planned is None:
                    planned = await (
                        self._plan_rejection(item, *rejection) if rejection else self._plan(item)
                    )
                try:
                    await self.store.commit(part.p, part.lease, planned.commit)
                except StoreConflict as err:
                    if err.lease_lost or not (faulted and await self._landed(planned)):
                        raise
                self._after_commit(part, planned)
                return
            except StoreConflict as err:
                self.cache.pop(sid, None)
                if err.lease_lost:
                    raise
                planned, faulted = None, False  # another writer won: re-read and apply again
            except STORE_FAULTS as err:
                self.cache.pop(sid, None)
                faulted = planned is not None
                self._store_trouble(f"committing an input to {sid}", err)
                await backoff.wait()
            except asyncio.CancelledError:
                raise
            except Exception as err:
                self.cache.pop(sid, None)
                planned, faulted = None, False
                failures += 1
                if failures >= POISON_FAILURES:
                    rejection = (_describe(err), traceback.format_exc())
                else:
                    log.warning("applying an input to %s failed (%s); trying again", sid, err)

    async def _landed(self, planned: _Planned) -> bool:
        c = planned.commit
        return bool(c.events) and await self.store.committed_seq(c.session_id) == c.new_seq

    def _store_trouble(self, what: str, err: Exception) -> None:
        """One log line per fault streak and per 10 s, not one per retry."""
        now = time.monotonic()
        if now - self._last_trouble_log >= 10:
            self._last_trouble_log = now
            log.warning("%s failed, retrying: %s", what, _describe(err))

    async def _load(self, sid: str) -> SessionState | None:
        state = self.cache.get(sid)
        if state is None:
            _, snap = await self.store.load_snapshot(sid)
            if snap is not None:
                state = state_from_json(snap)
                self.cache[sid] = state
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
                "unknown_agent",
                f"no agent {agent_id!r} in {self.project.path}; "
                f"declared: {', '.join(sorted(self.project.agents)) or 'none'}",
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
        )

    async def _plan(self, item: WorkItem) -> _Planned:
        """Load the session and run the machine: the commit to write and what follows it."""
        started = time.perf_counter()
        sid = item.session_id
        state = await self._load(sid)
        seq = state.seq if state else 0
        try:
            t = step(state, sid, self._machine_input(state, item.input), self.now_ms(), new_id)
        except MachineError as err:
            reply = {"ok": False, "error": err.message, "code": err.code, "status": err.status}
            commit = Commit(sid, seq, seq, [], None, reply={**reply, **err.detail})
            return _Planned(self._finish(commit, item), None, started)
        return _Planned(self._finish(_commit_of(sid, seq, t), item), t, started)

    @staticmethod
    def _finish(commit: Commit, item: WorkItem) -> Commit:
        """The parts of a commit that come from the work item: its ack, reply list and timer."""
        done = commit.timers_done + ((item.timer_member,) if item.timer_member else ())
        return dataclasses.replace(
            commit, ack_id=item.entry_id, reply_to=item.reply_to, timers_done=done
        )

    def _after_commit(self, part: _Partition, planned: _Planned) -> None:
        """The transition is durable: remember the state and start its effects (no I/O here)."""
        t = planned.transition
        if t is None or t.state is None:
            return
        new_state = t.state
        self.cache[new_state.session_id] = new_state
        for effect in t.effects:
            if isinstance(effect, RunLlmCall):
                self._start_llm_call(part, new_state, effect)
            elif isinstance(effect, RunDecision | RunExecute):
                self._start_worker_effect(part, new_state, effect)
            elif isinstance(effect, Deliver):
                part.outbox_dirty = True
        if part.outbox_dirty:
            self._track(part, self._relay_outbox(part))
        self._count(t.events)
        self.stats.steps += 1
        if self.stats.record_steps:
            self.stats.step_seconds.append(time.perf_counter() - planned.started)

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
        error = {
            "message": f"the engine could not apply an input ({kind}): {reason}; "
            "it is kept in the dead-letter stream",
            "code": "internal",
        }
        state = await self._load(sid)
        seq = state.seq if state else 0
        try:
            t: Transition | None = step(
                state, sid, InputRejected(kind, error), self.now_ms(), new_id
            )
        except Exception:  # the session cannot even record it: the dead letter still does
            log.exception("session %s cannot record the rejected input", sid)
            t = None
        commit = _commit_of(sid, seq, t) if t else Commit(sid, seq, seq, [], None)
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
            dead_letter=compact_json(letter),
        )
        return _Planned(self._finish(commit, item), t, started)

    def _count(self, events: list[dict[str, Any]]) -> None:
        if not events:
            return
        self.metrics.steps_committed(1)
        for event in events:
            kind = event["payload"]["type"]
            if kind == "turn.started":
                self.metrics.turn_started()
            elif kind == "turn.completed":
                self.metrics.turn_completed()
            elif kind == "turn.failed":
                self.metrics.turn_failed()

    # -- effects ---------------------------------------------------------------------

    def _track(self, part: _Partition, coro: Any) -> None:
        task = asyncio.create_task(coro)
        part.calls.add(task)
        task.add_done_callback(part.calls.discard)

    def _effect(
        self,
        part: _Partition,
        sid: str,
        what: str,
        prepare: Callable[[], Callable[[], Awaitable[Input]]],
        failed: Callable[[dict[str, Any], bool], Input],
    ) -> None:
        """Run one effect so that it always reports back: whatever it raises is a failed
        attempt with a reason, never a task that dies with nothing recorded.

        `prepare` builds the request from the committed state, before any await (so a
        later transition cannot change what is sent); a failure there is deterministic,
        so it is not retried.
        """
        try:
            run = prepare()
        except Exception as err:
            if not isinstance(err, SubsError):
                log.exception("preparing the %s of %s failed", what, sid)
            error = {
                "message": f"the {what} could not be prepared: {_describe(err)}",
                "code": "internal",
            }
            part.queue.put_nowait(WorkItem(None, sid, input_to_json(failed(error, False))))
            return

        async def guarded() -> None:
            try:
                result = await run()
            except asyncio.CancelledError:
                raise
            except Exception as err:
                log.exception("the %s of %s failed inside the engine", what, sid)
                error = {
                    "message": f"the {what} failed inside the engine: {_describe(err)}",
                    "code": "internal",
                }
                result = failed(error, True)
            part.queue.put_nowait(WorkItem(None, sid, input_to_json(result)))

        self._track(part, guarded())

    def _start_llm_call(self, part: _Partition, state: SessionState, effect: RunLlmCall) -> None:
        sid, call_id, attempt = state.session_id, effect.call_id, effect.attempt

        def prepare() -> Callable[[], Awaitable[Input]]:
            plan = build_llm_request(state, state.calls[call_id])
            return lambda: self._run_llm_call(sid, effect, plan)

        def failed(error: dict[str, Any], retryable: bool) -> Input:
            return LlmCallSettled(call_id, attempt, error=error, retryable=retryable)

        self._effect(part, sid, f"model call {call_id}", prepare, failed)

    def _start_worker_effect(
        self, part: _Partition, state: SessionState, effect: RunDecision | RunExecute
    ) -> None:
        sid = state.session_id
        target = self.workers.get(state.agent_id)

        def failed(error: dict[str, Any], retryable: bool) -> Input:
            if isinstance(effect, RunDecision):
                return DecisionFailed(effect.decision_id, effect.attempt, error, retryable)
            return ExecuteFailed(effect.call_id, effect.attempt, error, retryable)

        if target is None:
            error = {
                "message": f"agent {state.agent_id!r} has no worker to send this to",
                "code": "unroutable",
            }
            part.queue.put_nowait(WorkItem(None, sid, input_to_json(failed(error, False))))
            return
        now = self.now_ms()

        def prepare() -> Callable[[], Awaitable[Input]]:
            if isinstance(effect, RunDecision):
                decision = DecisionRun(state, target, now)

                async def run_decision() -> Input:
                    started = time.perf_counter()
                    result = await decision.run(self.http)
                    self.metrics.observe_worker_call(time.perf_counter() - started)
                    return result

                return run_decision
            execute = ExecuteRun(state, effect.call_id, target, now)

            async def run_execute() -> Input:
                deltas = DeltaWriter(self.store, sid)
                started = time.perf_counter()
                try:
                    return await execute.run(self.http, deltas.add)
                finally:
                    self.metrics.observe_worker_call(time.perf_counter() - started)
                    await deltas.close()  # every delta is out before the event that ends it

            return run_execute

        what = "decision" if isinstance(effect, RunDecision) else f"call {effect.call_id}"
        self._effect(part, sid, f"worker {what}", prepare, failed)

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
                    await self.store.enqueue(to, json.loads(message)["input"], None)
                    await self.store.outbox_done(part.p, entry_id)
        except STORE_FAULTS as err:
            part.outbox_dirty = True  # the work reader's next round tries again
            self._store_trouble(f"relaying the outbox of partition {part.p}", err)
        finally:
            part.relaying = False

    def _target(self, block_id: str | None) -> LlmTarget:
        block = self.project.llm.get(block_id or "")
        declared = ", ".join(sorted(self.project.llm)) or "none"
        if block is None:
            raise ProviderError(
                f"the agent names no [llm.{block_id}] block; declared: {declared}"
                if block_id
                else f"the agent names no llm block; declared: {declared}",
                code="unroutable",
                retryable=False,
                param="agent.llm",
            )
        if block.type == "worker":
            raise ProviderError(
                f"[llm.{block.id}] runs on a worker, which this engine does not support yet",
                code="unroutable",
                retryable=False,
            )
        assert block.base_url is not None and block.api_key_env is not None
        return LlmTarget(
            type=block.type,
            base_url=block.base_url,
            api_key=self.env.get(block.api_key_env) or None,
            api_key_env=block.api_key_env,
        )

    async def _run_llm_call(self, sid: str, effect: RunLlmCall, plan: LlmCallPlan) -> Input:
        delta_seq = 0
        deltas = DeltaWriter(self.store, sid)

        async def on_delta(delta: dict[str, Any]) -> None:
            nonlocal delta_seq
            delta_seq += 1
            deltas.add(
                {**delta, "call_id": effect.call_id, "attempt": effect.attempt, "seq": delta_seq}
            )

        settled: LlmCallSettled
        started = time.perf_counter()
        try:
            target = self._target(plan.llm)
            timeout = None if effect.deadline is None else (effect.deadline - self.now_ms()) / 1000
            async with asyncio.timeout(timeout):
                response = await complete(
                    self.http, target, plan.request, stream=plan.stream, on_delta=on_delta
                )
            settled = LlmCallSettled(effect.call_id, effect.attempt, response=response)
        except ProviderError as err:
            info = {"message": err.message, "code": err.code}
            if err.param:
                info["param"] = err.param
            settled = LlmCallSettled(
                effect.call_id,
                effect.attempt,
                error=info,
                retryable=err.retryable,
                retry_after=err.retry_after,
            )
        except TimeoutError:
            info = {
                "message": "the model call ran past its run timeout",
                "code": "deadline_exceeded",
            }
            settled = LlmCallSettled(effect.call_id, effect.attempt, error=info, retryable=True)
        finally:
            self.metrics.observe_model_call(time.perf_counter() - started)
            await deltas.close()  # every delta is out before the event that ends the call
        return settled


class DeltaWriter:
    """Writes one call's token deltas in order, batching what piles up during a round trip."""

    def __init__(self, store: Store, session_id: str) -> None:
        self.store = store
        self.session_id = session_id
        self.buffer: list[dict[str, Any]] = []
        self.task: asyncio.Task[None] | None = None

    def add(self, delta: dict[str, Any]) -> None:
        self.buffer.append(delta)
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self._flush())

    async def _flush(self) -> None:
        while self.buffer:
            batch, self.buffer = self.buffer, []
            try:
                await self.store.add_deltas(self.session_id, batch)
            except Exception:  # deltas are best effort; the reply itself is in the log
                log.exception("writing token deltas of %s failed", self.session_id)

    async def close(self) -> None:
        if self.task is not None:
            await self.task


def _lost_work(state: SessionState | None) -> list[CallLost]:
    """What a dead engine had out for this session: to be sent again."""
    if state is None:
        return []
    lost = [
        CallLost(c.id, c.attempt)
        for c in state.calls.values()
        if c.handler in ("server", "worker") and c.status == "running"
    ]
    if state.decision is not None and state.decision.status == "running":
        lost.append(CallLost(state.decision.id, state.decision.attempt))
    return lost


def _has_inflight(state: SessionState | None) -> bool:
    """Whether a crash would leave one of this session's requests unanswered."""
    return bool(_lost_work(state))


@dataclass(frozen=True)
class _Planned:
    """One input's transition, ready to commit: what to write, and what follows it."""

    commit: Commit
    transition: Transition | None  # None: refused, nothing follows
    started: float  # perf_counter at the start of the step


class Backoff:
    """Waits that grow from 50 ms to 2 s while a fault lasts; reset by a success."""

    def __init__(self, first: float = 0.05, most: float = 2.0) -> None:
        self.first, self.most, self.next = first, most, first

    async def wait(self) -> None:
        await asyncio.sleep(self.next)
        self.next = min(self.next * 2, self.most)

    def reset(self) -> None:
        self.next = self.first


def _commit_of(sid: str, seq: int, t: Transition) -> Commit:
    """What a transition writes: its events, the new snapshot, its timers and deliveries."""
    new_state = t.state
    created = t.events[0] if t.events else None
    return Commit(
        session_id=sid,
        expected_seq=seq,
        new_seq=new_state.seq if new_state else 0,
        events=t.events,
        snapshot=json.dumps(state_to_json(new_state), separators=(",", ":"))
        if t.events and new_state
        else None,
        inflight=_has_inflight(new_state) if t.events else None,
        timers=tuple(
            (e.due, _timer_member(sid, e.due, e.input))
            for e in t.effects
            if isinstance(e, StartTimer)
        ),
        timers_done=tuple(
            _timer_member(sid, e.due, e.input) for e in t.effects if isinstance(e, CancelTimer)
        ),
        outbox=tuple(
            json.dumps({"to": e.to, "input": input_to_json(e.input)})
            for e in t.effects
            if isinstance(e, Deliver)
        ),
        reply={"ok": True, **t.reply} if t.reply else {"ok": True, "ignored": t.ignored},
        created_ms=at_ms(created)
        if created and created["payload"]["type"] == "session.created"
        else None,
    )


def _timer_member(sid: str, due: int, inp: Input) -> str:
    """A timer's entry in the partition's set; the same timer always gives the same bytes."""
    return json.dumps({"sid": sid, "input": input_to_json(inp), "due": due})


def _describe(err: BaseException) -> str:
    text = err.message if isinstance(err, SubsError) else str(err)
    return f"{type(err).__name__}: {text}" if text else type(err).__name__
