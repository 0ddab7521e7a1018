"""What a turn's reply is made of in Slack: its parts, the stamp each carries, and the state
that says which of them landed.

Every post is one *part* of the reply (`reply`, `more-<n>`, `prompt-<id>`, `root`) and
carries message metadata naming the turn and the part, so a bot that resumes a dead one's
turn finds what already landed and posts only the rest.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from bot.payloads import SlackMessage

__all__ = ["STAMP", "ReplyState", "Save", "stamp", "stamped_parts"]

STAMP = "subs_turn"  # message metadata event_type on every message the bot posts for a turn


class ReplyState(Protocol):
    """Where a reply goes and what of it landed: the turn's checkpoint (bot/turns/), which
    this layer writes through and never builds."""

    team: str
    channel: str
    thread_ts: str
    turn_id: str
    user: str
    since: str  # ts the turn began at: its messages in the thread come after it
    bot_id: str  # this app's bot id, to know its own unstamped messages
    quiet: bool  # no "No reply." message when there is nothing to say
    posted: dict[str, str]  # reply part -> message ts
    streaming: str  # ts of a native stream not known to be stopped


Save = Callable[[], Awaitable[None]]  # make what `ReplyState` holds durable


def stamp(turn_id: str, part: str) -> dict[str, Any]:
    """The message metadata that marks a reply part as this turn's, so a follower that takes
    over finds what an earlier one posted."""
    return {"event_type": STAMP, "event_payload": {"turn_id": turn_id, "part": part}}


def stamped_parts(messages: list[SlackMessage], turn_id: str) -> dict[str, str]:
    """`part -> ts` of the thread's messages stamped for `turn_id`."""
    parts: dict[str, str] = {}
    for msg in messages:
        meta = msg.get("metadata") or {}
        payload = meta.get("event_payload") or {}
        if meta.get("event_type") == STAMP and payload.get("turn_id") == turn_id:
            parts.setdefault(str(payload.get("part")), str(msg["ts"]))
    return parts
