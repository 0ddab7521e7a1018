"""The Slack bot's composition: every agent's Slack app wired to the turn machinery.

SPEC §14. `start_bots` builds a `Bots` for every agent with a `[agent.<id>.slack]` block whose
bot token is in the environment, with either an app token (Socket Mode: no public URL needed;
`Bots.start()` connects) or a signing secret (`Bots.routes()` serves it at
`POST /slack/<agent>/events` on any aiohttp app; `subs serve` shares its own;
bot/slack/intake.py checks Slack's signature before anything reads the body). Bolt acks; the
turn runs in a task of ours afterwards, so Slack never waits on it.

The layers it joins: `bot/rendering/` (pure: what a turn looks like in Slack), `bot/slack/`
(Slack I/O: Bolt apps, paced Web API calls, the reply writers) and `bot/turns/` (following
turns: what each input does, the followers and their checkpoints), which reaches the engine
only through its client.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from aiohttp import web
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncBoltContext
from slack_bolt.context.ack.async_ack import AsyncAck

from bot.payloads import BlockActions, EventCallback, SlashCommand
from bot.rendering.prompts import ACTION_PREFIX
from bot.slack.agent_app import Bot, connect_socket_mode, new_bot, socket_mode
from bot.slack.governor import Paced, RateGovernor
from bot.slack.intake import events_handler
from bot.turns.access import Access
from bot.turns.follower import LEASE_MS, RETRY_SECONDS, Followers
from bot.turns.land import land
from bot.turns.listeners import Listeners
from bot.turns.slots import TurnSlots
from bot.turns.store import Checkpoints, Slots, purge_sessions
from bot.turns.watch import Watch
from engine.client import Client
from engine.config import Project, WatchEntry, slack_env_suffix
from engine.landing import Landed, Landing
from engine.store.store import PurgeHooks, RedisClient
from engine.telemetry.spans import SpanRecord

__all__ = ["PURGE_HOOKS", "Bot", "Bots", "start_bots"]

log = logging.getLogger(__name__)

# The bot's keys of a session (checkpoints, leases, dedupe keys) go with it when the
# retention sweep removes it: the composition root hands these to the engine's sweep,
# whether or not a Slack app runs now (an earlier serve's may have left keys).
PURGE_HOOKS: PurgeHooks = MappingProxyType({"slack": purge_sessions})


class Bots:
    """Every agent's Slack app in this process, the shared pacing, and the followed turns."""

    def __init__(
        self,
        client: Client,
        redis: RedisClient,
        governor: RateGovernor | None = None,
        *,
        owner: str | None = None,
        lease_ms: int = LEASE_MS,
        retry_s: float = RETRY_SECONDS,
        console: Callable[[str], str] | None = None,
        refused: Callable[[str, str], None] | None = None,
        spans: Callable[[Iterable[SpanRecord]], None] | None = None,
    ) -> None:
        """`redis` keeps the bot's checkpoints (bot/turns/store.py); `console` gives a
        session's console page, linked from failed turns' messages; `refused` counts a
        person the agent's `allow`/`external` turned away (agent, reason); `spans` takes the
        bot's spans when tracing is on."""
        self.paced = Paced(governor or RateGovernor(), _send)
        owner = owner or f"bot-{secrets.token_hex(6)}"
        checkpoints = Checkpoints(redis, owner, lease_ms)
        slots = TurnSlots(Slots(redis, lease_ms), owner)
        self.bots: dict[str, Bot] = {}
        self.followers = Followers(
            client,
            self.paced,
            checkpoints,
            self.bots,
            retry_s,
            console=console,
            slots=slots,
            spans=spans,
        )
        self.listeners = Listeners(self.followers, refused)
        self._sockets: list[AsyncSocketModeHandler] = []
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
        max_concurrent_turns: int = 4,
        files: bool = True,
        file_text_limit: int = 256 * 1024,
        follow: bool = False,
        show_cost: bool = False,
        watches: Sequence[Watch] = (),
        access: Access | None = None,
        approvers: Sequence[str] = (),
    ) -> None:
        """One agent's app, its inputs handed to the listeners: with `follow`, a person's
        reply in a thread it answered starts a turn; `watches` are its alert channels;
        `access` says who may start turns, `approvers` who may answer prompts (else the
        turn's starter); `show_cost` puts each ended turn's cost under its reply."""
        bot = new_bot(
            agent,
            answers,
            token,
            signing_secret,
            api_url,
            app_token=app_token,
            stream=stream,
            max_concurrent_turns=max_concurrent_turns,
        )
        bot.files, bot.file_text_limit = files, file_text_limit
        bot.show_cost = show_cost
        app = bot.app
        self.listeners.configure(agent, follow=follow, watches=watches)
        self.listeners.access[agent] = access or Access()
        self.listeners.approvers[agent] = tuple(approvers)

        async def on_event(body: EventCallback, context: AsyncBoltContext) -> None:
            await self.listeners.event(bot, body, context)

        async def on_command(ack: AsyncAck, body: SlashCommand, context: AsyncBoltContext) -> None:
            await ack()  # sent once the listener returns: the turn is recorded by then
            await self.listeners.command(bot, body, context.bot_id or "")

        async def on_click(ack: AsyncAck, body: BlockActions) -> None:
            await ack()  # sent once the resume is recorded (or refused)
            await self.listeners.click(bot, body)

        async def on_button(ack: AsyncAck, body: BlockActions, context: AsyncBoltContext) -> None:
            await ack()
            await self.listeners.button(bot, body, context.bot_id or "")

        app.event(re.compile(".*"))(on_event)
        for command in commands:
            app.command(command)(on_command)
        app.action(re.compile(rf"^{ACTION_PREFIX}:"))(on_click)
        app.action(re.compile(rf"^(?!{ACTION_PREFIX}:)"))(on_button)
        self.bots[agent] = bot

    def land(self, landing: Landing) -> Awaitable[Landed]:
        """A turn the API sends into Slack (engine/landing.py `Lander`)."""
        return land(self.followers, landing)

    async def home(self, session_id: str) -> tuple[str, str] | None:
        """(channel, thread ts) of a session landed in Slack; None for any other (and for
        one whose root is still being posted: (channel, "") then)."""
        found = await self.followers.checkpoints.home(session_id)
        return None if found is None else (found[1], found[2])

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
            handler = socket_mode(bot)
            self._sockets.append(handler)
            connect = connect_socket_mode(bot, handler)
            task = asyncio.create_task(connect, name=f"slack-{bot.agent}")
            self._connecting.append(task)
        if self.bots:
            await self.followers.start()

    async def connected(self) -> None:
        """Wait until every Socket Mode bot has connected."""
        await asyncio.gather(*self._connecting)

    async def idle(self) -> None:
        """Wait until every turn started or resumed so far (and since) has ended."""
        await self.followers.idle()

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
        await self.followers.aclose()
        await self.paced.aclose()


def _watches(agent: str, entries: Sequence[WatchEntry], env: Mapping[str, str]) -> list[Watch]:
    """The agent's watch entries whose channel is known here (one named by an unset variable
    is off, said once: `subs check` lists the variable as missing)."""
    found = []
    for i, entry in enumerate(entries):
        channel = entry.channel_id(env)
        if channel is None:
            log.warning(
                "slack: agent %s: watch.%d is off: %s is not set", agent, i, entry.channel_var
            )
            continue
        found.append(Watch.of(channel, entry.posters, entry.match))
    return found


async def _send(team: str, method: str, send: Callable[[], Awaitable[Any]]) -> None:
    """Paced payloads are the calls themselves, so a stream's append reads its text late."""
    await send()


def start_bots(
    project: Project,
    client: Client,
    redis: RedisClient,
    env: Mapping[str, str],
    api_url: str | None = None,
    *,
    governor: RateGovernor | None = None,
    lease_ms: int = LEASE_MS,
    owner: str | None = None,
    retry_s: float = RETRY_SECONDS,
    refused: Callable[[str, str], None] | None = None,
    spans: Callable[[Iterable[SpanRecord]], None] | None = None,
) -> Bots:
    """A bot for each agent with a Slack block whose bot token is set, and an app token
    (Socket Mode) or a signing secret (HTTP). Call `Bots.start()` to connect Socket Mode.

    `api_url` (else `SLACK_API_URL`) is the Web API base, for a fake Slack in tests. A
    failed turn's message links to its console page when `[serve] public_url` is set (an
    address only this machine reaches would be a dead link in Slack).
    """
    console = project.serve.console_url if project.serve.public_url else None
    bots = Bots(
        client,
        redis,
        governor,
        lease_ms=lease_ms,
        owner=owner,
        retry_s=retry_s,
        console=console,
        refused=refused,
        spans=spans,
    )
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
            max_concurrent_turns=agent.slack.max_concurrent_turns,
            files=agent.slack.files,
            file_text_limit=agent.slack.file_text_limit,
            follow=agent.slack.follow,
            show_cost=agent.slack.show_cost,
            watches=_watches(agent.id, agent.slack.watch, env),
            access=Access(
                agent.slack.allow_teams,
                agent.slack.allow_channels,
                agent.slack.allow_users,
                agent.slack.external,
            ),
            approvers=agent.approvers,
        )
    return bots
