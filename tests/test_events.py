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


def test_a_run_emits_only_catalogued_records():
    """conftest checks every emit; this names the check so its failure reads clearly."""
    s = Session()
    s.say("hi")
    call = next(iter(s.state.calls))
    s.apply(LlmCallSettled(call, 1, response=tool_reply(("c1", "confirm", "{}"))))
    assert {"tool.call.requested", "tool.call.dispatched"} <= set(s.types())
    for event in s.log:
        ev.parse_event(event)
