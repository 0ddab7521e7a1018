"""The retention sweep: sessions idle past `[store] retention` are archived, then removed.

Like a namespace's retention period in Temporal (closed executions only, then deleted,
archival first when it is on): a session is taken only when nothing of it is open — no
running or queued turn, no open interrupt, call or decision, no live child — and its
newest event is older than the retention. One engine sweeps at a time (a lease), a few
sessions a batch. Each removal is fenced: the store deletes the session only if its seq
is what the sweep read, no call is in flight and no input for it waits on the work
stream (engine/store/lua/archive_delete.lua); otherwise the session stays, whole, and
the archive just written is withdrawn. The archive is on disk, fsynced, before the
delete: a sweep killed anywhere loses no session and leaves none half-deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import SubsError, describe
from engine.jsonedge import encode
from engine.machine import SessionState, default_kinds, fold, state_to_json
from engine.store import archive
from engine.store.reindex import index_sessions
from engine.store.retention import REMOVED, PurgeHooks, Removed, occurred_ms
from engine.store.snapshots import load
from engine.store.store import STORE_FAULTS, Store

log = logging.getLogger("subs.retention")

BATCH = 50  # sessions read per round trip, and removed before the lease is renewed
SWEEP_EVERY_S = 60.0
REMOVE_LANES = 8  # removals in flight at once (connections the sweep may hold)
# After each batch the sweep rests this share of the time the batch took: it shares the
# engine's process and Redis with the turns (bench/retention.py measures the cost).
REST = 0.5
SWEEP_LEASE_MS = 30_000


def held_by(state: SessionState) -> str | None:
    """What keeps a session in Redis however old it is; None when nothing does."""
    if state.turn is not None:
        return f"turn {state.turn.id} is running"
    if state.queue or state.pending:
        return "a turn is queued"
    if state.interrupts:
        return "an interrupt is open"
    if state.calls:
        return "a call is open"
    if state.decision is not None or state.held is not None:
        return "a decision is open"
    for child, entry in state.children.items():
        if entry.get("call_id") or entry.get("detached"):
            return f"child {child} is live"
    return None


@dataclass
class SweepReport:
    """What one sweep did (a bench, /metrics and the tests read it)."""

    archived: int = 0  # removed from Redis (with an archive when archives are on)
    kept: int = 0  # old enough, but something of it is open or it moved meanwhile
    seen: int = 0
    keys_outside: int = 0  # other layers' keys the hooks deleted
    files: list[Path] = field(default_factory=list)


Step = Callable[[str, str], Awaitable[None]]  # (step name, session id): a test's hook


class Sweeper:
    """Sweeps the store's idle sessions; `sweep_once` is one full pass. `purge`: the hooks
    that delete what other layers keep of a removed session (serve passes the bot's)."""

    def __init__(
        self,
        store: Store,
        *,
        retention_ms: int,
        archive_dir: Path | None,
        clock: Callable[[], float],
        owner: str,
        on_removed: Callable[[str], None] = lambda sid: None,
        purge: PurgeHooks | None = None,
        batch: int = BATCH,
        lease_ms: int = SWEEP_LEASE_MS,
        rest: float = REST,
    ) -> None:
        self.store = store
        self.retention_ms = retention_ms
        self.archive_dir = archive_dir
        self.clock = clock
        self.owner = owner
        self.on_removed = on_removed
        self.purge = dict(purge or {})  # other layers' keys of a removed session (the bot's)
        self.batch = batch
        self.lease_ms = lease_ms
        self.rest = rest
        self.step: Step | None = None  # called between the sweep's steps (tests)
        self.total = SweepReport()

    async def _at(self, name: str, sid: str) -> None:
        if self.step is not None:
            await self.step(name, sid)

    async def sweep_once(self) -> SweepReport | None:
        """One pass over every partition; None when another engine holds the sweep."""
        lease = await self.store.acquire_sweep(self.owner, self.lease_ms)
        if lease is None:
            return None
        report = SweepReport()
        try:
            now = int(self.clock() * 1000)
            cutoff = now - self.retention_ms
            for p in range(self.store.partitions):
                offset = 0
                while True:
                    sids = await self.store.created_before(p, cutoff, offset, self.batch)
                    if not sids:
                        break
                    began = time.monotonic()
                    removed = await self._batch(sids, cutoff, now, report)
                    offset += len(sids) - len(removed)
                    if removed:
                        report.keys_outside += await self.store.purge_outside(removed, self.purge)
                    if not await self.store.renew_sweep(lease, self.lease_ms):
                        log.warning("retention: the sweep's lease moved; this pass stops")
                        return report
                    if removed and self.rest:
                        await asyncio.sleep((time.monotonic() - began) * self.rest)
        finally:
            with contextlib.suppress(*STORE_FAULTS):
                await self.store.release_sweep(lease)
            self._add(report)
        return report

    def _add(self, report: SweepReport) -> None:
        self.total.archived += report.archived
        self.total.kept += report.kept
        self.total.seen += report.seen
        self.total.keys_outside += report.keys_outside

    async def _batch(
        self, sids: list[str], cutoff: int, now: int, report: SweepReport
    ) -> list[Removed]:
        """Read a batch, archive the idle ones (one sync for all files), remove each if it
        is still as read."""
        lasts = await self.store.last_activity(sids)
        snaps = await self.store.load_snapshots(sids)
        taking: list[tuple[str, SessionState, Path | None]] = []
        files: list[tuple[Path, archive.Archive]] = []
        for sid, last, snap in zip(sids, lasts, snaps, strict=True):
            report.seen += 1
            if snap is None or last is None or last > cutoff:
                continue
            state = await load(self.store, sid, snap)
            if held_by(state) is not None:
                report.kept += 1
                continue
            await self._at("read", sid)
            path = None
            if self.archive_dir is not None:
                events = await self.store.read_log(sid, count=state.seq)
                if len(events) != state.seq or occurred_ms(events[-1]) != last:
                    report.kept += 1  # it moved while we read: the next pass looks again
                    continue
                path = self.archive_dir / archive.file_name(sid, last)
                kept = await self.store.session_files(sid)
                files.append((path, archive.Archive(sid, events, last, now, kept)))
            taking.append((sid, state, path))
        await asyncio.to_thread(archive.write_many, files)
        # At once: Redis fsyncs its AOF once per batch of commands it runs together, so
        # the removals share their fsyncs (one at a time, each waited for one).
        lanes = asyncio.Semaphore(REMOVE_LANES)

        async def remove(sid: str, state: SessionState, path: Path | None) -> Removed | None:
            async with lanes:
                return await self._remove(sid, state, path, report)

        gone = await asyncio.gather(*(remove(*taken) for taken in taking))
        return [r for r in gone if r is not None]

    async def _remove(
        self, sid: str, state: SessionState, path: Path | None, report: SweepReport
    ) -> Removed | None:
        if path is not None:
            await self._at("archived", sid)
        result = await self.store.remove_session(sid, state.seq)
        if result != REMOVED:
            report.kept += 1
            if path is not None:  # the session lives on: its archive would be stale
                with contextlib.suppress(OSError):
                    path.unlink()
            return None
        await self._at("removed", sid)
        self.on_removed(sid)
        report.archived += 1
        if path is not None:
            report.files.append(path)
        return Removed(sid, tuple(state.turns))

    async def run(self, every_s: float = SWEEP_EVERY_S) -> None:
        """Sweep every `every_s` seconds until cancelled; a Redis fault waits a round."""
        while True:
            try:
                report = await self.sweep_once()
                if report is not None and report.archived:
                    log.info("retention: archived %d idle sessions", report.archived)
            except STORE_FAULTS as err:
                log.warning("retention: the sweep stopped on a store fault: %s", err)
            except Exception:
                log.exception("retention: the sweep failed")
            await asyncio.sleep(every_s)


class RestoreRefused(SubsError):
    """An archive that cannot go back: a session with its id is in Redis."""


async def restore(store: Store, kept: archive.Archive) -> SessionState:
    """Put an archived session back: the same id and log, its snapshot folded again.

    Raises:
        RestoreRefused: a session with that id exists (delete it first, or keep it).
        ArchiveError: the log does not fold (not a log this version can read).
    """
    try:
        state = fold(kept.events)
    except Exception as err:
        raise archive.ArchiveError(
            f"session {kept.session_id}: its log does not fold ({describe(err)})"
        ) from None
    if state is None:
        raise archive.ArchiveError(f"session {kept.session_id}: the archive holds no events")
    events = [encode(e) for e in kept.events]
    snapshot = encode(state_to_json(state))
    if not await store.restore_session(
        kept.session_id, events, snapshot, state.created_at, kept.files
    ):
        raise RestoreRefused(
            f"session {kept.session_id} is in Redis already; "
            f"`subs sessions delete {kept.session_id}` first to put the archived one back"
        )
    await index_sessions(store, [kept.session_id], default_kinds())  # listed again
    return state


def export(
    events: list[dict[str, Any]], written_ms: int, files: dict[str, bytes] | None = None
) -> archive.Archive:
    """A live session's log (and files) as an archive (`subs sessions export`)."""
    if not events:
        raise archive.ArchiveError("the session has no events")
    sid = events[0]["session_id"]
    return archive.Archive(sid, events, occurred_ms(events[-1]), written_ms, files or {})
