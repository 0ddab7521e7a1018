"""Session logs and snapshots: the commit that writes a transition all-or-nothing, loading a
session (its snapshot and the log's tail), listing and deleting sessions."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import orjson
from redis.asyncio.connection import AbstractConnection
from redis.commands.core import AsyncScript
from redis.exceptions import (
    MovedError,
    NoScriptError,
)

from engine.errors import SubsError
from engine.jsonedge import encode
from engine.store.connection import lua_script
from engine.store.durability import ReplicaWait
from engine.store.index import IndexWrite, SessionIndex
from engine.store.keys import LEGACY_SESSIONS
from engine.store.retention import Removals
from engine.store.streams import Entries, SessionStreams


class StoreConflict(SubsError):
    """A commit was refused: the lease moved or another writer got there first."""

    def __init__(self, message: str, *, lease_lost: bool) -> None:
        super().__init__(message, code="internal", retryable=True)
        self.lease_lost = lease_lost


def _assemble(seq: bytes, state: bytes, at: bytes | None, entries: Entries) -> Snapshot:
    """A snapshot hash's fields and the log entries after its `at`, as a Snapshot."""
    head = int(seq)
    raw = [fields[b"e"] for _, fields in entries]
    since = head if at is None else int(at)  # no `at`: written before tails existed
    return Snapshot(
        head,
        since,
        orjson.loads(state),
        len(state),
        [orjson.loads(r) for r in raw],
        sum(map(len, raw)),
    )


COMMIT_SCRIPT = lua_script(__package__, "commit.lua")


DELETE_SCRIPT = lua_script(__package__, "delete.lua")


COMMIT_KEYS_KEPT = 4096  # sessions whose commit keys are kept (`SessionLog.commit_keys`)


@dataclass(frozen=True)
class Commit:
    """One transition's writes, applied all-or-nothing.

    `events` are the new log entries, encoded, numbered from `expected_seq + 1`. The
    snapshot is the whole state, written only now and then (engine/store/snapshots.py): a
    step that does not write it still moves the hash's `seq`, and the state stays at
    its `at`, the log's tail after it folded on load.
    """

    session_id: str
    expected_seq: int
    new_seq: int
    events: tuple[bytes, ...]
    snapshot: bytes | None  # None: not rewritten
    ack_id: str | None = None
    inflight: bool | None = None  # None: unchanged
    timers: tuple[tuple[int, str], ...] = ()
    timers_done: tuple[str, ...] = ()
    reply: dict[str, Any] | None = None
    reply_to: str | None = None
    outbox: tuple[str, ...] = ()  # messages to other sessions, relayed after the commit
    created_ms: int | None = None  # the session is new: index it (in the same commit)
    dead_letter: bytes | None = None  # an input no transition could take, kept for a person
    index: IndexWrite | None = None  # the listing indexes' entry, when events are written


@dataclass(frozen=True)
class Snapshot:
    """A session as stored: the state at seq `at` and the log entries after it, to `seq`."""

    seq: int
    at: int
    state: dict[str, Any]
    state_bytes: int
    tail: list[dict[str, Any]]
    tail_bytes: int


class SessionLog(SessionStreams, SessionIndex):
    """Each session's log and snapshot: commits, loads, listings, deletes."""

    replicas: ReplicaWait | None
    removals: Removals  # told of each delete
    _commit: AsyncScript
    _delete: AsyncScript
    _lines: dict[int, AbstractConnection]  # each partition's commit connection
    _line_locks: dict[int, asyncio.Lock]
    # (session, partition, index scopes) -> the commit script's keys (`commit_keys`)
    _commit_keys: dict[tuple[str, int, tuple[str, ...] | None], tuple[str, ...]]

    async def head(self, session_id: str) -> tuple[int, dict[str, Any]] | None:
        """The session's seq and owner (its identity, fixed when it was created): what an
        access check needs, without the log's tail. None when the session does not exist."""
        seq, state = cast(
            list[bytes | None], await self.redis.hmget(self.snap_key(session_id), "seq", "state")
        )
        if seq is None or state is None:
            return None
        return int(seq), orjson.loads(state)["identity"]

    async def load_snapshot(self, session_id: str) -> Snapshot | None:
        """The last full snapshot and the log after it; None when the session does not exist."""
        seq, state, at = cast(
            list[bytes | None],
            await self.redis.hmget(self.snap_key(session_id), "seq", "state", "at"),
        )
        if seq is None or state is None:
            return None
        return await self._snapshot(session_id, seq, state, at)

    async def load_snapshots(self, session_ids: Sequence[str]) -> list[Snapshot | None]:
        """`load_snapshot` for many sessions in two round trips (the hashes, then the tails
        that are not empty), not two each: a listing page reads a page of them."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for sid in session_ids:
                pipe.hmget(self.snap_key(sid), "seq", "state", "at")
            heads = cast(list[list[bytes | None]], await pipe.execute())
        tails: dict[int, Entries] = {}
        wanted = [
            (n, sid, int(seq), int(at or seq))
            for n, (sid, (seq, state, at)) in enumerate(zip(session_ids, heads, strict=True))
            if seq is not None and state is not None and int(at or seq) < int(seq)
        ]
        if wanted:
            async with self.redis.pipeline(transaction=False) as pipe:
                for _, sid, head, since in wanted:
                    pipe.xrange(self.log_key(sid), min=f"({since}-0", max=f"{head}-0")
                replies = await pipe.execute()
            tails = {n: entries for (n, *_), entries in zip(wanted, replies, strict=True)}
        return [
            None if seq is None or state is None else _assemble(seq, state, at, tails.get(n, []))
            for n, (seq, state, at) in enumerate(heads)
        ]

    async def identities(self, session_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Each session's identity, `{}` for one with none or no session: read from its
        snapshot alone, in one round trip (an identity is fixed at creation, so the log's
        tail cannot change it). What budget buckets of a subagent's session key on."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for sid in session_ids:
                pipe.hget(self.snap_key(sid), "state")
            states = cast(list[bytes | None], await pipe.execute())
        return {
            sid: (orjson.loads(state).get("identity") if state else None) or {}
            for sid, state in zip(session_ids, states, strict=True)
        }

    async def _snapshot(
        self, session_id: str, seq: bytes, state: bytes, at: bytes | None
    ) -> Snapshot:
        """A snapshot hash read as one instant, with its tail. The tail is read after it:
        log entries up to `seq` never change, so a commit in between adds nothing to it."""
        head = int(seq)
        since = head if at is None else int(at)  # no `at`: written before tails existed
        entries: Entries = []
        if since < head:
            entries = cast(
                Entries,
                await self.redis.xrange(
                    self.log_key(session_id), min=f"({since}-0", max=f"{head}-0"
                ),
            )
        return _assemble(seq, state, at, entries)

    async def read_cut(self, session_id: str) -> tuple[Snapshot, list[dict[str, Any]], str] | None:
        """The snapshot, and the token deltas with the delta stream's last id ("0-0" when
        empty), read in one transaction: one instant. None when the session does not
        exist. Both keys share the session's slot."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hmget(self.snap_key(session_id), "seq", "state", "at")
            pipe.xrange(self.delta_key(session_id))
            (seq, raw, at), entries = await pipe.execute()
        if raw is None:
            return None
        deltas = [orjson.loads(fields[b"d"]) for _, fields in entries]
        cursor = entries[-1][0].decode() if entries else "0-0"
        return await self._snapshot(session_id, seq, raw, at), deltas, cursor

    async def commit(
        self, p: int, lease: str, c: Commit, deltas: Sequence[dict[str, Any]] = ()
    ) -> int:
        """Apply a transition. Raises StoreConflict when fenced off.

        `deltas` (token deltas of the call this input ends) go out in the same write,
        ahead of the script: they reach the delta stream before the event that ends
        their call, with no round trip of their own. They are written even when the
        commit is then refused (they are best effort, and were streamed).
        """
        sid = c.session_id
        args: list[Any] = [
            lease,
            c.expected_seq,
            c.new_seq,
            c.snapshot or b"",
            c.ack_id or "",
            "" if c.inflight is None else ("+" if c.inflight else "-"),
            sid,
            encode(c.reply) if c.reply is not None and c.reply_to else "",
            len(c.events),
            "" if c.created_ms is None else c.created_ms,
            c.dead_letter or b"",
        ]
        for n, event in enumerate(c.events, c.expected_seq + 1):
            args += [f"{n}-0", event]
        args.append(len(c.timers))
        for due, member in c.timers:
            args += [due, member]
        args.append(len(c.timers_done))
        args += list(c.timers_done)
        args.append(len(c.outbox))
        args += list(c.outbox)
        ix = c.index
        if ix is not None and c.events:
            w = "" if ix.wake_ms is None else ix.wake_ms
            args += [ix.created_ms, ix.last_ms, w, ix.last_ms, " ".join(ix.scopes)]
        keys = self.commit_keys(sid, p, ix.scopes if ix is not None and c.events else None)
        if c.reply_to:
            keys = (*keys[:6], c.reply_to, *keys[7:])
        if deltas and self.replicas is not None:
            await self.add_deltas(sid, deltas)  # not counted by the commit's WAIT
            deltas = ()
        result = await self._commit_on_line(
            p, sid, [len(keys), *keys, *args], self._delta_xadds(sid, deltas)
        )
        if result == -1:
            raise StoreConflict(f"lease on partition {p} is no longer ours", lease_lost=True)
        if result == -2:
            raise StoreConflict(f"session {sid} moved past seq {c.expected_seq}", lease_lost=False)
        return int(result)

    def commit_keys(self, sid: str, p: int, scopes: tuple[str, ...] | None) -> tuple[str, ...]:
        """The commit script's keys for session `sid` of partition `p` (its reply key the
        one for no request), with the listing indexes' when `scopes` are given. Kept per
        session, as they never change (a store's partitions and tags are fixed): each
        commit built ~20 key names afresh. At most `COMMIT_KEYS_KEPT` sessions' are kept."""
        cached = self._commit_keys.get((sid, p, scopes))
        if cached is not None:
            return cached
        keys: tuple[str, ...] = (
            self.log_key(sid),
            self.snap_key(sid),
            self.work_key(p),
            self.inflight_key(p),
            self.lease_key(p),
            self.timers_key(p),
            self.reply_key(sid, "none"),
            self.outbox_key(p),
            self.sessions_key(p),
            self.dead_key(p),
        )
        if scopes is not None:
            keys += (self.moves_key(p), self.mark_key(p), *self.index_keys(sid, scopes))
        if len(self._commit_keys) >= COMMIT_KEYS_KEPT:
            self._commit_keys.clear()
        self._commit_keys[(sid, p, scopes)] = keys
        return keys

    async def _commit_on_line(
        self, p: int, sid: str, args: list[Any], before: list[list[Any]]
    ) -> Any:
        """EVALSHA of the commit script on the partition's own connection, packed here.

        Commits are the hot path: redis-py's command layer (a pool checkout with its
        health probe, per-argument encoding, the Script wrapper) cost ~90 µs of CPU a
        commit more than this (measured). One partition commits one input at a time,
        so its connection is never shared; any failure drops it (the pool makes a new
        one), and a Redis that lost its scripts (a restart) is given the script again.
        `before` are commands sent ahead of the script in the same write. On a cluster
        the connection is to the master owning the partition's slot. With `wait_replicas`, a
        WAIT follows on the same connection (WAIT counts its own connection's writes).
        """
        lock = self._line_locks.get(p)
        if lock is None:
            lock = self._line_locks[p] = asyncio.Lock()
        async with lock:
            conn = self._lines.pop(p, None) or await self._connection(self.log_key(sid))
            evalsha = [b"EVALSHA", self._commit.sha, *args]
            try:
                try:
                    result = await self._run_commit(conn, before, evalsha)
                except MovedError as moved:  # nothing ran: sent once more, to the new master
                    await self._put_back(conn, moved)
                    conn = await self._connection(self.log_key(sid))
                    result = await self._run_commit(conn, before, evalsha)
                if self.replicas is not None and result >= 0:
                    (acked,) = await self._ask(conn, [self.replicas.command()])
                    self.replicas.record(int(acked), sid)
            except BaseException as err:
                await self._put_back(conn, err)
                raise
            self._lines[p] = conn
            return result

    async def _run_commit(
        self, conn: AbstractConnection, before: list[list[Any]], evalsha: list[Any]
    ) -> Any:
        """`before`, then the script; a server without the script (restarted, or a replica
        just promoted) is given it."""
        try:
            *_, result = await self._ask(conn, [*before, evalsha])
        except NoScriptError:  # `before` ran: only the script is sent again
            _, result = await self._ask(conn, [[b"SCRIPT", b"LOAD", COMMIT_SCRIPT], evalsha])
        return result

    async def read_log(
        self, session_id: str, after_seq: int = 0, count: int | None = None
    ) -> list[dict[str, Any]]:
        """The session's events after `after_seq`, oldest first, at most `count`."""
        entries = cast(
            Entries,
            await self.redis.xrange(
                self.log_key(session_id), min=f"({after_seq}-0" if after_seq else "-", count=count
            ),
        )
        return [orjson.loads(fields[b"e"]) for _, fields in entries]

    async def list_sessions(self, offset: int = 0, limit: int = 50) -> list[str]:
        """Session ids, newest first, merged from every partition's index.

        The index is written by the commit that creates a session, in the session's
        own slot; `subs:sessions` is where versions before that kept it, still read.
        """
        keys = [self.sessions_key(p) for p in range(self.partitions)] + [LEGACY_SESSIONS]
        async with self.redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.zrevrange(key, 0, offset + limit - 1, withscores=True)
            replies = await pipe.execute()
        newest: dict[str, float] = {}
        for members in replies:
            for member, score in members:
                newest.setdefault(member.decode(), score)
        ordered = sorted(newest, key=lambda sid: (-newest[sid], sid))
        return ordered[offset : offset + limit]

    async def delete_session(self, session_id: str, expected_seq: int) -> bool:
        """Remove the session's log, snapshot, token deltas, files and index entries, if its seq
        is still `expected_seq`; False when a commit moved it (nothing was deleted).

        An engine that cached the session is fenced off by the seq check of its next
        commit, and reads the session afresh (gone) then.
        """
        p = self.partition_of(session_id)
        keys = [
            self.snap_key(session_id),
            self.log_key(session_id),
            self.delta_key(session_id),
            self.sessions_key(p),
            self.inflight_key(p),
            self.files_key(session_id),
            *await self.indexed_keys(session_id),
        ]
        if not await self._delete(keys=keys, args=[expected_seq, session_id]):
            return False
        self.removals(session_id)
        await self.redis.zrem(LEGACY_SESSIONS, session_id)  # another slot: not in the script
        return True

    async def last_events(self, session_ids: Sequence[str]) -> list[dict[str, Any] | None]:
        """Each session's newest event (None when its log is empty), in one round trip."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for sid in session_ids:
                pipe.xrevrange(self.log_key(sid), count=1)
            replies = await pipe.execute()
        return [orjson.loads(reply[0][1][b"e"]) if reply else None for reply in replies]

    async def dead_letters(self, count: int = 100) -> list[dict[str, Any]]:
        """Inputs no transition could take, newest first, across partitions."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for p in range(self.partitions):
                pipe.xrevrange(self.dead_key(p), count=count)
            replies = await pipe.execute()
        letters = [
            {"id": entry_id.decode(), **orjson.loads(fields[b"d"])}
            for entries in replies
            for entry_id, fields in entries
        ]
        letters.sort(key=lambda d: d.get("at_ms", 0), reverse=True)
        return letters[:count]
