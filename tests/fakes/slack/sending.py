"""How the fake delivers to the app over HTTP: POSTs signed as Slack signs them (events,
slash commands, interactivity, raw bodies), and the response_url posts the app sends back."""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import urlencode

import aiohttp
from aiohttp import web

from tests.fakes.slack.checks import OUTER_TYPES, flag, sign
from tests.fakes.slack.model import Channel, Delivery, Ephemeral, Message, Reply, User


class EventSender:
    """The methods of `FakeSlack` that deliver to the app and take its replies (mixed into it)."""

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
