"""The event catalogue (engine/machine/events.py) and the fold agree on the kinds."""

from __future__ import annotations

import pytest

from engine.machine import LlmCallSettled
from engine.machine import events as ev
from engine.machine.evolve import _APPLY
from tests.machine_helpers import Session, tool_reply


def test_evolve_folds_exactly_the_catalogued_kinds():
    assert set(_APPLY) | {ev.SESSION_CREATED} == set(ev.EVENTS)


def test_every_kind_constant_is_catalogued():
    constants = {
        value for name, value in vars(ev).items() if name.isupper() and isinstance(value, str)
    }
    assert constants == set(ev.EVENTS)


@pytest.mark.parametrize(
    "payload",
    [
        {"type": "head.moved", "head": "m1"},  # a renamed field
        {"type": "head.moved"},  # a missing one
        {"type": "turn.started", "turn_id": 7},  # a mistyped one
        {"type": "turn.begun", "turn_id": "t"},  # an unknown kind
    ],
)
def test_a_payload_off_its_record_is_refused(payload):
    with pytest.raises(ValueError):
        ev.parse(payload)


_QUEUED = {"type": "decision.queued", "proposed": {}}
_FINISHED = {"type": "tool.finished", "id": "c1", "ok": True, "name": "lookup"}


@pytest.mark.parametrize(
    "payload",
    [
        {**_QUEUED, "trigger": {**_FINISHED, "result_text": "x"}},  # a field no rule writes
        {**_QUEUED, "trigger": {k: v for k, v in _FINISHED.items() if k != "ok"}},  # one missing
        {**_QUEUED, "trigger": {"type": "tool.done", "id": "c1"}},  # a kind of trigger unknown
        {**_QUEUED, "trigger": _FINISHED, "proposed": {"actions": [{"type": "done", "x": 1}]}},
        {**_QUEUED, "trigger": _FINISHED, "proposed": {"actions": [{"type": "tool.call"}]}},
        {
            "type": "turn.failed",
            "turn_id": "t",
            "error": {"message": "m"},
            "cost": "0",
            "usage": {},
        },
        {"type": "turn.started", "turn_id": "t", "by": {"privilege": "operator", "who": "U1"}},
    ],
)
def test_triggers_actions_and_errors_inside_a_payload_are_held_to_their_shapes(payload):
    """A record's trigger, proposal, error and submitter are typed shapes
    (engine/machine/shapes.py), checked as strictly as the record around them."""
    with pytest.raises(ValueError):
        ev.parse(payload)
    good = {**payload, "trigger": _FINISHED, "proposed": {"actions": [{"type": "done"}]}}
    if payload["type"] == "decision.queued":
        ev.parse(good)  # the same record with shapes that fit is taken


def test_a_run_emits_only_catalogued_records():
    """conftest checks every emit; this names the check so its failure reads clearly."""
    s = Session()
    s.say("hi")
    call = next(iter(s.state.calls))
    s.apply(LlmCallSettled(call, 1, response=tool_reply(("c1", "confirm", "{}"))))
    assert {"tool.call.requested", "tool.call.dispatched"} <= set(s.types())
    for event in s.log:
        ev.parse_event(event)
