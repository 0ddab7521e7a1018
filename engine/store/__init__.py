"""The store: the only code that talks to Redis (logs, snapshots, work streams, leases,
timers), and the embedded redis-server.

redis-py is imported here first, before any module of the store: with OpenTelemetry's SDK
installed (tracing, engine/telemetry/), redis-py's own observability module imports the
SDK's metrics package at import time (`redis/observability/providers.py`, in a
`try: from opentelemetry.sdk.metrics import MeterProvider`, only for a type annotation and
a flag nothing reads), 40-400 ms that `subs serve` and `subs sessions list` paid at every
start for metrics nobody asked for. redis-py has no switch for it, so the metrics package
is hidden from that one import (redis-py takes it as not installed, which it handles), and
is importable as before once redis is loaded. redis-py's metrics stay available: they load
the SDK themselves when someone turns them on (`redis.observability`'s `init`).
"""

import sys


def _import_redis() -> None:
    if "redis" in sys.modules or "opentelemetry.sdk.metrics" in sys.modules:
        return  # loaded already (a test, a bench), or the SDK's metrics are in use anyway
    sys.modules["opentelemetry.sdk.metrics"] = None  # type: ignore[assignment]  # "not installed"
    try:
        import redis.asyncio  # noqa: F401  # (redis.asyncio loads redis itself)
    finally:
        del sys.modules["opentelemetry.sdk.metrics"]


_import_redis()
