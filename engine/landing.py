"""Sessions that land in Slack: what the API hands the bot when a full key points a session
at a channel or thread (the original engine's `slack_channel` / `slack_thread_ts` owner
metadata), and the one place that reads those keys.

The API decides *whether* a submit lands (`slack_target`); the bot, through a `Lander`
that `subs serve` hands the API, records the turn as one of its checkpoints before the API
answers, so the turn is posted, submitted and streamed by the same machinery as a mention
(exactly once across a crash). Plain data: both `engine/api/` and `bot/turns/` import it.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from engine.errors import SubsError

__all__ = [
    "CHANNEL_KEY",
    "THREAD_KEY",
    "AlertHook",
    "Landed",
    "Lander",
    "Landing",
    "LandingError",
    "slack_target",
]

CHANNEL_KEY = "slack_channel"  # the original engine's owner metadata names
THREAD_KEY = "slack_thread_ts"
_CHANNEL = re.compile(r"[CGD][A-Z0-9]{2,40}")  # a conversation id, never a #name
_TS = re.compile(r"[0-9]{1,12}\.[0-9]{1,9}")  # a Slack message ts, "seconds.micros"


class LandingError(SubsError):
    """A submit that names a Slack channel but cannot land there (bad metadata, no app)."""

    code = "invalid_input"
    status = 422


@dataclass(frozen=True)
class Landing:
    """One turn a full key sends into Slack: `thread_ts` None posts a new root message
    (its text `title`) whose thread becomes the session's home."""

    agent: str
    session_id: str
    turn_id: str
    channel: str
    thread_ts: str | None
    input: dict[str, Any]  # the ClientInput, with agent_id and turn_id
    identity: dict[str, Any]  # the session's owner identity, recorded by its first input
    title: str


@dataclass(frozen=True)
class Landed:
    """Where the turn goes: the thread (None until the bot posts the root message)."""

    channel: str
    thread_ts: str | None
    recorded: bool  # False: this turn was landed already (a retried request)


class Lander(Protocol):
    """What the bot offers the API (bot/app.py `Bots`, landing by bot/turns/land.py)."""

    def land(self, landing: Landing) -> Awaitable[Landed]:
        """Record the turn for the bot to post, submit and stream; raises LandingError
        (409) when no Slack app of `landing.agent` runs here."""

    def home(self, session_id: str) -> Awaitable[tuple[str, str] | None]:
        """(channel, thread_ts) of a session already landed in Slack, else None."""


def slack_target(metadata: Mapping[str, Any] | None) -> tuple[str, str | None] | None:
    """(channel, thread_ts or None) the metadata points at, None when it names no channel.

    Raises:
        LandingError: a channel or ts of the wrong shape (a `#name`, a number), naming it.
    """
    if not metadata or CHANNEL_KEY not in metadata:
        if metadata and metadata.get(THREAD_KEY) is not None:
            raise LandingError(
                f"identity.metadata.{THREAD_KEY}: needs {CHANNEL_KEY} too (the thread's channel)",
                param=f"identity.metadata.{THREAD_KEY}",
            )
        return None
    channel, thread = metadata.get(CHANNEL_KEY), metadata.get(THREAD_KEY)
    if not isinstance(channel, str) or not _CHANNEL.fullmatch(channel):
        raise LandingError(
            f"identity.metadata.{CHANNEL_KEY}: a Slack channel id like C0123ABCD "
            f"(never a #name), not {str(channel)[:40]!r}",
            param=f"identity.metadata.{CHANNEL_KEY}",
        )
    if thread is not None and (not isinstance(thread, str) or not _TS.fullmatch(thread)):
        raise LandingError(
            f"identity.metadata.{THREAD_KEY}: a Slack message ts like 1712345678.000100, "
            f"not {str(thread)[:40]!r}",
            param=f"identity.metadata.{THREAD_KEY}",
        )
    return channel, thread


@dataclass(frozen=True)
class AlertHook:
    """`[hooks.alertmanager]`: the agent that triages, and the channel its threads go to."""

    agent: str
    channel: str
