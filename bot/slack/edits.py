"""A reply grown by edits (the default, and where a native stream falls back to): posted
once it has something to show, then `chat.update`d through the workspace's pacing.

Only the first post renders at once; an interim edit renders when its paced slot comes, so
a long answer's thousands of deltas cost one render per visible update, not one per token.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any

from slack_sdk.web.async_client import AsyncWebClient

from bot.rendering.turn_view import TurnView
from bot.slack.governor import Paced
from bot.slack.parts import ReplyState
from bot.slack.webapi import call

__all__ = ["EditedMessage"]

Post = Callable[[str, dict[str, Any]], Awaitable[str]]  # post a part once; its ts


class EditedMessage:
    """The turn's message as posts and paced edits; `landed` is the latest edit sent."""

    def __init__(
        self, cp: ReplyState, view: TurnView, web: AsyncWebClient, paced: Paced, post: Post
    ) -> None:
        self.cp = cp
        self.view = view
        self.web = web
        self.paced = paced
        self._post = post
        self.shown: dict[str, Any] = {}
        self.landed: asyncio.Future[None] | None = None  # the latest chat.update

    def update(self, ts: str, content: dict[str, Any]) -> asyncio.Future[None]:
        """The latest version of message `ts`, paced and coalesced."""
        args = {"channel": self.cp.channel, "ts": ts, **content}
        send = functools.partial(call, self.web, "chat.update", args)
        return self.paced.submit(self.cp.team, "chat.update", (self.cp.channel, ts), send)

    async def show(self, content: dict[str, Any] | None = None) -> None:
        """Post the message, or edit it: to `content` (the final version), else to whatever
        the view shows when the edit's slot comes."""
        ts = self.cp.posted.get("reply")
        if ts is None:
            content = content or self._content()
            if content["blocks"] and content != self.shown:
                self.shown = content
                await self._post("reply", content)
        elif content is not None:
            if content != self.shown:
                self.shown = content
                self.landed = self.update(ts, content)
        else:
            key = (self.cp.channel, ts)
            self.landed = self.paced.submit(self.cp.team, "chat.update", key, self._edit_latest)

    def _content(self) -> dict[str, Any]:
        rendered = self.view.render()
        return {"text": rendered.text, "blocks": rendered.blocks}

    async def _edit_latest(self) -> None:
        """chat.update to the view as it is now, unless that is what Slack shows already."""
        content = self._content()
        if content["blocks"] and content != self.shown:
            args = {"channel": self.cp.channel, "ts": self.cp.posted.get("reply"), **content}
            await call(self.web, "chat.update", args)
            self.shown = content  # only once shown: a failed edit is not skipped as a repeat
