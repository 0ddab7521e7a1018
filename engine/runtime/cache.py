"""The engine's cache of session states: bounded, least recently used out first.

A cached state saves a read and a fold per step; a miss reads the snapshot and refolds
its tail, as a restarted engine does, so dropping an entry is always safe. Unbounded, it
held every session this engine ever touched (200 sessions of 200 KB kept a serve ~140 MB
bigger after they were deleted: issue 27). It is bounded by a count and by an estimate of
the memory the states take: the snapshot's stored JSON size (and the log written since)
times `BYTES_PER_JSON_BYTE`, plus `ENTRY_BYTES` each. The factor is measured: folded
golden logs take 3-10x their JSON in Python objects (tracemalloc; the small ones the
most), the issue's 200 KB sessions ~3.5x.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

from engine.machine import SessionState
from engine.store.snapshots import Mark

BYTES_PER_JSON_BYTE = 4
ENTRY_BYTES = 4096


def estimate(json_bytes: int) -> int:
    """The memory a state of `json_bytes` stored bytes takes in the cache, estimated."""
    return json_bytes * BYTES_PER_JSON_BYTE + ENTRY_BYTES


@dataclass
class _Entry:
    state: SessionState
    mark: Mark | None  # the stored snapshot's mark, when this version's fold wrote it
    size: int


class StateCache:
    """Session id -> (state, snapshot mark), at most `max_sessions` and about `max_bytes`."""

    def __init__(self, max_bytes: int, max_sessions: int) -> None:
        self.max_bytes = max_bytes
        self.max_sessions = max_sessions
        self.bytes = 0
        self.evicted = 0
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, sid: object) -> bool:
        return sid in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._entries))

    def get(self, sid: str) -> SessionState | None:
        """The cached state (now the most recently used), or None: read it from Redis."""
        entry = self._entries.get(sid)
        if entry is None:
            return None
        self._entries.move_to_end(sid)
        return entry.state

    def mark(self, sid: str) -> Mark | None:
        """The mark of the stored snapshot the cached state matches, if any."""
        entry = self._entries.get(sid)
        return None if entry is None else entry.mark

    def put(self, sid: str, state: SessionState, mark: Mark | None, json_bytes: int | None) -> None:
        """Cache `state` (most recently used). `mark` None keeps the entry's mark;
        `json_bytes` None keeps its size estimate (a step that rewrote nothing)."""
        old = self._entries.pop(sid, None)
        if old is not None:
            self.bytes -= old.size
            mark = mark or old.mark
        size = (
            estimate(json_bytes) if json_bytes is not None else (old.size if old else ENTRY_BYTES)
        )
        if size > self.max_bytes:
            return  # bigger than the whole cache: read from Redis each time instead
        self._entries[sid] = _Entry(state, mark, size)
        self.bytes += size
        while len(self._entries) > self.max_sessions or self.bytes > self.max_bytes:
            self.drop(next(iter(self._entries)))  # the least recently used
            self.evicted += 1

    def drop(self, sid: str) -> None:
        """Forget a session (deleted, archived, or its partition gone elsewhere)."""
        entry = self._entries.pop(sid, None)
        if entry is not None:
            self.bytes -= entry.size
