"""Effects: what the shell must do after a transition commits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .inputs import (
    CallDeadline,
    DecisionDeadline,
    DecisionTimerFired,
    InterruptDeadline,
    QueueDeadline,
    TimerFired,
)


@dataclass(frozen=True)
class RunCall:
    """Run attempt `attempt` of call `call_id`: each call kind's effect is a subclass
    (kinds.py), which the shell's runner registry maps to the code that runs it."""

    call_id: str
    attempt: int
    deadline: int | None  # ms


@dataclass(frozen=True)
class RunLlmCall(RunCall):
    """Call the model for `call_id`, attempt `attempt`, on the engine."""


@dataclass(frozen=True)
class RunDecision:
    """POST the live decision to the session's worker."""

    decision_id: str
    attempt: int
    deadline: int | None


@dataclass(frozen=True)
class RunExecute(RunCall):
    """POST a call's `tool.execute` / `llm.execute` to the worker."""


@dataclass(frozen=True)
class StartTimer:
    """Deliver `input` at `due` (ms). Committed with the transition, so it survives a crash."""

    due: int
    input: (
        TimerFired
        | DecisionTimerFired
        | CallDeadline
        | DecisionDeadline
        | QueueDeadline
        | InterruptDeadline
    )


@dataclass(frozen=True)
class CancelTimer:
    """Forget a timer started earlier (same `due` and `input`): what it guarded has ended."""

    due: int
    input: CallDeadline | DecisionDeadline | QueueDeadline | InterruptDeadline


@dataclass(frozen=True)
class Deliver:
    """Hand an input to another session (a message, a child to start, a child's result).

    Committed to the partition's outbox with the transition, then relayed: a crash
    in between relays it again, and every receiving input is idempotent.
    """

    to: str
    input: Any  # an Input of the receiving session


Effect = RunCall | RunDecision | StartTimer | CancelTimer | Deliver
