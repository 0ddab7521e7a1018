"""OpenAI Chat Completions (`POST /v1/chat/completions`), as notes/engine-facts.md §3
records it: a pretty-printed JSON body, or `data:` chunks ending in `data: [DONE]`, with usage
in a last chunk when `stream_options.include_usage` asks and the `obfuscation` field unless
`include_obfuscation` is false; errors as `{"error": {message, type, param, code}}`."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from aiohttp import web

from tests.fakes.llm_vendor.answer import Answer, AnswerCall, Frames, split_json
from tests.fakes.llm_vendor.vendor import Vendor, dumps, json_response

OPENAI_PATH = "/v1/chat/completions"

OPENAI_FINISH = {"stop": "stop", "length": "length", "tool_calls": "tool_calls"}

_OPENAI_ERRORS: dict[int, tuple[str, str, str | None]] = {
    400: ("Invalid request.", "invalid_request_error", None),
    401: ("Incorrect API key provided.", "invalid_request_error", "invalid_api_key"),
    403: ("You are not allowed to use this model.", "invalid_request_error", None),
    404: ("The model does not exist.", "invalid_request_error", "model_not_found"),
    429: (
        "Rate limit reached for requests per min (RPM): Limit 3, Used 3, Requested 1.",
        "requests",
        "rate_limit_exceeded",
    ),
    500: (
        "The server had an error while processing your request. Sorry about that!",
        "server_error",
        None,
    ),
    503: ("The engine is currently overloaded, please try again later.", "server_error", None),
}


class OpenAI(Vendor):
    name = "openai"

    def __init__(self, rng: random.Random, body: dict[str, Any]) -> None:
        super().__init__(rng, body)
        self.id = "chatcmpl-" + self.rand(29)
        options = body.get("stream_options") or {}
        self.include_usage = bool(options.get("include_usage"))
        self.obfuscation = options.get("include_obfuscation", True) is not False

    def call_id(self) -> str:
        return "call_" + self.rand(24)

    def usage(self, answer: Answer) -> dict[str, Any]:
        prompt = answer.uncached + answer.cache_read
        return {
            "prompt_tokens": prompt,
            "completion_tokens": answer.output,
            "total_tokens": prompt + answer.output,
            "prompt_tokens_details": {"cached_tokens": answer.cache_read, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": 0,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        }

    def message(self, answer: Answer) -> dict[str, Any]:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": answer.text or None,
            "refusal": None,
            "annotations": [],
        }
        if answer.calls:
            message["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in answer.calls
            ]
        return message

    def whole(self, answer: Answer) -> web.Response:
        body = {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": answer.model,
            "choices": [
                {
                    "index": 0,
                    "message": self.message(answer),
                    "logprobs": None,
                    "finish_reason": OPENAI_FINISH[answer.finish],
                }
            ],
            "usage": self.usage(answer),
            "service_tier": "default",
            "system_fingerprint": None,
        }
        # The live API pretty-prints its JSON bodies.
        return json_response(dumps(body, indent=2), {"x-request-id": "req_" + self.rand(32)})

    def chunk(self, answer: Answer, choices: list[Any], usage: Any = None) -> bytes:
        chunk: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": answer.model,
            "service_tier": "default",
            "system_fingerprint": None,
            "choices": choices,
        }
        if self.include_usage:
            chunk["usage"] = usage
        if self.obfuscation:
            chunk["obfuscation"] = self.rand(self.rng.randint(0, 8))
        return b"data: " + dumps(chunk).encode() + b"\n\n"

    def choice(self, delta: dict[str, Any], finish: str | None = None) -> list[Any]:
        return [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]

    def deltas(self, answer: Answer) -> Iterator[dict[str, Any]]:
        """The deltas of an answer, first to last, before the finish."""
        calls = list(enumerate(answer.calls))
        role: dict[str, Any] = {"role": "assistant", "content": "" if answer.text else None}
        if not answer.text and calls:
            role["tool_calls"] = [self.call_start(*calls[0])]
        role["refusal"] = None
        yield role
        for piece in answer.text_pieces:
            yield {"content": piece}
        for position, (index, call) in enumerate(calls):
            if position or answer.text:
                yield {"tool_calls": [self.call_start(index, call)]}
            for piece in split_json(call.arguments):
                yield {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}

    def call_start(self, index: int, call: AnswerCall) -> dict[str, Any]:
        return {
            "index": index,
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }

    def stream(self, answer: Answer) -> Frames:
        frames = [self.chunk(answer, self.choice(delta)) for delta in self.deltas(answer)]
        finish_at = len(frames)
        frames.append(self.chunk(answer, self.choice({}, OPENAI_FINISH[answer.finish])))
        if self.include_usage:
            frames.append(self.chunk(answer, [], self.usage(answer)))
        frames.append(b"data: [DONE]\n\n")
        return Frames(frames, finish_at)

    def stream_headers(self) -> dict[str, str]:
        return {
            "Content-Type": "text/event-stream; charset=utf-8",
            "x-request-id": "req_" + self.rand(32),
        }

    def stream_error(self) -> bytes:
        message, kind, code = _OPENAI_ERRORS[500]
        error = {"message": message, "type": kind, "param": None, "code": code}
        return b"data: " + dumps({"error": error}).encode() + b"\n\n"

    def error_body(self, status: int) -> dict[str, Any]:
        message, kind, code = _OPENAI_ERRORS.get(status, _OPENAI_ERRORS[500])
        return {"error": {"message": message, "type": kind, "param": None, "code": code}}
