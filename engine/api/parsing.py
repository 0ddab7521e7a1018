"""What a client sends, read strictly at the edge: JSON bodies into their models, integers
from the query and headers. Every mistake is a 4xx naming where it is (`param`)."""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.api.errors import ApiError, excerpt
from engine.api.state import API
from engine.jsonedge import JsonEdgeError, loads_checked

MAX_SEQ = 2**63 - 1  # a seq is a Redis stream id's first half: a signed 64-bit integer here
_DIGITS = re.compile(r"[0-9]{1,19}")  # int() also takes ' 7', '+7', '7_0', non-ASCII digits


class InputBody(BaseModel):
    """`POST /api/client/sessions/input`: the ClientInput and where it goes."""

    model_config = ConfigDict(extra="forbid")

    session_id: str | None = Field(default=None, min_length=1, max_length=200)
    input: Any = Field(...)
    identity: dict[str, Any] | None = None


class SettleBody(BaseModel):
    """`POST .../calls/settle`: a result or an error for an open call."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1)
    attempt: int | None = Field(default=None, ge=1)
    result: Any = None
    error: str | None = None
    retryable: bool = False


class InterruptBody(BaseModel):
    """`POST .../interrupt`: why the turn pauses, and what the prompt carries."""

    model_config = ConfigDict(extra="forbid")

    reason: str
    payload: dict[str, Any] | None = None


class CancelBody(BaseModel):
    """`POST .../cancel`: an optional reason recorded with the failed turn."""

    model_config = ConfigDict(extra="forbid")

    reason: str | None = Field(default=None, max_length=1000)


def _invalid(exc: ValidationError, prefix: str = "") -> ApiError:
    """422 naming the first bad field as a dotted path."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in (prefix, *first["loc"]) if p != "")
    text = "required field is missing" if first["type"] == "missing" else first["msg"]
    if first["type"] == "extra_forbidden":
        text = "unknown field"
    return ApiError(
        f"{where}: {text}" if where else text, status=422, code="invalid_input", param=where
    )


def validate(model: type[BaseModel], data: Any, prefix: str = "") -> Any:
    """`data` as a `model`, or a 422 naming the first bad field (under `prefix`)."""
    if not isinstance(data, dict):
        raise ApiError("the body must be a JSON object", status=422, code="invalid_input")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _invalid(exc, prefix) from None


def integer(raw: str, name: str, code: str, *, lo: int, hi: int) -> int:
    """A plain decimal in lo..hi: ASCII digits and nothing else, or a 400 naming `name`."""
    if _DIGITS.fullmatch(raw) is None or not lo <= int(raw) <= hi:
        message = f"{name}: expected an integer {lo}..{hi}, got {excerpt(raw)}"
        raise ApiError(message, status=400, code=code, param=name)
    return int(raw)


def int_query(request: web.Request, name: str, default: int, *, lo: int, hi: int) -> int:
    """An integer query parameter within bounds; a bad one is a 400 naming it."""
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    return integer(raw, name, "invalid_query", lo=lo, hi=hi)


async def json_body(request: web.Request) -> Any:
    """The body as JSON every parser reads alike (see jsonedge): 415 unless it says it is
    JSON, 413 past `max_body` (declared or read), 400 naming the path of what is wrong."""
    if request.content_type != "application/json":  # aiohttp's: lower-cased, no parameters
        got = request.headers.get("Content-Type")
        sent = f"Content-Type {excerpt(got)}" if got is not None else "no Content-Type"
        message = f"the body must be sent as Content-Type: application/json, not with {sent}"
        raise ApiError(message, status=415, code="unsupported_media_type")
    limit = request.app[API].max_body
    too_large = ApiError(f"the body is larger than {limit} bytes", status=413, code="too_large")
    if request.content_length is not None and request.content_length > limit:
        raise too_large
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise too_large from None
    try:
        return loads_checked(raw)
    except JsonEdgeError as err:
        if err.param is None:
            raise ApiError(f"the body: {err.message}", status=400, code="invalid_json") from None
        raise ApiError(err.message, status=400, code="invalid_json", param=err.param) from None
