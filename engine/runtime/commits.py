"""A transition as the store writes it: one `Commit`, built without I/O.

What the machine returned (events, new state, effects) and what the work item brings
(its ack, whom to answer, the timer that fired) become the fields of the one Lua call
that commits a step (`engine/store/log.py`): the events, the snapshot when its mark
says it is due, timers started and ended, deliveries for the outbox, the reply, the
session's place in the listing indexes. `apply.py` plans a step with these and owns
everything around them (the cache, the clock, the retries).
"""

from __future__ import annotations

import dataclasses
import json

from engine.jsonedge import encode
from engine.machine import (
    CancelTimer,
    Deliver,
    Input,
    Kinds,
    SessionState,
    StartTimer,
    Transition,
    input_to_json,
    state_to_json,
)
from engine.machine import events as ev
from engine.machine.deadlines import armed
from engine.machine.evolve import at_ms
from engine.runtime.inflight import has_inflight
from engine.store.index import IndexWrite, scopes_of
from engine.store.snapshots import Mark
from engine.store.store import Commit, WorkItem


def commit_of(
    sid: str,
    seq: int,
    t: Transition,
    mark: Mark | None,
    min_bytes: int,
    item: WorkItem,
    kinds: Kinds,
) -> tuple[Commit, Mark | None]:
    """What a transition writes: its events, the snapshot when it is due, its timers and
    deliveries, and what comes from the work item (see `with_item`); and the snapshot's
    mark once it is written."""
    new_state = t.state
    created = t.events[0] if t.events else None
    events = tuple(map(encode, t.events))
    snapshot = None
    if events and new_state:
        mark = mark.after(sum(map(len, events)), min_bytes) if mark else None
        if mark is None:
            snapshot = encode(state_to_json(new_state))
            mark = Mark(len(snapshot), 0)
    commit = Commit(
        session_id=sid,
        expected_seq=seq,
        new_seq=new_state.seq if new_state else 0,
        events=events,
        snapshot=snapshot,
        inflight=has_inflight(new_state, kinds) if t.events else None,
        timers=tuple(
            (e.due, _timer_member(sid, e.due, e.input))
            for e in t.effects
            if isinstance(e, StartTimer)
        ),
        timers_done=tuple(
            _timer_member(sid, e.due, e.input) for e in t.effects if isinstance(e, CancelTimer)
        )
        + ((item.timer_member,) if item.timer_member else ()),
        ack_id=item.entry_id,
        reply_to=item.reply_to,
        outbox=tuple(
            json.dumps({"to": e.to, "input": input_to_json(e.input)})
            for e in t.effects
            if isinstance(e, Deliver)
        ),
        reply={"ok": True, **t.reply} if t.reply else {"ok": True, "ignored": t.ignored},
        created_ms=at_ms(created)
        if created and created["payload"]["type"] == ev.SESSION_CREATED
        else None,
        index=_index_of(new_state, t, kinds),
    )
    return commit, mark


def with_item(commit: Commit, item: WorkItem) -> Commit:
    """The parts of a commit that come from the work item: its ack, reply list and timer."""
    done = commit.timers_done + ((item.timer_member,) if item.timer_member else ())
    return dataclasses.replace(
        commit, ack_id=item.entry_id, reply_to=item.reply_to, timers_done=done
    )


def _index_of(state: SessionState | None, t: Transition, kinds: Kinds) -> IndexWrite | None:
    """The session's entry in the listing indexes after a step that wrote events."""
    if state is None or not t.events:
        return None
    # What the step armed gives the wake time without working the timers out again.
    dues = t.dues if t.dues is not None else (due for due, _ in armed(state, kinds).values())
    return IndexWrite(
        created_ms=state.created_at,
        last_ms=at_ms(t.events[-1]),
        wake_ms=min(dues, default=None),
        scopes=scopes_of(state.agent_id, not state.ancestry),
    )


def _timer_member(sid: str, due: int, inp: Input) -> str:
    """A timer's entry in the partition's set; the same timer always gives the same bytes."""
    return json.dumps({"sid": sid, "input": input_to_json(inp), "due": due})
