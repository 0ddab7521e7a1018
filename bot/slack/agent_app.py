"""One agent's Slack app: the Bolt app and Web API client it talks through, and its
Socket Mode connection.

The Slack side of the wiring only: which listener each input goes to is decided above, in
bot/app.py, so this layer knows nothing of turns.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import aiohttp
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp
from slack_sdk.errors import SlackClientError
from slack_sdk.signature import SignatureVerifier
from slack_sdk.web.async_client import AsyncWebClient

from engine.errors import describe

__all__ = ["CONNECT_RETRY_FIRST", "CONNECT_RETRY_MAX", "Bot", "connect_socket_mode", "new_bot"]

log = logging.getLogger(__name__)
CONNECT_RETRY_FIRST = 1.0  # seconds before the second Socket Mode try; doubles up to the max
CONNECT_RETRY_MAX = 30.0


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
    max_concurrent_turns: int = 4  # the app's turns running at once (bot/turns/slots.py)
    files: bool = True  # read messages' files and upload the agent's images
    file_text_limit: int = 256 * 1024  # bytes of a text file the model reads
    show_cost: bool = False  # a line of each ended turn's cost under its reply


def new_bot(
    agent: str,
    answers: str,
    token: str,
    signing_secret: str | None,
    api_url: str | None,
    *,
    app_token: str | None = None,
    stream: str = "edit",
    max_concurrent_turns: int = 4,
) -> Bot:
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
    return Bot(
        agent,
        answers,
        app,
        web_client,
        app_token,
        native=stream == "native",
        verifier=verifier,
        max_concurrent_turns=max_concurrent_turns,
    )


def socket_mode(bot: Bot) -> AsyncSocketModeHandler:
    """The Socket Mode handler of a bot with an app token (not yet connected)."""
    assert bot.app_token is not None
    return AsyncSocketModeHandler(bot.app, bot.app_token, web_client=bot.web)


async def connect_socket_mode(bot: Bot, handler: AsyncSocketModeHandler) -> None:
    """Open the bot's Socket Mode URL until Slack gives one, one log line a try.

    Asked here rather than by the SDK, which retries forever, logging a traceback
    each time; once Slack answers, the SDK connects to the URL and keeps it up.
    """
    assert bot.app_token is not None
    delay = CONNECT_RETRY_FIRST
    while True:
        try:
            opened = await bot.web.apps_connections_open(app_token=bot.app_token)
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
