"""The one error a model call raises, and the parts of it every vendor shares.

See SPEC.md §5 (ErrorInfo codes) and §11 (only retryable errors retry).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

from engine.errors import SubsError

# The longest vendor sentence we quote in a message; past it we cut, because a
# message is one human sentence and never a raw document.
_MAX_QUOTE = 240


class ProviderError(SubsError):
    """A model call failed.

    Attributes:
        message: one human sentence.
        code: an ErrorInfo code (SPEC.md §5), e.g. "provider_error", "rate_limited".
        retryable: whether another attempt may succeed.
        retry_after: seconds the vendor asked us to wait, if it said.
        vendor_status: the vendor's HTTP status, when the failure was an HTTP answer
            (`status` is the root's: the API's, where an error reaches it).
        param: the parameter at fault, e.g. the name of a missing env variable.
    """

    code: str = "provider_error"

    def __init__(
        self,
        message: str,
        *,
        code: str = "provider_error",
        retryable: bool = False,
        retry_after: float | None = None,
        vendor_status: int | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message, code=code, retryable=retryable, param=param)
        self.retry_after = retry_after
        self.vendor_status = vendor_status

    def __repr__(self) -> str:
        return (
            f"ProviderError({self.message!r}, code={self.code!r}, retryable={self.retryable}, "
            f"vendor_status={self.vendor_status}, retry_after={self.retry_after})"
        )


def status_class(status: int) -> tuple[str, bool]:
    """Returns (code, retryable) for an HTTP status before any vendor detail refines it.

    429 is a rate limit; 408, 409 and 5xx are worth another try (what the vendors'
    own SDKs retry); every other status is final.
    """
    if status == 429:
        return "rate_limited", True
    if status in (408, 409) or status >= 500:
        return "provider_error", True
    return "provider_error", False


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Returns the wait the vendor asked for, in seconds, or None.

    Reads `retry-after-ms` first (OpenAI's SDKs do), then `retry-after` as seconds
    or an HTTP date. `headers` must look keys up case-insensitively (aiohttp's do).
    """
    ms = headers.get("retry-after-ms")
    if ms is not None:
        seconds = _number(ms)
        if seconds is not None:
            return seconds / 1000
    value = headers.get("retry-after")
    if value is None:
        return None
    seconds = _number(value)
    if seconds is not None:
        return seconds
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def error_body(body: bytes) -> dict[str, Any]:
    """Returns the `error` object of a vendor error body, or {} when there is none."""
    try:
        doc = json.loads(body)
    except ValueError:
        return {}
    error = doc.get("error") if isinstance(doc, dict) else None
    return error if isinstance(error, dict) else {}


def quote(text: object) -> str:
    """Returns a vendor's message as one short line fit to end our sentence."""
    if not isinstance(text, str):
        return ""
    line = " ".join(text.split())
    if len(line) > _MAX_QUOTE:
        line = line[: _MAX_QUOTE - 1].rstrip() + "…"
    return line


def http_error(
    vendor: str,
    status: int,
    headers: Mapping[str, str],
    vendor_message: object,
    code: str,
    retryable: bool,
) -> ProviderError:
    """Builds the ProviderError for an HTTP error answer."""
    said = quote(vendor_message)
    message = f"{vendor} returned HTTP {status}" + (f": {said}" if said else "")
    return ProviderError(
        message,
        code=code,
        retryable=retryable,
        retry_after=retry_after(headers),
        vendor_status=status,
    )
