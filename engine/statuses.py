"""Every status word subs records or shows, as a closed set mypy holds each use to.

One place, importing nothing: the pure machine writes them into its state, and the
client, the API, the CLI and the bot's rendering read them (`subs sessions list --url`
loads none of the engine to do it).
"""

from __future__ import annotations

from typing import Literal, TypeGuard, get_args

# What a session is doing (`SessionState.status`): an open interrupt outranks a turn.
SessionStatus = Literal["idle", "running", "interrupted"]
# A session as a listing shows it and `?status=` filters it: `failed` for an idle
# session whose last turn failed (engine/listing.py `session_row`).
ListedStatus = Literal["idle", "running", "interrupted", "failed"]
LISTED_STATUSES: tuple[ListedStatus, ...] = get_args(ListedStatus)
# Each turn of a session (`SessionState.turns`), from its start or its queueing on.
TurnStatus = Literal["queued", "running", "completed", "failed"]
# An open call (`Call.status`): `waiting` on an outside settle (an async worker tool, a
# client tool), `retry_scheduled` while a backoff timer runs.
CallStatus = Literal["requested", "running", "retry_scheduled", "waiting", "failed"]
# The session's one live decision (`Decision.status`).
DecisionStatus = Literal["running", "waiting", "retry_scheduled", "failed"]
# How a turn watched at a terminal ended for the watcher: `detached` when the watcher
# stopped following it (the turn itself goes on).
WatchedStatus = Literal["completed", "failed", "detached"]
# A tool line in a Slack reply.
LineState = Literal["running", "ok", "error"]


def is_listed_status(word: str) -> TypeGuard[ListedStatus]:
    """Whether a word from outside (a query, a flag) is one a listing filters on."""
    return word in LISTED_STATUSES
