"""The HTTP API (SPEC §13): a thin aiohttp shell over the Redis-level `Client`.

Handlers validate at the edge, call `Client`/`Store`, and refuse with `{"error", "code"}`
bodies; a session's event stream is one SSE writer per connection, fed by the process's
shared readers. Other layers import what they need to build, run and guard the app from
here; the modules below hold one idea each, and tests that look inside import from them.
"""

from engine.api.app import make_app, make_runner
from engine.api.auth import ApiKeys, ApiKeysError, bind_warning, check_bind
from engine.api.stream import SseLimits

__all__ = [
    "ApiKeys",
    "ApiKeysError",
    "SseLimits",
    "bind_warning",
    "check_bind",
    "make_app",
    "make_runner",
]
