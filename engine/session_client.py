"""What a caller may ask of an engine, whichever way it reaches it.

Two clients implement it: `engine.client.Client` (in process, over the engine's Redis)
and `engine.cli.remote.HttpClient` (a remote engine's HTTP API). The CLI holds one of
them through this Protocol, so a command written once works both ways; mypy holds both
classes to these signatures where the CLI hands either out as one (`cli/connect.py`,
`cli/run.py`).

Imports only typing (and the status words): `subs sessions list --url` loads it without
loading the engine.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol, TypedDict

from engine.statuses import ListedStatus


class BucketRow(TypedDict):
    """One budget-policy bucket a session counts toward, as read when listed: `used` of
    `limit` (tokens, or USD for `cost_usd`) in its window; `frees_at` (ISO 8601 UTC) when
    it is spent, else None."""

    policy: str
    group: str
    dimension: str
    used: str
    limit: str
    frees_at: str | None


class SessionRow(TypedDict):
    """A session as a listing shows it (`engine.listing.session_row`, the admin API's rows).

    Times are ISO 8601 UTC text; `failed` says the last turn failed, and `error` why while
    that failure is the newest event; `first_message` is None for a session not yet asked.
    """

    session_id: str
    agent_id: str
    status: ListedStatus
    created_at: str
    first_event_at: str
    last_event_at: str | None
    wake_at: str | None
    top_level: bool
    sub_agent_cost: str
    turn_id: str | None
    seq: int
    last_activity_at: str | None
    turns: int
    first_message: str | None
    tokens: int
    cost: str
    failed: bool
    error: str | None
    budgets: list[BucketRow]  # its `[[budgets]]` buckets ([] when the project has none)


class SessionClient(Protocol):
    """Submit inputs to sessions and read them back. Refusals are `ClientError`s."""

    async def submit(
        self,
        payload: dict[str, Any],
        *,
        session_id: str | None = None,
        identity: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Send one ClientInput; `{session_id, turn_id?, queued?}` once it is committed."""
        ...

    async def settle(
        self,
        session_id: str,
        call_id: str,
        *,
        attempt: int | None = None,
        result: Any = None,
        error: str | None = None,
        retryable: bool = False,
    ) -> dict[str, Any]:
        """End an async worker (or client) tool call from outside (SPEC §6)."""
        ...

    async def interrupt(self, session_id: str, reason: str, payload: Any = None) -> dict[str, Any]:
        """Pause the running turn (SPEC §8); `{interrupt_id}`."""
        ...

    async def cancel(self, session_id: str, reason: str | None = None) -> dict[str, Any]:
        """End the running turn as failed; `{session_id, turn_id}`."""
        ...

    async def delete(self, session_id: str) -> None:
        """Remove an idle session and everything stored for it."""
        ...

    async def session(self, session_id: str) -> dict[str, Any] | None:
        """The session as a client reads it; None when there is none."""
        ...

    async def sessions(self, offset: int = 0, limit: int = 50) -> list[str]:
        """Session ids, newest first."""
        ...

    async def session_rows(
        self, limit: int = 50, cursor: str | None = None
    ) -> tuple[list[SessionRow], str | None]:
        """A page of the admin list, latest activity first; and the next page's cursor
        (None on the last)."""
        ...

    async def dead_letters(self, limit: int = 100) -> list[dict[str, Any]]:
        """Inputs the engine could not apply, newest first."""
        ...

    async def events(self, session_id: str, after_seq: int = 0) -> list[dict[str, Any]]:
        """The session's recorded events after `after_seq`, oldest first."""
        ...

    async def delta_cursor(self, session_id: str) -> str:
        """Where to follow token deltas from so as to miss nothing new."""
        ...

    def follow(
        self, session_id: str, after_seq: int = 0, *, delta_cursor: str | None = None
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """`("event", Event)` and `("delta", TokenDelta)` as they come."""
        ...
