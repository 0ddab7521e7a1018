"""The thread's working indicator while a turn runs.

SPEC §14: `assistant.threads.setStatus` where Slack allows it; where it refuses (a channel
thread of an app that is not an assistant, say), a reaction on the triggering message,
removed when the turn ends.
"""

from __future__ import annotations

import asyncio
import functools

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.slack.governor import Paced
from bot.slack.webapi import call, slack_error

__all__ = ["SET_STATUS", "WORKING_REACTION", "Indicator"]

SET_STATUS = "assistant.threads.setStatus"
WORKING_REACTION = "hourglass_flowing_sand"


class Indicator:
    """One turn's status (or reaction) in one thread, sent through the shared pacing."""

    def __init__(
        self,
        web: AsyncWebClient,
        paced: Paced,
        team: str,
        channel: str,
        thread_ts: str,
        trigger: str,
    ) -> None:
        self.web = web
        self.paced = paced
        self.team = team
        self.channel = channel
        self.thread_ts = thread_ts
        self.trigger = trigger  # the message a reaction goes on
        self.status = ""  # the thread status as we last set it (or Slack cleared it)
        self._sent: asyncio.Future[None] | None = None  # the latest setStatus sent or waiting
        self._reaction: asyncio.Future[None] | None = None  # reactions.add, once refused

    def show(self, status: str) -> None:
        """Show `status` on the thread ("" clears it), unless Slack refused a status there."""
        if self._reaction is not None or status == self.status:
            return
        self.status = status
        self._sent = self._set_status(status)
        self._sent.add_done_callback(self._refused)

    def replied(self) -> None:
        """The app posted into the thread: Slack clears the thread status then."""
        self.status = ""

    async def clear(self, *, stale: bool = False) -> None:
        """Clear the status, or remove the reaction, once the turn's message has landed.

        `stale`: a dead follower may have shown either, so clear both if nothing else did."""
        if self._sent is None:
            if not stale:
                return  # nothing was shown
            self._sent = self._set_status("")
            self._reaction = self._react("reactions.remove") if self.trigger else None
            await asyncio.gather(
                self._sent, *filter(None, [self._reaction]), return_exceptions=True
            )
            return
        await asyncio.gather(self._sent, return_exceptions=True)  # settles `_reaction`
        if self._reaction is None:
            shown = self._set_status("")
        else:
            [added] = await asyncio.gather(self._reaction, return_exceptions=True)
            if added is not None and slack_error(added) != "already_reacted":
                return  # no reaction of ours to remove
            shown = self._react("reactions.remove")
        await asyncio.gather(shown, return_exceptions=True)  # Paced logged a failure

    def _set_status(self, status: str) -> asyncio.Future[None]:
        args = {"channel_id": self.channel, "thread_ts": self.thread_ts, "status": status}
        send = functools.partial(call, self.web, SET_STATUS, args)
        return self.paced.submit(self.team, SET_STATUS, (self.channel, self.thread_ts), send)

    def _refused(self, sent: asyncio.Future[None]) -> None:
        if sent.cancelled() or not isinstance(sent.exception(), SlackApiError):
            return
        if self._reaction is None and self.trigger:
            self._reaction = self._react("reactions.add")

    def _react(self, method: str) -> asyncio.Future[None]:
        args = {"channel": self.channel, "timestamp": self.trigger, "name": WORKING_REACTION}
        send = functools.partial(call, self.web, method, args)
        return self.paced.submit(self.team, method, (self.channel, self.trigger), send)
