"""Retry policies (SPEC §11): defaults per effect kind, layered overrides, backoff."""

from __future__ import annotations

from typing import Any

# Backoff is ours to choose (the spec fixes the formula, not the numbers):
# wait before attempt n = min(base ** n, max) seconds.
_BACKOFF = {"backoff_base_secs": 2, "backoff_max_secs": 60}

DEFAULTS: dict[str, dict[str, Any]] = {
    "llm": {
        "queue_timeout_secs": 60,
        "run_timeout_secs": 180,
        "total_timeout_secs": 1800,
        "max_attempts": 5,
        **_BACKOFF,
    },
    "tool": {
        "queue_timeout_secs": None,
        "run_timeout_secs": 120,
        "total_timeout_secs": 600,
        "max_attempts": 1,
        **_BACKOFF,
    },
    "client_tool": {
        "queue_timeout_secs": None,
        "run_timeout_secs": None,
        "total_timeout_secs": None,
        "max_attempts": 1,
        **_BACKOFF,
    },
    "subagent": {
        "queue_timeout_secs": 30,
        "run_timeout_secs": 10,
        "total_timeout_secs": 3600,
        "max_attempts": 3,
        **_BACKOFF,
    },
    "decision": {
        "queue_timeout_secs": None,
        "run_timeout_secs": 20,
        "total_timeout_secs": 300,
        "max_attempts": 10,
        **_BACKOFF,
    },
}

# Which `retry.<kind>` block of an agent config applies to each effect kind.
_AGENT_KIND = {"llm": "llm", "tool": "tool", "client_tool": "tool", "subagent": "subagent"}


def _layer(policy: dict[str, Any], override: dict[str, Any] | None) -> None:
    if not override:
        return
    for key, value in override.items():
        # An override cannot make a timeout unbounded: None means "not named".
        if value is not None and key in policy:
            policy[key] = value


def resolve_policy(
    kind: str, agent: dict[str, Any] | None, action_retry: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Engine default → agent `retry.default` → agent `retry.<kind>` → the action's own `retry`."""
    policy = dict(DEFAULTS[kind])
    retry = (agent or {}).get("retry") or {}
    _layer(policy, retry.get("default"))
    agent_kind = _AGENT_KIND.get(kind)
    if agent_kind:
        _layer(policy, retry.get(agent_kind))
    _layer(policy, action_retry)
    return policy


def backoff_ms(policy: dict[str, Any], attempt: int) -> int:
    """Wait before `attempt` (2 for the first retry)."""
    base = policy["backoff_base_secs"]
    return int(min(base**attempt, policy["backoff_max_secs"]) * 1000)


def run_deadline(policy: dict[str, Any], now: int) -> int | None:
    run = policy.get("run_timeout_secs")
    return None if run is None else now + run * 1000


def past_total(policy: dict[str, Any], started_at: int, at: int) -> bool:
    total = policy.get("total_timeout_secs")
    return total is not None and at - started_at > total * 1000
