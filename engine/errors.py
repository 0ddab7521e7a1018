"""The engine's own exceptions: each carries what an `ErrorInfo` needs."""

from __future__ import annotations


class SubsError(Exception):
    """Root of every failure the engine reports; `code` is an `ErrorCode` value."""

    code: str = "internal"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        retryable: bool = False,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.retryable = retryable
        self.param = param


class ProtocolError(SubsError):
    """A document from a worker or client that is not what the protocol allows."""

    code = "invalid_response"

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message, param=param)


def describe(err: BaseException) -> str:
    """An exception as one line for a log or an ErrorInfo: its class and its message."""
    text = err.message if isinstance(err, SubsError) else str(err)
    return f"{type(err).__name__}: {text}" if text else type(err).__name__
