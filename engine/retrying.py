"""Waiting out a fault that passes (Redis restarting, a failover): back off, say it once.

Below the effect runners and the runtime, which both retry this way.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time


class Backoff:
    """Waits that grow from 50 ms to 2 s while a fault lasts; reset by a success."""

    def __init__(self, first: float = 0.05, most: float = 2.0) -> None:
        self.first, self.most, self.next = first, most, first

    async def wait(self) -> None:
        """Sleep the current delay, then double it up to `most`."""
        await asyncio.sleep(self.next)
        self.next = min(self.next * 2, self.most)

    def reset(self) -> None:
        """It worked: the next fault starts from the first delay again."""
        self.next = self.first


class Trouble:
    """One warning per `every` seconds for a fault that repeats, not one per retry."""

    def __init__(self, log: logging.Logger, every: float = 10.0) -> None:
        self.log, self.every, self._last = log, every, -math.inf

    def __call__(self, what: str, err: BaseException) -> None:
        """Report `err` from `what`, unless reported less than `every` seconds ago."""
        now = time.monotonic()
        if now - self._last >= self.every:
            self._last = now
            self.log.warning("%s failed, retrying: %s: %s", what, type(err).__name__, err)
