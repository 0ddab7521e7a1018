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
        return zlib.crc32(session_id.encode()) % self.partitions

    def _key(self, p: int, name: str) -> str:
        return f"subs:{{{self.tags[p]}}}:{name}"

    def log_key(self, session_id: str) -> str:
        return self._key(self.partition_of(session_id), f"log:{session_id}")

    def snap_key(self, session_id: str) -> str:
        return self._key(self.partition_of(session_id), f"snap:{session_id}")

    def delta_key(self, session_id: str) -> str:
        return self._key(self.partition_of(session_id), f"deltas:{session_id}")

    def files_key(self, session_id: str) -> str:
        """The session's files (engine/store/files.py), a hash from SHA-256 to bytes."""
        return self._key(self.partition_of(session_id), f"files:{session_id}")

    def work_key(self, p: int) -> str:
        return self._key(p, "work")

    def lease_key(self, p: int) -> str:
        return self._key(p, "lease")

    def fence_key(self, p: int) -> str:
        return self._key(p, "fence")

    def timers_key(self, p: int) -> str:
        return self._key(p, "timers")

    def inflight_key(self, p: int) -> str:
        return self._key(p, "inflight")

    def outbox_key(self, p: int) -> str:
        return self._key(p, "outbox")

    def sessions_key(self, p: int) -> str:
        return self._key(p, "sessions")

    def dead_key(self, p: int) -> str:
        return self._key(p, "dead")

    def reply_key(self, session_id: str, request_id: str) -> str:
        return self._key(self.partition_of(session_id), f"reply:{request_id}")
