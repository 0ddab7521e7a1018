"""A reply grown through Slack's native stream (`chat.startStream` / `appendStream` /
`stopStream`), tool and subagent lines as task cards.

A stream is started only when Slack's tier (20 starts a minute per workspace) lets the
first text out within `START_WAIT`; it is left for edits (bot/slack/edits.py) when Slack
refuses it, an append fails (expired, stopped), or the text is taken back or grows past
one message. A stream's message carries no stamp until it stops: `Checkpoint.streaming`
says which message is being streamed (`STARTING` while the start is under way), so a
follower that resumes the turn can find and close it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.rendering.layout import DEFAULT_LIMIT, Rendered
from bot.rendering.turn_view import TurnView
from bot.slack.governor import Paced, RateLimited
from bot.slack.parts import ReplyState, Save, stamp
from bot.slack.webapi import call, slack_error

__all__ = ["STARTING", "STREAM_GONE", "NativeStream"]

log = logging.getLogger(__name__)

STREAM_GONE = frozenset({"message_not_in_streaming_state", "stopped_by_user", "message_not_found"})
START_WAIT = 1.0  # seconds a reply's first text may wait for a stream slot; else edits
STARTING = "starting"  # Checkpoint.streaming while chat.startStream is under way
_TASK_STATUS = {"running": "in_progress", "ok": "complete", "error": "error"}

Close = Callable[[str, dict[str, Any] | None], Awaitable[bool]]  # chat.stopStream a ts


class NativeStream:
    """The turn's message as one native stream, while `active`; `started` once it began."""

    def __init__(
        self,
        cp: ReplyState,
        view: TurnView,
        web: AsyncWebClient,
        paced: Paced,
        save: Save,
        close: Close,
        *,
        active: bool,
    ) -> None:
        self.cp = cp
        self.view = view
        self.web = web
        self.paced = paced
        self._save = save
        self._close = close
        self.active = active
        self.started = bool(cp.streaming)  # the message began as a stream (no stamp yet)
        self._sent = ""  # markdown appended to the stream so far
        self._tasks: dict[str, str] = {}  # task id -> status sent to the stream
        self._appended: asyncio.Future[None] | None = None
        self._broken = False  # the stream refused an append: edits from here on

    async def show(self) -> bool:
        """Stream the answer's growth; False when it cannot (the stream is left: edit)."""
        if self._broken:
            await self.fall_back()
            return False
        text = self.view.answer(closed=False)
        if not text.startswith(self._sent) or len(text) > DEFAULT_LIMIT:
            await self.fall_back()  # text was taken back (a retried call), or too long
            return False
        ts = self.cp.posted.get("reply")
        if ts is None:
            if not text:
                return True  # nothing to show yet; the thread status says we are working
            return await self._start(text)
        if len(text) > len(self._sent) or self._changed_tasks():
            key = (self.cp.channel, ts)
            self._appended = self.paced.submit(
                self.cp.team, "chat.appendStream", key, self._append_next
            )
            self._appended.add_done_callback(self._append_failed)
        return True

    async def stop(self, rendered: Rendered) -> bool:
        """Stop the stream with the rest of the answer; False when the final version must
        be an edit (the stream broke, or the message shows more than the streamed answer)."""
        if self._appended is not None:
            await asyncio.gather(self._appended, return_exceptions=True)
        view = self.view
        text = view.answer(closed=False)
        whole = (
            text == view.answer()  # no code fence left open
            and rendered.failed is None
            and view.footer is None  # a cost line: the final version is an edit
            and not rendered.continuations
            and not view.slack_channel.get("view")
        )
        ts = str(self.cp.posted.get("reply"))
        args: dict[str, Any] = {"channel": self.cp.channel, "ts": ts}
        chunks = self._task_chunks()
        if not self._broken and text.startswith(self._sent) and text[len(self._sent) :]:
            chunks.insert(0, {"type": "markdown_text", "text": text[len(self._sent) :]})
        if chunks:
            args["chunks"] = chunks
        args["metadata"] = stamp(self.cp.turn_id, "reply")
        stopped = await self._close(ts, args)
        return stopped and not self._broken and whole

    async def fall_back(self) -> None:
        """Leave the stream for edits, stopping it if it is still open."""
        self.active = False
        if self.cp.streaming:
            await self._close(self.cp.streaming, None)

    async def _start(self, text: str) -> bool:
        """Open the stream with the first text, or give it up for this turn when Slack's
        tier would hold the text back."""
        cp = self.cp
        governor, loop = self.paced.governor, asyncio.get_running_loop()
        slot = governor.next_slot(cp.team, "chat.startStream", loop.time())
        if slot - loop.time() > START_WAIT:
            self.active = False
            return False
        governor.record(cp.team, "chat.startStream", slot)  # booked before anything awaits
        cp.streaming = STARTING  # a resumer looks for the message if we die in the call
        await self._save()
        await asyncio.sleep(max(0.0, slot - loop.time()))
        tasks = self._task_chunks()
        args: dict[str, Any] = {
            "channel": cp.channel,
            "thread_ts": cp.thread_ts,
            "recipient_user_id": cp.user,
            "recipient_team_id": cp.team,
            "chunks": [{"type": "markdown_text", "text": text}, *tasks],
        }
        try:
            answer = await call(self.web, "chat.startStream", args)
        except (RateLimited, SlackApiError) as err:  # refused, or the tier is spent: edits
            if isinstance(err, RateLimited):
                governor.penalise(cp.team, "chat.startStream", err.retry_after, loop.time())
            log.info("slack stream not started (%s): editing instead", slack_error(err) or err)
            self.active, cp.streaming = False, ""
            return False
        self._sent, self.started = text, True
        self._sent_tasks(tasks)
        cp.posted["reply"] = cp.streaming = str(answer["ts"])
        await self._save()
        return True

    def _task_chunks(self) -> list[dict[str, Any]]:
        """task_update chunks for tool and subagent lines whose status the stream lacks."""
        return [
            {"type": "task_update", "id": key, "title": title, "status": _TASK_STATUS[state]}
            for key, title, state in self.view.tasks
            if self._tasks.get(key) != _TASK_STATUS[state]
        ]

    def _sent_tasks(self, chunks: list[dict[str, Any]]) -> None:
        """The stream took these chunks: their task statuses are shown."""
        for chunk in chunks:
            if chunk["type"] == "task_update":
                self._tasks[chunk["id"]] = chunk["status"]

    def _changed_tasks(self) -> bool:
        return any(self._tasks.get(k) != _TASK_STATUS[s] for k, _, s in self.view.tasks)

    async def _append_next(self) -> None:
        """Send what the stream lacks at the moment the pacer's slot comes (so coalesced)."""
        text = self.view.answer(closed=False)
        if self._broken or not self.cp.streaming or not text.startswith(self._sent):
            return
        args: dict[str, Any] = {"channel": self.cp.channel, "ts": self.cp.posted.get("reply")}
        chunks = self._task_chunks()
        delta = text[len(self._sent) :]
        if delta:
            chunks.insert(0, {"type": "markdown_text", "text": delta})
        if not chunks:
            return
        args["chunks"] = chunks
        await call(self.web, "chat.appendStream", args)
        self._sent = text
        self._sent_tasks(chunks)

    def _append_failed(self, done: asyncio.Future[None]) -> None:
        if not done.cancelled() and done.exception() is not None:
            self._broken = True  # expired or stopped: the next show edits the whole message
