"""Vendor usage objects → the neutral Usage shape, whose counts add up across vendors.

See SPEC.md §7: `input` is every input token, cached or not, so the adapters
differ only in which vendor field already includes the cache.
"""

from __future__ import annotations

from typing import Any


def neutral(
    *, uncached_input: int, cache_read: int, cache_write: int, output: int, provider: Any
) -> dict[str, Any]:
    """Returns a neutral Usage dict built from its disjoint parts."""
    total_input = uncached_input + cache_read + cache_write
    return {
        "input": total_input,
        "output": output,
        "uncached_input": uncached_input,
        "cache_read": cache_read,
        "cache_write": cache_write,
        "total": total_input + output,
        "provider": provider,
    }


def from_openai(raw: dict[str, Any]) -> dict[str, Any]:
    """Normalises OpenAI / OpenRouter usage, whose prompt_tokens include cached tokens."""
    details = raw.get("prompt_tokens_details") or {}
    prompt = count(raw.get("prompt_tokens"))
    cache_read = min(count(details.get("cached_tokens")), prompt)
    cache_write = min(count(details.get("cache_write_tokens")), prompt - cache_read)
    return neutral(
        uncached_input=prompt - cache_read - cache_write,
        cache_read=cache_read,
        cache_write=cache_write,
        output=count(raw.get("completion_tokens")),
        provider=raw,
    )


def from_anthropic(raw: dict[str, Any]) -> dict[str, Any]:
    """Normalises Anthropic usage, whose input_tokens exclude cache reads and writes."""
    return neutral(
        uncached_input=count(raw.get("input_tokens")),
        cache_read=count(raw.get("cache_read_input_tokens")),
        cache_write=count(raw.get("cache_creation_input_tokens")),
        output=count(raw.get("output_tokens")),
        provider=raw,
    )


def count(value: object) -> int:
    """Returns a token count, reading a missing or malformed one as 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
