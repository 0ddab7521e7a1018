"""Alert channels (`[[agent.<id>.slack.watch]]`): which new posts the app triages unasked.

Pure reads of a `message` event. An app's post is told by its `bot_id` (a classic app's or
an incoming webhook's carries `subtype: bot_message` and no `user`; a modern app's has no
subtype, but its `bot_id`, `bot_profile` and bot user), so a poster is matched by any name
Slack gives it: the name it posted under or its profile's, its bot id, its app id, its user
id. `match` is searched in the message as the model will read it (bot/rendering/
message_text.py: blocks, attachments and their fields), ids left as ids.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from bot.rendering.message_text import message_text

__all__ = ["Watch", "poster_names", "watched"]


@dataclass(frozen=True)
class Watch:
    """One watched channel: whose posts (`posters`, lower-cased; empty: anyone's) and which
    (`pattern`; None: any) start a turn."""

    channel: str
    posters: frozenset[str] = frozenset()
    pattern: re.Pattern[str] | None = None

    @classmethod
    def of(cls, channel: str, posters: Iterable[str], match: str | None) -> Watch:
        names = frozenset(p.strip().lower() for p in posters if p.strip())
        return cls(channel, names, re.compile(match) if match is not None else None)

    def admits(self, event: Mapping[str, Any]) -> bool:
        if self.posters and not (poster_names(event) & self.posters):
            return False
        return self.pattern is None or self.pattern.search(message_text(event, {})) is not None


def poster_names(event: Mapping[str, Any]) -> set[str]:
    """Every name and id Slack gives the poster of `event`, lower-cased."""
    found = [event.get(key) for key in ("user", "bot_id", "app_id", "username")]
    profile = event.get("bot_profile")
    if isinstance(profile, dict):
        found += [profile.get(key) for key in ("name", "app_id", "id")]
    return {v.strip().lower() for v in found if isinstance(v, str) and v.strip()}


def watched(event: Mapping[str, Any], watches: Iterable[Watch]) -> bool:
    """Whether an entry for the event's channel admits it (the caller checked it is new and
    top-level)."""
    channel = event.get("channel")
    return any(w.channel == channel and w.admits(event) for w in watches)
