"""Re-record the golden logs from real engine runs: `python -m tests.golden.record`.

Runs each scenario's test (the real engine on a real redis-server, the fake vendor
and the test worker) with this module as a pytest plugin; after the test, every
session's log is written as `<scenario>[.<n>].jsonl`, one stored event a line, and
its fold as `.state.json`. `--states` only refolds the logs already here (for a
deliberate `FOLD_VERSION` change). tests/test_golden_logs.py never records.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis import Redis

from engine.machine import fold, state_to_json

HERE = Path(__file__).parent
_SCENARIO = "SUBS_GOLDEN_SCENARIO"

SCENARIOS = {
    "engine_client_tool": "tests/test_engine.py::test_client_tool_round_trip_streamed[ops_openai]",
    "engine_vendor_retries": "tests/test_engine.py::"
    "test_retryable_vendor_errors_are_retried_then_the_turn_completes",
    "engine_queue": "tests/test_engine.py::test_busy_session_refuses_queues_and_dedupes",
    "engine_poison_input": "tests/test_engine.py::"
    "test_a_poison_input_fails_the_running_turn_and_the_queued_one_runs",
    "engine_cancel": "tests/test_api.py::test_cancel_ends_the_running_turn_and_the_queued_one_runs",
    "worker_tool": "tests/test_engine_worker.py::"
    "test_a_worker_that_echoes_proposals_is_a_complete_agent",
    "worker_async_tool": "tests/test_engine_worker.py::"
    "test_an_async_tool_waits_for_a_settle_across_an_engine_restart",
    "worker_interrupt": "tests/test_engine_worker.py::test_interrupt_pauses_until_resumed",
    "worker_decision_retries_fail": "tests/test_engine_worker.py::"
    "test_a_wrong_signature_fails_the_turn_cleanly",
    "worker_decision_retry_recovers": "tests/test_engine_worker.py::"
    "test_garbage_is_a_failed_attempt_and_the_next_one_recovers[garbage1-actions.0.type]",
    "worker_message_send": "tests/test_engine_worker.py::"
    "test_message_send_reaches_the_other_session_once",
    "subagents": "tests/test_subagents.py::"
    "test_a_parent_delegates_to_a_worker_child_and_an_engine_child_at_once",
    "worker_state_branch_backoff": "tests/golden/scenarios.py::"
    "test_worker_state_channels_a_backoff_and_a_branch",
    "subagent_fails": "tests/golden/scenarios.py::test_a_child_whose_turn_fails",
    "engine_per_submit_tool_waits": "tests/golden/scenarios.py::"
    "test_a_turn_waits_on_a_per_submit_client_tool",
    "connectors": "tests/golden/scenarios.py::"
    "test_connectors_a_sync_a_call_and_a_server_that_is_not_installed",
    "connector_off": "tests/golden/scenarios.py::test_an_off_connection_over_two_turns",
    "budget_ask": "tests/test_budgets.py::test_ask_holds_the_call_until_a_person_approves_more",
    "budget_policy_reject": "tests/test_budget_policies.py::"
    "test_a_per_agent_policy_stops_the_turn_that_would_cross_it_while_another_agent_runs[single]",
    "budget_policy_interrupt": "tests/test_budget_policies.py::"
    "test_the_interrupt_strategy_asks_and_an_approval_lets_the_turn_go_on",
    "worker_async_decision": "tests/test_async_decisions.py::"
    "test_an_async_decision_completes_the_turn_and_a_stale_id_is_refused",
}


def write_state(log: Path) -> None:
    events = [json.loads(line) for line in log.read_text().splitlines()]
    state = fold(events)
    assert state is not None, log
    log.with_suffix(".state.json").write_text(json.dumps(state_to_json(state), indent=1) + "\n")


def _logs(redis: Redis) -> list[list[dict[str, Any]]]:
    """Every session's log, oldest session first."""
    logs = []
    for key in redis.scan_iter(match="subs:*:log:*"):
        logs.append([json.loads(fields[b"e"]) for _, fields in redis.xrange(key)])
    return sorted(logs, key=lambda log: (log[0]["occurred_at"], log[0]["session_id"]))


@pytest.fixture(autouse=True)
def record_sessions(redis_server: str) -> Iterator[None]:
    """After the test (its own fixtures torn down first), write what it logged."""
    yield
    name = os.environ[_SCENARIO]
    with Redis.from_url(redis_server) as redis:
        logs = _logs(redis)
    assert logs, f"{name} logged nothing"
    for n, log in enumerate(logs, 1):
        path = HERE / (f"{name}.jsonl" if len(logs) == 1 else f"{name}.{n}.jsonl")
        path.write_text("".join(json.dumps(e, separators=(",", ":")) + "\n" for e in log))
        write_state(path)


def main(argv: list[str]) -> int:
    if argv == ["--states"]:
        for log in sorted(HERE.glob("*.jsonl")):
            write_state(log)
        return 0
    for name in argv or SCENARIOS:
        for old in HERE.glob(f"{name}.*"):
            old.unlink()
        run = [sys.executable, "-m", "pytest", "-q", "-p", "tests.golden.record", SCENARIOS[name]]
        done = subprocess.run(run, env={**os.environ, _SCENARIO: name}, check=False)
        if done.returncode != 0:
            return done.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
