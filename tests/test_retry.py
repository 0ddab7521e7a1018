"""Retry policies layer as SPEC §11 says: engine default, agent default, agent kind, action."""

from engine.machine.retry import (
    DEFAULTS,
    Fault,
    Next,
    after_failure,
    backoff_ms,
    past_total,
    resolve_policy,
)


def test_defaults_match_the_spec_table():
    assert DEFAULTS["llm"]["max_attempts"] == 5 and DEFAULTS["llm"]["run_timeout_secs"] == 180
    assert (
        DEFAULTS["llm"]["total_timeout_secs"] == 1800
        and DEFAULTS["llm"]["queue_timeout_secs"] == 60
    )
    assert DEFAULTS["tool"]["max_attempts"] == 1 and DEFAULTS["tool"]["run_timeout_secs"] == 120
    assert (
        DEFAULTS["decision"]["max_attempts"] == 10
        and DEFAULTS["decision"]["run_timeout_secs"] == 20
    )
    assert DEFAULTS["decision"]["total_timeout_secs"] == 300
    assert DEFAULTS["subagent"]["max_attempts"] == 3


def test_overrides_layer_in_order_and_only_change_what_they_name():
    agent = {
        "retry": {
            "default": {"max_attempts": 7, "backoff_base_secs": 3},
            "llm": {"max_attempts": 4},
            "tool": {"run_timeout_secs": 30},
        }
    }
    llm = resolve_policy("llm", agent)
    assert llm["max_attempts"] == 4 and llm["backoff_base_secs"] == 3
    assert llm["run_timeout_secs"] == 180
    tool = resolve_policy("tool", agent, {"max_attempts": 2, "run_timeout_secs": None})
    assert tool["max_attempts"] == 2 and tool["run_timeout_secs"] == 30  # None names nothing
    assert resolve_policy("decision", agent)["max_attempts"] == 7  # only `default` reaches it
    assert resolve_policy("client_tool", agent)["run_timeout_secs"] == 30  # retry.tool covers it


def test_backoff_and_total_timeout():
    policy = {"backoff_base_secs": 2, "backoff_max_secs": 10, "total_timeout_secs": 60}
    assert [backoff_ms(policy, n) for n in (2, 3, 4)] == [4000, 8000, 10000]
    assert not past_total(policy, 0, 60_000) and past_total(policy, 0, 60_001)


POLICY = {
    "max_attempts": 3,
    "backoff_base_secs": 2,
    "backoff_max_secs": 10,
    "total_timeout_secs": 60,
}


def test_after_a_failure_the_next_attempt_waits_its_backoff_or_what_was_asked():
    assert after_failure(POLICY, 1, 0, 1000, retryable=True) == Next(False, 5000, False)
    assert after_failure(POLICY, 1, 0, 1000, retryable=True, retry_after=7.5).due == 8500
    assert after_failure(POLICY, 1, 0, 1000, retryable=True, at_once=True).due == 1000


def test_a_failure_is_final_when_refused_counted_out_or_out_of_time():
    assert after_failure(POLICY, 1, 0, 0, retryable=False).final
    assert after_failure(POLICY, 3, 0, 0, retryable=True) == Next(True, 10_000, False)
    lost = after_failure(POLICY, 3, 0, 0, retryable=True, at_once=True, counted=False)
    assert not lost.final  # a lost attempt does not count...
    late = after_failure(POLICY, 1, 0, 57_000, retryable=True)
    assert late == Next(True, 61_000, True)  # ...but the total timeout still bounds it
    # The effect's own total timeout bounds it when another policy counts the attempts.
    assert not after_failure(POLICY, 1, 0, 57_000, retryable=True, total={}).final


def test_the_engines_own_faults_say_their_code_and_whether_to_retry():
    assert Fault.LOST.error("gone") == {"message": "gone", "code": "internal"}
    assert Fault.LOST.retryable and Fault.DEADLINE.retryable and Fault.INVALID_RESPONSE.retryable
    assert not (Fault.UNROUTABLE.retryable or Fault.BAD_OUTPUT.retryable)
    assert Fault.CHILD_DEADLINE.code == Fault.DEADLINE.code and not Fault.CHILD_DEADLINE.retryable
