"""Slack's inputs, made turns: mentions and DMs, alerts in watched channels, follow-ups,
slash commands, custom buttons, and clicks on interrupt prompts.

A mention, a DM, an alert, a follow-up, a slash command or a custom button
(`channels.slack`) becomes a checkpoint the followers record and follow
(bot/turns/follower.py): a slash command posts a root message and runs as a
`client.action` in its thread, as a button does in its own. A prompt
click resumes the interrupt with the option the engine recorded (read from the session
snapshot, so a click cannot inject a value), then rewrites the prompt to say who answered.
Each listener returns once the turn is recorded, so Bolt acks only then.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from slack_bolt.async_app import AsyncBoltContext

from bot.payloads import BlockActions, EventCallback, SlashCommand
from bot.rendering.prompts import option_of, parse_interrupt_action, prompt_for, resolved_prompt
from bot.slack.agent_app import Bot
from bot.slack.webapi import call
from bot.turns.access import REFUSED, Access, refusal
from bot.turns.approvers import approvers_of, named
from bot.turns.checkpoint import CLOCK_SKEW, Checkpoint
from bot.turns.follower import DEDUPE_SECONDS, Followers
from bot.turns.routing import route, thread_ts_of
from bot.turns.store import seen_key
from bot.turns.turn_follower import SLACK_OWNER
from bot.turns.watch import Watch
from engine.client import ClientError

log = logging.getLogger(__name__)

ANSWERED = "This prompt was already answered, or it expired."
NOBODY = "Nobody can answer this prompt in Slack: its agent names no approvers."
COMMAND_ARGS = ("text", "user_id", "channel_id", "team_id", "response_url", "trigger_id")


class Listeners:
    """What each kind of Slack input does; `Bots.add` registers these with Bolt."""

    def __init__(
        self, followers: Followers, refused: Callable[[str, str], None] | None = None
    ) -> None:
        self.followers = followers
        self.access: dict[str, Access] = {}  # by agent: who may start turns
        self.approvers: dict[str, tuple[str, ...]] = {}  # by agent: its `approvers`
        self.refused = refused  # counts a refusal: (agent, reason)
        self.follow: dict[str, bool] = {}  # agent -> follow-ups start turns
        self.watches: dict[str, tuple[Watch, ...]] = {}  # agent -> its alert channels

    async def _refuse(
        self, bot: Bot, team: str, where: dict[str, str], reason: str, *, ephemeral: str | None
    ) -> None:
        """Tell the person why nothing started (unless `ephemeral` is None); count it; log
        ids and the reason, never the text."""
        log.info(
            "slack: agent %s refused %s in %s (%s)",
            bot.agent,
            where.get("user"),
            where.get("channel"),
            reason,
        )
        if self.refused is not None:
            self.refused(bot.agent, reason)
        if ephemeral is not None:
            self.followers.spawn(self.followers.tell(bot, team, {**where, "text": ephemeral}))

    def _refusal(
        self, bot: Bot, user: str, channel: str, user_team: Any, app_team: str
    ) -> str | None:
        team = user_team if isinstance(user_team, str) and user_team else None
        access = self.access.get(bot.agent, Access())
        return refusal(access, user=user, channel=channel, user_team=team, app_team=app_team)

    def configure(self, agent: str, *, follow: bool, watches: Sequence[Watch] = ()) -> None:
        """`agent`'s app answers follow-ups (`follow`) and triages the `watches`' alerts."""
        self.follow[agent] = follow
        self.watches[agent] = tuple(watches)

    async def event(self, bot: Bot, body: EventCallback, context: AsyncBoltContext) -> None:
        """After Bolt verified the signature; Slack gets its ack once the turn is recorded.

        A mention, a DM, a watched channel's new alert, or a follow-up in a thread the app
        answered (bot/turns/routing.py `route`). Each message is one turn, its id the
        message's ts: Slack's retries (same event_id), the same message under another
        event_id, and a mention's two deliveries (`app_mention` and `message`) all find it
        recorded already."""
        event = body.get("event")
        if not isinstance(event, dict):
            return
        bot_user, bot_id = context.bot_user_id, context.bot_id
        follow, watches = self.follow.get(bot.agent, False), self.watches.get(bot.agent, ())
        kind = route(event, bot.answers, bot_user, bot_id, follow=follow, watches=watches)
        if kind is None:
            return
        event_id = body.get("event_id")
        if not isinstance(event_id, str) or not event_id:
            return
        thread_ts = thread_ts_of(event)
        assert thread_ts is not None  # route checked
        sid, landed = await self.followers.session_of(bot.agent, event["channel"], thread_ts)
        if kind == "reply" and not await self.followers.client.last_seq(sid):
            return  # a thread the app was never asked in: people talking
        app_team = str(body.get("team_id") or context.team_id or "")
        if kind != "alert":  # a watched channel's alerts are the operator's own choice
            user_team = event.get("user_team") or event.get("team")
            reason = self._refusal(bot, event["user"], event["channel"], user_team, app_team)
            if reason is not None:
                # Refused once: Slack's retries of the event (same event_id) and a mention's
                # second delivery (`message`, same ts) are dropped, neither told nor counted.
                checkpoints = self.followers.checkpoints
                for name in (seen_key("event", event_id), seen_key("refused", event["ts"])):
                    if not await checkpoints.first(event["channel"], name, DEDUPE_SECONDS):
                        return
                where = {"channel": event["channel"], "user": event["user"]}
                if event.get("thread_ts"):
                    where["thread_ts"] = event["thread_ts"]
                # A follow-up was not addressed to the app: counted, not answered.
                text = None if kind == "reply" else REFUSED[reason]
                await self._refuse(bot, app_team, where, reason, ephemeral=text)
                return
        cp = Checkpoint(
            agent=bot.agent,
            team=app_team,
            channel=event["channel"],
            thread_ts=thread_ts,
            turn_id=f"slack-{event['ts']}",
            user=str(event.get("user") or event.get("bot_id")),
            payload=None,
            trigger=event["ts"],
            since=event["ts"],
            bot_id=bot_id or "",
            mention={"event": event, "bot_user": bot_user, "bot_id": bot_id},
            by_app=bool(event.get("bot_id")),
            session=landed,
        )
        await self.followers.start_turn(cp, [seen_key("event", event_id)])

    async def command(self, bot: Bot, body: SlashCommand, bot_id: str) -> None:
        """A slash command: its turn is recorded at once; its follower posts the root message
        naming who ran what, whose thread is the session."""
        args = {key: str(body.get(key) or "") for key in COMMAND_ARGS}
        command = str(body.get("command") or "")
        if not (command and args["channel_id"] and args["user_id"] and args["trigger_id"]):
            return
        reason = self._refusal(
            bot, args["user_id"], args["channel_id"], body.get("user_team"), args["team_id"]
        )
        if reason is not None:
            where = {"channel": args["channel_id"], "user": args["user_id"]}
            await self._refuse(bot, args["team_id"], where, reason, ephemeral=REFUSED[reason])
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
        await self.followers.start_turn(cp, [seen_key("command", args["trigger_id"])])

    async def button(self, bot: Bot, body: BlockActions, bot_id: str) -> None:
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
        _, landed = await self.followers.session_of(bot.agent, str(channel), thread_ts)
        action_ts = str(action["action_ts"])
        team = str((body.get("team") or {}).get("id") or "")
        user_team = (body.get("user") or {}).get("team_id")
        reason = self._refusal(bot, str(user), str(channel), user_team, team)
        if reason is not None:
            where = {"channel": str(channel), "user": str(user), "thread_ts": thread_ts}
            await self._refuse(bot, team, where, reason, ephemeral=REFUSED[reason])
            return
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
            session=landed,
        )
        seen = f"{channel}:{message_ts}:{action['action_id']}:{action_ts}:{user}"
        await self.followers.start_turn(cp, [seen_key("action", seen)])

    async def click(self, bot: Bot, body: BlockActions) -> None:
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
        sid, landed = await self.followers.session_of(bot.agent, channel, str(thread_ts))
        interrupt = (await self.followers.open_interrupts(sid)).get(interrupt_id)
        option = option_of(interrupt, index)
        if interrupt is not None and option is not None:
            refused = await self._not_approver(bot, team, interrupt, user)
            if refused is not None:
                where = {"channel": channel, "user": user, "thread_ts": thread_ts}
                log.info("slack: prompt %s: %s is not an approver", interrupt_id, user)
                self.followers.spawn(self.followers.tell(bot, team, {**where, "text": refused}))
                return
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
                reply = await self.followers.client.submit(
                    resume, session_id=sid, owner=None if landed else SLACK_OWNER
                )
            except ClientError as err:
                log.warning("slack prompt %s: %s", interrupt_id, err)
            else:
                resumed = reply.get("resumed") is True
        if not resumed or interrupt is None or option is None:
            ephemeral = {"channel": channel, "user": user, "thread_ts": thread_ts, "text": ANSWERED}
            self.followers.spawn(self.followers.tell(bot, team, ephemeral))
            return
        prompt = prompt_for(interrupt) or {}
        label = str(option.get("label") or "") or None
        answered = resolved_prompt(prompt, label, user, option.get("style") != "danger")
        args = {"channel": channel, "ts": message_ts, **answered}
        send = functools.partial(call, bot.web, "chat.update", args)
        self.followers.spawn(
            _landed(self.followers.paced.submit(team, "chat.update", (channel, message_ts), send))
        )

    async def _not_approver(
        self, bot: Bot, team: str, interrupt: dict[str, Any], user: str
    ) -> str | None:
        """None when `user` may answer `interrupt` (bot/turns/approvers.py); else what they
        are told. Groups are asked only when no listed person matches."""
        ids = approvers_of(interrupt, self.approvers.get(bot.agent, ()))
        if not ids:
            return NOBODY
        if user in ids:
            return None
        directory = self.followers.directory(bot)
        for group in (i for i in ids if i.startswith("S")):
            if user in await directory.members(team, group):
                return None
        return f"Only {named(ids)} can answer this."


async def _landed(sent: asyncio.Future[None]) -> None:
    await sent
