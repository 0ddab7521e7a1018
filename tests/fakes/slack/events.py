"""What the fake sends to the app: Events API envelopes, slash commands and block actions,
signed as Slack signs them, and the response_url posts the app sends back."""

from __future__ import annotations

import json
import time
import uuid
from base64 import b64encode
from typing import Any
from urllib.parse import urlencode

import aiohttp
from aiohttp import web

from tests.fakes.slack.checks import OUTER_TYPES, flag, sign
from tests.fakes.slack.model import Channel, Delivery, Ephemeral, Message, Reply, Team, User


class EventSender:
    """The methods of `FakeSlack` that deliver events to the app (mixed into it)."""

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
        body = payload if payload.get("type") in OUTER_TYPES else self.envelope(payload)
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
        if original is not None and flag(body.get("delete_original")):
            original.deleted = True
        elif original is not None and flag(body.get("replace_original")):
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
