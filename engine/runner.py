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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import redis.asyncio as aioredis

from .config import Project
from .durability import check_server
from .errors import SubsError
from .llm import LlmTarget, ProviderError, complete
from .machine import (
    CallLost,
    ChildSpawned,
    ClientSubmitted,
    DecisionFailed,
    Deliver,
    ExecuteFailed,
    Input,
    LlmCallSettled,
    MachineError,
    RunDecision,
    RunExecute,
    RunLlmCall,
    SessionState,
    StartTimer,
    build_llm_request,
    input_from_json,
    input_to_json,
    state_from_json,
    state_to_json,
    step,
)
from .machine.evolve import at_ms
from .metrics import Metrics
from .store import Commit, Store, StoreConflict, WorkItem
from .worker_effects import DecisionRun, ExecuteRun, WorkerTarget

log = logging.getLogger("subs.engine")


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
        durability = self.project.store
        self.store = await Store.open(
            self.redis,
            self._want_partitions,
            wait_replicas=durability.wait_replicas,
            wait_timeout_ms=durability.wait_timeout_ms,
        )
        await check_server(self.redis, durability.fsync)
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
        self.owned[p] = part
        await self.store.ensure_group(p)
        for item in await self.store.claim_pending(p, self.owner):
            part.queue.put_nowait(item)
        # Calls the previous owner had out are lost with it: send them again.
        for sid in await self.store.inflight_sessions(p):
            state = await self._load(sid)
            for lost in _lost_work(state):
                part.queue.put_nowait(WorkItem(None, sid, input_to_json(lost)))
        for entry_id, to, message in await self.store.outbox(p):
            await self._relay(p, entry_id, to, message)
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
        while True:
            try:
                items = await self.store.read_work(part.p, self.owner, block_ms=2000)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("reading work of partition %d failed", part.p)
                await asyncio.sleep(0.5)
                continue
            for item in items:
                part.queue.put_nowait(item)

    async def _timer_loop(self) -> None:
        while True:
            await asyncio.sleep(self.timer_poll_ms / 1000)
            owned = list(self.owned)
            if not owned:
                continue
            try:
                members = await self.store.due_timers_all(owned, self.now_ms())
            except Exception:
                log.exception("reading timers failed")
                continue
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
                await self._apply(part, item)
            except asyncio.CancelledError:
                raise
            except StoreConflict as err:
                self.cache.pop(item.session_id, None)
                if err.lease_lost:
                    log.warning("partition %d fenced off: %s", part.p, err)
                    return
                part.queue.put_nowait(item)  # another writer won: re-read and apply again
            except Exception:
                log.exception("applying an input to %s failed", item.session_id)
                self.cache.pop(item.session_id, None)
            finally:
                if item.timer_member:
                    part.timers_queued.discard(item.timer_member)

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

    async def _apply(self, part: _Partition, item: WorkItem) -> None:
        started = time.perf_counter()
        sid = item.session_id
        state = await self._load(sid)
        seq = state.seq if state else 0
        try:
            t = step(state, sid, self._machine_input(state, item.input), self.now_ms(), new_id)
        except MachineError as err:
            refusal = {"error": err.message, "code": err.code, "status": err.status, **err.detail}
        except Exception as err:
            # The core is pure, so this input fails the same way on every try and every owner:
            # refuse it (acked, answered) instead of leaving a poison item to be reclaimed.
            log.exception("input to %s cannot be applied; refused", sid)
            error = f"the engine could not apply this input ({type(err).__name__}: {err})"
            refusal = {"error": error, "code": "internal", "status": 500}
        else:
            refusal = None
        if refusal is not None:
            reply = {"ok": False, **refusal}
            commit = Commit(
                sid, seq, seq, [], None, item.entry_id, reply=reply, reply_to=item.reply_to
            )
            await self.store.commit(part.p, part.lease, self._with_timer(commit, item))
            return
        new_state = t.state
        timers = tuple(
            (e.due, json.dumps({"sid": sid, "input": input_to_json(e.input), "due": e.due}))
            for e in t.effects
            if isinstance(e, StartTimer)
        )
        commit = Commit(
            session_id=sid,
            expected_seq=seq,
            new_seq=new_state.seq if new_state else 0,
            events=t.events,
            snapshot=json.dumps(state_to_json(new_state), separators=(",", ":"))
            if t.events and new_state
            else None,
            ack_id=item.entry_id,
            inflight=_has_inflight(new_state) if t.events else None,
            timers=timers,
            outbox=tuple(
                json.dumps({"to": e.to, "input": input_to_json(e.input)})
                for e in t.effects
                if isinstance(e, Deliver)
            ),
            reply={"ok": True, **t.reply} if t.reply else {"ok": True, "ignored": t.ignored},
            reply_to=item.reply_to,
        )
        await self.store.commit(part.p, part.lease, self._with_timer(commit, item))
        if new_state is None:
            return
        self.cache[sid] = new_state
        if t.events and t.events[0]["payload"]["type"] == "session.created":
            await self.store.note_session(sid, at_ms(t.events[0]))
        for effect in t.effects:
            if isinstance(effect, RunLlmCall):
                self._start_llm_call(part, new_state, effect)
            elif isinstance(effect, RunDecision | RunExecute):
                self._start_worker_effect(part, new_state, effect)
        if any(isinstance(e, Deliver) for e in t.effects):
            for entry_id, to, message in await self.store.outbox(part.p):
                await self._relay(part.p, entry_id, to, message)
        self._count(t.events)
        self.stats.steps += 1
        if self.stats.record_steps:
            self.stats.step_seconds.append(time.perf_counter() - started)

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

    @staticmethod
    def _with_timer(commit: Commit, item: WorkItem) -> Commit:
        if item.timer_member is None:
            return commit
        return Commit(**{**commit.__dict__, "timers_done": (item.timer_member,)})

    # -- effects ---------------------------------------------------------------------

    def _start_llm_call(self, part: _Partition, state: SessionState, effect: RunLlmCall) -> None:
        plan = build_llm_request(state, state.calls[effect.call_id])
        sid = state.session_id
        task = asyncio.create_task(self._run_llm_call(part, sid, effect, plan))
        part.calls.add(task)
        task.add_done_callback(part.calls.discard)

    def _track(self, part: _Partition, coro: Any) -> None:
        task = asyncio.create_task(coro)
        part.calls.add(task)
        task.add_done_callback(part.calls.discard)

    def _start_worker_effect(
        self, part: _Partition, state: SessionState, effect: RunDecision | RunExecute
    ) -> None:
        sid = state.session_id
        target = self.workers.get(state.agent_id)
        if target is None:
            error = {
                "message": f"agent {state.agent_id!r} has no worker to send this to",
                "code": "unroutable",
            }
            failed = (
                DecisionFailed(effect.decision_id, effect.attempt, error, retryable=False)
                if isinstance(effect, RunDecision)
                else ExecuteFailed(effect.call_id, effect.attempt, error, retryable=False)
            )
            part.queue.put_nowait(WorkItem(None, sid, input_to_json(failed)))
            return
        now = self.now_ms()

        # Build the request now, from the state this transition committed.
        if isinstance(effect, RunDecision):
            decision = DecisionRun(state, target, now)

            async def run_decision() -> None:
                started = time.perf_counter()
                result = await decision.run(self.http)
                self.metrics.observe_worker_call(time.perf_counter() - started)
                part.queue.put_nowait(WorkItem(None, sid, input_to_json(result)))

            self._track(part, run_decision())
        else:
            execute = ExecuteRun(state, effect.call_id, target, now)

            async def run_execute() -> None:
                deltas = DeltaWriter(self.store, sid)
                started = time.perf_counter()
                result = await execute.run(self.http, deltas.add)
                self.metrics.observe_worker_call(time.perf_counter() - started)
                await deltas.close()
                part.queue.put_nowait(WorkItem(None, sid, input_to_json(result)))

            self._track(part, run_execute())

    async def _relay(self, p: int, entry_id: str, to: str, item_json: str) -> None:
        """Hand a committed delivery to its target session, then forget it.

        A crash between the two relays it again; every delivered input is idempotent
        at the receiver (message ids, turn ids derived from the parent's call)."""
        item = json.loads(item_json)
        await self.store.enqueue(to, item["input"], None)
        await self.store.outbox_done(p, entry_id)

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

    async def _run_llm_call(self, part: _Partition, sid: str, effect: RunLlmCall, plan) -> None:
        delta_seq = 0

        deltas = DeltaWriter(self.store, sid)

        async def on_delta(delta: dict[str, Any]) -> None:
            nonlocal delta_seq
            delta_seq += 1
            deltas.add(
                {"call_id": effect.call_id, "attempt": effect.attempt, "seq": delta_seq, **delta}
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
        except Exception as err:  # our own bug: record it rather than hang the turn
            log.exception("model call %s failed", effect.call_id)
            info = {"message": f"internal error: {type(err).__name__}", "code": "internal"}
            settled = LlmCallSettled(effect.call_id, effect.attempt, error=info, retryable=True)
        self.metrics.observe_model_call(time.perf_counter() - started)
        await deltas.close()  # every delta is out before the event that ends the call
        part.queue.put_nowait(WorkItem(None, sid, input_to_json(settled)))


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
