"""What a commit survives beyond the Redis process: the AOF fsync policy and replicas.

The engine sets `appendfsync` only on the embedded server. An external server is
the operator's, so at start the engine reads its settings (when CONFIG is allowed)
and says once when they keep commits less safely than `[store] fsync` asks.
`[store] wait_replicas` makes each commit wait for replicas with WAIT; a WAIT that
ends short is logged, rate-limited, since the commit has already happened and
cannot be taken back. See README "Durability".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError

from engine.config import Fsync

log = logging.getLogger("subs.store")

# appendfsync values, weakest first.
_FSYNC_ORDER = ("no", "everysec", "always")
_LOSES = {
    "no": "whatever the OS had not yet written back (often ~30 s)",
    "everysec": "up to ~1 s of acknowledged steps",
}
SHORT_WAIT_LOG_EVERY = 10.0  # seconds between two "fewer replicas" lines


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else value


async def check_server(redis: aioredis.Redis | RedisCluster, fsync: Fsync) -> str | None:
    """Log (and return) one line when the server is weaker than `fsync`; None when not."""
    try:
        raw = await redis.config_get("append*")
    except ResponseError as err:  # managed Redis often refuses CONFIG (or this user may not)
        line = (
            f"cannot read the Redis server's appendonly/appendfsync (CONFIG GET refused: {err}); "
            f"commits are only as durable as its settings, not checked against "
            f"[store] fsync = {fsync!r}"
        )
        log.warning(line)
        return line
    settings = {_text(k): _text(v) for k, v in raw.items()}
    if settings.get("appendonly") != "yes":
        line = (
            "the Redis server keeps no append-only file (appendonly no): a restart of it loses "
            f"every step since its last RDB snapshot, though [store] fsync = {fsync!r}"
        )
        log.warning(line)
        return line
    server = settings.get("appendfsync", "")
    if server in _FSYNC_ORDER and _FSYNC_ORDER.index(server) < _FSYNC_ORDER.index(fsync):
        line = (
            f"the Redis server fsyncs its AOF {server!r}, weaker than [store] fsync = {fsync!r}: "
            f"a power cut can lose {_LOSES[server]}; set appendfsync {fsync} on the server"
        )
        log.warning(line)
        return line
    return None


class ReplicaWait:
    """WAIT for `replicas` after a commit; says when fewer acknowledged, at most every 10 s."""

    def __init__(
        self,
        replicas: int,
        timeout_ms: int,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.replicas = replicas
        self.timeout_ms = timeout_ms
        self.clock = clock
        self.short = 0  # WAITs that ended short since the last line
        self._last_line = -SHORT_WAIT_LOG_EVERY

    def command(self) -> list[bytes | int]:
        """The WAIT to send on the connection that made the commit (WAIT counts the writes
        of its own connection only)."""
        return [b"WAIT", self.replicas, self.timeout_ms]

    def record(self, acked: int, session_id: str) -> None:
        """A WAIT's answer: how many replicas acknowledged the commit of `session_id`."""
        if acked < self.replicas:
            self.short += 1
            now = self.clock()
            if now - self._last_line >= SHORT_WAIT_LOG_EVERY:
                log.warning(
                    "a commit of session %s reached %d of %d replicas in %d ms; it stands (the "
                    "primary has it) but a failover now could lose it "
                    "(%d such commits since the last line)",
                    session_id,
                    acked,
                    self.replicas,
                    self.timeout_ms,
                    self.short,
                )
                self.short = 0
                self._last_line = now
