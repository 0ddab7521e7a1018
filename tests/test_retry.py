"""Retry policies layer as SPEC §11 says: engine default, agent default, agent kind, action."""

from engine.machine.retry import DEFAULTS, backoff_ms, past_total, resolve_policy


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
