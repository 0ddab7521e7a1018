"""A tiny in-memory driver for the pure machine: no Redis, no clock."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from engine.machine import (
    ClientSubmitted,
    Event,
    Input,
    Kinds,
    SessionState,
    Transition,
    default_kinds,
    fold,
    state_to_json,
    step,
)
from engine.machine.policies import Bucket

AGENT = {
    "llm": "vendor",
    "model": "m1",
    "system": "be brief",
    "tools": [
        {"name": "confirm", "description": "ask a person", "handler": "client"},
        {"name": "lookup", "description": "ask the worker"},
    ],
    "retry": {"llm": {"backoff_base_secs": 1, "backoff_max_secs": 5}},
}


# The table of call kinds the pure machine runs by in these tests: the engine's default.
KINDS = default_kinds()


class CountingIds:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}-{self.n}"


@dataclass
class Session:
    """Drives one session and keeps its log, as the store would."""

    session_id: str = "s1"
    agent: dict[str, Any] | None = field(default_factory=lambda: copy.deepcopy(AGENT))
    now: int = 1_767_000_000_000
    state: SessionState | None = None
    log: list[Event] = field(default_factory=list)
    ids: CountingIds = field(default_factory=CountingIds)
    decider: str = "engine"
    kinds: Kinds = KINDS
    buckets: tuple[Bucket, ...] = ()  # budget-policy buckets, as the shell would read them

    def apply(self, inp: Input) -> Transition:
        self.now += 10
        t = step(
            self.state, self.session_id, inp, self.now, self.ids, self.kinds, buckets=self.buckets
        )
        self.state = t.state
        self.log.extend(t.events)
        return t

    def say(self, text: str, **extra: Any) -> Transition:
        body = {
            "type": "client.message",
            "agent_id": "a",
            "message": {"role": "user", "content": text},
        }
        body.update(extra)
        return self.client(body)

    def client(self, body: dict[str, Any]) -> Transition:
        return self.apply(ClientSubmitted(body, "a", {}, self.agent, self.decider))

    def types(self, t: Transition | None = None) -> list[str]:
        events = t.events if t is not None else self.log
        return [e["payload"]["type"] for e in events]

    def check_fold(self) -> None:
        assert [e["seq"] for e in self.log] == list(range(1, len(self.log) + 1))
        folded = fold(copy.deepcopy(self.log))
        assert self.state is not None and folded is not None
        assert state_to_json(folded) == state_to_json(self.state)


def text_reply(text: str, **usage: int) -> dict[str, Any]:
    u = {"input": 10, "output": 5, "uncached_input": 10, "cache_read": 0, "cache_write": 0}
    u.update(usage)
    u["total"] = u["input"] + u["output"]
    return {"model": "m1", "content": text, "finish_reason": "stop", "usage": u, "cost": "0.001"}


def tool_reply(*calls: tuple[str, str, str]) -> dict[str, Any]:
    return {
        "model": "m1",
        "content": None,
        "finish_reason": "tool_calls",
        "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
            for cid, name, args in calls
        ],
        "cost": "0.002",
    }
