"""Stopping tasks that must stop: cancel, wait, and cancel again while they run.

The engine stops its loops and a dropped partition's tasks this way (`engine.py`,
`partitions.py`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

log = logging.getLogger("subs.engine")

RECANCEL_SECONDS = 0.1


async def cancel_and_wait(tasks: Iterable[asyncio.Task[Any]], *, patience: float | None) -> None:
    """Cancel the tasks and wait for them to end, cancelling again while they run.

    Once is not always enough on Python 3.11: a cancel that lands just as a
    `wait_for` (redis-py's socket timeout) completes its inner call is lost, and
    the task goes on sleeping; `subs serve` then never exited on SIGTERM. After
    `patience` seconds (None: no limit) a task still running is logged and left.
    """
    every = list(tasks)
    pending = {t for t in every if not t.done()}
    loop = asyncio.get_running_loop()
    give_up = None if patience is None else loop.time() + patience
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_SECONDS)
        if pending and give_up is not None and loop.time() >= give_up:
            log.warning("%d task(s) did not stop when cancelled: %s", len(pending), pending)
            break
    for task in every:
        if task.done() and not task.cancelled() and task.exception() is not None:
            log.warning("task %s had failed: %s", task.get_name(), task.exception())
