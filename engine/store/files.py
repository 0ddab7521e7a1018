"""A session's files, stored once each: content-addressed by SHA-256.

A file a message carries (a screenshot pasted in Slack, a PDF) is kept here, and the message
in the session's log holds only a reference to it (a `link` content part, engine/files.py),
so the bytes sit in Redis once per session rather than once per turn that reads them. One
hash per session (`files:<session>`, with the session's partition tag), field = the hex
digest; deleting the session deletes it (lua/delete.lua).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import cast

from engine.store.connection import RedisClient
from engine.store.keys import Keys

__all__ = ["SessionFiles", "digest"]


def digest(data: bytes) -> str:
    """The name a file is stored under: its SHA-256, in hex."""
    return hashlib.sha256(data).hexdigest()


class SessionFiles(Keys):
    """Put and get a session's files by digest."""

    redis: RedisClient

    async def put_file(self, session_id: str, data: bytes) -> str:
        """Keep `data` for the session (once: a second put of the same bytes writes
        nothing); returns its digest."""
        name = digest(data)
        await self.redis.hsetnx(self.files_key(session_id), name, data)
        return name

    async def get_files(self, session_id: str, names: Sequence[str]) -> list[bytes | None]:
        """The bytes of each digest in `names` (None for one the session does not hold)."""
        if not names:
            return []
        key = self.files_key(session_id)
        got = await self.redis.hmget(key, list(names))
        return cast(list[bytes | None], got)
