"""The TypedDicts of bot/payloads.py agree with what Slack sends: every field they declare
that a payload carries has the declared type, in the payloads the fake Slack builds (each
built from Slack's documented examples, cited in tests/fakes/slack/events.py).

mypy holds the bot's code to the TypedDicts; this holds the TypedDicts to the wire.
"""

from __future__ import annotations

import types
from collections.abc import AsyncIterator
from typing import Any, Union, get_args, get_origin, get_type_hints, is_typeddict

import pytest
from slack_sdk.web.async_client import AsyncWebClient

from bot.payloads import BlockActions, EventCallback, SlackMessage, SlashCommand
from tests.fakes.slack import FakeSlack


def mismatches(value: Any, hint: Any, where: str = "") -> list[str]:
    """Where `value` is not of type `hint` (TypedDicts walked field by field; the keys a
    TypedDict does not declare are Slack's, and not checked)."""
    if hint is Any:
        return []
    if is_typeddict(hint):
        if not isinstance(value, dict):
            return [f"{where or '.'}: {type(value).__name__}, not an object"]
        hints = get_type_hints(hint)
        return [
            bad
            for key, sub in hints.items()
            if key in value
            for bad in mismatches(value[key], sub, f"{where}.{key}")
        ]
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        fits = [mismatches(value, option, where) for option in get_args(hint)]
        return [] if any(not f for f in fits) else fits[0]
    if origin is list:
        [item] = get_args(hint)
        if not isinstance(value, list):
            return [f"{where}: {type(value).__name__}, not a list"]
        return [bad for n, v in enumerate(value) for bad in mismatches(v, item, f"{where}.{n}")]
    if origin is dict:
        return [] if isinstance(value, dict) else [f"{where}: {type(value).__name__}, not dict"]
    if hint is type(None):
        return [] if value is None else [f"{where}: {value!r}, not None"]
    ok = isinstance(value, hint) and not (hint is int and isinstance(value, bool))
    return [] if ok else [f"{where}: {type(value).__name__}, not {hint.__name__}"]


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as server:
        yield server


async def test_slacks_payloads_have_the_types_the_bot_declares(fake: FakeSlack) -> None:
    web = AsyncWebClient(token=fake.bot_token, base_url=fake.url)
    mention = fake.post_as_user(fake.general, fake.mention("deploy"))
    reply = fake.post_as_user(fake.general, "in the thread", thread_ts=mention.ts)
    button = {"type": "button", "action_id": "approve", "value": "1"}
    button["text"] = {"type": "plain_text", "text": "Approve"}
    posted = await web.chat_postMessage(
        channel=fake.general.id,
        thread_ts=mention.ts,
        text="approve?",
        blocks=[{"type": "actions", "block_id": "b1", "elements": [button]}],
    )
    [prompt] = [m for m in fake.thread(fake.general.id, mention.ts) if m.ts == posted["ts"]]
    thread = await web.conversations_replies(channel=fake.general.id, ts=mention.ts)

    payloads: list[tuple[str, Any, Any]] = [
        ("app_mention", fake.envelope(fake.event_for(mention, kind="app_mention")), EventCallback),
        ("DM", fake.envelope(fake.event_for(fake.post_as_user(fake.dm, "hi"))), EventCallback),
        ("thread reply", fake.envelope(fake.event_for(reply)), EventCallback),
        ("slash command", fake.command_payload("/subs", "status"), SlashCommand),
        ("block_actions", fake.block_action(prompt, "approve"), BlockActions),
        *(("conversations.replies", m, SlackMessage) for m in thread["messages"]),
    ]
    found = {what: bad for what, payload, hint in payloads if (bad := mismatches(payload, hint))}
    assert found == {}
    # It read what it checks: the fields the listeners rely on are there.
    assert all(
        fake.envelope(fake.event_for(mention, kind="app_mention"))["event"].get(key)
        for key in ("channel", "user", "ts", "text")
    )


def test_the_checker_sees_a_wrong_type() -> None:
    assert mismatches({"event": {"ts": 1.5}}, EventCallback) == [".event.ts: float, not str"]
    assert mismatches({"actions": [{"value": 3}]}, BlockActions) == [
        ".actions.0.value: int, not str"
    ]
    assert mismatches({"event_time": True}, EventCallback) == [".event_time: bool, not int"]
    assert mismatches({"user": {"id": "U1"}, "unknown": 1}, BlockActions) == []
