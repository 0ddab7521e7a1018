"""OpenAI Chat Completions and OpenRouter's dialect of it: request bodies, responses,
stream chunks and error answers, converted to and from the neutral shapes.

Pure: no I/O. `provider` ("openai" or "openrouter") selects the few places the two
differ: how reasoning is asked for, reasoning text in answers, error wording.
Wire facts: notes/engine-facts.md §3.1 and §3.3.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.effects.llm import prices
from engine.effects.llm.errors import ProviderError, error_body, http_error, quote, status_class
from engine.effects.llm.usage import from_openai

NAMES = {"openai": "OpenAI", "openrouter": "OpenRouter"}

_FINISH_REASONS = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "content_filter": "content_filter",
}

# Content part kinds the engine stores by reference; they must be resolved before a call.
_STORED_PARTS = frozenset({"blob", "link", "attachment"})

_NO_ARGUMENTS = {"type": "object", "properties": {}}

# Error table: a vendor error code, else a status, → (code, retryable). What is not
# here follows errors.status_class.
_BY_ERROR_CODE: dict[str, tuple[str, bool]] = {
    "insufficient_quota": ("budget_exceeded", False),
}
_BY_STATUS: dict[str, dict[int, tuple[str, bool]]] = {
    "openai": {},
    "openrouter": {402: ("budget_exceeded", False), 403: ("refused", False)},
}


def build_request(
    request: dict[str, Any], *, stream: bool, provider: str = "openai"
) -> dict[str, Any]:
    """Returns the Chat Completions body for a neutral LlmRequest: the model, tools and
    options first and the messages last, each in a fixed order, so that consecutive calls
    share a byte-identical prefix (OpenAI's automatic prompt caching matches prefixes).

    Raises:
        ProviderError: a message holds content that must be resolved first.
    """
    body: dict[str, Any] = {"model": request["model"]}
    tools = [_tool(tool) for tool in request.get("tools") or () if not tool.get("defer")]
    if tools:
        body["tools"] = tools
    if request.get("temperature") is not None:
        body["temperature"] = request["temperature"]
    if request.get("max_completion_tokens") is not None:
        body["max_completion_tokens"] = request["max_completion_tokens"]
    reasoning = request.get("reasoning") or {}
    if provider == "openrouter":
        config = {key: value for key, value in reasoning.items() if value is not None}
        if config:
            body["reasoning"] = config
    elif reasoning.get("effort") is not None:
        body["reasoning_effort"] = reasoning["effort"]
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    # Last: what stays the same from call to call comes first, so the bytes of two calls
    # of a session share their prefix up to the new messages (OpenAI caches prefixes).
    body["messages"] = [_message(message) for message in request["messages"]]
    return body


def message_groups(
    messages: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]]]:
    """Each neutral message is one Chat Completions message: (no system part, singletons)."""
    return [], [[message] for message in messages]


def convert_group(group: list[dict[str, Any]]) -> dict[str, Any]:
    """One neutral message as an OpenAI chat message (OpenAI needs no grouping)."""
    return _message(group[0])


def _message(message: dict[str, Any]) -> dict[str, Any]:
    role = message["role"]
    content = _content(message.get("content"))
    if role == "tool":
        return {
            "role": "tool",
            "tool_call_id": message.get("tool_call_id") or "",
            "content": "" if content is None else content,
        }
    out: dict[str, Any] = {"role": role}
    if role == "assistant":
        out["content"] = content
        calls = message.get("tool_calls")
        if calls:
            out["tool_calls"] = [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {
                        "name": call["function"]["name"],
                        "arguments": call["function"]["arguments"],
                    },
                }
                for call in calls
            ]
    else:
        out["content"] = "" if content is None else content
    if message.get("name"):
        out["name"] = message["name"]
    return out


def _content(content: Any) -> Any:
    """Neutral parts are OpenAI's own, except the stored kinds, which cannot be sent."""
    if isinstance(content, list):
        for part in content:
            if part.get("type") in _STORED_PARTS:
                raise ProviderError(
                    f"A {part['type']!r} content part must be resolved before a model call."
                )
    return content


def _tool(tool: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": tool["name"],
            "description": tool.get("description", ""),
            "parameters": tool.get("input") or _NO_ARGUMENTS,
        },
    }


def parse_response(body: Any, *, provider: str = "openai") -> dict[str, Any]:
    """Returns the neutral LlmResponse for a non-streaming Chat Completions body.

    Raises:
        ProviderError: "invalid_response" for a body of the wrong shape; a
            retryable error for a body that reports an error.
    """
    name = NAMES[provider]
    if not isinstance(body, dict):
        raise _invalid(name, "a response that is not a JSON object")
    if body.get("error") is not None:
        raise stream_error(body["error"], name)
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise _invalid(name, "a response without choices")
    choice = choices[0]
    if choice.get("finish_reason") == "error":
        raise stream_error(body.get("error"), name)
    message = choice.get("message")
    if not isinstance(message, dict):
        raise _invalid(name, "a choice without a message")
    try:
        calls = [
            {
                "id": call["id"],
                "type": "function",
                "function": {
                    "name": call["function"]["name"],
                    "arguments": call["function"].get("arguments") or "",
                },
            }
            for call in message.get("tool_calls") or ()
        ]
    except (KeyError, TypeError):
        raise _invalid(name, "a malformed tool call") from None
    return _response(
        model=body.get("model") or "",
        text=message.get("content") or "",
        tool_calls=calls,
        finish_reason=_finish_reason(choice.get("finish_reason")),
        raw_usage=body.get("usage"),
        reasoning=message.get("reasoning") if provider == "openrouter" else None,
        provider=provider,
    )


class StreamAccumulator:
    """Folds decoded stream chunks into neutral deltas and, at the end, a response.

    Feed each `data:` JSON object in order; the `[DONE]` sentinel is the caller's.
    """

    def __init__(self, *, provider: str = "openai") -> None:
        self._provider = provider
        self._name = NAMES[provider]
        self._model = ""
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}
        self._finish: str | None = None
        self._usage: dict[str, Any] | None = None
        self._error: Any = None
        self._failed = False

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        """Returns the neutral StreamDeltas carried by one chunk."""
        if chunk.get("error") is not None:
            self._failed, self._error = True, chunk["error"]
            return []
        self._model = chunk.get("model") or self._model
        if isinstance(chunk.get("usage"), dict):
            self._usage = chunk["usage"]
        deltas: list[dict[str, Any]] = []
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self._text.append(delta["content"])
                deltas.append({"text": delta["content"]})
            if self._provider == "openrouter" and delta.get("reasoning"):
                self._reasoning.append(delta["reasoning"])
                deltas.append({"reasoning": delta["reasoning"]})
            pieces = [self._tool_call(fragment) for fragment in delta.get("tool_calls") or ()]
            if pieces:
                deltas.append({"tool_calls": pieces})
            reason = choice.get("finish_reason")
            if reason == "error":
                self._failed = True
            elif reason is not None:
                self._finish = _finish_reason(reason)
                deltas.append({"finish_reason": self._finish})
        return deltas

    def _tool_call(self, fragment: dict[str, Any]) -> dict[str, Any]:
        """Parallel calls are told apart by index; only the first fragment has id and name."""
        index = fragment.get("index", 0)
        function = fragment.get("function") or {}
        call = self._calls.get(index)
        if call is None:
            call = {
                "id": fragment.get("id") or f"call_{index}",
                "name": function.get("name") or "",
                "arguments": [],
            }
            self._calls[index] = call
            piece = {"id": call["id"], "name": call["name"]}
        else:
            piece = {"id": call["id"]}
        if function.get("arguments"):
            call["arguments"].append(function["arguments"])
            piece["arguments"] = function["arguments"]
        return piece

    def finish(self) -> dict[str, Any]:
        """Returns the neutral LlmResponse of the whole stream.

        Raises:
            ProviderError: retryable, when the stream reported an error or ended
                before a finish reason (SPEC.md §7).
        """
        if self._failed:
            raise stream_error(self._error, self._name)
        if self._finish is None:
            raise ProviderError(
                f"The {self._name} stream ended before a finish reason.", retryable=True
            )
        calls = [
            {
                "id": call["id"],
                "type": "function",
                "function": {"name": call["name"], "arguments": "".join(call["arguments"])},
            }
            for _, call in sorted(self._calls.items())
        ]
        return _response(
            model=self._model,
            text="".join(self._text),
            tool_calls=calls,
            finish_reason=self._finish,
            raw_usage=self._usage,
            reasoning="".join(self._reasoning) or None,
            provider=self._provider,
        )


def parse_error(
    status: int, headers: Mapping[str, str], body: bytes, *, provider: str = "openai"
) -> ProviderError:
    """Returns the ProviderError for an HTTP error answer (headers: case-insensitive)."""
    error = error_body(body)
    code, retryable = _BY_STATUS[provider].get(status) or status_class(status)
    vendor_code = error.get("code")
    if isinstance(vendor_code, str) and vendor_code in _BY_ERROR_CODE:
        code, retryable = _BY_ERROR_CODE[vendor_code]
    return http_error(NAMES[provider], status, headers, error.get("message"), code, retryable)


def stream_error(error: Any, name: str) -> ProviderError:
    """Returns the retryable error for an error reported inside a 200 answer."""
    error = error if isinstance(error, dict) else {}
    rate_limited = error.get("code") in (429, "rate_limit_exceeded")
    said = quote(error.get("message"))
    return ProviderError(
        f"{name} reported an error mid-answer" + (f": {said}" if said else "."),
        code="rate_limited" if rate_limited else "provider_error",
        retryable=True,
    )


def _finish_reason(reason: Any) -> str | None:
    if reason is None:
        return None
    return _FINISH_REASONS.get(reason, str(reason))


def _response(
    *,
    model: str,
    text: str,
    tool_calls: list[dict[str, Any]],
    finish_reason: str | None,
    raw_usage: Any,
    reasoning: str | None,
    provider: str,
) -> dict[str, Any]:
    usage = from_openai(raw_usage) if isinstance(raw_usage, dict) else None
    cost = None
    if usage is not None:
        reported = raw_usage.get("cost")
        if isinstance(reported, int | float) and not isinstance(reported, bool):
            cost = prices.usd(reported)
        else:
            cost = prices.cost(model, usage)
    response: dict[str, Any] = {
        "model": model,
        "content": text or None,
        "tool_calls": tool_calls,
        "finish_reason": finish_reason,
        "usage": usage,
        "cost": cost,
    }
    if reasoning:
        response["reasoning"] = {"provider": provider, "text": reasoning}
    return response


def _invalid(name: str, what: str) -> ProviderError:
    return ProviderError(f"{name} sent {what}.", code="invalid_response", retryable=True)
