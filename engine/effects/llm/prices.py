"""What a call cost, in USD, when the vendor does not say.

Prices are USD per million tokens, as the vendors published them for these
models (Anthropic cache writes at the 5-minute rate; OpenAI charges no cache
write, so its write price is the input price). All arithmetic is Decimal:
costs accumulate across turns and sessions, and float sums drift.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

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


def price_for(model: str) -> Price | None:
    """Returns the price of `model`, matched by the longest known prefix, or None.

    A router's vendor prefix is dropped ("anthropic/claude-sonnet-4-5"), and so
    is a dated suffix ("claude-haiku-4-5-20251001"); OpenRouter's dotted
    versions ("claude-sonnet-4.5") match their dashed names.
    """
    name = model.rsplit("/", 1)[-1].lower()
    for candidate in (name, name.replace(".", "-")):
        best = max((key for key in PRICES if _has_prefix(candidate, key)), key=len, default=None)
        if best is not None:
            return PRICES[best]
    return None


def _has_prefix(name: str, key: str) -> bool:
    """Whether `key` starts `name` and ends at a boundary ("gpt-4.1" is no prefix of "gpt-4.10")."""
    if not name.startswith(key):
        return False
    rest = name[len(key) :]
    return not rest or not (rest[0].isalnum() or rest[0] == ".")


def cost(model: str, usage: dict[str, Any]) -> str:
    """Returns the USD cost of a call from the price table; an unknown model costs "0"."""
    price = price_for(model)
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
