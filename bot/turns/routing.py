"""Which Slack events start a turn, and in which session (SPEC §14: a thread is a session).

Pure reads of an Events API `event` dict. Events come from outside, so every field is
treated as possibly missing or of the wrong type: a predicate says no rather than raise.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Literal

from bot.turns.watch import Watch, watched

__all__ = [
    "ANSWERS",
    "is_dm",
    "is_mention",
    "is_own",
    "missed_messages",
    "route",
    "session_id_for",
    "thread_ts_of",
    "wants_turn",
]

ANSWERS = frozenset({"dm", "channels", "both"})
# Subtypes of messages someone posted (a person, another app, an integration); the others
# are notices (joins, topic changes, …) Slack writes itself.
SAID = frozenset({"bot_message", "thread_broadcast", "file_share", "me_message"})
Event = dict[str, Any]
Route = Literal["mention", "dm", "alert", "reply"]
_USER_MENTION = re.compile(r"<@([UW][A-Z0-9]+)(?:\|[^>]*)?>")
_GROUP_MENTION = re.compile(r"<!subteam\^")


def session_id_for(agent: str, channel: str, thread_ts: str) -> str:
    return f"slack:{agent}:{channel}:{thread_ts}"


def _str(event: Event, key: str) -> str | None:
    value = event.get(key)
    return value if isinstance(value, str) and value else None


def thread_ts_of(event: Event) -> str | None:
    """The thread a message belongs to: its `thread_ts`, or its own `ts` when top-level."""
    return _str(event, "thread_ts") or _str(event, "ts")


def is_dm(event: Event) -> bool:
    """A person's message in the app's DM (`message.im`): plain, or with files
    (`subtype: file_share`, which may carry no text at all)."""
    return (
        event.get("type") == "message"
        and event.get("channel_type") == "im"
        and event.get("subtype", None) in (None, "file_share")
        and ("subtype" not in event or bool(event.get("files")))
    )


def is_mention(event: Event) -> bool:
    """An `app_mention`: Slack sends it only for messages that mention this app (one with
    files may say `subtype: file_share`)."""
    return event.get("type") == "app_mention" and event.get("subtype", None) in (
        None,
        "file_share",
    )


def is_own(event: Event, bot_user: str | None, bot_id: str | None) -> bool:
    """The app's own message (or one posted under its bot id): never starts a turn."""
    if bot_id is not None and event.get("bot_id") == bot_id:
        return True
    return bot_user is not None and event.get("user") == bot_user


def wants_turn(event: Event, answers: str, bot_user: str | None, bot_id: str | None) -> bool:
    """Whether this event starts (or queues) a turn, honouring the agent's `answers`.

    A channel mention is answered for `channels`/`both`, a DM for `dm`/`both`. A mention
    inside a DM arrives as a DM message too; only the `message` event counts there.
    """
    if is_own(event, bot_user, bot_id) or "edited" in event:
        return False  # an edit is no new question (and its ts names a turn already asked)
    if not all(_str(event, key) for key in ("user", "channel", "ts")):
        return False
    if not isinstance(event.get("text"), str) or thread_ts_of(event) is None:
        return False
    if is_dm(event):
        return answers in ("dm", "both")
    if is_mention(event) and event.get("channel_type") != "im":
        return answers in ("channels", "both")
    return False


def missed_messages(
    replies: list[dict[str, Any]], before_ts: str, bot_user: str | None, bot_id: str | None
) -> list[dict[str, Any]]:
    """The messages of a thread (`conversations.replies`, oldest first) after the app's last
    message and before `before_ts`: what the agent has not seen yet. People's, and other
    apps' and integrations' (an alert at the thread's root is what people ask about); never
    the app's own."""
    missed: list[dict[str, Any]] = []
    for msg in replies:
        ts = _ts_key(msg.get("ts"))
        if ts is None or ts >= (_ts_key(before_ts) or ts):
            continue
        if is_own(msg, bot_user, bot_id):
            missed.clear()
        elif _posted(msg):
            missed.append(msg)
    return missed


def _posted(msg: dict[str, Any]) -> bool:
    """Someone's message: a person's (`user`) or an app's (`bot_id`), of a kind people post."""
    subtype = msg.get("subtype")
    if subtype is not None and subtype not in SAID:
        return False
    return bool(_str(msg, "user") or _str(msg, "bot_id"))


def _ts_key(ts: Any) -> tuple[int, int] | None:
    """A Slack ts ("seconds.micros") as a sortable pair; floats would lose the micros."""
    if not isinstance(ts, str):
        return None
    seconds, _, micros = ts.partition(".")
    if not seconds.isdigit() or not (micros.isdigit() or micros == ""):
        return None
    return int(seconds), int(micros.ljust(6, "0")[:6] or 0)


def route(
    event: Event,
    answers: str,
    bot_user: str | None,
    bot_id: str | None,
    *,
    follow: bool = False,
    watches: Iterable[Watch] = (),
) -> Route | None:
    """What this event asks of the app, if anything.

    - `mention` / `dm`: as `wants_turn` says; with channel messages subscribed, a mention
      also arrives as a `message` (its own event_id), read as the same mention, so the two
      deliveries make one turn (its id is the message's ts) whichever comes first.
    - `alert`: a new top-level post in a watched channel that an entry admits.
    - `reply`: with `follow`, a person's new reply in a thread that mentions nobody else;
      a follow-up if the app answered in that thread (the caller knows: the session).
    Edits, deletions and Slack's notices are none of these; the app's own posts never are.
    """
    if wants_turn(event, answers, bot_user, bot_id):
        return "dm" if is_dm(event) else "mention"
    if event.get("type") != "message" or event.get("channel_type") == "im":
        return None
    if is_own(event, bot_user, bot_id) or "edited" in event:
        return None
    subtype = event.get("subtype")
    if subtype is not None and subtype not in SAID:
        return None  # message_changed, message_deleted, joins, topic changes, ...
    if not (_str(event, "channel") and _str(event, "ts")):
        return None
    person = _str(event, "user") is not None and "bot_id" not in event
    text = _str(event, "text") or ""
    mentioned = set(_USER_MENTION.findall(text))
    channels = answers in ("channels", "both")
    if person and subtype in (None, "file_share") and bot_user in mentioned:
        return "mention" if channels else None  # the app_mention's twin (files or none)
    if thread_ts_of(event) == event["ts"]:  # top-level: an alert, or nothing for the app
        posted = _str(event, "user") or _str(event, "bot_id")
        return "alert" if posted and watched(event, watches) else None
    if not (follow and channels and person) or subtype == "bot_message":
        return None
    if mentioned - {bot_user} or _GROUP_MENTION.search(text):
        return None  # people talking to each other
    return "reply"
