"""Trace and span ids derived from what a session records (W3C Trace Context, level 1).

A turn's trace id is a hash of its session and turn ids, unless the client that
started it passed its own `traceparent`: then the turn joins that trace. A span's id
is a hash of its trace and of what it is (the turn, a decision's attempt, a call's
attempt), so every process that sees the same facts names the same spans, and a
worker's request names the decision span it belongs to before that span is exported.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

__all__ = ["SpanContext", "parse_traceparent", "parse_tracestate", "span_id", "trace_id_for_turn"]

# version 00: 2 hex version, 32 hex trace id, 16 hex parent id, 2 hex flags.
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16


@dataclass(frozen=True)
class SpanContext:
    """Where a span sits: its trace, its own id, and whether it is sampled."""

    trace_id: str  # 32 lowercase hex
    span_id: str  # 16 lowercase hex
    sampled: bool = True

    def traceparent(self) -> str:
        """The `traceparent` header naming this span as the parent of what it calls."""
        return f"00-{self.trace_id}-{self.span_id}-{'01' if self.sampled else '00'}"


def _digest(*parts: str) -> bytes:
    return hashlib.sha256("\x1f".join(parts).encode()).digest()


def trace_id_for_turn(session_id: str, turn_id: str) -> str:
    """The trace of a turn no client named one for: stable across processes."""
    tid = _digest("trace", session_id, turn_id)[:16].hex()
    return tid if tid != _ZERO_TRACE else "0" * 31 + "1"


def span_id(trace_id: str, *what: str) -> str:
    """The id of the span `what` names within `trace_id` (never the invalid all-zero id)."""
    sid = _digest("span", trace_id, *what)[:8].hex()
    return sid if sid != _ZERO_SPAN else "0" * 15 + "1"


_TRACESTATE_MAX = 512  # what W3C Trace Context asks a vendor to pass on at least
# key=value: a key of lowercase letters, digits and `_-*/@`; a value of printable ASCII but
# `,` and `=`, not ending in a space.
_TRACESTATE_MEMBER = re.compile(
    r"[a-z0-9][_0-9a-z\-*/@]{0,255}"
    r"=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
)


def parse_tracestate(value: str | None) -> str | None:
    """A `tracestate` header to pass on as it came, or None when it is missing, too long
    or not a list of `key=value` members (then it is dropped, as the spec allows)."""
    if not value or len(value) > _TRACESTATE_MAX:
        return None
    members = [m.strip() for m in value.split(",") if m.strip()]
    if not members or len(members) > 32:
        return None
    if not all(_TRACESTATE_MEMBER.fullmatch(m) for m in members):
        return None
    return ",".join(members)


def parse_traceparent(value: str | None) -> SpanContext | None:
    """A `traceparent` header's context, or None for a missing or invalid one.

    Per the spec, an unknown higher version is read for its first four fields, while
    version `ff` and all-zero ids are invalid (the receiver then starts a trace of its own).
    """
    if not value:
        return None
    text = value.strip().lower()
    m = _TRACEPARENT.match(text)
    if m is None:
        return None
    version, trace, parent, flags = m.groups()
    if version == "ff" or trace == _ZERO_TRACE or parent == _ZERO_SPAN:
        return None
    if version == "00" and len(text) != 55:
        return None
    if version != "00" and len(text) > 55 and text[55] != "-":
        return None
    return SpanContext(trace, parent, bool(int(flags, 16) & 1))
