"""Who may use an agent's Slack app (`[agent.<id>.slack] allow` and `external`).

Pure reads of who wrote (user, their team) and where (channel), against the agent's lists:
the reason for a refusal, or None. A person of another organisation on a Slack Connect
channel is told apart by their team: the event's `user_team` (Slack sets it on messages in
shared channels), else its `team`, is not the team the app is installed in.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["REFUSED", "Access", "refusal"]

# What the person refused is told (ephemeral), by reason: what happened, and what to do.
REFUSED = {
    "external": (
        "Sorry: this app only answers people of the organisation that installed it. "
        "Ask someone there to bring it your question."
    ),
    "team": "Sorry: this app does not answer people of your workspace. Ask its owner for access.",
    "channel": (
        "Sorry: this app does not answer in this channel. Ask its owner to allow the channel, "
        "or ask it where it answers."
    ),
    "user": "Sorry: you are not on this app's list of users. Ask its owner for access.",
}


@dataclass(frozen=True)
class Access:
    """An agent's lists (empty: any) and whether other organisations' people may use it."""

    teams: tuple[str, ...] = ()
    channels: tuple[str, ...] = ()
    users: tuple[str, ...] = ()
    external: bool = False


def refusal(
    access: Access, *, user: str, channel: str, user_team: str | None, app_team: str | None
) -> str | None:
    """Why `user` (of `user_team`) may not start a turn in `channel`, or None.

    `app_team` is the workspace the event was delivered for (the app's install); a
    `user_team` that differs is another organisation's person (Slack Connect)."""
    if not access.external and user_team and app_team and user_team != app_team:
        return "external"
    if access.teams and (user_team or app_team) not in access.teams:
        return "team"
    if access.channels and channel not in access.channels:
        return "channel"
    if access.users and user not in access.users:
        return "user"
    return None
