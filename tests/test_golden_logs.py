"""Logs an earlier version wrote fold to the state they folded to then (tests/golden/).

They are the compatibility contract for logs already in users' Redis: a change to the
fold that breaks one is a change to what a stored session is. Recorded from real engine
runs by tests/golden/record.py; this test only reads them.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from engine.machine import FOLD_VERSION, fold, state_to_json
from engine.machine.events import EVENTS, parse_event
from engine.store import archive

GOLDEN = Path(__file__).parent / "golden"
LOGS = sorted(GOLDEN.glob("*.jsonl"))


def read_log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_there_are_golden_logs_and_each_has_its_state():
    assert len(LOGS) >= 10
    for log in LOGS:
        assert log.with_suffix(".state.json").exists(), log.name


@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.stem)
def test_a_golden_log_folds_to_its_recorded_state(log: Path):
    events = read_log(log)
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert {e["session_id"] for e in events} == {events[0]["session_id"]}
    for event in events:
        parse_event(event)  # still a record of the catalogue, field for field
    state = fold(events)
    assert state is not None
    recorded = json.loads(log.with_suffix(".state.json").read_text())
    assert recorded["fold_version"] == FOLD_VERSION, "a new fold version: refold the states"
    assert json.loads(json.dumps(state_to_json(state))) == recorded


def test_the_golden_logs_hold_every_catalogued_kind():
    """A new kind of event needs a golden log that records it (record.py)."""
    seen = {e["payload"]["type"] for log in LOGS for e in read_log(log)}
    assert set(EVENTS) - seen == set()


def test_every_status_a_golden_log_folds_to_is_a_declared_one():
    """The statuses of engine/statuses.py are closed sets mypy holds the code to; the
    logs are data mypy never sees, so each prefix of each log is folded here and every
    status word of the state checked against its set."""
    from typing import get_args

    from engine.statuses import CallStatus, DecisionStatus, SessionStatus, TurnStatus

    seen: dict[str, set[str]] = {"session": set(), "turn": set(), "call": set(), "decision": set()}
    for log in LOGS:
        events = read_log(log)
        for n in range(1, len(events) + 1):
            state = fold(events[:n])
            assert state is not None
            seen["session"].add(state.status)
            seen["turn"] |= set(state.turns.values())
            seen["call"] |= {c.status for c in state.calls.values()}
            if state.decision is not None:
                seen["decision"].add(state.decision.status)
    declared = {
        "session": set(get_args(SessionStatus)),
        "turn": set(get_args(TurnStatus)),
        "call": set(get_args(CallStatus)),
        "decision": set(get_args(DecisionStatus)),
    }
    for what, words in seen.items():
        assert words, f"no {what} status seen: the check would check nothing"
        assert words <= declared[what], f"{what} statuses not declared: {words - declared[what]}"


@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.stem)
def test_a_golden_log_read_back_from_an_archive_folds_the_same(log: Path, tmp_path: Path):
    """The archive format (docs/archive.md) holds a log exactly: written to a file and
    read back, each golden log folds to its recorded state."""
    events = read_log(log)
    kept = archive.Archive(events[0]["session_id"], events, 1_700_000_000_000, 1_700_000_000_000)
    path = archive.write(tmp_path / archive.file_name(kept.session_id, kept.last_activity_ms), kept)
    back = archive.read(path)
    assert back.events == events and back.session_id == kept.session_id
    state = fold(back.events)
    assert state is not None
    recorded = json.loads(log.with_suffix(".state.json").read_text())
    assert json.loads(json.dumps(state_to_json(state))) == recorded


def test_an_archive_of_another_version_or_shape_is_refused_naming_why(tmp_path: Path):
    events = read_log(LOGS[0])
    good = archive.dumps(archive.Archive(events[0]["session_id"], events, 0, 0))
    lines = gzip.decompress(good).split(b"\n")
    header = json.loads(lines[0])
    cases = {
        "version 2": [json.dumps({**header, "version": 2}).encode(), *lines[1:]],
        "is not event 2": [lines[0], lines[1], *lines[3:]],
        "not a session archive": [b'{"format": "other"}', *lines[1:]],
    }
    for says, broken in cases.items():
        with pytest.raises(archive.ArchiveError, match=says):
            archive.loads(gzip.compress(b"\n".join(broken)))
