"""A file in a message, by reference: a `link` content part naming bytes the engine keeps.

A message that carries a file (an image, a PDF) holds `{type: "link", uri, mimeType, name}`
in its content, `uri` = `subs-file:sha256:<hex>` naming the bytes kept once for the session
(engine/store/files.py). That part is valid ClientInput and, as the protocol's schema has
it, a valid message part for a worker (the schema's `attachment` part cannot validate: its
`$ref` to Attachment sits beside `additionalProperties: false`, each side refusing the
other's keys, and the schema is frozen as the original engine's). The engine swaps the
reference for the bytes, in the vendor's own form, only when it calls a model
(engine/effects/llm/files.py), so the log never holds them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["FILE_URI", "file_link", "stored_digest"]

FILE_URI = "subs-file:sha256:"


def file_link(digest: str, mime: str, name: str) -> dict[str, Any]:
    """The content part naming a stored file."""
    return {"type": "link", "uri": FILE_URI + digest, "mimeType": mime, "name": name}


def stored_digest(part: Any) -> str | None:
    """The digest a `link` part names when it is one of ours, else None."""
    if not isinstance(part, Mapping) or part.get("type") != "link":
        return None
    uri = part.get("uri")
    if isinstance(uri, str) and uri.startswith(FILE_URI) and len(uri) == len(FILE_URI) + 64:
        return uri[len(FILE_URI) :]
    return None
