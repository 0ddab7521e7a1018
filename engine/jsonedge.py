"""Untrusted JSON in: parse it once and refuse what Python's `json` takes but nothing else should.

`json.loads` accepts `NaN`, `Infinity` and `-Infinity`, turns `1e999` into an infinite float,
and keeps a lone UTF-16 surrogate escape (`"\\ud800"`) as a string no UTF-8 encoder will
write. Any of them, taken in, fails later and far away (a Redis write, a response that
cannot be encoded). `loads_checked` refuses them at the edge, and nesting past `max_depth`,
naming the JSON path of the first offence, so a client or a worker learns exactly what to fix.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from typing import Any

import orjson

from engine.errors import SubsError

MAX_DEPTH = 64
_SURROGATE = re.compile("[\ud800-\udfff]")


class JsonEdgeError(SubsError, ValueError):
    """JSON refused at the edge. `param` is the dotted path of the offence (`input.messages.0`),
    None for the document as a whole. A ValueError too, like what `json.loads` raises."""

    code = "invalid_json"
    status = 400

    def __init__(self, message: str, *, param: str | None = None, syntax: bool = False) -> None:
        super().__init__(message, param=param)
        self.syntax = syntax  # not UTF-8 or not JSON at all, rather than a value refused


class _Constant:
    """`NaN`, `Infinity` or `-Infinity` as parsed: left in place for the walk to find."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


_WIDE = 2.0**63


class _Wide(Exception):
    """orjson's float that may have been an integer past 64 bits in the document."""


class _Refused(Exception):
    """Raised at the offence; each level it passes on the way up adds its key to `path`."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.path: list[str] = []


def loads_checked(data: bytes | str, *, max_depth: int = MAX_DEPTH) -> Any:
    """Parse `data` (bytes must be UTF-8) and check every value in one walk.

    Raises:
        JsonEdgeError: not UTF-8, not JSON, or the first of: a non-finite number, a lone
            surrogate in a string or a key, nesting deeper than `max_depth`.
    """
    try:
        # orjson refuses all of the above but depth (its limit is 1024), several times
        # faster. It reads an integer past 64 bits as a float, where `json` keeps it
        # exact: a float that large sends the document down the slow path too.
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        pass  # refused: parsed again below, for a message that names the offence
    else:
        try:
            _checked(value, max_depth, wide=True)
        except _Wide:
            pass
        else:
            return value
    if isinstance(data, bytes | bytearray):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise JsonEdgeError(f"not UTF-8: byte {err.start} is invalid", syntax=True) from None
    try:
        value = json.loads(data, parse_constant=_Constant)
    except RecursionError:
        raise JsonEdgeError(f"nested deeper than {max_depth} levels") from None
    except ValueError as err:
        raise JsonEdgeError(f"not JSON: {err}", syntax=True) from None
    check(value, max_depth=max_depth)
    return value


def check(value: Any, *, max_depth: int = MAX_DEPTH) -> None:
    """The same checks for a value already in Python (a client input built by the CLI or
    the Slack bot): what the engine stores must be JSON any reader can read back.

    Raises:
        JsonEdgeError: as `loads_checked`, for the first offence found.
    """
    _checked(value, max_depth, wide=False)


def _checked(value: Any, max_depth: int, *, wide: bool) -> None:
    try:
        # The document as item 0 of a list: scalars need no call.
        _check([value], -1, max_depth, wide)
    except _Refused as refused:
        path = ".".join(reversed(refused.path[:-1]))
        message = f"{path}: {refused.problem}" if path else refused.problem
        raise JsonEdgeError(message, param=path or None) from None


def _check(node: list[Any] | dict[str, Any], depth: int, max_depth: int, wide: bool) -> None:
    """A container's items, checked inline: only a nested container costs a call, and the
    path is worked out only for an offence. The types are exactly those `json.loads` builds.
    With `wide`, a float past ±2**63 raises `_Wide`."""
    if depth >= max_depth:
        raise _Refused(f"nested deeper than {max_depth} levels")
    if type(node) is dict:
        if not "".join(node).isascii():
            _check_keys(node)
        values: Iterable[Any] = node.values()
    else:
        values = node
    for value in values:
        kind = type(value)
        if kind is str:
            if value.isascii() or not _SURROGATE.search(value):
                continue
            refused = _Refused("a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape)")
        elif kind is dict or kind is list:
            try:
                _check(value, depth + 1, max_depth, wide)
            except _Refused as nested:
                nested.path.append(_key_of(node, value))
                raise
            continue
        elif kind is float:
            if math.isfinite(value):
                if wide and not -_WIDE < value < _WIDE:
                    raise _Wide
                continue
            # A parsed document's only non-finite floats are overflows (1e999); a NaN can
            # come from a value built in Python.
            nan = value != value
            refused = _Refused(
                "NaN is not a JSON number" if nan else "a number too large for a double"
            )
        elif kind is _Constant:
            refused = _Refused(f"{value.name} is not a JSON number")
        else:
            continue
        refused.path.append(_key_of(node, value))
        raise refused


def _check_keys(node: dict[str, Any]) -> None:
    for key in node:
        if _SURROGATE.search(key):
            refused = _Refused("a key holds a lone UTF-16 surrogate")
            refused.path.append(key.encode("utf-8", "backslashreplace").decode())
            raise refused


def _key_of(node: list[Any] | dict[str, Any], value: Any) -> str:
    """Where `value` sits in `node`. The walk stops at the first offence, so an equal value
    earlier in `node` would have been refused first: the first `is` match is the one."""
    pairs = node.items() if type(node) is dict else enumerate(node)
    return next(str(key) for key, item in pairs if item is value)


def encode(value: Any) -> bytes:
    """JSON as the engine writes it (the store, request bodies): compact UTF-8, by orjson,
    several times faster than `json`. What is written has passed an edge (this module,
    the config's models), which refuse NaN and infinities: orjson itself would write
    them as null. An integer past 64 bits, which the edge keeps exact, is left to `json`."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return compact_json(value).encode()


def compact_json(value: Any) -> str:
    """JSON as stored and served: no spaces, UTF-8 kept (Redis and HTTP alike). NaN and
    infinities raise ValueError: written out, they would be JSON no other parser reads."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
