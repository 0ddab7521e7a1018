"""The API as one aiohttp app (SPEC §13): its shared state, the middleware order, the
routes, and the shutdown hooks that end open streams and the shared reader."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from aiohttp import web

from engine.api import agui
from engine.api.admin import (
    admin_budgets,
    admin_dead_letters,
    admin_events,
    admin_sessions,
    get_healthz,
    get_metrics,
)
from engine.api.auth import ApiKeys
from engine.api.chat_page import add_chat_routes
from engine.api.client_tokens import ClientTokens
from engine.api.console import add_console_routes
from engine.api.fanout import Hub
from engine.api.hooks import post_alertmanager
from engine.api.local import allowed_hosts
from engine.api.machine import post_client_token, post_machine_submit, post_worker_submit
from engine.api.middleware import (
    authenticate,
    console_headers,
    cors_headers,
    local_only,
    preflight,
    render_errors,
)
from engine.api.sessions import (
    delete_session,
    get_session,
    post_cancel,
    post_input,
    post_interrupt,
    post_settle,
    stream_events,
)
from engine.api.state import API, ApiState
from engine.api.stream import SseLimits, sse_frame
from engine.client import Client
from engine.landing import AlertHook, Lander
from engine.metrics import Metrics
from engine.store.store import Store


def make_runner(app: web.Application, *, header_timeout: float, **kw: Any) -> web.AppRunner:
    """The runner `subs serve` serves `app` with: handlers cancelled when their client
    hangs up, and a request's headers given `header_timeout` seconds to arrive (from the
    connection's start, or the previous answer's end) before the connection is closed, so
    a client that trickles them (slow-loris) holds nothing for long. aiohttp's keep-alive
    timer is that bound: it runs from those moments and closes a connection still waiting
    for a request's head; an idle kept-alive connection closes after it too."""
    return web.AppRunner(app, handler_cancellation=True, keepalive_timeout=header_timeout, **kw)


async def _stop_streams(app: web.Application) -> None:
    for stream in list(app[API].streams):
        stream.stop()


async def _close_hub(app: web.Application) -> None:
    await app[API].hub.aclose()


def make_app(
    engine_client: Client,
    store: Store,
    *,
    keys: ApiKeys,
    max_body: int = 1 << 20,
    metrics: Metrics | None = None,
    heartbeat: float = 15.0,
    sse: SseLimits | None = None,
    cors_origins: Iterable[str] = (),
    request_timeout: float = 30.0,
    max_streams_per_key: int = 100,
    max_streams: int = 10_000,
    agents: Iterable[str] = (),
    store_problem: Callable[[], str | None] = lambda: None,
    hosts: Iterable[str | None] = (),
    tokens: ClientTokens | None = None,
    lander: Lander | None = None,
    alertmanager: AlertHook | None = None,
) -> web.Application:
    """The API as an aiohttp app; the caller runs it (and decides where, see `check_bind`).

    `cors_origins` are the browser origins (`scheme://host[:port]`) allowed to call it;
    none, the default, sends no CORS headers and refuses every preflight. `agents` are
    the project's agent ids, each with a chat page (`/console/chat/<agent>`). `store` should
    be on a connection pool of its own, apart from the engine's: the API's waits
    (submits, event-stream readers) must never hold up a lease renewal.
    `store_problem` says why the store is degraded though Redis answers (/healthz).
    `hosts` are the names an open API (no keys) answers besides the loopback ones: the
    address it is bound to and `[serve] public_url`'s host (engine/api/local.py).
    `tokens` mints and checks client tokens (engine/api/client_tokens.py); none: off.
    `lander` is the Slack bot of this process: sessions whose identity names a Slack
    channel land there (engine/api/slack_landing.py); `alertmanager` configures
    `POST /api/hooks/alertmanager` (engine/api/hooks.py), else it answers 404.
    """
    limits = sse or SseLimits()
    app = web.Application(
        middlewares=[render_errors, local_only, preflight, authenticate], client_max_size=max_body
    )
    app[API] = ApiState(
        client=engine_client,
        store=store,
        keys=keys,
        metrics=metrics or Metrics(),
        max_body=max_body,
        heartbeat=heartbeat,
        limits=limits,
        cors_origins=frozenset(o.lower() for o in cors_origins),
        request_timeout=request_timeout,
        hub=Hub(store, sse_frame, block_ms=limits.block_ms, buffer=limits.max_pending),
        max_streams_per_key=max_streams_per_key,
        tokens=tokens or ClientTokens(),
        max_streams=max_streams,
        agents=tuple(sorted(agents)),
        store_problem=store_problem,
        local_hosts=allowed_hosts(hosts),
        lander=lander,
        alertmanager=alertmanager,
    )
    app.on_response_prepare.append(cors_headers)
    app.on_response_prepare.append(console_headers)
    app.on_shutdown.append(_stop_streams)
    app.on_cleanup.append(_close_hub)
    r = app.router
    r.add_post("/api/client/sessions/input", post_input)
    r.add_post("/api/hooks/alertmanager", post_alertmanager)
    r.add_get("/api/client/sessions/{sid}", get_session)
    r.add_get("/api/client/sessions/{sid}/events/stream", stream_events)
    r.add_post("/api/client/sessions/{sid}/interrupt", post_interrupt)
    r.add_post("/api/client/sessions/{sid}/cancel", post_cancel)
    r.add_delete("/api/client/sessions/{sid}", delete_session)
    r.add_post("/api/machine/sessions/{sid}/calls/settle", post_settle)
    r.add_post("/api/machine/client-tokens", post_client_token)
    r.add_post("/api/machine/sessions/submit", post_machine_submit)
    r.add_post("/api/machine/workers/submit", post_worker_submit)
    r.add_get("/api/machine/sessions/{sid}/events/stream", stream_events)
    r.add_get("/api/admin/sessions", admin_sessions)
    r.add_get("/api/admin/sessions/{sid}/events", admin_events)
    r.add_get("/api/admin/dead-letters", admin_dead_letters)
    r.add_get("/api/admin/budgets", admin_budgets)
    agui.install(app)  # the AG-UI channel
    add_chat_routes(r)  # its chat page
    r.add_get("/healthz", get_healthz)
    r.add_get("/metrics", get_metrics)
    add_console_routes(r)
    return app
