"""Log records that say which span they happened in, and one JSON object per line.

With tracing on, each effect runs with its span in `CURRENT` (a context variable the
effect's task copies), and `SpanFields` puts its ids on every record logged meanwhile
(`trace_id`, `span_id`), so a backend links a warning to the turn it belongs to.
`SUBS_LOG_FORMAT=json` prints every record as one JSON object a line.
"""

from __future__ import annotations

import json
import logging
from contextvars import ContextVar
from datetime import UTC, datetime

from engine.telemetry.ids import SpanContext

__all__ = ["CURRENT", "JsonLines", "SpanFields", "WithSpan"]

CURRENT: ContextVar[SpanContext | None] = ContextVar("subs_span", default=None)


class SpanFields(logging.Filter):
    """Adds the current span's `trace_id` and `span_id` to a record (empty outside one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        span = CURRENT.get()
        record.trace_id = span.trace_id if span else ""
        record.span_id = span.span_id if span else ""
        return True


class WithSpan(logging.Formatter):
    """A record as its format says, then ` trace_id=… span_id=…` when it has a span."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        trace, span = getattr(record, "trace_id", ""), getattr(record, "span_id", "")
        return f"{text} trace_id={trace} span_id={span}" if trace else text


class JsonLines(logging.Formatter):
    """`{"time", "level", "logger", "message", "trace_id"?, "span_id"?, "exception"?}`."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, str] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in ("trace_id", "span_id"):
            value = getattr(record, key, "")
            if value:
                line[key] = value
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line["exception"] = record.exc_text
        return json.dumps(line, ensure_ascii=False)
