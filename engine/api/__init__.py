"""The HTTP API (SPEC §13): a thin aiohttp shell over the Redis-level `Client`.

Other layers import what they need to build, run and guard the app from here; the
modules below hold one idea each, and tests that look inside import from them.
"""

from .app import ApiKeys, ApiKeysError, SseLimits, bind_warning, check_bind, make_app

__all__ = ["ApiKeys", "ApiKeysError", "SseLimits", "bind_warning", "check_bind", "make_app"]
