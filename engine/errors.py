"""The one error model: every failure subs reports is a `SubsError`.

Its `code` is the stable word a client branches on. Where a failure becomes a turn's
`ErrorInfo` (SPEC §5), the code is one of `ErrorCode`, a closed set a worker written
for the original engine validates; `info()` maps any other code to `internal`. Where it
surfaces on the HTTP API, `status` is the HTTP status and `body()` the JSON every
endpoint answers with (docs/API.md "Errors"); the CLI prints the message on one line
and exits with `exit_status`.

Imports nothing: the pure machine (`engine/machine/`) raises these too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, NotRequired, get_args

from typing_extensions import TypedDict  # pydantic reads typing's only from 3.12

ErrorCode = Literal[
    "provider_error",
    "rate_limited",
    "refused",
    "budget_exceeded",
    "deadline_exceeded",
    "invalid_response",
    "handler_error",
    "worker_unreachable",
    "unroutable",
    "internal",
]
ERROR_CODES: frozenset[str] = frozenset(get_args(ErrorCode))


class ErrorInfo(TypedDict):
    """A failure as SPEC §5 spells it, as the machine records it and a worker reads it:
    `code` is an `ErrorCode` on the wire (`info()`); the machine keeps what it was given."""

    message: str
    code: str
    param: NotRequired[str | None]
    detail: NotRequired[Any]


# Checked as strictly as the event records that hold it (engine/machine/events.py), as
# pydantic's `with_config` would set it, without importing pydantic here.
ErrorInfo.__pydantic_config__ = {"extra": "forbid", "strict": True}  # type: ignore[attr-defined]


class SubsError(Exception):
    """Root of every failure subs reports.

    Every constructor, here and in the subclasses, takes the message first and all else by
    name: one order to remember, and a call that names what each value is.

    Attributes:
        message: what is wrong and what to do, for a person.
        code: the word to branch on (an `ErrorCode` where it becomes an ErrorInfo).
        status: the HTTP status where it reaches the API; 500 means a bug there.
        exit_status: the CLI's exit status (2: the command line or the config).
        retryable: whether the same call may succeed later.
        param: the field, parameter or header at fault, as a dotted path.
        detail: more fields for the API's error body and the ErrorInfo's `detail`.
        headers: HTTP headers the API's answer carries (`Retry-After`).
    """

    code: str = "internal"
    status: int = 500
    exit_status: int = 1

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        status: int | None = None,
        retryable: bool = False,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        self.retryable = retryable
        self.param = param
        self.headers = dict(headers or {})
        self.detail = dict(detail or {})

    def body(self) -> dict[str, Any]:
        """The API's error JSON: `{"error", "code"}`, then `param` and the detail fields."""
        body: dict[str, Any] = {"error": self.message, "code": self.code}
        if self.param is not None:
            body["param"] = self.param
        return body | self.detail

    def info(self) -> ErrorInfo:
        """The failure as an ErrorInfo (SPEC §5): its code if an ErrorCode, else internal."""
        info: ErrorInfo = {
            "message": self.message,
            "code": self.code if self.code in ERROR_CODES else "internal",
        }
        if self.param:
            info["param"] = self.param
        if self.detail:
            info["detail"] = self.detail
        return info


class ProtocolError(SubsError):
    """A document from a worker or client that is not what the protocol allows."""

    code = "invalid_response"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message, param=param)


class ClientError(SubsError):
    """The engine refused an input. `status` is the HTTP status it maps to.

    Here, not in engine/client.py, so the CLI's HTTP client can raise it without
    loading the engine (engine.client re-exports it)."""

    def __init__(self, message: str, *, code: str, status: int, detail: Mapping[str, Any]) -> None:
        super().__init__(message, code=code, status=status, detail=detail)


def describe(err: BaseException) -> str:
    """An exception as one line for a log or an ErrorInfo: its class and its message."""
    text = err.message if isinstance(err, SubsError) else str(err)
    return f"{type(err).__name__}: {text}" if text else type(err).__name__
