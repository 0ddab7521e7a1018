"""Resuming an interrupt (SPEC §8), and what follows it.

A client's `interrupt.resume` or a worker's `interrupt.resolve` resumes an open
interrupt; an old or repeated id does nothing. One past its `expiresAt` resolves as
expired instead (its timer fires `InterruptDeadline`; a late resume is the same). What
follows depends on what raised it: a call held by its budget is sent, or the turn fails
over budget; a connector call held for a person's approval is sent, or ends as a tool
error the model reads; a connection that refused its credential is synced afresh; for
any other, the decision that follows (`interrupt.resumed`) proposes a model call if
nothing else is open.

Raising one, who may resume it and when it expires are interrupts.py's: that module sits
below the call rules (they raise approvals through it), and this one above them.
"""

from __future__ import annotations

from typing import Any

from . import budgets
from . import events as ev
from .asking import decide
from .calls import call_failed, dispatch
from .connections import connector_of
from .connectors import start_sync
from .core import Step
from .ending import fail_turn
from .inputs import InterruptDeadline
from .interrupts import EXPIRED, approved, expired
from .requesting import send_tool
from .shapes import ErrorInfo, InterruptResumed, OpenInterrupt
from .tool_messages import reprompt_or_nothing


def resume_interrupt(st: Step, iid: str, payload: Any, *, expire: bool = False) -> bool:
    """Resume; an old or repeated id does nothing. One past its `expiresAt` (or `expire`,
    its timer) resolves as expired instead, with `EXPIRED` as the payload: False then."""
    if st.state is None or iid not in st.s.interrupts:
        st.ignore(f"interrupt {iid!r} is not open")
        return False
    interrupt = st.s.interrupts[iid]
    expire = expire or expired(interrupt, st.now)
    if expire:
        payload = EXPIRED
    connector = connector_of(interrupt)
    resumed: ev.SessionInterruptResumed = {
        "type": ev.SESSION_INTERRUPT_RESUMED,
        "interrupt_id": iid,
    }
    trigger: InterruptResumed = {"type": "interrupt.resumed", "interrupt_id": iid}
    if payload is not None:
        resumed["payload"] = payload
        trigger["payload"] = payload
    if expire:
        resumed["expired"] = True
    st.emit(resumed)
    if budgets.budget_of(interrupt) is not None:
        if not expire and approved(payload):
            _tell_worker(st, trigger)
        _budget_answered(st, interrupt, payload, expire)
        return not expire
    if interrupt.get("origin") == "approval":
        _tell_worker(st, trigger)
        _approval_answered(st, interrupt, payload, expire)
        return not expire
    if connector is not None and st.s.turn is not None:
        _tell_worker(st, trigger)
        start_sync(st, connector, force=True)  # a held decision follows it
        return not expire
    decide(st, trigger, reprompt_or_nothing(st))
    return not expire


def _tell_worker(st: Step, trigger: InterruptResumed) -> None:
    """A worker hears of an interrupt the engine raised on its branch (SPEC §8: "the
    worker then gets `interrupt.resumed`"), though it did not raise it: the engine's own
    answer follows (the held call is sent or ends as a tool error, the connection is
    synced again), so nothing is proposed. Not when the turn ends at this answer (a
    declined budget fails it), nor while the turn's first decision is held for its
    connections: the worker has not heard of the turn yet, and the turn's own trigger
    follows the sync."""
    if st.by_worker and st.s.turn is not None and st.s.held is None:
        decide(st, trigger, {})


def interrupt_deadline(st: Step, inp: InterruptDeadline) -> None:
    """An interrupt's `expiresAt` passed: one still open resolves as expired."""
    if st.state is None or inp.interrupt_id not in st.s.interrupts:
        st.ignore(f"interrupt {inp.interrupt_id!r} is not open")
        return
    resume_interrupt(st, inp.interrupt_id, None, expire=True)


def _approval_answered(st: Step, interrupt: OpenInterrupt, payload: Any, expire: bool) -> None:
    """A tool call that waited for a person (connectors' `approve`): approved, it is sent;
    declined or expired, it ends as a tool error the model reads."""
    call_id = (interrupt.get("payload") or {}).get("toolCallId")
    call = st.s.calls.get(call_id or "")
    if call is None or call.status != "requested":
        return
    if not expire and approved(payload):
        dispatch(st, call, 1)
        return
    why = "nobody approved it before the prompt expired" if expire else "a person declined it"
    error: ErrorInfo = {
        "message": f"{call.name} was not run: {why}",
        "code": "handler_error",
        "detail": {"declined": True, "expired": expire},
    }
    call_failed(st, call, error, False, None)


def _budget_answered(st: Step, interrupt: OpenInterrupt, payload: Any, expire: bool) -> None:
    """A call held by its budget (budgets.py): approved, its limit was raised (the resume
    event's fold) and it is sent; declined or expired, the turn fails as over budget."""
    meta = budgets.budget_of(interrupt) or {}
    call = st.s.calls.get(str(meta.get("call_id") or ""))
    if st.s.turn is None:
        return
    if not expire and approved(payload):
        if call is not None and call.status == "requested":
            # A tool call may still need its connection's approval; a model call is sent.
            if call.kind == "tool":
                send_tool(st, call)
            else:
                dispatch(st, call, 1)
        return
    why = "the prompt expired" if expire else "a person declined to raise it"
    figures: dict[str, Any] = {
        k: meta[k]
        for k in ("limit", "allowed", "spent", "next", "policy", "group", "dimension", "frees_at")
        if k in meta
    }
    said = str(interrupt.get("reason") or "").removeprefix("budget: ")
    error: ErrorInfo = {
        "message": f"budget exceeded: {said}; {why}",
        "code": "budget_exceeded",
        "detail": {**figures, "declined": not expire, "expired": expire},
    }
    fail_turn(st, error)
