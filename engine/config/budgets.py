"""`[[budgets]]` in subs.toml: the file's model of a budget policy, its checks across
entries, and its build.

Kept in one module beside the schema (schema.py reads it as one key of the file's root);
the policies themselves are the machine's (engine/machine/policies.py), which checks a
model call against their buckets.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

from engine.machine.policies import BudgetPolicy, window_ms

GroupKey = Literal["agent", "user", "channel", "session"]
_Name = Annotated[str, StringConstraints(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")]
_Value = Annotated[str, StringConstraints(min_length=1)]


def _window(value: str) -> str:
    window_ms(value)
    return value


def _unique(keys: list[GroupKey]) -> list[GroupKey]:
    if len(set(keys)) != len(keys):
        raise ValueError(f"names a key twice: {keys}")
    return keys


class BudgetEntry(BaseModel):
    """One `[[budgets]]` table as written."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    name: _Name
    group_by: Annotated[list[GroupKey], AfterValidator(_unique)] = Field(default_factory=list)
    dimension: Literal["total_tokens", "cost_usd"]
    limit: Annotated[float, Field(gt=0)]
    window: Annotated[str, AfterValidator(_window)]
    strategy: Literal["reject", "interrupt"] = "reject"
    match: dict[GroupKey, _Value] = Field(default_factory=dict)


def problems(entries: list[BudgetEntry], agents: set[str]) -> list[tuple[str, str]]:
    """What the entries get wrong together, each as (key, why): names must be unique, a
    token limit is a whole number, and a `match` on an agent names a declared one."""
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for i, e in enumerate(entries):
        agent = e.match.get("agent")
        if agent is not None and agent not in agents:
            declared = ", ".join(sorted(agents)) or "none"
            out.append((f"budgets.{i}.match.agent", f"no agent {agent!r}; declared: {declared}"))
        if e.name in seen:
            out.append((f"budgets.{i}.name", f"{e.name!r} names another [[budgets]] entry too"))
        seen.add(e.name)
        if e.dimension == "total_tokens" and not float(e.limit).is_integer():
            out.append((f"budgets.{i}.limit", f"a token limit is a whole number, got {e.limit}"))
    return out


def build(entries: list[BudgetEntry]) -> tuple[BudgetPolicy, ...]:
    """The checked entries as the machine's policies."""
    return tuple(
        BudgetPolicy(
            name=e.name,
            group_by=tuple(e.group_by),
            dimension=e.dimension,
            limit=format(Decimal(str(e.limit)).normalize(), "f"),
            window=e.window,
            window_ms=window_ms(e.window),
            strategy=e.strategy,
            match=tuple(sorted(e.match.items())),
        )
        for e in entries
    )
