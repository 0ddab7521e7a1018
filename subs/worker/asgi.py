"""The worker as an ASGI application, written to the ASGI 3 spec with no framework, so
it runs under any ASGI server and mounts in FastAPI or Starlette
(`app.mount("/worker", asgi_app(worker))`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from subs.worker.core import MAX_BODY, Reply, Worker

__all__ = ["asgi_app"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


def asgi_app(worker: Worker) -> App:
    """An ASGI app answering the engine's POSTs on any path it is mounted at."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            raise RuntimeError(f"a worker speaks HTTP, not {scope['type']}")
        if scope["method"] != "POST":
            await _send(send, Reply.error(405, "a worker answers POST only"), [(b"allow", b"POST")])
            return
        body = await _body(receive)
        if body is None:
            await _send(send, Reply.error(413, f"a request is at most {MAX_BODY} bytes"))
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        await _send(send, await worker.handle(body, headers))

    return app


async def _lifespan(receive: Receive, send: Send) -> None:
    """Nothing to start or stop: acknowledge both, so a server with lifespan on runs."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _body(receive: Receive) -> bytes | None:
    """The whole request body, or None past MAX_BODY."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


async def _send(send: Send, reply: Reply, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    headers = [(b"content-type", reply.content_type.encode()), *(extra or [])]
    if reply.stream is None:
        headers.append((b"content-length", str(len(reply.body)).encode()))
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    if reply.stream is None:
        await send({"type": "http.response.body", "body": reply.body})
        return
    async for chunk in reply.stream:
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b""})
