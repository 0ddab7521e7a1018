"""The fake's world: workspaces, users, channels, messages and their versions, and what it
records (calls, acks, deliveries, response_url posts)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.fakes.slack.checks import texts

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
    display_name: str = ""  # the profile's; people often leave it empty
    real_name: str = ""  # the profile's full name; `name` when empty


@dataclass
class Integration:
    """Another app or integration of the workspace that posts (a monitoring tool).

    `classic`: an incoming webhook or a classic app, whose posts are `subtype: bot_message`
    with `bot_id` and `username` and no `user`; else a modern app with a bot user, whose
    posts carry `user`, `bot_id` and `bot_profile` and no subtype (oncall-facts §1.0:
    bolt-python PR #198's two payloads, python-slack-sdk issue #229).
    """

    name: str
    team: str
    bot_id: str
    app_id: str
    classic: bool
    bot_user: str | None = None


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
        return "\n".join([self.text, *texts(self.blocks)])


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
    # Fields kept as the poster sent them (an integration's `subtype`, `username`, `icons`,
    # `files`): shown in the Web API and events as they are.
    extra: dict[str, Any] = field(default_factory=dict)

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
class Ctx:
    team: Team | None  # None for the app-level token
    args: dict[str, Any]


@dataclass
class Method:
    handler: Callable[[Ctx], dict[str, Any]]
    json: bool = True  # accepts application/json bodies (Slack's write methods)
    token: str = "bot"  # bot | app
    post_only: bool = False
