"""The API's refusals: `ApiError` carries the HTTP status, and every error answer, the
API's and the Slack route's on the same app, is rendered here as `SubsError.body()`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from engine.errors import SubsError
from engine.jsonedge import compact_json


class ApiError(SubsError):
    """A request the API refuses, with its HTTP status; the error middleware renders it."""

    def __init__(
        self,
        message: str,
        *,
        status: int,
        code: str,
        headers: Mapping[str, str] | None = None,
        param: str | None = None,
        **detail: Any,
    ) -> None:
        super().__init__(
            message, code=code, status=status, headers=headers, param=param, detail=detail
        )


def error_response(err: SubsError) -> web.Response:
    """Every error answer of the API (and of the Slack route on the same app): `err.body()`."""
    headers = err.headers
    if err.status == 401:
        headers = {**headers, "WWW-Authenticate": "Bearer"}
    return web.json_response(err.body(), status=err.status, headers=headers, dumps=compact_json)


_HTTP_CODES = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 413: "too_large"}
INTERNAL = ApiError("internal error (logged by the API)", status=500, code="internal")
STORE_DOWN = ApiError(
    "the store (Redis) is not reachable; retry shortly",
    status=503,
    code="store_unavailable",
    headers={"Retry-After": "1"},
)


def http_error(err: web.HTTPException) -> ApiError:
    """aiohttp's own refusal in the API's shape, keeping the headers it must carry."""
    code = _HTTP_CODES.get(err.status, "http_error")
    kept = {k: v for k, v in err.headers.items() if k in ("Allow", "Retry-After")}
    return ApiError(err.reason, status=err.status, code=code, headers=kept)


def excerpt(raw: str, limit: int = 40) -> str:
    """A client's value quoted back in an error, cut short: it may be anything."""
    return repr(raw[:limit]) + ("..." if len(raw) > limit else "")
