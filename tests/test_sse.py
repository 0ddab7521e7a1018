"""The event-stream decoder against the WHATWG rules, table by table, cut at every byte."""

from __future__ import annotations

import pytest

from engine.sse import Event, SseDecoder


def decode(chunks: list[bytes]) -> list[Event]:
    decoder = SseDecoder()
    events: list[Event] = []
    for chunk in chunks:
        events += decoder.feed(chunk)
    return events + decoder.close()


def every_cut(body: bytes) -> list[list[bytes]]:
    """The body whole, byte by byte, and cut in two at every point."""
    cuts = [[body], [body[i : i + 1] for i in range(len(body))]]
    cuts += [[body[:i], body[i:]] for i in range(1, len(body))]
    return cuts


def ev(data: str, event: str = "message", id: str = "", retry: int | None = None) -> Event:
    return Event(event, data, id, retry)


FIELDS = [
    ("one data line", b"data: hi\n\n", [ev("hi")]),
    ("no space after the colon", b"data:hi\n\n", [ev("hi")]),
    ("only one space is dropped", b"data:  hi\n\n", [ev(" hi")]),
    ("a colon in the value", b"data: a:b\n\n", [ev("a:b")]),
    ("data lines join with LF", b"data: a\ndata: b\n\n", [ev("a\nb")]),
    ("an empty data line", b"data\n\n", [ev("")]),
    ("an empty data value", b"data:\n\n", [ev("")]),
    ("a trailing empty data line", b"data: a\ndata\n\n", [ev("a\n")]),
    ("an event type", b"event: add\ndata: x\n\n", [ev("x", "add")]),
    ("a field name with no colon", b"event\ndata: x\n\n", [ev("x")]),
    ("an unknown field", b"foo: bar\ndata: x\n\n", [ev("x")]),
    ("a field name with a space is another field", b"data : x\n\n", []),
    ("a comment", b": ping\n\n", []),
    ("a bare colon is a comment", b":\ndata: x\n\n", [ev("x")]),
    ("an event without data is not dispatched", b"event: add\n\n", []),
    ("and its type does not carry over", b"event: add\n\ndata: x\n\n", [ev("x")]),
    ("blank lines alone", b"\n\n\n", []),
    ("two events", b"data: 1\n\ndata: 2\n\n", [ev("1"), ev("2")]),
]

LINE_ENDS = [
    ("CRLF", b"data: a\r\ndata: b\r\n\r\n", [ev("a\nb")]),
    ("CR", b"data: a\rdata: b\r\r", [ev("a\nb")]),
    ("LF", b"data: a\ndata: b\n\n", [ev("a\nb")]),
    ("mixed", b"data: a\r\ndata: b\rdata: c\n\r\n", [ev("a\nb\nc")]),
    ("CR then LF is one line end", b"data: a\r\n\r\n", [ev("a")]),
    ("LF then CR is two", b"data: a\n\rdata: b\n\n", [ev("a"), ev("b")]),
]

IDS_AND_RETRY = [
    ("an id", b"id: 7\ndata: x\n\n", [ev("x", id="7")]),
    ("the id carries over", b"id: 7\ndata: x\n\ndata: y\n\n", [ev("x", id="7"), ev("y", id="7")]),
    ("an empty id resets it", b"id: 7\ndata: x\n\nid\ndata: y\n\n", [ev("x", id="7"), ev("y")]),
    (
        "an id with NUL is ignored",
        b"id: 7\ndata: x\n\nid: a\x00b\ndata: y\n\n",
        [ev("x", id="7"), ev("y", id="7")],
    ),
    ("an id alone sets it for the next event", b"id: 9\n\ndata: x\n\n", [ev("x", id="9")]),
    ("retry", b"retry: 3000\ndata: x\n\n", [ev("x", retry=3000)]),
    ("retry not digits", b"retry: 3s\ndata: x\n\n", [ev("x")]),
    ("retry empty", b"retry\ndata: x\n\n", [ev("x")]),
    ("retry in other digits", "retry: ٣\ndata: x\n\n".encode(), [ev("x")]),
]

TEXT = [
    ("a leading BOM is dropped", b"\xef\xbb\xbfdata: x\n\n", [ev("x")]),
    ("only the first BOM", b"\xef\xbb\xbf\xef\xbb\xbfdata: x\n\n", []),
    ("multibyte text", "data: שלום 👩🏽‍💻\n\n".encode(), [ev("שלום 👩🏽‍💻")]),
    (
        "a JSON payload",
        b'event: llm.token.delta\ndata: {"text":"a"}\n\n',
        [ev('{"text":"a"}', "llm.token.delta")],
    ),
]

ENDINGS = [
    ("an event the stream ends inside is dropped", b"data: 1\n\ndata: 2", [ev("1")]),
    ("even with its line end", b"data: 1\n\ndata: 2\n", [ev("1")]),
    ("an empty stream", b"", []),
]


@pytest.mark.parametrize(
    ("name", "body", "expected"),
    FIELDS + LINE_ENDS + IDS_AND_RETRY + TEXT + ENDINGS,
    ids=[case[0] for case in FIELDS + LINE_ENDS + IDS_AND_RETRY + TEXT + ENDINGS],
)
def test_the_rules_hold_however_the_stream_is_cut(name, body, expected):
    for chunks in every_cut(body):
        assert decode(chunks) == expected, (name, chunks)


@pytest.mark.parametrize(
    "body",
    [b"data: \xff\n\n", b"data: \xed\xa0\x80\n\n", b"data: \xc3\n\n"],
    ids=["a byte never in UTF-8", "a UTF-8 surrogate", "a lead byte cut short"],
)
def test_bytes_that_are_not_utf8_are_refused_not_replaced(body):
    with pytest.raises(UnicodeDecodeError):
        decode([body])


def test_a_stream_ending_inside_a_character_is_refused():
    decoder = SseDecoder()
    assert decoder.feed(b"data: x\n\ndata: \xe2\x82") == [ev("x")]
    with pytest.raises(UnicodeDecodeError):
        decoder.close()


def test_pending_counts_the_bytes_since_the_last_event():
    decoder = SseDecoder()
    decoder.feed(b": a comment\n")
    decoder.feed(b"data: 12345")
    assert decoder.pending == len(b": a comment\n") + len(b"data: 12345")
    assert decoder.feed(b"\n\n") == [ev("12345")]
    assert decoder.pending == 0
