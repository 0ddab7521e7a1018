"""Socket Mode: apps.connections.open (the app token's ticket), the WebSocket link the app
opens with it, envelopes sent over it, and their acks."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import aiohttp
from aiohttp import web

from tests.fakes.slack.checks import OUTER_TYPES
from tests.fakes.slack.model import Ack, Ctx


class SocketModeServer:
    """The methods of `FakeSlack` that serve Socket Mode (mixed into it)."""

    # --- Socket Mode ---------------------------------------------------------------------

    def _connections_open(self, ctx: Ctx) -> dict[str, Any]:
        ticket = uuid.uuid4().hex
        self._tickets.add(ticket)
        host = self.base.removeprefix("http://")
        return {"url": f"ws://{host}/link/?ticket={ticket}&app_id={self.app_id}"}

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
        if kind == "events_api" and payload.get("type") not in OUTER_TYPES:
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
