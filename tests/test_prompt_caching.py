"""Prompt caching: Anthropic breakpoints (direct and through OpenRouter), OpenAI's stable
prefix, and the cache tokens priced at their own rates, per call and per turn.

The fake vendor caches as the vendors document it (tests/fakes/prompt_cache.py,
docs/prompt-caching.md): Anthropic reads a prefix written at an earlier breakpoint,
refuses a fifth breakpoint; OpenAI reads a repeated prefix of 1024+ tokens in 128-token
steps.
"""

from __future__ import annotations

import itertools
import json
import textwrap
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from engine.client import Client
from engine.config import parse_project
from engine.effects.llm import anthropic, caching, prices
from engine.effects.llm.caching import choose
from engine.effects.llm.prompts import EncodedMessages, encode_body
from engine.runtime.engine import Engine
from tests.engine_helpers import ENV, turn_ended, wait_for_event
from tests.fakes.llm_vendor import ANTHROPIC_PATH, OPENAI_PATH, Text, ToolCalls

# About 1,600 of the fake's tokens: past Sonnet's 1,024-token minimum and OpenAI's 1,024.
LONG_SYSTEM = "You are the on-call assistant. " + " ".join(
    f"Rule {n}: answer briefly, cite the runbook, never guess about production." for n in range(80)
)
# About 1,100 tokens of tool definitions: the tools alone make a cacheable prefix.
LONG_TOOL = "Ask the person at the keyboard to confirm an action. " + " ".join(
    f"Case {n}: a restart, a rollback or a failover needs a yes first." for n in range(70)
)
EPHEMERAL = {"type": "ephemeral"}


# --- where the breakpoints go (pure) ----------------------------------------------------


def test_breakpoints_close_tools_system_previous_turn_and_newest_message() -> None:
    kinds = ["definition", "definition", "system", "user", "assistant", "user"]
    sizes = [40, 60, 5000, 10, 20, 10]
    assert choose(kinds, sizes, minimum=1) == [1, 2, 4, 5]
    # A prefix under the model's minimum (4096 bytes ~ 1024 tokens) is not worth a marker.
    assert choose(kinds, sizes, minimum=1024) == [2, 4, 5]
    # Within a turn the newest message is a tool result; the previous turn ends before
    # the newest user message.
    loop = ([*kinds, "assistant", "tool"], [*sizes, 30, 30])
    assert choose(*loop, minimum=1) == [1, 2, 4, 7]
    assert choose(*loop, minimum=1, unmarkable=[1]) == [2, 4, 7]
    assert choose(["user"], [10], minimum=1) == [0]
    assert choose([], [], minimum=1) == []


def test_caching_style_by_vendor_and_model() -> None:
    assert caching.caching_for("anthropic", "claude-sonnet-4-5", True) == caching.Caching(
        "anthropic", 1024
    )
    assert caching.caching_for("openrouter", "anthropic/claude-haiku-4.5", True) == (
        caching.Caching("parts", 4096)
    )
    assert caching.caching_for("openrouter", "openai/gpt-4.1", True) is None
    assert caching.caching_for("openai", "gpt-4.1", True) is None
    assert caching.caching_for("anthropic", "claude-sonnet-4-5", False) is None


def anthropic_body(
    messages: list[dict[str, Any]], *, cache: bool = True, tools: bool = True
) -> dict[str, Any]:
    request = {
        "model": "claude-sonnet-4-5",
        "messages": messages,
        "tools": [{"name": "confirm", "description": LONG_TOOL}] if tools else [],
    }
    body = encode_body(
        request,
        scope=("s", "anthropic"),
        groups=anthropic.message_groups,
        convert=anthropic.convert_group,
        build=anthropic.build_request,
        stream=False,
        kept=EncodedMessages(),
        caching=caching.caching_for("anthropic", "claude-sonnet-4-5", cache),
    )
    parsed: dict[str, Any] = json.loads(body)
    return parsed


def test_an_anthropic_body_carries_four_breakpoints_and_none_when_off() -> None:
    messages = [
        {"id": "s", "role": "system", "content": LONG_SYSTEM},
        {"id": "u1", "role": "user", "content": "what is paging?"},
        {"id": "a1", "role": "assistant", "content": "disk full on db-1"},
        {"id": "u2", "role": "user", "content": "and now?"},
    ]
    body = anthropic_body(messages)
    assert body["tools"][-1]["cache_control"] == EPHEMERAL
    assert body["system"] == [{"type": "text", "text": LONG_SYSTEM, "cache_control": EPHEMERAL}]
    first, previous, newest = body["messages"]
    assert first == {"role": "user", "content": "what is paging?"}
    assert previous["content"] == [
        {"type": "text", "text": "disk full on db-1", "cache_control": EPHEMERAL}
    ]
    assert newest["content"][-1]["cache_control"] == EPHEMERAL
    assert json.dumps(body).count("cache_control") == 4
    assert "cache_control" not in json.dumps(anthropic_body(messages, cache=False))
    # A short prompt is under the minimum: no breakpoint at all.
    short = [{"id": "u", "role": "user", "content": "hi"}]
    assert "cache_control" not in json.dumps(anthropic_body(short, tools=False))


# --- the fake vendor speaks caching as the vendors do -----------------------------------


def marked(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text, "cache_control": EPHEMERAL}


async def test_a_fifth_breakpoint_is_refused_with_anthropics_own_error(vendor) -> None:
    vendor.push(Text("never sent"))
    body = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 10,
        "system": [marked("a"), marked("b")],
        "messages": [{"role": "user", "content": [marked("c"), marked("d"), marked("e")]}],
    }
    async with (
        aiohttp.ClientSession() as http,
        http.post(vendor.url + ANTHROPIC_PATH, json=body) as response,
    ):
        assert response.status == 400
        error = await response.json()
    assert error["type"] == "error"
    assert error["error"] == {
        "type": "invalid_request_error",
        "message": "A maximum of 4 blocks with cache_control may be provided. Found 5.",
    }
    # Four are taken, and the script's reply was not used up by the refusal.
    body["messages"][0]["content"][-1].pop("cache_control")
    async with (
        aiohttp.ClientSession() as http,
        http.post(vendor.url + ANTHROPIC_PATH, json=body) as response,
    ):
        assert response.status == 200
        assert (await response.json())["content"][0]["text"] == "never sent"


async def test_openai_reads_a_repeated_prefix_from_1024_tokens_in_128_token_steps(vendor):
    vendor.default = Text("ok")
    system = {"role": "system", "content": "x" * 5000}  # 1250 tokens

    async def cached(messages: list[dict[str, Any]]) -> int:
        body = {"model": "gpt-4.1-mini", "messages": messages}
        async with (
            aiohttp.ClientSession() as http,
            http.post(vendor.url + OPENAI_PATH, json=body) as response,
        ):
            usage = (await response.json())["usage"]
        return int(usage["prompt_tokens_details"]["cached_tokens"])

    first = [system, {"role": "user", "content": "hi"}]
    assert await cached(first) == 0
    # The second call repeats 5002 characters: 1250 tokens, read as 1024 + 128.
    assert await cached([*first, {"role": "assistant", "content": "yo"}]) == 1152
    # A repeated prefix under 1024 tokens is not cached.
    short = [{"role": "system", "content": "y" * 3000}, {"role": "user", "content": "hi"}]
    assert await cached(short) == 0
    assert await cached([*short, {"role": "user", "content": "again"}]) == 0


# --- the engine: a session's second turn reads the first one's cache --------------------


# A session budget two turns of the long prompt (about 2,700 tokens of tools and system)
# fit only when the second reads the first's prefix from the cache: turn 1 costs about
# $0.0100 (written at 1.25x; $0.0081 uncached), turn 2's input is estimated at about
# $0.0081 at the input price and $0.0010 with the cached prefix at the cache-read price.
CAPPED = "session_budget = { max_cost_usd = 0.013 }"


def project_toml(url: str) -> str:
    tool = (
        f'{{ name = "confirm", description = "{LONG_TOOL}", '
        'handler = "client", input = { type = "object", properties = '
        '{ question = { type = "string" } } } }'
    )

    def agent(name: str, llm: str, model: str, extra: str = "") -> str:
        return f"""
        [agent.{name}]
        llm = "{llm}"
        model = "{model}"
        system = "{LONG_SYSTEM}"
        tools = [{tool}]
        retry = {{ llm = {{ backoff_base_secs = 0 }} }}
        {extra}
        """

    return textwrap.dedent(
        f"""\
        name = "caching"

        [llm.anthropic]
        type = "anthropic"
        base_url = "{url}"

        [llm.uncached]
        type = "anthropic"
        base_url = "{url}"
        cache = false

        [llm.openrouter]
        type = "openrouter"
        base_url = "{url}/api/v1"

        [llm.openai]
        type = "openai"
        base_url = "{url}/v1"
        """
    ) + "".join(
        textwrap.dedent(agent(*a))
        for a in (
            ("claude", "anthropic", "claude-sonnet-4-5"),
            ("claude_off", "uncached", "claude-sonnet-4-5"),
            ("routed", "openrouter", "anthropic/claude-sonnet-4-5"),
            ("gpt", "openai", "gpt-4.1-mini"),
            ("claude_capped", "anthropic", "claude-sonnet-4-5", CAPPED),
            ("claude_capped_off", "uncached", "claude-sonnet-4-5", CAPPED),
        )
    )


@pytest.fixture
async def cache_engine(redis, vendor, tmp_path: Path):
    path = tmp_path / "subs.toml"
    path.write_text(project_toml(vendor.url))
    project = parse_project(path.read_text(), str(path), env={})
    engine = Engine(project, redis, env={**ENV, "OPENROUTER_API_KEY": "test-or"}, lease_ms=3000)
    await engine.start()
    yield engine
    await engine.stop()


async def two_turns(engine: Engine, agent: str) -> list[dict[str, Any]]:
    """Two turns of one session; their turn.completed payloads."""
    client = Client(engine.store)
    ends = []
    sid = None
    for text in ("the db is paging, what now?", "it is back; anything else?"):
        message = {"role": "user", "content": text}
        submit = {"type": "client.message", "agent_id": agent, "message": message}
        reply = await client.submit(submit, session_id=sid)
        sid = reply["session_id"]
        end = await wait_for_event(client, sid, turn_ended(reply["turn_id"]))
        assert end["payload"]["type"] == "turn.completed"
        ends.append(end["payload"])
    return ends


def marks(value: Any, path: str = "") -> list[str]:
    """Where a body carries cache_control, as paths."""
    if isinstance(value, dict):
        here = [path] if "cache_control" in value else []
        return here + [m for k, v in value.items() for m in marks(v, f"{path}.{k}")]
    if isinstance(value, list):
        return [m for i, v in enumerate(value) for m in marks(v, f"{path}[{i}]")]
    return []


async def test_the_second_turn_reads_the_first_turns_prefix_at_the_cache_price(
    cache_engine, vendor
):
    vendor.push(Text("Check the runbook for disk alerts first."), Text("Watch it for an hour."))
    first, second = await two_turns(cache_engine, "claude")
    one, two = (r.body for r in vendor.requests)
    # Turn 1: tools, system, the newest message. Turn 2: the previous turn's end as well.
    assert marks(one) == [".system[0]", ".messages[0].content[0]", ".tools[0]"]
    assert marks(two) == [
        ".system[0]",
        ".messages[1].content[0]",
        ".messages[2].content[0]",
        ".tools[0]",
    ]
    assert first["usage"]["cache_read"] == 0 and first["usage"]["cache_write"] > 0
    # Turn 2 reads all turn 1 wrote, and writes only what came since.
    assert second["usage"]["cache_read"] == first["usage"]["cache_write"]
    assert 0 < second["usage"]["cache_write"] < first["usage"]["cache_write"] / 10
    # Priced at Sonnet 4.5's own rates: $3 input, $0.30 read, $3.75 write, $15 output.
    for end in (first, second):
        assert end["cost"] == prices.cost("claude-sonnet-4-5", end["usage"])
    assert Decimal(second["cost"]) < Decimal(first["cost"]) / 2
    # Paid at the input price, turn 2's input would have cost this much more:
    u = second["usage"]
    saved = (Decimal(u["cache_read"]) * Decimal("2.70") - u["cache_write"] * Decimal("0.75")) / (
        10**6
    )
    uncached_price = (u["input"] * 3 + u["output"] * 15) / Decimal(10**6)
    assert uncached_price - Decimal(second["cost"]) == saved > 0
    # /metrics counts input tokens by how the cache served them.
    labels = 'model="claude-sonnet-4-5",provider="anthropic"'
    scraped = cache_engine.metrics.render()
    reads = first["usage"]["cache_read"] + second["usage"]["cache_read"]
    assert f'subs_model_input_tokens_total{{cache="cache_read",{labels}}} {reads}\n' in scraped
    writes = first["usage"]["cache_write"] + second["usage"]["cache_write"]
    assert f'subs_model_input_tokens_total{{cache="cache_write",{labels}}} {writes}\n' in scraped


async def test_with_cache_false_no_breakpoint_is_sent(cache_engine, vendor):
    vendor.push(Text("Check the runbook."), Text("Watch it."))
    _, second = await two_turns(cache_engine, "claude_off")
    assert all(b"cache_control" not in r.raw for r in vendor.requests)
    assert second["usage"]["cache_read"] == second["usage"]["cache_write"] == 0
    assert second["usage"]["uncached_input"] == second["usage"]["input"]


async def test_through_openrouter_an_anthropic_model_gets_breakpoints_on_content_parts(
    cache_engine, vendor
):
    vendor.push(Text("Check the runbook."), Text("Watch it."))
    first, second = await two_turns(cache_engine, "routed")
    two = vendor.requests[1].body
    # The system message, the previous turn's reply and the newest message; the tools
    # have no documented marker in Chat Completions, and render before the system prompt.
    assert marks(two) == [
        ".messages[0].content[0]",
        ".messages[2].content[0]",
        ".messages[3].content[0]",
    ]
    raw = vendor.requests[1].raw
    assert raw.index(b'"tools"') < raw.index(b'"messages"')
    assert second["usage"]["cache_read"] == first["usage"]["cache_write"] > 0
    assert Decimal(second["cost"]) < Decimal(first["cost"]) / 2


async def test_openai_calls_share_a_byte_identical_prefix_up_to_the_new_messages(
    cache_engine, vendor
):
    vendor.push(
        ToolCalls([("confirm", {"question": "restart the db?"})]),
        Text("Restarted."),
        Text("Nothing else."),
    )
    client = Client(cache_engine.store)
    say = {"type": "client.message", "agent_id": "gpt"}
    reply = await client.submit({**say, "message": {"role": "user", "content": "db down"}})
    sid = reply["session_id"]
    call = await wait_for_event(
        client, sid, lambda e: e["payload"]["type"] == "tool.call.dispatched"
    )
    await client.submit(
        {"type": "tool.result", "id": call["payload"]["id"], "result": "yes"}, session_id=sid
    )
    await wait_for_event(client, sid, turn_ended(reply["turn_id"]))
    again = await client.submit(
        {**say, "message": {"role": "user", "content": "more?"}}, session_id=sid
    )
    end = await wait_for_event(client, sid, turn_ended(again["turn_id"]))
    bodies = [r.raw for r in vendor.requests]
    assert len(bodies) == 3
    for earlier, later in itertools.pairwise(bodies):
        # Everything up to the end of the earlier call's messages (its body, less the
        # closing `]}`) starts the later one: model, tools, options, then the history.
        assert earlier.endswith(b"]}")
        prefix = earlier[: -len(b"]}")]
        assert later.startswith(prefix)
        assert prefix.index(b'"tools"') < prefix.index(b'"messages"')
    # OpenAI read that prefix back: 1024 tokens and more, in 128-token steps.
    usage = end["payload"]["usage"]
    assert usage["cache_read"] >= 1024 and (usage["cache_read"] - 1024) % 128 == 0
    assert usage["cache_write"] == 0


async def test_a_session_budget_lets_a_cached_second_turn_run_that_full_price_would_refuse(
    cache_engine, vendor
):
    """The pre-dispatch estimate prices the prefix the first turn left in the cache at the
    cache-read rate: the limit that stops the uncached session's second turn before its
    call lets the cached one's run (engine/machine/budgets.py, `cached_at`)."""
    client = Client(cache_engine.store)

    async def turn(agent: str, sid: str, text: str) -> dict[str, Any]:
        message = {"role": "user", "content": text}
        submit = {"type": "client.message", "agent_id": agent, "message": message}
        reply = await client.submit(submit, session_id=sid)
        end = await wait_for_event(client, sid, turn_ended(reply["turn_id"]))
        return end["payload"]

    texts = ("the db is paging, what now?", "it is back; anything else?")
    vendor.push(Text("Check the runbook for disk alerts first."), Text("Watch it for an hour."))
    first = await turn("claude_capped", "capped", texts[0])
    second = await turn("claude_capped", "capped", texts[1])
    assert first["type"] == second["type"] == "turn.completed", second
    assert len(vendor.requests) == 2
    assert second["usage"]["cache_read"] == first["usage"]["cache_write"] > 0
    # The vendor's own figures agree: both turns fit the limit.
    assert Decimal(first["cost"]) + Decimal(second["cost"]) <= Decimal("0.013")

    vendor.push(Text("Check the runbook for disk alerts first."))
    assert (await turn("claude_capped_off", "capped-off", texts[0]))["type"] == "turn.completed"
    end = await turn("claude_capped_off", "capped-off", texts[1])
    assert end["type"] == "turn.failed"
    error = end["error"]
    assert error["code"] == "budget_exceeded"
    assert error["detail"]["limit"] == "session.max_cost_usd"
    assert len(vendor.requests) == 3  # the uncached second turn's call was never sent

    # The cached second call was estimated at a fraction of the uncached one's estimate.
    events = await client.events("capped")
    estimates = [
        e["payload"]["estimate"] for e in events if e["payload"]["type"] == "llm.call.requested"
    ]
    assert "cached" not in estimates[0] and estimates[1]["cached"] > 0
    assert Decimal(estimates[1]["cost"]) < Decimal(error["detail"]["next"]) / 5
