"""The script a test writes: the replies it pushes (a text, tool calls, an HTTP error, a
stream cut short or meeting an error, raw bytes) and each request as the fake received it.

Replies are vendor-neutral; the route a request arrives on decides the wire format
(`answer.py` turns a reply into one answer, the vendor modules render it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Text:
    """A text answer.

    `chunks` splits the text into about that many stream chunks (default: one per
    word). `chunk_delay` is slept before each chunk (before a whole body, once);
    `end_delay` between a stream's last chunk and the end of its body, which over a
    real network can arrive in a packet of its own.
    `cache_read` / `cache_write` add that many cached input tokens to what the vendor's
    cache rule gives.
    `reasoning` adds Anthropic thinking / OpenRouter reasoning. `cost` is what
    OpenRouter reports (default: derived from the usage).
    """

    text: str
    chunks: int | None = None
    cache_read: int = 0
    cache_write: int = 0
    reasoning: str | None = None
    finish: str = "stop"
    cost: str | None = None
    chunk_delay: float = 0.0
    end_delay: float = 0.0


@dataclass
class ToolCalls:
    """Tool calls (parallel when several), with optional text before them."""

    calls: list[tuple[str, dict[str, Any]]]
    text: str | None = None
    chunk_delay: float = 0.0
    ids: list[str] | None = None  # the calls' ids; default: the vendor's own style, random


@dataclass
class HttpError:
    """An HTTP error answer; `body` defaults to the vendor's own body for the status."""

    status: int
    retry_after: float | None = None
    body: dict[str, Any] | None = None


@dataclass
class CutStream:
    """A stream that starts fine and stops before its finish reason.

    `abort=True` closes the connection mid-body; False ends the body cleanly.
    """

    after_chunks: int
    text: str = "this answer will never reach its end"
    abort: bool = True


@dataclass
class InStreamError:
    """A 200 stream that reports an error event/chunk after `after_chunks` chunks."""

    after_chunks: int = 1
    text: str = "this answer meets an error on its way"


@dataclass
class Raw:
    """Bytes sent as they are, for answers no vendor should send."""

    body: bytes
    status: int = 200
    content_type: str = "application/json"


Reply = Text | ToolCalls | HttpError | CutStream | InStreamError | Raw


@dataclass
class Recorded:
    """One request as the fake received it (header names in lower case); `peer` is the
    client's address and port, one per connection."""

    path: str
    headers: dict[str, str]
    body: Any
    received: float
    peer: str = ""
    raw: bytes = b""  # the body's bytes as they arrived
