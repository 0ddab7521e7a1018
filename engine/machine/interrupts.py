"""Interrupts (SPEC §8): the session pauses until a person (or the worker) resumes it.

Raising one is a fact any rule may record (a client's request, a worker's action, a
connection that refused its credential); resuming one, and what follows, is turns.py's.
"""

from __future__ import annotations

from typing import Any

from . import events as ev
from .core import Step


def raise_interrupt(st: Step, action: dict[str, Any], origin: str) -> None:
    """Open an interrupt (once per id) and pause the turn on it."""
    iid = action.get("interrupt_id") or st.ids("int")
    if iid in st.s.interrupts:
        return
    st.emit(
        {
            "type": ev.SESSION_INTERRUPTED,
            "interrupt_id": iid,
            "origin": origin,
            "reason": action.get("reason") or "",
            "payload": action.get("payload"),
        }
    )
