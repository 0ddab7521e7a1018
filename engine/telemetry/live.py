"""Spans measured as they happen, for work that leaves no fact in a session's log: the
Slack bot's intake of a turn and its Web API calls.

`LIVE` holds where such spans go and what they sit under, for the task (and the tasks it
starts) doing that work; `timed` measures one piece of work into a span when it is set,
and costs one context-variable read when it is not.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable, Callable, Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

from engine.telemetry.ids import SpanContext
from engine.telemetry.spans import Attributes, SpanRecord

__all__ = ["LIVE", "Live", "in_live", "now_ms", "timed"]

T = TypeVar("T")


@dataclass(frozen=True)
class Live:
    """The span new spans are children of, and where finished ones go."""

    parent: SpanContext
    emit: Callable[[Iterable[SpanRecord]], None]


LIVE: ContextVar[Live | None] = ContextVar("subs_live_span", default=None)


def now_ms() -> int:
    """The wall clock, as span records count it."""
    return time.time_ns() // 1_000_000


async def timed(name: str, attributes: Attributes, work: Awaitable[T]) -> T:
    """Await `work`; with a live span set, record it as a client span under it."""
    live = LIVE.get()
    if live is None:
        return await work
    start, error = now_ms(), None
    try:
        return await work
    except BaseException as err:
        error = type(err).__name__
        raise
    finally:
        ctx = SpanContext(live.parent.trace_id, secrets.token_hex(8))
        record = SpanRecord(
            name, ctx, live.parent.span_id, "client", start, now_ms(), attributes, error=error
        )
        live.emit([record])


def in_live(work: Callable[[], Awaitable[Any]]) -> Callable[[], Awaitable[Any]]:
    """`work` to be run later by another task (a paced send), under the live span set now."""
    live = LIVE.get()
    if live is None:
        return work

    async def under() -> Any:
        token = LIVE.set(live)
        try:
            return await work()
        finally:
            LIVE.reset(token)

    return under
