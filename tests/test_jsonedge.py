"""`loads_checked`: what it keeps, what it refuses, and the path it names."""

from __future__ import annotations

import json
from typing import Any

import pytest

from engine.errors import SubsError
from engine.jsonedge import MAX_DEPTH, JsonEdgeError, loads_checked


def nested(levels: int, kind: str = "list") -> str:
    """`levels` containers, one inside the other: [[[...]]] or {"a":{"a":...}}."""
    if kind == "list":
        return "[" * levels + "]" * levels
    return '{"a":' * (levels - 1) + "{}" + "}" * (levels - 1)


# (name, document, the path named or None for the whole document, fragment of the message)
REFUSED: list[tuple[str, str | bytes, str | None, str]] = [
    ("NaN in a value", '{"input": {"x": [1, NaN]}}', "input.x.1", "NaN is not a JSON number"),
    ("Infinity", '{"a": Infinity}', "a", "Infinity is not a JSON number"),
    ("-Infinity", '{"a": [-Infinity]}', "a.0", "-Infinity is not a JSON number"),
    ("NaN alone", "NaN", None, "NaN is not a JSON number"),
    ("a number past a double", '{"n": 1e999}', "n", "too large for a double"),
    ("a negative one", "[-1e400]", "0", "too large for a double"),
    ("lone high surrogate", '{"s": "a\\ud800b"}', "s", "lone UTF-16 surrogate"),
    ("lone low surrogate", '["ok", "\\udc00"]', "1", "lone UTF-16 surrogate"),
    ("pair reversed", '{"s": "\\ude00\\ud83d"}', "s", "lone UTF-16 surrogate"),
    ("surrogate alone", '"\\uD800"', None, "lone UTF-16 surrogate"),
    ("surrogate in a key", '{"a": {"k\\ud800": 1}}', "a.k\\ud800", "a key holds a lone"),
    (
        "path through lists and objects",
        '{"input": {"messages": [{"content": "x"}, {"content": NaN}]}}',
        "input.messages.1.content",
        "NaN",
    ),
    ("lists 65 deep", nested(65), ".".join(["0"] * 64), f"nested deeper than {MAX_DEPTH}"),
    ("objects 65 deep", nested(65, "dict"), ".".join(["a"] * 64), "nested deeper than"),
    ("far too deep to parse", nested(100_000), None, "nested deeper than"),
    ("not JSON", "{nope", None, "not JSON"),
    ("empty", "", None, "not JSON"),
    ("trailing garbage", '{"a": 1} x', None, "not JSON"),
    ("a BOM", '\ufeff{"a": 1}', None, "not JSON"),
    ("not UTF-8", b'{"a": "\xff"}', None, "not UTF-8: byte 7"),
    ("UTF-8 of a surrogate", b'"\xed\xa0\x80"', None, "not UTF-8"),
    ("UTF-16", '{"a": 1}'.encode("utf-16"), None, "not UTF-8"),
    ("an int past the digit limit", "1" * 5000, None, "not JSON"),
]


@pytest.mark.parametrize(("name", "document", "path", "fragment"), REFUSED)
def test_refused_with_the_path(
    name: str, document: str | bytes, path: str | None, fragment: str
) -> None:
    with pytest.raises(JsonEdgeError) as caught:
        loads_checked(document)
    err = caught.value
    assert err.param == path, name
    assert fragment in err.message, (name, err.message)
    if path is not None:
        assert err.message.startswith(f"{path}: "), err.message
    assert err.code == "invalid_json"
    assert isinstance(err, SubsError) and isinstance(err, ValueError)
    err.message.encode()  # printable and sendable: a bad key is named escaped


KEPT: list[tuple[str, str | bytes, Any]] = [
    ("unicode as text", '{"é": "naïve 😀 中文"}', {"é": "naïve 😀 中文"}),
    ("unicode as escapes", '["\\u00e9", "\\ud83d\\ude00"]', ["é", "😀"]),
    ("UTF-8 bytes", '{"a": "😀"}'.encode(), {"a": "😀"}),
    ("lists 64 deep", nested(64), json.loads(nested(64))),
    ("objects 64 deep", nested(64, "dict"), json.loads(nested(64, "dict"))),
    ("big but finite numbers", "[1e308, -1.5e-320, 123456789012345678901234567890]", None),
    ("the word NaN in a string", '{"NaN": "Infinity"}', {"NaN": "Infinity"}),
    ("scalars", '[true, false, null, 0, -0.0, ""]', [True, False, None, 0, -0.0, ""]),
]


@pytest.mark.parametrize(("name", "document", "expected"), KEPT)
def test_kept_as_json_loads_reads_it(name: str, document: str | bytes, expected: Any) -> None:
    value = loads_checked(document)
    assert value == json.loads(document), name
    if expected is not None:
        assert value == expected, name


def test_max_depth_is_the_callers() -> None:
    assert loads_checked("[[1]]", max_depth=2) == [[1]]
    with pytest.raises(JsonEdgeError) as caught:
        loads_checked('{"a": [[1]]}', max_depth=2)
    assert caught.value.param == "a.0"


def test_the_first_offence_is_named_when_equal_values_repeat() -> None:
    with pytest.raises(JsonEdgeError) as caught:
        loads_checked('[1, "x", "x", 1e999, 1e999]')
    assert caught.value.param == "3"
