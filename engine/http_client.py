"""A typed client for a remote engine's HTTP API (SPEC §13), for scripts, the CLI and the bot.

`follow` resumes by itself: when the connection drops it reconnects with
`Last-Event-ID` set to the last event it yielded, so a caller sees every
event exactly once.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
from httpx_sse import aconnect_sse

from .client import ClientError

_TURN_ENDS = ("turn.completed", "turn.failed")


class HttpClient:
    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        http: httpx.AsyncClient | None = None,
        reconnect_delay: float = 0.5,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = http or httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=None))
        self.base_url = base_url.rstrip("/")
        self.headers = headers
        self.reconnect_delay = reconnect_delay

    async def aclose(self) -> None:
        await self.http.aclose()

    async def _call(self, method: str, path: str, body: Any = None, **params: Any) -> Any:
        response = await self.http.request(
            method,
            self.base_url + path,
            json=body,
            params={k: v for k, v in params.items() if v is not None},
            headers=self.headers,
        )
        if response.is_success:
            return response.json()
        try:
            detail = response.json()
        except ValueError:
            detail = {"error": response.text[:200]}
        raise ClientError(
            detail.pop("error", f"HTTP {response.status_code}"),
            code=detail.pop("code", "http_error"),
            status=response.status_code,
            detail=detail,
        )

    async def submit(
        self,
        payload: dict[str, Any],
        *,
        session_id: str | None = None,
        identity: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"input": payload}
        if session_id:
            body["session_id"] = session_id
        return await self._call("POST", "/api/client/sessions/input", body)

    async def session(self, session_id: str) -> dict[str, Any]:
        return await self._call("GET", f"/api/client/sessions/{session_id}")

    async def settle(
        self,
        session_id: str,
        call_id: str,
        *,
        attempt: int | None = None,
        result: Any = None,
        error: str | None = None,
        retryable: bool = False,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"id": call_id}
        if attempt is not None:
            body["attempt"] = attempt
        if error is not None:
            body.update(error=error, retryable=retryable)
        else:
            body["result"] = result
        return await self._call("POST", f"/api/machine/sessions/{session_id}/calls/settle", body)

    async def interrupt(self, session_id: str, reason: str, payload: Any = None) -> dict[str, Any]:
        body = {"reason": reason, "payload": payload}
        return await self._call("POST", f"/api/client/sessions/{session_id}/interrupt", body)

    async def events(self, session_id: str, after_seq: int = 0) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while True:
            page = await self._call(
                "GET", f"/api/admin/sessions/{session_id}/events", after_seq=after_seq, limit=500
            )
            events = page["events"] if isinstance(page, dict) else page
            out += events
            if len(events) < 500:
                return out
            after_seq = events[-1]["seq"]

    async def sessions(self, offset: int = 0, limit: int = 50) -> list[dict[str, Any]]:
        page = await self._call("GET", "/api/admin/sessions", offset=offset, limit=limit)
        return page["sessions"] if isinstance(page, dict) else page

    async def dead_letters(self, limit: int = 100) -> list[dict[str, Any]]:
        page = await self._call("GET", "/api/admin/dead-letters", limit=limit)
        return page["dead_letters"]

    async def delta_cursor(self, session_id: str) -> str:
        """The event stream interleaves the deltas of the call in flight itself."""
        return "0-0"

    async def follow(
        self,
        session_id: str,
        after_seq: int = 0,
        *,
        turn_id: str | None = None,
        delta_cursor: str | None = None,
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """`("event", Event)` and `("delta", TokenDelta)` as they come; resumes after a drop.

        With `turn_id` it ends once that turn has ended; without, it runs until cancelled.
        """
        last = after_seq
        url = f"{self.base_url}/api/client/sessions/{session_id}/events/stream"
        while True:
            params: dict[str, Any] = {"after_seq": last}
            if turn_id:
                params["turn_id"] = turn_id
            headers = {**self.headers, "Last-Event-ID": str(last)}
            try:
                async with aconnect_sse(
                    self.http, "GET", url, params=params, headers=headers
                ) as source:
                    if not source.response.is_success:
                        await source.response.aread()
                        detail = source.response.json()
                        raise ClientError(
                            detail.get("error", "cannot follow"),
                            code=detail.get("code", "http_error"),
                            status=source.response.status_code,
                            detail=detail,
                        )
                    async for sse in source.aiter_sse():
                        if not sse.data:
                            continue  # a heartbeat comment, decoded as an empty frame
                        data = json.loads(sse.data)
                        if sse.event == "llm.token.delta":
                            yield "delta", data
                            continue
                        if "seq" not in data:
                            continue  # a control frame (e.g. stream.overflow): reconnect below
                        if data["seq"] <= last:
                            continue
                        last = data["seq"]
                        yield "event", data
                        ends = data["payload"]["type"] in _TURN_ENDS
                        if turn_id and data.get("turn_id") == turn_id and ends:
                            return
            except (httpx.TransportError, httpx.RemoteProtocolError):
                pass  # dropped: resume from the last event we yielded
            await asyncio.sleep(self.reconnect_delay)
