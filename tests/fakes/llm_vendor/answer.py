"""One answer, vendor-neutral: what a scripted reply and the request make of it (text and
reasoning cut into stream pieces, tool calls with ids, the usage), before a vendor module
renders it in its own wire format.

Usage is deterministic: input = characters of the request's text and tools // 4 + 1, output =
words of the reply (+ a quarter of each tool call's arguments); the part of the input read
from or written to the prompt cache (`CacheUse`) is counted apart from the uncached rest.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.fakes.llm_vendor.script import CutStream, InStreamError, Text, ToolCalls
from tests.fakes.prompt_cache import CacheUse, tool_chars


@dataclass
class AnswerCall:
    """A tool call as the vendors send it: an id, a name and the arguments' JSON."""

    id: str
    name: str
    arguments: str  # json.dumps default style, as both vendors stream it


@dataclass
class Answer:
    """What the vendor answers, before its format: pieces of text and reasoning (one per
    stream chunk), tool calls, the neutral finish reason and the usage."""

    model: str
    text_pieces: list[str]
    reasoning_pieces: list[str]
    calls: list[AnswerCall]
    finish: str  # neutral: stop | length | tool_calls
    uncached: int
    cache_read: int
    cache_write: int
    output: int
    cost: str | None = None

    @property
    def text(self) -> str:
        return "".join(self.text_pieces)

    @property
    def reasoning(self) -> str:
        return "".join(self.reasoning_pieces)


@dataclass
class Frames:
    """A rendered stream: frames, and the index of the first one carrying the finish."""

    frames: list[bytes]
    finish_at: int


def split_words(text: str, chunks: int | None) -> list[str]:
    if not text:
        return []
    if chunks is None:
        return re.findall(r"\s*\S+\s*$|\s*\S+", text)
    size = max(1, -(-len(text) // max(1, chunks)))
    return [text[i : i + size] for i in range(0, len(text), size)]


def split_json(text: str) -> list[str]:
    return re.findall(r"\w+|\s+\w+|[^\w\s]+|\s+", text)


def request_text(body: Any) -> int:
    """Characters of the request's message text (content, text, system, tool results) and
    of its tool definitions (their JSON)."""
    total = 0

    def walk(value: Any, key: str | None) -> None:
        nonlocal total
        if isinstance(value, str):
            if key in ("content", "text", "system"):
                total += len(value)
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(v, k)
        elif isinstance(value, list):
            for item in value:
                walk(item, key)

    if isinstance(body, dict):
        walk({"system": body.get("system"), "messages": body.get("messages")}, None)
        total += sum(tool_chars(tool) for tool in body.get("tools") or ())
    return total


def build_answer(
    reply: Text | ToolCalls | CutStream | InStreamError,
    body: Any,
    use: CacheUse,
    new_call_id: Callable[[], str],
) -> Answer:
    """The answer `reply` makes to the request `body`; `new_call_id` draws a tool call's id in
    the route's vendor's style when the script names none."""
    uncached = request_text(body) // 4 + 1 - use.read - use.write
    model = body.get("model", "") if isinstance(body, dict) else ""
    if isinstance(reply, ToolCalls):
        ids = reply.ids or [new_call_id() for _ in reply.calls]
        calls = [
            AnswerCall(call_id, name, json.dumps(args, ensure_ascii=False))
            for call_id, (name, args) in zip(ids, reply.calls, strict=True)
        ]
        text = reply.text or ""
        output = len(text.split()) + sum(len(c.arguments) // 4 + 1 for c in calls)
        return Answer(
            model=model,
            text_pieces=split_words(text, None),
            reasoning_pieces=[],
            calls=calls,
            finish="tool_calls",
            uncached=uncached,
            cache_read=use.read,
            cache_write=use.write,
            output=output,
        )
    if isinstance(reply, Text):
        text, chunks, reasoning = reply.text, reply.chunks, reply.reasoning or ""
        cache_read, cache_write, finish, cost = (
            use.read + reply.cache_read,
            use.write + reply.cache_write,
            reply.finish,
            reply.cost,
        )
    else:  # CutStream / InStreamError: a text answer that will not finish
        text, chunks, reasoning = reply.text, None, ""
        cache_read, cache_write, finish, cost = use.read, use.write, "stop", None
    return Answer(
        model=model,
        text_pieces=split_words(text, chunks),
        reasoning_pieces=split_words(reasoning, None),
        calls=[],
        finish=finish,
        uncached=uncached,
        cache_read=cache_read,
        cache_write=cache_write,
        output=max(1, len(text.split()) + len(reasoning.split())),
        cost=cost,
    )
