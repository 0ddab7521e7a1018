"""One turn's reply in its Slack thread: the message that grows while the turn runs, its
continuations and prompts, each posted exactly once.

SPEC §14: one turn is one message, streamed as it is written, either by edits (post, then
paced `chat.update`) or through Slack's native stream (`chat.startStream` / `appendStream` /
`stopStream`), falling back to edits when Slack refuses the stream or it expires. Every post
is one *part* of the reply (`reply`, `more-<n>`, `prompt-<id>`) and carries message metadata
naming the turn and the part, so a bot that resumes a dead one's turn finds what already
landed (`adopt_stamps`) and posts only the rest.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.rendering.layout import DEFAULT_LIMIT, Rendered
from bot.rendering.turn_view import TurnView
from bot.slack.governor import Paced, RateLimited
from bot.slack.webapi import call, governed, slack_error, thread_messages

__all__ = ["STAMP", "Reply", "ReplyState", "stamp", "stamped_parts"]

log = logging.getLogger(__name__)

STAMP = "subs_turn"  # message metadata event_type on every message the bot posts for a turn
STREAM_GONE = frozenset({"message_not_in_streaming_state", "stopped_by_user", "message_not_found"})
START_WAIT = 1.0  # seconds a reply's first text may wait for a stream slot; else edits
STARTING = "starting"  # Checkpoint.streaming while chat.startStream is under way
_TASK_STATUS = {"running": "in_progress", "ok": "complete", "error": "error"}


class ReplyState(Protocol):
    """Where a reply goes and what of it landed: the turn's checkpoint (bot/turns/), which
    this layer writes through and never builds."""

    team: str
    channel: str
    thread_ts: str
    turn_id: str
    user: str
    since: str  # ts the turn began at: its messages in the thread come after it
    bot_id: str  # this app's bot id, to know its own unstamped messages
    quiet: bool  # no "No reply." message when there is nothing to say
    posted: dict[str, str]  # reply part -> message ts
    streaming: str  # ts of a native stream not known to be stopped


Save = Callable[[], Awaitable[None]]  # make what `ReplyState` holds durable


def stamp(turn_id: str, part: str) -> dict[str, Any]:
    return {"event_type": STAMP, "event_payload": {"turn_id": turn_id, "part": part}}


def stamped_parts(messages: list[dict[str, Any]], turn_id: str) -> dict[str, str]:
    """`part -> ts` of the thread's messages stamped for `turn_id`."""
    parts: dict[str, str] = {}
    for msg in messages:
        meta = msg.get("metadata") or {}
        payload = meta.get("event_payload") or {}
        if meta.get("event_type") == STAMP and payload.get("turn_id") == turn_id:
            parts.setdefault(str(payload.get("part")), str(msg["ts"]))
    return parts


class Reply:
    """Posts, edits and streams one turn's message; `cp.posted` records what landed."""

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
        self.native = native and "reply" not in cp.posted  # resumed: what it shows is unknown
        self.shown: dict[str, Any] = {}
        self.landed: asyncio.Future[None] | None = None  # the latest chat.update
        self._sent = ""  # markdown appended to the native stream so far
        self._tasks: dict[str, str] = {}  # task id -> status sent to the native stream
        self._appended: asyncio.Future[None] | None = None
        self._broken = False  # the native stream refused an append: edits from here on
        self._streamed = bool(cp.streaming)  # the message began as a stream (no stamp yet)
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
        self.native = self.native and "reply" not in cp.posted
        await self._save()

    async def close_stale_stream(self) -> None:
        """A resumed turn's native stream: stop it (its text is unknown), then edit it whole."""
        if not self.cp.streaming:
            return
        await self._close_stream(self.cp.streaming)
        self.native, self._streamed = False, True

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

    def update(self, ts: str, content: dict[str, Any]) -> asyncio.Future[None]:
        """The latest version of message `ts`, paced and coalesced."""
        args = {"channel": self.cp.channel, "ts": ts, **content}
        send = functools.partial(call, self.web, "chat.update", args)
        return self.paced.submit(self.cp.team, "chat.update", (self.cp.channel, ts), send)

    async def show_channel(self) -> None:
        """What `channels.slack` asked for: prompts posted once, rewrites of other messages
        (the thread's root when no `ts` is named)."""
        for seq, content in self.view.slack_prompts:
            await self.post(f"channel-{seq}", content)
        for seq, ts, content in self.view.slack_updates:
            if seq not in self._updated:
                self._updated.add(seq)
                self.update(ts or self.cp.thread_ts, content)

    async def give_up(self, text: str) -> None:
        """The turn will not be finished: close a stream left open, and say so in the thread
        (or, for a command whose root never landed, to the person who ran it)."""
        if self.cp.streaming and self.cp.streaming != STARTING:
            await self._close_stream(self.cp.streaming)
        if self.cp.thread_ts:
            await self.post("given-up", {"text": text})
        else:
            args = {"channel": self.cp.channel, "user": self.cp.user, "text": text}
            await self._call("chat.postEphemeral", args)

    # -- the growing message --------------------------------------------------------------

    async def show(self) -> None:
        """Bring the message up to the view, as an interim version that may be coalesced away.

        Only the first post renders now; an edit renders when its paced slot comes, so a
        long answer's thousands of deltas cost one render per visible update, not per token."""
        if self.native and self._broken:
            await self._fall_back()
        if self.native and await self._stream():
            return
        await self._edit()

    async def finish(self, rendered: Rendered) -> None:
        """Land the final version, then the continuations; returns once all are in Slack."""
        if self.cp.quiet and self.ts is None and self._silent(rendered):
            return
        content: dict[str, Any] = {"text": rendered.text, "blocks": rendered.blocks}
        if self.native and self.cp.streaming and await self._stop(rendered):
            content = {}  # the stream's final message is the whole reply
        if content:
            if self._streamed:  # a stream fell back to edits: stamp the message it left
                content["metadata"] = stamp(self.cp.turn_id, "reply")
            await self._edit(content)
        if self.landed is not None:
            await self.landed  # the final version, or a newer one of the same key
        for n, more in enumerate(rendered.continuations, 1):
            await self.post(f"more-{n}", {"markdown_text": more})

    def _silent(self, rendered: Rendered) -> bool:
        view = self.view
        shown = view.answer() or view.tasks or view.slack_channel.get("view")
        return not shown and rendered.failed is None

    async def _edit(self, content: dict[str, Any] | None = None) -> None:
        """Post the message, or edit it: to `content` (the final version), else to whatever
        the view shows when the edit's slot comes."""
        if self.ts is None:
            content = content or self._content()
            if content["blocks"] and content != self.shown:
                self.shown = content
                await self.post("reply", content)
        elif content is not None:
            if content != self.shown:
                self.shown = content
                self.landed = self.update(self.ts, content)
        else:
            key = (self.cp.channel, self.ts)
            self.landed = self.paced.submit(self.cp.team, "chat.update", key, self._edit_latest)

    def _content(self) -> dict[str, Any]:
        rendered = self.view.render()
        return {"text": rendered.text, "blocks": rendered.blocks}

    async def _edit_latest(self) -> None:
        """chat.update to the view as it is now, unless that is what Slack shows already."""
        content = self._content()
        if content["blocks"] and content != self.shown:
            args = {"channel": self.cp.channel, "ts": self.ts, **content}
            await call(self.web, "chat.update", args)
            self.shown = content  # only once shown: a failed edit is not skipped as a repeat

    # -- native streaming -----------------------------------------------------------------

    async def _stream(self) -> bool:
        """Stream the answer's growth; False when it cannot (the caller edits instead)."""
        text = self.view.answer(closed=False)
        if not text.startswith(self._sent) or len(text) > DEFAULT_LIMIT:
            await self._fall_back()  # text was taken back (a retried call), or too long
            return False
        if self.ts is None:
            if not text:
                return True  # nothing to show yet; the thread status says we are working
            return await self._start(text)
        if len(text) > len(self._sent) or self._changed_tasks():
            self._appended = self.paced.submit(
                self.cp.team, "chat.appendStream", (self.cp.channel, self.ts), self._append_next
            )
            self._appended.add_done_callback(self._append_failed)
        return True

    async def _start(self, text: str) -> bool:
        """Open the stream with the first text, or give up native streaming for this turn
        when Slack's tier (20 starts a minute per workspace) would hold the text back."""
        cp = self.cp
        governor, loop = self.paced.governor, asyncio.get_running_loop()
        slot = governor.next_slot(cp.team, "chat.startStream", loop.time())
        if slot - loop.time() > START_WAIT:
            self.native = False
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
            self.native, cp.streaming = False, ""
            return False
        self._sent, self._streamed = text, True
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
        args: dict[str, Any] = {"channel": self.cp.channel, "ts": self.ts}
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

    async def _stop(self, rendered: Rendered) -> bool:
        """Stop the stream with the rest of the answer; False when the final version must
        be an edit (the stream broke, or the message shows more than the streamed answer)."""
        if self._appended is not None:
            await asyncio.gather(self._appended, return_exceptions=True)
        view = self.view
        text = view.answer(closed=False)
        whole = (
            text == view.answer()  # no code fence left open
            and rendered.failed is None
            and not rendered.continuations
            and not view.slack_channel.get("view")
        )
        args: dict[str, Any] = {"channel": self.cp.channel, "ts": self.ts}
        chunks = self._task_chunks()
        if not self._broken and text.startswith(self._sent) and text[len(self._sent) :]:
            chunks.insert(0, {"type": "markdown_text", "text": text[len(self._sent) :]})
        if chunks:
            args["chunks"] = chunks
        args["metadata"] = stamp(self.cp.turn_id, "reply")
        stopped = await self._close_stream(str(self.ts), args)
        return stopped and not self._broken and whole

    async def _fall_back(self) -> None:
        """Leave native streaming for edits, stopping a stream that is still open."""
        self.native = False
        if self.cp.streaming:
            await self._close_stream(self.cp.streaming)

    async def _close_stream(self, ts: str, args: dict[str, Any] | None = None) -> bool:
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
