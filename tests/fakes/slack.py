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
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import math
import re
import time
import uuid
from base64 import b64decode, b64encode
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlencode

import aiohttp
from aiohttp import web

T = TypeVar("T")

# --- rate limits (notes §1.5, §3.3) ----------------------------------------------------


@dataclass(frozen=True)
class Limit:
    """`calls` per `per` Slack-seconds: a token bucket that holds `burst` calls (default `calls`).

    `per_channel` keys the bucket by channel as well (chat.postMessage's 1/s/channel rule).
    """

    calls: int
    per: float
    burst: int | None = None
    per_channel: bool = False


TIER_2 = Limit(20, 60)
TIER_3 = Limit(50, 60)
TIER_4 = Limit(100, 60)

# None = no limit: auth.test and setStatus are "special" tiers the notes give no number for;
# apps.connections.open is Tier 1 by slack_sdk's own comment, left open so reconnects stay fast.
DEFAULT_LIMITS: dict[str, Limit | None] = {
    # "one message per second per channel" with short bursts; the burst size is unverified.
    "chat.postMessage": Limit(1, 1, burst=3, per_channel=True),
    "chat.update": TIER_3,
    "chat.delete": TIER_3,
    "chat.postEphemeral": TIER_4,
    "chat.startStream": TIER_2,
    "chat.appendStream": TIER_4,
    "chat.stopStream": TIER_2,
    "conversations.replies": TIER_3,
    "conversations.history": TIER_3,
    "conversations.info": TIER_3,  # slack-api-ref docs.slack.dev/methods/conversations.info "t3"
    "reactions.add": TIER_3,
    "reactions.remove": TIER_2,
    "users.info": TIER_4,
    "auth.test": None,
    "assistant.threads.setStatus": None,
    "apps.connections.open": None,
}

# Sizes (notes §1.7, §5).
POST_TEXT_MAX = 40_000  # chat.postMessage / postEphemeral truncate above this (a warning)
UPDATE_TEXT_MAX = 4_000  # chat.update: msg_too_long
MARKDOWN_MAX = 12_000  # markdown_text and each markdown chunk: msg_too_long (error name unverified)
BLOCKS_MAX = 50  # blocks per message (unverified)
BLOCKS_TEXT_MAX = 12_000  # cumulative text in blocks: msg_blocks_too_long (undocumented)
SECTION_TEXT_MAX = 3_000
LOADING_MESSAGES_MAX = 10
STREAM_LIFETIME = 300.0  # streams end about 5 minutes after start (§1.1)
STATUS_TIMEOUT = 120.0  # a thread status clears after two minutes without a message (§1.4)

DEFAULT_SCOPES = (
    "app_mentions:read,assistant:write,channels:history,chat:write,commands,groups:history,"
    "im:history,im:write,reactions:write,users:read"
)


class SlackError(Exception):
    """A Slack error answer: `{"ok": false, "error": error, **extra}`."""

    def __init__(self, error: str, **extra: Any) -> None:
        super().__init__(error)
        self.error = error
        self.extra = extra


# --- state -----------------------------------------------------------------------------


@dataclass
class Team:
    id: str
    name: str
    domain: str
    bot_user: str
    bot_id: str
    bot_token: str


@dataclass
class User:
    id: str
    team: str
    name: str
    is_bot: bool = False
    bot_id: str | None = None


@dataclass
class Channel:
    id: str
    team: str
    name: str
    is_im: bool
    members: set[str]
    user: str | None = None  # the person in a DM
    created: int = field(default_factory=lambda: int(time.time()))


@dataclass
class Version:
    """One visible state of a message, and when it came to be (`time.time()`)."""

    text: str
    blocks: list[Any]
    tasks: list[dict[str, Any]]
    at: float = field(default=0.0, compare=False)

    @property
    def shown(self) -> str:
        """What a person reads: the text and every text inside the blocks."""
        return "\n".join([self.text, *_texts(self.blocks)])


@dataclass
class Message:
    channel: str
    team: str
    ts: str
    user: str
    text: str = ""
    bot_id: str | None = None  # set on the app's own messages
    app_id: str | None = None
    thread_ts: str | None = None
    blocks: list[Any] = field(default_factory=list)
    attachments: list[Any] = field(default_factory=list)
    metadata: dict[str, Any] | None = None
    markdown: bool = False  # text came as markdown_text / a stream
    client_msg_id: str | None = None
    reactions: dict[str, list[str]] = field(default_factory=dict)
    edited_ts: str | None = None
    deleted: bool = False
    # None (not a stream), streaming, stopped, expired, stopped_by_user
    stream: str | None = None
    stream_started: float = 0.0
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)
    plan_title: str | None = None
    versions: list[Version] = field(default_factory=list)

    @property
    def is_reply(self) -> bool:
        return self.thread_ts is not None and self.thread_ts != self.ts


@dataclass
class Ephemeral:
    channel: str
    user: str
    ts: str
    text: str
    blocks: list[Any]
    thread_ts: str | None


@dataclass
class Status:
    channel: str
    thread_ts: str
    status: str
    loading_messages: list[str]
    at: float
    cleared: bool = False


@dataclass
class Call:
    """One Web API request as the fake received it, and its answer."""

    method: str
    args: dict[str, Any]
    at: float  # time.time() on arrival
    http_method: str = "POST"
    content_type: str = ""
    status: int = 200
    response: dict[str, Any] = field(default_factory=dict)

    @property
    def error(self) -> str | None:
        return None if self.response.get("ok") else self.response.get("error")


@dataclass
class Ack:
    envelope_id: str
    payload: Any
    at: float


@dataclass
class Delivery:
    """What the app answered to a signed request the fake sent."""

    status: int
    text: str
    headers: dict[str, str]
    body: bytes  # exactly what was sent and signed
    payload: Any  # the envelope / command / action that was sent
    elapsed: float


@dataclass
class Reply:
    """A POST to a response_url the fake handed out (slash commands, actions)."""

    channel: str
    user: str
    body: dict[str, Any]
    message_ts: str | None


@dataclass
class _Bucket:
    tokens: float
    stamp: float

    def take(self, limit: Limit, now: float, scale: float) -> float:
        """Takes one call: 0, or the seconds until one is available."""
        rate = limit.calls / (limit.per * scale)
        self.tokens = min(limit.burst or limit.calls, self.tokens + (now - self.stamp) * rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / rate


@dataclass
class _Ctx:
    team: Team | None  # None for the app-level token
    args: dict[str, Any]


@dataclass
class _Method:
    handler: Callable[[_Ctx], dict[str, Any]]
    json: bool = True  # accepts application/json bodies (Slack's write methods)
    token: str = "bot"  # bot | app
    post_only: bool = False


_OUTER_TYPES = {"event_callback", "url_verification", "app_rate_limited"}
_FORM_JSON = {
    "blocks": "invalid_blocks_format",
    "attachments": "invalid_attachments",
    "metadata": "invalid_metadata_format",
    "chunks": "invalid_chunks",
}
_MENTION = re.compile(r"<@([A-Z0-9]+)>")
_TASK_STATUSES = {"pending", "in_progress", "complete", "error"}


def _flag(value: Any) -> bool:
    return value is True or str(value).lower() in ("1", "true")


def _required(args: Mapping[str, Any], name: str) -> str:
    value = args.get(name)
    if value is None or value == "":
        raise SlackError(
            "invalid_arguments",
            response_metadata={"messages": [f"[ERROR] missing required field: {name}"]},
        )
    return str(value)


def _texts(value: Any) -> Iterator[str]:
    """Every `text` string inside a block tree."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "text" and isinstance(item, str):
                yield item
            else:
                yield from _texts(item)
    elif isinstance(value, list):
        for item in value:
            yield from _texts(item)


def _invalid_blocks(message: str, pointer: str) -> SlackError:
    return SlackError(
        "invalid_blocks",
        response_metadata={"messages": [f"[ERROR] {message} [json-pointer:{pointer}]"]},
    )


def check_blocks(blocks: Any) -> list[dict[str, Any]]:
    """Slack's checks on `blocks` (notes §1.7, §5); returns them."""
    if not isinstance(blocks, list) or not all(
        isinstance(b, dict) and isinstance(b.get("type"), str) for b in blocks
    ):
        raise SlackError("invalid_blocks_format")
    if len(blocks) > BLOCKS_MAX:
        raise _invalid_blocks(f"no more than {BLOCKS_MAX} items allowed", "/blocks")
    for i, block in enumerate(blocks):
        if len(str(block.get("block_id", ""))) > 255:
            raise _invalid_blocks("must be less than 256 characters", f"/blocks/{i}/block_id")
        text = block.get("text")
        section = block["type"] == "section" and isinstance(text, dict)
        if section and len(str(text.get("text", ""))) > SECTION_TEXT_MAX:
            raise _invalid_blocks(
                f"must be less than {SECTION_TEXT_MAX + 1} characters", f"/blocks/{i}/text/text"
            )
        for j, element in enumerate(block.get("elements") or []):
            if not isinstance(element, dict) or element.get("type") != "button":
                continue
            where = f"/blocks/{i}/elements/{j}"
            label = element.get("text")
            label_text = label.get("text", "") if isinstance(label, dict) else ""
            for name, size, value in (
                ("text/text", 75, label_text),
                ("value", 2000, element.get("value", "")),
                ("action_id", 255, element.get("action_id", "")),
            ):
                if len(str(value)) > size:
                    raise _invalid_blocks(
                        f"must be less than {size + 1} characters", f"{where}/{name}"
                    )
    if sum(len(t) for t in _texts(blocks)) > BLOCKS_TEXT_MAX:
        raise SlackError("msg_blocks_too_long")
    return blocks


def _check_metadata(value: Any) -> dict[str, Any] | None:
    if value == {}:
        return None
    if not isinstance(value, dict):
        raise SlackError("invalid_metadata_format")
    if not isinstance(value.get("event_type"), str) or not isinstance(
        value.get("event_payload"), dict
    ):
        raise SlackError("invalid_metadata_schema")
    return value


def _check_chunks(value: Any) -> list[dict[str, Any]]:
    """Chunk objects (notes §1.1): markdown_text, plan_update, task_update, blocks."""
    if not isinstance(value, list):
        raise SlackError("invalid_chunks")
    for chunk in value:
        kind = chunk.get("type") if isinstance(chunk, dict) else None
        if kind == "markdown_text":
            if not isinstance(chunk.get("text"), str):
                raise SlackError("invalid_chunks")
            if len(chunk["text"]) > MARKDOWN_MAX:
                raise SlackError("msg_too_long")
        elif kind == "plan_update":
            if not isinstance(chunk.get("title"), str):
                raise SlackError("invalid_chunks")
        elif kind == "task_update":
            if not chunk.get("id") or not chunk.get("title"):
                raise SlackError("invalid_chunks")
            if chunk.get("status") not in _TASK_STATUSES:
                raise SlackError("invalid_chunks")
        elif kind == "blocks":
            check_blocks(chunk.get("blocks"))
        else:
            raise SlackError("invalid_chunks")
    return value


def rich_text(text: str) -> list[dict[str, Any]]:
    """The rich_text block Slack attaches to a person's message (mentions as user elements)."""
    elements: list[dict[str, Any]] = []
    pos = 0
    for match in _MENTION.finditer(text):
        if match.start() > pos:
            elements.append({"type": "text", "text": text[pos : match.start()]})
        elements.append({"type": "user", "user_id": match.group(1)})
        pos = match.end()
    if pos < len(text):
        elements.append({"type": "text", "text": text[pos:]})
    section = {"type": "rich_text_section", "elements": elements}
    return [{"type": "rich_text", "block_id": uuid.uuid4().hex[:5], "elements": [section]}]


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """X-Slack-Signature: v0=hex(HMAC_SHA256(secret, f"v0:{ts}:{body}")) (notes §3.2)."""
    base = b"v0:" + timestamp.encode() + b":" + body
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


# --- the server ------------------------------------------------------------------------


class FakeSlack:
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
        self.channels: dict[str, Channel] = {}
        self.ephemerals: list[Ephemeral] = []
        self.replies_sent: list[Reply] = []  # response_url posts
        self.envelopes: list[dict[str, Any]] = []  # sent over Socket Mode
        self.acks: dict[str, Ack] = {}
        self.connections = 0  # Socket Mode connections ever accepted
        self._messages: dict[str, dict[str, Message]] = {}
        self._statuses: dict[tuple[str, str], list[Status]] = {}
        self._buckets: dict[tuple[str, str, str], _Bucket] = {}
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

        self.app_id = self._id("A")
        self.app_token = f"xapp-1-{self.app_id}-{uuid.uuid4().hex}"
        self.team = self.add_team("Fake Team")
        self.user = self.add_user("alice")
        self.general = self.add_channel("general")
        self.dm = self.add_dm(self.user)
        self._methods: dict[str, _Method] = {
            "auth.test": _Method(self._auth_test, json=False),
            "chat.postMessage": _Method(self._post_message),
            "chat.update": _Method(self._update),
            "chat.delete": _Method(self._delete),
            "chat.postEphemeral": _Method(self._post_ephemeral),
            "chat.startStream": _Method(self._start_stream),
            "chat.appendStream": _Method(self._append_stream),
            "chat.stopStream": _Method(self._stop_stream),
            "conversations.replies": _Method(self._replies, json=False),
            "conversations.history": _Method(self._history, json=False),
            "conversations.info": _Method(self._info, json=False),
            "reactions.add": _Method(self._react),
            "reactions.remove": _Method(self._unreact),
            "assistant.threads.setStatus": _Method(self._set_status),
            "users.info": _Method(self._user_info, json=False),
            "apps.connections.open": _Method(
                self._connections_open, json=False, token="app", post_only=True
            ),
        }

    # --- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/api/{method}", self._api)
        app.router.add_get("/link/", self._link)
        app.router.add_post("/response/{key}", self._response_url)
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

    def add_user(self, name: str, team: Team | None = None) -> User:
        user = User(self._id("U"), (team or self.team).id, name)
        self.users[user.id] = user
        return user

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
            call.response = {"ok": True, **method.handler(_Ctx(team, call.args))}
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
        for name, error in _FORM_JSON.items():
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
        bucket = self._buckets.setdefault(key, _Bucket(float(limit.burst or limit.calls), now))
        wait = bucket.take(limit, now, self.time_scale)
        return max(1, math.ceil(wait)) if wait else 0

    # --- helpers shared by methods -----------------------------------------------------

    def _channel(self, ctx: _Ctx, ref: Any, *, member: bool = True) -> Channel:
        """Resolves an id, a #name or a user id (their DM); checks the bot may use it."""
        assert ctx.team is not None
        ref = str(ref or "")
        channel = self.channels.get(ref)
        if channel is None:
            for ch in self.channels.values():
                if ch.team == ctx.team.id and (
                    (not ch.is_im and ch.name == ref.lstrip("#")) or (ch.is_im and ch.user == ref)
                ):
                    channel = ch
        if channel is None or channel.team != ctx.team.id:
            raise SlackError("channel_not_found")
        if member and ctx.team.bot_user not in channel.members:
            raise SlackError("not_in_channel")
        return channel

    def _find(self, channel: Channel, ts: Any, error: str = "message_not_found") -> Message:
        msg = self._messages[channel.id].get(str(ts or ""))
        if msg is None or msg.deleted:
            raise SlackError(error)
        return msg

    def _own(self, ctx: _Ctx, msg: Message) -> bool:
        assert ctx.team is not None
        return msg.app_id == self.app_id and msg.bot_id == ctx.team.bot_id

    def _stream_state(self, msg: Message) -> str | None:
        limit = self.stream_lifetime * self.time_scale
        if msg.stream == "streaming" and self._now() - msg.stream_started > limit:
            msg.stream = "expired"
        return msg.stream

    def _store(self, msg: Message) -> None:
        self._messages[msg.channel][msg.ts] = msg
        self._touch(msg)
        if msg.bot_id and msg.thread_ts:
            for status in self._statuses.get((msg.channel, msg.thread_ts), []):
                status.cleared = True  # a reply from the app clears the thread status

    def _touch(self, msg: Message) -> None:
        version = Version(
            msg.text,
            json.loads(json.dumps(msg.blocks)),
            [dict(t) for t in msg.tasks.values()],
            time.time(),
        )
        if not msg.versions or msg.versions[-1] != version:
            msg.versions.append(version)

    def _thread(self, channel: str, ts: str) -> list[Message]:
        messages = self._messages[channel]
        root = messages.get(ts)
        if root is not None and root.is_reply and root.thread_ts is not None:
            root = messages.get(root.thread_ts, root)
        if root is None:
            return []
        replies = [m for m in messages.values() if m.thread_ts == root.ts and m is not root]
        return [root, *sorted(replies, key=lambda m: m.ts)]

    def _bot_message(self, ctx: _Ctx, channel: Channel, thread_ts: Any) -> Message:
        assert ctx.team is not None
        return Message(
            channel=channel.id,
            team=channel.team,
            ts=self._next_ts(),
            user=ctx.team.bot_user,
            bot_id=ctx.team.bot_id,
            app_id=self.app_id,
            thread_ts=str(thread_ts) if thread_ts else None,
        )

    def render(self, msg: Message, *, metadata: bool = True) -> dict[str, Any]:
        """A message as the Web API and events show it."""
        out: dict[str, Any] = {"type": "message", "user": msg.user, "text": msg.text}
        if msg.bot_id:
            team = self.teams[msg.team]
            out["bot_id"] = msg.bot_id
            out["app_id"] = msg.app_id
            out["bot_profile"] = {
                "id": msg.bot_id,
                "app_id": msg.app_id,
                "name": self.users[team.bot_user].name,
                "deleted": False,
                "team_id": team.id,
            }
        elif msg.client_msg_id:
            out["client_msg_id"] = msg.client_msg_id
        out["ts"] = msg.ts
        out["team"] = msg.team
        if msg.blocks:
            out["blocks"] = msg.blocks
        if msg.attachments:
            out["attachments"] = msg.attachments
        if msg.edited_ts:
            out["edited"] = {"user": msg.user, "ts": msg.edited_ts}
        replies = self.thread(msg.channel, msg.ts)[1:] if not msg.is_reply else []
        if msg.is_reply and msg.thread_ts is not None:
            out["thread_ts"] = msg.thread_ts
            parent = self._messages[msg.channel].get(msg.thread_ts)
            if parent is not None:
                out["parent_user_id"] = parent.user
        elif replies:
            users = list(dict.fromkeys(m.user for m in replies))
            out.update(
                thread_ts=msg.ts,
                reply_count=len(replies),
                reply_users_count=len(users),
                latest_reply=replies[-1].ts,
                reply_users=users,
                is_locked=False,
                subscribed=False,
            )
        if msg.reactions:
            out["reactions"] = [
                {"name": name, "users": users, "count": len(users)}
                for name, users in msg.reactions.items()
            ]
        if metadata and msg.metadata:
            out["metadata"] = msg.metadata
        return out

    def _content(self, args: Mapping[str, Any], *, text_max: int, truncate: bool) -> dict[str, Any]:
        """text / markdown_text / blocks / attachments of a post or an update, checked."""
        text, md = args.get("text"), args.get("markdown_text")
        blocks, attachments = args.get("blocks"), args.get("attachments")
        if md is not None and (text or blocks):
            raise SlackError("markdown_text_conflict")
        if md is not None:
            if len(str(md)) > MARKDOWN_MAX:
                raise SlackError("msg_too_long")
            return {"text": str(md), "markdown": True, "blocks": []}
        if not text and not blocks and not attachments:
            raise SlackError("no_text")
        out: dict[str, Any] = {}
        if blocks is not None:
            out["blocks"] = check_blocks(blocks)
        if attachments is not None:
            out["attachments"] = attachments
        if text is not None:
            text = str(text)
            if len(text) > text_max:
                if not truncate:
                    raise SlackError("msg_too_long")
                text = text[:text_max]
                out["warning"] = "message_truncated"
            out["text"], out["markdown"] = text, False
        return out

    @staticmethod
    def _apply(msg: Message, content: Mapping[str, Any]) -> dict[str, Any]:
        for name in ("text", "markdown", "blocks", "attachments"):
            if name in content:
                setattr(msg, name, content[name])
        if "warning" in content:
            return {
                "warning": content["warning"],
                "response_metadata": {"warnings": [content["warning"]]},
            }
        return {}

    # --- methods -----------------------------------------------------------------------

    def _auth_test(self, ctx: _Ctx) -> dict[str, Any]:
        team = ctx.team
        assert team is not None
        return {
            "url": f"https://{team.domain}.slack.com/",
            "team": team.name,
            "user": self.users[team.bot_user].name,
            "team_id": team.id,
            "user_id": team.bot_user,
            "bot_id": team.bot_id,
            "is_enterprise_install": False,
        }

    def _post_message(self, ctx: _Ctx) -> dict[str, Any]:
        channel = self._channel(ctx, ctx.args.get("channel"))
        content = self._content(ctx.args, text_max=POST_TEXT_MAX, truncate=True)
        metadata = _check_metadata(ctx.args["metadata"]) if "metadata" in ctx.args else None
        msg = self._bot_message(ctx, channel, ctx.args.get("thread_ts"))
        extra = self._apply(msg, content)
        msg.metadata = metadata
        self._store(msg)
        return {"channel": channel.id, "ts": msg.ts, "message": self.render(msg), **extra}

    def _update(self, ctx: _Ctx) -> dict[str, Any]:
        channel = self._channel(ctx, ctx.args.get("channel"))
        msg = self._find(channel, ctx.args.get("ts"))
        if not self._own(ctx, msg):
            raise SlackError("cant_update_message")
        if self._stream_state(msg) == "streaming":
            raise SlackError("streaming_state_conflict")
        content = self._content(ctx.args, text_max=UPDATE_TEXT_MAX, truncate=False)
        metadata = _check_metadata(ctx.args["metadata"]) if "metadata" in ctx.args else msg.metadata
        self._apply(msg, content)
        msg.metadata = metadata  # kept unless sent; {} removes it
        msg.edited_ts = self._next_ts()
        self._touch(msg)
        return {"channel": channel.id, "ts": msg.ts, "text": msg.text, "message": self.render(msg)}

    def _delete(self, ctx: _Ctx) -> dict[str, Any]:
        channel = self._channel(ctx, ctx.args.get("channel"))
        msg = self._find(channel, ctx.args.get("ts"))
        if not self._own(ctx, msg):
            raise SlackError("cant_delete_message")
        msg.deleted = True
        return {"channel": channel.id, "ts": msg.ts}

    def _post_ephemeral(self, ctx: _Ctx) -> dict[str, Any]:
        channel = self._channel(ctx, ctx.args.get("channel"))
        user = str(ctx.args.get("user") or "")
        if user not in channel.members:
            raise SlackError("user_not_in_channel")
        content = self._content(ctx.args, text_max=POST_TEXT_MAX, truncate=True)
        ts = self._next_ts()
        thread_ts = ctx.args.get("thread_ts")
        self.ephemerals.append(
            Ephemeral(
                channel.id,
                user,
                ts,
                content.get("text", ""),
                content.get("blocks", []),
                str(thread_ts) if thread_ts else None,
            )
        )
        return {"message_ts": ts}

    def _start_stream(self, ctx: _Ctx) -> dict[str, Any]:
        channel = self._channel(ctx, ctx.args.get("channel"))
        thread_ts = _required(ctx.args, "thread_ts")
        if not channel.is_im:
            if not ctx.args.get("recipient_user_id"):
                raise SlackError("missing_recipient_user_id")
            if not ctx.args.get("recipient_team_id"):
                raise SlackError("missing_recipient_team_id")
        msg = self._bot_message(ctx, channel, thread_ts)
        msg.markdown, msg.stream, msg.stream_started = True, "streaming", self._now()
        self._stream_in(msg, ctx.args)
        self._store(msg)
        return {"channel": channel.id, "ts": msg.ts}

    def _streaming(self, ctx: _Ctx) -> tuple[Channel, Message]:
        channel = self._channel(ctx, ctx.args.get("channel"))
        msg = self._find(channel, _required(ctx.args, "ts"))
        if msg.app_id != self.app_id:
            raise SlackError("message_not_owned_by_app")
        state = self._stream_state(msg)
        if state == "stopped_by_user":
            raise SlackError("stopped_by_user")
        if state != "streaming":
            raise SlackError("message_not_in_streaming_state")
        return channel, msg

    def _stream_in(self, msg: Message, args: Mapping[str, Any]) -> None:
        """Appends markdown_text and chunks to a streaming message."""
        md = args.get("markdown_text")
        if md is not None and len(str(md)) > MARKDOWN_MAX:
            raise SlackError("msg_too_long")
        chunks = _check_chunks(args["chunks"]) if "chunks" in args else []
        if md is not None:
            msg.text += str(md)
        for chunk in chunks:
            if chunk["type"] == "markdown_text":
                msg.text += chunk["text"]
            elif chunk["type"] == "plan_update":
                msg.plan_title = chunk["title"]
            elif chunk["type"] == "task_update":
                msg.tasks[chunk["id"]] = {**msg.tasks.get(chunk["id"], {}), **chunk}
            else:
                msg.blocks = [*msg.blocks, *chunk["blocks"]]

    def _append_stream(self, ctx: _Ctx) -> dict[str, Any]:
        channel, msg = self._streaming(ctx)
        if ctx.args.get("markdown_text") is None and not ctx.args.get("chunks"):
            raise SlackError("no_text")
        self._stream_in(msg, ctx.args)
        self._touch(msg)
        return {"channel": channel.id, "ts": msg.ts}

    def _stop_stream(self, ctx: _Ctx) -> dict[str, Any]:
        channel, msg = self._streaming(ctx)
        self._stream_in(msg, ctx.args)
        if ctx.args.get("blocks") is not None:
            msg.blocks = [*msg.blocks, *check_blocks(ctx.args["blocks"])]
        if "metadata" in ctx.args:
            msg.metadata = _check_metadata(ctx.args["metadata"])
        msg.stream = "stopped"
        self._touch(msg)
        return {"channel": channel.id, "ts": msg.ts, "message": self.render(msg)}

    def _page(
        self,
        messages: list[Message],
        args: Mapping[str, Any],
        default_limit: int,
        parent: Message | None = None,
    ) -> tuple[list[Message], dict[str, Any]]:
        """oldest/latest/inclusive, the parent first, then cursor + limit.

        A cursor is base64 'next_ts:<ts>' of the first message of the next page.
        """
        inclusive = _flag(args.get("inclusive"))
        oldest, latest = args.get("oldest"), args.get("latest")
        if oldest:
            messages = [m for m in messages if m.ts > oldest or (inclusive and m.ts == oldest)]
        if latest:
            messages = [m for m in messages if m.ts < latest or (inclusive and m.ts == latest)]
        if parent is not None:
            messages = [parent, *messages]
        cursor = args.get("cursor")
        if cursor:
            try:
                start = b64decode(str(cursor)).decode().removeprefix("next_ts:")
            except ValueError:
                raise SlackError("invalid_cursor") from None
            index = next((i for i, m in enumerate(messages) if m.ts == start), None)
            if index is None:
                raise SlackError("invalid_cursor")
            messages = messages[index:]
        limit = int(args.get("limit") or default_limit)
        page, rest = messages[:limit], messages[limit:]
        next_cursor = b64encode(f"next_ts:{rest[0].ts}".encode()).decode() if rest else ""
        return page, {"has_more": bool(rest), "response_metadata": {"next_cursor": next_cursor}}

    def _replies(self, ctx: _Ctx) -> dict[str, Any]:
        channel = self._channel(ctx, ctx.args.get("channel"))
        thread = self.thread(channel.id, _required(ctx.args, "ts"))
        if not thread:
            raise SlackError("thread_not_found")
        page, more = self._page(thread[1:], ctx.args, 1000, parent=thread[0])
        with_metadata = _flag(ctx.args.get("include_all_metadata"))
        return {"messages": [self.render(m, metadata=with_metadata) for m in page], **more}

    def _history(self, ctx: _Ctx) -> dict[str, Any]:
        channel = self._channel(ctx, ctx.args.get("channel"))
        newest_first = list(reversed(self.history(channel.id)))
        page, more = self._page(newest_first, ctx.args, 100)
        with_metadata = _flag(ctx.args.get("include_all_metadata"))
        return {"messages": [self.render(m, metadata=with_metadata) for m in page], **more}

    def _info(self, ctx: _Ctx) -> dict[str, Any]:
        ch = self._channel(ctx, ctx.args.get("channel"), member=False)
        assert ctx.team is not None
        if ch.is_im:
            body: dict[str, Any] = {
                "id": ch.id,
                "created": ch.created,
                "is_im": True,
                "is_org_shared": False,
                "user": ch.user,
                "is_open": True,
                "context_team_id": ch.team,
            }
        else:
            body = {
                "id": ch.id,
                "name": ch.name,
                "is_channel": True,
                "is_group": False,
                "is_im": False,
                "is_mpim": False,
                "is_private": False,
                "created": ch.created,
                "is_archived": False,
                "is_general": ch.name == "general",
                "name_normalized": ch.name,
                "is_member": ctx.team.bot_user in ch.members,
                "context_team_id": ch.team,
            }
        if _flag(ctx.args.get("include_num_members")):
            body["num_members"] = len(ch.members)
        return {"channel": body}

    def _reaction_target(self, ctx: _Ctx) -> tuple[Message, str]:
        if not ctx.args.get("channel") or not ctx.args.get("timestamp"):
            raise SlackError("no_item_specified")
        channel = self._channel(ctx, ctx.args.get("channel"))
        name = str(ctx.args.get("name") or "").strip(":")
        if not re.fullmatch(r"[a-z0-9_+\-']+(::skin-tone-[2-6])?", name):
            raise SlackError("invalid_name")
        return self._find(channel, ctx.args["timestamp"]), name

    def _react(self, ctx: _Ctx) -> dict[str, Any]:
        assert ctx.team is not None
        msg, name = self._reaction_target(ctx)
        users = msg.reactions.setdefault(name, [])
        if ctx.team.bot_user in users:
            raise SlackError("already_reacted")
        users.append(ctx.team.bot_user)
        return {}

    def _unreact(self, ctx: _Ctx) -> dict[str, Any]:
        assert ctx.team is not None
        msg, name = self._reaction_target(ctx)
        users = msg.reactions.get(name, [])
        if ctx.team.bot_user not in users:
            raise SlackError("no_reaction")
        users.remove(ctx.team.bot_user)
        if not users:
            del msg.reactions[name]
        return {}

    def _set_status(self, ctx: _Ctx) -> dict[str, Any]:
        channel = self._channel(ctx, ctx.args.get("channel_id"))
        thread_ts = str(ctx.args.get("thread_ts") or "")
        self._find(channel, thread_ts, "invalid_thread_ts")
        if "status" not in ctx.args:  # "" is allowed: it clears the status
            raise SlackError("invalid_arguments")
        loading = ctx.args.get("loading_messages") or []
        if not isinstance(loading, list) or len(loading) > LOADING_MESSAGES_MAX:
            raise SlackError("invalid_arguments")
        status = Status(channel.id, thread_ts, str(ctx.args["status"]), loading, self._now())
        self._statuses.setdefault((channel.id, thread_ts), []).append(status)
        return {}

    def _user_info(self, ctx: _Ctx) -> dict[str, Any]:
        user = self.users.get(str(ctx.args.get("user") or ""))
        if user is None:
            raise SlackError("user_not_found")
        profile: dict[str, Any] = {"real_name": user.name, "display_name": user.name}
        if user.bot_id:
            profile["bot_id"] = user.bot_id
        return {
            "user": {
                "id": user.id,
                "team_id": user.team,
                "name": user.name,
                "deleted": False,
                "real_name": user.name,
                "tz": "Europe/London",
                "is_bot": user.is_bot,
                "is_app_user": False,
                "profile": profile,
            }
        }

    def _connections_open(self, ctx: _Ctx) -> dict[str, Any]:
        ticket = uuid.uuid4().hex
        self._tickets.add(ticket)
        host = self.base.removeprefix("http://")
        return {"url": f"ws://{host}/link/?ticket={ticket}&app_id={self.app_id}"}

    # --- events the fake sends to the app ----------------------------------------------

    def event_for(self, msg: Message, *, kind: str = "message") -> dict[str, Any]:
        """The `message` (message.im / message.channels) or `app_mention` event for a message."""
        channel = self.channels[msg.channel]
        event: dict[str, Any] = {**self.render(msg, metadata=True), "type": kind}
        event.pop("reactions", None)
        event.update(channel=channel.id, event_ts=msg.ts)
        if kind == "message":
            event["channel_type"] = "im" if channel.is_im else "channel"
        else:
            event.pop("bot_profile", None)
        return event

    def envelope(
        self, event: dict[str, Any], *, event_id: str | None = None, team: Team | None = None
    ) -> dict[str, Any]:
        """An Events API `event_callback` envelope around an event."""
        team = team or self.teams.get(str(event.get("team")), self.team)
        return {
            "token": "fake-verification-token",
            "team_id": team.id,
            "context_team_id": team.id,
            "context_enterprise_id": None,
            "api_app_id": self.app_id,
            "event": event,
            "type": "event_callback",
            "event_id": event_id or f"Ev{uuid.uuid4().hex[:10].upper()}",
            "event_time": int(time.time()),
            "authorizations": [
                {
                    "enterprise_id": None,
                    "team_id": team.id,
                    "user_id": team.bot_user,
                    "is_bot": True,
                    "is_enterprise_install": False,
                }
            ],
            "is_ext_shared_channel": False,
            "event_context": "4-" + b64encode(json.dumps({"team": team.id}).encode()).decode(),
        }

    def _new_response_url(self, channel: str, user: str, message_ts: str | None) -> str:
        key = uuid.uuid4().hex
        self._response_urls[key] = (channel, user, message_ts)
        return f"{self.base}/response/{key}"

    def command_payload(
        self,
        command: str,
        text: str = "",
        *,
        user: User | None = None,
        channel: Channel | None = None,
    ) -> dict[str, str]:
        """A slash command's fields (form fields over HTTP, a JSON object over Socket Mode)."""
        user = user or self.user
        channel = channel or self.general
        team = self.teams[channel.team]
        return {
            "token": "fake-verification-token",
            "team_id": team.id,
            "team_domain": team.domain,
            "channel_id": channel.id,
            "channel_name": "directmessage" if channel.is_im else channel.name,
            "user_id": user.id,
            "user_name": user.name,
            "command": command,
            "text": text,
            "api_app_id": self.app_id,
            "is_enterprise_install": "false",
            "response_url": self._new_response_url(channel.id, user.id, None),
            "trigger_id": f"{int(time.time())}.{uuid.uuid4().int % 10**12}.{uuid.uuid4().hex}",
        }

    def block_action(
        self, msg: Message, action_id: str, *, value: str | None = None, user: User | None = None
    ) -> dict[str, Any]:
        """A person clicks a button on `msg`; LookupError if the message shows no such button."""
        buttons = (
            (block, element)
            for block in msg.blocks
            if block.get("type") == "actions"
            for element in block.get("elements") or []
            if element.get("action_id") == action_id
            and (value is None or element.get("value") == value)
        )
        found = next(buttons, None)
        if found is None or msg.deleted:
            raise LookupError(f"no button {action_id!r} on message {msg.ts}: nobody can click it")
        block, button = found
        user = user or self.user
        channel = self.channels[msg.channel]
        team = self.teams[channel.team]
        container: dict[str, Any] = {
            "type": "message",
            "message_ts": msg.ts,
            "channel_id": channel.id,
            "is_ephemeral": False,
        }
        if msg.thread_ts:
            container["thread_ts"] = msg.thread_ts
        action = {
            "action_id": action_id,
            "block_id": block.get("block_id", ""),
            "text": button.get("text"),
            "value": button.get("value"),
            "type": "button",
            "action_ts": self._next_ts(),
        }
        if "style" in button:
            action["style"] = button["style"]
        return {
            "type": "block_actions",
            "user": {"id": user.id, "username": user.name, "name": user.name, "team_id": team.id},
            "api_app_id": self.app_id,
            "token": "fake-verification-token",
            "container": container,
            "trigger_id": f"{int(time.time())}.{uuid.uuid4().int % 10**12}.{uuid.uuid4().hex}",
            "team": {"id": team.id, "domain": team.domain},
            "enterprise": None,
            "is_enterprise_install": False,
            "channel": {
                "id": channel.id,
                "name": "directmessage" if channel.is_im else channel.name,
            },
            "message": self.render(msg),
            "state": {"values": {}},
            "response_url": self._new_response_url(channel.id, user.id, msg.ts),
            "actions": [action],
        }

    async def send_event(
        self,
        url: str,
        payload: dict[str, Any],
        *,
        signing_secret: str | None = None,
        retry_num: int | None = None,
        retry_reason: str = "http_timeout",
        ts: float | None = None,
        timeout: float = 10,
    ) -> Delivery:
        """POSTs an Events API request, signed; `payload` is an event or a whole envelope.

        Re-send `delivery.payload` with `retry_num=1` for Slack's retry of the same event_id.
        """
        body = payload if payload.get("type") in _OUTER_TYPES else self.envelope(payload)
        headers = {}
        if retry_num is not None:
            headers = {"X-Slack-Retry-Num": str(retry_num), "X-Slack-Retry-Reason": retry_reason}
        raw = json.dumps(body).encode()
        return await self._send_signed(
            url, raw, "application/json", body, signing_secret, ts, headers, timeout
        )

    async def send_command(
        self,
        url: str,
        command: str,
        text: str = "",
        *,
        user: User | None = None,
        channel: Channel | None = None,
        signing_secret: str | None = None,
        ts: float | None = None,
        timeout: float = 10,
    ) -> Delivery:
        """POSTs a slash command, form-encoded and signed."""
        fields = self.command_payload(command, text, user=user, channel=channel)
        raw = urlencode(fields).encode()
        return await self._send_signed(
            url, raw, "application/x-www-form-urlencoded", fields, signing_secret, ts, {}, timeout
        )

    async def send_action(
        self,
        url: str,
        payload: dict[str, Any],
        *,
        signing_secret: str | None = None,
        ts: float | None = None,
        timeout: float = 10,
    ) -> Delivery:
        """POSTs an interactivity payload (form field `payload` = JSON), signed."""
        raw = urlencode({"payload": json.dumps(payload)}).encode()
        return await self._send_signed(
            url, raw, "application/x-www-form-urlencoded", payload, signing_secret, ts, {}, timeout
        )

    async def send_raw(
        self, url: str, raw: bytes, *, content_type: str = "application/json", timeout: float = 10
    ) -> Delivery:
        """POSTs `raw` as it is (JSON or not), signed as Slack signs: for malformed bodies."""
        return await self._send_signed(url, raw, content_type, None, None, None, {}, timeout)

    async def _send_signed(
        self,
        url: str,
        raw: bytes,
        content_type: str,
        payload: Any,
        secret: str | None,
        ts: float | None,
        extra: dict[str, str],
        timeout: float,
    ) -> Delivery:
        assert self._session is not None, "FakeSlack is not started"
        stamp = str(int(ts if ts is not None else time.time()))
        headers = {
            "Content-Type": content_type,
            "User-Agent": "Slackbot 1.0 (+https://api.slack.com/robots)",
            "X-Slack-Request-Timestamp": stamp,
            "X-Slack-Signature": sign(secret or self.signing_secret, stamp, raw),
            **extra,
        }
        started = time.monotonic()
        async with self._session.post(
            url, data=raw, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout)
        ) as response:
            text = await response.text()
            return Delivery(
                status=response.status,
                text=text,
                headers={k.lower(): v for k, v in response.headers.items()},
                body=raw,
                payload=payload,
                elapsed=time.monotonic() - started,
            )

    async def _response_url(self, request: web.Request) -> web.Response:
        """respond(): replace_original / delete_original / in_channel / ephemeral (default)."""
        target = self._response_urls.get(request.match_info["key"])
        if target is None:
            return web.json_response({"ok": False, "error": "expired_url"}, status=404)
        channel_id, user, message_ts = target
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return web.Response(status=400, text="invalid_payload")  # as incoming webhooks do
        self.replies_sent.append(Reply(channel_id, user, body, message_ts))
        original = self._messages[channel_id].get(message_ts) if message_ts else None
        text, blocks = str(body.get("text", "")), body.get("blocks") or []
        if original is not None and _flag(body.get("delete_original")):
            original.deleted = True
        elif original is not None and _flag(body.get("replace_original")):
            original.text, original.blocks = text, blocks
            original.edited_ts = self._next_ts()
            self._touch(original)
        elif body.get("response_type") == "in_channel":
            channel = self.channels[channel_id]
            team = self.teams[channel.team]
            msg = Message(
                channel=channel_id,
                team=team.id,
                ts=self._next_ts(),
                user=team.bot_user,
                text=text,
                bot_id=team.bot_id,
                app_id=self.app_id,
                thread_ts=body.get("thread_ts"),
                blocks=blocks,
            )
            self._store(msg)
        else:
            thread_ts = body.get("thread_ts")
            self.ephemerals.append(
                Ephemeral(channel_id, user, self._next_ts(), text, blocks, thread_ts)
            )
        self._changed.set()
        return web.json_response({"ok": True})

    # --- Socket Mode ---------------------------------------------------------------------

    async def _link(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("ticket") not in self._tickets:
            return web.Response(status=401, text="invalid ticket")
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        self._sockets.append(ws)
        self.connections += 1
        self._changed.set()
        try:
            await ws.send_json(
                {
                    "type": "hello",
                    "num_connections": len(self._sockets),
                    "debug_info": {
                        "host": "applink-fake",
                        "build_number": 1,
                        "approximate_connection_time": 18060,
                    },
                    "connection_info": {"app_id": self.app_id},
                }
            )
            async for frame in ws:
                if frame.type != aiohttp.WSMsgType.TEXT:
                    continue
                try:
                    data = json.loads(frame.data)
                except ValueError:
                    continue
                if isinstance(data, dict) and data.get("envelope_id"):
                    envelope_id = str(data["envelope_id"])
                    self.acks[envelope_id] = Ack(envelope_id, data.get("payload"), time.time())
                    self._changed.set()
        finally:
            self._sockets.remove(ws)
            self._changed.set()
        return ws

    @property
    def open_sockets(self) -> int:
        return len(self._sockets)

    async def wait_socket(self, count: int = 1, timeout: float = 5) -> None:
        """Returns once `count` Socket Mode connections are open."""
        await self.until(lambda: True if len(self._sockets) >= count else None, timeout)

    async def socket_send(
        self,
        kind: str,
        payload: dict[str, Any],
        *,
        accepts_response_payload: bool | None = None,
        retry_attempt: int = 0,
        retry_reason: str = "",
        timeout: float = 5,
    ) -> str:
        """Sends an envelope over an open connection (round robin); returns its envelope_id.

        `kind` is events_api (payload: an event or an envelope), slash_commands (a
        command_payload) or interactive (e.g. a block_action).
        """
        if kind == "events_api" and payload.get("type") not in _OUTER_TYPES:
            payload = self.envelope(payload)
        await self.wait_socket(1, timeout)
        envelope: dict[str, Any] = {
            "envelope_id": str(uuid.uuid4()),
            "payload": payload,
            "type": kind,
            # events_api never takes a response payload; the others may (unverified per type)
            "accepts_response_payload": (
                kind != "events_api"
                if accepts_response_payload is None
                else accepts_response_payload
            ),
        }
        if kind == "events_api":
            envelope.update(retry_attempt=retry_attempt, retry_reason=retry_reason)
        ws = self._sockets[self._next_socket % len(self._sockets)]
        self._next_socket += 1
        await ws.send_str(json.dumps(envelope))
        self.envelopes.append(envelope)
        return envelope["envelope_id"]

    async def socket_disconnect(self, reason: str = "refresh_requested") -> None:
        """Tells every connection to reconnect, as Slack does before it closes one."""
        for ws in list(self._sockets):
            debug = {"host": "applink-fake"}
            await ws.send_json({"type": "disconnect", "reason": reason, "debug_info": debug})

    async def wait_ack(self, envelope_id: str, timeout: float = 5) -> Ack:
        """The app's ack of an envelope; TimeoutError after `timeout`."""
        return await self.until(lambda: self.acks.get(envelope_id), timeout)

    async def until(self, check: Callable[[], T | None], timeout: float = 5) -> T:
        """Returns `check()` once it is not None; TimeoutError after `timeout` (no polling)."""
        async with asyncio.timeout(timeout):
            while True:
                found = check()
                if found is not None:
                    return found
                self._changed.clear()
                await self._changed.wait()
