"""The store's key names: every key of a partition carries the partition's hash tag, so on a
cluster each partition lives on one master and every script stays on one slot."""

from __future__ import annotations

import zlib
from typing import NewType

from redis.crc import key_slot

from engine.errors import SubsError

SessionId = NewType("SessionId", str)


DEFAULT_PARTITIONS = 16


LEGACY_SESSIONS = "subs:sessions"


META = "subs:meta"


SLOTS = 16384  # Redis Cluster's hash slots


def spread_tags(partitions: int) -> list[str]:
    """Each partition's hash tag, chosen so partition p's slot falls in the p-th equal
    share of the cluster's 16384 slots: a cluster whose masters hold equal slot ranges
    (as `redis-cli --cluster create` makes them) gets an equal share of partitions on
    each. The tag is `<p>.<k>`, k the first that lands there (a few dozen tries)."""
    if partitions > SLOTS:
        raise SubsError(f"at most {SLOTS} partitions (one a slot), got {partitions}")
    tags = []
    for p in range(partitions):
        k = 0
        while key_slot(f"{p}.{k}".encode()) * partitions // SLOTS != p:
            k += 1
        tags.append(f"{p}.{k}")
    return tags


class Keys:
    """Where each session's and each partition's keys live."""

    partitions: int
    tags: list[str]

    def partition_of(self, session_id: str) -> int:
        """A session's partition: a stable hash, so every engine agrees on it."""
        return zlib.crc32(session_id.encode()) % self.partitions

    def _key(self, p: int, name: str) -> str:
        return f"subs:{{{self.tags[p]}}}:{name}"

    def log_key(self, session_id: str) -> str:
        """The session's event log (a stream, one entry per event)."""
        return self._key(self.partition_of(session_id), f"log:{session_id}")

    def snap_key(self, session_id: str) -> str:
        """The session's latest snapshot."""
        return self._key(self.partition_of(session_id), f"snap:{session_id}")

    def delta_key(self, session_id: str) -> str:
        """The session's token delta stream."""
        return self._key(self.partition_of(session_id), f"deltas:{session_id}")

    def files_key(self, session_id: str) -> str:
        """The session's files (engine/store/files.py), a hash from SHA-256 to bytes."""
        return self._key(self.partition_of(session_id), f"files:{session_id}")

    def work_key(self, p: int) -> str:
        """The partition's work stream: inputs waiting for its owner."""
        return self._key(p, "work")

    def lease_key(self, p: int) -> str:
        """Who owns the partition, until when."""
        return self._key(p, "lease")

    def fence_key(self, p: int) -> str:
        """The partition's fencing counter: a lease taken later always reads higher."""
        return self._key(p, "fence")

    def timers_key(self, p: int) -> str:
        """The partition's timers, scored by when they fire."""
        return self._key(p, "timers")

    def inflight_key(self, p: int) -> str:
        """Sessions with effects out, to find after a crash."""
        return self._key(p, "inflight")

    def outbox_key(self, p: int) -> str:
        """Messages committed for other sessions, not yet handed over."""
        return self._key(p, "outbox")

    def sessions_key(self, p: int) -> str:
        """The partition's session index, by creation time; listings merge them."""
        return self._key(p, "sessions")

    def index_key(self, p: int, sort: str, scope: str) -> str:
        """A listing index of the partition (engine/store/index.py): `sort` is `first`,
        `last` or `wake`, `scope` the sessions it holds (`t` top-level, `s` subagents,
        `a:<agent>:t|s` one agent's)."""
        return self._key(p, f"ix:{sort}:{scope}")

    def moves_key(self, p: int) -> str:
        """Where a session's index scores were before it moved, once per listing started:
        what keeps a listing's cursor stable (engine/store/index.py)."""
        return self._key(p, "ix:moves")

    def mark_key(self, p: int) -> str:
        """The partition's listing mark: bumped by each listing's first page."""
        return self._key(p, "ix:mark")

    def dead_key(self, p: int) -> str:
        """Inputs the engine could not apply."""
        return self._key(p, "dead")

    def reply_key(self, session_id: str, request_id: str) -> str:
        """Where the owner answers one request; in the session's partition, so on a cluster
        the commit script can write it."""
        return self._key(self.partition_of(session_id), f"reply:{request_id}")
