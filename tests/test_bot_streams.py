"""Native streaming, resuming a turn another bot began, and `channels.slack` (in process)."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bot.slack.parts import STAMP, stamp
from bot.turns.checkpoint import Checkpoint, LeaseLost
from bot.turns.follower import GAVE_UP, MAX_FAILURES
from bot.turns.routing import session_id_for
from bot.turns.store import LEGACY_TURNS, Checkpoints, checkpoint_keys
from bot.turns.turn_follower import BUSY
from engine.config import parse_project
from tests.bot_helpers import AGENT, World, serve_bots
from tests.engine_helpers import on_both_redis, poll_until, project_toml, turn_ended, wait_for_event
from tests.fakes.llm_vendor import FakeVendor, Text, ToolCalls
from tests.fakes.slack import FakeSlack, Message, SlackError
from tests.workers import TestWorker, WorkerFactory

ANSWER = "Checked **all** replicas.\n\n- `db-1` ok\n- `db-2` ok\n\nNothing to do."


def _project(vendor: FakeVendor, tmp_path: Path, slack: str, extra: str = "") -> Any:
    text = project_toml(vendor.url, retry="retry = { llm = { backoff_base_secs = 0 } }")
    text += extra + f"\n[agent.{AGENT}.slack]\n{slack}\n"
    return parse_project(text, str(tmp_path / "subs.toml"), env={})


@pytest.fixture
async def native(redis, vendor: FakeVendor, tmp_path: Path) -> AsyncIterator[World]:
    project = _project(vendor, tmp_path, 'answers = "both"\nstream = "native"')
    async with serve_bots(redis, vendor, project, AGENT) as served:
        yield served


@pytest.fixture
async def world(redis, vendor: FakeVendor, tmp_path: Path) -> AsyncIterator[World]:
    project = _project(vendor, tmp_path, 'answers = "both"')
    async with serve_bots(redis, vendor, project, AGENT) as served:
        yield served


def _replies(fake: FakeSlack, msg: Message) -> list[Message]:
    return [m for m in fake.thread(msg.channel, msg.thread_ts or msg.ts) if m.bot_id]


async def open_turns(redis) -> int:
    """How many turns have a checkpoint, over every bucket."""
    return len(await Checkpoints(redis, "probe", 1).open())


async def _mention(world: World, text: str) -> Message:
    fake = world.fake
    mention = fake.post_as_user(fake.general, fake.mention(text))
    delivered = await fake.send_event(world.url, fake.event_for(mention, kind="app_mention"))
    assert delivered.status == 200
    return mention


async def _turn_ended(world: World, mention: Message) -> None:
    sid = session_id_for(world.agent, mention.channel, mention.thread_ts or mention.ts)
    await wait_for_event(world.client, sid, turn_ended(f"slack-{mention.ts}"))


def _any_turn_ended(event: dict[str, Any]) -> bool:
    return event["payload"]["type"] in ("turn.completed", "turn.failed")


# -- native streaming -----------------------------------------------------------------


async def test_native_streaming_writes_one_message_through_the_stream_methods(
    native: World,
) -> None:
    fake = native.fake
    native.vendor.push(Text(ANSWER, chunks=8, chunk_delay=0.05))
    mention = await _mention(native, "are the replicas ok?")
    await _turn_ended(native, mention)
    await native.bots.idle()

    [reply] = _replies(fake, mention)
    assert reply.text == ANSWER and reply.stream == "stopped"
    assert reply.metadata == {
        "event_type": STAMP,
        "event_payload": {"turn_id": f"slack-{mention.ts}", "part": "reply"},
    }
    [start] = fake.calls("chat.startStream")
    assert start.args["recipient_user_id"] == fake.user.id
    assert start.args["recipient_team_id"] == fake.team.id
    assert len(fake.calls("chat.stopStream")) == 1
    assert not fake.calls("chat.update") and not fake.calls("chat.postMessage")
    visible = [v.text for v in fake.edits(reply.channel, reply.ts)]
    assert len(set(visible)) > 1 and all(ANSWER.startswith(t) for t in visible)
    assert await open_turns(native.client.store.redis) == 0


async def test_an_expired_stream_falls_back_to_editing_the_same_message(native: World) -> None:
    fake = native.fake
    native.vendor.push(Text(ANSWER, chunks=12, chunk_delay=0.1))
    mention = await _mention(native, "are the replicas ok?")
    [start] = await fake.wait_for("chat.startStream", timeout=10)
    fake.expire_stream(start.args["channel"], start.response["ts"])
    await _turn_ended(native, mention)
    await native.bots.idle()

    [reply] = _replies(fake, mention)
    assert reply.ts == start.response["ts"]
    assert [b["text"] for b in reply.blocks if b["type"] == "markdown"] == [ANSWER]
    assert any(c.error == "message_not_in_streaming_state" for c in fake.calls("chat.appendStream"))
    assert fake.calls("chat.update") and not fake.calls("chat.postMessage")
    assert reply.metadata is not None and reply.metadata["event_type"] == STAMP


async def test_a_reply_is_edited_when_no_stream_can_start_soon(native: World) -> None:
    """chat.startStream's tier (20/min per workspace) is booked by other threads: the reply
    does not wait for it, it is posted and edited."""
    fake = native.fake
    loop = asyncio.get_running_loop()
    native.bots.paced.governor.record(fake.team.id, "chat.startStream", loop.time() + 30)
    native.vendor.push(Text(ANSWER, chunks=4, chunk_delay=0.05))
    mention = await _mention(native, "are the replicas ok?")
    await _turn_ended(native, mention)
    await native.bots.idle()
    [reply] = _replies(fake, mention)
    assert [b["text"] for b in reply.blocks if b["type"] == "markdown"] == [ANSWER]
    assert not fake.calls("chat.startStream") and len(fake.calls("chat.postMessage")) == 1


# -- resuming a turn ------------------------------------------------------------------


async def test_a_native_stream_left_open_is_stopped_and_finished_by_edits(native: World) -> None:
    fake = native.fake
    native.vendor.push(Text(ANSWER, chunks=20, chunk_delay=0.1))
    mention = await _mention(native, "are the replicas ok?")
    [start] = await fake.wait_for("chat.startStream", timeout=10)
    await native.bots.aclose()  # the stream stays open; what it shows is not checkpointed

    async with native.successor() as successor:
        await _turn_ended(native, mention)
        await successor.idle()
    [reply] = _replies(fake, mention)
    assert reply.ts == start.response["ts"] and reply.stream == "stopped"
    assert [b["text"] for b in reply.blocks if b["type"] == "markdown"] == [ANSWER]
    assert reply.metadata is not None and reply.metadata["event_payload"]["part"] == "reply"
    assert len(fake.calls("chat.startStream")) == 1


@on_both_redis
async def test_a_bot_closed_mid_stream_hands_its_turn_to_the_next(world: World) -> None:
    fake = world.fake
    world.vendor.push(Text(ANSWER, chunks=20, chunk_delay=0.1))
    mention = await _mention(world, "are the replicas ok?")
    await fake.until(lambda: _replies(fake, mention) or None, timeout=10)
    await world.bots.aclose()  # mid-stream: the checkpoint stays, the lease is released
    assert await open_turns(world.client.store.redis) == 1

    async with world.successor() as successor:
        await _turn_ended(world, mention)
        await successor.idle()
    [reply] = _replies(fake, mention)
    assert [b["text"] for b in reply.blocks if b["type"] == "markdown"] == [ANSWER]
    assert len([c for c in fake.calls("chat.postMessage") if c.args.get("thread_ts")]) == 1
    assert await open_turns(world.client.store.redis) == 0


async def test_a_resumed_turn_finds_the_reply_a_dead_bot_posted_by_its_stamp(
    world: World,
) -> None:
    """The dead bot posted the reply but died before checkpointing it: no second post."""
    fake = world.fake
    world.vendor.push(Text(ANSWER))
    mention = await _mention(world, "are the replicas ok?")
    await _turn_ended(world, mention)
    await world.bots.idle()
    [reply] = _replies(fake, mention)
    posts = len(fake.calls("chat.postMessage"))

    lost = Checkpoint(
        agent=AGENT,
        team=fake.team.id,
        channel=mention.channel,
        thread_ts=mention.ts,
        turn_id=f"slack-{mention.ts}",
        user=fake.user.id,
        payload=None,
        after=0,
        cursor="0-0",
        trigger=mention.ts,
        mention={
            "event": fake.event_for(mention, kind="app_mention"),
            "bot_user": fake.bot_user,
            "bot_id": None,
        },
    )
    await world.client.store.redis.hset(checkpoint_keys(lost)[0], lost.key, lost.dumps())
    async with world.successor() as successor:
        await successor.idle()
    assert [m.ts for m in _replies(fake, mention)] == [reply.ts]
    assert len(fake.calls("chat.postMessage")) == posts
    assert fake.calls("conversations.replies")[-1].args.get("include_all_metadata")
    assert await open_turns(world.client.store.redis) == 0
    assert len(await world.turns(mention.channel, mention.ts)) == 1


# -- channels.slack -------------------------------------------------------------------

HELPER = "helper"
PAGE = {
    "type": "actions",
    "elements": [
        {
            "type": "button",
            "action_id": "page_again",
            "value": "INC-1",
            "text": {"type": "plain_text", "text": "Page again"},
        }
    ],
}
VIEW = {"type": "context", "elements": [{"type": "mrkdwn", "text": "INC-1 · sev2"}]}


async def _pager(request: dict[str, Any]) -> Any:
    trigger = request["trigger"]
    if trigger["type"] == "client.action" and trigger["name"] == "oncall":
        slack = {
            "status": "is paging the on-call…",
            "prompt": {"text": "Page again?", "blocks": [PAGE]},
            "update": {"text": "INC-1 · paging"},
            "view": [VIEW],
        }
        return {
            "messages": [{"role": "user", "content": f"/oncall {trigger['args']['text']}"}],
            "actions": [{"type": "llm.call"}],
            "channels": {"slack": slack},
        }
    return request["proposed"]


@pytest.fixture
async def pager(
    redis, vendor: FakeVendor, tmp_path: Path, test_worker: WorkerFactory
) -> AsyncIterator[tuple[World, TestWorker]]:
    worker = await test_worker(_pager)
    extra = (
        f'\n[agent.{HELPER}]\nllm = "anthropic"\nmodel = "claude-haiku-4-5"\n'
        f'system = "You page people."\nworker = "{worker.url}"\n'
    )
    text = project_toml(vendor.url) + extra
    text += f'[agent.{HELPER}.slack]\nanswers = "both"\ncommands = ["/oncall"]\n'
    project = parse_project(text, str(tmp_path / "subs.toml"), env={})
    async with serve_bots(redis, vendor, project, HELPER) as served:
        yield served, worker


async def _page(world: World) -> Message:
    """`/oncall page INC-1`: the command's root message, once posted."""
    fake = world.fake
    await fake.send_command(world.url, "/oncall", "page INC-1")
    [root] = await fake.until(
        lambda: [m for m in fake.history(fake.general.id) if m.bot_id] or None, timeout=10
    )
    return root


async def test_channels_slack_overrides_what_the_thread_shows(
    pager: tuple[World, TestWorker],
) -> None:
    world, worker = pager
    fake = world.fake
    world.vendor.push(Text("Paged Ana.", chunks=4, chunk_delay=0.1))
    root = await _page(world)
    sid = session_id_for(HELPER, root.channel, root.ts)
    await wait_for_event(world.client, sid, _any_turn_ended)
    await world.bots.idle()

    assert "is paging the on-call…" in fake.statuses(root.channel, root.ts)
    assert fake.message(root.channel, root.ts).text == "INC-1 · paging"
    thread = [m for m in fake.thread(root.channel, root.ts) if m.bot_id and m.ts != root.ts]
    prompt, reply = sorted(thread, key=lambda m: m.ts)
    assert prompt.text == "Page again?" and prompt.blocks == [PAGE]
    assert reply.blocks[-1] == VIEW
    assert [b["text"] for b in reply.blocks if b["type"] == "markdown"] == ["Paged Ana."]

    # A custom button comes back as a client.action named by its action_id.
    click = fake.block_action(prompt, "page_again")
    assert (await fake.send_action(world.url, click)).status == 200

    def clicked() -> dict[str, Any] | None:
        actions = [
            r["trigger"]
            for r in worker.requests
            if r["trigger"]["type"] == "client.action" and r["trigger"]["name"] == "page_again"
        ]
        return actions[0] if actions else None

    action = await fake.until(clicked, timeout=10)
    await world.bots.idle()
    args = action["args"]
    assert (args["value"], args["user_id"], args["channel_id"]) == (
        "INC-1",
        fake.user.id,
        root.channel,
    )
    assert args["message_ts"] == prompt.ts and args["thread_ts"] == root.ts
    # The worker kept the empty proposal: nothing to say, so nothing is posted.
    assert len([m for m in fake.thread(root.channel, root.ts) if m.bot_id]) == 3


RETRY = 0.1


async def test_a_turn_whose_followers_keep_failing_is_given_up_and_says_so(
    world: World,
) -> None:
    """Every follower fails (here Slack refuses the reply's posts): retried with backoff,
    then dropped, with a short note in the thread where the reply was going."""
    fake = world.fake
    post = fake._methods["chat.postMessage"]

    def refuse_but_the_note(ctx: Any) -> dict[str, Any]:
        if ctx.args.get("text") != GAVE_UP:
            raise SlackError("not_in_channel")
        return post.handler(ctx)

    fake._methods["chat.postMessage"] = replace(post, handler=refuse_but_the_note)
    world.vendor.default = Text("never shown")
    asked = fake.post_as_user(fake.general, fake.mention("status?"))
    message = {"role": "user", "content": "status?"}
    doomed = Checkpoint(
        agent=AGENT,
        team=fake.team.id,
        channel=asked.channel,
        thread_ts=asked.ts,
        turn_id=f"slack-{asked.ts}",
        user=fake.user.id,
        payload={"type": "client.message", "message": message},
        trigger=asked.ts,
        since=asked.ts,
    )
    await world.client.store.redis.hset(checkpoint_keys(doomed)[0], doomed.key, doomed.dumps())
    async with world.successor(lease_ms=300, retry_s=RETRY) as successor:

        async def dropped() -> bool:
            return await open_turns(world.client.store.redis) == 0

        await poll_until(dropped, timeout=15, what="the checkpoint to be given up")
        await successor.idle()
    [note] = _replies(fake, asked)
    assert note.text == GAVE_UP and note.metadata == stamp(doomed.turn_id, "given-up")
    stamps = [c for c in fake.calls("conversations.replies") if c.args.get("include_all_metadata")]
    assert len(stamps) == MAX_FAILURES  # one follower per try, each failing after its look
    gaps = [b.at - a.at for a, b in itertools.pairwise(stamps)]
    assert all(gap >= RETRY * 2**n for n, gap in enumerate(gaps))  # backing off, doubling


async def test_a_button_clicked_while_the_thread_is_busy_says_so_and_starts_nothing(
    pager: tuple[World, TestWorker],
) -> None:
    world, worker = pager
    fake = world.fake
    world.vendor.push(Text("Paged Ana.", chunks=20, chunk_delay=0.1))
    root = await _page(world)

    def prompted() -> Message | None:
        found = [m for m in fake.thread(root.channel, root.ts) if m.text == "Page again?"]
        return found[0] if found else None

    prompt = await fake.until(prompted, timeout=10)
    assert (
        await fake.send_action(world.url, fake.block_action(prompt, "page_again"))
    ).status == 200
    [busy] = await fake.until(lambda: fake.ephemerals or None, timeout=10)
    assert busy.text == BUSY and busy.user == fake.user.id
    await wait_for_event(
        world.client, session_id_for(HELPER, root.channel, root.ts), _any_turn_ended
    )
    await world.bots.idle()
    names = [r["trigger"].get("name") for r in worker.requests]
    assert "page_again" not in names
    assert await open_turns(world.client.store.redis) == 0


# -- one turn per message -------------------------------------------------------------


async def test_the_same_message_under_a_new_event_id_starts_no_second_turn(world: World) -> None:
    """An edited mention (or any redelivery with a fresh event_id) names the same message:
    one turn, one follower, one reply."""
    fake = world.fake
    world.vendor.push(Text(ANSWER, chunks=6, chunk_delay=0.05))
    mention = await _mention(world, "are the replicas ok?")
    event = fake.event_for(mention, kind="app_mention")
    again = await fake.send_event(world.url, event)  # new envelope, new event_id
    edited = await fake.send_event(world.url, {**event, "edited": {"user": fake.user.id}})
    assert again.status == edited.status == 200
    await _turn_ended(world, mention)
    await world.bots.idle()
    late = await fake.send_event(world.url, event)  # after the turn ended
    assert late.status == 200
    await world.bots.idle()
    assert len(_replies(fake, mention)) == 1
    assert len(await world.turns(mention.channel, mention.ts)) == 1
    assert await open_turns(world.client.store.redis) == 0


def _bare_checkpoint() -> Checkpoint:
    return Checkpoint(
        agent=AGENT,
        team="T1",
        channel="C1",
        thread_ts="1.000001",
        turn_id="slack-1.000001",
        user="U1",
        payload=None,
    )


async def test_checkpoint_writes_are_fenced_by_the_followers_lease(redis) -> None:
    mine, theirs = Checkpoints(redis, "mine", 60_000), Checkpoints(redis, "theirs", 60_000)
    cp = _bare_checkpoint()
    assert await mine.start(["subs:test:seen:1"], 60, cp)
    assert not await theirs.start(["subs:test:seen:2"], 60, cp)  # the turn is known
    assert await theirs.claim(cp) is None  # leased to "mine"
    await mine.release(cp)
    taken = await theirs.claim(cp)
    assert taken is not None and taken.key == cp.key
    with pytest.raises(LeaseLost):
        await mine.save(cp)  # the stalled follower writes nothing over its successor
    with pytest.raises(LeaseLost):
        await mine.drop(cp)
    await theirs.drop(taken)
    assert await theirs.claim(cp) is None  # finished: a stale copy cannot bring it back
    assert await open_turns(redis) == 0


async def test_a_resumed_command_finds_the_root_message_a_dead_bot_posted(world: World) -> None:
    """The dead bot posted the command's root message but died before checkpointing it."""
    fake = world.fake
    turn_id = "slack-cmd-T0DEAD"
    web = world.bots.bots[AGENT].web
    since = f"{time.time() - 1:.6f}"
    root = await web.chat_postMessage(
        channel=fake.general.id, text="ran `/oncall ack`", metadata=stamp(turn_id, "root")
    )
    args = {"text": "ack", "user_id": fake.user.id, "channel_id": fake.general.id}
    lost = Checkpoint(
        agent=AGENT,
        team=fake.team.id,
        channel=fake.general.id,
        thread_ts="",
        turn_id=turn_id,
        user=fake.user.id,
        payload={"type": "client.action", "name": "oncall", "args": args},
        since=since,
    )
    await world.client.store.redis.hset(checkpoint_keys(lost)[0], lost.key, lost.dumps())
    async with world.successor() as successor:
        await successor.idle()
    roots = [m for m in fake.history(fake.general.id) if m.bot_id]
    assert [m.ts for m in roots] == [root["ts"]]
    [reply] = [m for m in fake.thread(fake.general.id, root["ts"]) if m.ts != root["ts"]]
    assert reply.metadata == stamp(turn_id, "reply")
    sid = session_id_for(AGENT, fake.general.id, root["ts"])
    kinds = [e["payload"]["type"] for e in await world.client.events(sid)]
    assert kinds.count("turn.started") == 1 and "turn.completed" in kinds
    assert await open_turns(world.client.store.redis) == 0


async def test_an_unreadable_checkpoint_is_skipped_and_an_older_one_still_read(redis) -> None:
    checkpoints = Checkpoints(redis, "me", 60_000)
    cp = _bare_checkpoint()
    older = {**json.loads(cp.dumps()), "resumes": 2}  # a field an earlier bot wrote
    turns = checkpoint_keys(cp)[0]
    await redis.hset(turns, mapping={cp.key: json.dumps(older), "junk": "{not json"})
    assert [c.key for c in await checkpoints.open()] == [cp.key]


async def test_a_mention_while_the_thread_is_busy_is_queued_and_answered_next(
    world: World,
) -> None:
    fake = world.fake
    world.vendor.push(Text("First answer.", chunks=10, chunk_delay=0.1))
    world.vendor.push(Text("Second answer.", chunks=3, chunk_delay=0.05))
    first = await _mention(world, "is the db ok?")
    await fake.until(lambda: _replies(fake, first) or None, timeout=10)  # still streaming
    second = fake.post_as_user(fake.general, fake.mention("and the cache?"), thread_ts=first.ts)
    assert (
        await fake.send_event(world.url, fake.event_for(second, kind="app_mention"))
    ).status == 200
    sid = session_id_for(AGENT, first.channel, first.ts)
    await wait_for_event(world.client, sid, turn_ended(f"slack-{second.ts}"))
    await world.bots.idle()
    replies = _replies(fake, first)
    shown = [[b["text"] for b in m.blocks if b["type"] == "markdown"] for m in replies]
    assert shown == [["First answer."], ["Second answer."]]
    assert replies[1].ts > second.ts  # the second reply comes after the second question
    kinds = [e["payload"]["type"] for e in await world.client.events(sid)]
    assert kinds.count("turn.queued") == 1 and kinds.count("turn.completed") == 2


# -- tool calls in the message ----------------------------------------------------------

LOOKUP = (
    '{ name = "lookup", description = "Look a thing up", input = { type = "object", '
    'properties = { q = { type = "string" } }, required = ["q"] } }'
)


async def _lookup(request: dict[str, Any]) -> Any:
    if request["trigger"]["type"] == "tool.execute":
        return {"actions": [{"type": "tool.result", "result": {"disk": "91%"}}]}
    return request["proposed"]


@pytest.mark.parametrize("stream", ["edit", "native"])
async def test_a_tool_call_shows_in_the_reply(
    redis, vendor: FakeVendor, tmp_path: Path, test_worker: WorkerFactory, stream: str
) -> None:
    worker = await test_worker(_lookup)
    text = project_toml(vendor.url) + (
        f'\n[agent.{HELPER}]\nllm = "anthropic"\nmodel = "claude-haiku-4-5"\n'
        f'system = "You help."\nworker = "{worker.url}"\ntools = [{LOOKUP}]\n'
        f'[agent.{HELPER}.slack]\nanswers = "both"\nstream = "{stream}"\n'
    )
    project = parse_project(text, str(tmp_path / "subs.toml"), env={})
    vendor.push(ToolCalls([("lookup", {"q": "disk"})]), Text("Disk is at **91%**.", chunks=3))
    async with serve_bots(redis, vendor, project, HELPER) as world:
        fake = world.fake
        asked = fake.post_as_user(fake.general, fake.mention("how full is the disk?"))
        await fake.send_event(world.url, fake.event_for(asked, kind="app_mention"))
        sid = session_id_for(HELPER, asked.channel, asked.ts)
        await wait_for_event(world.client, sid, turn_ended(f"slack-{asked.ts}"))
        await world.bots.idle()
        [reply] = _replies(fake, asked)
    if stream == "native":
        assert reply.text == "Disk is at **91%**."
        assert [(t["title"], t["status"]) for t in reply.tasks.values()] == [("lookup", "complete")]
    else:
        [line] = [e["text"] for b in reply.blocks if b["type"] == "context" for e in b["elements"]]
        assert "lookup" in line and "disk" in line  # name, then arguments and result at the end
        assert [b["text"] for b in reply.blocks if b["type"] == "markdown"] == [
            "Disk is at **91%**."
        ]


async def test_a_checkpoint_a_bot_before_the_buckets_left_moves_to_its_bucket(redis) -> None:
    cp = _bare_checkpoint()
    await redis.hset(LEGACY_TURNS, mapping={cp.key: cp.dumps(), "junk": "{not json"})
    checkpoints = Checkpoints(redis, "me", 60_000)
    assert [c.key for c in await checkpoints.open()] == [cp.key]
    assert await redis.hget(checkpoint_keys(cp)[0], cp.key) == cp.dumps().encode()
    assert await redis.hkeys(LEGACY_TURNS) == [b"junk"]  # unreadable: left, and logged
    assert await checkpoints.claim(cp) is not None
    await checkpoints.drop(cp)
    assert [c.key for c in await checkpoints.open()] == []
