"""A message-started turn's input: the message and those the agent missed since, as one.

A mention, a DM, an alert or a follow-up is recorded without its input (listeners answer
Slack at once); its follower builds the input here, once it holds a slot: each message as a
person reads it, `Name: text`, with its files after it (bot/turns/files.py). The names come
from each app's directory, cached for the process and shared with the listeners (who asks
which groups a prompt's approvers are in).
"""

from __future__ import annotations

from typing import Any

from bot.payloads import SlackMessage
from bot.rendering.files import files_of
from bot.rendering.message_text import attributed, message_text, poster, wanted_ids
from bot.slack.agent_app import Bot
from bot.slack.directory import Directory
from bot.slack.governor import Paced
from bot.slack.webapi import thread_messages
from bot.turns.checkpoint import Checkpoint
from bot.turns.files import FileReader
from bot.turns.routing import missed_messages
from engine.client import Client

__all__ = ["MentionInput"]


class MentionInput:
    """Builds the input of the turns a message started, for every agent's app."""

    def __init__(self, client: Client, paced: Paced) -> None:
        self.client = client
        self.paced = paced
        self._directories: dict[str, Directory] = {}

    def directory(self, bot: Bot) -> Directory:
        """The names `bot`'s token may look up, cached for this process."""
        found = self._directories.get(bot.agent)
        if found is None:
            found = self._directories[bot.agent] = Directory(bot.web, self.paced.governor)
        return found

    async def payload(self, bot: Bot, cp: Checkpoint) -> dict[str, Any]:
        """A mention, a DM, an alert or a follow-up: its message, and those the agent missed
        since (other apps' alerts included), as one input; each as a person reads it,
        `Name: text`, with its files after it (bot/turns/files.py). An alert is its thread's
        root: nothing came before it.

        Its author reaches a worker in the trigger's client context (the session's identity
        is its first asker's): `client.forwarded_props.slack.author` = `{issuer, id, name?}`.
        """
        assert cp.mention is not None
        event, bot_user, bot_id = cp.mention["event"], cp.mention["bot_user"], cp.mention["bot_id"]
        ts = event["ts"]
        missed: list[SlackMessage] = []
        if cp.thread_ts != ts:
            thread = await thread_messages(
                self.paced.governor, cp.team, bot.web, cp.channel, cp.thread_ts
            )
            missed = missed_messages(thread, ts, bot_user, bot_id)
        wanted = wanted_ids(missed) | wanted_ids([event], addressed_to=bot_user)
        names = await self.directory(bot).names(cp.team, wanted)
        messages = []
        async with FileReader(
            self.client, self.paced.governor, bot, cp.team, cp.session_id
        ) as files:
            for msg, to in [*((m, None) for m in missed), (event, bot_user)]:
                said = _said(msg, names, to)
                content = await files.content(msg, said)
                messages.append({"id": f"slack:{msg['ts']}", "role": "user", "content": content})
        author = {"issuer": "slack", "id": cp.user}  # a person's user id, or an app's bot id
        name = poster(event, names)
        if name != cp.user:
            author["name"] = name
        client = {"forwarded_props": {"slack": {"author": author}}}
        return {"type": "client.append", "messages": messages, "queue": True, "client": client}


def _said(msg: SlackMessage, names: dict[str, str], addressed_to: str | None) -> str:
    """`Name: text`; a message of only files says so rather than `(no text)`."""
    if files_of(msg) and not message_text(msg, names, addressed_to=addressed_to):
        count = len(files_of(msg))
        return f"{poster(msg, names)}: (shared {count} file{'s' if count > 1 else ''})"
    return attributed(msg, names, addressed_to=addressed_to)
