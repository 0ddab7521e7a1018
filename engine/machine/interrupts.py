"""Interrupts (SPEC §8): the session pauses until a person (or the worker) resumes it.

Raising one is a fact any rule may record (a client's request, a worker's action, a
connection that refused its credential, a tool call waiting for approval); resuming one,
and what follows, is resuming.py's. Here: who may resume one, and when it expires.

Who: a turn records who submitted it (`by`: the privilege of the caller, and the subject
it named); an interrupt raised in that turn keeps it. Resuming needs at least that
privilege (upstream's InterruptOrigin rule: `frontend` < `machine` < `operator` <
`system`): a `KEY:own` key cannot answer what a full key's turn asked. Which person may
answer in Slack is the bot's to check (bot/turns/approvers.py), from the same record.

When: a payload's `expiresAt` (RFC 3339) is a deadline the engine enforces. The machine
only reads the time it is given: the timer is derived from the state (deadlines.py) and
fired by the shell, and a resume that arrives at or after it resolves the interrupt as
expired instead.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from . import events as ev
from .core import Step
from .shapes import OpenInterrupt, Raise, Submitter

RANKS = {"frontend": 0, "machine": 1, "operator": 2, "system": 3}
# What an expired interrupt resumes with: a declined answer nobody gave (the schema's
# InterruptResolution, status `cancelled`).
EXPIRED = {"status": "cancelled", "reason": "expired"}


def raise_interrupt(st: Step, action: Raise, origin: str) -> None:
    """Open an interrupt (once per id) and pause the turn on it."""
    iid = action.get("interrupt_id") or st.ids("int")
    if iid in st.s.interrupts:
        return
    raised: ev.SessionInterrupted = {
        "type": ev.SESSION_INTERRUPTED,
        "interrupt_id": iid,
        "origin": origin,
        "reason": action.get("reason") or "",
        "payload": action.get("payload"),
    }
    turn = st.s.turn
    if turn is not None and turn.by:
        raised["by"] = turn.by
    st.emit(raised)


def submitter(owner: dict[str, Any] | None, identity: dict[str, Any]) -> Submitter:
    """A turn's `by`: a scoped key (`owner` set) is a `frontend`, a full key (or the open
    API, or the Slack bot in process) an `operator`; and the subject it submitted as."""
    by: Submitter = {"privilege": "frontend" if owner is not None else "operator"}
    subject = (identity or {}).get("subject")
    if isinstance(subject, dict) and subject.get("id"):
        by["subject"] = {"issuer": subject.get("issuer"), "id": subject["id"]}
    return by


def may_resume(interrupt: OpenInterrupt, privilege: str) -> bool:
    """Whether a caller of `privilege` may resume `interrupt` (at least its turn's)."""
    by = interrupt.get("by")
    needed = (by.get("privilege") if by else None) or "frontend"
    return RANKS.get(privilege, 0) >= RANKS.get(needed, 0)


def expires_ms(interrupt: OpenInterrupt) -> int | None:
    """When `interrupt` expires (epoch ms), from its payload's `expiresAt`; None when it
    names none or not a time (then it is shown as written, and never expires)."""
    payload = interrupt.get("payload")
    raw = payload.get("expiresAt") if isinstance(payload, dict) else None
    if not isinstance(raw, str) or not raw:
        return None
    try:
        at = datetime.fromisoformat(raw)
    except ValueError:
        return None
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return int(at.timestamp() * 1000)


def expired(interrupt: OpenInterrupt, now: int) -> bool:
    """Whether the interrupt's `expiresAt` has come (at `now`, ms): it can no longer be
    answered."""
    due = expires_ms(interrupt)
    return due is not None and now >= due


def approved(payload: Any) -> bool:
    """A resume that approves: `"approve"`, or `{"value": "approve"}` (a Slack button)."""
    if isinstance(payload, dict):
        payload = payload.get("value")
    return bool(payload == "approve")
