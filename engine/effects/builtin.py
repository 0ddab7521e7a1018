"""The runners of the effects every engine runs, as one table for the composition root.

Each kind's runner has a module of its own and imports the runner (engine/effects/
runner.py), never the reverse: so the table naming the built-in ones sits above them,
and engine/runtime/engine.py adds MCP's and any a caller brings to it.
"""

from __future__ import annotations

from engine.effects.llm_call import start_llm_call
from engine.effects.runner import Runner
from engine.effects.worker_effects import start_worker_effect
from engine.machine import RunDecision, RunExecute, RunLlmCall


def builtin_runners() -> dict[type, Runner]:
    """The runners of the built-in effects: model calls, worker decisions and executes."""
    return {
        RunLlmCall: start_llm_call,
        RunDecision: start_worker_effect,
        RunExecute: start_worker_effect,
    }
