"""Usage and cost arithmetic. Cost is a USD decimal string, added exactly."""

from __future__ import annotations

from decimal import Decimal

USAGE_KEYS = ("input", "output", "uncached_input", "cache_read", "cache_write", "total")


def add_usage(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    """Sum the normalised counts; `provider` (the vendor's raw form) is not summed."""
    return {k: int(a.get(k, 0)) + int(b.get(k, 0) or 0) for k in USAGE_KEYS}


def add_cost(a: str, b: str) -> str:
    """Costs are decimal strings, added exactly (floats would drift over a long session)."""
    total = Decimal(a) + Decimal(b)
    return format(total.normalize(), "f") if total else "0"
