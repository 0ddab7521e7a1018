"""Anthropic Messages (`POST /v1/messages`), as notes/engine-facts.md §3 records it: a
message with content blocks (thinking, text, tool_use), or `event:` / `data:` pairs from
message_start to message_stop with a ping after the first block's start; errors as
`{"type": "error", "error": {type, message}}`."""

from __future__ import annotations

import json
import random
import string
from typing import Any

from aiohttp import web

from tests.fakes.llm_vendor.answer import Answer, Frames, split_json
from tests.fakes.llm_vendor.vendor import Vendor, dumps, json_response
from tests.fakes.prompt_cache import TooManyBreakpoints

ANTHROPIC_PATH = "/v1/messages"

_ANTHROPIC_FINISH = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}

_ANTHROPIC_ERRORS: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "Invalid request."),
    401: ("authentication_error", "invalid x-api-key"),
    402: ("billing_error", "Your credit balance is too low."),
    403: (
        "permission_error",
        "Your API key does not have permission to use the specified resource.",
    ),
    404: ("not_found_error", "The requested resource could not be found."),
    409: ("conflict_error", "Conflict."),
    413: ("request_too_large", "Request exceeds the maximum allowed number of bytes."),
    429: ("rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit."),
    500: ("api_error", "Internal server error"),
    504: ("timeout_error", "Request timed out"),
    529: ("overloaded_error", "Overloaded"),
}


class Anthropic(Vendor):
    name = "anthropic"

    def __init__(self, rng: random.Random, body: dict[str, Any]) -> None:
        super().__init__(rng, body)
        self.id = "msg_01" + self.rand(22)

    def call_id(self) -> str:
        return "toolu_01" + self.rand(22)

    def signature(self) -> str:
        return "EqQB" + self.rand(60, string.ascii_letters + string.digits + "+/") + "=="

    def usage(self, answer: Answer, output: int, *, where: str) -> dict[str, Any]:
        """Usage as message_start, message_delta (cumulative) or a whole body carries it."""
        usage: dict[str, Any] = {
            "input_tokens": answer.uncached,
            "cache_creation_input_tokens": answer.cache_write,
            "cache_read_input_tokens": answer.cache_read,
        }
        if where == "body":
            usage["cache_creation"] = {
                "ephemeral_5m_input_tokens": answer.cache_write,
                "ephemeral_1h_input_tokens": 0,
            }
        usage["output_tokens"] = output
        if where != "delta":
            usage["service_tier"] = "standard"
        return usage

    def blocks(self, answer: Answer) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = []
        if answer.reasoning:
            blocks.append(
                {"type": "thinking", "thinking": answer.reasoning, "signature": self.signature()}
            )
        if answer.text:
            blocks.append({"type": "text", "text": answer.text})
        for call in answer.calls:
            blocks.append(
                {
                    "type": "tool_use",
                    "id": call.id,
                    "name": call.name,
                    "input": json.loads(call.arguments),
                }
            )
        return blocks

    def whole(self, answer: Answer) -> web.Response:
        body = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": answer.model,
            "content": self.blocks(answer),
            "stop_reason": _ANTHROPIC_FINISH[answer.finish],
            "stop_sequence": None,
            "usage": self.usage(answer, answer.output, where="body"),
        }
        return json_response(dumps(body), {"request-id": "req_01" + self.rand(22)})

    @staticmethod
    def event(data: dict[str, Any], *, compact: bool = True) -> bytes:
        return f"event: {data['type']}\ndata: {dumps(data, compact=compact)}\n\n".encode()

    def stream(self, answer: Answer) -> Frames:
        e = self.event
        frames = [
            e(
                {
                    "type": "message_start",
                    "message": {
                        "id": self.id,
                        "type": "message",
                        "role": "assistant",
                        "model": answer.model,
                        "content": [],
                        "stop_reason": None,
                        "stop_sequence": None,
                        "usage": self.usage(answer, 1, where="start"),
                    },
                }
            )
        ]
        index = 0

        def block(start: dict[str, Any], deltas: list[dict[str, Any]]) -> None:
            nonlocal index
            frames.append(
                e({"type": "content_block_start", "index": index, "content_block": start})
            )
            if index == 0:
                frames.append(self.event({"type": "ping"}, compact=False))
            for delta in deltas:
                frames.append(e({"type": "content_block_delta", "index": index, "delta": delta}))
            frames.append(e({"type": "content_block_stop", "index": index}))
            index += 1

        if answer.reasoning:
            thinking = [{"type": "thinking_delta", "thinking": p} for p in answer.reasoning_pieces]
            thinking.append({"type": "signature_delta", "signature": self.signature()})
            block({"type": "thinking", "thinking": "", "signature": ""}, thinking)
        if answer.text:
            block(
                {"type": "text", "text": ""},
                [{"type": "text_delta", "text": p} for p in answer.text_pieces],
            )
        for call in answer.calls:
            pieces = ["", *split_json(call.arguments)]
            block(
                {
                    "type": "tool_use",
                    "id": call.id,
                    "name": call.name,
                    "caller": {"type": "direct"},
                    "input": {},
                },
                [{"type": "input_json_delta", "partial_json": p} for p in pieces],
            )
        finish_at = len(frames)
        frames.append(
            e(
                {
                    "type": "message_delta",
                    "delta": {
                        "stop_reason": _ANTHROPIC_FINISH[answer.finish],
                        "stop_sequence": None,
                    },
                    "usage": self.usage(answer, answer.output, where="delta"),
                }
            )
        )
        frames.append(e({"type": "message_stop"}))
        return Frames(frames, finish_at)

    def stream_headers(self) -> dict[str, str]:
        return {
            "Content-Type": "text/event-stream; charset=utf-8",
            "request-id": "req_01" + self.rand(22),
        }

    def stream_error(self) -> bytes:
        error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
        return self.event(error, compact=False)

    def error_body(self, status: int) -> dict[str, Any]:
        kind, message = _ANTHROPIC_ERRORS.get(status, _ANTHROPIC_ERRORS[500])
        return {
            "type": "error",
            "error": {"type": kind, "message": message},
            "request_id": "req_01" + self.rand(22),
        }

    def refuse(self, refusal: TooManyBreakpoints) -> web.Response:
        """Anthropic's 400 for a fifth cache_control block."""
        body = {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": refusal.message},
            "request_id": "req_01" + self.rand(22),
        }
        return json_response(dumps(body), {"request-id": "req_01" + self.rand(22)}, status=400)
