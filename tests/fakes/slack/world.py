"""The world a test builds: workspaces, people, channels, other apps and what they post,
with the fake's ids and its clock (which `advance` moves without sleeping)."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Mapping
from typing import Any

from tests.fakes.slack.checks import rich_text
from tests.fakes.slack.model import Channel, Integration, Message, Team, User

# Slack numbers attachments (`id`) and stores named colors as bare hex: danger -> a30200
# (bolt-python issue #760), warning -> daa038 (sYnfo/Yasuf #8); good's hex is unverified.
COLORS = {"danger": "a30200", "warning": "daa038", "good": "2eb886"}


def _as_stored(number: int, attachment: Mapping[str, Any]) -> dict[str, Any]:
    color = attachment.get("color")
    return {"id": number, **attachment, **({"color": COLORS.get(color, color)} if color else {})}


class WorldBuilding:
    """The methods of `FakeSlack` that build its world and keep its ids and clock (mixed in)."""

    def _id(self, prefix: str) -> str:
        return f"{prefix}{next(self._ids):08d}"

    @property
    def bot_token(self) -> str:
        return self.team.bot_token

    @property
    def bot_user(self) -> str:
        return self.team.bot_user

    def _now(self) -> float:
        return self.clock() + self._offset

    def _next_ts(self) -> str:
        now = int((time.time() + self._offset) * 1_000_000)
        self._last_us = max(now, self._last_us + 1)
        return f"{self._last_us // 1_000_000}.{self._last_us % 1_000_000:06d}"

    def advance(self, seconds: float) -> None:
        """Moves the fake's clock forward (rate windows refill, streams and statuses expire)."""
        self._offset += seconds

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

    def expire_stream(self, channel: str, ts: str) -> None:
        """Ends a stream server-side, as Slack does after ~5 minutes (notes §1.1)."""
        self.message(channel, ts).stream = "expired"

    def stop_stream_by_user(self, channel: str, ts: str) -> None:
        """The person pressed stop: further appends get `stopped_by_user`."""
        self.message(channel, ts).stream = "stopped_by_user"
