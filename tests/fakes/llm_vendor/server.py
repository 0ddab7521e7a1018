"""The vendor's server: a real aiohttp server on 127.0.0.1, port 0, with one route per
vendor format. Each request is recorded, pops the oldest scripted reply (or asks the
responder, or takes the default) and is answered in the format of the route that received
it, as a JSON body or an event stream (the request's `stream` decides)."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from aiohttp import web

from tests.fakes.llm_vendor.answer import build_answer
from tests.fakes.llm_vendor.anthropic_messages import ANTHROPIC_PATH, Anthropic
from tests.fakes.llm_vendor.openai_chat import OPENAI_PATH, OpenAI
from tests.fakes.llm_vendor.openrouter import OPENROUTER_PATH, OpenRouter
from tests.fakes.llm_vendor.script import (
    CutStream,
    HttpError,
    InStreamError,
    Raw,
    Recorded,
    Reply,
    Text,
    ToolCalls,
)
from tests.fakes.llm_vendor.vendor import Vendor
from tests.fakes.prompt_cache import CacheUse, PromptCaches, TooManyBreakpoints

# The route each vendor format answers on.
VENDORS: dict[str, type[Vendor]] = {
    OPENAI_PATH: OpenAI,
    OPENROUTER_PATH: OpenRouter,
    ANTHROPIC_PATH: Anthropic,
}


class FakeVendor:
    """A scripted vendor server; see the package docstring."""

    def __init__(self, *, seed: int = 0) -> None:
        self.url = ""
        self.default: Reply | None = None
        # Chooses a reply from the request when the script is empty (many sessions at once).
        self.responder: Callable[[Any], Reply] | None = None
        self.requests: list[Recorded] = []
        # Requests being answered now (arrived, response not yet ended), and the most ever.
        self.in_flight = 0
        self.max_in_flight = 0
        self.durations: list[float] = []  # seconds each answered request took, in end order
        self._script: deque[Reply] = deque()
        self._arrived = asyncio.Event()
        self._rng = random.Random(seed)
        self._runner: web.AppRunner | None = None
        self.caches = PromptCaches()

    async def start(self) -> None:
        app = web.Application()
        for path in (OPENAI_PATH, OPENROUTER_PATH, ANTHROPIC_PATH):
            app.router.add_post(path, self._handle)
        # handler_cancellation: a client that hangs up mid-stream cancels its handler.
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeVendor:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def openai_base(self) -> str:
        return self.url + "/v1"

    def openrouter_base(self) -> str:
        return self.url + "/api/v1"

    def anthropic_base(self) -> str:
        return self.url

    def push(self, *replies: Reply) -> None:
        """Queues replies; each request, on any route, takes the oldest."""
        self._script.extend(replies)

    async def wait_for_requests(self, n: int, timeout: float = 10) -> None:
        """Returns once at least `n` requests have arrived; TimeoutError after `timeout`."""
        async with asyncio.timeout(timeout):
            while len(self.requests) < n:
                self._arrived.clear()
                await self._arrived.wait()

    # --- handling ----------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        began = time.monotonic()
        try:
            return await self._answer_request(request)
        finally:
            self.in_flight -= 1
            self.durations.append(time.monotonic() - began)

    async def _answer_request(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        headers = {name.lower(): value for name, value in request.headers.items()}
        assert request.transport is not None
        host, port = request.transport.get_extra_info("peername")[:2]
        peer = f"{host}:{port}"
        self.requests.append(Recorded(request.path, headers, body, time.time(), peer, raw))
        self._arrived.set()
        vendor = VENDORS[request.path](self._rng, body if isinstance(body, dict) else {})
        use = self._cache_use(request.path, body)
        if isinstance(use, TooManyBreakpoints):
            return vendor.refuse(use)
        if self._script:
            reply = self._script.popleft()
        elif self.responder is not None:
            reply = self.responder(body)
        else:
            reply = self.default
        if reply is None:
            return web.json_response(
                {"error": {"message": "FakeVendor: the script ran out of replies."}},
                status=500,
            )
        if isinstance(reply, Raw):
            return web.Response(
                status=reply.status, body=reply.body, headers={"Content-Type": reply.content_type}
            )
        if isinstance(reply, HttpError):
            return vendor.error(reply)
        answer = build_answer(reply, body, use, vendor.call_id)
        delay = reply.chunk_delay if isinstance(reply, Text | ToolCalls) else 0.0
        if not vendor.streaming:
            if delay:
                await asyncio.sleep(delay)  # a slow vendor, not a test's synchronisation
            return vendor.whole(answer)
        rendered = vendor.stream(answer)
        frames, cut = rendered.frames, False
        if isinstance(reply, CutStream | InStreamError):
            frames = _first_chunks(frames, reply.after_chunks, rendered.finish_at)
            if isinstance(reply, InStreamError):
                frames.append(vendor.stream_error())
            cut = isinstance(reply, CutStream) and reply.abort
        end_delay = reply.end_delay if isinstance(reply, Text) else 0.0
        return await self._send_stream(
            request, vendor.stream_headers(), frames, delay, cut, end_delay
        )

    def _cache_use(self, path: str, body: Any) -> CacheUse | TooManyBreakpoints:
        """What the route's vendor reads from and writes to its prompt cache."""
        if not isinstance(body, dict):
            return CacheUse()
        if path == ANTHROPIC_PATH:
            return self.caches.anthropic(body, chat=False)
        if path == OPENROUTER_PATH and str(body.get("model", "")).startswith("anthropic/"):
            return self.caches.anthropic(body, chat=True)
        return self.caches.openai(body)

    @property
    def connections(self) -> int:
        """How many connections the recorded requests came over."""
        return len({r.peer for r in self.requests})

    def sending(self, frame: bytes) -> None:
        """Called as each stream frame goes out; a benchmark overrides it to time tokens."""

    async def _send_stream(
        self,
        request: web.Request,
        headers: dict[str, str],
        frames: list[bytes],
        delay: float,
        cut: bool,
        end_delay: float = 0.0,
    ) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers=headers)
        await response.prepare(request)
        try:
            for frame in frames:
                if delay:
                    await asyncio.sleep(delay)  # a slow vendor, not a test's synchronisation
                self.sending(frame)
                await response.write(frame)
            if cut:
                # Close mid-body: the chunked encoding never gets its last chunk.
                assert request.transport is not None
                request.transport.close()
                return response
            if end_delay:
                await asyncio.sleep(end_delay)  # a slow network, not a test's synchronisation
            await response.write_eof()
        except ConnectionResetError:
            pass  # the client hung up; nothing to finish
        return response


def _first_chunks(frames: list[bytes], n: int, finish_at: int) -> list[bytes]:
    """The first `n` data frames (comments ride along), never reaching the finish."""
    out: list[bytes] = []
    taken = 0
    for index, frame in enumerate(frames):
        if index >= finish_at or (taken >= n and not frame.startswith(b":")):
            break
        out.append(frame)
        if not frame.startswith(b":"):
            taken += 1
    return out
