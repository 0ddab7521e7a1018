"""Following one turn, from its checkpoint to its whole reply, or to a counted failure.

A follower holds the turn's lease (bot/turns/follower.py keeps it) and takes its steps in
order, each recorded in the checkpoint so that a follower resuming it skips what is done:
the workspace of a landed turn, the root message of a slash command or a landing, a slot of
its app (bot/turns/slots.py; until one is free its reply says it is queued), a message's
input (bot/turns/mention.py), the submit, and the stream into its reply
(bot/turns/streamer.py). The checkpoint is dropped once the reply is whole. A follower that
fails counts it in the checkpoint and lets go of the lease, so a later round retries it;
one that lost its lease stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping

from bot.rendering.mrkdwn import escape
from bot.rendering.prompts import prompt_for
from bot.rendering.turn_view import TurnView
from bot.slack.agent_app import Bot
from bot.slack.governor import Paced
from bot.slack.indicator import Indicator
from bot.slack.parts import stamped_parts
from bot.slack.reply import Reply
from bot.slack.webapi import call, every_message, governed
from bot.turns.checkpoint import Checkpoint, LeaseLost
from bot.turns.mention import MentionInput
from bot.turns.slots import Slot, TurnSlots
from bot.turns.store import Checkpoints
from bot.turns.streamer import Streamer
from engine.client import Client, ClientError
from engine.telemetry.live import LIVE, Live
from engine.telemetry.spans import SpanRecord, intake_context

__all__ = ["ARCHIVED", "BUSY", "SLACK_OWNER", "Following", "TurnFollower", "queued_text"]

log = logging.getLogger(__name__)

BUSY = "Still working on this thread: try again once the reply is done."
# The bot's own writes name this owner: a thread's session must have been started from
# Slack (by any asker), never by an API key that picked the predictable id first.
SLACK_OWNER = {"issuer": "slack"}
NOT_ADOPTED = (
    ":no_entry: This thread's session was not started from Slack (an API client created it "
    "first), so I will not use it. Mention me in a new thread to start one."
)
ARCHIVED = (
    "This thread had been quiet past the retention period, so its conversation was archived: "
    "I am starting afresh here and do not remember what was said before."
)
QUEUED = ":hourglass_flowing_sand: Queued: {where} (this app answers {limit} at a time)."
ANSWER_HERE = " The answer will appear here."

# The turns this process follows, by checkpoint key, with the task following each: the
# lease round renews these (bot/turns/follower.py), and a turn leaves it before its
# checkpoint is dropped.
Following = dict[str, tuple[Checkpoint, asyncio.Task[None]]]


class TurnFollower:
    """Follows turns for every agent's app in `bots`: each `follow` call, one turn."""

    def __init__(
        self,
        client: Client,
        paced: Paced,
        checkpoints: Checkpoints,
        bots: Mapping[str, Bot],
        retry_s: float,
        *,
        following: Following,
        slots: TurnSlots,
        mentions: MentionInput,
        streamer: Streamer,
        console: Callable[[str], str] | None = None,
        spans: Callable[[Iterable[SpanRecord]], None] | None = None,
    ) -> None:
        self.client = client
        self.paced = paced
        self.checkpoints = checkpoints
        self.bots = bots
        self.retry_s = retry_s
        self.following = following
        self.slots = slots
        self.mentions = mentions
        self.streamer = streamer
        self.console = console  # a session's console page, for failed turns' messages
        self.spans = spans  # where the bot's spans go (tracing on), else None
        self._teams: dict[str, str] = {}  # agent -> its app's workspace (auth.test)

    async def follow(self, cp: Checkpoint, *, resumed: bool) -> None:
        """Submit the turn (again, when resumed: the engine knows its id) and stream it.

        A follower that fails counts it in the checkpoint and lets go of the lease, so another
        round retries the turn, up to `MAX_FAILURES` (bot/turns/follower.py); one that lost its
        lease just stops."""
        task = asyncio.current_task()
        assert task is not None
        self.following[cp.key] = (cp, task)
        if self.spans is not None:  # this task's Web API calls and the turn sit under intake
            LIVE.set(Live(intake_context(cp.session_id, cp.turn_id), self.spans))
        bot = self.bots[cp.agent]
        console = self.console(cp.session_id) if self.console else None
        view = TurnView(cp.turn_id, console=console, show_cost=bot.show_cost)
        save = functools.partial(self.checkpoints.save, cp)
        # Slack's native stream is addressed to a person: an app's alert has none.
        reply = Reply(cp, view, bot.web, self.paced, save, native=bot.native and not cp.by_app)
        working: Indicator | None = None
        slot = self.slots.slot(cp.agent, cp.key, bot.max_concurrent_turns)
        try:
            if not cp.team:  # a landed turn: its workspace, for pacing and the metadata
                cp.team = await self._team(bot)
                await self.checkpoints.save(cp)
            if not cp.thread_ts:
                await self._post_root(cp, reply, resumed=resumed)
            working = Indicator(bot.web, self.paced, cp.team, cp.channel, cp.thread_ts, cp.trigger)
            if resumed:
                await reply.adopt_stamps()
                await reply.close_stale_stream()
            await slot.take(functools.partial(self._queued, cp, reply, slot))
            if cp.payload is None:
                cp.payload = await self.mentions.payload(bot, cp)
                await self.checkpoints.save(cp)
            if await self._submit(cp, reply):
                await self._after_archive(cp, reply)
                await self.streamer.stream(cp, view, reply, working, slot)
            await slot.release()
            # No longer renewed: the lease round must not take the drop for a lost lease.
            self.following.pop(cp.key, None)
            await self.checkpoints.drop(cp)
        except LeaseLost:
            log.warning("slack: turn %s is followed elsewhere now", cp.key)
            working = None  # the other follower shows (and clears) the indicator
        except Exception:
            with contextlib.suppress(Exception):  # Redis away too: the lease lapses anyway
                cp.failures += 1
                cp.retry_at = time.time() + self.retry_s * 2 ** (cp.failures - 1)
                await self.checkpoints.save(cp)
                await self.checkpoints.release(cp)
            raise
        finally:
            self.following.pop(cp.key, None)
            with contextlib.suppress(Exception):  # Redis away: the slot's lease lapses anyway
                await slot.release()
            if working is not None and not task.cancelling():  # shutting down: Slack times it out
                await working.clear(stale=resumed)

    async def _team(self, bot: Bot) -> str:
        """The workspace `bot`'s token belongs to (`auth.test`), asked once per process."""
        found = self._teams.get(bot.agent)
        if found is None:
            answer = await call(bot.web, "auth.test", {})
            found = self._teams[bot.agent] = str(answer.get("team_id") or "")
        return found

    async def _post_root(self, cp: Checkpoint, reply: Reply, *, resumed: bool) -> None:
        """A slash command's root message, once: its thread becomes the turn's session."""
        if resumed and "root" not in cp.posted:
            args = {"channel": cp.channel, "oldest": cp.since, "include_all_metadata": True}
            history = await every_message(
                self.paced.governor, cp.team, reply.web, "conversations.history", args
            )
            found = stamped_parts(history, cp.turn_id)
            if "root" in found:
                cp.posted["root"] = found["root"]
        if cp.session:  # a landed session's first turn: its title, said by the app
            text = escape(cp.title)
        else:
            args = cp.payload["args"] if cp.payload else {}
            ran = escape(f"/{(cp.payload or {}).get('name')} {args.get('text') or ''}".strip())
            text = f"<@{cp.user}> ran `{ran}`"
        root = await reply.post("root", {"text": text}, thread=False)
        cp.thread_ts = cp.trigger = cp.since = root
        await self.checkpoints.save(cp)
        if cp.session:  # before the submit: a mention there finds the session from now on
            await self.checkpoints.set_home(cp.session, cp.agent, cp.channel, root)

    async def _queued(
        self, cp: Checkpoint, reply: Reply, slot: Slot, ahead: int, granted: asyncio.Future[None]
    ) -> None:
        """The turn waits for a slot: its reply, posted now, says so (a post the reply makes
        anyway, so a storm costs no extra call). Its answer then grows in that message by
        edits. A button's quiet turn, or one whose reply landed already, shows nothing new.

        The note takes only a free chat.postMessage slot of the channel (one a second): the
        replies of running turns must not queue behind a storm's notes. It is not posted
        once the slot came first."""
        if cp.quiet or "reply" in cp.posted:
            return
        note = {"text": queued_text(ahead, slot.limit)}
        if await reply.post_unless("reply", note, granted):
            reply.stream.active = False

    async def _submit(self, cp: Checkpoint, reply: Reply) -> bool:
        """Submit the turn's input; False when there is no turn to follow.

        While a prompt is open the engine refuses new input; the open question is posted again.
        """
        metadata = {
            "slack_channel": cp.channel,
            "slack_thread_ts": cp.thread_ts,
            "slack_team": cp.team,
        }
        if not cp.team:  # a landed turn's root was posted by the app: no event named it
            del metadata["slack_team"]
        identity = {"subject": {"issuer": "slack", "id": cp.user}, "metadata": metadata}
        if cp.identity is not None:  # landed: the API caller's identity, and its thread
            given = cp.identity.get("metadata") or {}
            identity = {**cp.identity, "metadata": {**given, **metadata}}
        try:
            payload = {**(cp.payload or {}), "agent_id": cp.agent, "turn_id": cp.turn_id}
            live = LIVE.get()
            answer = await self.client.submit(
                payload,
                session_id=cp.session_id,
                identity=identity,
                # A landed session was pointed at this thread by a full key: the bot writes
                # it as one (only `land` records a thread's session).
                owner=None if cp.session else SLACK_OWNER,
                traceparent=live.parent.traceparent() if live else None,
            )
        except ClientError as err:
            if err.code == "forbidden":  # someone else's session under our thread's id
                log.warning("slack: session %s was not started from Slack; not used", cp.session_id)
                await reply.post("reply", {"text": NOT_ADOPTED})
                return False
            if err.code == "turn_already_active":  # an action (not queueable) mid-turn
                args = {"channel": cp.channel, "user": cp.user, "thread_ts": cp.thread_ts}
                bot, busy = self.bots[cp.agent], {**args, "text": BUSY}  # its user's alone
                await governed(self.paced.governor, cp.team, bot.web, "chat.postEphemeral", busy)
                return False
            if err.code != "session_interrupted":
                if err.status >= 500:
                    raise  # the engine's trouble, not the input's: the follower retries
                # The engine refused this input for good (it cannot be stored, say):
                # say so in the thread once instead of retrying what will fail again.
                await reply.post("reply", {"text": f":warning: {escape(err.message)}"})
                return False
            for iid, interrupt in (await self.client.interrupts(cp.session_id)).items():
                prompt = prompt_for(interrupt)
                if prompt is not None:
                    await reply.post(f"prompt-{iid}", prompt)
            return False
        return answer.get("turn_id") is not None  # None: every message was known already

    async def _after_archive(self, cp: Checkpoint, reply: Reply) -> None:
        """The thread's session was archived (retention): its turn runs on a fresh session.

        Archived between this turn's start and its submit, the fresh log is shorter than the
        seq the turn follows from: it is followed from the start (events and deltas of other
        turns are skipped anyway). And the thread is told, once, that it starts afresh."""
        if cp.after and await self.client.last_seq(cp.session_id) < cp.after:
            cp.after, cp.cursor = 0, "0-0"
            await self.checkpoints.save(cp)
        if await self.checkpoints.take_archived(cp.session_id):
            await reply.post("archived", {"text": ARCHIVED})


def queued_text(ahead: int, limit: int) -> str:
    """What a waiting turn's reply says: how many wait before it, and the app's limit."""
    many = f"{ahead} request{'s' if ahead > 1 else ''} ahead of this one"
    where = "next in line" if ahead == 0 else many
    return QUEUED.format(where=where, limit=limit) + ANSWER_HERE
