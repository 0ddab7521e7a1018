"""The worker as an aiohttp application (aiohttp is already the engine's dependency)."""

from __future__ import annotations

from aiohttp import web

from subs.worker.core import MAX_BODY, Worker

__all__ = ["aiohttp_app"]


def aiohttp_app(worker: Worker, path: str = "/") -> web.Application:
    """An app that answers the engine's POSTs at `path`; run it with `web.run_app`, or
    add it to your own with `app.add_subapp`."""

    async def decide(request: web.Request) -> web.StreamResponse:
        body = await request.read()  # the raw bytes: the signature covers exactly these
        reply = await worker.handle(body, request.headers)
        if reply.stream is None:
            return web.Response(
                status=reply.status, body=reply.body, content_type="application/json"
            )
        response = web.StreamResponse(
            status=reply.status, headers={"Content-Type": reply.content_type}
        )
        await response.prepare(request)
        try:
            async for chunk in reply.stream:
                await response.write(chunk)
            await response.write_eof()
        except ConnectionResetError:
            pass  # the engine may stop reading once it has the decision.result
        return response

    app = web.Application(client_max_size=MAX_BODY)
    app.router.add_post(path, decide)
    return app
