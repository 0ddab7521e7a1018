"""The Slack bot's wiring: one Bolt app per agent, over Socket Mode or the HTTP Events API.

SPEC §14. `start_bots` builds a `Bots` for every agent with a `[agent.<id>.slack]` block whose
bot token is in the environment, with either an app token (Socket Mode: no public URL needed;
`Bots.start()` connects) or a signing secret (`Bots.routes()` serves it at
`POST /slack/<agent>/events` on any aiohttp app; `subs serve` shares its own;
bot/slack/intake.py checks Slack's signature before anything reads the body). Bolt acks; the
turn runs in a task of ours afterwards, so Slack never waits on it. What each input does:
bot/slack/listeners.py; how its turn is followed and resumed: bot/threads/follower.py.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import aiohttp
from aiohttp import web
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp, AsyncBoltContext
from slack_bolt.context.ack.async_ack import AsyncAck
from slack_sdk.errors import SlackClientError
from slack_sdk.signature import SignatureVerifier
from slack_sdk.web.async_client import AsyncWebClient

from bot.rendering.prompts import ACTION_PREFIX
from bot.slack.agent_app import Bot
from bot.slack.governor import Paced, RateGovernor
from bot.slack.intake import events_handler
from bot.slack.listeners import Listeners
from bot.threads.follower import LEASE_MS, RETRY_SECONDS, Followers
from bot.threads.store import Checkpoints
from engine.client import Client
from engine.config import Project, slack_env_suffix
from engine.errors import describe

__all__ = ["Bot", "Bots", "start_bots"]

log = logging.getLogger(__name__)
CONNECT_RETRY_FIRST = 1.0  # seconds before the second Socket Mode try; doubles up to the max
CONNECT_RETRY_MAX = 30.0


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
        console: Callable[[str], str] | None = None,
    ) -> None:
        """`console` gives a session's console page, linked from failed turns' messages."""
        self.paced = Paced(governor or RateGovernor(), _send)
        checkpoints = Checkpoints(
            client.store.redis, owner or f"bot-{secrets.token_hex(6)}", lease_ms
        )
        self.bots: dict[str, Bot] = {}
        self.followers = Followers(
            client, self.paced, checkpoints, self.bots, retry_s, console=console
        )
        self.listeners = Listeners(self.followers)
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
            await self.listeners.event(bot, body, context)

        async def on_command(
            ack: AsyncAck, body: dict[str, Any], context: AsyncBoltContext
        ) -> None:
            await ack()  # sent once the listener returns: the turn is recorded by then
            await self.listeners.command(bot, body, context.bot_id or "")

        async def on_click(ack: AsyncAck, body: dict[str, Any]) -> None:
            await ack()  # sent once the resume is recorded (or refused)
            await self.listeners.click(bot, body)

        async def on_button(ack: AsyncAck, body: dict[str, Any], context: AsyncBoltContext) -> None:
            await ack()
            await self.listeners.button(bot, body, context.bot_id or "")

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
        if self.bots:
            await self.followers.start()

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

    `api_url` (else `SLACK_API_URL`) is the Web API base, for a fake Slack in tests. A
    failed turn's message links to its console page when `[serve] public_url` is set (an
    address only this machine reaches would be a dead link in Slack).
    """
    console = project.serve.console_url if project.serve.public_url else None
    bots = Bots(client, governor, lease_ms=lease_ms, owner=owner, retry_s=retry_s, console=console)
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
