"""Call kinds: the one table of what runs each kind of call, and by which rules.

A call's kind is the (`kind`, `handler`) pair its `*.call.requested` recorded:
("llm", "server") the engine calls the model; ("llm", "worker") and ("tool", "worker")
the worker executes; ("tool", "client") the client runs it; ("tool", "subagent") a
child session does. The rules ask this table instead of branching on the handler:
which retry policy applies, whether the session can run the call, the effect that
dispatching an attempt starts, the attempt's deadline timer, whether a dead engine
loses the attempt, and how the kind's runner's answer (`CallAnswered`) settles it.
Decisions are not calls: decisions.py runs them under the "decision" policy.

Adding a kind (connectors.py did, for MCP syncs and calls) touches:
  1. its own machine module: a `RunCall` subclass for its effect and
     `register(CallKind(...))`, with a `settle` rule if a tool result is not what its
     answer means;
  2. its own shell module: `engine.effects.runner.register(ItsEffect, its_runner)`, the
     runner answering with `CallAnswered` (run it under `EffectRunner.run`);
  3. the event catalogue (events.py), only for facts no event records yet;
  4. two import lines, so both register wherever the engine runs: its machine module
     at the end of this file, its runner module at the end of engine/effects/runner.py.
Nothing else: config accepts any registered tool handler, the rules, timers, retries
and lost-work resends read this table. `tests/test_effect_kinds.py` registers a toy
kind from the test alone and runs a turn through the real engine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import retry
from .core import Step
from .effects import RunCall, RunExecute, RunLlmCall
from .inputs import CallAnswered
from .state import Call, SessionState

Deadline = Callable[[Call], int | None]  # when the attempt's deadline timer fires (ms)


def backstop(grace_ms: int) -> Deadline:
    """A timer at the attempt's run deadline, `grace_ms` later (the runner enforces the
    deadline itself and says so better; the timer ends an attempt the shell lost)."""
    return lambda call: None if call.deadline is None else call.deadline + grace_ms


def whole_run(call: Call) -> int | None:
    """A timer at the call's total timeout, counted from its start (a child's run)."""
    total = call.retry.get("total_timeout_secs")
    return None if total is None else call.started_at + int(total * 1000)


def queue_then_whole_run(call: Call) -> int | None:
    """A subagent call: its attempt's queue deadline until the child's turn starts (the
    fold then clears `deadline`), and its total timeout all along."""
    dues = [d for d in (call.deadline, whole_run(call)) if d is not None]
    return min(dues) if dues else None


def no_deadline(call: Call) -> int | None:
    return None


def always(state: SessionState) -> bool:
    return True


def by_worker(state: SessionState) -> bool:
    return state.decider == "worker"


@dataclass(frozen=True)
class CallKind:
    """The rules of one kind of call."""

    kind: str  # "llm" | "tool" | "connector": which family of call events it records
    handler: str  # where it runs, as `*.call.requested` records it
    retry: str  # its policy in retry.DEFAULTS
    runnable: Callable[[SessionState], bool]  # can this session run it at all
    effect: type[RunCall] | None  # what dispatching an attempt asks the shell to run
    deadline: Deadline  # its attempt's deadline timer
    in_flight: bool  # an attempt is a request a dead engine loses (sent again)
    # The settle API may end a running attempt (a waiting, async one it always may).
    outside_settles: bool = False
    settle: Callable[[Step, Call, CallAnswered], None] | None = None  # None: calls.answered
    # How a call that failed for good ends (its `errored` event is out); None: the tool
    # message the model sees (calls.tool_finished).
    failed: Callable[[Step, Call, dict[str, Any]], None] | None = None
    retry_defaults: dict[str, Any] | None = None  # a policy of its own, added as `retry`
    agent_retry: str | None = None  # the agent's `retry.<block>` over its own policy


# The worker's deadline timer is a worker tool's only deadline (it may be waiting,
# async), so no grace; an engine-run attempt's timer is a backstop.
BACKSTOP_GRACE_MS = 1000

KINDS: dict[tuple[str, str], CallKind] = {}


def register(k: CallKind) -> None:
    """Add a kind; registering the same kind twice is harmless, a different one is an error."""
    key = (k.kind, k.handler)
    if key in KINDS and KINDS[key] != k:
        raise ValueError(f"call kind {key} is already registered")
    if k.retry_defaults is not None:
        retry.add_policy(k.retry, k.retry_defaults, k.agent_retry)
    KINDS[key] = k


def of(kind: str, handler: str) -> CallKind | None:
    """The rules of a call, or None for a handler nothing registered (it cannot run)."""
    return KINDS.get((kind, handler))


def tool_handlers() -> set[str]:
    """The handlers an agent's tool may name (a subagent's tool is offered, not declared)."""
    return {h for (kind, h) in KINDS if kind == "tool" and h not in ("subagent", "server")}


for _builtin in (
    CallKind("llm", "server", "llm", always, RunLlmCall, backstop(BACKSTOP_GRACE_MS), True),
    CallKind("llm", "worker", "llm", by_worker, RunExecute, backstop(BACKSTOP_GRACE_MS), True),
    CallKind("tool", "worker", "tool", by_worker, RunExecute, backstop(0), True),
    CallKind("tool", "client", "client_tool", always, None, no_deadline, False, True),
    CallKind("tool", "subagent", "subagent", always, None, queue_then_whole_run, False, True),
):
    register(_builtin)

# Kinds with modules of their own are imported here, to register: `from . import <kind>`.
from . import connectors  # noqa: E402, F401  (MCP: the connector sync and tool calls)
