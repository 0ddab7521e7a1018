"""One turn's reply in its Slack thread: the message that grows while the turn runs, its
continuations and prompts, each posted exactly once.

SPEC §14: one turn is one message, streamed as it is written, either by edits (post, then
paced `chat.update`: bot/slack/edits.py) or through Slack's native stream
(bot/slack/streams.py), falling back to edits when Slack refuses the stream or it expires.
Every post is one stamped part (bot/slack/parts.py), so a bot that resumes a dead one's turn
finds what already landed (`adopt_stamps`) and posts only the rest.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.rendering.layout import Rendered
from bot.rendering.turn_view import TurnView
from bot.slack.edits import EditedMessage
from bot.slack.governor import Paced
from bot.slack.parts import ReplyState, Save, stamp, stamped_parts
from bot.slack.streams import STARTING, STREAM_GONE, NativeStream
from bot.slack.webapi import governed, slack_error, thread_messages

__all__ = ["Reply"]

log = logging.getLogger(__name__)


class Reply:
    """Posts one turn's parts and grows its message, streamed while it can be, else edited;
    `cp.posted` records what landed."""

    def __init__(
        self,
        cp: ReplyState,
        view: TurnView,
        web: AsyncWebClient,
        paced: Paced,
        save: Save,
        *,
        native: bool = False,
    ) -> None:
        self.cp = cp
        self.view = view
        self.web = web
        self.paced = paced
        self._save = save
        self.edits = EditedMessage(cp, view, web, paced, self.post)
        # Resumed with the message posted: what it shows is unknown, so it is edited whole.
        active = native and "reply" not in cp.posted
        self.stream = NativeStream(cp, view, web, paced, save, self.close_stream, active=active)
        self._updated: set[int] = set()  # channels.slack updates applied

    @property
    def ts(self) -> str | None:
        return self.cp.posted.get("reply")

    async def adopt_stamps(self) -> None:
        """Learn the parts a dead follower posted after its last checkpoint.

        A native stream carries no stamp until it stops: one a follower was starting when it
        died is this app's first unstamped message in the thread since the turn began."""
        cp = self.cp
        messages = await thread_messages(
            self.paced.governor,
            cp.team,
            self.web,
            cp.channel,
            cp.thread_ts,
            include_all_metadata=True,
            **({"oldest": cp.since} if cp.since else {}),
        )
        found = stamped_parts(messages, cp.turn_id)
        if cp.streaming == STARTING:
            cp.streaming = next(
                (
                    str(m["ts"])
                    for m in messages
                    if m.get("bot_id") == cp.bot_id
                    and not m.get("metadata")
                    and m.get("ts", "") > cp.since
                ),
                "",
            )
            if cp.streaming:
                found.setdefault("reply", cp.streaming)
        cp.posted = {**found, **cp.posted}
        self.stream.active = self.stream.active and "reply" not in cp.posted
        await self._save()

    async def close_stale_stream(self) -> None:
        """A resumed turn's native stream: stop it (its text is unknown), then edit it whole."""
        if not self.cp.streaming:
            return
        await self.close_stream(self.cp.streaming)
        self.stream.active, self.stream.started = False, True

    # -- posting ------------------------------------------------------------------------

    async def post(self, part: str, content: dict[str, Any], *, thread: bool = True) -> str:
        """Post `part` into the thread (or, not `thread`, into the channel) unless it landed
        already; its ts either way. The lease is checked first: a follower that lost the turn
        posts nothing."""
        cp = self.cp
        if part in cp.posted:
            return cp.posted[part]
        await self._save()
        args = {"channel": cp.channel, **content, "metadata": stamp(cp.turn_id, part)}
        if thread:
            args["thread_ts"] = cp.thread_ts
        answer = await self._call("chat.postMessage", args)
        cp.posted[part] = str(answer["ts"])
        await self._save()
        return cp.posted[part]

    async def post_unless(
        self, part: str, content: dict[str, Any], unless: asyncio.Future[Any]
    ) -> bool:
        """`post`, taking only a chat.postMessage slot free now (it never queues ahead of
        other posts), and not once `unless` is done; whether it was posted."""
        cp = self.cp
        if part in cp.posted:
            return True
        await self._save()
        args = {"channel": cp.channel, "thread_ts": cp.thread_ts, **content}
        args["metadata"] = stamp(cp.turn_id, part)
        answer = await governed(
            self.paced.governor, cp.team, self.web, "chat.postMessage", args, unless=unless
        )
        if answer is None:
            return False
        cp.posted[part] = str(answer["ts"])
        await self._save()
        return True

    async def show_channel(self) -> None:
        """What `channels.slack` asked for: prompts posted once, rewrites of other messages
        (the thread's root when no `ts` is named)."""
        for seq, content in self.view.slack_prompts:
            await self.post(f"channel-{seq}", content)
        for seq, ts, content in self.view.slack_updates:
            if seq not in self._updated:
                self._updated.add(seq)
                self.edits.update(ts or self.cp.thread_ts, content)

    async def give_up(self, text: str) -> None:
        """The turn will not be finished: close a stream left open, and say so in the thread
        (or, for a command whose root never landed, to the person who ran it)."""
        if self.cp.streaming and self.cp.streaming != STARTING:
            await self.close_stream(self.cp.streaming)
        if self.cp.thread_ts:
            await self.post("given-up", {"text": text})
        else:
            args = {"channel": self.cp.channel, "user": self.cp.user, "text": text}
            await self._call("chat.postEphemeral", args)

    # -- the growing message --------------------------------------------------------------

    async def show(self) -> None:
        """Bring the message up to the view, as an interim version that may be coalesced away."""
        if self.stream.active and await self.stream.show():
            return
        await self.edits.show()

    async def finish(self, rendered: Rendered) -> None:
        """Land the final version, then the continuations; returns once all are in Slack."""
        if self.cp.quiet and self.ts is None and self._silent(rendered):
            return
        content: dict[str, Any] = {"text": rendered.text, "blocks": rendered.blocks}
        if self.stream.active and self.cp.streaming and await self.stream.stop(rendered):
            content = {}  # the stream's final message is the whole reply
        if content:
            if self.stream.started:  # a stream fell back to edits: stamp the message it left
                content["metadata"] = stamp(self.cp.turn_id, "reply")
            await self.edits.show(content)
        if self.edits.landed is not None:
            await self.edits.landed  # the final version, or a newer one of the same key
        for n, more in enumerate(rendered.continuations, 1):
            await self.post(f"more-{n}", {"markdown_text": more})

    def _silent(self, rendered: Rendered) -> bool:
        view = self.view
        shown = view.answer() or view.tasks or view.slack_channel.get("view")
        return not shown and rendered.failed is None

    async def close_stream(self, ts: str, args: dict[str, Any] | None = None) -> bool:
        """chat.stopStream; True when it stopped now, False when Slack had ended it already.

        Raises:
            SlackApiError: any other refusal; the stream may still be open, so it stays in
                the checkpoint for the next follower to close.
        """
        try:
            await self._call("chat.stopStream", args or {"channel": self.cp.channel, "ts": ts})
            stopped = True
        except SlackApiError as err:
            if slack_error(err) not in STREAM_GONE:
                raise
            log.info("slack stream %s was over already: %s", ts, slack_error(err))
            stopped = False
        self.cp.streaming = ""
        await self._save()
        return stopped

    async def _call(self, method: str, args: dict[str, Any]) -> Any:
        return await governed(self.paced.governor, self.cp.team, self.web, method, args)
