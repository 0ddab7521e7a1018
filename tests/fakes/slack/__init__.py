"""A fake Slack: Web API, Events API sender and Socket Mode server, on 127.0.0.1, port 0.

The real slack_sdk / slack_bolt talk to it: `AsyncWebClient(token=fake.bot_token,
base_url=fake.url)` (what SLACK_API_URL should hold). It keeps workspaces, channels, threads
and messages in memory so a test asserts what a person would see (`thread`, `message`,
`edits`), records every Web API call (`requests`), enforces Slack's per-method,
per-workspace rate limits with HTTP 429 + Retry-After, and rejects what Slack rejects with
Slack's error strings. Numbers and error names come from notes/slack-facts.md (§1.1 streaming,
§1.4 setStatus, §1.5 tiers, §1.7 sizes, §3.3 fake, §5 Block Kit) and slack-api-ref's method
specs; the few guesses are marked "unverified".

Time: every Slack duration (rate windows, stream lifetime, status timeout) is multiplied by
`time_scale`, and `advance(seconds)` moves the fake's clock forward without sleeping.

The parts: `rules.py` (rate tiers, sizes, scopes, the error answer), `model.py` (the world it
keeps and what it records), `checks.py` (what it refuses of an app's payloads, and request
signing), and the faces `FakeSlack` mixes in:
- the workspace: `world.py` (building it: teams, people, channels, other apps' posts; ids
  and the clock) and `messages.py` (messages kept with their versions, rendered as Slack
  shows them);
- the Web API: `web_api.py` (every call's dispatch: arguments, token, rate limit, errors)
  and one module per method family: `chat.py`, `conversations.py`, `reactions.py`,
  `assistant.py`, `users.py`, `files.py` (files shared, downloaded and uploaded);
- toward the app: `events.py` (the payloads it sends), `sending.py` (signed HTTP delivery
  and response_url posts) and `socket_mode.py`;
- for the test: `view.py` (what a person sees, the calls made, waiting on either).
This module keeps the state they share, the method table and the server's lifecycle.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
from aiohttp import web

from tests.fakes.slack.assistant import AssistantMethods
from tests.fakes.slack.chat import ChatMethods
from tests.fakes.slack.checks import sign
from tests.fakes.slack.conversations import ConversationMethods
from tests.fakes.slack.events import EventPayloads
from tests.fakes.slack.files import FileMethods, FilesState
from tests.fakes.slack.messages import MessageStore
from tests.fakes.slack.model import (
    Ack,
    Call,
    Channel,
    Ephemeral,
    Integration,
    Message,
    Method,
    Reply,
    Status,
    Team,
    User,
)
from tests.fakes.slack.reactions import ReactionMethods
from tests.fakes.slack.rules import (
    DEFAULT_LIMITS,
    DEFAULT_SCOPES,
    STATUS_TIMEOUT,
    STREAM_LIFETIME,
    Bucket,
    Limit,
    SlackError,
)
from tests.fakes.slack.sending import EventSender
from tests.fakes.slack.socket_mode import SocketModeServer
from tests.fakes.slack.users import UserMethods
from tests.fakes.slack.view import PersonView
from tests.fakes.slack.web_api import WebApiDispatch
from tests.fakes.slack.world import WorldBuilding

__all__ = [
    "DEFAULT_LIMITS",
    "Call",
    "FakeSlack",
    "Integration",
    "Limit",
    "Message",
    "SlackError",
    "sign",
]


class FakeSlack(
    WorldBuilding,
    MessageStore,
    PersonView,
    WebApiDispatch,
    ChatMethods,
    ConversationMethods,
    ReactionMethods,
    AssistantMethods,
    UserMethods,
    FileMethods,
    EventPayloads,
    EventSender,
    SocketModeServer,
):
    """A fake Slack workspace (or several) for one app; see the module docstring."""

    def __init__(
        self,
        *,
        limits: Mapping[str, Limit | None] | None = None,
        time_scale: float = 1.0,
        stream_lifetime: float = STREAM_LIFETIME,
        status_timeout: float = STATUS_TIMEOUT,
        scopes: str = DEFAULT_SCOPES,
        signing_secret: str = "fake-signing-secret",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits: dict[str, Limit | None] = {**DEFAULT_LIMITS, **(limits or {})}
        self.time_scale = time_scale
        self.stream_lifetime = stream_lifetime
        self.status_timeout = status_timeout
        self.scopes = scopes
        self.signing_secret = signing_secret
        self.clock = clock  # pass `lambda: 0.0` to freeze time; `advance` still moves it
        self.base = ""
        self.url = ""  # the Web API base: http://127.0.0.1:PORT/api/
        self.requests: list[Call] = []
        self.teams: dict[str, Team] = {}
        self.users: dict[str, User] = {}
        self.integrations: dict[str, Integration] = {}  # by bot id
        self.channels: dict[str, Channel] = {}
        self.usergroups: dict[str, list[str]] = {}  # user group id (S…) -> member ids
        self.ephemerals: list[Ephemeral] = []
        self.replies_sent: list[Reply] = []  # response_url posts
        self.envelopes: list[dict[str, Any]] = []  # sent over Socket Mode
        self.acks: dict[str, Ack] = {}
        self.connections = 0  # Socket Mode connections ever accepted
        # The app's bot events (`events_for`): the manifest's, with channel messages.
        self.subscriptions = {"app_mention", "message.im", "message.channels", "message.groups"}
        self._messages: dict[str, dict[str, Message]] = {}
        self._statuses: dict[tuple[str, str], list[Status]] = {}
        self._buckets: dict[tuple[str, str, str], Bucket] = {}
        self._response_urls: dict[str, tuple[str, str, str | None]] = {}
        self._tickets: set[str] = set()
        self._sockets: list[web.WebSocketResponse] = []
        self._next_socket = 0
        self._ids = itertools.count(1)
        self._last_us = 0
        self._offset = 0.0
        self._changed = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.file_state = FilesState()

        self.app_id = self._id("A")
        self.app_token = f"xapp-1-{self.app_id}-{uuid.uuid4().hex}"
        self.team = self.add_team("Fake Team")
        self.user = self.add_user("alice")
        self.general = self.add_channel("general")
        self.dm = self.add_dm(self.user)
        self._methods: dict[str, Method] = {
            "auth.test": Method(self._auth_test, json=False),
            "chat.postMessage": Method(self._post_message),
            "chat.update": Method(self._update),
            "chat.delete": Method(self._delete),
            "chat.postEphemeral": Method(self._post_ephemeral),
            "chat.startStream": Method(self._start_stream),
            "chat.appendStream": Method(self._append_stream),
            "chat.stopStream": Method(self._stop_stream),
            "conversations.replies": Method(self._replies, json=False),
            "conversations.history": Method(self._history, json=False),
            "conversations.info": Method(self._info, json=False),
            "reactions.add": Method(self._react),
            "reactions.remove": Method(self._unreact),
            "assistant.threads.setStatus": Method(self._set_status),
            "users.info": Method(self._user_info, json=False),
            "usergroups.users.list": Method(self._usergroup_users, json=False),
            "bots.info": Method(self._bot_info, json=False),
            "files.getUploadURLExternal": Method(self._get_upload_url, json=False),
            "files.completeUploadExternal": Method(self._complete_upload, json=False),
            "apps.connections.open": Method(
                self._connections_open, json=False, token="app", post_only=True
            ),
        }

    # --- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/api/{method}", self._api)
        app.router.add_get("/link/", self._link)
        app.router.add_post("/response/{key}", self._response_url)
        app.router.add_get("/files-pri/{ref}/download/{name}", self._download)
        app.router.add_get("/files-pri/{ref}/{name}", self._download)
        app.router.add_post("/upload/v1/{ticket}", self._upload)
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.base = f"http://127.0.0.1:{port}"
        self.url = self.base + "/api/"
        self._session = aiohttp.ClientSession()

    async def stop(self) -> None:
        for ws in list(self._sockets):
            await ws.close()
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeSlack:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
