"""The Slack bot: one Bolt app per agent, over Socket Mode or the HTTP Events API.

SPEC §14. `start_bots` builds a `Bots` for every agent with a `[agent.<id>.slack]` block whose
bot token is in the environment, with either an app token (Socket Mode: no public URL needed;
`Bots.start()` connects) or a signing secret (`Bots.routes()` serves it at
`POST /slack/<agent>/events` on any aiohttp app; `subs serve` shares its own; bot/slack/intake.py
checks Slack's signature before anything reads the body). Bolt acks; the turn runs in a task
of ours afterwards, so Slack never waits on it.

Every turn the bot starts gets a turn id of its choosing and a checkpoint in Redis, written
with the event's dedupe key before the input is submitted (bot/threads/checkpoint.py). The
follower of a turn writes it into one Slack message (bot/rendering/reply.py) and drops the
checkpoint once the reply is whole; `Bots.start()` also resumes the turns a dead bot left
half-written.

A slash command posts a root message and runs as a `client.action` in that message's thread;
so does a click on a custom button (`channels.slack`). An interrupt posts a prompt with one
button per option; a click resumes with the option the engine recorded (read from the session
snapshot, so a click cannot inject a value).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp, AsyncBoltContext
from slack_bolt.context.ack.async_ack import AsyncAck
from slack_sdk.errors import SlackClientError
from slack_sdk.signature import SignatureVerifier
from slack_sdk.web.async_client import AsyncWebClient

from engine.client import Client, ClientError
from engine.config import Project, slack_env_suffix
from engine.errors import describe
from engine.snapshots import load_state

from ..rendering.indicator import SET_STATUS, Indicator
from ..rendering.mrkdwn import escape
from ..rendering.prompts import (
    ACTION_PREFIX,
    interrupt_prompt,
    parse_interrupt_action,
    resolved_prompt,
)
from ..rendering.reply import Reply, stamped_parts
from ..rendering.turn_view import TurnView
from ..threads.checkpoint import Checkpoint, LeaseLost
from ..threads.routing import (
    missed_messages,
    session_id_for,
    strip_mention,
    thread_ts_of,
    wants_turn,
)
from ..threads.store import Checkpoints
from .governor import Paced, RateGovernor
from .intake import events_handler
from .webapi import call, every_message, governed, thread_messages

__all__ = ["SET_STATUS", "Bot", "Bots", "start_bots"]

log = logging.getLogger(__name__)
CONNECT_RETRY_FIRST = 1.0  # seconds before the second Socket Mode try; doubles up to the max
CONNECT_RETRY_MAX = 30.0

DEDUPE_SECONDS = 3600  # Slack retries within minutes; an hour covers replays too
LEASE_MS = 15_000  # a dead bot's turns move to a live one within this (plus a scan)
MAX_FAILURES = 5
RETRY_SECONDS = 5.0  # a failed follower's turn is retried after 5 s, then 10, 20, 40
CLOCK_SKEW = 60.0  # how far this host's clock may be off Slack's
GAVE_UP = ":warning: This reply could not be finished: Slack or the engine kept failing."
ANSWERED = "This prompt was already answered."
BUSY = "Still working on this thread: try again once the reply is done."
COMMAND_ARGS = ("text", "user_id", "channel_id", "team_id", "response_url", "trigger_id")


@dataclass
class Bot:
    """One agent's Slack app."""

    agent: str
    answers: str
    app: AsyncApp
    web: AsyncWebClient
    app_token: str | None = None  # set: Socket Mode; else the HTTP Events API
    native: bool = False  # stream replies with chat.startStream/appendStream/stopStream
    verifier: SignatureVerifier | None = None  # HTTP only: signatures, before Bolt reads


class Bots:
    """Every agent's Slack app in this process, the shared pacing, and the followed turns."""

    def __init__(
        self,
        client: Client,
        governor: RateGovernor | None = None,
        *,
        owner: str | None = None,
        lease_ms: int = LEASE_MS,
        retry_s: float = RETRY_SECONDS,
    ) -> None:
        self.client = client
        self.retry_s = retry_s
        self.paced = Paced(governor or RateGovernor(), _send)
        self.checkpoints = Checkpoints(
            client.store.redis, owner or f"bot-{secrets.token_hex(6)}", lease_ms
        )
        self.bots: dict[str, Bot] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._following: dict[str, tuple[Checkpoint, asyncio.Task[None]]] = {}
        self._sockets: list[AsyncSocketModeHandler] = []
        self._keeper: asyncio.Task[None] | None = None
        self._connecting: list[asyncio.Task[None]] = []

    def add(
        self,
        agent: str,
        answers: str,
        token: str,
        signing_secret: str | None,
        api_url: str | None,
        commands: Sequence[str] = (),
        *,
        app_token: str | None = None,
        stream: str = "edit",
    ) -> None:
        """One agent's app: Socket Mode with `app_token`, else HTTP with `signing_secret`."""
        # No SDK retries: a post resent after a dropped connection could show twice; a failed
        # call fails the follower, and its successor looks for what landed (the stamps).
        web_client = AsyncWebClient(
            token=token, base_url=api_url or AsyncWebClient.BASE_URL, retry_handlers=[]
        )
        app = AsyncApp(
            client=web_client,
            signing_secret=signing_secret or "",
            request_verification_enabled=app_token is None,  # Socket Mode has no signatures
            # Ack after the listener: an event is acked once its turn is recorded in Redis,
            # so a crash before that leaves it unacked, and Slack delivers it again.
            process_before_response=True,
        )
        http = app_token is None and signing_secret
        verifier = SignatureVerifier(signing_secret) if http and signing_secret else None
        bot = Bot(
            agent, answers, app, web_client, app_token, native=stream == "native", verifier=verifier
        )

        async def on_event(body: dict[str, Any], context: AsyncBoltContext) -> None:
            await self._on_event(bot, body, context)

        async def on_command(
            ack: AsyncAck, body: dict[str, Any], context: AsyncBoltContext
        ) -> None:
            await ack()  # sent once the listener returns: the turn is recorded by then
            await self._command(bot, body, context.bot_id or "")

        async def on_click(ack: AsyncAck, body: dict[str, Any]) -> None:
            await ack()  # sent once the resume is recorded (or refused)
            await self._click(bot, body)

        async def on_button(ack: AsyncAck, body: dict[str, Any], context: AsyncBoltContext) -> None:
            await ack()
            await self._button(bot, body, context.bot_id or "")

        app.event(re.compile(".*"))(on_event)
        for command in commands:
            app.command(command)(on_command)
        app.action(re.compile(rf"^{ACTION_PREFIX}:"))(on_click)
        app.action(re.compile(rf"^(?!{ACTION_PREFIX}:)"))(on_button)
        self.bots[agent] = bot

    def routes(self) -> list[web.RouteDef]:
        """`POST /slack/<agent>/events` for every bot over HTTP (those without an app token)."""
        return [
            web.post(f"/slack/{a}/events", events_handler(bot.app, bot.verifier))
            for a, bot in self.bots.items()
            if bot.verifier is not None
        ]

    def describe(self) -> list[str]:
        """One phrase per app for the startup line: agent, transport, streaming."""
        return [
            f"{a} ({'socket mode' if bot.app_token else f'POST /slack/{a}/events'}, "
            f"{'native' if bot.native else 'edit'} streaming)"
            for a, bot in self.bots.items()
        ]

    async def start(self) -> None:
        """Start connecting every Socket Mode bot, in the background (see `_connect`), and
        resume turns left half-written. Returns at once, however Slack is doing."""
        for bot in self.bots.values():
            if bot.app_token is None:
                continue
            handler = AsyncSocketModeHandler(bot.app, bot.app_token, web_client=bot.web)
            self._sockets.append(handler)
            connect = self._connect(bot, bot.app_token, handler)
            task = asyncio.create_task(connect, name=f"slack-{bot.agent}")
            self._connecting.append(task)
        if self.bots and self._keeper is None:
            await self._resume_orphans()
            self._keeper = asyncio.create_task(self._keep_leases())

    async def connected(self) -> None:
        """Wait until every Socket Mode bot has connected."""
        await asyncio.gather(*self._connecting)

    async def _connect(self, bot: Bot, app_token: str, handler: AsyncSocketModeHandler) -> None:
        """Open the bot's Socket Mode URL until Slack gives one, one log line a try.

        Asked here rather than by the SDK, which retries forever, logging a traceback
        each time; once Slack answers, the SDK connects to the URL and keeps it up.
        """
        delay = CONNECT_RETRY_FIRST
        while True:
            try:
                opened = await bot.web.apps_connections_open(app_token=app_token)
                handler.client.wss_uri = opened["url"]
                await handler.connect_async()
            except (SlackClientError, aiohttp.ClientError, OSError, TimeoutError) as err:
                log.warning(
                    "slack: agent %s: cannot connect Socket Mode (%s); retrying in %g s",
                    bot.agent,
                    describe(err),
                    delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, CONNECT_RETRY_MAX)
                continue
            # Said as loudly as the failures were, so whoever saw those sees this.
            level = logging.INFO if delay == CONNECT_RETRY_FIRST else logging.WARNING
            log.log(level, "slack: agent %s: connected (Socket Mode)", bot.agent)
            return

    async def idle(self) -> None:
        """Wait until every turn started or resumed so far (and since) has ended."""
        while self._tasks:
            await asyncio.wait(list(self._tasks))

    async def aclose(self) -> None:
        """Stop receiving, following turns (the engine keeps running them) and the pacing.

        Leases are released, so another bot resumes the turns at once."""
        connecting, self._connecting = self._connecting, []
        for task in connecting:
            task.cancel()
        await asyncio.gather(*connecting, return_exceptions=True)
        sockets, self._sockets = self._sockets, []
        for handler in sockets:
            await handler.close_async()
        if self._keeper is not None:
            self._keeper.cancel()
            await asyncio.gather(self._keeper, return_exceptions=True)
        following = [cp for cp, _ in self._following.values()]
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for cp in following:
            await self.checkpoints.release(cp)
        await self.paced.aclose()

    # -- receiving ----------------------------------------------------------------------

    async def _on_event(self, bot: Bot, body: dict[str, Any], context: AsyncBoltContext) -> None:
        """After Bolt verified the signature; Slack gets its ack once the turn is recorded."""
        event = body.get("event")
        if not isinstance(event, dict):
            return
        bot_user, bot_id = context.bot_user_id, context.bot_id
        if not wants_turn(event, bot.answers, bot_user, bot_id):
            return
        event_id = body.get("event_id")
        if not isinstance(event_id, str) or not event_id:
            return
        thread_ts = thread_ts_of(event)
        assert thread_ts is not None  # wants_turn checked
        cp = Checkpoint(
            agent=bot.agent,
            team=str(body.get("team_id") or context.team_id or ""),
            channel=event["channel"],
            thread_ts=thread_ts,
            turn_id=f"slack-{event['ts']}",
            user=event["user"],
            payload=None,
            trigger=event["ts"],
            since=event["ts"],
            bot_id=bot_id or "",
            mention={"event": event, "bot_user": bot_user, "bot_id": bot_id},
        )
        await self._start_turn(cp, [_seen_key("event", event_id)])

    def _spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("slack turn failed", exc_info=task.exception())

    # -- starting a turn ----------------------------------------------------------------

    async def _mention_payload(self, bot: Bot, cp: Checkpoint) -> dict[str, Any]:
        """A mention or a DM: its message, and those the agent missed since, as one input."""
        assert cp.mention is not None
        event, bot_user, bot_id = cp.mention["event"], cp.mention["bot_user"], cp.mention["bot_id"]
        ts = event["ts"]
        messages: list[dict[str, Any]] = []
        if cp.thread_ts != ts:
            thread = await thread_messages(
                self.paced.governor, cp.team, bot.web, cp.channel, cp.thread_ts
            )
            for msg in missed_messages(thread, ts, bot_user, bot_id):
                text = f"<@{msg['user']}>: {msg.get('text') or ''}"
                messages.append({"id": f"slack:{msg['ts']}", "role": "user", "content": text})
        text = strip_mention(event["text"], bot_user)
        messages.append({"id": f"slack:{ts}", "role": "user", "content": text})
        return {"type": "client.append", "messages": messages, "queue": True}

    async def _command(self, bot: Bot, body: dict[str, Any], bot_id: str) -> None:
        """A slash command: its turn is recorded at once; its follower posts the root message
        naming who ran what, whose thread is the session."""
        args = {key: str(body.get(key) or "") for key in COMMAND_ARGS}
        command = str(body.get("command") or "")
        if not (command and args["channel_id"] and args["user_id"] and args["trigger_id"]):
            return
        cp = Checkpoint(
            agent=bot.agent,
            team=args["team_id"],
            channel=args["channel_id"],
            thread_ts="",  # the root message's ts, once posted
            turn_id=f"slack-cmd-{args['trigger_id']}",
            user=args["user_id"],
            payload={"type": "client.action", "name": command.removeprefix("/"), "args": args},
            # Slack ts are epoch seconds on Slack's clock: the root comes later, give or take.
            since=f"{time.time() - CLOCK_SKEW:.6f}",
            bot_id=bot_id,
        )
        await self._start_turn(cp, [_seen_key("command", args["trigger_id"])])

    async def _button(self, bot: Bot, body: dict[str, Any], bot_id: str) -> None:
        """A custom button (from `channels.slack`): `client.action` named by its action_id."""
        actions = body.get("actions")
        action = actions[0] if isinstance(actions, list) and actions else None
        container = body.get("container") or {}
        channel = (body.get("channel") or {}).get("id") or container.get("channel_id")
        message_ts = container.get("message_ts")
        user = (body.get("user") or {}).get("id")
        if not isinstance(action, dict) or not all(
            isinstance(v, str) and v
            for v in (channel, message_ts, user, action.get("action_id"), action.get("action_ts"))
        ):
            return
        thread_ts = str(container.get("thread_ts") or message_ts)
        action_ts = str(action["action_ts"])
        team = str((body.get("team") or {}).get("id") or "")
        args = {
            "value": action.get("value"),
            "user_id": user,
            "channel_id": channel,
            "team_id": team,
            "message_ts": message_ts,
            "thread_ts": thread_ts,
            "trigger_id": body.get("trigger_id"),
            "response_url": body.get("response_url"),
        }
        cp = Checkpoint(
            agent=bot.agent,
            team=team,
            channel=str(channel),
            thread_ts=thread_ts,
            turn_id=f"slack-action-{action_ts}",
            user=str(user),
            payload={"type": "client.action", "name": action["action_id"], "args": args},
            since=action_ts,
            bot_id=bot_id,
            quiet=True,
        )
        seen = f"{channel}:{message_ts}:{action['action_id']}:{action_ts}:{user}"
        await self._start_turn(cp, [_seen_key("action", seen)])

    async def _start_turn(self, cp: Checkpoint, seen: list[str]) -> None:
        """Record the turn, once per Slack input, then follow it in a task of its own.

        Its id is in the dedupe keys too: an edited mention arrives as a new event with the
        message's ts, and must not start that turn again."""
        if cp.thread_ts:
            cp.after = await self.client.last_seq(cp.session_id)
            cp.cursor = await self.client.delta_cursor(cp.session_id)
        keys = [*seen, _seen_key("turn", cp.key)]
        if await self.checkpoints.start(keys, DEDUPE_SECONDS, cp):
            self._following[cp.key] = (cp, self._spawn(self._follow(cp, resumed=False)))

    # -- following a turn ---------------------------------------------------------------

    async def _follow(self, cp: Checkpoint, *, resumed: bool) -> None:
        """Submit the turn (again, when resumed: the engine knows its id) and stream it.

        A follower that fails counts it in the checkpoint and lets go of the lease, so another
        round retries the turn, up to `MAX_FAILURES`; one that lost its lease just stops."""
        task = asyncio.current_task()
        assert task is not None
        self._following[cp.key] = (cp, task)
        bot = self.bots[cp.agent]
        view = TurnView(cp.turn_id)
        reply = Reply(cp, view, bot.web, self.paced, self.checkpoints.save, native=bot.native)
        working: Indicator | None = None
        try:
            if not cp.thread_ts:
                await self._post_root(cp, reply, resumed=resumed)
            working = Indicator(bot.web, self.paced, cp.team, cp.channel, cp.thread_ts, cp.trigger)
            if resumed:
                await reply.adopt_stamps()
                await reply.close_stale_stream()
            if cp.payload is None:
                cp.payload = await self._mention_payload(bot, cp)
                await self.checkpoints.save(cp)
            if await self._submit(cp, reply):
                await self._stream(cp, view, reply, working)
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
            if working is not None and not task.cancelling():  # shutting down: Slack times it out
                await working.clear(stale=resumed)

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
        args = cp.payload["args"] if cp.payload else {}
        ran = escape(f"/{(cp.payload or {}).get('name')} {args.get('text') or ''}".strip())
        root = await reply.post("root", {"text": f"<@{cp.user}> ran `{ran}`"}, thread=False)
        cp.thread_ts = cp.trigger = cp.since = root
        await self.checkpoints.save(cp)

    async def _submit(self, cp: Checkpoint, reply: Reply) -> bool:
        """Submit the turn's input; False when there is no turn to follow.

        While a prompt is open the engine refuses new input; the open question is posted again.
        """
        metadata = {
            "slack_channel": cp.channel,
            "slack_thread_ts": cp.thread_ts,
            "slack_team": cp.team,
        }
        identity = {"subject": {"issuer": "slack", "id": cp.user}, "metadata": metadata}
        try:
            payload = {**(cp.payload or {}), "agent_id": cp.agent, "turn_id": cp.turn_id}
            answer = await self.client.submit(payload, session_id=cp.session_id, identity=identity)
        except ClientError as err:
            if err.code == "turn_already_active":  # an action (not queueable) mid-turn
                args = {"channel": cp.channel, "user": cp.user, "thread_ts": cp.thread_ts}
                await self._tell(self.bots[cp.agent], cp.team, {**args, "text": BUSY})
                return False
            if err.code != "session_interrupted":
                if err.status >= 500:
                    raise  # the engine's trouble, not the input's: the follower retries
                # The engine refused this input for good (it cannot be stored, say):
                # say so in the thread once instead of retrying what will fail again.
                await reply.post("reply", {"text": f":warning: {escape(err.message)}"})
                return False
            for iid, interrupt in (await self._open_interrupts(cp.session_id)).items():
                prompt = _prompt(interrupt)
                if prompt is not None:
                    await reply.post(f"prompt-{iid}", prompt)
            return False
        return answer.get("turn_id") is not None  # None: every message was known already

    async def _stream(
        self, cp: Checkpoint, view: TurnView, reply: Reply, working: Indicator
    ) -> None:
        """Fold the turn's events and deltas into its Slack message until the reply is whole."""
        follow = self.client.follow(cp.session_id, cp.after, delta_cursor=cp.cursor)
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
                    prompt = _prompt(payload)
                    if prompt is not None:
                        await reply.post(f"prompt-{payload['interrupt_id']}", prompt)
                await reply.show_channel()
            if view.done:
                await reply.finish(view.render())
                return
            had_reply = reply.ts is not None
            await reply.show()
            if reply.ts is not None and not had_reply:
                working.replied()
            working.show(view.status or "")

    # -- resuming -----------------------------------------------------------------------

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
                self._spawn(self._give_up(cp))
                continue
            log.info("slack: resuming turn %s of %s", cp.turn_id, cp.session_id)
            self._following[cp.key] = (cp, self._spawn(self._follow(cp, resumed=True)))

    async def _give_up(self, cp: Checkpoint) -> None:
        """Say so where the reply was going (best effort: that is what kept failing), then
        forget the turn."""
        bot = self.bots[cp.agent]
        reply = Reply(cp, TurnView(cp.turn_id), bot.web, self.paced, self.checkpoints.save)
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
                    if not await self.checkpoints.renew(cp):
                        log.warning("slack: lost the lease on turn %s; another bot has it", key)
                        task.cancel()
                await self._resume_orphans()
            except Exception as err:  # Redis away for a moment: the next round retries
                log.warning("slack: lease round failed: %s", err)

    # -- interrupts ---------------------------------------------------------------------

    async def _open_interrupts(self, sid: str) -> dict[str, dict[str, Any]]:
        """The session's open interrupts as the engine recorded them, by id."""
        state = await load_state(self.client.store, sid)
        return dict(state.interrupts) if state else {}

    async def _click(self, bot: Bot, body: dict[str, Any]) -> None:
        """A prompt button: resume with the recorded option, then show who answered."""
        actions = body.get("actions")
        action = actions[0] if isinstance(actions, list) and actions else None
        parsed = parse_interrupt_action(action) if isinstance(action, dict) else None
        container = body.get("container") or {}
        channel = (body.get("channel") or {}).get("id") or container.get("channel_id")
        message_ts = container.get("message_ts")
        user = (body.get("user") or {}).get("id")
        team = str((body.get("team") or {}).get("id") or "")
        if (
            parsed is None
            or not isinstance(channel, str)
            or not isinstance(message_ts, str)
            or not isinstance(user, str)
        ):
            return
        interrupt_id, index = parsed
        thread_ts = container.get("thread_ts") or message_ts
        sid = session_id_for(bot.agent, channel, thread_ts)
        interrupt = (await self._open_interrupts(sid)).get(interrupt_id)
        option = _option(interrupt, index)
        resumed = False
        if interrupt is not None and option is not None:
            responder = {"channel": "slack", "user": user}
            responder |= {k: option[k] for k in ("label", "style") if option.get(k) is not None}
            resume = {
                "type": "interrupt.resume",
                "interrupt_id": interrupt_id,
                "payload": {"value": option.get("value"), "responder": responder},
            }
            try:
                reply = await self.client.submit(resume, session_id=sid)
            except ClientError as err:
                log.warning("slack prompt %s: %s", interrupt_id, err)
            else:
                resumed = reply.get("resumed") is True
        if not resumed or interrupt is None or option is None:
            ephemeral = {"channel": channel, "user": user, "thread_ts": thread_ts, "text": ANSWERED}
            self._spawn(self._tell(bot, team, ephemeral))
            return
        prompt = _prompt(interrupt) or {}
        label = str(option.get("label") or "") or None
        answered = resolved_prompt(prompt, label, user, option.get("style") != "danger")
        args = {"channel": channel, "ts": message_ts, **answered}
        send = functools.partial(call, bot.web, "chat.update", args)
        self._spawn(_landed(self.paced.submit(team, "chat.update", (channel, message_ts), send)))

    async def _tell(self, bot: Bot, team: str, ephemeral: dict[str, Any]) -> None:
        await governed(self.paced.governor, team, bot.web, "chat.postEphemeral", ephemeral)


def _prompt(interrupt: dict[str, Any]) -> dict[str, Any] | None:
    """The prompt message for a recorded interrupt; None when Slack cannot carry its id."""
    payload = interrupt.get("payload")
    try:
        return interrupt_prompt(
            str(interrupt["interrupt_id"]),
            payload if isinstance(payload, dict) else None,
            str(interrupt.get("reason") or ""),
        )
    except ValueError as err:
        log.warning("slack prompt not shown: %s", err)
        return None


def _option(interrupt: dict[str, Any] | None, index: int) -> dict[str, Any] | None:
    """Option `index` of an interrupt's `metadata.options`, when there is such a dict."""
    payload = (interrupt or {}).get("payload")
    metadata = payload.get("metadata") if isinstance(payload, dict) else None
    options = metadata.get("options") if isinstance(metadata, dict) else None
    if not isinstance(options, list) or index >= len(options):
        return None
    option = options[index]
    return option if isinstance(option, dict) else None


async def _landed(sent: asyncio.Future[None]) -> None:
    await sent


def _seen_key(kind: str, key: str) -> str:
    return f"subs:slack:seen:{kind}:{key}"


async def _send(team: str, method: str, send: Callable[[], Awaitable[Any]]) -> None:
    """Paced payloads are the calls themselves, so a stream's append reads its text late."""
    await send()


def start_bots(
    project: Project,
    client: Client,
    env: Mapping[str, str],
    api_url: str | None = None,
    *,
    governor: RateGovernor | None = None,
    lease_ms: int = LEASE_MS,
    owner: str | None = None,
    retry_s: float = RETRY_SECONDS,
) -> Bots:
    """A bot for each agent with a Slack block whose bot token is set, and an app token
    (Socket Mode) or a signing secret (HTTP). Call `Bots.start()` to connect Socket Mode.

    `api_url` (else `SLACK_API_URL`) is the Web API base, for a fake Slack in tests.
    """
    bots = Bots(client, governor, lease_ms=lease_ms, owner=owner, retry_s=retry_s)
    api_url = api_url or env.get("SLACK_API_URL") or None
    for agent in project.agents.values():
        if agent.slack is None:
            continue
        suffix = slack_env_suffix(agent.id)
        token = env.get(f"SLACK_BOT_TOKEN_{suffix}")
        secret = env.get(f"SLACK_SIGNING_SECRET_{suffix}") or None
        app_token = env.get(f"SLACK_APP_TOKEN_{suffix}") or None
        if not token or not (app_token or secret):
            log.info("agent %s: no Slack bot token, or no app token or signing secret", agent.id)
            continue
        bots.add(
            agent.id,
            agent.slack.answers,
            token,
            secret,
            api_url,
            agent.slack.commands,
            app_token=app_token,
            stream=agent.slack.stream,
        )
    return bots
