"""Whether an API submit lands in Slack, and handing it to the bot when it does: the one
place every route that submits for a full key goes through (`POST /api/client/sessions/input`,
the Alertmanager hook, a machine submit).

A session lands when the identity of its first submit names `slack_channel` (and maybe
`slack_thread_ts`); its later turns land in the same thread. The bot records the turn as a
checkpoint before this answers (engine/landing.py), then posts the root message, submits
the input under the turn id chosen here and streams the reply: so the API answers 202 with
the session, the turn and where it goes, before the turn is submitted.
"""

from __future__ import annotations

from typing import Any

from engine.api.state import ApiState
from engine.client import validate_client_input
from engine.ids import new_id
from engine.landing import Landing, LandingError, slack_target
from engine.machine.turns import TURN_STARTS
from engine.messages import text_of

TITLE_CHARS = 300  # a root message quotes the input's start, not a whole document


async def land_if_slack(
    api: ApiState,
    payload: Any,
    *,
    session_id: str | None,
    identity: dict[str, Any],
    full: bool,
    title: str | None = None,
) -> dict[str, Any] | None:
    """The answer for a submit that lands in Slack; None for one that does not.

    Raises:
        LandingError: the metadata is malformed, the session exists and was not started
            in Slack, the input starts no turn, or no Slack app of its agent runs here.
    """
    target = slack_target(identity.get("metadata"))
    home = None
    if session_id is not None and api.lander is not None:
        home = await api.lander.home(session_id)
    if target is None and home is None:
        return None
    if not isinstance(payload, dict) or payload.get("type") not in TURN_STARTS:
        if home is not None and target is None:
            return None  # an answer to a prompt, a cancel: it goes straight to the engine
        raise LandingError(
            f"input.type: a Slack landing starts a turn ({', '.join(TURN_STARTS)})",
            param="input.type",
        )
    if not full:
        raise LandingError(
            "identity: only a full-access key may point a session at Slack",
            status=403,
            code="forbidden",
            param="identity",
        )
    if home is None and session_id is not None and await api.store.head(session_id) is not None:
        raise LandingError(
            f"session {session_id!r} exists and was not started in Slack: only a session's "
            "first submit may point it at a channel (leave session_id out, or pick a new one)",
            status=409,
            code="conflict",
        )
    agent = payload.get("agent_id")
    if not isinstance(agent, str) or not agent:
        raise LandingError(
            "input.agent_id: required to land in Slack (its agent's app posts)",
            param="input.agent_id",
        )
    if api.lander is None:
        raise LandingError(
            "no Slack app runs in this process: a session lands in Slack only through "
            "`subs serve` with the agent's Slack app configured",
            status=409,
            code="slack_unavailable",
        )
    sid = session_id or new_id("ses")
    turn_id = payload.get("turn_id") or new_id("turn")
    if home is not None and payload.get("turn_id"):
        # A turn id the session has seen is that turn, however late it comes back (the
        # bot's dedupe keys last an hour; the session's own state holds every turn id).
        status = await api.client.turn_status(sid, str(turn_id))
        if status is not None:
            slack = {"agent": agent, "channel": home[0], "thread_ts": home[1] or None}
            queued = status == "queued"
            answer = {"session_id": sid, "turn_id": turn_id, "queued": queued}
            return {**answer, "existing": True, "slack": slack}
    payload = {**payload, "turn_id": turn_id}
    validate_client_input(payload)  # refused here, not in Slack after the root is posted
    channel, thread_ts = home or target  # type: ignore[misc]  # one of them is set
    landed = await api.lander.land(
        Landing(
            agent=agent,
            session_id=sid,
            turn_id=str(turn_id),
            channel=channel,
            thread_ts=thread_ts,
            input=payload,
            identity=identity,
            title=title or _title(payload),
        )
    )
    slack = {"agent": agent, "channel": landed.channel, "thread_ts": landed.thread_ts}
    return {"session_id": sid, "turn_id": turn_id, "queued": True, "slack": slack}


def _title(payload: dict[str, Any]) -> str:
    """The root message's text: the first thing the input says, shortened."""
    messages = payload.get("messages") or [payload.get("message")]
    for msg in messages if isinstance(messages, list) else []:
        if isinstance(msg, dict):
            text = text_of(msg.get("content")).strip()
            if text:
                return text if len(text) <= TITLE_CHARS else text[: TITLE_CHARS - 1] + "…"
    name = payload.get("name")
    return f"`{name}`" if isinstance(name, str) and name else "A turn from the API"
