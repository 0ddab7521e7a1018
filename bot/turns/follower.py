"""Following turns: each turn the bot starts is recorded once, streamed into its Slack
message, and resumed by another follower when this one dies or fails.

Every turn gets a turn id of the bot's choosing and a checkpoint in Redis, written with the
input's dedupe keys before the input is submitted (bot/turns/checkpoint.py). Its follower
holds a lease on it, writes the turn into one Slack message (bot/slack/reply.py) and
drops the checkpoint once the reply is whole. Leases are renewed in a loop that also takes
over turns whose lease lapsed; a turn whose followers keep failing is given up. A turn runs
only in one of its app's slots (bot/turns/slots.py); until one is free, its reply says it is
queued.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any

from bot.payloads import SlackMessage
from bot.rendering.files import files_of, tool_images
from bot.rendering.message_text import attributed, message_text, poster, wanted_ids
from bot.rendering.mrkdwn import escape
from bot.rendering.prompts import expired_prompt, prompt_for
from bot.rendering.turn_view import TurnView
from bot.slack.agent_app import Bot
from bot.slack.directory import Directory
from bot.slack.files import upload
from bot.slack.governor import Paced
from bot.slack.indicator import Indicator
from bot.slack.parts import stamped_parts
from bot.slack.reply import Reply
from bot.slack.webapi import call, every_message, governed, thread_messages
from bot.turns.checkpoint import Checkpoint, LeaseLost
from bot.turns.files import FileReader
from bot.turns.routing import missed_messages, session_id_for
from bot.turns.slots import Slot, TurnSlots
from bot.turns.store import Checkpoints, seen_key
from engine.client import Client, ClientError
from engine.landing import Landed, Landing, LandingError
from engine.telemetry.live import LIVE, Live, now_ms
from engine.telemetry.spans import Attributes, SpanRecord, intake_context

log = logging.getLogger(__name__)

CLOCK_SKEW = 60.0  # how far this host's clock may be off Slack's (a root's ts is Slack's)
DEDUPE_SECONDS = 3600  # Slack retries within minutes; an hour covers replays too
LEASE_MS = 15_000  # a dead bot's turns move to a live one within this (plus a scan)
MAX_FAILURES = 5
RETRY_SECONDS = 5.0  # a failed follower's turn is retried after 5 s, then 10, 20, 40
GAVE_UP = ":warning: This reply could not be finished: Slack or the engine kept failing."
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
        self.spans = spans  # where the bot's spans go (tracing on), else None
        self.slots = slots
        self.console = console  # a session's console page, for failed turns' messages
        self.paced = paced
        self.checkpoints = checkpoints
        self.bots = bots
        self.retry_s = retry_s
        self._tasks: set[asyncio.Task[None]] = set()
        self._following: dict[str, tuple[Checkpoint, asyncio.Task[None]]] = {}
        self._keeper: asyncio.Task[None] | None = None
        self._directories: dict[str, Directory] = {}
        self._teams: dict[str, str] = {}  # agent -> its app's workspace (auth.test)

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

    async def land(self, landing: Landing) -> Landed:
        """A turn the API sends into Slack (engine/landing.py): recorded as a checkpoint
        before the API answers, then followed as a mention is: the root message (when no
        thread is named), the submit under the API's turn id, the streamed reply.

        The session's home is claimed first: a second landing while its root is still being
        posted is told to retry (503) rather than post a second root.

        Raises:
            LandingError: no app of the agent here (409), or the home is being posted (503).
        """
        bot = self.bots.get(landing.agent)
        if bot is None:
            raise LandingError(
                f"agent {landing.agent!r} has no Slack app running here (its [agent."
                f"{landing.agent}.slack] block and SLACK_BOT_TOKEN_* are needed)",
                status=409,
                code="slack_unavailable",
            )
        sid, channel, thread = landing.session_id, landing.channel, landing.thread_ts or ""
        home = await self.checkpoints.claim_home(
            sid, landing.agent, channel, thread, DEDUPE_SECONDS
        )
        if home is not None:
            _, channel, thread = home
            if not thread:
                raise LandingError(
                    f"session {sid!r}: its Slack thread is still being posted; try again",
                    status=503,
                    code="unavailable",
                )
        cp = Checkpoint(
            agent=landing.agent,
            team="",
            channel=channel,
            thread_ts=thread,
            turn_id=landing.turn_id,
            user="",
            payload=landing.input,
            since=f"{time.time() - CLOCK_SKEW:.6f}",
            trigger=thread,
            by_app=True,  # no person asked in Slack: nobody to stream to natively
            session=sid,
            identity=landing.identity,
            title=landing.title,
        )
        recorded = await self.start_turn(cp, [seen_key("land", f"{sid} {landing.turn_id}")])
        return Landed(channel, thread or None, recorded)

    async def start_turn(self, cp: Checkpoint, seen: list[str]) -> bool:
        """Record the turn, once per Slack input, then follow it in a task of its own.

        Its id is in the dedupe keys too: an edited mention arrives as a new event with the
        message's ts, and must not start that turn again."""
        if cp.thread_ts:
            cp.after = await self.client.last_seq(cp.session_id)
            cp.cursor = await self.client.delta_cursor(cp.session_id)
        keys = [*seen, seen_key("turn", cp.key)]
        if await self.checkpoints.start(keys, DEDUPE_SECONDS, cp):
            self._following[cp.key] = (cp, self.spawn(self._follow(cp, resumed=False)))
            return True
        return False

    # -- following a turn ---------------------------------------------------------------------

    async def _follow(self, cp: Checkpoint, *, resumed: bool) -> None:
        """Submit the turn (again, when resumed: the engine knows its id) and stream it.

        A follower that fails counts it in the checkpoint and lets go of the lease, so another
        round retries the turn, up to `MAX_FAILURES`; one that lost its lease just stops."""
        task = asyncio.current_task()
        assert task is not None
        self._following[cp.key] = (cp, task)
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
                cp.payload = await self._mention_payload(bot, cp)
                await self.checkpoints.save(cp)
            if await self._submit(cp, reply):
                await self._after_archive(cp, reply)
                await self._stream(cp, view, reply, working, slot)
            await slot.release()
            # No longer renewed: the lease round must not take the drop for a lost lease.
            self._following.pop(cp.key, None)
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
            self._following.pop(cp.key, None)
            with contextlib.suppress(Exception):  # Redis away: the slot's lease lapses anyway
                await slot.release()
            if working is not None and not task.cancelling():  # shutting down: Slack times it out
                await working.clear(stale=resumed)

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

    async def _mention_payload(self, bot: Bot, cp: Checkpoint) -> dict[str, Any]:
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

    async def _team(self, bot: Bot) -> str:
        """The workspace `bot`'s token belongs to (`auth.test`), asked once per process."""
        found = self._teams.get(bot.agent)
        if found is None:
            answer = await call(bot.web, "auth.test", {})
            found = self._teams[bot.agent] = str(answer.get("team_id") or "")
        return found

    def directory(self, bot: Bot) -> Directory:
        """The names `bot`'s token may look up, cached for this process."""
        found = self._directories.get(bot.agent)
        if found is None:
            found = self._directories[bot.agent] = Directory(bot.web, self.paced.governor)
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
                await self.tell(self.bots[cp.agent], cp.team, {**args, "text": BUSY})
                return False
            if err.code != "session_interrupted":
                if err.status >= 500:
                    raise  # the engine's trouble, not the input's: the follower retries
                # The engine refused this input for good (it cannot be stored, say):
                # say so in the thread once instead of retrying what will fail again.
                await reply.post("reply", {"text": f":warning: {escape(err.message)}"})
                return False
            for iid, interrupt in (await self.open_interrupts(cp.session_id)).items():
                prompt = prompt_for(interrupt)
                if prompt is not None:
                    await reply.post(f"prompt-{iid}", prompt)
            return False
        return answer.get("turn_id") is not None  # None: every message was known already

    async def _stream(
        self, cp: Checkpoint, view: TurnView, reply: Reply, working: Indicator, slot: Slot
    ) -> None:
        """Fold the turn's events and deltas into its Slack message until the reply is whole.

        The slot is given back as the engine's turn ends, before the final edits (paced by
        Slack's tiers) land: the next turn's model call need not wait for them. A turn that
        waits for a person's decision gives it back then: a few open approvals must not
        stop the app; what runs after the click is not counted (people click, not storms)."""
        follow = self.client.follow(cp.session_id, cp.after, delta_cursor=cp.cursor)
        first = "reply" not in cp.posted  # the intake span ends at this follower's first reply
        images: list[tuple[str, bytes]] = []  # the tools' images, uploaded once it is done
        prompts: dict[str, dict[str, Any]] = {}  # by interrupt id, as posted
        async for kind, item in follow:
            if kind == "delta":
                view.apply_delta(item)
            elif item.get("turn_id") != cp.turn_id:
                continue
            else:
                try:
                    view.apply_event(item)
                except ValueError as err:  # a newer engine's event: show the rest anyway
                    log.warning("slack turn %s: %s", cp.turn_id, err)
                    continue
                payload = item["payload"]
                if payload["type"] == "session.interrupted":
                    await slot.release()  # a person decides now, for minutes or days
                    prompt = prompt_for(payload)
                    if prompt is not None:
                        prompts[payload["interrupt_id"]] = prompt
                        await reply.post(f"prompt-{payload['interrupt_id']}", prompt)
                elif payload["type"] == "session.interrupt_resumed" and payload.get("expired"):
                    await self._expired(cp, prompts.get(payload["interrupt_id"]), payload)
                await reply.show_channel()
                if payload["type"] == "tool.call.completed":
                    images += tool_images(payload.get("result"), f"image-{len(images) + 1}")
            if view.done:
                await slot.release()
                await reply.finish(view.render())
                if first:  # nothing was shown before the end: intake lasted the turn
                    first = self._intake(cp)
                await self._upload(cp, images)
                return
            had_reply = reply.ts is not None
            await reply.show()
            if reply.ts is not None and not had_reply:
                working.replied()
                if first:
                    first = self._intake(cp)
            working.show(view.status or "")

    def _intake(self, cp: Checkpoint) -> bool:
        """End the turn's intake span, from the Slack message to its first words posted
        (tracing on). Returns False: it is ended."""
        live = LIVE.get()
        if live is not None:
            started = float(cp.trigger or cp.since or 0) * 1000 or now_ms()
            attributes: Attributes = {
                "gen_ai.agent.name": cp.agent,
                "gen_ai.conversation.id": cp.session_id,
                "subs.turn.id": cp.turn_id,
                "slack.team": cp.team,
                "slack.channel": cp.channel,
                "slack.thread_ts": cp.thread_ts,
            }
            name, start, end = f"slack intake {cp.agent}", int(started), now_ms()
            live.emit([SpanRecord(name, live.parent, None, "server", start, end, attributes)])
        return False

    async def _upload(self, cp: Checkpoint, images: list[tuple[str, bytes]]) -> None:
        """The images the agent's tools returned, uploaded into the thread after its reply,
        each once (a resumed follower skips those it finds in `cp.posted`). One Slack refuses
        is a note in the thread: the reply's text is there already."""
        bot = self.bots[cp.agent]
        for n, (name, data) in enumerate(images):
            part = f"file-{n}"
            if part in cp.posted:
                continue
            why = "files = false" if not bot.files else None
            if why is None:
                governor = self.paced.governor
                why = await upload(bot.web, governor, cp.team, cp.channel, cp.thread_ts, name, data)
            if why is not None:
                log.warning("slack turn %s: could not upload %s: %s", cp.turn_id, name, why)
                text = f":warning: The agent made an image ({escape(name)}) that could not be "
                text += f"uploaded: {escape(why)}"
                args = {"channel": cp.channel, "thread_ts": cp.thread_ts, "text": text}
                await governed(self.paced.governor, cp.team, bot.web, "chat.postMessage", args)
            cp.posted[part] = "uploaded" if why is None else "noted"
            await self.checkpoints.save(cp)

    async def _expired(
        self, cp: Checkpoint, prompt: dict[str, Any] | None, payload: dict[str, Any]
    ) -> None:
        """The engine resolved a prompt as expired: rewrite it to say so (buttons gone)."""
        ts = cp.posted.get(f"prompt-{payload['interrupt_id']}")
        if prompt is None or ts is None:
            return
        bot = self.bots[cp.agent]
        args = {"channel": cp.channel, "ts": ts, **expired_prompt(prompt)}
        send = functools.partial(call, bot.web, "chat.update", args)
        await self.paced.submit(cp.team, "chat.update", (cp.channel, ts), send)

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
            self._following[cp.key] = (cp, self.spawn(self._follow(cp, resumed=True)))

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


def queued_text(ahead: int, limit: int) -> str:
    """What a waiting turn's reply says: how many wait before it, and the app's limit."""
    many = f"{ahead} request{'s' if ahead > 1 else ''} ahead of this one"
    where = "next in line" if ahead == 0 else many
    return QUEUED.format(where=where, limit=limit) + ANSWER_HERE


def _said(msg: SlackMessage, names: dict[str, str], addressed_to: str | None) -> str:
    """`Name: text`; a message of only files says so rather than `(no text)`."""
    if files_of(msg) and not message_text(msg, names, addressed_to=addressed_to):
        count = len(files_of(msg))
        return f"{poster(msg, names)}: (shared {count} file{'s' if count > 1 else ''})"
    return attributed(msg, names, addressed_to=addressed_to)
