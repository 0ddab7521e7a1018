"""Prompt caching: where a request's cache breakpoints go, and what carries them.

Anthropic caches a prompt only up to the blocks marked `cache_control`, at most four of
them, and only a prefix of at least a model's minimum length; OpenRouter passes the same
markers, on content parts, to Anthropic models. OpenAI caches by itself: all it needs is a
prefix that stays the same from call to call (the body's order, openai.build_request).
Facts and sources: docs/prompt-caching.md.

Pure: no I/O. The breakpoints, in Anthropic's render order (tools, system, messages):
the last tool, the last system block, the last message of the previous turn (the
message before the newest user message) and the newest message, whose prefix the next
call of the turn, or the next turn, reads back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

EPHEMERAL = {"type": "ephemeral"}
MAX_BREAKPOINTS = 4  # Anthropic refuses a fifth block with cache_control

# Minimum cacheable prefix, in tokens, by model name prefix (Anthropic's table); others 1024.
_MIN_TOKENS = (
    ("claude-opus-4-5", 4096),
    ("claude-opus-4-6", 4096),
    ("claude-haiku-4-5", 4096),
    ("claude-3-5-haiku", 2048),
    ("claude-3-haiku", 2048),
)
DEFAULT_MIN_TOKENS = 1024
BYTES_PER_TOKEN = 4  # an estimate: a token is about four bytes of JSON-encoded English

_NOT_MARKABLE = frozenset({"thinking", "redacted_thinking"})


@dataclass(frozen=True)
class Caching:
    """How one call asks for caching.

    Attributes:
        style: "anthropic" (Messages: tools, system and content blocks carry the markers)
            or "parts" (OpenRouter's Chat Completions: content parts carry them).
        min_tokens: the model's minimum cacheable prefix.
    """

    style: str
    min_tokens: int


def caching_for(vendor: str, model: str, enabled: bool) -> Caching | None:
    """The breakpoints' style for a call, or None: caching off, or a vendor that caches
    without being asked (OpenAI, and OpenRouter's non-Anthropic models)."""
    if not enabled:
        return None
    if vendor == "anthropic":
        return Caching("anthropic", min_tokens(model))
    if vendor == "openrouter" and model.lower().startswith("anthropic/"):
        return Caching("parts", min_tokens(model))
    return None


def min_tokens(model: str) -> int:
    """The minimum cacheable prefix of an Anthropic model (router and date parts ignored)."""
    name = model.rsplit("/", 1)[-1].lower().replace(".", "-")
    for prefix, tokens in _MIN_TOKENS:
        if name.startswith(prefix):
            return tokens
    return DEFAULT_MIN_TOKENS


@dataclass(frozen=True)
class Unit:
    """One piece of the prompt in render order: `kind` is "tool" (a definition),
    "system", or a message's: "user", "assistant", "result" (tool results); `size` its
    encoded bytes; `markable` whether a marker can go on it."""

    kind: str
    size: int
    markable: bool = True


def choose(units: Sequence[Unit], minimum: int) -> list[int]:
    """The indices of the units to mark: the last tool, the last system unit, the end of
    the previous turn and the last message, each only when the prefix it closes reaches
    `minimum` tokens (estimated), never more than MAX_BREAKPOINTS (the latest kept)."""
    reach: list[int] = []
    prefix = 0
    for unit in units:
        prefix += unit.size
        reach.append(prefix)
    ends: list[int] = []
    for kind in ("tool", "system"):
        found = [i for i, u in enumerate(units) if u.kind == kind]
        if found:
            ends.append(found[-1])
    conversation = [i for i, u in enumerate(units) if u.kind not in ("tool", "system")]
    users = [i for i in conversation if units[i].kind == "user"]
    if users:
        before = [i for i in conversation if i < users[-1]]
        if before:
            ends.append(before[-1])
    if conversation:
        ends.append(conversation[-1])
    enough = minimum * BYTES_PER_TOKEN
    chosen = sorted({i for i in ends if units[i].markable and reach[i] >= enough})
    return chosen[-MAX_BREAKPOINTS:]


# --- markers on vendor shapes -----------------------------------------------------------


def mark_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic tool definition carrying a breakpoint."""
    return {**tool, "cache_control": dict(EPHEMERAL)}


def mark_system(system: Any) -> Any:
    """Anthropic's `system` (a string or text blocks) with a breakpoint on its last block."""
    blocks = [{"type": "text", "text": system}] if isinstance(system, str) else list(system)
    return _mark_last(blocks)


def mark_message(message: dict[str, Any]) -> dict[str, Any] | None:
    """A message (Anthropic's, or OpenRouter's Chat Completions form) with a breakpoint on
    its last content block, or None when it has none that can carry one (an empty text, an
    assistant message of only tool calls in Chat Completions, only thinking blocks)."""
    content = message.get("content")
    if isinstance(content, str):
        if not content:
            return None
        blocks = [{"type": "text", "text": content}]
    elif isinstance(content, list) and content:
        blocks = list(content)
    else:
        return None
    marked = _mark_last(blocks)
    return None if marked is None else {**message, "content": marked}


def _mark_last(blocks: list[Any]) -> list[Any] | None:
    for i in range(len(blocks) - 1, -1, -1):
        block = blocks[i]
        if isinstance(block, dict) and block.get("type") not in _NOT_MARKABLE:
            if block.get("type") == "text" and not block.get("text"):
                continue
            blocks[i] = {**block, "cache_control": dict(EPHEMERAL)}
            return blocks
    return None
