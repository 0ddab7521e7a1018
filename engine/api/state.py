"""What the API's handlers and middleware share: the app's state, keyed on the app (`API`),
the caller each request carries (`PRINCIPAL`), and the per-caller count of open streams."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web

from engine.api.auth import ApiKeys, Principal
from engine.api.client_tokens import ClientTokens
from engine.api.errors import ApiError
from engine.api.fanout import Hub
from engine.api.stream import SseLimits, SseStream
from engine.client import Client
from engine.landing import AlertHook, Lander
from engine.metrics import Metrics
from engine.store.store import Store


@dataclass
class ApiState:
    """One app's settings and shared parts, reached as `request.app[API]`."""

    client: Client
    store: Store
    keys: ApiKeys
    metrics: Metrics
    max_body: int
    heartbeat: float
    limits: SseLimits
    cors_origins: frozenset[str]  # lower-cased; empty: no CORS headers at all
    request_timeout: float
    hub: Hub
    max_streams_per_key: int
    max_streams: int  # all callers' streams together: bounds the fan-out's taps and buffers
    tokens: ClientTokens = field(default_factory=ClientTokens)  # off without a secret
    agents: tuple[str, ...] = ()  # the project's agents: the chat page has a page for each
    # The `Host` names an open API answers (engine.api.local): loopback, the bound address
    # and `public_url`'s host.
    local_hosts: frozenset[str] = frozenset()
    # Why the store is degraded though it answers (the embedded server's folder removed).
    store_problem: Callable[[], str | None] = lambda: None
    # The Slack bot of this process (subs serve), for sessions that land in Slack; None:
    # such a submit is refused (engine/api/slack_landing.py).
    lander: Lander | None = None
    alertmanager: AlertHook | None = None  # `[hooks.alertmanager]`: POST /api/hooks/alertmanager
    streams: set[SseStream] = field(default_factory=set)
    streams_by_caller: dict[str, int] = field(default_factory=dict)
    streams_held: int = 0  # the slots `streams_by_caller` counts, all callers together

    def take_stream_slot(self, request: web.Request) -> str:
        """Count one more stream for the caller, or refuse it: 429 past the limit.

        The caller is the API key; when the API runs open, the client's address.
        Returns the caller to hand back to `free_stream_slot`.
        """
        key_id = request[PRINCIPAL].key_id
        caller = request[PRINCIPAL].caller if key_id is not None else f"addr:{request.remote}"
        held = self.streams_by_caller.get(caller, 0)
        total = self.streams_held
        if total >= self.max_streams:
            raise ApiError(
                f"too many event streams: the API already has {total} open, the limit set by "
                "[serve] max_streams; try again when one closes",
                status=503,
                code="too_many_streams",
                headers={"Retry-After": "1"},
                limit=self.max_streams,
            )
        if held >= self.max_streams_per_key:
            who = "this key" if key_id is not None else "this address"
            raise ApiError(
                f"too many event streams: {who} already has {held} open, the limit set by "
                "[serve] max_streams_per_key (or SUBS_MAX_STREAMS_PER_KEY); close one first",
                status=429,
                code="too_many_streams",
                headers={"Retry-After": "1"},
                limit=self.max_streams_per_key,
            )
        self.streams_by_caller[caller] = held + 1
        self.streams_held += 1
        return caller

    def free_stream_slot(self, caller: str) -> None:
        """A stream of `caller` closed: its slot counts no more against the key's limit."""
        held = self.streams_by_caller.pop(caller) - 1
        self.streams_held -= 1
        if held:
            self.streams_by_caller[caller] = held


API = web.AppKey("subs_api", ApiState)
PRINCIPAL = web.RequestKey("subs_principal", Principal)


def principal_of(request: web.Request) -> Principal:
    """The caller the auth middleware found (every route but /healthz and Slack's has one)."""
    return request[PRINCIPAL]
