"""What Slack allows, as the fake enforces it: rate tiers (a token bucket per method and
workspace), sizes, the default scopes, and Slack's error answer. Numbers from
notes/slack-facts.md; the few guesses are marked "unverified"."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# --- rate limits (notes §1.5, §3.3) ----------------------------------------------------


@dataclass(frozen=True)
class Limit:
    """`calls` per `per` Slack-seconds: a token bucket that holds `burst` calls (default `calls`).

    `per_channel` keys the bucket by channel as well (chat.postMessage's 1/s/channel rule).
    """

    calls: int
    per: float
    burst: int | None = None
    per_channel: bool = False


TIER_2 = Limit(20, 60)
TIER_3 = Limit(50, 60)
TIER_4 = Limit(100, 60)

# None = no limit: auth.test and setStatus are "special" tiers the notes give no number for;
# apps.connections.open is Tier 1 by slack_sdk's own comment, left open so reconnects stay fast.
DEFAULT_LIMITS: dict[str, Limit | None] = {
    # "one message per second per channel" with short bursts; the burst size is unverified.
    "chat.postMessage": Limit(1, 1, burst=3, per_channel=True),
    "chat.update": TIER_3,
    "chat.delete": TIER_3,
    "chat.postEphemeral": TIER_4,
    "chat.startStream": TIER_2,
    "chat.appendStream": TIER_4,
    "chat.stopStream": TIER_2,
    "conversations.replies": TIER_3,
    "conversations.history": TIER_3,
    "conversations.info": TIER_3,  # slack-api-ref docs.slack.dev/methods/conversations.info "t3"
    "reactions.add": TIER_3,
    "reactions.remove": TIER_2,
    "users.info": TIER_4,
    "bots.info": TIER_3,  # docs.slack.dev/reference/methods/bots.info: Tier 3
    "files.getUploadURLExternal": TIER_4,  # docs.slack.dev/reference/methods/…: Tier 4
    "files.completeUploadExternal": TIER_4,
    "usergroups.users.list": TIER_2,  # docs.slack.dev/reference/methods/usergroups.users.list
    "auth.test": None,
    "assistant.threads.setStatus": None,
    "apps.connections.open": None,
}

# Sizes (notes §1.7, §5).
POST_TEXT_MAX = 40_000  # chat.postMessage / postEphemeral truncate above this (a warning)
UPDATE_TEXT_MAX = 4_000  # chat.update: msg_too_long
MARKDOWN_MAX = 12_000  # markdown_text and each markdown chunk: msg_too_long (error name unverified)
BLOCKS_MAX = 50  # blocks per message (unverified)
BLOCKS_TEXT_MAX = 12_000  # cumulative text in blocks: msg_blocks_too_long (undocumented)
SECTION_TEXT_MAX = 3_000
LOADING_MESSAGES_MAX = 10
STREAM_LIFETIME = 300.0  # streams end about 5 minutes after start (§1.1)
STATUS_TIMEOUT = 120.0  # a thread status clears after two minutes without a message (§1.4)

DEFAULT_SCOPES = (
    "app_mentions:read,assistant:write,channels:history,chat:write,commands,files:read,"
    "files:write,groups:history,im:history,im:write,reactions:write,usergroups:read,"
    "users:read"
)


class SlackError(Exception):
    """A Slack error answer: `{"ok": false, "error": error, **extra}`."""

    def __init__(self, error: str, **extra: Any) -> None:
        super().__init__(error)
        self.error = error
        self.extra = extra


@dataclass
class Bucket:
    tokens: float
    stamp: float

    def take(self, limit: Limit, now: float, scale: float) -> float:
        """Takes one call: 0, or the seconds until one is available."""
        rate = limit.calls / (limit.per * scale)
        self.tokens = min(limit.burst or limit.calls, self.tokens + (now - self.stamp) * rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / rate
