"""A typed client for a remote engine's HTTP API (SPEC §13), for scripts, the CLI and the bot.

`follow` resumes by itself: when the connection drops it reconnects with
`Last-Event-ID` set to the last event it yielded, so a caller sees every
event exactly once. It keeps trying while the engine cannot be reached, and says so
through `on_lost` (at the first failed attempt) and `on_back` (once it answers again).
Event streams are decoded by `engine.sse`. Any other call to an engine that cannot be
reached is a ClientError (code `unreachable`), not a traceback.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp

from engine.effects.http_pool import failure_name, failure_text, new_session
from engine.errors import ClientError
from engine.jsonedge import compact_json
from engine.session_client import SessionRow
from engine.sse import SseDecoder

# Dropped: resume from the last event yielded. Timeouts are ClientConnectionErrors too.
_DROPS = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError)


class HttpClient:
    """`http` is a session to share (its owner closes it); without one the client makes
    its own on first use, in the running loop, and `aclose` closes it."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        http: aiohttp.ClientSession | None = None,
        reconnect_delay: float = 0.5,
        connect_timeout: float | None = None,
        stream_silence: float | None = None,
        on_lost: Callable[[ClientError], None] | None = None,
        on_back: Callable[[], None] | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = http
        self._owned = http is None
        self.base_url = base_url.rstrip("/")
        self.headers = headers
        self.reconnect_delay = reconnect_delay
        self.connect_timeout = connect_timeout
        # An event stream quiet for this long is dead (the engine pings every 15 s when
        # idle): a host gone without closing its connections, met by reconnecting.
        self.stream_silence = stream_silence
        self.on_lost = on_lost
        self.on_back = on_back

    @property
    def http(self) -> aiohttp.ClientSession:
        """The HTTP session, made in the running loop on first use."""
        if self._http is None:
            if self.connect_timeout is None:
                self._http = new_session()
            else:
                self._http = new_session(sock_connect_timeout=self.connect_timeout)
        return self._http

    async def aclose(self) -> None:
        """Close the HTTP session if this client made it."""
        if self._owned and self._http is not None:
            await self._http.close()

    async def _object(
        self, method: str, path: str, body: Any = None, **params: Any
    ) -> dict[str, Any]:
        """`_call` for the routes that answer a JSON object: anything else is the engine's
        fault, said as one ClientError rather than a KeyError further on."""
        answer = await self._call(method, path, body, **params)
        if not isinstance(answer, dict):
            raise ClientError(
                f"{self.base_url}{path} answered {type(answer).__name__}, not a JSON object",
                code="invalid_response",
                status=502,
                detail={},
            )
        return answer

    async def _call(self, method: str, path: str, body: Any = None, **params: Any) -> Any:
        headers = self.headers
        data = None
        if body is not None or method in ("POST", "DELETE"):
            # Every write says JSON, a body-less one too: an open API refuses it otherwise.
            headers = {**headers, "Content-Type": "application/json"}
        if body is not None:
            data = compact_json(body).encode()
        try:
            async with self.http.request(
                method,
                self.base_url + path,
                data=data,
                params={k: v for k, v in params.items() if v is not None},
                headers=headers,
                allow_redirects=False,
            ) as response:
                content = await response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise self._unreachable(exc) from None
        if 200 <= response.status < 300:
            return json.loads(content) if content else None
        raise _refusal(response.status, content)

    def _unreachable(self, exc: BaseException) -> ClientError:
        name, text = failure_name(exc), failure_text(exc)
        return ClientError(
            f"cannot reach {self.base_url}: {name}"
            + (f": {text}" if text else "")
            + " (is an engine serving there? check the URL)",
            code="unreachable",
            status=503,
            detail={"error": name},
        )

    def _stream_timeout(self) -> aiohttp.ClientTimeout | None:
        """The session's timeouts, with a read bound when `stream_silence` is set."""
        if self.stream_silence is None:
            return None  # the session's own
        now = self.http.timeout
        return aiohttp.ClientTimeout(
            total=now.total,
            connect=now.connect,
            sock_connect=now.sock_connect,
            sock_read=self.stream_silence,
        )

    async def submit(
        self,
        payload: dict[str, Any],
        *,
        session_id: str | None = None,
        identity: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """`POST /api/client/sessions/input`, as `Client.submit`."""
        body: dict[str, Any] = {"input": payload}
        if session_id:
            body["session_id"] = session_id
        return await self._object("POST", "/api/client/sessions/input", body)

    async def session(self, session_id: str) -> dict[str, Any] | None:
        """None for a session the engine does not have, as `Client.session` says it."""
        try:
            return await self._object("GET", f"/api/client/sessions/{session_id}")
        except ClientError as err:
            if err.code == "unknown_session":
                return None
            raise

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
        """`POST .../calls/settle`, as `Client.settle`."""
        body: dict[str, Any] = {"id": call_id}
        if attempt is not None:
            body["attempt"] = attempt
        if error is not None:
            body.update(error=error, retryable=retryable)
        else:
            body["result"] = result
        return await self._object("POST", f"/api/machine/sessions/{session_id}/calls/settle", body)

    async def interrupt(self, session_id: str, reason: str, payload: Any = None) -> dict[str, Any]:
        """`POST .../interrupt`, as `Client.interrupt`."""
        body = {"reason": reason, "payload": payload}
        return await self._object("POST", f"/api/client/sessions/{session_id}/interrupt", body)

    async def cancel(self, session_id: str, reason: str | None = None) -> dict[str, Any]:
        """`POST .../cancel`, as `Client.cancel`."""
        body = {"reason": reason} if reason else {}
        return await self._object("POST", f"/api/client/sessions/{session_id}/cancel", body)

    async def delete(self, session_id: str) -> None:
        """`DELETE` the session, as `Client.delete`."""
        await self._call("DELETE", f"/api/client/sessions/{session_id}")

    async def events(self, session_id: str, after_seq: int = 0) -> list[dict[str, Any]]:
        """The whole log after `after_seq`, read page by page from the admin route."""
        out: list[dict[str, Any]] = []
        while True:
            page = await self._object(
                "GET", f"/api/admin/sessions/{session_id}/events", after_seq=after_seq, limit=500
            )
            events: list[dict[str, Any]] = page["events"]
            out += events
            if len(events) < 500:
                return out
            after_seq = events[-1]["seq"]

    async def sessions(self, offset: int = 0, limit: int = 50) -> list[str]:
        """Session ids, newest first, as `Client.sessions` gives them (every session, by
        its first event, paged by cursor past the first `offset`)."""
        ids: list[str] = []
        cursor: str | None = None
        while len(ids) < offset + limit:
            query: dict[str, Any] = {"sort": "first_event_desc", "top_level": "false"}
            query["limit"] = min(500, offset + limit - len(ids))
            if cursor is not None:
                query["cursor"] = cursor
            page = await self._object("GET", "/api/admin/sessions", **query)
            ids += [row["session_id"] for row in page["items"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        return ids[offset : offset + limit]

    async def session_rows(
        self, limit: int = 50, cursor: str | None = None
    ) -> tuple[list[SessionRow], str | None]:
        """One page of the admin list, and the next page's cursor (None on the last)."""
        query: dict[str, Any] = {"limit": limit}
        if cursor is not None:
            query["cursor"] = cursor
        page = await self._object("GET", "/api/admin/sessions", **query)
        rows: list[SessionRow] = page["items"]
        return rows, page["next_cursor"]

    async def dead_letters(self, limit: int = 100) -> list[dict[str, Any]]:
        """Inputs the engine could not apply, newest first."""
        page = await self._object("GET", "/api/admin/dead-letters", limit=limit)
        letters: list[dict[str, Any]] = page["dead_letters"]
        return letters

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
        from engine.machine.events import TURN_ENDS  # the machine: not for `sessions list`

        last = after_seq
        url = f"{self.base_url}/api/client/sessions/{session_id}/events/stream"
        lost = False  # said so through on_lost, not yet back
        while True:
            answered = False
            params: dict[str, Any] = {"after_seq": last}
            if turn_id:
                params["turn_id"] = turn_id
            headers = {
                **self.headers,
                "Accept": "text/event-stream",
                "Cache-Control": "no-store",
                "Last-Event-ID": str(last),
            }
            try:
                async with self.http.get(
                    url,
                    params=params,
                    headers=headers,
                    allow_redirects=False,
                    timeout=self._stream_timeout(),
                ) as response:
                    if not 200 <= response.status < 300:
                        raise _refusal(response.status, await response.read())
                    answered = True
                    if lost:
                        lost = False
                        if self.on_back is not None:
                            self.on_back()
                    decoder = SseDecoder()
                    async for chunk in response.content.iter_any():
                        for sse in decoder.feed(chunk):
                            if not sse.data:
                                continue  # `data:` with nothing after it: no JSON to read
                            if sse.event == "llm.token.delta":
                                yield "delta", json.loads(sse.data)
                                continue
                            data = json.loads(sse.data)
                            if "seq" not in data:
                                continue  # a control frame (e.g. stream.overflow): reconnect below
                            if data["seq"] <= last:
                                continue
                            last = data["seq"]
                            yield "event", data
                            ends = data["payload"]["type"] in TURN_ENDS
                            if turn_id and data.get("turn_id") == turn_id and ends:
                                return
            except _DROPS as exc:  # resume from the last event we yielded
                if not answered and not lost:  # not a drop: the engine did not answer
                    lost = True
                    if self.on_lost is not None:
                        self.on_lost(self._unreachable(exc))
            except UnicodeDecodeError as err:
                raise ClientError(
                    f"the event stream of {session_id} is not UTF-8 ({err.reason})",
                    code="invalid_response",
                    status=502,
                    detail={},
                ) from None
            await asyncio.sleep(self.reconnect_delay)


def _refusal(status: int, content: bytes) -> ClientError:
    """The API's `{"error", "code", ...}` answer as a ClientError; any other body quoted."""
    try:
        detail = json.loads(content)
    except ValueError:
        detail = None
    if not isinstance(detail, dict):
        detail = {"error": content[:200].decode("utf-8", "replace")}
    return ClientError(
        detail.pop("error", f"HTTP {status}"),
        code=detail.pop("code", "http_error"),
        status=status,
        detail=detail,
    )
