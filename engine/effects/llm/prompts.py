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

import uuid
from collections import OrderedDict
from collections.abc import Callable
from functools import partial
from typing import Any

import orjson

from engine.effects.llm import caching as cache

Groups = Callable[[list[dict[str, Any]]], tuple[list[dict[str, Any]], list[list[dict[str, Any]]]]]
Convert = Callable[[list[dict[str, Any]]], dict[str, Any]]
Build = Callable[..., dict[str, Any]]

DEFAULT_MAX_BYTES = 64 << 20
_SLOT = f"subs-messages-{uuid.uuid4().hex}"
_SLOT_JSON = orjson.dumps(_SLOT)


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
        """The encoded message for `key`, made once and reused while kept: a turn re-sends its
        whole history at every model call."""
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
    caching: cache.Caching | None = None,
) -> bytes:
    """The vendor body of a neutral request, as bytes equal in JSON to
    `build(request, stream=stream)` (plus cache breakpoints when `caching` is given);
    `scope` is (session id, vendor format)."""
    system, grouped = groups(request["messages"])
    head_value = build({**request, "messages": system}, stream=stream)
    fragments = []
    keys: list[tuple[str, ...] | None] = []
    for group in grouped:
        ids = [m.get("id") for m in group]
        key = None if None in ids else (*scope, *map(str, ids))
        keys.append(key)
        fragments.append(kept.fragment(key, partial(convert, group)))
    if caching is not None:
        head_value = _breakpoints(head_value, grouped, fragments, keys, caching, kept)
    # The messages go where `build` puts them, so the body reads the same: their key holds
    # a string no tool schema or text can hold (a nonce of this process) until spliced.
    head = orjson.dumps({**head_value, "messages": _SLOT})
    at = head.index(_SLOT_JSON)
    return b"".join((head[:at], b"[", b",".join(fragments), b"]", head[at + len(_SLOT_JSON) :]))


def _breakpoints(
    head: dict[str, Any],
    grouped: list[list[dict[str, Any]]],
    fragments: list[bytes],
    keys: list[tuple[str, ...] | None],
    caching: cache.Caching,
    kept: EncodedMessages,
) -> dict[str, Any]:
    """Puts the cache breakpoints `caching.choose` picks on the head (tools, Anthropic's
    system) and on the message fragments (replaced in place by marked ones, kept under
    their own key: the next call marks another message, and reuses the plain one)."""
    head = dict(head)
    tools = head.get("tools") or []
    kinds: list[str] = []
    sizes: list[int] = []
    unmarkable: list[int] = []
    if caching.style == "anthropic":
        kinds += ["definition"] * len(tools)
        sizes += [len(orjson.dumps(t)) for t in tools]
        if head.get("system"):
            kinds.append("system")
            sizes.append(len(orjson.dumps(head["system"])))
    elif tools:  # Chat Completions: no documented marker on tools; they still count
        unmarkable.append(len(kinds))
        kinds.append("definition")
        sizes.append(len(orjson.dumps(tools)))
    first = len(kinds)
    kinds += [group[0]["role"] for group in grouped]
    sizes += map(len, fragments)
    for index in cache.choose(kinds, sizes, caching.min_tokens, unmarkable=unmarkable):
        if index >= first:
            at = index - first
            marked = _marked(fragments[at], keys[at], kept)
            if marked is not None:
                fragments[at] = marked
        elif kinds[index] == "system":
            system = cache.mark_system(head["system"])
            if system is not None:
                head["system"] = system
        else:
            head["tools"] = [*tools[:-1], cache.mark_tool(tools[-1])]
    return head


def _marked(fragment: bytes, key: tuple[str, ...] | None, kept: EncodedMessages) -> bytes | None:
    """The fragment's message with a breakpoint on its last block, or None if it cannot
    carry one. Made from the encoded message, never converted again (its files may be
    left unresolved because the plain form was kept)."""
    marked_key = None if key is None else (*key, "cache")
    if marked_key is not None and kept.holds(marked_key):
        return kept.fragment(marked_key, dict)
    message = cache.mark_message(orjson.loads(fragment))
    if message is None:
        return None
    return kept.fragment(marked_key, lambda: message)
