"""Text cut to fit a terminal's line, shared by the terminal view and the listings.

Its own module so that a listing (`subs sessions list`) prints without loading the
terminal view, which needs the engine's event model.
"""

from __future__ import annotations


def short(text: str, limit: int = 80) -> str:
    """`text`, or its first `limit - 1` characters and an ellipsis."""
    return text if len(text) <= limit else text[: limit - 1] + "…"
