"""Server-sent events, decoded by the WHATWG event-stream rules: bytes in, events out.

Pure (no I/O): whatever reads a response body feeds its chunks here, however they
were cut. Unlike the lenient readers that turn bad bytes into U+FFFD, the stream
must be UTF-8: a peer that sends anything else is told so, not misquoted.

The rules (html.spec.whatwg.org, "Interpreting an event stream"): one leading BOM
is dropped; lines end in CRLF, LF or CR; a line starting with `:` is a comment; a
field's value follows the first `:`, less one space; `data` lines join with LF;
`id` without NUL sets the last event id; `retry` of ASCII digits sets the
reconnection time; a blank line dispatches the event if it has data; an event
the stream ends in the middle of is dropped.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass

_LINE_END = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True)
class Event:
    """One dispatched event; `id` is the last event id as of this event."""

    event: str
    data: str
    id: str = ""
    retry: int | None = None


class SseDecoder:
    """Feed it the body's chunks in order; each call returns the events they completed.

    Raises UnicodeDecodeError (from `feed` or `close`) for bytes that are not UTF-8.
    `pending` is how many bytes arrived since the last dispatched event, so a reader
    can bound one event's size without bounding the stream.
    """

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self._partial: list[str] = []  # the line being read, not yet ended
        self._after_cr = False  # the last text ended in CR: an LF next is its CRLF
        self._started = False  # the BOM check is done
        self._event = ""
        self._data: list[str] = []
        self._id = ""
        self._retry: int | None = None
        self.pending = 0

    def feed(self, chunk: bytes) -> list[Event]:
        """The events the bytes complete; a partial line or UTF-8 sequence waits for more."""
        self.pending += len(chunk)
        return self._lines(self._utf8.decode(chunk))

    def close(self) -> list[Event]:
        """The stream ended: an event not ended by a blank line is dropped."""
        events = self._lines(self._utf8.decode(b"", final=True))
        self._partial = []  # a last line without its line end belongs to that event
        return events

    def _lines(self, text: str) -> list[Event]:
        """Scan only the new text for line ends, so one huge line costs O(its size)."""
        if not text:
            return []
        if not self._started:
            self._started = True
            text = text.removeprefix("\ufeff")
        if self._after_cr and text[:1] == "\n":
            text = text[1:]
        self._after_cr = text[-1:] == "\r"
        lines = text.split("\n") if "\r" not in text else _LINE_END.split(text)
        rest = lines.pop()  # after the last line end: the start of a line not yet ended
        events: list[Event] = []
        if lines and self._partial:
            lines[0] = "".join(self._partial) + lines[0]
            self._partial = []
        for line in lines:
            event = self._line(line)
            if event is not None:
                events.append(event)
        if rest:
            self._partial.append(rest)
        return events

    def _line(self, line: str) -> Event | None:
        if not line:
            return self._dispatch()
        if line.startswith("data: "):  # the common case, first
            self._data.append(line[6:])
            return None
        if line[0] == ":":
            return None  # a comment
        field, colon, value = line.partition(":")
        if colon and value[:1] == " ":
            value = value[1:]
        if field == "event":
            self._event = value
        elif field == "data":
            self._data.append(value)
        elif field == "id" and "\0" not in value:
            self._id = value
        elif field == "retry" and value.isascii() and value.isdigit():
            self._retry = int(value)
        return None

    def _dispatch(self) -> Event | None:
        data, kind = self._data, self._event
        self._data, self._event = [], ""
        if not data:
            return None
        self.pending = 0
        return Event(kind or "message", "\n".join(data), self._id, self._retry)
