"""The fake Slack, driven by the real slack_sdk / slack_bolt clients."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from itertools import pairwise
from typing import Any
from urllib.parse import parse_qs

import aiohttp
import pytest
from aiohttp import web
from slack_bolt.async_app import AsyncApp
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_async_handlers import AsyncRateLimitErrorRetryHandler
from slack_sdk.signature import SignatureVerifier
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.socket_mode.async_client import AsyncBaseSocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient

from tests.fakes.slack import FakeSlack, Limit, alerts

APPROVAL = [
    {"type": "section", "text": {"type": "mrkdwn", "text": "*Approval needed*: deploy?"}},
    {
        "type": "actions",
        "block_id": "approval:int-1",
        "elements": [
            {
                "type": "button",
                "action_id": "approve",
                "style": "primary",
                "value": "int-1",
                "text": {"type": "plain_text", "text": "Approve"},
            }
        ],
    },
]


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as server:
        yield server


@pytest.fixture
def client(fake: FakeSlack) -> AsyncWebClient:
    return AsyncWebClient(token=fake.bot_token, base_url=fake.url)


async def slack_error(call: Awaitable[Any]) -> SlackApiError:
    with pytest.raises(SlackApiError) as info:
        await call
    return info.value


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[web.Application], Awaitable[str]]]:
    """Runs aiohttp apps on 127.0.0.1:0; returns their base url."""
    runners: list[web.AppRunner] = []

    async def start(app: web.Application) -> str:
        runner = web.AppRunner(app, shutdown_timeout=1)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    yield start
    for runner in runners:
        await runner.cleanup()


# --- Web API ---------------------------------------------------------------------------


async def test_auth_test_answers_like_slack(fake: FakeSlack, client: AsyncWebClient) -> None:
    response = await client.auth_test()
    assert response["team_id"] == fake.team.id
    assert response["user_id"] == fake.bot_user
    assert response["bot_id"] == fake.team.bot_id
    assert "chat:write" in response.headers["x-oauth-scopes"]


async def test_post_update_and_replies_show_the_thread(
    fake: FakeSlack, client: AsyncWebClient
) -> None:
    root = fake.post_as_user(fake.dm, "what is up?")
    metadata = {"event_type": "subs_turn", "event_payload": {"session": "s1"}}
    posted = await client.chat_postMessage(
        channel=fake.dm.id, thread_ts=root.ts, text="thinking", metadata=metadata
    )
    ts = posted["ts"]
    assert posted["message"]["bot_id"] == fake.team.bot_id
    await client.chat_update(channel=fake.dm.id, ts=ts, text="thinking about it")
    await client.chat_update(channel=fake.dm.id, ts=ts, text="done", blocks=APPROVAL)

    assert [m.text for m in fake.thread(fake.dm.id, root.ts)] == ["what is up?", "done"]
    assert [v.text for v in fake.edits(fake.dm.id, ts)] == [
        "thinking",
        "thinking about it",
        "done",
    ]
    assert fake.message(fake.dm.id, ts).blocks == APPROVAL

    replies = await client.conversations_replies(
        channel=fake.dm.id, ts=root.ts, include_all_metadata=True
    )
    parent, reply = replies["messages"]
    assert parent["reply_count"] == 1 and parent["thread_ts"] == root.ts
    assert reply["metadata"] == metadata  # kept across updates that did not send it
    assert reply["edited"]["user"] == fake.bot_user
    plain = await client.conversations_replies(channel=fake.dm.id, ts=root.ts)
    assert "metadata" not in plain["messages"][1]


async def test_replies_and_history_paginate(fake: FakeSlack, client: AsyncWebClient) -> None:
    root = fake.post_as_user(fake.general, "root")
    for n in range(5):
        fake.post_as_user(fake.general, f"reply {n}", thread_ts=root.ts)
    seen: list[str] = []
    cursor = None
    while True:
        page = await client.conversations_replies(
            channel=fake.general.id, ts=root.ts, limit=2, cursor=cursor
        )
        seen += [m["text"] for m in page["messages"]]
        cursor = page["response_metadata"]["next_cursor"]
        if not page["has_more"]:
            break
    assert seen == ["root", "reply 0", "reply 1", "reply 2", "reply 3", "reply 4"]
    later = fake.post_as_user(fake.general, "later")
    history = await client.conversations_history(channel=fake.general.id, limit=1)
    assert [m["ts"] for m in history["messages"]] == [later.ts]  # newest first, no replies
    assert history["has_more"] is True


async def test_streaming_shows_several_steps_then_the_final_message(
    fake: FakeSlack, client: AsyncWebClient
) -> None:
    root = fake.post_as_user(fake.dm, "write a poem")
    stream = await client.chat_stream(channel=fake.dm.id, thread_ts=root.ts, buffer_size=5)
    for word in ("Roses ", "are ", "red, ", "violets ", "blue"):
        await stream.append(markdown_text=word)
    assert stream.ts is not None
    conflict = await slack_error(client.chat_update(channel=fake.dm.id, ts=stream.ts, text="x"))
    assert conflict.response["error"] == "streaming_state_conflict"
    metadata = {"event_type": "subs_turn", "event_payload": {"turn": 1}}
    await stream.stop(blocks=APPROVAL[:1], metadata=metadata)

    steps = [v.text for v in fake.edits(fake.dm.id, stream.ts)]
    assert len(steps) > 2 and steps[-1] == "Roses are red, violets blue"
    assert all(later.startswith(earlier) for earlier, later in pairwise(steps))
    final = fake.message(fake.dm.id, stream.ts)
    assert final.thread_ts == root.ts and final.blocks == APPROVAL[:1]
    assert final.metadata == metadata
    methods = [c.method for c in fake.requests]
    assert methods[0] == "chat.startStream" and methods[-1] == "chat.stopStream"
    assert "chat.appendStream" in methods

    ended = await slack_error(
        client.chat_appendStream(channel=fake.dm.id, ts=stream.ts, markdown_text="more")
    )
    assert ended.response["error"] == "message_not_in_streaming_state"
    await client.chat_update(channel=fake.dm.id, ts=stream.ts, text="edited after the stream")


async def test_stream_expiry_stop_button_and_channel_rules(
    fake: FakeSlack, client: AsyncWebClient
) -> None:
    root = fake.post_as_user(fake.dm, "hi")
    started = await client.chat_startStream(channel=fake.dm.id, thread_ts=root.ts)
    fake.advance(301)  # Slack ends streams about 5 minutes after start
    expired = await slack_error(
        client.chat_appendStream(channel=fake.dm.id, ts=started["ts"], markdown_text="late")
    )
    assert expired.response["error"] == "message_not_in_streaming_state"

    other = await client.chat_startStream(channel=fake.dm.id, thread_ts=root.ts)
    fake.stop_stream_by_user(fake.dm.id, other["ts"])
    stopped = await slack_error(
        client.chat_appendStream(channel=fake.dm.id, ts=other["ts"], markdown_text="x")
    )
    assert stopped.response["error"] == "stopped_by_user"

    mention = fake.post_as_user(fake.general, fake.mention("hi"))
    missing = await slack_error(
        client.chat_startStream(channel=fake.general.id, thread_ts=mention.ts)
    )
    assert missing.response["error"] == "missing_recipient_user_id"
    await client.chat_startStream(
        channel=fake.general.id,
        thread_ts=mention.ts,
        recipient_user_id=fake.user.id,
        recipient_team_id=fake.team.id,
        chunks=[{"type": "task_update", "id": "t1", "title": "search", "status": "in_progress"}],
    )
    bad_chunk = await slack_error(
        client.chat_startStream(
            channel=fake.dm.id, thread_ts=root.ts, chunks=[{"type": "task_update", "id": "t"}]
        )
    )
    assert bad_chunk.response["error"] == "invalid_chunks"


def _rejections() -> list[tuple[str, Callable[[FakeSlack, AsyncWebClient], Awaitable[Any]]]]:
    def user_message(fake: FakeSlack) -> str:
        return fake.post_as_user(fake.dm, "mine").ts

    async def own(fake: FakeSlack, client: AsyncWebClient) -> str:
        return (await client.chat_postMessage(channel=fake.dm.id, text="bot"))["ts"]

    async def update_too_long(fake: FakeSlack, client: AsyncWebClient) -> Any:
        ts = await own(fake, client)
        return await client.chat_update(channel=fake.dm.id, ts=ts, text="x" * 4001)

    async def other_team_channel(fake: FakeSlack, client: AsyncWebClient) -> Any:
        elsewhere = fake.add_channel("elsewhere", team=fake.add_team("Other"))
        return await client.chat_postMessage(channel=elsewhere.id, text="hi")

    async def not_member(fake: FakeSlack, client: AsyncWebClient) -> Any:
        quiet = fake.add_channel("quiet", bot_member=False)
        return await client.chat_postMessage(channel=quiet.id, text="hi")

    section = {"type": "section", "text": {"type": "mrkdwn", "text": "y" * 3001}}
    many = [{"type": "divider"}] * 51
    long_md = [{"type": "markdown", "text": "z" * 2500} for _ in range(5)]
    return [
        ("msg_too_long", update_too_long),
        (
            "msg_too_long",
            lambda f, c: c.chat_postMessage(channel=f.dm.id, markdown_text="m" * 12_001),
        ),
        (
            "markdown_text_conflict",
            lambda f, c: c.chat_postMessage(channel=f.dm.id, text="a", markdown_text="b"),
        ),
        (
            "invalid_blocks",
            lambda f, c: c.chat_postMessage(channel=f.dm.id, text="t", blocks=[section]),
        ),
        ("invalid_blocks", lambda f, c: c.chat_postMessage(channel=f.dm.id, text="t", blocks=many)),
        (
            "msg_blocks_too_long",
            lambda f, c: c.chat_postMessage(channel=f.dm.id, text="t", blocks=long_md),
        ),
        ("no_text", lambda f, c: c.chat_postMessage(channel=f.dm.id)),
        (
            "invalid_metadata_schema",
            lambda f, c: c.chat_postMessage(channel=f.dm.id, text="a", metadata={"x": 1}),
        ),
        (
            "cant_update_message",
            lambda f, c: c.chat_update(channel=f.dm.id, ts=user_message(f), text="edit"),
        ),
        ("cant_delete_message", lambda f, c: c.chat_delete(channel=f.dm.id, ts=user_message(f))),
        ("message_not_found", lambda f, c: c.chat_update(channel=f.dm.id, ts="1.000001", text="a")),
        ("channel_not_found", lambda f, c: c.chat_postMessage(channel="C404", text="hi")),
        ("channel_not_found", other_team_channel),
        ("not_in_channel", not_member),
        ("thread_not_found", lambda f, c: c.conversations_replies(channel=f.dm.id, ts="1.000001")),
        (
            "invalid_thread_ts",
            lambda f, c: c.assistant_threads_setStatus(
                channel_id=f.dm.id, thread_ts="1.000001", status="thinking"
            ),
        ),
        ("user_not_found", lambda f, c: c.users_info(user="U404")),
        (
            "user_not_in_channel",
            lambda f, c: c.chat_postEphemeral(channel=f.dm.id, user="U404", text="psst"),
        ),
    ]


REJECTIONS = _rejections()


@pytest.mark.filterwarnings("ignore:The top-level `text` argument is missing")
@pytest.mark.parametrize(
    ("error", "call"), REJECTIONS, ids=[f"{e}-{i}" for i, (e, _) in enumerate(REJECTIONS)]
)
async def test_rejects_what_slack_rejects(
    fake: FakeSlack,
    client: AsyncWebClient,
    error: str,
    call: Callable[[FakeSlack, AsyncWebClient], Awaitable[Any]],
) -> None:
    failure = await slack_error(call(fake, client))
    assert failure.response.status_code == 200
    assert failure.response["error"] == error
    assert fake.requests[-1].error == error


async def test_long_post_is_truncated_with_a_warning(
    fake: FakeSlack, client: AsyncWebClient
) -> None:
    posted = await client.chat_postMessage(channel=fake.dm.id, text="x" * 40_001)
    assert posted["warning"] == "message_truncated"
    assert len(fake.message(fake.dm.id, posted["ts"]).text) == 40_000


async def test_tokens(fake: FakeSlack) -> None:
    bad = AsyncWebClient(token="xoxb-nope", base_url=fake.url)
    assert (await slack_error(bad.auth_test())).response["error"] == "invalid_auth"
    app_level = AsyncWebClient(token=fake.app_token, base_url=fake.url)
    refused = await slack_error(app_level.chat_postMessage(channel=fake.dm.id, text="hi"))
    assert refused.response["error"] == "not_allowed_token_type"
    bot = AsyncWebClient(token=fake.bot_token, base_url=fake.url)
    wrong = await slack_error(bot.apps_connections_open(app_token=fake.bot_token))
    assert wrong.response["error"] == "not_allowed_token_type"
    unknown = await slack_error(bot.api_call("chat.scheduleMessage", json={"channel": "x"}))
    assert unknown.response["error"] == "unknown_method"


async def test_form_json_and_query_inputs(fake: FakeSlack, client: AsyncWebClient) -> None:
    metadata = {"event_type": "t", "event_payload": {"k": "v"}}
    # form body, blocks and metadata JSON-encoded inside fields (slack_sdk's data=)
    form = await client.api_call(
        "chat.postMessage",
        data={
            "channel": fake.general.id,
            "text": "form",
            "blocks": json.dumps(APPROVAL),
            "metadata": json.dumps(metadata),
        },
    )
    posted = fake.message(fake.general.id, form["ts"])
    assert posted.blocks == APPROVAL and posted.metadata == metadata
    assert fake.requests[-1].content_type == "application/x-www-form-urlencoded"
    # query string on a POST (how slack_sdk sends reactions.add)
    await client.reactions_add(channel=fake.general.id, timestamp=form["ts"], name="eyes")
    assert fake.message(fake.general.id, form["ts"]).reactions == {"eyes": [fake.bot_user]}
    assert fake.requests[-1].content_type != "application/json"

    async with aiohttp.ClientSession() as http:
        # token as a form field, no Authorization header
        async with http.post(
            fake.url + "chat.postMessage",
            data={"token": fake.bot_token, "channel": "#general", "text": "by name"},
        ) as response:
            body = await response.json()
        assert body["ok"] and body["channel"] == fake.general.id
        # GET with everything in the query string
        async with http.get(
            fake.url + "conversations.replies",
            params={"token": fake.bot_token, "channel": fake.general.id, "ts": form["ts"]},
        ) as response:
            assert [m["text"] for m in (await response.json())["messages"]] == ["form"]
        # a JSON body cannot carry its token: Slack wants the Authorization header
        async with http.post(
            fake.url + "chat.postMessage",
            json={"token": fake.bot_token, "channel": fake.general.id, "text": "json"},
        ) as response:
            assert (await response.json())["error"] == "not_authed"
        async with http.post(
            fake.url + "chat.postMessage",
            data=b"{not json",
            headers={
                "Authorization": f"Bearer {fake.bot_token}",
                "Content-Type": "application/json",
            },
        ) as response:
            assert (await response.json())["error"] == "invalid_json"


async def test_reactions_ephemeral_status_and_lookups(
    fake: FakeSlack, client: AsyncWebClient
) -> None:
    root = fake.post_as_user(fake.dm, "hello")
    await client.reactions_add(channel=fake.dm.id, timestamp=root.ts, name="eyes")
    again = await slack_error(
        client.reactions_add(channel=fake.dm.id, timestamp=root.ts, name="eyes")
    )
    assert again.response["error"] == "already_reacted"
    await client.reactions_remove(channel=fake.dm.id, timestamp=root.ts, name="eyes")
    gone = await slack_error(
        client.reactions_remove(channel=fake.dm.id, timestamp=root.ts, name="eyes")
    )
    assert gone.response["error"] == "no_reaction"

    await client.chat_postEphemeral(channel=fake.general.id, user=fake.user.id, text="only you")
    assert [(e.user, e.text) for e in fake.ephemerals] == [(fake.user.id, "only you")]

    await client.assistant_threads_setStatus(
        channel_id=fake.dm.id, thread_ts=root.ts, status="is thinking..."
    )
    assert fake.status(fake.dm.id, root.ts) == "is thinking..."
    await client.chat_postMessage(channel=fake.dm.id, thread_ts=root.ts, text="answer")
    assert fake.status(fake.dm.id, root.ts) == ""  # a reply from the app clears it
    await client.assistant_threads_setStatus(
        channel_id=fake.dm.id, thread_ts=root.ts, status="still working"
    )
    fake.advance(121)
    assert fake.status(fake.dm.id, root.ts) == ""  # two-minute timeout
    assert fake.statuses(fake.dm.id, root.ts) == ["is thinking...", "still working"]

    person = await client.users_info(user=fake.user.id)
    assert person["user"]["name"] == "alice" and person["user"]["is_bot"] is False
    dm = await client.conversations_info(channel=fake.dm.id)
    assert dm["channel"]["is_im"] is True and dm["channel"]["user"] == fake.user.id
    general = await client.conversations_info(channel=fake.general.id)
    assert general["channel"]["name"] == "general" and general["channel"]["is_member"] is True


# --- rate limits -----------------------------------------------------------------------


async def test_429_with_retry_after_and_the_sdk_retry_handler() -> None:
    async with FakeSlack(limits={"chat.update": Limit(1, 1)}) as fake:
        client = AsyncWebClient(token=fake.bot_token, base_url=fake.url)
        ts = (await client.chat_postMessage(channel=fake.dm.id, text="a"))["ts"]
        await client.chat_update(channel=fake.dm.id, ts=ts, text="b")
        limited = await slack_error(client.chat_update(channel=fake.dm.id, ts=ts, text="c"))
        assert limited.response.status_code == 429
        assert limited.response.headers["Retry-After"] == "1"
        assert limited.response["error"] == "ratelimited"

        patient = AsyncWebClient(token=fake.bot_token, base_url=fake.url)
        patient.retry_handlers.append(AsyncRateLimitErrorRetryHandler(max_retry_count=2))
        await patient.chat_update(channel=fake.dm.id, ts=ts, text="d")
        updates = fake.calls("chat.update")
        assert [c.status for c in updates] == [200, 429, 429, 200]
        assert updates[-1].at - updates[-2].at >= 1.0  # it waited out Retry-After
        assert fake.message(fake.dm.id, ts).text == "d"


async def test_limits_are_per_workspace_method_and_channel() -> None:
    limits = {
        "chat.postMessage": Limit(1, 60, per_channel=True),
        "chat.update": Limit(1, 60),
    }
    async with FakeSlack(limits=limits) as fake:
        other_team = fake.add_team("Other")
        other_channel = fake.add_channel("random", team=other_team)
        a = AsyncWebClient(token=fake.bot_token, base_url=fake.url)
        b = AsyncWebClient(token=other_team.bot_token, base_url=fake.url)
        first = await a.chat_postMessage(channel=fake.general.id, text="1")
        second = await slack_error(a.chat_postMessage(channel=fake.general.id, text="2"))
        assert second.response.status_code == 429
        assert int(second.response.headers["Retry-After"]) == 60
        await a.chat_postMessage(channel=fake.dm.id, text="another channel")
        await b.chat_postMessage(channel=other_channel.id, text="another workspace")
        await a.chat_update(channel=fake.general.id, ts=first["ts"], text="another method")
        fake.advance(60)
        await a.chat_postMessage(channel=fake.general.id, text="after the window")


async def test_default_limits_follow_the_notes() -> None:
    async with FakeSlack(clock=lambda: 0.0) as fake:  # frozen: nothing refills by itself
        client = AsyncWebClient(token=fake.bot_token, base_url=fake.url)
        root = fake.post_as_user(fake.dm, "go")
        for _ in range(20):  # chat.startStream is Tier 2: 20 per minute
            await client.chat_startStream(channel=fake.dm.id, thread_ts=root.ts)
        over = await slack_error(client.chat_startStream(channel=fake.dm.id, thread_ts=root.ts))
        assert over.response.status_code == 429
        assert over.response.headers["Retry-After"] == "3"  # one call per 60/20 s
        for n in range(3):  # chat.postMessage: 1/s per channel, short bursts
            await client.chat_postMessage(channel=fake.general.id, text=str(n))
        burst = await slack_error(client.chat_postMessage(channel=fake.general.id, text="4"))
        assert burst.response.headers["Retry-After"] == "1"
        fake.advance(3)
        await client.chat_startStream(channel=fake.dm.id, thread_ts=root.ts)


async def test_time_scale_shrinks_every_slack_duration() -> None:
    limits = {"chat.update": Limit(1, 60)}
    async with FakeSlack(limits=limits, time_scale=0.01, clock=lambda: 0.0) as fake:
        client = AsyncWebClient(token=fake.bot_token, base_url=fake.url)
        root = fake.post_as_user(fake.dm, "go")
        ts = (await client.chat_postMessage(channel=fake.dm.id, text="a"))["ts"]
        await client.chat_update(channel=fake.dm.id, ts=ts, text="b")
        limited = await slack_error(client.chat_update(channel=fake.dm.id, ts=ts, text="c"))
        assert limited.response.headers["Retry-After"] == "1"  # whole seconds, at least 1
        stream = await client.chat_startStream(channel=fake.dm.id, thread_ts=root.ts)
        fake.advance(3.01)  # more than a minute and 5 minutes (stream lifetime), x 0.01
        await client.chat_update(channel=fake.dm.id, ts=ts, text="c")
        expired = await slack_error(
            client.chat_appendStream(channel=fake.dm.id, ts=stream["ts"], markdown_text="x")
        )
        assert expired.response["error"] == "message_not_in_streaming_state"


# --- events, commands and actions sent to the app --------------------------------------


async def test_signed_requests_verify_with_slack_sdk(
    fake: FakeSlack, serve: Callable[[web.Application], Awaitable[str]]
) -> None:
    received: list[tuple[bytes, dict[str, str]]] = []

    async def record(request: web.Request) -> web.Response:
        received.append((await request.read(), dict(request.headers)))
        return web.Response(text="")

    app = web.Application()
    app.router.add_post("/slack/events", record)
    url = await serve(app) + "/slack/events"
    verifier = SignatureVerifier(fake.signing_secret)

    msg = fake.post_as_user(fake.dm, "hello bot")
    first = await fake.send_event(url, fake.event_for(msg))
    retry = await fake.send_event(url, first.payload, retry_num=1)
    stale = await fake.send_event(url, fake.event_for(msg), ts=time.time() - 600)
    forged = await fake.send_event(url, fake.event_for(msg), signing_secret="not-the-secret")
    assert first.status == retry.status == 200
    (body, headers), (retry_body, retry_headers) = received[0], received[1]
    assert verifier.is_valid_request(body, headers)
    assert not verifier.is_valid_request(received[2][0], received[2][1])  # older than 5 min
    assert not verifier.is_valid_request(received[3][0], received[3][1])
    assert stale.status == forged.status == 200  # the receiver here does not check
    envelope = json.loads(body)
    assert envelope["type"] == "event_callback" and envelope["team_id"] == fake.team.id
    assert envelope["event"]["channel_type"] == "im" and envelope["event"]["text"] == "hello bot"
    assert json.loads(retry_body)["event_id"] == envelope["event_id"]
    assert retry_headers["X-Slack-Retry-Num"] == "1"
    assert retry_headers["X-Slack-Retry-Reason"] == "http_timeout"

    await fake.send_command(url, "/subs", "ack INC-42")
    body, headers = received[-1]
    assert verifier.is_valid_request(body, headers)
    fields = {k: v[0] for k, v in parse_qs(body.decode()).items()}
    assert fields["command"] == "/subs" and fields["text"] == "ack INC-42"
    assert fields["response_url"].startswith(fake.base)

    plain = fake.post_as_user(fake.dm, "x")  # a button can only be clicked where it is shown
    with pytest.raises(LookupError):
        fake.block_action(plain, "approve")


async def test_a_real_bolt_app_accepts_events_commands_and_actions(
    fake: FakeSlack, client: AsyncWebClient, serve: Callable[[web.Application], Awaitable[str]]
) -> None:
    app = AsyncApp(client=client, signing_secret=fake.signing_secret)
    heard: list[str] = []

    @app.event("app_mention")
    async def on_mention(event: dict[str, Any], say: Any) -> None:
        await say(text="approve?", blocks=APPROVAL, thread_ts=event["ts"])

    @app.event("message")
    async def on_message(event: dict[str, Any]) -> None:
        heard.append(event["text"])

    @app.command("/subs")
    async def on_command(ack: Any, respond: Any, command: dict[str, Any]) -> None:
        await ack()
        await respond(text=f"on it: {command['text']}")

    @app.action("approve")
    async def on_approve(ack: Any, body: dict[str, Any], client: AsyncWebClient) -> None:
        await ack()
        await client.chat_update(
            channel=body["channel"]["id"],
            ts=body["container"]["message_ts"],
            text=f"Approved by <@{body['user']['id']}>",
            blocks=[],
        )

    url = await serve(app.web_app()) + "/slack/events"

    mention = fake.post_as_user(fake.general, fake.mention("deploy"))
    delivered = await fake.send_event(url, fake.event_for(mention, kind="app_mention"))
    assert delivered.status == 200 and delivered.elapsed < 3
    await fake.wait_for("chat.postMessage")
    prompt = fake.thread(fake.general.id, mention.ts)[1]
    assert prompt.bot_id == fake.team.bot_id and prompt.text == "approve?"

    # the app's own message comes back as an event; Bolt drops it (bot ids match auth.test)
    await fake.send_event(url, fake.event_for(prompt))
    person = fake.post_as_user(fake.dm, "a person")
    await fake.send_event(url, fake.event_for(person))
    await fake.until(lambda: heard or None)
    assert heard == ["a person"]

    await fake.send_command(url, "/subs", "status")
    reply = await fake.until(lambda: fake.ephemerals[-1] if fake.ephemerals else None)
    assert reply.text == "on it: status" and reply.user == fake.user.id
    assert fake.replies_sent[-1].body["text"] == "on it: status"

    click = await fake.send_action(url, fake.block_action(prompt, "approve"))
    assert click.status == 200
    await fake.until(lambda: True if len(prompt.versions) == 2 else None)
    assert prompt.text == f"Approved by <@{fake.user.id}>" and prompt.blocks == []
    with pytest.raises(LookupError):  # the buttons are gone: nobody can click again
        fake.block_action(prompt, "approve")


# --- Socket Mode -----------------------------------------------------------------------


async def test_socket_mode_round_trip(fake: FakeSlack) -> None:
    web_client = AsyncWebClient(base_url=fake.url)
    socket = SocketModeClient(app_token=fake.app_token, web_client=web_client)
    requests: list[SocketModeRequest] = []

    async def listener(client: AsyncBaseSocketModeClient, request: SocketModeRequest) -> None:
        requests.append(request)
        await client.send_socket_mode_response(
            SocketModeResponse(envelope_id=request.envelope_id, payload={"text": "seen"})
        )

    socket.socket_mode_request_listeners.append(listener)
    try:
        await socket.connect()
        await fake.wait_socket()
        msg = fake.post_as_user(fake.dm, "over the socket")
        envelope_id = await fake.socket_send("events_api", fake.event_for(msg))
        ack = await fake.wait_ack(envelope_id)
        assert ack.payload == {"text": "seen"}
        [request] = requests
        assert request.type == "events_api" and request.accepts_response_payload is False
        assert request.payload["event"]["text"] == "over the socket"

        command_id = await fake.socket_send("slash_commands", fake.command_payload("/subs", "hi"))
        await fake.wait_ack(command_id)
        assert requests[-1].payload["command"] == "/subs"
        assert requests[-1].accepts_response_payload is True
    finally:
        await socket.close()
    assert [c.method for c in fake.requests] == ["apps.connections.open"]
    assert fake.requests[0].http_method == "POST"


async def test_socket_mode_reconnects_on_disconnect(fake: FakeSlack) -> None:
    web_client = AsyncWebClient(base_url=fake.url)
    socket = SocketModeClient(app_token=fake.app_token, web_client=web_client)
    acked: list[str] = []

    async def listener(client: AsyncBaseSocketModeClient, request: SocketModeRequest) -> None:
        acked.append(request.envelope_id)
        await client.send_socket_mode_response(SocketModeResponse(request.envelope_id))

    socket.socket_mode_request_listeners.append(listener)
    try:
        await socket.connect()
        await fake.wait_socket()
        await fake.socket_disconnect()
        # the client asks for a new URL, connects again and closes the old connection
        await fake.until(lambda: True if fake.connections == 2 and fake.open_sockets == 1 else None)
        assert len(fake.calls("apps.connections.open")) == 2
        event = fake.event_for(fake.post_as_user(fake.dm, "after the reconnect"))
        envelope_id = await fake.socket_send("events_api", event)
        await fake.wait_ack(envelope_id)
    finally:
        await socket.close()
    assert acked == [envelope_id]


async def test_waits_time_out_instead_of_hanging(fake: FakeSlack) -> None:
    with pytest.raises(TimeoutError):
        await fake.wait_for("chat.postMessage", timeout=0.05)
    with pytest.raises(TimeoutError):
        await fake.wait_ack("nope", timeout=0.05)


# --- files ------------------------------------------------------------------------------


async def test_files_download_with_the_bot_token_else_the_sign_in_page(
    fake: FakeSlack,
) -> None:
    """oncall-facts §2.2: Bearer bot token with files:read gets the bytes; anything else
    gets Slack's sign-in page, HTML with status 200 (not a 401)."""
    obj = fake.add_file("a.log", b"hello\n", "text/plain")
    url = obj["url_private_download"]
    assert url.startswith(fake.base) and obj["size"] == 6
    bearer = {"Authorization": f"Bearer {fake.bot_token}"}
    async with aiohttp.ClientSession() as http:
        async with http.get(url, headers=bearer) as got:
            assert (got.status, got.content_type, await got.read()) == (
                200,
                "text/plain",
                b"hello\n",
            )
        for headers in ({}, {"Authorization": "Bearer xoxb-wrong"}):
            async with http.get(url, headers=headers) as page:
                assert (page.status, page.content_type) == (200, "text/html")
        fake.scopes = fake.scopes.replace("files:read,", "")
        async with http.get(url, headers=bearer) as page:
            assert page.content_type == "text/html" and "Sign in" in await page.text()
    assert fake.file_state.signin_pages == 3


async def test_files_upload_v2_shares_the_file_in_the_thread(
    fake: FakeSlack, client: AsyncWebClient
) -> None:
    """slack_sdk's files_upload_v2: getUploadURLExternal, the bytes, completeUploadExternal."""
    root = fake.post_as_user(fake.general, "graph please")
    png = b"\x89PNG\r\n\x1a\n" + bytes(100)
    done = await client.files_upload_v2(
        channel=fake.general.id, thread_ts=root.ts, filename="g.png", content=png
    )
    assert done["file"]["title"] == "g.png"
    [shared] = fake.shared_files(fake.general.id, root.ts)
    assert (shared.name, shared.mimetype, shared.data) == ("g.png", "image/png", png)
    [reply] = [m for m in fake.thread(fake.general.id, root.ts) if fake.by_app(m)]
    assert reply.extra["subtype"] == "file_share" and reply.extra["files"][0]["id"] == shared.id
    unknown = await slack_error(client.files_completeUploadExternal(files=[{"id": "F0"}]))
    assert unknown.response["error"] == "file_not_found"
    fake.scopes = fake.scopes.replace("files:write,", "")
    err = await slack_error(
        client.files_upload_v2(channel=fake.general.id, filename="h.png", content=png)
    )
    assert err.response["error"] == "missing_scope"


async def test_events_for_a_new_message_are_what_slack_sends_with_channel_messages(
    fake: FakeSlack,
) -> None:
    asked = fake.post_as_user(fake.general, fake.mention("help"))
    events = fake.events_for(asked)
    assert [e["type"] for e in events] == ["message", "app_mention"]
    assert events[0]["channel_type"] == "channel" and "channel_type" not in events[1]
    assert {e["ts"] for e in events} == {asked.ts}
    ids = {fake.envelope(e)["event_id"] for e in events}
    assert len(ids) == 2  # two deliveries, each its own event_id

    alertmanager = fake.add_integration("Alertmanager", classic=True)
    alert = fake.post_as_integration(alertmanager, fake.general, alerts.ALERTMANAGER_FIRING)
    [event] = fake.events_for(alert)
    assert (event["type"], event["subtype"], event["text"]) == ("message", "bot_message", "")
    assert event["bot_id"] == alertmanager.bot_id and "user" not in event
    assert event["attachments"][0]["color"] == "a30200"

    grafana = fake.add_integration("Grafana")
    panel = fake.post_as_integration(
        grafana, fake.general, alerts.GRAFANA_PANEL_IMAGE, thread_ts=alert.ts
    )
    [event] = fake.events_for(panel)
    assert "subtype" not in event and event["bot_profile"]["name"] == "Grafana"
    assert event["thread_ts"] == alert.ts

    [dm] = fake.events_for(fake.post_as_user(fake.dm, fake.mention("hi")))
    assert (dm["type"], dm["channel_type"]) == ("message", "im")  # no app_mention in a DM
    fake.subscriptions = {"app_mention"}
    assert [e["type"] for e in fake.events_for(asked)] == ["app_mention"]

    before = fake.edit_post(alert, alerts.ALERTMANAGER_RESOLVED)
    changed = fake.changed_event(alert, before)
    assert changed["subtype"] == "message_changed" and changed["ts"] != alert.ts
    assert changed["message"]["ts"] == alert.ts and "edited" in changed["message"]
    assert "[RESOLVED]" in changed["message"]["attachments"][0]["title"]
    assert "[FIRING:2]" in changed["previous_message"]["attachments"][0]["title"]
    alert.deleted = True
    deleted = fake.deleted_event(alert)
    assert (deleted["subtype"], deleted["deleted_ts"]) == ("message_deleted", alert.ts)
