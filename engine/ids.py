"""Ids the engine and its clients mint: one module below both, so a client that names a
new session or turn needs nothing of the engine's runtime."""

from __future__ import annotations

import secrets
import time


def new_id(prefix: str) -> str:
    """Time-ordered, unique: 48 bits of milliseconds, 64 random bits."""
    return f"{prefix}_{int(time.time() * 1000):012x}{secrets.token_hex(8)}"
