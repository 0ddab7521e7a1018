"""Request bodies whose history is converted and encoded once, not at every call.

A model call sends the session's whole path of messages. Converting each to the
vendor's shape and serialising it again at every step made a step's cost grow
with the session. A message in a session's tree never changes (its id is unique
in the session), so its vendor form is encoded once and kept, keyed by session,
vendor format and message ids; a body is the encoded head (model, tools, options)
with the kept fragments spliced in. Messages without an id (a worker's explicit
`messages`) are encoded each time.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from functools import partial
from typing import Any

import orjson

Groups = Callable[[list[dict[str, Any]]], tuple[list[dict[str, Any]], list[list[dict[str, Any]]]]]
Convert = Callable[[list[dict[str, Any]]], dict[str, Any]]
Build = Callable[..., dict[str, Any]]

DEFAULT_MAX_BYTES = 64 << 20
_EMPTY_MESSAGES = b'"messages":[]'


class EncodedMessages:
    """Encoded vendor messages, least recently used dropped past `max_bytes`."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self.size = 0
        self._kept: OrderedDict[tuple[str, ...], bytes] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def holds(self, key: tuple[str, ...]) -> bool:
        """Whether `key` is kept; if so it becomes the most recently used, so the body being
        built now (whose other fragments may push old ones out) still finds it."""
        if key not in self._kept:
            return False
        self._kept.move_to_end(key)
        return True

    def fragment(self, key: tuple[str, ...] | None, make: Callable[[], Any]) -> bytes:
        if key is None:
            return orjson.dumps(make())
        kept = self._kept.get(key)
        if kept is not None:
            self._kept.move_to_end(key)
            return kept
        encoded = orjson.dumps(make())
        self._kept[key] = encoded
        self.size += len(encoded)
        while self.size > self.max_bytes and self._kept:
            _, dropped = self._kept.popitem(last=False)
            self.size -= len(dropped)
        return encoded


def encode_body(
    request: dict[str, Any],
    *,
    scope: tuple[str, str],
    groups: Groups,
    convert: Convert,
    build: Build,
    stream: bool,
    kept: EncodedMessages,
) -> bytes:
    """The vendor body of a neutral request, as bytes equal in JSON to
    `build(request, stream=stream)`; `scope` is (session id, vendor format)."""
    system, grouped = groups(request["messages"])
    head = orjson.dumps(build({**request, "messages": system}, stream=stream))
    fragments = []
    for group in grouped:
        ids = [m.get("id") for m in group]
        key = None if None in ids else (*scope, *map(str, ids))
        fragments.append(kept.fragment(key, partial(convert, group)))
    # The messages go where `build` puts them, so the body reads the same. The first
    # `"messages":[]` is that key: inside a string its quotes would be escaped, and the
    # keys before it (model, max_tokens, system) hold no such object.
    at = head.index(_EMPTY_MESSAGES)
    return b"".join(
        (head[:at], b'"messages":[', b",".join(fragments), b"]", head[at + len(_EMPTY_MESSAGES) :])
    )
