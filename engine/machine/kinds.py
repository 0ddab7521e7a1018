"""Call kinds: what runs each kind of call, and by which rules; the built-in kinds.

A call's kind is the (`kind`, `handler`) pair its `*.call.requested` recorded:
("llm", "server") the engine calls the model; ("llm", "worker") and ("tool", "worker")
the worker executes; ("tool", "client") the client runs it; ("tool", "subagent") a
child session does (subagents.py). The rules ask the step's table of kinds (`st.kinds`, core.py
`Kinds`) instead of branching on the handler: which retry policy applies, whether the
session can run the call, the effect that dispatching an attempt starts, the attempt's
deadline timer, whether a dead engine loses the attempt, and how the kind's runner's
answer (`CallAnswered`) settles it. Decisions are not calls: they run under the
"decision" policy.

The built-in kinds are here; subagents.py and connectors.py hold their own, with the
hooks their rules need. Adding a kind (connectors.py did, for MCP syncs and calls)
touches:
  1. its own machine module: a `RunCall` subclass for its effect and a `CallKind` value,
     with a `settle` rule if a tool result is not what its answer means;
  2. its own shell module: a runner for its effect, answering with `CallAnswered`
     (run it under `EffectRunner.run`);
  3. the event catalogue (events.py), only for facts no event records yet;
  4. the composition: its kind in the table (defaults.py `default_kinds`) and its runner
     among the engine's (engine/runtime/engine.py).
Nothing else: config accepts any tool handler of the table, the rules, timers, retries
and lost-work resends read it. `tests/test_effect_kinds.py` builds a table with a toy
kind from the test alone and runs a turn through the real engine.
"""

from __future__ import annotations

from .core import CallKind, Deadline
from .effects import RunExecute, RunLlmCall
from .state import Call, SessionState


def backstop(grace_ms: int) -> Deadline:
    """A timer at the attempt's run deadline, `grace_ms` later (the runner enforces the
    deadline itself and says so better; the timer ends an attempt the shell lost)."""
    return lambda call: None if call.deadline is None else call.deadline + grace_ms


def no_deadline(call: Call) -> int | None:
    """For kinds whose attempts have no run deadline of their own."""
    return None


def always(state: SessionState) -> bool:
    """A kind available to every session."""
    return True


def by_worker(state: SessionState) -> bool:
    """A kind only a worker-decided session has."""
    return state.decider == "worker"


# The worker's deadline timer is a worker tool's only deadline (it may be waiting,
# async), so no grace; an engine-run attempt's timer is a backstop.
BACKSTOP_GRACE_MS = 1000

BUILTIN: tuple[CallKind, ...] = (
    CallKind("llm", "server", "llm", always, RunLlmCall, backstop(BACKSTOP_GRACE_MS), True),
    CallKind("llm", "worker", "llm", by_worker, RunExecute, backstop(BACKSTOP_GRACE_MS), True),
    CallKind("tool", "worker", "tool", by_worker, RunExecute, backstop(0), True),
    CallKind("tool", "client", "client_tool", always, None, no_deadline, False, True),
)
