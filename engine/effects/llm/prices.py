"""What a call cost, in USD, when the vendor does not say.

Prices are USD per million tokens, as the vendors published them for these
models (Anthropic cache writes at the 5-minute rate; OpenAI charges no cache
write, so its write price is the input price). All arithmetic is Decimal:
costs accumulate across turns and sessions, and float sums drift.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from engine.config import AgentDecl, Project

# A block's own prices (`[llm.<id>] prices`): model -> {input, output, cache_read,
# cache_write} as decimal strings, USD per million tokens (engine/config/build.py).
Extra = Mapping[str, Mapping[str, str]]
T = TypeVar("T")

_MILLION = Decimal(1_000_000)


@dataclass(frozen=True)
class Price:
    """USD per million tokens, by kind of token."""

    input: Decimal
    output: Decimal
    cache_read: Decimal
    cache_write: Decimal


def _price(input: str, output: str, cache_read: str, cache_write: str) -> Price:
    return Price(Decimal(input), Decimal(output), Decimal(cache_read), Decimal(cache_write))


PRICES: dict[str, Price] = {
    "claude-opus-4-1": _price("15", "75", "1.50", "18.75"),
    "claude-sonnet-4-5": _price("3", "15", "0.30", "3.75"),
    "claude-haiku-4-5": _price("1", "5", "0.10", "1.25"),
    "gpt-4.1": _price("2", "8", "0.50", "2"),
    "gpt-4.1-mini": _price("0.40", "1.60", "0.10", "0.40"),
    "gpt-4.1-nano": _price("0.10", "0.40", "0.025", "0.10"),
    "gpt-4o": _price("2.50", "10", "1.25", "2.50"),
    "gpt-4o-mini": _price("0.15", "0.60", "0.075", "0.15"),
}


def price_for(model: str, extra: Extra | None = None) -> Price | None:
    """Returns the price of `model`, matched by the longest known prefix, or None; a
    block's own `prices` (`extra`, matched the same way) come before the table.

    A router's vendor prefix is dropped ("anthropic/claude-sonnet-4-5"), and so
    is a dated suffix ("claude-haiku-4-5-20251001"); OpenRouter's dotted
    versions ("claude-sonnet-4.5") match their dashed names.
    """
    if extra:
        own = {k.lower(): v for k, v in extra.items()}
        if model.lower() in own:
            return _price(**own[model.lower()])
        found = _lookup(model, {k.rsplit("/", 1)[-1]: v for k, v in own.items()})
        if found is not None:
            return _price(**found)
    return _lookup(model, PRICES)


def _lookup(model: str, table: Mapping[str, T]) -> T | None:
    name = model.rsplit("/", 1)[-1].lower()
    for candidate in (name, name.replace(".", "-")):
        best = max((key for key in table if _has_prefix(candidate, key)), key=len, default=None)
        if best is not None:
            return table[best]
    return None


def _has_prefix(name: str, key: str) -> bool:
    """Whether `key` starts `name` and ends at a boundary ("gpt-4.1" is no prefix of "gpt-4.10")."""
    if not name.startswith(key):
        return False
    rest = name[len(key) :]
    return not rest or not (rest[0].isalnum() or rest[0] == ".")


def cost(model: str, usage: dict[str, Any], extra: Extra | None = None) -> str:
    """Returns the USD cost of a call from the price table (and a block's own `extra`);
    an unknown model costs "0" (a cost budget refuses one at `subs check`: `unpriced`)."""
    price = price_for(model, extra)
    if price is None:
        return "0"
    total = (
        usage["uncached_input"] * price.input
        + usage["cache_read"] * price.cache_read
        + usage["cache_write"] * price.cache_write
        + usage["output"] * price.output
    )
    return usd(total / _MILLION)


def usd(amount: Decimal | float | int | str) -> str:
    """Returns `amount` as a plain decimal string, never with an exponent ("0.00000735").

    A float is read through its shortest repr, so 7.35e-06 becomes exactly 0.00000735.
    """
    value = amount if isinstance(amount, Decimal) else Decimal(str(amount))
    if value.is_zero():
        return "0"
    return format(value.normalize(), "f")


def reprice(response: dict[str, Any], extra: Extra) -> dict[str, Any]:
    """A reply's cost by its block's own `prices` when they name its model and the vendor
    reported no cost of its own (OpenRouter's `usage.cost` stands)."""
    usage = response.get("usage")
    model = str(response.get("model") or "")
    if not extra or not isinstance(usage, dict) or price_for(model, extra) is None:
        return response
    provider = usage.get("provider")
    if isinstance(provider, dict) and isinstance(provider.get("cost"), int | float):
        return response
    return {**response, "cost": cost(model, usage, extra)}


def agent_price(project: Project, agent: AgentDecl) -> Price | None:
    """The price of an agent's model: its block's own `prices`, then the table."""
    block = project.llm.get(agent.llm or "")
    return price_for(agent.model or "", block.prices if block is not None else None)


def unpriced(project: Project) -> list[tuple[str, str]]:
    """The agents with a limit in USD whose model has no known price, each with why: their
    spend could not be counted, so the limit would never hold (`subs check` refuses)."""
    out = []
    for agent in project.agents.values():
        if agent.cost_limited and agent.model and agent_price(project, agent) is None:
            which = "budget" if "max_cost_usd" in (agent.budget or {}) else "session_budget"
            out.append(
                (
                    f"agent.{agent.id}.{which}.max_cost_usd",
                    f"a limit in USD, but no known price for model "
                    f"{agent.model!r}: set [llm.{agent.llm}] prices = "
                    f'{{ "{agent.model}" = {{ input = ..., output = ... }} }} (USD per '
                    "million tokens)",
                )
            )
    for i, policy in enumerate(project.budgets):
        if policy.dimension != "cost_usd":
            continue
        only = dict(policy.match).get("agent")
        for agent in project.agents.values():
            if only not in (None, agent.id) or not agent.model:
                continue
            if agent_price(project, agent) is None:
                out.append(
                    (
                        f"budgets.{i}.dimension",
                        f"counts USD, but agent {agent.id!r}'s model {agent.model!r} has no "
                        f"known price: set [llm.{agent.llm}] prices = "
                        f'{{ "{agent.model}" = {{ input = ..., output = ... }} }}',
                    )
                )
                break
    return out


def with_prices(project: Project, config: dict[str, Any] | None, agent: AgentDecl) -> Any:
    """An agent's wire config with its model's input and cache-read prices in `budget.price`
    (`session_budget.price` when it has only that), which the machine estimates a call's
    cost with (engine/machine/budgets.py); a `[[budgets]]` policy in USD needs them too,
    budget or not (in `budget.price` then)."""
    cost_policy = any(p.dimension == "cost_usd" for p in project.budgets)
    if config is None or not ("budget" in config or "session_budget" in config or cost_policy):
        return config
    price = agent_price(project, agent)
    if price is None:
        return config
    key = "session_budget" if "session_budget" in config and "budget" not in config else "budget"
    priced = {"input": usd(price.input), "cache_read": usd(price.cache_read)}
    return {**config, key: {**config.get(key, {}), "price": priced}}
