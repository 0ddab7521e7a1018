"""What a test reads: the channel as a person sees it (threads, versions of a message, the
thread status), the Web API calls the app made, and waiting for either without polling."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from tests.fakes.slack.model import Call, Message, Version

T = TypeVar("T")


class PersonView:
    """The test-facing readers of `FakeSlack` (mixed into it)."""

    def message(self, channel: str, ts: str) -> Message:
        """A message by channel and ts; KeyError if there is none (deleted ones included)."""
        return self._messages[channel][ts]

    def thread(self, channel: str, ts: str) -> list[Message]:
        """The parent and its replies, oldest first, without deleted messages."""
        return [m for m in self._thread(channel, ts) if not m.deleted]

    def by_app(self, msg: Message) -> bool:
        """Whether this app posted `msg` (not a person, not another app)."""
        return msg.app_id == self.app_id and msg.bot_id == self.teams[msg.team].bot_id

    def history(self, channel: str) -> list[Message]:
        """Top-level messages of a channel, oldest first."""
        return sorted(
            (m for m in self._messages[channel].values() if not m.is_reply and not m.deleted),
            key=lambda m: m.ts,
        )

    def edits(self, channel: str, ts: str) -> list[Version]:
        """Every visible version of a message, in order (a stream shows one per step)."""
        return list(self.message(channel, ts).versions)

    def status(self, channel: str, thread_ts: str) -> str:
        """The thread's status as shown now ('' when none, cleared by a reply, or timed out)."""
        history = self._statuses.get((channel, thread_ts))
        if not history:
            return ""
        last = history[-1]
        if last.cleared or self._now() - last.at > self.status_timeout * self.time_scale:
            return ""
        return last.status

    def statuses(self, channel: str, thread_ts: str) -> list[str]:
        """Every status the app set on a thread, in order."""
        return [s.status for s in self._statuses.get((channel, thread_ts), [])]

    def calls(self, method: str) -> list[Call]:
        return [c for c in self.requests if c.method == method]

    async def wait_for(self, method: str, count: int = 1, timeout: float = 5) -> list[Call]:
        """Returns the calls to `method` once there are `count`; TimeoutError after `timeout`."""
        return await self.until(
            lambda: self.calls(method) if len(self.calls(method)) >= count else None, timeout
        )

    async def until(self, check: Callable[[], T | None], timeout: float = 5) -> T:
        """Returns `check()` once it is not None; TimeoutError after `timeout` (no polling)."""
        async with asyncio.timeout(timeout):
            while True:
                found = check()
                if found is not None:
                    return found
                self._changed.clear()
                await self._changed.wait()
