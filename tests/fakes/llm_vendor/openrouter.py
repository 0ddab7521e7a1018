"""OpenRouter's chat completions (`POST /api/v1/chat/completions`): OpenAI's format plus
OpenRouter's additions (notes/engine-facts.md §3.3): a `: OPENROUTER PROCESSING` comment
first, usage always, with its cost priced per kind of token, and its own error bodies."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from aiohttp import web

from tests.fakes.llm_vendor.answer import Answer, Frames, split_json
from tests.fakes.llm_vendor.openai_chat import OPENAI_FINISH, OpenAI
from tests.fakes.llm_vendor.vendor import dumps, json_response, num
from tests.fakes.prompt_cache import TooManyBreakpoints

OPENROUTER_PATH = "/api/v1/chat/completions"


@dataclass(frozen=True)
class _Price:
    input: Decimal  # USD per token
    output: Decimal


# What OpenRouter bills per token for the models the tests and benches use (its model
# pages: anthropic/claude-sonnet-4.5 $3 / $15 per million); any other model the fake's
# flat $0.10 / $0.40 per million.
_OPENROUTER_PRICES = {
    "anthropic/claude-sonnet-4-5": _Price(Decimal("0.000003"), Decimal("0.000015")),
    "anthropic/claude-haiku-4-5": _Price(Decimal("0.000001"), Decimal("0.000005")),
}
_OPENROUTER_DEFAULT = _Price(Decimal("0.0000001"), Decimal("0.0000004"))
# Cache reads and writes as multiples of the input price (OpenRouter's prompt-caching
# page): Anthropic reads 0.1x and writes 1.25x; OpenAI's writes cost nothing more and its
# reads are discounted (0.5x on that page's table; the exact rate is per model).
_CACHE_RATES = {"anthropic": (Decimal("0.1"), Decimal("1.25")), "": (Decimal("0.5"), Decimal(1))}


class OpenRouter(OpenAI):
    """OpenAI's format plus OpenRouter's additions (notes §3.3)."""

    name = "openrouter"

    def __init__(self, rng: random.Random, body: dict[str, Any]) -> None:
        super().__init__(rng, body)
        self.id = f"gen-{self.created}-{self.rand(20)}"
        self.include_usage = True  # OpenRouter always sends usage
        self.obfuscation = False

    def usage(self, answer: Answer) -> dict[str, Any]:
        prompt = answer.uncached + answer.cache_read + answer.cache_write
        price = _OPENROUTER_PRICES.get(answer.model.replace(".", "-"), _OPENROUTER_DEFAULT)
        read, write = _CACHE_RATES["anthropic" if answer.model.startswith("anthropic/") else ""]
        prompt_cost = price.input * (
            answer.uncached + answer.cache_read * read + answer.cache_write * write
        )
        completion_cost = Decimal(answer.output) * price.output
        cost = Decimal(answer.cost) if answer.cost is not None else prompt_cost + completion_cost
        return {
            "prompt_tokens": prompt,
            "completion_tokens": answer.output,
            "total_tokens": prompt + answer.output,
            "cost": num(cost),
            "is_byok": False,
            "prompt_tokens_details": {
                "cached_tokens": answer.cache_read,
                "cache_write_tokens": answer.cache_write,
                "audio_tokens": 0,
                "video_tokens": 0,
            },
            "cost_details": {
                "upstream_inference_cost": None,
                "upstream_inference_prompt_cost": num(prompt_cost),
                "upstream_inference_completions_cost": num(completion_cost),
            },
            "completion_tokens_details": {
                "reasoning_tokens": len(answer.reasoning.split()),
                "image_tokens": 0,
                "audio_tokens": 0,
            },
        }

    def whole(self, answer: Answer) -> web.Response:
        message = self.message(answer)
        del message["annotations"]
        message["reasoning"] = answer.reasoning or None
        finish = OPENAI_FINISH[answer.finish]
        body = {
            "id": self.id,
            "provider": "OpenAI",
            "model": answer.model,
            "object": "chat.completion",
            "created": self.created,
            "choices": [
                {
                    "logprobs": None,
                    "finish_reason": finish,
                    "native_finish_reason": finish,
                    "index": 0,
                    "message": message,
                }
            ],
            "usage": self.usage(answer),
        }
        return json_response(dumps(body), {})

    def chunk(self, answer: Answer, choices: list[Any], usage: Any = None) -> bytes:
        chunk: dict[str, Any] = {
            "id": self.id,
            "provider": "OpenAI",
            "model": answer.model,
            "object": "chat.completion.chunk",
            "created": self.created,
            "choices": choices,
        }
        if usage is not None:
            chunk["usage"] = usage
        return b"data: " + dumps(chunk).encode() + b"\n\n"

    def choice(self, delta: dict[str, Any], finish: str | None = None) -> list[Any]:
        return [
            {
                "index": 0,
                "delta": delta,
                "finish_reason": finish,
                "native_finish_reason": finish,
                "logprobs": None,
            }
        ]

    def deltas(self, answer: Answer) -> Iterator[dict[str, Any]]:
        for piece in answer.reasoning_pieces:
            yield {"role": "assistant", "content": "", "reasoning": piece}
        for piece in answer.text_pieces:
            yield {"role": "assistant", "content": piece}
        for index, call in enumerate(answer.calls):
            start = {
                "role": "assistant",
                "content": None,
                "tool_calls": [self.call_start(index, call)],
            }
            yield start
            for piece in split_json(call.arguments):
                yield {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}

    def stream(self, answer: Answer) -> Frames:
        rendered = super().stream(answer)
        comment = b": OPENROUTER PROCESSING\n\n"
        return Frames([comment, *rendered.frames], rendered.finish_at + 1)

    def stream_headers(self) -> dict[str, str]:
        return {"Content-Type": "text/event-stream", "X-Generation-Id": self.id}

    def stream_error(self) -> bytes:
        chunk = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.body.get("model", ""),
            "provider": "OpenAI",
            "error": {"code": "server_error", "message": "Provider disconnected unexpectedly"},
            "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "error"}],
        }
        return b"data: " + dumps(chunk).encode() + b"\n\n"

    def error_body(self, status: int) -> dict[str, Any]:
        message = {
            400: "Invalid request",
            401: "No auth credentials found",
            402: "Insufficient credits",
            403: "Input was flagged by moderation",
            408: "Request timed out",
            429: "Rate limit exceeded",
            502: "Provider returned error",
            503: "No available provider meets your routing requirements",
        }.get(status, "Internal Server Error")
        return {"error": {"code": status, "message": message, "metadata": {}}}

    def refuse(self, refusal: TooManyBreakpoints) -> web.Response:
        """OpenRouter relays the provider's 400 with its raw body in `metadata.raw`."""
        raw = {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": refusal.message},
        }
        metadata = {"raw": dumps(raw), "provider_name": "Anthropic"}
        body = {"error": {"code": 400, "message": "Provider returned error", "metadata": metadata}}
        return json_response(dumps(body), {}, status=400)
