"""The context every rule works in: the state, the events it emits, the effects it asks for."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, Protocol

from ..errors import SubsError
from . import events as ev
from .effects import Effect
from .evolve import Event, evolve
from .state import SessionState


class Ids(Protocol):
    def __call__(self, prefix: str) -> str: ...


class MachineError(SubsError):
    """An input the session refuses. `status` is the HTTP status hint."""

    def __init__(self, code: str, message: str, status: int = 409, **detail: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.detail = detail


@dataclass
class Transition:
    state: SessionState | None
    events: list[Event] = field(default_factory=list)
    effects: list[Effect] = field(default_factory=list)
    reply: dict[str, Any] | None = None
    ignored: str | None = None


def iso(ms: int) -> str:
    """RFC 3339 in UTC, to the millisecond (every event's `occurred_at`)."""
    seconds, milli = divmod(ms, 1000)
    return f"{_iso_second(seconds)}.{milli:03d}Z"


@lru_cache(maxsize=64)
def _iso_second(seconds: int) -> str:
    # A step's events share their second: formatting it once is 5x faster per event.
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")


class Step:
    """One transition in the making: the context every rule function takes.

    Rules (turns.py, calls.py, decisions.py) are plain functions of a `Step`; it holds
    what they share and nothing else. Every state change goes through `emit`.
    """

    def __init__(self, state: SessionState | None, session_id: str, now: int, ids: Ids) -> None:
        self.state = state
        self.session_id = session_id
        self.now = now
        self.occurred_at = iso(now)
        self.ids = ids
        self.out = Transition(state=state)
        # The agent's Slack slash commands, from the client input being applied.
        self.slash_commands: tuple[str, ...] = ()

    @property
    def s(self) -> SessionState:
        """The state, for a rule that runs only once the session exists."""
        assert self.state is not None
        return self.state

    @property
    def by_worker(self) -> bool:
        return self.s.decider == "worker"

    def emit(self, payload: ev.Payload, turn_id: str | None = None) -> None:
        """Record one event (a record of events.py) and fold it into the state."""
        seq = (self.state.seq if self.state else 0) + 1
        if turn_id is None and self.state is not None and self.state.turn is not None:
            turn_id = self.state.turn.id
        event: Event = {
            "session_id": self.session_id,
            "seq": seq,
            "occurred_at": self.occurred_at,
            "payload": payload,
        }
        if turn_id is not None:
            event["turn_id"] = turn_id
        self.state = evolve(self.state, event)
        self.out.state = self.state
        self.out.events.append(event)

    def ignore(self, reason: str) -> None:
        self.out.ignored = reason
