"""Inputs to the machine: facts that happened outside it, in the past tense."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ClientSubmitted:
    """A client input (SPEC §13 ClientInput), already validated at the edge.

    `agent_config` and `decider` describe the agent as the project file
    declares it; they matter only when this input creates the session.
    """

    input: dict[str, Any]
    agent_id: str
    identity: dict[str, Any]
    agent_config: dict[str, Any] | None
    decider: str = "engine"


@dataclass(frozen=True)
class LlmCallSettled:
    """An engine-run model call attempt ended: a response, or an error."""

    call_id: str
    attempt: int
    response: dict[str, Any] | None = None
    error: dict[str, Any] | None = None  # ErrorInfo
    retryable: bool = False
    retry_after: float | None = None


@dataclass(frozen=True)
class TimerFired:
    """A backoff timer for `call_id` elapsed; `attempt` is the one it schedules."""

    call_id: str
    attempt: int


@dataclass(frozen=True)
class CallLost:
    """The engine that ran this attempt is gone (restart, lease moved)."""

    call_id: str
    attempt: int


Input = ClientSubmitted | LlmCallSettled | TimerFired | CallLost


def input_to_json(inp: Input) -> dict[str, Any]:
    return {"kind": type(inp).__name__, **inp.__dict__}


_KINDS: dict[str, type] = {
    c.__name__: c for c in (ClientSubmitted, LlmCallSettled, TimerFired, CallLost)
}


def input_from_json(d: dict[str, Any]) -> Input:
    fields = dict(d)
    kind = _KINDS.get(fields.pop("kind", ""))
    if kind is None:
        raise ValueError(f"unknown input kind {d.get('kind')!r}")
    return kind(**fields)
