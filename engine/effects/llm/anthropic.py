"""Anthropic Messages: request bodies, responses, stream events and error answers,
converted to and from the neutral shapes.

Pure: no I/O. Wire facts: notes/engine-facts.md §3.2.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from engine.effects.llm import prices
from engine.effects.llm.errors import ProviderError, error_body, http_error, quote, status_class
from engine.effects.llm.usage import from_anthropic
from engine.machine.tools import arguments_of

NAME = "Anthropic"

# Anthropic requires max_tokens; this is ours when the request names none.
DEFAULT_MAX_TOKENS = 8192

_FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}

# Thinking budgets for a reasoning effort given without max_tokens.
_THINKING_BUDGETS = {"minimal": 1024, "low": 2048, "medium": 8192, "high": 16384, "xhigh": 32768}

_NO_ARGUMENTS = {"type": "object", "properties": {}}

_REASONING_BLOCKS = frozenset({"thinking", "redacted_thinking"})

# Anthropic rejects empty text blocks, which an assistant turn of only tool calls would make.
_EMPTY_TEXT = {"type": "text", "text": ""}

# Error table: the error's type → (code, retryable). A type not here follows the
# status (errors.status_class).
_BY_TYPE: dict[str, tuple[str, bool]] = {
    "invalid_request_error": ("provider_error", False),
    "authentication_error": ("provider_error", False),
    "billing_error": ("budget_exceeded", False),
    "permission_error": ("provider_error", False),
    "not_found_error": ("provider_error", False),
    "request_too_large": ("provider_error", False),
    "rate_limit_error": ("rate_limited", True),
    "api_error": ("provider_error", True),
    "timeout_error": ("provider_error", True),
    "overloaded_error": ("provider_error", True),
}
# A 429 that no wait will cure: the organisation's spend limit.
_SPEND_LIMIT = "enforced_spend_limit_reached"


def build_request(request: dict[str, Any], *, stream: bool) -> dict[str, Any]:
    """Returns the Messages body for a neutral LlmRequest.

    System messages become the top-level `system`; consecutive tool results merge
    into one user message; an assistant's Anthropic reasoning blocks go back
    before its tool_use blocks, as Anthropic requires.

    Raises:
        ProviderError: a message holds content Anthropic cannot take.
    """
    system_messages, groups = message_groups(request["messages"])
    system = [block for m in system_messages for block in _blocks(m.get("content"))]
    messages = [convert_group(group) for group in groups]
    body: dict[str, Any] = {"model": request["model"]}
    budget = _thinking_budget(request.get("reasoning") or {})
    max_tokens = request.get("max_completion_tokens")
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS + (budget or 0)
    body["max_tokens"] = max_tokens
    if system:
        only_text = len(system) == 1 and set(system[0]) == {"type", "text"}
        body["system"] = system[0]["text"] if only_text else system
    body["messages"] = messages
    tools = [_tool(tool) for tool in request.get("tools") or () if not tool.get("defer")]
    if tools:
        body["tools"] = tools
    if request.get("temperature") is not None:
        body["temperature"] = request["temperature"]
    if budget:
        body["thinking"] = {"type": "enabled", "budget_tokens": budget}
    if stream:
        body["stream"] = True
    return body


def message_groups(
    messages: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]]]:
    """The system messages, and the rest grouped as they become Anthropic messages: a run
    of consecutive tool results is one user message, any other message one of its own."""
    system: list[dict[str, Any]] = []
    groups: list[list[dict[str, Any]]] = []
    previous_role = None
    for message in messages:
        role = message["role"]
        if role == "system":
            system.append(message)
        elif role == "tool" and previous_role == "tool":
            groups[-1].append(message)
        else:
            groups.append([message])
        previous_role = role
    return system, groups


def convert_group(group: list[dict[str, Any]]) -> dict[str, Any]:
    """One group of `message_groups` as the Anthropic message it becomes."""
    message = group[0]
    role = message["role"]
    if role == "tool":
        results = [
            {
                "type": "tool_result",
                "tool_use_id": m.get("tool_call_id") or "",
                "content": _content(m.get("content")),
            }
            for m in group
        ]
        return {"role": "user", "content": results}
    if role == "assistant":
        return {"role": "assistant", "content": _assistant_content(message)}
    return {"role": "user", "content": _content(message.get("content"))}


def _assistant_content(message: dict[str, Any]) -> Any:
    reasoning = message.get("reasoning") or {}
    blocks: list[Any] = []
    if reasoning.get("provider") == "anthropic":
        blocks.extend(reasoning.get("blocks") or ())
    calls = message.get("tool_calls") or ()
    if not blocks and not calls:
        return _content(message.get("content"))
    blocks.extend(block for block in _blocks(message.get("content")) if block != _EMPTY_TEXT)
    for call in calls:
        blocks.append(
            {
                "type": "tool_use",
                "id": call["id"],
                "name": call["function"]["name"],
                "input": _arguments(call["function"].get("arguments")),
            }
        )
    return blocks


def _arguments(raw: str | None) -> dict[str, Any]:
    """tool_use input must be an object: arguments the model botched (not JSON, not an
    object, or refused at the edge: too deep to parse) go back as {}."""
    value = arguments_of(raw or "")
    return value if isinstance(value, dict) else {}


def _content(content: Any) -> Any:
    """A string stays a string; a list of neutral parts becomes content blocks."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return [_part(part) for part in content]


def _blocks(content: Any) -> list[dict[str, Any]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [_part(part) for part in content]


def _part(part: dict[str, Any]) -> dict[str, Any]:
    kind = part.get("type")
    if kind == "text":
        return {"type": "text", "text": part["text"]}
    if kind == "image_url":
        return {"type": "image", "source": _source(part["image_url"]["url"])}
    if kind == "file":
        return {"type": "document", "source": _source(part["file"]["file_data"])}
    raise ProviderError(f"Anthropic cannot take a {kind!r} content part.")


def _source(url: str) -> dict[str, Any]:
    """A data URL is sent inline as base64; any other URL by reference."""
    if url.startswith("data:") and ";base64," in url:
        head, data = url[len("data:") :].split(";base64,", 1)
        return {"type": "base64", "media_type": head, "data": data}
    return {"type": "url", "url": url}


def _tool(tool: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": tool["name"],
        "description": tool.get("description", ""),
        "input_schema": tool.get("input") or _NO_ARGUMENTS,
    }


def _thinking_budget(reasoning: dict[str, Any]) -> int | None:
    if reasoning.get("enabled") is False or reasoning.get("effort") == "none":
        return None
    if reasoning.get("max_tokens"):
        return int(reasoning["max_tokens"])
    if reasoning.get("effort") in _THINKING_BUDGETS:
        return _THINKING_BUDGETS[reasoning["effort"]]
    if reasoning.get("enabled"):
        return _THINKING_BUDGETS["medium"]
    return None


def parse_response(body: Any) -> dict[str, Any]:
    """Returns the neutral LlmResponse for a non-streaming Messages body.

    Raises:
        ProviderError: "invalid_response" for a body of the wrong shape; a
            retryable error for an error body.
    """
    if not isinstance(body, dict):
        raise _invalid("a response that is not a JSON object")
    if body.get("type") == "error":
        raise stream_error(body.get("error"))
    content = body.get("content")
    if body.get("type") != "message" or not isinstance(content, list):
        raise _invalid("a response that is not a message")
    usage = body.get("usage")
    return _response(
        model=body.get("model") or "",
        blocks=content,
        arguments={},
        stop_reason=body.get("stop_reason"),
        raw_usage=usage if isinstance(usage, dict) else None,
    )


class StreamAccumulator:
    """Folds decoded stream events into neutral deltas and, at the end, a response.

    Feed each event's `data` object (its `type` is the event name). Pings and
    event types this code does not know are ignored, as Anthropic asks.
    """

    def __init__(self) -> None:
        self._model = ""
        self._blocks: dict[int, dict[str, Any]] = {}
        self._json: dict[int, list[str]] = {}
        self._usage: dict[str, Any] | None = None
        self._stop_reason: str | None = None
        self._stopped = False
        self._failed = False
        self._error: Any = None

    def feed(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        """Returns the neutral StreamDeltas carried by one event."""
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message") or {}
            self._model = message.get("model") or self._model
            if isinstance(message.get("usage"), dict):
                self._usage = dict(message["usage"])
            return []
        if kind == "content_block_start":
            return self._start(event.get("index", len(self._blocks)), event["content_block"])
        if kind == "content_block_delta":
            return self._delta(event.get("index", 0), event.get("delta") or {})
        if kind == "message_delta":
            return self._message_delta(event)
        if kind == "message_stop":
            self._stopped = True
        elif kind == "error":
            self._failed, self._error = True, event.get("error")
        return []

    def _start(self, index: int, block: dict[str, Any]) -> list[dict[str, Any]]:
        block = dict(block)
        self._blocks[index] = block
        kind = block.get("type")
        if kind == "text" and block.get("text"):
            return [{"text": block["text"]}]
        if kind == "thinking" and block.get("thinking"):
            return [{"reasoning": block["thinking"]}]
        if kind == "tool_use":
            self._json[index] = []
            return [{"tool_calls": [{"id": block.get("id", ""), "name": block.get("name", "")}]}]
        return []

    def _delta(self, index: int, delta: dict[str, Any]) -> list[dict[str, Any]]:
        block = self._blocks.setdefault(index, {})
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"] = block.get("text", "") + delta["text"]
            return [{"text": delta["text"]}]
        if kind == "thinking_delta":
            block["thinking"] = block.get("thinking", "") + delta["thinking"]
            return [{"reasoning": delta["thinking"]}]
        if kind == "signature_delta":
            block["signature"] = delta["signature"]
        elif kind == "input_json_delta" and delta.get("partial_json"):
            piece = delta["partial_json"]
            self._json.setdefault(index, []).append(piece)
            return [{"tool_calls": [{"id": block.get("id", ""), "arguments": piece}]}]
        return []

    def _message_delta(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        """message_delta usage is cumulative: its counts replace message_start's."""
        usage = event.get("usage")
        if isinstance(usage, dict):
            merged = dict(self._usage or {})
            merged.update((key, value) for key, value in usage.items() if value is not None)
            self._usage = merged
        reason = (event.get("delta") or {}).get("stop_reason")
        if reason is None:
            return []
        self._stop_reason = reason
        return [{"finish_reason": _finish_reason(reason)}]

    def finish(self) -> dict[str, Any]:
        """Returns the neutral LlmResponse of the whole stream.

        Raises:
            ProviderError: retryable, when the stream carried an error event or
                ended before message_stop (SPEC.md §7).
        """
        if self._failed:
            raise stream_error(self._error)
        if not self._stopped:
            raise ProviderError("The Anthropic stream ended before message_stop.", retryable=True)
        return _response(
            model=self._model,
            blocks=[block for _, block in sorted(self._blocks.items())],
            arguments={
                self._blocks[index].get("id", ""): "".join(parts)
                for index, parts in self._json.items()
            },
            stop_reason=self._stop_reason,
            raw_usage=self._usage,
        )


def _response(
    *,
    model: str,
    blocks: list[Any],
    arguments: dict[str, str],
    stop_reason: Any,
    raw_usage: dict[str, Any] | None,
) -> dict[str, Any]:
    """Builds the neutral response from content blocks.

    `arguments` holds streamed tool input by tool_use id, kept as streamed (the
    concatenated deltas) so tool validation sees what the model wrote; a
    non-streamed input object is dumped compactly.
    """
    text: list[str] = []
    thinking: list[str] = []
    reasoning_blocks: list[Any] = []
    calls: list[dict[str, Any]] = []
    for block in blocks:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            text.append(block.get("text") or "")
        elif kind in _REASONING_BLOCKS:
            reasoning_blocks.append(block)
            thinking.append(block.get("thinking") or "")
        elif kind == "tool_use":
            call_id = block.get("id", "")
            calls.append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {
                        "name": block.get("name", ""),
                        "arguments": arguments.get(call_id) or _dumps(block.get("input") or {}),
                    },
                }
            )
    usage = from_anthropic(raw_usage) if raw_usage is not None else None
    response: dict[str, Any] = {
        "model": model,
        "content": "".join(text) or None,
        "tool_calls": calls,
        "finish_reason": _finish_reason(stop_reason),
        "usage": usage,
        "cost": prices.cost(model, usage) if usage is not None else None,
    }
    if reasoning_blocks:
        response["reasoning"] = {
            "provider": "anthropic",
            "text": "".join(thinking) or None,
            "blocks": reasoning_blocks,
        }
    return response


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _finish_reason(reason: Any) -> str | None:
    if reason is None:
        return None
    return _FINISH_REASONS.get(reason, str(reason))


def parse_error(status: int, headers: Mapping[str, str], body: bytes) -> ProviderError:
    """Returns the ProviderError for an HTTP error answer (headers: case-insensitive)."""
    error = error_body(body)
    code, retryable = _BY_TYPE.get(str(error.get("type")), status_class(status))
    details = error.get("details")
    if isinstance(details, dict) and details.get("error_code") == _SPEND_LIMIT:
        code, retryable = "budget_exceeded", False
    return http_error(NAME, status, headers, error.get("message"), code, retryable)


def stream_error(error: Any) -> ProviderError:
    """Returns the retryable error for an `error` event after a 200 answer."""
    error = error if isinstance(error, dict) else {}
    code, _ = _BY_TYPE.get(error.get("type"), ("provider_error", True))
    said = quote(error.get("message")) or quote(error.get("type"))
    return ProviderError(
        "Anthropic reported an error mid-answer" + (f": {said}" if said else "."),
        code=code,
        retryable=True,
    )


def _invalid(what: str) -> ProviderError:
    return ProviderError(f"Anthropic sent {what}.", code="invalid_response", retryable=True)
