"""The admin list over the engine's Redis: a session as a listing row, and the pages.

Pages are read from the listing indexes the commit keeps (engine/store/index.py), never a
scan; a row joins a session's state with its newest event, its wake time and what its
subagents and budget buckets hold. `Client` (engine/client.py) lists through this.
"""

from __future__ import annotations

import time
from typing import Any

from engine.machine import SessionState, iso
from engine.machine.accounting import add_cost
from engine.machine.events import TURN_FAILED
from engine.machine.policies import BudgetPolicy, buckets_for, context_of
from engine.messages import text_of
from engine.session_client import BucketRow, SessionRow
from engine.statuses import ListedStatus
from engine.store.index import Cursor, Sort, read_scopes, scopes_of
from engine.store.reindex import ensure_indexes
from engine.store.snapshots import load_states
from engine.store.store import Store


def session_row(state: SessionState, last: dict[str, Any] | None) -> SessionRow:
    """A session as a listing shows it; `last` is its newest event. `failed` says its last
    turn failed (`error`: why, while that failure is the newest event); `status` is the
    session's, `failed` instead of `idle` then. Times are ISO 8601 UTC text.

    It reads whatever an older version stored: a first message with no text lists as "".
    """
    first = next((n.message for n in state.nodes.values() if n.message.get("role") == "user"), None)
    failed = _last_failed(state)
    payload = last["payload"] if last else {}
    error = payload.get("error") if payload.get("type") == TURN_FAILED else None
    last_at = last["occurred_at"] if last else None
    return {
        "session_id": state.session_id,
        "agent_id": state.agent_id,
        "status": listed_status(state),
        "created_at": iso(state.created_at),
        "first_event_at": iso(state.created_at),
        "last_event_at": last_at,
        "wake_at": None,
        "top_level": not state.ancestry,
        "sub_agent_cost": "0",
        "turn_id": state.turn.id if state.turn is not None else None,
        "seq": state.seq,
        "last_activity_at": last_at,
        "turns": len(state.turns),
        "first_message": _words(text_of(first.get("content")), 80) if first else None,
        "tokens": state.usage.get("total", 0),
        "cost": state.cost,
        "failed": failed,
        "error": _words(str(error.get("message", "")), 160) if isinstance(error, dict) else None,
        "budgets": [],  # filled in by a client that knows the project's policies
    }


def _last_failed(state: SessionState) -> bool:
    return state.last_turn is not None and state.turns.get(state.last_turn) == "failed"


def listed_status(state: SessionState) -> ListedStatus:
    """The session's status as a listing words it: `failed` for an idle session whose
    last turn failed."""
    return "failed" if _last_failed(state) and state.status == "idle" else state.status


def row_matches(row: SessionRow, agent: str | None, status: ListedStatus | None) -> bool:
    """A listing filter on the row's agent and `status` (as `session_row` words it)."""
    if agent is not None and row["agent_id"] != agent:
        return False
    return status is None or row["status"] == status


def _words(text: str, limit: int) -> str:
    """Text on one line, cut at `limit` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


FIND_BATCH = (
    200  # sessions a status-filtered listing reads at once: few round trips, bounded memory
)
FILTER_SCAN = 1000  # sessions one status-filtered page reads at most, matches or not


class SessionListing:
    """The admin list's reads, for a client over the engine's own Redis."""

    store: Store
    policies: tuple[BudgetPolicy, ...]

    async def sessions(self, offset: int = 0, limit: int = 50) -> list[str]:
        """Session ids, newest first."""
        return await self.store.list_sessions(offset, limit)

    async def session_rows(
        self, limit: int = 50, cursor: str | None = None
    ) -> tuple[list[SessionRow], str | None]:
        """One page of the admin list in its default order (`list_page`), and the cursor
        of the next page (None on the last)."""
        page = await self.list_page(limit=limit, cursor=cursor)
        return page["items"], page["next_cursor"]

    async def list_page(
        self,
        *,
        limit: int = 50,
        cursor: str | None = None,
        sort: Sort = "last_event_desc",
        top_level: bool | None = None,
        agent_id: str | None = None,
        session_id: str | None = None,
        status: ListedStatus | None = None,
    ) -> dict[str, Any]:
        """A page of the admin list, `{items, next_cursor}` (the original engine's shape),
        read from the listing indexes (engine/store/index.py): ordered as of the listing's
        first page, so a session written between pages is neither given twice nor
        skipped. `top_level` defaults to true (subagents' sessions left out), except
        with `session_id`, which finds the one session whatever it is. A `status` filter
        reads at most `FILTER_SCAN` sessions a page, so a page may hold fewer than `limit`
        items with a `next_cursor` to go on from.

        Raises:
            ClientError: `invalid_query` (400) for a cursor it cannot go on from.
        """
        await ensure_indexes(self.store)  # one HGET once they are built
        if session_id is not None:
            hit = [
                r
                for r in await self._rows([session_id])
                if (agent_id is None or r["agent_id"] == agent_id)
                and (status is None or r["status"] == status)
                and (top_level is None or r["top_level"] == top_level)
            ]
            return {"items": hit, "next_cursor": None}
        top = True if top_level is None else top_level  # subagents' sessions only if asked
        filters = f"{int(top)}|{agent_id or ''}|{status or ''}"
        at: Cursor | None = None
        if cursor is not None:
            at = Cursor.decode(
                cursor,
                sort=sort,
                filters=filters,
                now_ms=int(time.time() * 1000),
                partitions=self.store.partitions,
            )
        scopes = read_scopes(agent_id, top)
        began = at.began_ms if at else int(time.time() * 1000)
        items: list[SessionRow] = []
        scanned = 0
        while True:
            page = await self.store.index_page(
                sort, scopes, limit if status is None else FIND_BATCH, at
            )
            marks = page.marks if at is None else at.marks
            states = await load_states(self.store, [s for s, _ in page.items])
            last: tuple[str, float] | None = None
            hits: list[SessionState] = []
            for (sid, score), state in zip(page.items, states, strict=True):
                last = (sid, score)
                scanned += 1
                if state is not None and (status is None or listed_status(state) == status):
                    hits.append(state)
                    if len(items) + len(hits) == limit:
                        break
            items += await self._rows_of(hits)
            more = page.more or (last is not None and last != page.items[-1])
            if last is not None:
                at = Cursor(sort, filters, began, marks, last[1], last[0])
            if not more or len(items) == limit or scanned >= FILTER_SCAN:
                break
        return {"items": items, "next_cursor": at.encode() if more and at is not None else None}

    async def _rows(self, ids: list[str]) -> list[SessionRow]:
        """Listing rows for these sessions (`_rows_of`); a session gone since its id was
        read is left out."""
        states = await load_states(self.store, ids)
        return await self._rows_of([st for st in states if st is not None])

    async def _buckets(self, states: list[SessionState]) -> list[list[BucketRow]]:
        """Each session's budget buckets as they stand (one read for the page)."""
        # A subagent's session counts toward its root's person and channel (apply.py).
        roots = sorted({s.ancestry[0] for s in states if s.ancestry})
        identity = await self.store.identities(roots) if roots else {}
        refs = [
            buckets_for(
                self.policies,
                context_of(
                    s.session_id, s.agent_id, identity[s.ancestry[0]] if s.ancestry else s.identity
                ),
            )
            for s in states
        ]
        uses = await self.store.read_buckets(
            [r for rs in refs for r in rs], int(time.time() * 1000)
        )
        out: list[list[BucketRow]] = []
        at = 0
        for rs in refs:
            out.append(
                [
                    {
                        "policy": u.policy,
                        "group": u.group,
                        "dimension": u.dimension,
                        "used": u.used,
                        "limit": u.limit,
                        "frees_at": None if u.frees_at is None else iso(u.frees_at),
                    }
                    for u in uses[at : at + len(rs)]
                ]
            )
            at += len(rs)
        return out

    async def _rows_of(self, states: list[SessionState]) -> list[SessionRow]:
        """Listing rows for these sessions (`session_row`), with the wake time the index
        holds and the cost their subagent sessions added."""
        lasts = await self.store.last_events([st.session_id for st in states])
        found = list(zip(states, lasts, strict=True))
        children = [c for st, _ in found for c in st.children]
        kids = dict(zip(children, await load_states(self.store, children), strict=True))
        async with self.store.redis.pipeline(transaction=False) as pipe:
            for st, _ in found:
                scope = scopes_of(st.agent_id, not st.ancestry)[0]
                pipe.zscore(
                    self.store.index_key(self.store.partition_of(st.session_id), "wake", scope),
                    st.session_id,
                )
            wakes = await pipe.execute() if found else []
        rows = []
        for (st, last), wake in zip(found, wakes, strict=True):
            row = session_row(st, last)
            row["wake_at"] = iso(int(wake)) if wake is not None else None
            sub = "0"
            for child in st.children:
                kid = kids.get(child)
                if kid is not None:
                    sub = add_cost(sub, kid.cost)
            row["sub_agent_cost"] = sub
            rows.append(row)
        if self.policies:
            for row, used in zip(rows, await self._buckets(states), strict=True):
                row["budgets"] = used
        return rows
