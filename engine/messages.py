"""Stored messages as a reader shows them, whatever version of the engine stored them.

Older versions took a message with no content, content null, or parts without text, and
a role this version does not know: every reader (the lists, the AG-UI channel, the Slack
bot) reads a message's text here, so none of them fails on one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def text_of(content: Any) -> str:
    """A message's content as text: a string, or its text parts joined; "" for none."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            text
            for part in content
            if isinstance(part, Mapping) and isinstance(text := part.get("text"), str)
        )
    return ""
