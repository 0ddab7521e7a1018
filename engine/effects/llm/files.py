"""Files in a model call: each stored-file reference swapped for the bytes, at the call.

A message holds a file as a `link` part naming the bytes the session keeps
(engine/files.py); here, just before the request is built, each becomes what the vendor
takes: an image (PNG, JPEG, GIF, WebP) an `image_url` part with a `data:` URL (OpenAI's own
shape; the Anthropic module makes it an `image` block with a base64 source); a PDF a `file`
part for Anthropic (its `document` block) and, for the Chat Completions vendors, its text,
read with pypdf, or a note when it has none. Anything else, and bytes no longer stored,
become a one-line note: the call never fails for a file.
"""

from __future__ import annotations

import asyncio
import base64
import io
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from engine.files import stored_digest

__all__ = ["IMAGE_TYPES", "PDF_TEXT_MAX", "pdf_text", "resolve_files"]

log = logging.getLogger(__name__)

IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
PDF = "application/pdf"
PDF_TEXT_MAX = 256 * 1024  # characters of a PDF's text a Chat Completions model is given
DOCUMENTS = frozenset({"anthropic"})  # vendors that take a PDF as a document

Fetch = Callable[[Sequence[str]], Awaitable[list[bytes | None]]]

_texts: OrderedDict[str, str | None] = OrderedDict()  # a PDF's text by digest, read once
_TEXTS_KEPT = 32


async def resolve_files(
    request: dict[str, Any],
    fetch: Fetch,
    vendor: str,
    *,
    kept: Callable[[dict[str, Any]], bool] = lambda message: False,
) -> dict[str, Any]:
    """`request` with every stored-file reference in its messages resolved for `vendor`
    ("openai", "openrouter" or "anthropic"); the same object when it holds none.

    `kept(message)` says the message's vendor form is already encoded and kept
    (engine/effects/llm/prompts.py): its files are not read again, since the kept form is
    what is sent. That is checked again after each read (one may be dropped meanwhile), and
    from the last check to the return nothing awaits, so what the caller encodes next is
    either kept or resolved."""
    # This runs at every model call over the whole history, and most messages hold a
    # string: only a message of parts can name a file, so the others are passed over once.
    parted = [m for m in request.get("messages") or () if m.get("content").__class__ is list]
    if not parted:
        return request
    found: dict[str, bytes | None] = {}
    texts: dict[str, str | None] = {}  # PDFs' text, for vendors that take no documents
    while True:
        wanted = {
            digest: str(part.get("mimeType") or "")
            for message in parted
            if (refs := _references(message)) and not kept(message)
            for digest, part in refs
        }
        missing = sorted(wanted.keys() - found.keys())
        unread = [
            d
            for d, mime in wanted.items()
            if mime == PDF and vendor not in DOCUMENTS and d not in texts and found.get(d)
        ]
        if not missing and not unread:
            break
        if missing:
            found.update(zip(missing, await fetch(missing), strict=True))
        for digest in unread:
            texts[digest] = await _pdf_text(digest, found[digest] or b"")
    if not wanted:
        return request
    messages = []
    for message in request["messages"]:
        if _references(message) and not kept(message):
            content = [_part(p, found, texts, vendor) for p in message["content"]]
            message = {**message, "content": content}
        messages.append(message)
    return {**request, "messages": messages}


def _references(message: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The stored-file references in a message's content, with their parts."""
    content = message.get("content")
    if content.__class__ is not list:  # a string
        return []
    return [(d, part) for part in content if (d := stored_digest(part)) is not None]


def _part(
    part: Any, found: dict[str, bytes | None], texts: dict[str, str | None], vendor: str
) -> Any:
    digest = stored_digest(part)
    if digest is None:
        return part
    data, mime = found.get(digest), str(part.get("mimeType") or "")
    if data is None:
        return _note(f"(a {mime or 'file'} that is no longer stored)")
    if mime in IMAGE_TYPES:
        return {"type": "image_url", "image_url": {"url": _data_url(mime, data)}}
    if mime == PDF:
        if vendor in DOCUMENTS:
            file = {"filename": f"{digest[:12]}.pdf", "file_data": _data_url(PDF, data)}
            return {"type": "file", "file": file}
        text = texts.get(digest)
        if not text:
            return _note("(a PDF with no text to read; this model takes no documents)")
        return _note(f"(the PDF's text)\n{text}")
    return _note(f"(a {mime or 'file'} of {len(data)} bytes, not readable here)")


def _note(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


async def _pdf_text(digest: str, data: bytes) -> str | None:
    if digest in _texts:
        _texts.move_to_end(digest)
        return _texts[digest]
    text = await asyncio.to_thread(pdf_text, data)
    _texts[digest] = text
    while len(_texts) > _TEXTS_KEPT:
        _texts.popitem(last=False)
    return text


def pdf_text(data: bytes, limit: int = PDF_TEXT_MAX) -> str | None:
    """The text of a PDF's pages, cut at `limit` characters with a note saying how much was
    left out; None when it has none or cannot be read."""
    from pypdf import PdfReader  # only when a PDF is met: it is a large import

    try:
        reader = PdfReader(io.BytesIO(data))
        text = "\n".join((page.extract_text() or "").strip() for page in reader.pages).strip()
    except Exception as err:  # a broken PDF is the sender's, not the call's, failure
        log.info("a PDF could not be read: %s", err)
        return None
    if len(text) > limit:
        return f"{text[:limit]}\n(cut: {len(text) - limit} more characters of the PDF left out)"
    return text or None
