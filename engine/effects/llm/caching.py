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
from itertools import accumulate
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


_HEAD_KINDS = ("definition", "system")


def choose(
    kinds: Sequence[str], sizes: Sequence[int], minimum: int, *, unmarkable: Sequence[int] = ()
) -> list[int]:
    """The indices of the prompt's pieces to mark, given each piece's kind in render
    order ("definition" for a tool definition, "system", or a message's role: "user",
    "assistant", "tool" for tool results) and its encoded bytes: the last tool, the last
    system piece, the end of the previous turn (the message before the newest user
    message) and the last message, each only when the prefix it closes reaches `minimum`
    tokens (estimated), never more than MAX_BREAKPOINTS. Linear in C: a call's history
    can be long."""
    reach = list(accumulate(sizes))
    backwards = list(reversed(kinds))
    last = len(kinds) - 1
    ends: list[int] = []
    for kind in _HEAD_KINDS:
        if kind in backwards:
            ends.append(last - backwards.index(kind))
    newest = _message_before(kinds, len(kinds))
    if newest is not None:
        ends.append(newest)
    if "user" in backwards:
        previous = _message_before(kinds, last - backwards.index("user"))
        if previous is not None:
            ends.append(previous)
    enough = minimum * BYTES_PER_TOKEN
    chosen = sorted({i for i in ends if i not in unmarkable and reach[i] >= enough})
    return chosen[-MAX_BREAKPOINTS:]


def _message_before(kinds: Sequence[str], index: int) -> int | None:
    """The last message (not a tool definition or system piece) before `index`."""
    for i in range(index - 1, -1, -1):
        if kinds[i] not in _HEAD_KINDS:
            return i
    return None


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
