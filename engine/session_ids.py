"""Session ids the engine's own channels derive, reserved to them (SPEC §14: a Slack
thread is the session `slack:{agent}:{channel}:{thread_ts}`). Such an id is predictable,
so a key that could create one first would own the thread the bot later writes into:
only a full-access key may create or write a reserved id. The one list is here."""

from __future__ import annotations

SLACK_PREFIX = "slack:"
# prefix -> whose ids they are, as a refusal names them
RESERVED_PREFIXES: dict[str, str] = {SLACK_PREFIX: "the Slack bot's threads"}


def slack_session_id(agent: str, channel: str, thread_ts: str) -> str:
    """The session a Slack thread maps to; one per agent, channel and root ts."""
    return f"{SLACK_PREFIX}{agent}:{channel}:{thread_ts}"


def reserved_for(session_id: str) -> str | None:
    """Why `session_id` is reserved (`'slack:' ids are the Slack bot's threads`), or None."""
    for prefix, owner in RESERVED_PREFIXES.items():
        if session_id.startswith(prefix):
            return f"ids starting with {prefix!r} are {owner}"
    return None
