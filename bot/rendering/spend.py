"""What a turn spent, as one line of a Slack reply: a stop by its budget, or its cost.

A turn its budget stopped fails with `budget_exceeded` and a `detail` naming the limit
and the figures (engine/machine/budgets.py): the reply says so in words a person reads,
built from those figures rather than the error's own message. An agent may also show each
turn's cost under its reply (`[agent.<id>.slack] show_cost`): the figures the turn's events
already carry (`turn.completed` / `turn.failed` cost and usage, its call requests), so it
costs no request. Pure: no Slack, no engine.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

BUDGET_EXCEEDED = "budget_exceeded"

# A limit's figures as a person reads them: money, or a count of what.
_COUNTED = {
    "max_model_calls": "model calls",
    "max_tool_calls": "tool calls",
    "max_tokens": "tokens",
}


def money(cost: Any) -> str:
    """USD as the console shows it: 6 places under a cent, else 4 ("$0.000042", "$0.0123")."""
    value = _decimal(cost)
    if value is None or value.is_zero():
        return "$0"
    places = Decimal("0.000001") if abs(value) < Decimal("0.01") else Decimal("0.0001")
    return f"${value.quantize(places)}"


def _decimal(value: Any) -> Decimal | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return Decimal(str(value))
    except InvalidOperation:
        return None


def _count(value: Any) -> str:
    number = _decimal(value)
    return f"{int(number):,}" if number is not None and number == int(number) else str(value)


def budget_stop(error: Any) -> str | None:
    """The line for a turn its budget stopped ("Stopped by its budget: this turn has spent
    $0.0123 of $0.01 (max_cost_usd); the next call was not made."), or None for any other
    failure, or a budget error without its figures."""
    if not isinstance(error, dict) or error.get("code") != BUDGET_EXCEEDED:
        return None
    detail = error.get("detail")
    if not isinstance(detail, dict):
        return None
    limit, spent, allowed = detail.get("limit"), detail.get("spent"), detail.get("allowed")
    if not isinstance(limit, str) or spent is None or allowed is None:
        return None
    if limit.startswith("policy:"):
        return _policy_stop(detail, spent, allowed)
    key = limit.removeprefix("session.")
    scope = "this session" if limit != key else "this turn"
    if key == "max_cost_usd":
        figures = f"{money(spent)} of {money(allowed)}"
    elif key in _COUNTED:
        figures = f"{_count(spent)} of {_count(allowed)} {_COUNTED[key]}"
    else:
        return None
    return (
        f"Stopped by its budget: {scope} has spent {figures} ({limit}); the next call was not made."
    )


def _policy_stop(detail: dict[str, Any], spent: Any, allowed: Any) -> str:
    """A `[[budgets]]` policy's stop: which policy and bucket, its figures, when it frees up
    ("Stopped by budget policy per-user (user=slack:U1): 443 of 300 tokens used in its
    window; it frees up at 2026-12-06 07:00 UTC; the next call was not made.")."""
    cost = detail.get("dimension") == "cost_usd"
    if cost:
        figures = f"{money(spent)} of {money(allowed)}"
    else:
        figures = f"{_count(spent)} of {_count(allowed)} tokens"
    group = f" ({_bucket(str(detail['group']))})" if detail.get("group") else ""
    line = f"Stopped by budget policy {detail.get('policy')}{group}: {figures} used in its window"
    frees = detail.get("frees_at")
    nxt, whole = _decimal(detail.get("next")), _decimal(allowed)
    if isinstance(frees, str) and len(frees) >= 16:
        line += f"; it frees up at {frees[:10]} {frees[11:16]} UTC"
    elif nxt is not None and whole is not None and nxt > whole:
        # Nothing to wait for: this one call would cross the whole limit by itself.
        needs = money(nxt) if cost else f"{_count(nxt)} tokens"
        line += f"; the next call alone would need about {needs}, more than the whole limit"
    return line + "; the next call was not made."


def _bucket(group: str) -> str:
    """A bucket's keys as Slack shows them: a Slack person as a mention (`<@U…>`, their name
    on screen: it is the person whose turn was stopped), a Slack channel as its link; any
    other key as it is (`user=cli:bob`, `agent=oncall`)."""
    shown = []
    for pair in group.split(","):
        key, _, value = pair.partition("=")
        if key == "user" and value.startswith("slack:"):
            shown.append(f"<@{value.removeprefix('slack:')}>")
        elif key == "channel" and value[:1] in ("C", "G"):
            shown.append(f"<#{value}>")
        else:
            shown.append(pair)
    return ", ".join(shown)


def spend_line(cost: Any, usage: Any, model_calls: int, tool_calls: int) -> str:
    """A turn's cost in one line: "$0.0123 · 3 model calls · 2 tool calls · 84% cache hits"
    (calls and cache hits only when there were any)."""
    parts = [money(cost)]
    for n, what in ((model_calls, "model call"), (tool_calls, "tool call")):
        if n:
            parts.append(f"{n} {what}{'' if n == 1 else 's'}")
    if isinstance(usage, dict):
        total = int(usage.get("input") or 0)
        read = int(usage.get("cache_read") or 0)
        if total and read:
            parts.append(f"{round(100 * read / total)}% cache hits")
    return " · ".join(parts)
