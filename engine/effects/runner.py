"""Effects: what a committed transition asks for, run so that each one always reports back.

A model call runs against its vendor, a decision or a call's execute goes to the
agent's worker. Whatever happens — an answer, garbage, an exception of any class —
comes back to the engine as exactly one input (`done`), the effect's result or a
recorded failed attempt. An effect the engine loses on the way (a crash, a lease
moved) is ended by its deadline timer instead, which the commit that started it set.

Which code runs an effect is looked up by its type in the runner's table (`runners`),
built by whoever composes the engine (engine/runtime/engine.py): the built-in runners
here (`builtin_runners`), each call kind's from its own module (MCP's in
`engine/effects/mcp/runners.py`), and any a caller adds.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from engine.config import Project, project_secrets
from engine.effects.http_pool import new_session
from engine.effects.llm import LlmTarget, ProviderError, complete, prices
from engine.effects.llm.files import resolve_files
from engine.effects.llm.prompts import EncodedMessages
from engine.effects.worker import CheckedMessages, DecisionRun, ExecuteRun, WorkerTarget
from engine.errors import ErrorInfo, SubsError, describe
from engine.machine import (
    DecisionFailed,
    ExecuteFailed,
    Input,
    LlmCallPlan,
    LlmCallSettled,
    RunDecision,
    RunExecute,
    RunLlmCall,
    SessionState,
    build_llm_request,
)
from engine.machine.retry import Fault
from engine.metrics import Metrics
from engine.redact import Redactor, env_secrets, scrubbed
from engine.retrying import Trouble
from engine.store.store import Store
from engine.telemetry.logs import CURRENT
from engine.telemetry.spans import effect_context

log = logging.getLogger("subs.engine")

Deltas = tuple[dict[str, Any], ...]
Done = Callable[[Input, Deltas], None]  # the effect's result, and the call's last token deltas
Tasks = set[asyncio.Task[None]]
_delta_trouble = Trouble(log)

# Runs one effect of its type; it must report back through `done` exactly once
# (`EffectRunner.run` sees to that).
Runner = Callable[["EffectRunner", SessionState, Any, Done, Tasks], None]
Runners = Mapping[type, Runner]


def builtin_runners() -> dict[type, Runner]:
    """The runners of the built-in effects: model calls, worker decisions and executes."""
    return {
        RunLlmCall: EffectRunner._start_llm_call,
        RunDecision: EffectRunner._start_worker_effect,
        RunExecute: EffectRunner._start_worker_effect,
    }


class EngineConfigError(SubsError):
    """The project cannot run as configured (found at start, before any work)."""


def worker_targets(project: Project, env: Mapping[str, str]) -> dict[str, WorkerTarget]:
    """Each worker agent's URL and signing secret; a named but empty secret is an error."""
    targets = {}
    for agent in project.agents.values():
        if agent.worker is None:
            continue
        secret = None
        if agent.signing_secret_env:
            secret = env.get(agent.signing_secret_env) or None
            if secret is None:
                raise EngineConfigError(
                    f"agent.{agent.id}.signing_secret_env names {agent.signing_secret_env}, "
                    "which is not set (or empty) in the environment"
                )
        targets[agent.id] = WorkerTarget(agent.worker, secret)
    return targets


@dataclass
class EffectRunner:
    """Starts effects as tasks; `tasks` is the owner's set, so it can cancel them.

    Owns the engine's one HTTP session (`http_pool`): every model call and worker
    delivery shares its pool of kept-alive connections. Made in the running loop
    (the engine's `start`), closed by `aclose`.
    """

    project: Project
    store: Store
    env: Mapping[str, str]
    workers: dict[str, WorkerTarget]
    metrics: Metrics
    clock: Callable[[], float]
    runners: Runners  # by effect type
    sampled: bool = False  # tracing is on: worker requests say their span is recorded

    def __post_init__(self) -> None:
        self.http: aiohttp.ClientSession = new_session()
        # What a vendor, a worker or an MCP server says in an error may echo a secret it
        # was sent (a key in a 401's body, a token in a server's stderr): scrubbed before
        # it is recorded, since the log is read by the API, the console and Slack.
        self.redactor = Redactor([*env_secrets(self.env), *project_secrets(self.project, self.env)])
        self.prompts = EncodedMessages()
        self.checked = CheckedMessages()

    async def aclose(self) -> None:
        """Close the shared HTTP session."""
        await self.http.close()

    def now_ms(self) -> int:
        """The clock effects read, in ms; injected so tests can move it."""
        return int(self.clock() * 1000)

    def runs(self, effect: object) -> bool:
        """Whether this runner starts `effect` (the others are the commit's own)."""
        return type(effect) in self.runners

    def start(self, state: SessionState, effect: object, done: Done, tasks: Tasks) -> None:
        """Start `effect` by its type's runner; its end comes back through `done` (in its
        span's context when tracing is on, so what it logs names the span)."""
        runner = self.runners[type(effect)]
        span = effect_context(state, effect) if self.sampled else None
        if span is None:
            runner(self, state, effect, done, tasks)
            return

        def in_span() -> None:  # the effect's tasks copy this context: their logs name it
            CURRENT.set(span)
            runner(self, state, effect, done, tasks)

        contextvars.copy_context().run(in_span)

    def run(
        self,
        sid: str,
        what: str,
        prepare: Callable[[], Callable[[], Awaitable[Input]]],
        failed: Callable[[ErrorInfo, bool], Input],
        done: Done,
        tasks: set[asyncio.Task[None]],
        deltas: DeltaWriter | None = None,
    ) -> None:
        """Run one effect so that it always reports back: whatever it raises is a failed
        attempt with a reason, never a task that dies with nothing recorded.

        `prepare` builds the request from the committed state, before any await (so a
        later transition cannot change what is sent); a failure there is deterministic,
        so it is not retried. `deltas` is the writer the effect streams tokens into:
        what it still holds at the end is handed to `done`, to go out with the commit.
        """

        def report(result: Input, deltas_left: Deltas) -> None:
            done(self.scrubbed(result), deltas_left)

        try:
            run = prepare()
        except Exception as err:
            code = err.info()["code"] if isinstance(err, SubsError) else "internal"
            if code == "internal":  # not a failure the protocol names: a bug
                log.exception("preparing the %s of %s failed", what, sid)
            error: ErrorInfo = {
                "message": f"the {what} could not be prepared: {describe(err)}",
                "code": code,
            }
            report(failed(error, False), ())
            return

        async def guarded() -> None:
            try:
                result = await run()
            except asyncio.CancelledError:
                if deltas is not None:
                    deltas.abandon()
                raise
            except Exception as err:
                log.exception("the %s of %s failed inside the engine", what, sid)
                error: ErrorInfo = {
                    "message": f"the {what} failed inside the engine: {describe(err)}",
                    "code": "internal",
                }
                result = failed(error, True)
            report(result, () if deltas is None else await deltas.end())

        task = asyncio.create_task(guarded())
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def scrubbed(self, result: Input) -> Input:
        """`result` with the known secrets masked wherever outside text says something went
        wrong: its ErrorInfo `error`, an MCP result marked `isError`, and the `error` of a
        worker's actions (`tool.error`, `fail`). The one place every attempt of an effect
        passes before it is recorded; results that went well are left as they are."""
        scrub = self.redactor.scrub
        changes: dict[str, Any] = {}
        error = getattr(result, "error", None)
        if error:
            changes["error"] = scrubbed(error, scrub)
        answer = getattr(result, "result", None)
        if isinstance(answer, dict) and answer.get("isError"):
            changes["result"] = scrubbed(answer, scrub)
        response = getattr(result, "response", None)
        actions = response.get("actions") if isinstance(response, dict) else None
        if isinstance(actions, list) and any(isinstance(a, dict) and "error" in a for a in actions):
            assert isinstance(response, dict)
            said = [
                {**a, "error": scrubbed(a["error"], scrub)}
                if isinstance(a, dict) and "error" in a
                else a
                for a in actions
            ]
            changes["response"] = {**response, "actions": said}
        return dataclasses.replace(result, **changes) if changes else result

    def _start_llm_call(
        self, state: SessionState, effect: RunLlmCall, done: Done, tasks: set[asyncio.Task[None]]
    ) -> None:
        sid, call_id, attempt = state.session_id, effect.call_id, effect.attempt

        deltas = DeltaWriter(self.store, sid)

        def prepare() -> Callable[[], Awaitable[Input]]:
            plan = build_llm_request(state, state.calls[call_id])
            return lambda: self._run_llm_call(sid, effect, plan, deltas)

        def failed(error: ErrorInfo, retryable: bool) -> Input:
            return LlmCallSettled(call_id, attempt, error=error, retryable=retryable)

        self.run(sid, f"model call {call_id}", prepare, failed, done, tasks, deltas)

    def _start_worker_effect(
        self,
        state: SessionState,
        effect: RunDecision | RunExecute,
        done: Done,
        tasks: set[asyncio.Task[None]],
    ) -> None:
        sid = state.session_id
        target = self.workers.get(state.agent_id)

        def failed(error: ErrorInfo, retryable: bool) -> Input:
            if isinstance(effect, RunDecision):
                return DecisionFailed(effect.decision_id, effect.attempt, error, retryable)
            return ExecuteFailed(effect.call_id, effect.attempt, error, retryable)

        if target is None:
            error: ErrorInfo = {
                "message": f"agent {state.agent_id!r} has no worker to send this to",
                "code": "unroutable",
            }
            done(failed(error, False), ())
            return
        now = self.now_ms()
        deltas = None if isinstance(effect, RunDecision) else DeltaWriter(self.store, sid)

        def prepare() -> Callable[[], Awaitable[Input]]:
            if isinstance(effect, RunDecision):
                decision = DecisionRun(state, target, now, self.checked, self.sampled)

                async def run_decision() -> Input:
                    started = time.perf_counter()
                    result = await decision.run(self.http)
                    self.metrics.observe_worker_call(time.perf_counter() - started)
                    return result

                return run_decision
            cache = self._caches(state, effect.call_id)
            execute = ExecuteRun(
                state, effect.call_id, target, now, self.checked, self.sampled, cache
            )
            assert deltas is not None

            async def run_execute() -> Input:
                started = time.perf_counter()
                try:
                    files = functools.partial(self.store.get_files, sid)
                    return await execute.run(self.http, deltas.add, files)
                finally:
                    self.metrics.observe_worker_call(time.perf_counter() - started)

            return run_execute

        what = "decision" if isinstance(effect, RunDecision) else f"call {effect.call_id}"
        self.run(sid, f"worker {what}", prepare, failed, done, tasks, deltas)

    def _caches(self, state: SessionState, call_id: str) -> bool:
        """Whether a worker-run model call asks for prompt caching: its `[llm.<id>]` block's
        `cache` (the call's own block, else the agent's), on when it names none."""
        call = state.calls.get(call_id)
        block_id = (call.params.get("llm") if call is not None else None) or (
            state.agent or {}
        ).get("llm")
        block = self.project.llm.get(str(block_id or ""))
        return block.cache if block is not None else True

    def _target(self, block_id: str | None) -> LlmTarget:
        block = self.project.llm.get(block_id or "")
        declared = ", ".join(sorted(self.project.llm)) or "none"
        if block is None:
            raise ProviderError(
                f"the agent names no [llm.{block_id}] block; declared: {declared}"
                if block_id
                else f"the agent names no llm block; declared: {declared}",
                code=Fault.UNROUTABLE.code,
                retryable=Fault.UNROUTABLE.retryable,
                param="agent.llm",
            )
        if block.type == "worker":
            raise ProviderError(
                f"[llm.{block.id}] runs on a worker, which this engine does not support yet",
                code=Fault.UNROUTABLE.code,
                retryable=Fault.UNROUTABLE.retryable,
            )
        assert block.base_url is not None
        return LlmTarget(
            type=block.type,
            base_url=block.base_url,
            api_key=(self.env.get(block.api_key_env) or None) if block.api_key_env else None,
            api_key_env=block.api_key_env,
            block=block.id,
            cache=block.cache,
        )

    def _kept(self, sid: str, vendor: str, message: dict[str, Any]) -> bool:
        """Whether the message's vendor form is kept encoded (so its files need no reading):
        a message of its own group (not a system message, which goes in the head; not a tool
        result, which Anthropic groups), under the key `prompts.encode_body` gives it."""
        if message.get("role") in ("system", "tool") or message.get("id") is None:
            return False
        return self.prompts.holds((sid, vendor, str(message["id"])))

    async def _run_llm_call(
        self, sid: str, effect: RunLlmCall, plan: LlmCallPlan, deltas: DeltaWriter
    ) -> Input:
        delta_seq = 0

        async def on_delta(delta: dict[str, Any]) -> None:
            nonlocal delta_seq
            delta_seq += 1
            deltas.add(
                {**delta, "call_id": effect.call_id, "attempt": effect.attempt, "seq": delta_seq}
            )

        settled: LlmCallSettled
        started = time.perf_counter()
        provider = "unknown"
        try:
            target = self._target(plan.llm)
            provider = target.type
            timeout = None if effect.deadline is None else (effect.deadline - self.now_ms()) / 1000
            async with asyncio.timeout(timeout):
                fetch = functools.partial(self.store.get_files, sid)
                kept = functools.partial(self._kept, sid, target.type)
                request = await resolve_files(plan.request, fetch, target.type, kept=kept)
                response = await complete(
                    self.http,
                    target,
                    request,
                    stream=plan.stream,
                    on_delta=on_delta,
                    kept=self.prompts,
                    session_id=sid,
                )
            own = self.project.llm[plan.llm or ""].prices  # `_target` found the block
            response = prices.reprice(response, own) if own else response
            settled = LlmCallSettled(effect.call_id, effect.attempt, response=response)
        except ProviderError as err:
            info = err.info()
            settled = LlmCallSettled(
                effect.call_id,
                effect.attempt,
                error=info,
                retryable=err.retryable,
                retry_after=err.retry_after,
            )
        except TimeoutError:
            late = Fault.DEADLINE
            info = late.error("the model call ran past its run timeout")
            settled = LlmCallSettled(
                effect.call_id, effect.attempt, error=info, retryable=late.retryable
            )
        finally:
            seconds = time.perf_counter() - started
            self.metrics.observe_model_call(seconds)
        usage = (settled.response or {}).get("usage") or {}
        self.metrics.observe_chat(
            seconds,
            provider=provider,
            model=str(plan.request.get("model") or "unknown"),
            tokens={k: v for k in ("input", "output") if isinstance(v := usage.get(k), int)},
            error=None if settled.error is None else str(settled.error.get("code", "error")),
        )
        self.metrics.model_input(
            usage, provider=provider, model=str(plan.request.get("model") or "unknown")
        )
        return settled


class DeltaWriter:
    """Writes one call's token deltas in order while the call runs, batching what piles
    up during a round trip. What is left when the call ends goes out in the write that
    commits its end (`Store.commit`): ahead of that event, without a round trip."""

    def __init__(self, store: Store, session_id: str) -> None:
        self.store = store
        self.session_id = session_id
        self.buffer: list[dict[str, Any]] = []
        self.task: asyncio.Task[None] | None = None
        self.ended = False

    def add(self, delta: dict[str, Any]) -> None:
        """Queue a delta; a write starts unless one is already out."""
        self.buffer.append(delta)
        if not self.ended and (self.task is None or self.task.done()):
            self.task = asyncio.create_task(self._flush())

    async def _flush(self) -> None:
        while self.buffer and not self.ended:
            batch, self.buffer = self.buffer, []
            try:
                await self.store.add_deltas(self.session_id, batch)
            except Exception as err:  # deltas are best effort; the reply itself is in the log
                _delta_trouble(f"writing token deltas of {self.session_id}", err)

    async def end(self) -> Deltas:
        """The deltas not written yet, once the batch in flight is in (order holds)."""
        self.ended = True
        if self.task is not None:
            await self.task
        rest, self.buffer = tuple(self.buffer), []
        return rest

    def abandon(self) -> None:
        """The call ended: stop writing; the rest goes out with the commit."""
        self.ended = True
        if self.task is not None:
            self.task.cancel()
