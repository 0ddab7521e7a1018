"""Where each followed turn stands, kept in Redis so a restarted bot finishes what a dead one began.

Issue 5 / SPEC §14: a turn's final reply lands exactly once even when the bot process is killed
mid-stream. The checkpoint is written together with the Slack input's dedupe keys (one script)
before Slack gets its ack and before the turn is submitted under a turn id the bot chose. So a
crash leaves either nothing (unacked: Slack delivers the event again) or a checkpoint another
follower resumes: it submits again (the engine answers an existing turn id with that turn),
follows the session's log from `after`, and posts only the parts of the reply that `posted`
(and the thread's message metadata stamps) do not show already.

A follower holds a short lease per turn, renewed while it follows, and writes the checkpoint
only under it (fenced in the scripts), so with several `subs serve` processes a turn is
followed by one of them, a dead process's turns move to a live one, and a follower that lost
its lease (a long stall) stops instead of writing over its successor.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from bot.payloads import Mention
from bot.turns.routing import session_id_for
from engine.errors import SubsError

__all__ = ["CLOCK_SKEW", "Checkpoint", "LeaseLost"]

# How far this host's clock may be off Slack's: a turn whose root is not posted yet has
# its `since` set this far back (a Slack ts is epoch seconds on Slack's clock).
CLOCK_SKEW = 60.0


class LeaseLost(SubsError):
    """Another follower holds the turn now: this one must stop writing to Slack."""

    def __init__(self, *, key: str) -> None:
        super().__init__(f"the lease on following {key} moved to another follower")
        self.key = key


@dataclass
class Checkpoint:
    """One turn the bot streams into a thread, and what of it is already in Slack."""

    agent: str
    team: str
    channel: str
    thread_ts: str
    turn_id: str
    user: str
    payload: dict[str, Any] | None  # the turn-starting input with `turn_id`; None: `mention`
    after: int = 0  # the session's last seq before the input: the turn's events come later
    cursor: str = "0-0"  # the delta stream's end at that moment
    trigger: str = ""  # the message a working reaction goes on
    since: str = ""  # ts the turn began at: its messages in the thread come after it
    bot_id: str = ""  # this app's bot id, to know its own unstamped messages
    # The message (a mention, DM, alert or follow-up) `payload` is built from.
    mention: Mention | None = None
    by_app: bool = False  # started by an app's post (an alert): no person to stream to natively
    quiet: bool = False  # a button's turn: no "No reply." message when it has nothing to say
    failures: int = 0  # followers that failed on it (not those that died or handed it over)
    retry_at: float = 0.0  # epoch seconds: not resumed before (backing off after a failure)
    posted: dict[str, str] = field(default_factory=dict)  # reply part -> message ts
    streaming: str = ""  # ts of a native stream not known to be stopped
    # A session landed from the API (engine/landing.py), or a mention in its thread: its
    # id, whatever its shape; empty: the thread's own `slack:` session.
    session: str = ""
    # A landed turn's owner identity (the API caller's, with its metadata), submitted
    # as a full key would; None: a Slack person's turn.
    identity: dict[str, Any] | None = None
    title: str = ""  # a landed turn's root message text

    @property
    def session_id(self) -> str:
        """The engine session of this thread (a thread is a session): its own, or the
        landed session whose home it is."""
        return self.session or session_id_for(self.agent, self.channel, self.thread_ts)

    @property
    def key(self) -> str:
        """Unique per turn: the bot's turn ids are unique within a channel."""
        return f"{self.agent} {self.channel} {self.turn_id}"

    def dumps(self) -> str:
        """As stored in Redis: compact JSON, read back by `loads`."""
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def loads(cls, raw: str | bytes) -> Checkpoint:
        """Fields this version does not know (a newer or older bot wrote it) are left out."""
        data = json.loads(raw)
        return cls(**{k: v for k, v in data.items() if k in _FIELDS})


_FIELDS = frozenset(f.name for f in fields(Checkpoint))
