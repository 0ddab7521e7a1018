"""Effects: what the shell must do after a transition commits."""

from __future__ import annotations

from dataclasses import dataclass

from .inputs import TimerFired


@dataclass(frozen=True)
class RunLlmCall:
    """Call the model for `call_id`, attempt `attempt`, on the engine."""

    call_id: str
    attempt: int
    deadline: int | None  # ms


@dataclass(frozen=True)
class StartTimer:
    """Deliver `input` at `due` (ms). Committed with the transition, so it survives a crash."""

    due: int
    input: TimerFired


Effect = RunLlmCall | StartTimer
