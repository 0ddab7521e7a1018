"""Checking that a request came from the engine, before its body is parsed.

The engine signs each attempt twice (docs/workers.md, "Requests and signatures"):
`X-Subs-Signature: t=<unix>,v1=<hex>` is the HMAC-SHA256 of `<t>.` + the raw body, and
`X-Substructure-Signature: sha256=<hex>` (the original engine's) of the body alone.
Only the first carries a time, so only it stops a captured request replayed later:
it is required, and refused outside a window of five minutes either way of this
clock. The second, when present, must be right too.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections.abc import Mapping

__all__ = [
    "LEGACY_HEADER",
    "REPLAY_WINDOW",
    "TIMESTAMPED_HEADER",
    "SignatureError",
    "sign",
    "verify",
]

TIMESTAMPED_HEADER = "X-Subs-Signature"
LEGACY_HEADER = "X-Substructure-Signature"
REPLAY_WINDOW = 300  # seconds
_STAMPED = re.compile(r"t=(\d{1,12}),v1=([0-9a-f]{64})")


class SignatureError(Exception):
    """Why a request is refused (sent back with the 401, so the engine's log says it)."""


def _mac(secret: bytes, data: bytes) -> str:
    return hmac.new(secret, data, hashlib.sha256).hexdigest()


def _header(headers: Mapping[str, str], name: str) -> str | None:
    """A header by name, in any case (ASGI gives lowercase names, aiohttp any)."""
    wanted = name.lower()
    return next((v for k, v in headers.items() if k.lower() == wanted), None)


def sign(secret: str | bytes, body: bytes, at: int | None = None) -> dict[str, str]:
    """Both headers as the engine sends them, for `body` sent at `at` (now by default):
    for a worker's own tests, and for anything that calls a worker as the engine does."""
    key = secret.encode() if isinstance(secret, str) else secret
    t = str(int(time.time()) if at is None else at)
    return {
        TIMESTAMPED_HEADER: f"t={t},v1={_mac(key, t.encode() + b'.' + body)}",
        LEGACY_HEADER: "sha256=" + _mac(key, body),
    }


def verify(
    secret: str | bytes,
    body: bytes,
    headers: Mapping[str, str],
    *,
    now: float | None = None,
    window: int = REPLAY_WINDOW,
) -> None:
    """Raise `SignatureError` unless `headers` sign `body` (the bytes as received) with
    `secret`, within `window` seconds of `now`."""
    key = secret.encode() if isinstance(secret, str) else secret
    stamped = _header(headers, TIMESTAMPED_HEADER)
    if stamped is None:
        raise SignatureError(
            f"missing {TIMESTAMPED_HEADER}"
            + (
                f" ({LEGACY_HEADER} alone carries no time)"
                if _header(headers, LEGACY_HEADER)
                else ""
            )
        )
    match = _STAMPED.fullmatch(stamped.strip())
    if match is None:
        raise SignatureError(f"{TIMESTAMPED_HEADER} is not t=<unix seconds>,v1=<64 hex>")
    skew = (time.time() if now is None else now) - int(match[1])
    if abs(skew) > window:
        when = "old" if skew > 0 else "in the future"
        raise SignatureError(
            f"{TIMESTAMPED_HEADER} was made {abs(int(skew))} s {when}, past {window} s: "
            "a replay, or a clock off (keep both on NTP)"
        )
    if not hmac.compare_digest(_mac(key, match[1].encode() + b"." + body), match[2]):
        raise SignatureError(f"{TIMESTAMPED_HEADER} does not match: another secret or body")
    legacy = _header(headers, LEGACY_HEADER)
    if legacy is not None and not hmac.compare_digest(
        ("sha256=" + _mac(key, body)).encode(), legacy.strip().encode("utf-8", "replace")
    ):
        raise SignatureError(f"{LEGACY_HEADER} does not match: another secret or body")
