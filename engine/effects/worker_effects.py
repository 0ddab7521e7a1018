"""The runner of a worker's effects: the live decision (`RunDecision`) and a call's
execute (`RunExecute`), delivered to the agent's worker.

engine/effects/worker.py speaks the worker's protocol; this starts each delivery as a
task, times it for the metrics and streams an execute's token deltas to the session.
An agent with no worker fails the effect at once as `unroutable`, not retried.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable

from engine.config import Project
from engine.effects.deltas import DeltaWriter
from engine.effects.runner import Done, EffectRunner, Tasks
from engine.effects.worker import DecisionRun, ExecuteRun
from engine.errors import ErrorInfo
from engine.machine import (
    DecisionFailed,
    ExecuteFailed,
    Input,
    RunDecision,
    RunExecute,
    SessionState,
)


def start_worker_effect(
    runner: EffectRunner,
    state: SessionState,
    effect: RunDecision | RunExecute,
    done: Done,
    tasks: Tasks,
) -> None:
    """The runner of `RunDecision` and `RunExecute`: the delivery as a task, reporting
    back through `done`."""
    sid = state.session_id
    target = runner.workers.get(state.agent_id)

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
    now = runner.now_ms()
    deltas = None if isinstance(effect, RunDecision) else DeltaWriter(runner.store, sid)

    def prepare() -> Callable[[], Awaitable[Input]]:
        if isinstance(effect, RunDecision):
            decision = DecisionRun(state, target, now, runner.checked, runner.sampled)

            async def run_decision() -> Input:
                started = time.perf_counter()
                result = await decision.run(runner.http)
                runner.metrics.observe_worker_call(time.perf_counter() - started)
                return result

            return run_decision
        cache = _caches(runner.project, state, effect.call_id)
        execute = ExecuteRun(
            state, effect.call_id, target, now, runner.checked, runner.sampled, cache
        )
        assert deltas is not None

        async def run_execute() -> Input:
            started = time.perf_counter()
            try:
                files = functools.partial(runner.store.get_files, sid)
                return await execute.run(runner.http, deltas.add, files)
            finally:
                runner.metrics.observe_worker_call(time.perf_counter() - started)

        return run_execute

    what = "decision" if isinstance(effect, RunDecision) else f"call {effect.call_id}"
    runner.run(sid, f"worker {what}", prepare, failed, done, tasks, deltas)


def _caches(project: Project, state: SessionState, call_id: str) -> bool:
    """Whether a worker-run model call asks for prompt caching: its `[llm.<id>]` block's
    `cache` (the call's own block, else the agent's), on when it names none."""
    call = state.calls.get(call_id)
    block_id = (call.params.get("llm") if call is not None else None) or (state.agent or {}).get(
        "llm"
    )
    block = project.llm.get(str(block_id or ""))
    return block.cache if block is not None else True
