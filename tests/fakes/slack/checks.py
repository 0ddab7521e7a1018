"""Checks of what an app sends, with Slack's error strings: Block Kit, metadata, stream
chunks, required arguments; and the request signature Slack puts on what it sends."""

from __future__ import annotations

import hashlib
import hmac
import re
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from tests.fakes.slack.rules import (
    BLOCKS_MAX,
    BLOCKS_TEXT_MAX,
    MARKDOWN_MAX,
    SECTION_TEXT_MAX,
    SlackError,
)

OUTER_TYPES = {"event_callback", "url_verification", "app_rate_limited"}
FORM_JSON = {
    "blocks": "invalid_blocks_format",
    "attachments": "invalid_attachments",
    "metadata": "invalid_metadata_format",
    "chunks": "invalid_chunks",
}
MENTION = re.compile(r"<@([A-Z0-9]+)>")
TASK_STATUSES = {"pending", "in_progress", "complete", "error"}


def flag(value: Any) -> bool:
    return value is True or str(value).lower() in ("1", "true")


def required(args: Mapping[str, Any], name: str) -> str:
    value = args.get(name)
    if value is None or value == "":
        raise SlackError(
            "invalid_arguments",
            response_metadata={"messages": [f"[ERROR] missing required field: {name}"]},
        )
    return str(value)


def texts(value: Any) -> Iterator[str]:
    """Every `text` string inside a block tree."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "text" and isinstance(item, str):
                yield item
            else:
                yield from texts(item)
    elif isinstance(value, list):
        for item in value:
            yield from texts(item)


def invalid_blocks(message: str, pointer: str) -> SlackError:
    return SlackError(
        "invalid_blocks",
        response_metadata={"messages": [f"[ERROR] {message} [json-pointer:{pointer}]"]},
    )


def check_blocks(blocks: Any) -> list[dict[str, Any]]:
    """Slack's checks on `blocks` (notes §1.7, §5); returns them."""
    if not isinstance(blocks, list) or not all(
        isinstance(b, dict) and isinstance(b.get("type"), str) for b in blocks
    ):
        raise SlackError("invalid_blocks_format")
    if len(blocks) > BLOCKS_MAX:
        raise invalid_blocks(f"no more than {BLOCKS_MAX} items allowed", "/blocks")
    for i, block in enumerate(blocks):
        if len(str(block.get("block_id", ""))) > 255:
            raise invalid_blocks("must be less than 256 characters", f"/blocks/{i}/block_id")
        text = block.get("text")
        section = block["type"] == "section" and isinstance(text, dict)
        if section and len(str(text.get("text", ""))) > SECTION_TEXT_MAX:
            raise invalid_blocks(
                f"must be less than {SECTION_TEXT_MAX + 1} characters", f"/blocks/{i}/text/text"
            )
        for j, element in enumerate(block.get("elements") or []):
            if not isinstance(element, dict) or element.get("type") != "button":
                continue
            where = f"/blocks/{i}/elements/{j}"
            label = element.get("text")
            label_text = label.get("text", "") if isinstance(label, dict) else ""
            for name, size, value in (
                ("text/text", 75, label_text),
                ("value", 2000, element.get("value", "")),
                ("action_id", 255, element.get("action_id", "")),
            ):
                if len(str(value)) > size:
                    raise invalid_blocks(
                        f"must be less than {size + 1} characters", f"{where}/{name}"
                    )
    if sum(len(t) for t in texts(blocks)) > BLOCKS_TEXT_MAX:
        raise SlackError("msg_blocks_too_long")
    return blocks


def check_metadata(value: Any) -> dict[str, Any] | None:
    if value == {}:
        return None
    if not isinstance(value, dict):
        raise SlackError("invalid_metadata_format")
    if not isinstance(value.get("event_type"), str) or not isinstance(
        value.get("event_payload"), dict
    ):
        raise SlackError("invalid_metadata_schema")
    return value


def check_chunks(value: Any) -> list[dict[str, Any]]:
    """Chunk objects (notes §1.1): markdown_text, plan_update, task_update, blocks."""
    if not isinstance(value, list):
        raise SlackError("invalid_chunks")
    for chunk in value:
        kind = chunk.get("type") if isinstance(chunk, dict) else None
        if kind == "markdown_text":
            if not isinstance(chunk.get("text"), str):
                raise SlackError("invalid_chunks")
            if len(chunk["text"]) > MARKDOWN_MAX:
                raise SlackError("msg_too_long")
        elif kind == "plan_update":
            if not isinstance(chunk.get("title"), str):
                raise SlackError("invalid_chunks")
        elif kind == "task_update":
            if not chunk.get("id") or not chunk.get("title"):
                raise SlackError("invalid_chunks")
            if chunk.get("status") not in TASK_STATUSES:
                raise SlackError("invalid_chunks")
        elif kind == "blocks":
            check_blocks(chunk.get("blocks"))
        else:
            raise SlackError("invalid_chunks")
    return value


def rich_text(text: str) -> list[dict[str, Any]]:
    """The rich_text block Slack attaches to a person's message (mentions as user elements)."""
    elements: list[dict[str, Any]] = []
    pos = 0
    for match in MENTION.finditer(text):
        if match.start() > pos:
            elements.append({"type": "text", "text": text[pos : match.start()]})
        elements.append({"type": "user", "user_id": match.group(1)})
        pos = match.end()
    if pos < len(text):
        elements.append({"type": "text", "text": text[pos:]})
    section = {"type": "rich_text_section", "elements": elements}
    return [{"type": "rich_text", "block_id": uuid.uuid4().hex[:5], "elements": [section]}]


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """X-Slack-Signature: v0=hex(HMAC_SHA256(secret, f"v0:{ts}:{body}")) (notes §3.2)."""
    base = b"v0:" + timestamp.encode() + b":" + body
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()
