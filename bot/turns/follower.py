"""Following turns: each turn the bot starts is recorded once, streamed into its Slack
message, and resumed by another follower when this one dies or fails.

Every turn gets a turn id of the bot's choosing and a checkpoint in Redis, written with the
input's dedupe keys before the input is submitted (bot/turns/checkpoint.py). Its follower
(bot/turns/turn_follower.py) holds a lease on it, writes the turn into one Slack message
and drops the checkpoint once the reply is whole. Leases are renewed here in a loop that
also takes over turns whose lease lapsed; a turn whose followers keep failing is given up.
`Followers` is what the inputs (bot/turns/listeners.py, bot/turns/land.py) hand turns to,
and the few lookups they share with the followers.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any

from bot.rendering.turn_view import TurnView
from bot.slack.agent_app import Bot
from bot.slack.directory import Directory
from bot.slack.governor import Paced
from bot.slack.reply import Reply
from bot.slack.webapi import governed
from bot.turns.checkpoint import Checkpoint
from bot.turns.mention import MentionInput
from bot.turns.routing import session_id_for
from bot.turns.slots import TurnSlots
from bot.turns.store import Checkpoints, seen_key
from bot.turns.streamer import Streamer
from bot.turns.turn_follower import Following, TurnFollower
from engine.client import Client
from engine.telemetry.spans import SpanRecord

log = logging.getLogger(__name__)

DEDUPE_SECONDS = 3600  # Slack retries within minutes; an hour covers replays too
LEASE_MS = 15_000  # a dead bot's turns move to a live one within this (plus a scan)
MAX_FAILURES = 5
RETRY_SECONDS = 5.0  # a failed follower's turn is retried after 5 s, then 10, 20, 40
GAVE_UP = ":warning: This reply could not be finished: Slack or the engine kept failing."


class Followers:
    """The turns this process follows, for every agent's app in `bots`."""

    def __init__(
        self,
        client: Client,
        paced: Paced,
        checkpoints: Checkpoints,
        bots: Mapping[str, Bot],
        retry_s: float = RETRY_SECONDS,
        *,
        console: Callable[[str], str] | None = None,
        slots: TurnSlots,
        spans: Callable[[Iterable[SpanRecord]], None] | None = None,
    ) -> None:
        self.client = client
        self.slots = slots
        self.paced = paced
        self.checkpoints = checkpoints
        self.bots = bots
        self._tasks: set[asyncio.Task[None]] = set()
        self._following: Following = {}
        self._keeper: asyncio.Task[None] | None = None
        self.mentions = MentionInput(client, paced)
        self.follower = TurnFollower(
            client,
            paced,
            checkpoints,
            bots,
            retry_s,
            following=self._following,
            slots=slots,
            mentions=self.mentions,
            streamer=Streamer(client, paced, checkpoints, bots),
            console=console,
            spans=spans,
        )

    async def start(self) -> None:
        """Resume the turns left half-written, then keep leases in the background."""
        if self._keeper is None:
            await self._resume_orphans()
            self._keeper = asyncio.create_task(self._keep_leases())

    async def idle(self) -> None:
        """Wait until every turn started or resumed so far (and since) has ended."""
        while self._tasks:
            await asyncio.wait(list(self._tasks))

    async def aclose(self) -> None:
        """Stop following turns (the engine keeps running them) and release their leases,
        so another bot resumes them at once."""
        if self._keeper is not None:
            self._keeper.cancel()
            await asyncio.gather(self._keeper, return_exceptions=True)
        following = [cp for cp, _ in self._following.values()]
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.slots.aclose()
        for cp in following:
            await self.checkpoints.release(cp)

    def spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run `work` as one of the tasks `idle` waits for and `aclose` cancels."""
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("slack turn failed", exc_info=task.exception())

    async def start_turn(self, cp: Checkpoint, seen: list[str]) -> bool:
        """Record the turn, once per Slack input, then follow it in a task of its own.

        Its id is in the dedupe keys too: an edited mention arrives as a new event with the
        message's ts, and must not start that turn again."""
        if cp.thread_ts:
            cp.after = await self.client.last_seq(cp.session_id)
            cp.cursor = await self.client.delta_cursor(cp.session_id)
        keys = [*seen, seen_key("turn", cp.key)]
        if await self.checkpoints.start(keys, DEDUPE_SECONDS, cp):
            self._following[cp.key] = (cp, self.spawn(self.follower.follow(cp, resumed=False)))
            return True
        return False

    # -- resuming -----------------------------------------------------------------------------

    async def _resume_orphans(self) -> None:
        """Follow every open turn of our agents that no live bot follows (lease lapsed).

        A turn whose followers keep failing (the app was removed from the channel, say) is
        given up after `MAX_FAILURES`, so it is not retried forever."""
        for seen in await self.checkpoints.open():
            if seen.agent not in self.bots or seen.key in self._following:
                continue
            if seen.retry_at > time.time():
                continue  # backing off after a failure
            cp = await self.checkpoints.claim(seen)
            if cp is None:
                continue  # finished meanwhile, or another live follower has it
            if cp.failures >= MAX_FAILURES:
                log.error("slack: giving up turn %s of %s", cp.turn_id, cp.session_id)
                self.spawn(self._give_up(cp))
                continue
            log.info("slack: resuming turn %s of %s", cp.turn_id, cp.session_id)
            self._following[cp.key] = (cp, self.spawn(self.follower.follow(cp, resumed=True)))

    async def _give_up(self, cp: Checkpoint) -> None:
        """Say so where the reply was going (best effort: that is what kept failing), then
        forget the turn."""
        bot = self.bots[cp.agent]
        save = functools.partial(self.checkpoints.save, cp)
        reply = Reply(cp, TurnView(cp.turn_id), bot.web, self.paced, save)
        try:
            await reply.give_up(GAVE_UP)
        except Exception as err:
            log.warning("slack: could not say turn %s was given up: %s", cp.turn_id, err)
        await self.checkpoints.drop(cp)

    async def _keep_leases(self) -> None:
        """Renew the leases of the turns we follow; take over those whose follower died."""
        period = self.checkpoints.lease_ms / 3000
        while True:
            await asyncio.sleep(period)
            try:
                for key, (cp, task) in list(self._following.items()):
                    renewed = await self.checkpoints.renew(cp)
                    if not renewed and self._following.get(key, (None, None))[1] is task:
                        log.warning("slack: lost the lease on turn %s; another bot has it", key)
                        task.cancel()
                await self.slots.keep()
                await self._resume_orphans()
            except Exception as err:  # Redis away for a moment: the next round retries
                log.warning("slack: lease round failed: %s", err)

    # -- shared with the listeners ------------------------------------------------------------

    async def session_of(self, agent: str, channel: str, thread_ts: str) -> tuple[str, str]:
        """The session a thread continues: (its id, the landed session's id or "")."""
        landed = await self.checkpoints.landed(agent, channel, thread_ts)
        return landed or session_id_for(agent, channel, thread_ts), landed or ""

    async def open_interrupts(self, sid: str) -> dict[str, dict[str, Any]]:
        """The session's open interrupts as the engine recorded them, by id."""
        return await self.client.interrupts(sid)

    async def tell(self, bot: Bot, team: str, ephemeral: dict[str, Any]) -> None:
        """A message only its user sees: why their input started nothing."""
        await governed(self.paced.governor, team, bot.web, "chat.postEphemeral", ephemeral)

    def directory(self, bot: Bot) -> Directory:
        """The names `bot`'s token may look up, cached for this process (bot/turns/mention.py)."""
        return self.mentions.directory(bot)
