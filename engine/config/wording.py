"""The wording of a schema error: pydantic's first complaint as the file's key path and
one plain sentence (an unknown key gets a did-you-mean or the keys that are known)."""

from __future__ import annotations

import difflib
import re
import types
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from engine.config.model import ConfigError
from engine.config.schema import Root


def dotted(path: tuple[str | int, ...]) -> str:
    """A key path as errors name it: `agent.oncall.tools.0`."""
    return ".".join(str(p) for p in path)


# How pydantic names the branches of a union in an error's location (`mcp = ["mcp.x",
# {id = ...}]`): not keys of the file.
_UNION_TAG = re.compile(r"constrained-str|str|_[A-Z][A-Za-z]*")


def from_pydantic(file: str, error: ValidationError) -> ConfigError:
    """The first error, read as the file's key path. Where a value may be a string or a
    table, the branch of what was written speaks (not "expected a string" for a table)."""
    errors = error.errors()
    first = errors[0]
    tagged = [
        e for e in errors if any(isinstance(p, str) and _UNION_TAG.fullmatch(p) for p in e["loc"])
    ]
    if tagged:
        first = next((e for e in tagged if not e["type"].endswith("_type")), tagged[0])
    # A dict key's own error ends its location in "[key]": the key is named already.
    loc = tuple(
        p
        for p in first["loc"]
        if not (isinstance(p, str) and (_UNION_TAG.fullmatch(p) or p == "[key]"))
    )
    return ConfigError(_human(first, loc), file=file, key=dotted(loc))


def _describe(value: Any) -> str:
    for kind, name in (
        (bool, "true/false"),
        (int, "an integer"),
        (float, "a number"),
        (str, "a string"),
        (list, "a list"),
        (dict, "a table"),
    ):
        if isinstance(value, kind):
            return name
    return "a date/time"


def _human(err: Any, loc: tuple[str | int, ...]) -> str:
    kind, ctx, got = err["type"], err.get("ctx") or {}, err.get("input")
    expected = {
        "string_type": "a string",
        "int_type": "an integer",
        "int_from_float": "an integer",
        "bool_type": "true or false",
        "list_type": "a list",
        "dict_type": "a table",
        "model_type": "a table",
    }
    if kind in expected:
        return f"expected {expected[kind]}, got {_describe(got)}"
    if kind == "extra_forbidden":
        known = _known_keys(loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        return "unknown key" + (
            f" (did you mean {close[0]}?)" if close else f"; known keys: {', '.join(known)}"
        )
    if kind == "missing":
        return "required"
    if kind == "literal_error":
        return f"must be one of {ctx['expected']}, got {got!r}"
    if kind == "greater_than_equal":
        return f"must be {ctx['ge']} or more"
    if kind == "less_than_equal":
        return f"must be {ctx['le']} or less"
    if kind == "string_too_short":
        return "must not be empty"
    if kind == "string_too_long":
        return f"must be at most {ctx['max_length']} characters (is {len(got)})"
    if kind == "value_error":
        return str(ctx["error"])
    return str(err["msg"])


def _unwrap(annotation: Any) -> Any:
    """Strip `X | None` down to X (and `str | Table` to the table)."""
    while get_origin(annotation) in (Union, types.UnionType):
        options = [a for a in get_args(annotation) if a is not type(None)]
        tables = [a for a in options if isinstance(a, type) and issubclass(a, BaseModel)]
        annotation = (tables or options)[0]  # `str | table`: a key path runs into the table
    return annotation


def _known_keys(parent: tuple[str | int, ...]) -> list[str]:
    """The keys the file may use at `parent`, for an unknown-key hint."""
    current: Any = Root
    for part in parent:
        current = _unwrap(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            current = current.model_fields[str(part)].annotation
        else:  # a list index or a table key: step into the element type
            current = get_args(current)[-1]
    current = _unwrap(current)
    return [f.alias or name for name, f in current.model_fields.items()]
