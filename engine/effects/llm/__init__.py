"""LLM provider layer: neutral LlmRequest in, neutral LlmResponse out (SPEC.md §7).

`complete` makes the call; the vendor modules `openai` (also OpenRouter) and
`anthropic` hold the pure conversions, usable without I/O.
"""

from engine.effects.llm import anthropic, openai, prices
from engine.effects.llm.client import LlmTarget, complete
from engine.effects.llm.errors import ProviderError

__all__ = ["LlmTarget", "ProviderError", "anthropic", "complete", "openai", "prices"]
