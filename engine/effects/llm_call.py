"""The engine-run model call: a `RunLlmCall` sent to its `[llm.<id>]` block's vendor.

The request is built from the committed state before any await. Its files are read
(but for messages whose vendor form is kept encoded), the call runs under its
attempt's deadline with its token deltas streamed to the session as they come, and it
ends as one `LlmCallSettled`: the response (priced by the block's own `prices` where it
names any), the vendor's error, or the deadline passed. A model call an agent's worker
runs goes to the worker instead (engine/effects/worker_effects.py).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from engine.config import Project
from engine.effects.deltas import DeltaWriter
from engine.effects.llm import LlmTarget, ProviderError, complete, prices
from engine.effects.llm.files import resolve_files
from engine.effects.llm.prompts import EncodedMessages
from engine.effects.runner import Done, EffectRunner, Tasks
from engine.errors import ErrorInfo
from engine.machine import (
    Input,
    LlmCallPlan,
    LlmCallSettled,
    RunLlmCall,
    SessionState,
    build_llm_request,
)
from engine.machine.retry import Fault


def start_llm_call(
    runner: EffectRunner, state: SessionState, effect: RunLlmCall, done: Done, tasks: Tasks
) -> None:
    """The runner of `RunLlmCall`: the call as a task, reporting back through `done`."""
    sid, call_id, attempt = state.session_id, effect.call_id, effect.attempt

    deltas = DeltaWriter(runner.store, sid)

    def prepare() -> Callable[[], Awaitable[Input]]:
        plan = build_llm_request(state, state.calls[call_id])
        return lambda: _run_llm_call(runner, sid, effect, plan, deltas)

    def failed(error: ErrorInfo, retryable: bool) -> Input:
        return LlmCallSettled(call_id, attempt, error=error, retryable=retryable)

    runner.run(sid, f"model call {call_id}", prepare, failed, done, tasks, deltas)


def _target(project: Project, env: Mapping[str, str], block_id: str | None) -> LlmTarget:
    block = project.llm.get(block_id or "")
    declared = ", ".join(sorted(project.llm)) or "none"
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
        api_key=(env.get(block.api_key_env) or None) if block.api_key_env else None,
        api_key_env=block.api_key_env,
        block=block.id,
        cache=block.cache,
    )


def _kept(prompts: EncodedMessages, sid: str, vendor: str, message: dict[str, Any]) -> bool:
    """Whether the message's vendor form is kept encoded (so its files need no reading):
    a message of its own group (not a system message, which goes in the head; not a tool
    result, which Anthropic groups), under the key `prompts.encode_body` gives it."""
    if message.get("role") in ("system", "tool") or message.get("id") is None:
        return False
    return prompts.holds((sid, vendor, str(message["id"])))


async def _run_llm_call(
    runner: EffectRunner, sid: str, effect: RunLlmCall, plan: LlmCallPlan, deltas: DeltaWriter
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
        target = _target(runner.project, runner.env, plan.llm)
        provider = target.type
        timeout = None if effect.deadline is None else (effect.deadline - runner.now_ms()) / 1000
        async with asyncio.timeout(timeout):
            fetch = functools.partial(runner.store.get_files, sid)
            kept = functools.partial(_kept, runner.prompts, sid, target.type)
            request = await resolve_files(plan.request, fetch, target.type, kept=kept)
            response = await complete(
                runner.http,
                target,
                request,
                stream=plan.stream,
                on_delta=on_delta,
                kept=runner.prompts,
                session_id=sid,
            )
        own = runner.project.llm[plan.llm or ""].prices  # `_target` found the block
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
        runner.metrics.observe_model_call(seconds)
    usage = (settled.response or {}).get("usage") or {}
    runner.metrics.observe_chat(
        seconds,
        provider=provider,
        model=str(plan.request.get("model") or "unknown"),
        tokens={k: v for k in ("input", "output") if isinstance(v := usage.get(k), int)},
        error=None if settled.error is None else str(settled.error.get("code", "error")),
    )
    runner.metrics.model_input(
        usage, provider=provider, model=str(plan.request.get("model") or "unknown")
    )
    return settled
