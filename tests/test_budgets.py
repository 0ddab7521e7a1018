"""Budgets through the engine (issue #28): a real engine, a real MCP server over stdio
and the fake vendor over loopback; the machine's table tests are test_machine_budgets.py.
Also the config (`budget`, `session_budget`, `[llm.<id>] prices`) and `subs check`."""

from __future__ import annotations

import textwrap
from decimal import Decimal
from pathlib import Path

import pytest

from engine.config import ConfigError, parse_project
from engine.effects.llm import prices
from tests.engine_helpers import (
    assert_consistent,
    payloads,
    subs,
    turn_ended,
    wait_for_event,
)
from tests.fakes.llm_vendor import FakeVendor, Text, ToolCalls
from tests.test_mcp import harness, stdio_block, toml  # noqa: F401 (harness: a fixture)


async def test_a_model_that_calls_a_tool_forever_stops_at_max_model_calls(harness, vendor):  # noqa: F811
    # The vendor answers every request with the same tool call, for ever.
    vendor.default = ToolCalls([("clock__now", {})])
    text = toml(
        vendor,
        blocks=stdio_block(),
        mcp='[{ id = "mcp.clock", approve = "never" }]',
        extra="budget = { max_model_calls = 3 }",
    )
    await harness.start(text)
    sid, end = await harness.turn("loop for ever")
    assert end["payload"]["type"] == "turn.failed"
    error = end["payload"]["error"]
    assert error["code"] == "budget_exceeded"
    assert error["detail"] == {
        "limit": "max_model_calls",
        "allowed": "3",
        "spent": "3",
        "next": "1",
    }
    assert len(vendor.requests) == 3  # the fourth request never reached the vendor
    events = await assert_consistent(harness.engine.store, sid)
    assert len(payloads(events, "llm.call.requested")) == 3
    assert len(payloads(events, "tool.call.completed")) == 3  # each tool call ran
    assert len(vendor.requests) == 3


async def test_ask_holds_the_call_until_a_person_approves_more(harness, vendor):  # noqa: F811
    """`on_exceeded = "ask"`: the second model call waits behind an interrupt and reaches
    the vendor only once approved (also the golden log `budget_ask`)."""
    vendor.push(ToolCalls([("clock__now", {})]), Text("It is noon."))
    budget = 'budget = { max_model_calls = 1, max_cost_usd = 1, on_exceeded = "ask" }'
    text = toml(
        vendor, blocks=stdio_block(), mcp='[{ id = "mcp.clock", approve = "never" }]', extra=budget
    )
    await harness.start(text)
    sid, turn_id = await harness.say("what time is it?")
    client = harness.client
    asked = await wait_for_event(
        client, sid, lambda e: e["payload"]["type"] == "session.interrupted"
    )
    assert asked["payload"]["origin"] == "budget"
    assert asked["payload"]["payload"]["message"].endswith("continue with another 1?")
    assert len(vendor.requests) == 1  # the held call was not sent
    iid = asked["payload"]["interrupt_id"]
    body = {"type": "interrupt.resume", "interrupt_id": iid, "payload": {"value": "approve"}}
    assert (await client.submit(body, session_id=sid))["resumed"] is True
    end = await wait_for_event(client, sid, turn_ended(turn_id))
    assert end["payload"]["type"] == "turn.completed"
    assert len(vendor.requests) == 2
    events = await assert_consistent(harness.engine.store, sid)
    estimates = [p["estimate"] for p in payloads(events, "llm.call.requested")]
    assert len(estimates) == 2 and all(e["tokens"] > 0 for e in estimates)


def project(extra_llm: str = "", agent: str = "", model: str = "gpt-4.1-mini"):
    text = textwrap.dedent(
        f"""\
        [llm.main]
        type = "openai"
        {extra_llm}

        [agent.a]
        llm = "main"
        model = "{model}"
        {agent}
        """
    )
    return parse_project(text, "subs.toml", env={})


def test_an_agents_budget_reaches_its_config_with_its_models_input_price():
    p = project(agent='budget = { max_cost_usd = 0.5, max_tool_calls = 4, on_exceeded = "ask" }')
    a = p.agents["a"]
    config = prices.with_prices(p, a.wire_config(p), a)
    assert config["budget"] == {
        "max_cost_usd": 0.5,
        "max_tool_calls": 4,
        "on_exceeded": "ask",
        "price": {"input": "0.4", "cache_read": "0.1"},  # gpt-4.1-mini, from the table
    }
    assert prices.unpriced(p) == []
    # An agent with only a session budget: its price rides on that budget.
    p = project(agent="session_budget = { max_cost_usd = 2 }")
    a = p.agents["a"]
    config = prices.with_prices(p, a.wire_config(p), a)
    assert config["session_budget"]["price"] == {"input": "0.4", "cache_read": "0.1"}


def test_a_blocks_own_prices_price_a_model_the_table_lacks():
    p = project(
        extra_llm='prices = { "my-local-model" = { input = 0.5, output = 1.5 } }',
        agent="session_budget = { max_cost_usd = 2 }",
        model="my-local-model",
    )
    assert prices.unpriced(p) == []
    own = p.llm["main"].prices
    usage = {"uncached_input": 1_000_000, "cache_read": 0, "cache_write": 0, "output": 2_000_000}
    assert Decimal(prices.cost("my-local-model", usage, own)) == Decimal("3.5")
    assert prices.cost("my-local-model", usage) == "0"  # not in the table


def test_a_cost_limit_on_a_model_with_no_known_price_is_refused():
    p = project(agent="budget = { max_cost_usd = 1 }", model="my-local-model")
    [(key, why)] = prices.unpriced(p)
    assert key == "agent.a.budget.max_cost_usd"
    assert "my-local-model" in why and "prices" in why
    # A count limit needs no price.
    assert prices.unpriced(project(agent="budget = { max_model_calls = 1 }", model="x")) == []


@pytest.mark.parametrize(
    ("agent", "key"),
    [
        ("budget = { max_cost_usd = -1 }", "agent.a.budget.max_cost_usd"),
        ('budget = { on_exceeded = "warn" }', "agent.a.budget.on_exceeded"),
        ("budget = { max_calls = 3 }", "agent.a.budget.max_calls"),
        ("session_budget = { }", "agent.a.session_budget.max_cost_usd"),
    ],
)
def test_a_wrong_budget_is_one_error_naming_its_key(agent, key):
    with pytest.raises(ConfigError) as e:
        project(agent=agent)
    assert e.value.key == key


def test_a_worker_agents_budget_comes_from_its_worker():
    text = textwrap.dedent(
        """\
        [agent.w]
        worker = "http://127.0.0.1:9/worker"
        budget = { max_model_calls = 2 }
        """
    )
    with pytest.raises(ConfigError) as e:
        parse_project(text, "subs.toml", env={})
    assert "needs both llm and model" in str(e.value)


async def test_subs_check_refuses_a_cost_limit_it_cannot_count(tmp_path: Path, vendor: FakeVendor):
    config = tmp_path / "subs.toml"
    config.write_text(
        textwrap.dedent(
            f"""\
            [llm.main]
            type = "openai"
            base_url = "{vendor.openai_base()}"

            [agent.a]
            llm = "main"
            model = "my-local-model"
            budget = {{ max_cost_usd = 1 }}
            """
        )
    )
    code, out, err = await subs("check", "-c", str(config), env={"OPENAI_API_KEY": "x"})
    assert code != 0
    assert "agent.a.budget.max_cost_usd" in out + err and "my-local-model" in out + err
    config.write_text(
        config.read_text().replace(
            'type = "openai"',
            'type = "openai"\nprices = { "my-local-model" = { input = 1, output = 2 } }',
        )
    )
    code, out, err = await subs("check", "-c", str(config), env={"OPENAI_API_KEY": "x"})
    assert code == 0, out + err
