"""What the fake sends to the app: Events API envelopes and the events in them, slash
commands and block actions, as Slack builds them (each with a response_url for its reply)."""

from __future__ import annotations

import json
import time
import uuid
from base64 import b64encode
from typing import Any

from tests.fakes.slack.model import Channel, Message, Team, User


class EventPayloads:
    """The methods of `FakeSlack` that build what it sends to the app (mixed into it)."""

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

    def events_for(self, msg: Message) -> list[dict[str, Any]]:
        """Every event Slack sends this app for a new message, as its subscriptions ask
        (`self.subscriptions`): the `message` event (message.channels / message.groups /
        message.im), for apps' and integrations' posts too (empty `text` and all), and for a
        mention of the app outside a DM an `app_mention` as well. Each is delivered in its
        own envelope with its own event_id (slack-facts §3.3; that a mention comes both ways
        once channel messages are subscribed: Events API docs, "app_mention")."""
        channel = self.channels[msg.channel]
        team = self.teams[channel.team]
        found = []
        kind = "message.im" if channel.is_im else "message.channels"
        if kind in self.subscriptions:
            found.append(self.event_for(msg))
        mentioned = f"<@{team.bot_user}>" in msg.text and not self.by_app(msg)
        if mentioned and not channel.is_im and "app_mention" in self.subscriptions:
            found.append(self.event_for(msg, kind="app_mention"))
        return found

    def changed_event(self, msg: Message, previous: dict[str, Any]) -> dict[str, Any]:
        """The `message_changed` event for an edit of `msg` (`previous`: `render(msg)` from
        before the edit). Its own `ts` is the edit's, not the message's."""
        channel = self.channels[msg.channel]
        return {
            "type": "message",
            "subtype": "message_changed",
            "hidden": True,
            "message": self.render(msg),
            "previous_message": previous,
            "channel": channel.id,
            "channel_type": "im" if channel.is_im else "channel",
            "ts": self._next_ts(),
            "event_ts": msg.edited_ts or self._next_ts(),
        }

    def deleted_event(self, msg: Message) -> dict[str, Any]:
        """The `message_deleted` event once `msg` is gone."""
        channel = self.channels[msg.channel]
        ts = self._next_ts()
        return {
            "type": "message",
            "subtype": "message_deleted",
            "hidden": True,
            "deleted_ts": msg.ts,
            "previous_message": self.render(msg),
            "channel": channel.id,
            "channel_type": "im" if channel.is_im else "channel",
            "ts": ts,
            "event_ts": ts,
        }

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
            "user": {"id": user.id, "username": user.name, "name": user.name, "team_id": user.team},
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
