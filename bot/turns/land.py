"""A turn the API sends into Slack (engine/landing.py), made a checkpoint the followers follow.

The API's other way in, beside Slack's own inputs (bot/turns/listeners.py): no person asked
in Slack, so the app posts the root message (when no thread is named) under the session's
title, and the turn keeps the API's turn id and caller's identity. The session's home (its
thread) is claimed before anything is posted, so two landings never post two roots.
"""

from __future__ import annotations

import time

from bot.turns.checkpoint import CLOCK_SKEW, Checkpoint
from bot.turns.follower import DEDUPE_SECONDS, Followers
from bot.turns.store import seen_key
from engine.landing import Landed, Landing, LandingError

__all__ = ["land"]


async def land(followers: Followers, landing: Landing) -> Landed:
    """Recorded as a checkpoint before the API answers, then followed as a mention is: the
    root message (when no thread is named), the submit under the API's turn id, the
    streamed reply.

    The session's home is claimed first: a second landing while its root is still being
    posted is told to retry (503) rather than post a second root.

    Raises:
        LandingError: no app of the agent here (409), or the home is being posted (503).
    """
    bot = followers.bots.get(landing.agent)
    if bot is None:
        raise LandingError(
            f"agent {landing.agent!r} has no Slack app running here (its [agent."
            f"{landing.agent}.slack] block and SLACK_BOT_TOKEN_* are needed)",
            status=409,
            code="slack_unavailable",
        )
    sid, channel, thread = landing.session_id, landing.channel, landing.thread_ts or ""
    home = await followers.checkpoints.claim_home(
        sid, landing.agent, channel, thread, DEDUPE_SECONDS
    )
    if home is not None:
        _, channel, thread = home
        if not thread:
            raise LandingError(
                f"session {sid!r}: its Slack thread is still being posted; try again",
                status=503,
                code="unavailable",
            )
    cp = Checkpoint(
        agent=landing.agent,
        team="",
        channel=channel,
        thread_ts=thread,
        turn_id=landing.turn_id,
        user="",
        payload=landing.input,
        since=f"{time.time() - CLOCK_SKEW:.6f}",
        trigger=thread,
        by_app=True,  # no person asked in Slack: nobody to stream to natively
        session=sid,
        identity=landing.identity,
        title=landing.title,
    )
    recorded = await followers.start_turn(cp, [seen_key("land", f"{sid} {landing.turn_id}")])
    return Landed(channel, thread or None, recorded)
