"""What every vendor format shares: the base a route's renderer fills in (answers, streams,
errors, the cache-breakpoint refusal), its random ids, and JSON written as the vendors
write it (compact, numbers as plain decimals)."""

from __future__ import annotations

import json
import random
import re
import string
import time
from decimal import Decimal
from typing import Any

from aiohttp import web

from tests.fakes.llm_vendor.answer import Answer, Frames
from tests.fakes.llm_vendor.script import HttpError
from tests.fakes.prompt_cache import TooManyBreakpoints

NUMBER = re.compile(r'"@num:([0-9.]+)@"')


def num(value: Decimal) -> str:
    """Marks a number to be written as a plain decimal (JS style), not 7.35e-06."""
    return f"@num:{format(value.normalize(), 'f')}@"


def dumps(value: Any, *, compact: bool = True, indent: int | None = None) -> str:
    separators = (",", ":") if compact and indent is None else None
    text = json.dumps(value, separators=separators, indent=indent, ensure_ascii=False)
    return NUMBER.sub(r"\1", text)


def json_response(text: str, headers: dict[str, str], *, status: int = 200) -> web.Response:
    headers = {"Content-Type": "application/json", **headers}
    return web.Response(status=status, body=text.encode(), headers=headers)


class Vendor:
    """How one route renders answers and errors."""

    name = ""

    def __init__(self, rng: random.Random, body: dict[str, Any]) -> None:
        self.rng = rng
        self.body = body
        self.streaming = bool(body.get("stream"))
        self.created = int(time.time())

    def rand(self, n: int, alphabet: str = string.ascii_letters + string.digits) -> str:
        return "".join(self.rng.choice(alphabet) for _ in range(n))

    def call_id(self) -> str:
        raise NotImplementedError

    def whole(self, answer: Answer) -> web.Response:
        raise NotImplementedError

    def stream(self, answer: Answer) -> Frames:
        raise NotImplementedError

    def stream_headers(self) -> dict[str, str]:
        raise NotImplementedError

    def stream_error(self) -> bytes:
        raise NotImplementedError

    def error(self, reply: HttpError) -> web.Response:
        headers = {}
        if reply.retry_after is not None:
            seconds = reply.retry_after
            headers["retry-after"] = str(int(seconds)) if seconds == int(seconds) else str(seconds)
        body = reply.body if reply.body is not None else self.error_body(reply.status)
        return json_response(dumps(body), headers, status=reply.status)

    def error_body(self, status: int) -> dict[str, Any]:
        raise NotImplementedError

    def refuse(self, refusal: TooManyBreakpoints) -> web.Response:
        """The 400 for too many cache breakpoints (Anthropic's own error)."""
        raise NotImplementedError
