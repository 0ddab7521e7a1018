"""Who may answer a prompt and who may use the bot, through Bolt and the fake Slack with
three people: alice (asks), bob and carol (same workspace), and a Slack Connect guest.

A worker raises the interrupt (as test_bot.py's helper does); the engine records who
started the turn, the bot checks the clicker against the approvers, and the engine
enforces `expiresAt` with a durable timer.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from bot.turns.access import REFUSED, Access
from bot.turns.routing import session_id_for
from engine.config import parse_project
from tests.bot_helpers import AGENT, World, serve_bots
from tests.engine_helpers import project_toml
from tests.fakes.llm_vendor import FakeVendor, Text
from tests.fakes.slack import FakeSlack, Message
from tests.slack_serve_helpers import of_type, slack_serve
from tests.workers import TestWorker, WorkerFactory

HELPER = "helper"
OPTIONS = [
    {"label": "Approve", "value": "go", "style": "primary"},
    {"label": "Decline", "value": "stop", "style": "danger"},
]


class Asks:
    """The worker: a message with "restart" pauses for a person; `approvers` and
    `expires_in` (seconds) shape the interrupt's payload."""

    def __init__(self) -> None:
        self.approvers: list[str] | None = None
        self.expires_in: float | None = None

    async def __call__(self, request: dict[str, Any]) -> Any:
        trigger = request["trigger"]
        if trigger["type"] == "client.messages" and "restart" in str(trigger["messages"][-1]):
            metadata: dict[str, Any] = {"options": OPTIONS}
            if self.approvers is not None:
                metadata["approvers"] = self.approvers
            ask: dict[str, Any] = {"message": "Restart **prod**?", "metadata": metadata}
            if self.expires_in is not None:
                at = datetime.fromtimestamp(time.time() + self.expires_in, UTC)
                ask["expiresAt"] = at.isoformat()
            interrupt = {"type": "interrupt", "interrupt_id": "ok-1", "reason": "approval"}
            return {**request["proposed"], "actions": [{**interrupt, "payload": ask}]}
        return request["proposed"]


@pytest.fixture
async def helper(
    redis, vendor: FakeVendor, tmp_path: Path, test_worker: WorkerFactory
) -> AsyncIterator[tuple[World, TestWorker, Asks]]:
    asks = Asks()
    worker = await test_worker(asks)
    text = project_toml(vendor.url) + (
        f'\n[agent.{HELPER}]\nllm = "anthropic"\nmodel = "claude-haiku-4-5"\n'
        f'system = "You help."\nworker = "{worker.url}"\n'
        f'[agent.{HELPER}.slack]\nanswers = "both"\n'
    )
    project = parse_project(text, str(tmp_path / "subs.toml"), env={})
    async with serve_bots(redis, vendor, project, HELPER) as served:
        yield served, worker, asks


def people(fake: FakeSlack) -> tuple[Any, Any]:
    """bob and carol, of alice's workspace, in #general."""
    bob, carol = fake.add_user("bob"), fake.add_user("carol")
    fake.general.members |= {bob.id, carol.id}
    return bob, carol


async def prompt_of(world: World, text: str = "restart prod") -> tuple[Message, Message]:
    fake = world.fake
    mention = fake.post_as_user(fake.general, fake.mention(text))
    await fake.send_event(world.url, fake.event_for(mention, kind="app_mention"))
    [prompt] = await fake.until(
        lambda: [m for m in fake.thread(fake.general.id, mention.ts) if m.bot_id][:1] or None,
        timeout=10,
    )
    return mention, prompt


def approve_button(prompt: Message) -> str:
    buttons = [e for b in prompt.blocks if b["type"] == "actions" for e in b["elements"]]
    return str(buttons[0]["action_id"])


async def kinds(world: World, mention: Message) -> list[str]:
    events = await world.client.events(session_id_for(world.agent, mention.channel, mention.ts))
    return [e["payload"]["type"] for e in events]


async def ephemeral(fake: FakeSlack, n: int) -> Any:
    await fake.until(lambda: len(fake.ephemerals) >= n or None, timeout=10)
    return fake.ephemerals[n - 1]


async def test_only_the_person_who_asked_may_answer_by_default(
    helper: tuple[World, TestWorker, Asks],
) -> None:
    world, worker, _ = helper
    fake = world.fake
    bob, _carol = people(fake)
    world.vendor.push(Text("Restarted."))
    mention, prompt = await prompt_of(world)

    acked = await fake.send_action(
        world.url, fake.block_action(prompt, approve_button(prompt), user=bob)
    )
    assert acked.status == 200
    refused = await ephemeral(fake, 1)
    assert (refused.user, refused.text) == (bob.id, f"Only <@{fake.user.id}> can answer this.")
    state = await world.client.interrupts(session_id_for(HELPER, fake.general.id, mention.ts))
    assert list(state) == ["ok-1"]  # still open
    assert "session.interrupt_resumed" not in await kinds(world, mention)
    assert not [r for r in worker.requests if r["trigger"]["type"] == "interrupt.resumed"]
    assert fake.message(fake.general.id, prompt.ts).blocks == prompt.blocks  # untouched

    await fake.send_action(world.url, fake.block_action(prompt, approve_button(prompt)))
    reply = await world.reply_to(mention, nth=2)
    assert reply.text == "Restarted."
    assert f"Approved by <@{fake.user.id}>" in fake.message(fake.general.id, prompt.ts).text
    assert (await kinds(world, mention)).count("session.interrupt_resumed") == 1


async def test_a_worker_may_name_a_user_group_and_then_only_its_members_answer(
    helper: tuple[World, TestWorker, Asks],
) -> None:
    world, worker, asks = helper
    fake = world.fake
    bob, carol = people(fake)
    group = fake.add_usergroup("oncall-leads", [carol])
    asks.approvers = [group]  # replaces the default (alice)
    world.vendor.push(Text("Restarted."))
    mention, prompt = await prompt_of(world)

    for who in (fake.user, bob):  # the asker and a colleague: neither is in the group
        await fake.send_action(
            world.url, fake.block_action(prompt, approve_button(prompt), user=who)
        )
    await ephemeral(fake, 2)
    assert {(e.user, e.text) for e in fake.ephemerals} == {
        (u.id, f"Only <!subteam^{group}> can answer this.") for u in (fake.user, bob)
    }
    assert "session.interrupt_resumed" not in await kinds(world, mention)

    await fake.send_action(world.url, fake.block_action(prompt, approve_button(prompt), user=carol))
    await world.reply_to(mention, nth=2)
    assert f"Approved by <@{carol.id}>" in fake.message(fake.general.id, prompt.ts).text
    [resumed] = [r for r in worker.requests if r["trigger"]["type"] == "interrupt.resumed"]
    assert resumed["trigger"]["payload"]["responder"]["user"] == carol.id
    # one usergroups.users.list per group and workspace while cached
    assert len(fake.calls("usergroups.users.list")) == 1


async def test_configured_approvers_replace_the_asker(
    helper: tuple[World, TestWorker, Asks],
) -> None:
    world, _worker, _ = helper
    fake = world.fake
    bob, _carol = people(fake)
    # What `approvers = ["<bob>"]` on [agent.helper] gives the bot (start_bots' mapping is
    # checked below); set here because the fake mints bob's id after the file is read.
    world.bots.listeners.approvers[HELPER] = (bob.id,)
    world.vendor.push(Text("Restarted."))
    mention, prompt = await prompt_of(world)
    await fake.send_action(world.url, fake.block_action(prompt, approve_button(prompt)))
    refused = await ephemeral(fake, 1)
    assert (refused.user, refused.text) == (fake.user.id, f"Only <@{bob.id}> can answer this.")
    await fake.send_action(world.url, fake.block_action(prompt, approve_button(prompt), user=bob))
    await world.reply_to(mention, nth=2)


async def test_an_expired_prompt_is_resolved_by_the_engine_rewritten_and_refused_later(
    helper: tuple[World, TestWorker, Asks],
) -> None:
    world, worker, asks = helper
    fake = world.fake
    asks.expires_in = 1.0
    world.vendor.push(Text("Not restarted, then."))
    mention, prompt = await prompt_of(world)
    assert any(str(b.get("block_id", "")).startswith("subs_expiry") for b in prompt.blocks)
    late = fake.block_action(prompt, approve_button(prompt))  # a click sent after expiry

    def rewritten() -> Message | None:
        shown = fake.message(fake.general.id, prompt.ts)
        return shown if "Expired" in shown.text else None

    expired = await fake.until(rewritten, timeout=10)  # the engine's timer, ~1 s
    assert not [b for b in expired.blocks if b["type"] == "actions"]
    events = await world.client.events(session_id_for(HELPER, fake.general.id, mention.ts))
    [done] = [e["payload"] for e in events if e["payload"]["type"] == "session.interrupt_resumed"]
    assert done["expired"] is True
    await world.reply_to(mention, nth=2)  # the turn went on: the worker was asked first
    [resumed] = [r for r in worker.requests if r["trigger"]["type"] == "interrupt.resumed"]
    assert resumed["trigger"]["payload"] == {"status": "cancelled", "reason": "expired"}

    await fake.send_action(world.url, late)
    refused = await ephemeral(fake, 1)
    assert refused.text == "This prompt was already answered, or it expired."
    assert (await kinds(world, mention)).count("session.interrupt_resumed") == 1


# -- who may use the bot -----------------------------------------------------------------------


@pytest.fixture
async def world(redis, vendor: FakeVendor, tmp_path: Path) -> AsyncIterator[World]:
    text = project_toml(vendor.url) + f'\n[agent.{AGENT}.slack]\nanswers = "both"\n'
    project = parse_project(text, str(tmp_path / "subs.toml"), env={})
    async with serve_bots(redis, vendor, project, AGENT) as served:
        yield served


async def no_turn_for(world: World, msg: Message, user: Any, reason: str, n: int) -> None:
    """`msg` by `user` started nothing: an ephemeral refusal, no session, no model call."""
    fake = world.fake
    delivered = await fake.send_event(world.url, fake.event_for(msg, kind="app_mention"))
    assert delivered.status == 200
    refused = await ephemeral(fake, n)
    assert (refused.user, refused.text) == (user.id, REFUSED[reason])
    await world.bots.idle()
    assert await world.client.sessions() == []
    assert world.vendor.requests == []


async def test_a_slack_connect_guest_gets_a_polite_refusal_and_no_turn(world: World) -> None:
    fake = world.fake
    guest = fake.add_external_user("gina")
    shared = fake.add_channel("shared-incident", members=[fake.user, guest])
    msg = fake.post_as_user(shared, fake.mention("restart prod"), user=guest)
    assert fake.event_for(msg, kind="app_mention")["user_team"] != fake.team.id
    await no_turn_for(world, msg, guest, "external", 1)

    world.vendor.push(Text("Hello alice."))  # the host's own people still get answers
    mine = fake.post_as_user(shared, fake.mention("hi"))
    await fake.send_event(world.url, fake.event_for(mine, kind="app_mention"))
    assert (await world.reply_to(mine)).text == "Hello alice."


async def test_a_refusal_is_told_once_when_slack_retries_the_event(world: World) -> None:
    """Slack retries an event it thinks was not acknowledged (same event_id, with
    `X-Slack-Retry-Num`: https://api.slack.com/apis/events-api#retries), and a mention in a
    channel also arrives as a `message`: the guest is told (and counted) once."""
    fake = world.fake
    guest = fake.add_external_user("gina")
    shared = fake.add_channel("shared-incident", members=[fake.user, guest])
    msg = fake.post_as_user(shared, fake.mention("restart prod"), user=guest)
    first = await fake.send_event(world.url, fake.event_for(msg, kind="app_mention"))
    assert (await ephemeral(fake, 1)).text == REFUSED["external"]
    retry = await fake.send_event(world.url, first.payload, retry_num=1)
    again = await fake.send_event(world.url, fake.event_for(msg, kind="message"))
    assert first.status == retry.status == again.status == 200
    later = fake.post_as_user(shared, fake.mention("and now?"), user=guest)
    await fake.send_event(world.url, fake.event_for(later, kind="app_mention"))
    await ephemeral(fake, 2)  # the next message is refused: the ones before were handled
    await world.bots.idle()
    assert [e.text for e in fake.ephemerals] == [REFUSED["external"]] * 2
    assert world.vendor.requests == []


@pytest.mark.parametrize("refused_by", ["users", "channels", "teams"])
async def test_allow_lists_refuse_users_channels_and_teams(world: World, refused_by: str) -> None:
    fake = world.fake
    bob, _carol = people(fake)
    other = fake.add_channel("random")
    allow = {
        "users": Access(users=(fake.user.id,)),
        "channels": Access(channels=(other.id,)),
        "teams": Access(teams=("T0OTHER",)),
    }[refused_by]
    world.bots.listeners.access[AGENT] = allow  # what `allow = {…}` maps to (checked below)
    msg = fake.post_as_user(fake.general, fake.mention("restart prod"), user=bob)
    reason = {"users": "user", "channels": "channel", "teams": "team"}[refused_by]
    await no_turn_for(world, msg, bob, reason, 1)


async def test_start_bots_maps_the_slack_block_and_approvers(
    redis, vendor: FakeVendor, tmp_path: Path
) -> None:
    text = project_toml(vendor.url).replace(
        f"[agent.{AGENT}]", f'[agent.{AGENT}]\napprovers = ["U0BOB", "S0LEADS"]'
    ) + (
        f'\n[agent.{AGENT}.slack]\nanswers = "both"\nexternal = true\n'
        'allow = { teams = ["T0A"], channels = ["C0A", "C0B"], users = ["U0A"] }\n'
    )
    project = parse_project(text, str(tmp_path / "subs.toml"), env={})
    async with serve_bots(redis, vendor, project, AGENT) as served:
        listeners = served.bots.listeners
        assert listeners.access[AGENT] == Access(("T0A",), ("C0A", "C0B"), ("U0A",), True)
        assert listeners.approvers[AGENT] == ("U0BOB", "S0LEADS")


# -- expiry across a SIGKILL of `subs serve` ----------------------------------------------------


async def test_a_prompt_expires_even_when_the_engine_is_killed_in_between(
    tmp_path: Path, redis_url: str, vendor: FakeVendor, test_worker: WorkerFactory
) -> None:
    """The expiry timer is committed with the interrupt: a `subs serve` SIGKILLed while
    the prompt is open, started again, still resolves it as expired, and the new process's
    bot rewrites the prompt; a click after that is refused."""
    asks = Asks()
    asks.expires_in = 5.0  # room for a slow start on a loaded machine: killed before it
    worker = await test_worker(asks)
    vendor.push(Text("Not restarted, then."))
    async with slack_serve(tmp_path, redis_url, vendor.url, agent=HELPER, worker=worker.url) as app:
        fake = app.fake
        mention = fake.post_as_user(fake.general, fake.mention("restart prod"))
        assert (await app.send_event(fake.event_for(mention, kind="app_mention"))).status == 200
        prompt = await fake.until(lambda: app.bot_messages(mention)[:1] or None, timeout=20)
        [prompt] = prompt
        late = fake.block_action(prompt, approve_button(prompt))
        await app.kill()
        assert "session.interrupt_resumed" not in [
            e["payload"]["type"] for e in await app.events(mention)
        ]
        app.env["SUBS_LOG"] = "INFO"  # the new process logs every record (the refusal below)
        await app.restart()

        def rewritten() -> Message | None:
            shown = fake.message(fake.general.id, prompt.ts)
            return shown if "Expired" in shown.text else None

        await fake.until(rewritten, timeout=30)
        log = await app.turns_ended(mention, timeout=30)
        [done] = of_type(log, "session.interrupt_resumed")
        assert done["expired"] is True
        assert (await app.send_action(late)).status == 200
        refused = await ephemeral(fake, 1)
        assert refused.text == "This prompt was already answered, or it expired."
        assert len(of_type(await app.events(mention), "session.interrupt_resumed")) == 1

        # The serve process counts a refused guest in /metrics, and logs no message text.
        guest = fake.add_external_user("gina")
        fake.general.members.add(guest.id)
        said = fake.post_as_user(fake.general, fake.mention("secret plans 7c1f"), user=guest)
        assert (await app.send_event(fake.event_for(said, kind="app_mention"))).status == 200
        assert (await ephemeral(fake, 2)).text == REFUSED["external"]
        assert app.serve is not None
        async with httpx.AsyncClient(base_url=app.serve.api) as http:
            metrics = (await http.get("/metrics")).text
        line = f'subs_slack_refusals_total{{agent="{HELPER}",reason="external"}} 1'
        assert line in metrics.splitlines()
        await fake.until(lambda: f"refused {guest.id}" in "".join(app.stderr) or None, timeout=10)
        assert "secret plans" not in "".join(app.stderr)


async def test_a_guests_follow_up_in_an_answered_thread_starts_nothing_and_says_nothing(
    world: World,
) -> None:
    fake = world.fake
    guest = fake.add_external_user("gina")
    fake.general.members.add(guest.id)
    world.vendor.push(Text("Hello alice."))
    mention = fake.post_as_user(fake.general, fake.mention("hi"))
    await fake.send_event(world.url, fake.event_for(mention, kind="app_mention"))
    await world.reply_to(mention)
    aside = fake.post_as_user(fake.general, "what does it say?", user=guest, thread_ts=mention.ts)
    assert (await fake.send_event(world.url, fake.event_for(aside))).status == 200
    await world.bots.idle()
    assert len(await world.turns(fake.general.id, mention.ts)) == 1
    assert len(world.vendor.requests) == 1 and fake.ephemerals == []
