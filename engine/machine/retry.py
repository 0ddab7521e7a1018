"""Retries (SPEC §11), for every effect kind: policies, backoff, what follows a failure.

The one place that decides whether a failed attempt of a model call, a tool call, a
subagent call or a worker decision is tried again, when, and whether a failure the
engine names itself is worth another attempt (`Fault`). Errors from outside come with
their own verdict: a vendor's is classed by its adapter (engine/effects/llm/errors.py), a
worker's delivery by engine/effects/delivery.py, a client's or worker's tool error says so.
A new call kind names one of these policies, or brings its own (`CallKind.retry_defaults`,
merged into the table of kinds it is built into, core.py `Kinds`): nothing in this file
changes, and nothing here is changed at run time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypedDict

from .shapes import POLICY_KEYS, ErrorInfo, RetryPolicy


# Backoff is ours to choose (the spec fixes the formula, not the numbers):
# wait before attempt n = min(base ** n, max) seconds.
class Backoff(TypedDict):
    """The backoff half of a policy, which every built-in one shares."""

    backoff_base_secs: int
    backoff_max_secs: int


BACKOFF: Backoff = {"backoff_base_secs": 2, "backoff_max_secs": 60}

# The built-in policies, by name (a kind's own are added by the table it is built into).
DEFAULTS: Mapping[str, RetryPolicy] = {
    "llm": {
        "queue_timeout_secs": 60,
        "run_timeout_secs": 180,
        "total_timeout_secs": 1800,
        "max_attempts": 5,
        **BACKOFF,
    },
    "tool": {
        "queue_timeout_secs": None,
        "run_timeout_secs": 120,
        "total_timeout_secs": 600,
        "max_attempts": 1,
        **BACKOFF,
    },
    "client_tool": {
        "queue_timeout_secs": None,
        "run_timeout_secs": None,
        "total_timeout_secs": None,
        "max_attempts": 1,
        **BACKOFF,
    },
    "subagent": {
        "queue_timeout_secs": 30,
        "run_timeout_secs": 10,
        "total_timeout_secs": 3600,
        "max_attempts": 3,
        **BACKOFF,
    },
    "decision": {
        "queue_timeout_secs": None,
        "run_timeout_secs": 20,
        "total_timeout_secs": 300,
        "max_attempts": 10,
        **BACKOFF,
    },
    # A turn queued behind the running one (turns.py): no limit unless the agent's
    # `retry.default.queue_timeout_secs` sets one. A person who sends a second message
    # while a long turn runs (Slack queues every message) should see it answered.
    "turn": {
        "queue_timeout_secs": None,
        "run_timeout_secs": None,
        "total_timeout_secs": None,
        "max_attempts": 1,
        **BACKOFF,
    },
}

# Which `retry.<block>` of an agent config applies to each built-in policy.
AGENT_BLOCKS: Mapping[str, str] = {
    "llm": "llm",
    "tool": "tool",
    "client_tool": "tool",
    "subagent": "subagent",
}


class Fault(Enum):
    """A failure the engine names itself: its ErrorInfo code, and whether it is retryable."""

    LOST = ("internal", True)  # the engine running the attempt stopped
    DEADLINE = ("deadline_exceeded", True)  # the attempt ran past its run deadline
    INVALID_RESPONSE = ("invalid_response", True)  # the worker's answer cannot be applied
    UNROUTABLE = ("unroutable", False)  # nothing can run the call
    BAD_OUTPUT = ("handler_error", False)  # the result breaks the tool's output schema
    CHILD_DEADLINE = ("deadline_exceeded", False)  # a subagent's whole run is over its time

    def __init__(self, code: str, retryable: bool) -> None:
        self.code = code
        self.retryable = retryable

    def error(self, message: str) -> ErrorInfo:
        """An ErrorInfo with this fault's code."""
        return {"message": message, "code": self.code}


@dataclass(frozen=True)
class Next:
    """What follows a failed attempt."""

    final: bool  # no other attempt
    due: int  # when the next attempt starts (epoch ms): `now` for at once
    timed_out: bool  # final only because the total timeout would pass before it


def after_failure(
    policy: RetryPolicy,
    attempt: int,
    started_at: int,
    now: int,
    *,
    retryable: bool,
    retry_after: float | None = None,
    at_once: bool = False,
    counted: bool = True,
    total: RetryPolicy | None = None,
) -> Next:
    """Attempt `attempt` of an effect started at `started_at` failed: try again, or not.

    Args:
        policy: the resolved policy that counts attempts and sets the backoff.
        retry_after: the wait the other side asked for, in seconds (at least that long).
        at_once: no backoff (the attempt was lost, not refused).
        counted: whether this attempt counts against `max_attempts`.
        total: the policy whose `total_timeout_secs` bounds the effect (`policy`'s if None).
    """
    nxt = attempt + 1
    wait = 0 if at_once else backoff_ms(policy, nxt)
    if retry_after is not None:
        wait = max(wait, int(retry_after * 1000))
    due = now + wait
    if not retryable or (counted and nxt > policy["max_attempts"]):
        return Next(final=True, due=due, timed_out=False)
    if past_total(policy if total is None else total, started_at, due):
        return Next(final=True, due=due, timed_out=True)
    return Next(final=False, due=due, timed_out=False)


def own_policy(name: str, given: Mapping[str, Any]) -> RetryPolicy:
    """A kind's own policy `name` (`CallKind.retry_defaults`): the built-in backoff under
    what the kind gives, which must name `max_attempts` and only a policy's keys."""
    unknown = sorted(set(given) - set(POLICY_KEYS))
    if unknown or "max_attempts" not in given:
        problem = f"names {', '.join(unknown)}" if unknown else "has no max_attempts"
        raise ValueError(f"retry policy {name!r} {problem}")
    policy: RetryPolicy = {
        "backoff_base_secs": BACKOFF["backoff_base_secs"],
        "backoff_max_secs": BACKOFF["backoff_max_secs"],
        "max_attempts": given["max_attempts"],
    }
    for key in POLICY_KEYS:
        if key in given:
            policy[key] = given[key]
    return policy


def _layer(policy: RetryPolicy, override: Mapping[str, Any] | None) -> None:
    if not override:
        return
    for key in POLICY_KEYS:
        value = override.get(key)
        # An override cannot make a timeout unbounded: None means "not named".
        if value is not None and key in policy:
            policy[key] = value


def resolve_policy(
    kind: str,
    agent: dict[str, Any] | None,
    action_retry: Mapping[str, Any] | None = None,
    *,
    defaults: Mapping[str, RetryPolicy] = DEFAULTS,
    agent_blocks: Mapping[str, str] = AGENT_BLOCKS,
) -> RetryPolicy:
    """Engine default → agent `retry.default` → agent `retry.<kind>` → the action's own `retry`.

    `defaults` and `agent_blocks` are the built-in ones unless a table of kinds with
    policies of their own gives its (core.py `Kinds.policy`)."""
    policy = defaults[kind].copy()
    retry = (agent or {}).get("retry") or {}
    _layer(policy, retry.get("default"))
    agent_kind = agent_blocks.get(kind)
    if agent_kind:
        _layer(policy, retry.get(agent_kind))
    _layer(policy, action_retry)
    return policy


def backoff_ms(policy: RetryPolicy, attempt: int) -> int:
    """Wait before `attempt` (2 for the first retry)."""
    base = policy["backoff_base_secs"]
    return int(min(base**attempt, policy["backoff_max_secs"]) * 1000)


def queue_deadline(policy: RetryPolicy, since: int) -> int | None:
    """When work asked for at `since` has waited too long to start (None: no limit)."""
    queue = policy.get("queue_timeout_secs")
    return None if queue is None else since + queue * 1000


def queue_timeout(what: str, policy: RetryPolicy) -> ErrorInfo:
    """The ErrorInfo of work that waited past its queue timeout: a `deadline_exceeded`
    (the closed set has no code of its own for it) whose detail names the queue."""
    secs = policy.get("queue_timeout_secs")
    return {
        "message": f"{what} waited longer than its queue timeout ({secs} s) to start",
        "code": "deadline_exceeded",
        "detail": {"timeout": "queue", "reason": "queue_timeout", "queue_timeout_secs": secs},
    }


def run_deadline(policy: RetryPolicy, now: int) -> int | None:
    """When an attempt started `now` must end; None for no run timeout."""
    run = policy.get("run_timeout_secs")
    return None if run is None else now + run * 1000


def past_total(policy: RetryPolicy, started_at: int, at: int) -> bool:
    """Whether a call started at `started_at` is past its total timeout at `at`."""
    total = policy.get("total_timeout_secs")
    return total is not None and at - started_at > total * 1000
