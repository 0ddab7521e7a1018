"""How `subs` logs: warnings as one `subs:` line by default, full records with
`SUBS_LOG`, JSON lines with `SUBS_LOG_FORMAT=json`, every one scrubbed of secrets."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable

from engine.cli.common import REDACTOR, Usage
from engine.errors import describe

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _log_level() -> str | None:
    """`SUBS_LOG`, any case; None when unset. A level logging does not know is refused."""
    raw = os.environ.get("SUBS_LOG")
    if raw is None:
        return None
    level = raw.strip().upper()
    if level not in LOG_LEVELS:
        raise Usage(
            f"SUBS_LOG={raw!r} is not a level; use one of {', '.join(LOG_LEVELS)} (any case)"
        )
    return level


class OneLine(logging.Formatter):
    """A warning as the CLI says everything else: `subs: <message>`, on one line.

    The default, so a library's or the engine's warning does not break into a command's
    output as a raw logger line or a traceback; with `SUBS_LOG` set the records are
    printed in full. An exception's class and message end the line; `scrub` masks them
    (the redactor scrubs the message itself before the record gets here)."""

    def __init__(self, scrub: Callable[[str], str]) -> None:
        super().__init__()
        self.scrub = scrub

    def format(self, record: logging.LogRecord) -> str:
        """The record as one `subs:` line, its exception (scrubbed) at the end."""
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text = f"{text} ({self.scrub(describe(record.exc_info[1]))})"
            if record.levelno >= logging.ERROR:  # a bug: its traceback is one variable away
                text += "; SUBS_LOG=INFO prints the traceback"
        return "subs: " + " ".join(line.strip() for line in text.splitlines() if line.strip())


def _log_format() -> str | None:
    """`SUBS_LOG_FORMAT`: `json` or unset (the default lines)."""
    raw = os.environ.get("SUBS_LOG_FORMAT")
    if raw is None or not raw.strip():
        return None
    if raw.strip().lower() != "json":
        raise Usage(f"SUBS_LOG_FORMAT={raw!r} is not a format; the one there is: json")
    return "json"


def start_logging() -> None:
    """Warnings as `subs:` lines on stderr by default; `SUBS_LOG` for full records (with the
    span they happened in, when tracing is on), `SUBS_LOG_FORMAT=json` for JSON lines."""
    from engine.telemetry.logs import JsonLines, SpanFields, WithSpan

    level, form = _log_level(), _log_format()
    handler = logging.StreamHandler(sys.stderr)
    if form == "json":
        handler.setFormatter(JsonLines())
    elif level is None:
        handler.setFormatter(OneLine(REDACTOR.scrub))
    else:
        handler.setFormatter(WithSpan(logging.BASIC_FORMAT))
    handler.addFilter(SpanFields())
    logging.basicConfig(level=level or logging.WARNING, handlers=[handler])
    REDACTOR.install()
