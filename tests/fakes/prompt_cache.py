"""The vendors' prompt caches, as the fake vendor keeps them (docs/prompt-caching.md).

A request is read as a list of segments in the vendor's render order (tools, system,
messages: a message's content blocks, or its text, one segment each), each counted in
the fake's tokens (characters of its text, or a tool's JSON, // 4, as the fake bills a
request). Two rules:

- Anthropic (its Messages API, and Anthropic models on OpenRouter): only the prefixes
  ending at a block marked `cache_control` are written, when at least the model's minimum
  long; a breakpoint reads the longest prefix written before that ends on it or up to 20
  blocks before it. More than 4 breakpoints is refused (400, Anthropic's own message).
  Usage: cache_read (tokens read), cache_write (tokens written past what was read), and
  the rest uncached.
- OpenAI (automatic): every request's prefixes are kept; a request reads the longest
  prefix seen before, counted when at least 1024 tokens, in steps of 128 tokens.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import orjson

MAX_BREAKPOINTS = 4
LOOKBACK = 20  # blocks Anthropic looks back from a breakpoint for an earlier write
OPENAI_MIN, OPENAI_STEP = 1024, 128

# Anthropic's minimum cacheable prompt length, tokens, by model name prefix; others 1024.
_ANTHROPIC_MIN = (
    ("claude-opus-4-5", 4096),
    ("claude-opus-4-6", 4096),
    ("claude-haiku-4-5", 4096),
    ("claude-3-5-haiku", 2048),
    ("claude-3-haiku", 2048),
)


@dataclass(frozen=True)
class CacheUse:
    """What one request read from and wrote to the cache, in the fake's tokens."""

    read: int = 0
    write: int = 0


@dataclass(frozen=True)
class TooManyBreakpoints:
    """A request Anthropic refuses: `found` blocks carry cache_control."""

    found: int

    @property
    def message(self) -> str:
        return (
            f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. "
            f"Found {self.found}."
        )


@dataclass(frozen=True)
class _Segment:
    digest: bytes  # of the whole prefix ending here
    tokens: int  # of the whole prefix ending here
    marked: bool


def text_chars(value: Any, key: str | None = None) -> int:
    """Characters of text: strings under `content`, `text` or `system` (the fake's count)."""
    if isinstance(value, str):
        return len(value) if key in ("content", "text", "system") else 0
    if isinstance(value, dict):
        return sum(text_chars(v, k) for k, v in value.items())
    if isinstance(value, list):
        return sum(text_chars(item, key) for item in value)
    return 0


def tool_chars(tool: Any) -> int:
    """Characters of a tool definition: its compact JSON, without cache_control."""
    if isinstance(tool, dict):
        tool = {k: v for k, v in tool.items() if k != "cache_control"}
    return len(json.dumps(tool, separators=(",", ":"), ensure_ascii=False))


def anthropic_min(model: str) -> int:
    """Anthropic's minimum cacheable prefix for `model` (a router prefix is dropped)."""
    name = model.rsplit("/", 1)[-1].lower().replace(".", "-")
    return next((n for prefix, n in _ANTHROPIC_MIN if name.startswith(prefix)), 1024)


class PromptCaches:
    """Every prefix written, by vendor family and model; a fake vendor's lifetime is far
    shorter than the vendors' 5-minute time to live, so nothing expires."""

    def __init__(self) -> None:
        self._written: dict[tuple[str, str], set[bytes]] = {}

    def anthropic(self, body: dict[str, Any], *, chat: bool) -> CacheUse | TooManyBreakpoints:
        """Anthropic's rule, for a Messages body or (`chat`) a Chat Completions one."""
        segments = _segments(body, chat=chat)
        marks = [i for i, s in enumerate(segments) if s.marked]
        if len(marks) > MAX_BREAKPOINTS:
            return TooManyBreakpoints(len(marks))
        written = self._written.setdefault(("anthropic", str(body.get("model"))), set())
        minimum = anthropic_min(str(body.get("model") or ""))
        read_at = -1
        for mark in marks:
            for j in range(mark, max(-1, mark - LOOKBACK - 1), -1):
                if segments[j].digest in written:
                    read_at = max(read_at, j)
                    break
        read = segments[read_at].tokens if read_at >= 0 else 0
        write = 0
        for mark in marks:
            if segments[mark].tokens >= minimum:
                written.add(segments[mark].digest)
                if mark > read_at:
                    write = segments[mark].tokens - read
        return CacheUse(read=read, write=write)

    def openai(self, body: dict[str, Any]) -> CacheUse:
        """OpenAI's automatic rule: the longest prefix seen before, from 1024 tokens in
        steps of 128.

        Only prefixes of at least 1024 tokens are kept and looked up: a shorter one can
        never be the read (a digest names one prefix, so one size). A request shorter
        than that is not hashed at all."""
        pieces = _pieces(body, chat=True)
        if sum(size for _, size, _ in pieces) // 4 < OPENAI_MIN:
            return CacheUse()
        segments = [s for s in _digests(pieces) if s.tokens >= OPENAI_MIN]
        written = self._written.setdefault(("openai", str(body.get("model"))), set())
        common = max((s.tokens for s in segments if s.digest in written), default=0)
        written.update(s.digest for s in segments)
        if common < OPENAI_MIN:
            return CacheUse()
        return CacheUse(read=OPENAI_MIN + (common - OPENAI_MIN) // OPENAI_STEP * OPENAI_STEP)


def _segments(body: dict[str, Any], *, chat: bool) -> list[_Segment]:
    """The request's blocks in render order, each with the digest and size of the prefix
    it ends; cache_control itself is no part of what is cached."""
    return _digests(_pieces(body, chat=chat))


def _pieces(body: dict[str, Any], *, chat: bool) -> list[tuple[Any, int, bool]]:
    """The request's blocks in render order: (what it is, its characters, marked)."""
    pieces: list[tuple[Any, int, bool]] = []
    for tool in body.get("tools") or ():
        pieces.append(_piece(("tool", tool), tool_chars(tool), tool))
    if not chat:
        system = _blocks(body.get("system"))
        for block in system:
            pieces.append(_piece(("system", block), text_chars(block), block))
    for message in body.get("messages") or ():
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        rest = {k: v for k, v in message.items() if k not in ("content", "tool_calls")}
        content = message.get("content")
        if isinstance(content, str):  # one text block: its characters are the string's
            block = {"type": "text", "text": content}
            pieces.append(((rest, 0, block), len(content), False))
        elif isinstance(content, list):
            for index, block in enumerate(_blocks(content)):
                pieces.append(_piece((rest, index, block), text_chars(block, "content"), block))
        else:
            pieces.append(((rest, content), 0, False))
        for call in message.get("tool_calls") or ():
            pieces.append(_piece((role, call), 0, call))
    return pieces


def _digests(pieces: list[tuple[Any, int, bool]]) -> list[_Segment]:
    """Each piece with the digest and size of the prefix it ends (its JSON with sorted keys,
    chained)."""
    segments: list[_Segment] = []
    digest, chars = b"", 0
    for what, size, marked in pieces:
        chars += size
        digest = hashlib.sha256(digest + _canonical(what)).digest()
        segments.append(_Segment(digest, chars // 4, marked))
    return segments


def _blocks(content: Any) -> list[Any]:
    """Content as blocks: a string is the one text block it stands for (the vendors render
    both alike, so marking a message's text does not change its prefix)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content) if isinstance(content, list) else []


def _piece(what: Any, size: int, block: Any) -> tuple[Any, int, bool]:
    """A block without its cache_control (which does not change the prefix), and whether
    it had one."""
    if isinstance(block, dict) and "cache_control" in block:
        plain = {k: v for k, v in block.items() if k != "cache_control"}
        what = (*what[:-1], plain)
        return what, size, True
    return what, size, False


def _canonical(what: Any) -> bytes:
    """JSON with sorted keys: the same piece always gives the same bytes (orjson, which
    refuses integers past 64 bits: those go through the json module)."""
    try:
        return orjson.dumps(what, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:
        return json.dumps(what, sort_keys=True).encode()
