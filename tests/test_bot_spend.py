"""Spend in the Slack thread (issue #28): a turn its budget stopped says so in one line with
the figures, and an agent that opts in (`show_cost`) shows each turn's cost under its reply.
FakeSlack -> Bolt -> the real engine (real Redis, the fake vendor)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from bot.rendering.spend import budget_stop, money, spend_line
from bot.turns.routing import session_id_for
from engine.config import parse_project
from tests.bot_helpers import AGENT, serve_bots
from tests.fakes.llm_vendor import FakeVendor, Text


def project_text(vendor_url: str, *, budget: str = "", slack: str = "") -> str:
    return textwrap.dedent(
        f"""\
        name = "spend"

        [llm.anthropic]
        type = "anthropic"
        base_url = "{vendor_url}"

        [agent.{AGENT}]
        llm = "anthropic"
        model = "claude-haiku-4-5"
        system = "You are terse."
        retry = {{ llm = {{ backoff_base_secs = 0 }} }}
        {budget}

        [agent.{AGENT}.slack]
        answers = "both"
        {slack}
        """
    )


def context_lines(blocks: list[dict]) -> list[str]:
    return [e["text"] for b in blocks if b["type"] == "context" for e in b["elements"]]


async def test_a_turn_its_budget_stopped_says_so_in_the_thread_with_the_figures(
    redis, vendor: FakeVendor, tmp_path: Path
) -> None:
    # A limit below the first call's estimate: the turn stops before any model call.
    text = project_text(vendor.url, budget="budget = { max_cost_usd = 0.000001 }")
    project = parse_project(text, str(tmp_path / "subs.toml"), env={})
    async with serve_bots(redis, vendor, project, AGENT) as world:
        fake = world.fake
        dm = fake.post_as_user(fake.dm, "what is paging?")
        await fake.send_event(world.url, fake.event_for(dm))
        reply = await world.reply_to(dm)
        events = await world.client.events(session_id_for(AGENT, fake.dm.id, dm.ts))
        [failed] = [e["payload"] for e in events if e["payload"]["type"] == "turn.failed"]
        assert failed["error"]["code"] == "budget_exceeded"
        assert vendor.requests == []  # the call the budget did not allow was not made

        line = (
            ":warning: Stopped by its budget: this turn has spent $0 of $0.000001 "
            "(max_cost_usd); the next call was not made."
        )
        assert context_lines(reply.blocks) == [line]
        assert reply.text == line  # the notification reads the same
        # ... and no cost line: the agent did not ask for one.
        assert len(context_lines(reply.blocks)) == 1


async def test_an_agent_that_opts_in_shows_each_turns_cost_under_its_reply(
    redis, vendor: FakeVendor, tmp_path: Path
) -> None:
    text = project_text(vendor.url, slack="show_cost = true")
    project = parse_project(text, str(tmp_path / "subs.toml"), env={})
    async with serve_bots(redis, vendor, project, AGENT) as world:
        fake = world.fake
        vendor.push(Text("Nothing is paging."))
        dm = fake.post_as_user(fake.dm, "what is paging?")
        await fake.send_event(world.url, fake.event_for(dm))
        reply = await world.reply_to(dm)
        events = await world.client.events(session_id_for(AGENT, fake.dm.id, dm.ts))
        [done] = [e["payload"] for e in events if e["payload"]["type"] == "turn.completed"]
        assert done["cost"] != "0"  # priced from the table: claude-haiku-4-5
        assert reply.blocks[0] == {"type": "markdown", "text": "Nothing is paging."}
        [footer] = context_lines(reply.blocks)
        assert footer == f"{money(done['cost'])} · 1 model call"
        assert footer != "$0 · 1 model call"


def test_the_budget_line_reads_each_limit_in_its_own_units() -> None:
    def error(limit: str, allowed: str, spent: str) -> dict:
        detail = {"limit": limit, "allowed": allowed, "spent": spent, "next": "1"}
        return {"code": "budget_exceeded", "message": "budget exceeded: …", "detail": detail}

    rows = [
        (error("max_model_calls", "3", "3"), "this turn has spent 3 of 3 model calls"),
        (error("max_tool_calls", "8", "8"), "this turn has spent 8 of 8 tool calls"),
        (error("max_tokens", "400000", "399120"), "this turn has spent 399,120 of 400,000 tokens"),
        (error("max_cost_usd", "0.5", "0.4987"), "this turn has spent $0.4987 of $0.5000"),
        (error("session.max_cost_usd", "5", "4.99"), "this session has spent $4.9900 of $5.0000"),
    ]
    for err, words in rows:
        line = budget_stop(err)
        assert line is not None and words in line, (err, line)
        assert f"({err['detail']['limit']})" in line
    # Any other failure, or a budget error without its figures, is not a budget line.
    assert budget_stop({"code": "provider_error", "message": "overloaded"}) is None
    assert budget_stop({"code": "budget_exceeded", "message": "budget exceeded"}) is None
    assert budget_stop({"code": "budget_exceeded", "detail": {"limit": "max_weird"}}) is None
    assert budget_stop("budget_exceeded") is None


def test_a_budget_policys_stop_names_the_policy_its_bucket_and_when_it_frees_up() -> None:
    detail = {
        "limit": "policy:per-user",
        "policy": "per-user",
        "group": "user=slack:U1",
        "dimension": "total_tokens",
        "allowed": "300",
        "spent": "1443",
        "next": "101",
        "frees_at": "2026-12-06T07:00:00.000Z",
    }
    error = {"code": "budget_exceeded", "message": "budget exceeded: …", "detail": detail}
    assert budget_stop(error) == (
        "Stopped by budget policy per-user (<@U1>): 1,443 of 300 tokens used in its "
        "window; it frees up at 2026-12-06 07:00 UTC; the next call was not made."
    )
    # A fresh bucket whose limit one call alone would cross: nothing frees up, it says so.
    alone = {**detail, "spent": "0", "next": "599", "frees_at": None}
    assert budget_stop({**error, "detail": alone}) == (
        "Stopped by budget policy per-user (<@U1>): 0 of 300 tokens used in its "
        "window; the next call alone would need about 599 tokens, more than the whole limit; "
        "the next call was not made."
    )
    # A Slack channel is its link; keys of other issuers, and other keys, as they are.
    for group, shown in [
        ("channel=C0123", "(<#C0123>)"),
        ("user=cli:bob", "(user=cli:bob)"),
        ("user=slack:U1,channel=C0123", "(<@U1>, <#C0123>)"),
        ("agent=oncall", "(agent=oncall)"),
        ("channel=D0123", "(channel=D0123)"),  # a DM has no channel link
    ]:
        line = budget_stop({**error, "detail": {**detail, "group": group}})
        assert line is not None and f"per-user {shown}:" in line, line
    dollars = {**detail, "dimension": "cost_usd", "allowed": "5", "spent": "5.02", "group": ""}
    line = budget_stop({**error, "detail": dollars})
    assert line is not None and line.startswith("Stopped by budget policy per-user: $5.0200 of")


def test_the_cost_line_names_calls_and_cache_hits_only_when_there_were_any() -> None:
    usage = {"input": 1000, "cache_read": 840, "output": 20}
    assert spend_line("0.00421", usage, 3, 2) == (
        "$0.004210 · 3 model calls · 2 tool calls · 84% cache hits"
    )
    assert spend_line("0.0123", {"input": 10, "cache_read": 0}, 1, 0) == "$0.0123 · 1 model call"
    assert spend_line("0", None, 0, 0) == "$0"


async def test_a_natively_streamed_reply_gets_its_cost_line_when_the_stream_stops(
    redis, vendor: FakeVendor, tmp_path: Path
) -> None:
    """A native stream carries only the answer: the cost line comes with the final edit."""
    text = project_text(vendor.url, slack='show_cost = true\nstream = "native"')
    project = parse_project(text, str(tmp_path / "subs.toml"), env={})
    async with serve_bots(redis, vendor, project, AGENT) as world:
        fake = world.fake
        vendor.push(Text("Nothing is paging.", chunks=4, chunk_delay=0.05))
        mention = fake.post_as_user(fake.general, fake.mention("what is paging?"))
        await fake.send_event(world.url, fake.event_for(mention, kind="app_mention"))
        reply = await world.reply_to(mention)
        assert fake.calls("chat.startStream") and fake.calls("chat.stopStream")
        events = await world.client.events(session_id_for(AGENT, fake.general.id, mention.ts))
        [done] = [e["payload"] for e in events if e["payload"]["type"] == "turn.completed"]
        final = fake.message(reply.channel, reply.ts)
        assert [b["text"] for b in final.blocks if b["type"] == "markdown"] == [
            "Nothing is paging."
        ]
        assert context_lines(final.blocks) == [f"{money(done['cost'])} · 1 model call"]
