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
signing), and the three faces `FakeSlack` mixes in: `web_api.py` (the methods),
`events.py` (what it sends to the app), `files.py` (files shared, downloaded and
uploaded) and `socket_mode.py`. This module keeps the server's
lifecycle, world building, what a person sees, and the Web API's dispatch.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import re
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import aiohttp
from aiohttp import web

from tests.fakes.slack.checks import FORM_JSON, rich_text, sign
from tests.fakes.slack.events import EventSender
from tests.fakes.slack.files import FileMethods, FilesState
from tests.fakes.slack.model import (
    Ack,
    Call,
    Channel,
    Ctx,
    Ephemeral,
    Integration,
    Message,
    Method,
    Reply,
    Status,
    Team,
    User,
    Version,
)
from tests.fakes.slack.rules import (
    DEFAULT_LIMITS,
    DEFAULT_SCOPES,
    STATUS_TIMEOUT,
    STREAM_LIFETIME,
    Bucket,
    Limit,
    SlackError,
)
from tests.fakes.slack.socket_mode import SocketModeServer
from tests.fakes.slack.web_api import WebApiMethods

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

T = TypeVar("T")

# Slack numbers attachments (`id`) and stores named colors as bare hex: danger -> a30200
# (bolt-python issue #760), warning -> daa038 (sYnfo/Yasuf #8); good's hex is unverified.
COLORS = {"danger": "a30200", "warning": "daa038", "good": "2eb886"}


def _as_stored(number: int, attachment: Mapping[str, Any]) -> dict[str, Any]:
    color = attachment.get("color")
    return {"id": number, **attachment, **({"color": COLORS.get(color, color)} if color else {})}


class FakeSlack(WebApiMethods, FileMethods, EventSender, SocketModeServer):
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

    # --- world building ----------------------------------------------------------------

    def _id(self, prefix: str) -> str:
        return f"{prefix}{next(self._ids):08d}"

    @property
    def bot_token(self) -> str:
        return self.team.bot_token

    @property
    def bot_user(self) -> str:
        return self.team.bot_user

    def add_team(self, name: str) -> Team:
        """A workspace with this app installed (its own bot user and xoxb- token)."""
        team_id = self._id("T")
        team = Team(
            id=team_id,
            name=name,
            domain=re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-"),
            bot_user=self._id("U"),
            bot_id=self._id("B"),
            bot_token=f"xoxb-{team_id}-{uuid.uuid4().hex}",
        )
        self.teams[team.id] = team
        self.users[team.bot_user] = User(team.bot_user, team.id, "subs", True, team.bot_id)
        return team

    def add_user(
        self, name: str, team: Team | None = None, *, display_name: str = "", real_name: str = ""
    ) -> User:
        team_id = (team or self.team).id
        user = User(self._id("U"), team_id, name, display_name=display_name, real_name=real_name)
        self.users[user.id] = user
        return user

    def add_external_user(self, name: str, org: str = "Partner Co") -> User:
        """A person of another organisation (Slack Connect): their team is not one this app
        is installed in, so messages they write in a shared channel carry their own
        `user_team` (Slack's events for shared channels; see `render`)."""
        user = User(self._id("U"), self._id("T"), name, real_name=f"{name} ({org})")
        self.users[user.id] = user
        return user

    def add_usergroup(self, handle: str, members: list[User]) -> str:
        """A user group (`@handle`) of the app's workspace; its id (`S…`)."""
        group = self._id("S")
        self.usergroups[group] = [u.id for u in members]
        return group

    def add_integration(
        self, name: str, *, classic: bool = False, team: Team | None = None
    ) -> Integration:
        """Another app (`classic`: an incoming webhook or classic app) that posts in channels."""
        team = team or self.team
        bot_user = None if classic else self._id("U")
        found = Integration(name, team.id, self._id("B"), self._id("A"), classic, bot_user)
        self.integrations[found.bot_id] = found
        if bot_user is not None:
            self.users[bot_user] = User(bot_user, team.id, name.lower(), True, found.bot_id)
        return found

    def post_as_integration(
        self,
        app: Integration,
        channel: Channel | str,
        payload: Mapping[str, Any],
        *,
        thread_ts: str | None = None,
    ) -> Message:
        """`app` posts `payload` (what it sends to chat.postMessage or its webhook: `text`,
        `blocks`, `attachments`, `username`, `icons`, `files`) as Slack stores it."""
        ch = self.channels[channel if isinstance(channel, str) else channel.id]
        extra = {k: payload[k] for k in ("username", "icons", "files", "upload") if k in payload}
        if isinstance(extra.get("files"), list):  # hosted here: its URLs are the fake's
            extra["files"] = [self.host_file(f, ch.team) for f in extra["files"]]
        if app.classic:
            extra = {"subtype": "bot_message", **extra}
        msg = Message(
            channel=ch.id,
            team=ch.team,
            ts=self._next_ts(),
            user=app.bot_user or "",
            text=str(payload.get("text") or ""),
            bot_id=app.bot_id,
            app_id=app.app_id,
            thread_ts=thread_ts,
            blocks=list(payload.get("blocks") or []),
            attachments=[
                _as_stored(i, a) for i, a in enumerate(payload.get("attachments") or [], start=1)
            ],
            extra=extra,
        )
        self._store(msg)
        return msg

    def edit_post(self, msg: Message, payload: Mapping[str, Any]) -> dict[str, Any]:
        """Its poster edits `msg` (`text`, `blocks`, `attachments` replaced as given, as an
        integration's `chat.update` or a person's edit does); returns the message as it was,
        for `changed_event`."""
        before = self.render(msg)
        if "text" in payload:
            msg.text = str(payload["text"])
        if "blocks" in payload:
            msg.blocks = list(payload["blocks"])
        if "attachments" in payload:
            msg.attachments = [_as_stored(i, a) for i, a in enumerate(payload["attachments"], 1)]
        msg.edited_ts = self._next_ts()
        self._touch(msg)
        return before

    def add_channel(
        self,
        name: str,
        *,
        team: Team | None = None,
        members: list[User] | None = None,
        bot_member: bool = True,
    ) -> Channel:
        """A public channel; everyone in `members` (default: the team's people) is in it."""
        team = team or self.team
        people = (
            members
            if members is not None
            else [u for u in self.users.values() if u.team == team.id and not u.is_bot]
        )
        ids = {u.id for u in people} | ({team.bot_user} if bot_member else set())
        channel = Channel(self._id("C"), team.id, name, False, ids)
        self.channels[channel.id] = channel
        self._messages[channel.id] = {}
        return channel

    def add_dm(self, user: User) -> Channel:
        """The app's DM (Messages tab) with a person."""
        team = self.teams[user.team]
        channel = Channel(self._id("D"), team.id, user.id, True, {user.id, team.bot_user}, user.id)
        self.channels[channel.id] = channel
        self._messages[channel.id] = {}
        return channel

    def post_as_user(
        self,
        channel: Channel | str,
        text: str,
        *,
        user: User | None = None,
        thread_ts: str | None = None,
    ) -> Message:
        """A person writes a message (it is then in the channel for the app to read)."""
        ch = self.channels[channel if isinstance(channel, str) else channel.id]
        user = user or self.user
        msg = Message(
            channel=ch.id,
            team=ch.team,
            ts=self._next_ts(),
            user=user.id,
            text=text,
            thread_ts=thread_ts,
            blocks=rich_text(text),
            client_msg_id=str(uuid.uuid4()),
        )
        self._store(msg)
        return msg

    def mention(self, text: str, team: Team | None = None) -> str:
        """`<@BOT> text`, as Slack writes a mention of the app."""
        return f"<@{(team or self.team).bot_user}> {text}"

    def advance(self, seconds: float) -> None:
        """Moves the fake's clock forward (rate windows refill, streams and statuses expire)."""
        self._offset += seconds

    def expire_stream(self, channel: str, ts: str) -> None:
        """Ends a stream server-side, as Slack does after ~5 minutes (notes §1.1)."""
        self.message(channel, ts).stream = "expired"

    def stop_stream_by_user(self, channel: str, ts: str) -> None:
        """The person pressed stop: further appends get `stopped_by_user`."""
        self.message(channel, ts).stream = "stopped_by_user"

    # --- what a person sees ------------------------------------------------------------

    def message(self, channel: str, ts: str) -> Message:
        """A message by channel and ts; KeyError if there is none (deleted ones included)."""
        return self._messages[channel][ts]

    def thread(self, channel: str, ts: str) -> list[Message]:
        """The parent and its replies, oldest first, without deleted messages."""
        return [m for m in self._thread(channel, ts) if not m.deleted]

    def by_app(self, msg: Message) -> bool:
        """Whether this app posted `msg` (not a person, not another app)."""
        return msg.app_id == self.app_id and msg.bot_id == self.teams[msg.team].bot_id

    def history(self, channel: str) -> list[Message]:
        """Top-level messages of a channel, oldest first."""
        return sorted(
            (m for m in self._messages[channel].values() if not m.is_reply and not m.deleted),
            key=lambda m: m.ts,
        )

    def edits(self, channel: str, ts: str) -> list[Version]:
        """Every visible version of a message, in order (a stream shows one per step)."""
        return list(self.message(channel, ts).versions)

    def status(self, channel: str, thread_ts: str) -> str:
        """The thread's status as shown now ('' when none, cleared by a reply, or timed out)."""
        history = self._statuses.get((channel, thread_ts))
        if not history:
            return ""
        last = history[-1]
        if last.cleared or self._now() - last.at > self.status_timeout * self.time_scale:
            return ""
        return last.status

    def statuses(self, channel: str, thread_ts: str) -> list[str]:
        """Every status the app set on a thread, in order."""
        return [s.status for s in self._statuses.get((channel, thread_ts), [])]

    def calls(self, method: str) -> list[Call]:
        return [c for c in self.requests if c.method == method]

    async def wait_for(self, method: str, count: int = 1, timeout: float = 5) -> list[Call]:
        """Returns the calls to `method` once there are `count`; TimeoutError after `timeout`."""
        return await self.until(
            lambda: self.calls(method) if len(self.calls(method)) >= count else None, timeout
        )

    # --- the Web API -------------------------------------------------------------------

    def _now(self) -> float:
        return self.clock() + self._offset

    def _next_ts(self) -> str:
        now = int((time.time() + self._offset) * 1_000_000)
        self._last_us = max(now, self._last_us + 1)
        return f"{self._last_us // 1_000_000}.{self._last_us % 1_000_000:06d}"

    async def _api(self, request: web.Request) -> web.Response:
        name = request.match_info["method"]
        call = Call(name, {}, time.time(), request.method, request.content_type)
        headers = {"x-slack-req-id": uuid.uuid4().hex}
        team: Team | None = None
        try:
            method = self._methods.get(name)
            if method is None:
                raise SlackError("unknown_method", req_method=name)
            call.args, token = await self._read(request, method.json)
            team = self._authenticate(token, method.token)
            if method.post_only and request.method != "POST":
                raise SlackError("insecure_request")
            wait = self._take(name, team, call.args)
            if wait:
                call.status = 429
                headers["Retry-After"] = str(wait)
                raise SlackError("ratelimited")
            call.response = {"ok": True, **method.handler(Ctx(team, call.args))}
        except SlackError as fail:
            call.response = {"ok": False, "error": fail.error, **fail.extra}
        if team is not None:
            headers["x-oauth-scopes"] = self.scopes
        self.requests.append(call)
        self._changed.set()
        return web.json_response(call.response, status=call.status, headers=headers)

    async def _read(self, request: web.Request, json_ok: bool) -> tuple[dict[str, Any], str | None]:
        """Query string + form or JSON body, as Slack merges them; and the token."""
        args: dict[str, Any] = dict(request.query)
        auth = request.headers.get("Authorization", "")
        token = auth[len("Bearer ") :].strip() if auth.startswith("Bearer ") else None
        if request.method == "POST" and request.body_exists:
            kind = request.content_type
            if kind == "application/json":
                raw = await request.read()
                if json_ok:
                    try:
                        body = json.loads(raw)
                    except ValueError:
                        raise SlackError("invalid_json") from None
                    if not isinstance(body, dict):
                        raise SlackError("invalid_json")
                    body.pop("token", None)  # a JSON body's token must be in Authorization
                    args.update(body)
            elif kind in ("application/x-www-form-urlencoded", "multipart/form-data"):
                form = await request.post()
                args.update({k: v for k, v in form.items() if isinstance(v, str)})
            else:
                raise SlackError("invalid_post_type" if kind else "missing_post_type")
        form_token = args.pop("token", None)
        token = token or form_token
        for name, error in FORM_JSON.items():
            if isinstance(args.get(name), str):
                try:
                    args[name] = json.loads(args[name])
                except ValueError:
                    raise SlackError(error) from None
        loading = args.get("loading_messages")
        if isinstance(loading, str):
            try:
                args["loading_messages"] = json.loads(loading)
            except ValueError:
                args["loading_messages"] = [m for m in loading.split(",") if m]
        return args, token

    def _authenticate(self, token: str | None, kind: str) -> Team | None:
        if not token:
            raise SlackError("not_authed")
        if token == self.app_token:
            if kind != "app":
                raise SlackError("not_allowed_token_type")
            return None
        team = next((t for t in self.teams.values() if t.bot_token == token), None)
        if team is None:
            raise SlackError("invalid_auth")
        if kind != "bot":
            raise SlackError("not_allowed_token_type")
        return team

    def _take(self, method: str, team: Team | None, args: Mapping[str, Any]) -> int:
        """0, or the Retry-After seconds (whole, at least 1: slack_sdk parses an int)."""
        limit = self.limits.get(method)
        if limit is None:
            return 0
        channel = str(args.get("channel", "")) if limit.per_channel else ""
        key = (team.id if team else "app", method, channel)
        now = self._now()
        bucket = self._buckets.setdefault(key, Bucket(float(limit.burst or limit.calls), now))
        wait = bucket.take(limit, now, self.time_scale)
        return max(1, math.ceil(wait)) if wait else 0

    async def until(self, check: Callable[[], T | None], timeout: float = 5) -> T:
        """Returns `check()` once it is not None; TimeoutError after `timeout` (no polling)."""
        async with asyncio.timeout(timeout):
            while True:
                found = check()
                if found is not None:
                    return found
                self._changed.clear()
                await self._changed.wait()
