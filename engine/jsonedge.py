"""JSON at the edge: what enters the engine is strict JSON that Redis and every reader can hold.

Python's `json` accepts `NaN`/`Infinity`, lone UTF-16 surrogates (`"\\ud800"`) and
nesting as deep as the recursion limit. Each of those, let through, fails later
and somewhere worse: at commit (a surrogate cannot be encoded as UTF-8), when the
snapshot is written (too deep to serialise), or in a client that reads our output
(NaN is not JSON). So every document from a worker, a vendor or a client is
decoded here once, and refused with the path of the first bad value.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from .errors import SubsError

MAX_DEPTH = 64  # objects and arrays nested inside each other, the document itself being 1

_SURROGATE = re.compile("[\ud800-\udfff]")


class JsonRejected(SubsError):
    """A document that is not strict JSON within our limits; `param` is the bad value's path."""

    code = "invalid_response"


def loads(data: bytes | str, *, what: str = "the body", max_depth: int = MAX_DEPTH) -> Any:
    """Decode `data` and `check` it.

    Raises:
        JsonRejected: not UTF-8, not JSON, or a value `check` refuses.
    """
    try:
        value = json.loads(data)  # NaN/Infinity decode to floats that `check` finds, with a path
    except RecursionError:
        raise JsonRejected(f"{what} nests deeper than {max_depth} levels") from None
    except UnicodeDecodeError as exc:
        raise JsonRejected(f"{what} is not UTF-8 (a bad byte at {exc.start})") from None
    except ValueError:
        raise JsonRejected(f"{what} is not JSON") from None
    check(value, what=what, max_depth=max_depth)
    return value


def check(value: Any, *, what: str = "the body", max_depth: int = MAX_DEPTH) -> None:
    """Refuse NaN/Infinity, lone surrogates (in keys too) and nesting past `max_depth`.

    One walk without recursion, so a hostile depth cannot exhaust the stack.
    """
    stack: list[tuple[Any, tuple[str, ...], int]] = [(value, (), 1)]
    while stack:
        node, path, depth = stack.pop()
        if isinstance(node, dict):
            if depth > max_depth:
                raise _rejected(what, path, f"nests deeper than {max_depth} levels")
            for key, item in node.items():
                if not isinstance(key, str):
                    raise _rejected(what, path, f"has a key that is not a string: {key!r}")
                if not key.isascii() and _SURROGATE.search(key):
                    raise _rejected(what, path, "has a key with a lone UTF-16 surrogate")
                stack.append((item, (*path, key), depth + 1))
        elif isinstance(node, list):
            if depth > max_depth:
                raise _rejected(what, path, f"nests deeper than {max_depth} levels")
            for i, item in enumerate(node):
                stack.append((item, (*path, str(i)), depth + 1))
        elif isinstance(node, str):
            if not node.isascii() and _SURROGATE.search(node):
                raise _rejected(what, path, "is a string with a lone UTF-16 surrogate")
        elif isinstance(node, float) and not math.isfinite(node):
            raise _rejected(what, path, f"is {node}, which is not JSON")


def _rejected(what: str, path: tuple[str, ...], problem: str) -> JsonRejected:
    where = ".".join(path)
    subject = f"{what} at {where}" if where else what
    return JsonRejected(f"{subject} {problem}", param=where or None)
