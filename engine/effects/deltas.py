"""A call's token deltas, written to the session's delta stream while the call runs.

Deltas are best effort (the reply itself is in the log): a failed write is logged, at
most one warning per ten seconds, and what is still buffered when the call ends goes
out with the commit of its end, ahead of that event.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from engine.retrying import Trouble
from engine.store.store import Store

log = logging.getLogger("subs.engine")

Deltas = tuple[dict[str, Any], ...]
_delta_trouble = Trouble(log)


class DeltaWriter:
    """Writes one call's token deltas in order while the call runs, batching what piles
    up during a round trip. What is left when the call ends goes out in the write that
    commits its end (`Store.commit`): ahead of that event, without a round trip."""

    def __init__(self, store: Store, session_id: str) -> None:
        self.store = store
        self.session_id = session_id
        self.buffer: list[dict[str, Any]] = []
        self.task: asyncio.Task[None] | None = None
        self.ended = False

    def add(self, delta: dict[str, Any]) -> None:
        """Queue a delta; a write starts unless one is already out."""
        self.buffer.append(delta)
        if not self.ended and (self.task is None or self.task.done()):
            self.task = asyncio.create_task(self._flush())

    async def _flush(self) -> None:
        while self.buffer and not self.ended:
            batch, self.buffer = self.buffer, []
            try:
                await self.store.add_deltas(self.session_id, batch)
            except Exception as err:  # deltas are best effort; the reply itself is in the log
                _delta_trouble(f"writing token deltas of {self.session_id}", err)

    async def end(self) -> Deltas:
        """The deltas not written yet, once the batch in flight is in (order holds)."""
        self.ended = True
        if self.task is not None:
            await self.task
        rest, self.buffer = tuple(self.buffer), []
        return rest

    def abandon(self) -> None:
        """The call ended: stop writing; the rest goes out with the commit."""
        self.ended = True
        if self.task is not None:
            self.task.cancel()
