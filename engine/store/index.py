"""The listing indexes: each partition's sessions in sorted sets by first event, last
event and wake time, kept by the commit that changes them, and read a page at a time
with a cursor that holds still while sessions are written.

Each session sits in the sets of its scopes: `t` (top level) or `s` (a subagent's), and
`a:<agent>:t|s`, so `top_level` and `agent_id` choose the sets to read rather than filter
what is read. The scopes are kept in the snapshot hash (`ix`) for whoever removes it.

A first-event score never changes; a last-event or wake score does, and a listing that
ordered by the scores of each page's own instant would show a session moved between
pages twice, or not at all. So a listing's first page bumps each partition's mark, and
the first commit to move a session after a mark writes where it was (`ix:moves`, kept
an hour); later pages place such a session where it was when the listing began. A
listing is therefore ordered as of its first page, and its cursor expires with the moves
it needs (`CURSOR_TTL_MS`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import orjson
from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

from engine.errors import ClientError
from engine.store.connection import RedisClient, lua_script
from engine.store.keys import Keys

Sort = Literal["last_event_desc", "first_event_asc", "first_event_desc", "wake_at_asc"]
SORTS: tuple[Sort, ...] = ("last_event_desc", "first_event_asc", "first_event_desc", "wake_at_asc")
_SETS: dict[Sort, str] = {
    "last_event_desc": "last",
    "first_event_asc": "first",
    "first_event_desc": "first",
    "wake_at_asc": "wake",
}
CURSOR_TTL_MS = 30 * 60 * 1000  # the moves are kept an hour; a cursor is good for half that

PAGE_SCRIPT = lua_script(__package__, "ix_page.lua")
BUILD_SCRIPT = lua_script(__package__, "ix_build.lua")


def scopes_of(agent_id: str, top_level: bool) -> tuple[str, ...]:
    """The index scopes a session is listed under."""
    where = "t" if top_level else "s"
    return (where, f"a:{agent_id}:{where}")


def read_scopes(agent_id: str | None, top_level: bool) -> tuple[str, ...]:
    """The scopes a listing reads for its filters: one or both of top level and subagents,
    of every agent or one."""
    wheres = ("t",) if top_level else ("t", "s")
    return tuple(w if agent_id is None else f"a:{agent_id}:{w}" for w in wheres)


@dataclass(frozen=True)
class IndexWrite:
    """What a commit writes to the listing indexes: the session's times and scopes."""

    created_ms: int
    last_ms: int
    wake_ms: int | None
    scopes: tuple[str, ...]


class CursorError(ClientError):
    """A cursor this listing cannot go on from: a 400 naming `cursor`, saying why."""

    def __init__(self, message: str) -> None:
        super().__init__(
            f"cursor: {message}", code="invalid_query", status=400, detail={"param": "cursor"}
        )


@dataclass(frozen=True)
class Cursor:
    """Where a listing stands: its sort and filters (a cursor goes on only with the ones
    it was made for), when it began and each partition's mark then (a sort whose scores
    move), and the last item given (score, session id)."""

    sort: Sort
    filters: str
    began_ms: int
    marks: tuple[int, ...]
    score: float
    member: str

    def encode(self) -> str:
        """The opaque text a client sends back as `cursor`."""
        raw = orjson.dumps(
            [1, self.sort, self.filters, self.began_ms, list(self.marks), self.score, self.member]
        )
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @staticmethod
    def decode(text: str, *, sort: Sort, filters: str, now_ms: int, partitions: int) -> Cursor:
        """The cursor `text` names, checked against this request.

        Raises:
            CursorError: not one of ours, made for another sort or filters, or too old.
        """
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
            v, c_sort, c_filters, began, marks, score, member = orjson.loads(raw)
            ok = (
                v == 1
                and isinstance(began, int)
                and isinstance(marks, list)
                and all(isinstance(m, int) for m in marks)
                and isinstance(score, int | float)
                and isinstance(member, str)
            )
        except (binascii.Error, ValueError, TypeError):
            ok = False
        if not ok:
            raise CursorError("not a cursor this server made (send next_cursor as it came)")
        if c_sort != sort or c_filters != filters:
            raise CursorError(
                "made for another sort or other filters: send the same sort, top_level, "
                "agent_id and status as the first page did"
            )
        if marks and len(marks) != partitions:
            raise CursorError("made for a store with another partition count")
        if now_ms - began > CURSOR_TTL_MS:
            raise CursorError(
                f"older than {CURSOR_TTL_MS // 60000} minutes: start again from the first page"
            )
        return Cursor(sort, filters, began, tuple(marks), float(score), member)


@dataclass
class IndexPage:
    """Session ids in listing order with their scores (as of the listing's first page),
    and the marks the next page needs."""

    items: list[tuple[str, float]]
    marks: tuple[int, ...]
    more: bool = False
    read: int = field(default=0)


def _order_key(sort: Sort) -> Any:
    desc = sort in ("last_event_desc", "first_event_desc")
    if desc:
        return lambda item: (-item[1], _Desc(item[0]))
    return lambda item: (item[1], item[0])


class _Desc(str):
    """A string ordered backwards: equal scores list in Redis's REV order (member desc)."""

    __slots__ = ()

    def __lt__(self, other: object) -> bool:
        return str.__gt__(self, cast(str, other))

    def __gt__(self, other: object) -> bool:
        return str.__lt__(self, cast(str, other))


def _after(sort: Sort, item: tuple[str, float], score: float, member: str) -> bool:
    """Whether `item` comes after the cursor's (score, member) in this sort."""
    sid, s = item
    if sort in ("last_event_desc", "first_event_desc"):
        return s < score or (s == score and sid.encode() < member.encode())
    return s > score or (s == score and sid.encode() > member.encode())


class SessionIndex(Keys):
    """Reading and writing the listing indexes (see the module's docstring)."""

    redis: RedisClient
    cluster: RedisCluster | None
    _ix_page: AsyncScript
    _ix_build: AsyncScript

    async def _page_pipeline(self, calls: list[tuple[list[str], list[int | str]]]) -> list[Any]:
        """The page script for every partition in one pipeline (a server that lost its
        scripts, restarted, is given it and asked again)."""
        for attempt in range(2):
            try:
                async with self.redis.pipeline(transaction=False) as pipe:
                    for keys, args in calls:
                        pipe.evalsha(self._ix_page.sha, len(keys), *keys, *args)
                    return await pipe.execute()
            except NoScriptError:
                if attempt:
                    raise
                await self.redis.script_load(PAGE_SCRIPT)
        raise AssertionError("unreachable")

    def index_keys(self, session_id: str, scopes: Sequence[str]) -> list[str]:
        """The (first, last, wake) sets of each scope, in the session's partition."""
        p = self.partition_of(session_id)
        return [
            self.index_key(p, sort, scope) for scope in scopes for sort in ("first", "last", "wake")
        ]

    async def indexed_keys(self, session_id: str) -> list[str]:
        """Every index set the session is in (none when it was never indexed)."""
        raw = cast(bytes | None, await self.redis.hget(self.snap_key(session_id), "ix"))
        return self.index_keys(session_id, raw.decode().split()) if raw else []

    async def index_session(
        self,
        session_id: str,
        seq: int,
        *,
        created_ms: int,
        last_ms: int,
        wake_ms: int | None,
        scopes: Sequence[str],
    ) -> bool:
        """Index a session as read at `seq`; False when a commit moved it since."""
        keys = [self.snap_key(session_id), *self.index_keys(session_id, scopes)]
        wake: int | str = "" if wake_ms is None else wake_ms
        args: list[int | str] = [seq, session_id, created_ms, last_ms, wake, " ".join(scopes)]
        return bool(await self._ix_build(keys=keys, args=args))

    async def index_page(
        self,
        sort: Sort,
        scopes: Sequence[str],
        count: int,
        cursor: Cursor | None,
    ) -> IndexPage:
        """Up to `count` sessions after `cursor` (from the top without one) in `sort` order,
        merged from every partition; `more` when others follow."""
        kind = _SETS[sort]
        moving = kind != "first"
        desc = sort in ("last_event_desc", "first_event_desc")
        found: list[tuple[str, float]] = []

        calls: list[tuple[list[str], list[int | str]]] = []
        for p in range(self.partitions):
            keys = [
                self.moves_key(p),
                self.mark_key(p),
                *(self.index_key(p, kind, s) for s in scopes),
                *(self.index_key(p, "first", s) for s in scopes),
            ]
            if not moving:
                mark = "-"
            elif cursor is None:
                mark = ""
            else:
                mark = str(cursor.marks[p])
            args: list[int | str] = [
                len(scopes),
                mark,
                "desc" if desc else "asc",
                "" if cursor is None else repr(cursor.score),
                "" if cursor is None else cursor.member,
                count + 1,
            ]
            calls.append((keys, args))
        if self.cluster is None:  # one round trip for every partition
            replies = await self._page_pipeline(calls)
        else:  # each partition's script on its own master
            replies = await asyncio.gather(
                *(self._ix_page(keys=keys, args=args) for keys, args in calls)
            )
        marks: list[int] = []
        for got_mark, moved, sets in cast(list[list[Any]], replies):
            marks.append(int(got_mark) if moving else 0)
            for sid, was_last, was_wake in moved:
                was = was_last if kind == "last" else was_wake
                if was in (b"", ""):
                    continue  # not in this sort's set when the listing began
                item = (sid.decode(), float(was))
                if cursor is None or _after(sort, item, cursor.score, cursor.member):
                    found.append(item)
            for flat in sets:
                found += [(flat[j].decode(), float(flat[j + 1])) for j in range(0, len(flat), 2)]
        unique = dict.fromkeys(found)  # a session in two scopes' sets: listed once
        ordered = sorted(unique, key=_order_key(sort))
        return IndexPage(ordered[:count], tuple(marks) if moving else (), more=len(ordered) > count)
