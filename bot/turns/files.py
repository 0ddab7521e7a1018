"""A Slack message's files, made parts of the message the model reads.

Each file of a message (bot/rendering/files.py says which kind it is): a text file becomes
a text part (its name, its text, cut at the agent's `file_text_limit` with a note); an image
or a PDF is stored once for the session through the engine's client (`Client.put_file`)
and the message names it by a `link` part, which the engine resolves to the bytes at
the model call; anything else, and a file Slack would not give, is a one-line note. A
message without files stays a plain string.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from bot.rendering.files import (
    FilePlan,
    cut_text,
    files_of,
    note,
    plan_file,
    slack_hosted,
    text_block,
    titled,
)
from bot.slack.agent_app import Bot
from bot.slack.files import FileRefused, download
from bot.slack.governor import RateGovernor
from engine.client import Client

__all__ = ["FileReader"]

OFF = "this app is set not to read files (files = false)"
NOT_SLACK = "its address is not Slack's (the bot token is sent only to Slack)"


class FileReader:
    """Reads the files of one turn's messages, for one bot, into one session."""

    def __init__(
        self, client: Client, governor: RateGovernor, bot: Bot, team: str, session_id: str
    ) -> None:
        self.client = client
        self.governor = governor
        self.bot = bot
        self.team = team
        self.session_id = session_id
        self._http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> FileReader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._http is not None:
            await self._http.close()

    async def content(self, msg: Mapping[str, Any], said: str) -> str | list[dict[str, Any]]:
        """`said` (the message's text as the model reads it), with its files after it."""
        files = files_of(msg)
        if not files:
            return said
        parts: list[dict[str, Any]] = [{"type": "text", "text": said}]
        for file in files:
            parts += await self._file(plan_file(file, text_limit=self.bot.file_text_limit))
        return parts

    async def _file(self, plan: FilePlan) -> list[dict[str, Any]]:
        if not self.bot.files:
            return [_text(note(plan, OFF))]
        if plan.kind == "skip":
            return [_text(note(plan, plan.reason))]
        if not slack_hosted(plan.url, urlsplit(self.bot.web.base_url).hostname):
            return [_text(note(plan, NOT_SLACK))]
        if self._http is None:
            self._http = aiohttp.ClientSession()
        token = self.bot.web.token or ""
        try:
            data, total = await download(self._http, self.governor, self.team, token, plan)
        except FileRefused as why:
            return [_text(note(plan, str(why)))]
        if plan.kind == "text":
            text, cut = cut_text(data, total, plan.limit)
            return [_text(text_block(plan, text, cut))]
        ref = await self.client.put_file(self.session_id, data, plan.mime, plan.name)
        return [_text(f"[file {titled(plan)}]"), ref]


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}
