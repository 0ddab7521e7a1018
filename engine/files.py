"""A file in a message, by reference: the protocol's `attachment` content part.

A message that carries a file (an image, a PDF) holds `{type: "attachment", id, mime, size,
uri}` in its content, `uri` = `subs-file:sha256:<hex>` naming the bytes the engine keeps
once for the session (engine/store/files.py). That part is valid ClientInput and what a
worker sees; the engine swaps it for the bytes, in the vendor's own form, only when it
calls a model (engine/effects/llm/files.py), so the log never holds them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["FILE_URI", "attachment", "stored_digest"]

FILE_URI = "subs-file:sha256:"


def attachment(digest: str, mime: str, size: int) -> dict[str, Any]:
    """The content part naming a stored file."""
    return {
        "type": "attachment",
        "id": digest,
        "mime": mime,
        "size": size,
        "uri": FILE_URI + digest,
    }


def stored_digest(part: Any) -> str | None:
    """The digest an `attachment` part names when it is one of ours, else None."""
    if not isinstance(part, Mapping) or part.get("type") != "attachment":
        return None
    uri = part.get("uri")
    if isinstance(uri, str) and uri.startswith(FILE_URI) and len(uri) == len(FILE_URI) + 64:
        return uri[len(FILE_URI) :]
    return None
