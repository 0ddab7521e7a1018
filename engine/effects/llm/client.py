"""One model call over HTTP: the only I/O in engine.effects.llm.

The vendor modules convert shapes; this one sends the body, reads the answer
(JSON, or an event stream through `engine.sse`) and turns every transport failure into a
ProviderError. Every answer is read to its end, so its connection goes back to the
engine's pool (`engine.effects.http_pool`). See SPEC.md §7.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol, TypeVar

import aiohttp
from pydantic import BaseModel, ValidationError

from engine.effects.http_pool import drain, failure_name, failure_text, is_decoding
from engine.effects.llm import anthropic, openai, prompts
from engine.effects.llm.errors import ProviderError, quote
from engine.jsonedge import JsonEdgeError, compact_json, loads_checked
from engine.protocol import LlmResponse, StreamDelta
from engine.sse import Event, SseDecoder
from engine.telemetry.logs import CURRENT

ANTHROPIC_VERSION = "2023-06-01"

OnDelta = Callable[[dict[str, Any]], Awaitable[None]]
_T = TypeVar("_T")


@dataclass(frozen=True)
class LlmTarget:
    """Where a call goes.

    Attributes:
        type: "openai", "openrouter" or "anthropic".
        base_url: e.g. https://api.openai.com/v1, https://openrouter.ai/api/v1,
            https://api.anthropic.com.
        api_key: the key, resolved by the caller from the environment.
        api_key_env: the variable's name, for the error when the key is missing; None for
            a server that takes no key (`auth = "none"`): the call is sent without one.
        block: the `[llm.<id>]` block's id, named in connection errors with the URL.
    """

    type: str
    base_url: str
    api_key: str | None
    api_key_env: str | None
    block: str = ""


class _Accumulator(Protocol):
    def feed(self, event: dict[str, Any], /) -> list[dict[str, Any]]: ...

    def finish(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class _Adapter:
    name: str
    path: str
    build: Callable[..., dict[str, Any]]
    groups: prompts.Groups
    convert: prompts.Convert
    parse: Callable[[Any], dict[str, Any]]
    accumulator: Callable[[], _Accumulator]
    parse_error: Callable[[int, Mapping[str, str], bytes], ProviderError]
    auth: Callable[[str | None], dict[str, str]]  # the headers for a key (None: no key)


def _bearer(key: str | None) -> dict[str, str]:
    return {} if key is None else {"Authorization": f"Bearer {key}"}


def _anthropic_auth(key: str | None) -> dict[str, str]:
    version = {"anthropic-version": ANTHROPIC_VERSION}
    return version if key is None else {"x-api-key": key, **version}


def _openai_shaped(provider: str) -> _Adapter:
    return _Adapter(
        name=openai.NAMES[provider],
        path="/chat/completions",
        build=partial(openai.build_request, provider=provider),
        groups=openai.message_groups,
        convert=openai.convert_group,
        parse=partial(openai.parse_response, provider=provider),
        accumulator=partial(openai.StreamAccumulator, provider=provider),
        parse_error=partial(openai.parse_error, provider=provider),
        auth=_bearer,
    )


_ADAPTERS = {
    "openai": _openai_shaped("openai"),
    "openrouter": _openai_shaped("openrouter"),
    "anthropic": _Adapter(
        name=anthropic.NAME,
        path="/v1/messages",
        build=anthropic.build_request,
        groups=anthropic.message_groups,
        convert=anthropic.convert_group,
        parse=anthropic.parse_response,
        accumulator=anthropic.StreamAccumulator,
        parse_error=anthropic.parse_error,
        auth=_anthropic_auth,
    ),
}


async def complete(
    http: aiohttp.ClientSession,
    target: LlmTarget,
    request: dict[str, Any],
    *,
    stream: bool,
    on_delta: OnDelta | None = None,
    kept: prompts.EncodedMessages | None = None,
    session_id: str = "",
) -> dict[str, Any]:
    """Runs one model call.

    Args:
        http: the session to send with; its timeouts bound the call.
        target: the vendor, its URL and key.
        request: a neutral LlmRequest.
        stream: whether to stream the answer.
        on_delta: awaited with each neutral StreamDelta as it arrives.
        kept: the session's messages already encoded in vendor form (engine.effects.llm.prompts);
            without it, the body is built whole.
        session_id: whose messages `kept` holds them as.

    Returns:
        The neutral LlmResponse {model, content, tool_calls, finish_reason,
        usage, cost, reasoning?}.

    Raises:
        ProviderError: for every failure; `retryable` says whether to try again.
            A missing key fails before any request is sent (unless the target takes none).
    """
    adapter = _ADAPTERS.get(target.type)
    if adapter is None:
        raise ProviderError(f"Unknown LLM type {target.type!r}.", param="type")
    if target.api_key_env is not None and not target.api_key:
        raise ProviderError(f"{target.api_key_env} is not set.", param=target.api_key_env)
    url = target.base_url.rstrip("/") + adapter.path
    key = None if target.api_key_env is None else target.api_key
    headers = {"Content-Type": "application/json", **adapter.auth(key)}
    span = CURRENT.get()  # tracing on: the call attempt's span, for a vendor that reads it
    if span is not None:
        headers["traceparent"] = span.traceparent()
    if kept is None:
        body = compact_json(adapter.build(request, stream=stream)).encode()
    else:
        body = prompts.encode_body(
            request,
            scope=(session_id, target.type),
            groups=adapter.groups,
            convert=adapter.convert,
            build=adapter.build,
            stream=stream,
            kept=kept,
        )
    try:
        if stream:
            response = await _streamed(http, adapter, url, headers, body, on_delta)
        else:
            response = await _whole(http, adapter, url, headers, body)
        return _neutral(adapter, response)
    except TimeoutError as exc:  # aiohttp's own; a deadline around the call cancels instead
        name = failure_name(exc)
        where = _where(target) if name == "ConnectTimeout" else ""
        raise ProviderError(
            f"{adapter.name} did not answer in time ({name}){where}.", retryable=True
        ) from exc
    except aiohttp.ClientError as exc:
        if is_decoding(exc):
            raise ProviderError(
                f"{adapter.name} sent a body that could not be decoded.",
                code="invalid_response",
                retryable=True,
            ) from exc
        raise ProviderError(
            f"The connection to {adapter.name} failed{_where(target)}: {_reason(exc)}.",
            retryable=True,
        ) from exc


async def _whole(
    http: aiohttp.ClientSession,
    adapter: _Adapter,
    url: str,
    headers: dict[str, str],
    body: bytes,
) -> dict[str, Any]:
    async with http.post(url, data=body, headers=headers, allow_redirects=False) as response:
        content = await response.read()
    if not 200 <= response.status < 300:
        raise adapter.parse_error(response.status, response.headers, content)
    try:
        document = loads_checked(content)
    except JsonEdgeError as exc:
        problem = "that is not JSON" if exc.syntax else f"this engine refuses ({exc.message})"
        raise ProviderError(
            f"{adapter.name} sent a response {problem}.",
            code="invalid_response",
            retryable=True,
            vendor_status=response.status,
        ) from None
    return _read(adapter, adapter.parse, document, "response")


async def _streamed(
    http: aiohttp.ClientSession,
    adapter: _Adapter,
    url: str,
    headers: dict[str, str],
    body: bytes,
    on_delta: OnDelta | None,
) -> dict[str, Any]:
    headers = {**headers, "Accept": "text/event-stream", "Cache-Control": "no-store"}
    async with http.post(url, data=body, headers=headers, allow_redirects=False) as response:
        if not 200 <= response.status < 300:
            content = await response.read()
            raise adapter.parse_error(response.status, response.headers, content)
        if "text/event-stream" not in response.headers.get("Content-Type", "").lower():
            raise ProviderError(
                f"{adapter.name} answered a streaming call without an event stream.",
                code="invalid_response",
                retryable=True,
            )
        accumulator = adapter.accumulator()
        decoder = SseDecoder()
        try:
            async for chunk in response.content.iter_any():
                if await _on_events(adapter, accumulator, decoder.feed(chunk), on_delta):
                    await drain(response)
                    break
            else:
                await _on_events(adapter, accumulator, decoder.close(), on_delta)
        except UnicodeDecodeError as exc:
            raise ProviderError(
                f"{adapter.name} sent a stream that is not UTF-8 ({exc.reason}).",
                code="invalid_response",
                retryable=True,
            ) from None
        except TimeoutError:
            raise
        except aiohttp.ClientError as exc:
            if is_decoding(exc):
                raise
            raise ProviderError(
                f"The {adapter.name} stream was cut: {_reason(exc)}.", retryable=True
            ) from exc
    return _read(adapter, lambda _: accumulator.finish(), None, "stream")


async def _on_events(
    adapter: _Adapter, accumulator: _Accumulator, events: list[Event], on_delta: OnDelta | None
) -> bool:
    """Vendor stream events; True at `[DONE]`, which ends an OpenAI-shaped stream (the
    caller drains the rest of the body, which the vendor ends right after, so that the
    connection is reused). Comments and empty data are keep-alives."""
    for event in events:
        if event.data == "[DONE]":
            return True
        if not event.data:
            continue
        event_json = _event_json(adapter.name, event.data)
        for delta in _read(adapter, accumulator.feed, event_json, "stream event"):
            _check(adapter, StreamDelta, delta, "stream event")
            if on_delta is not None:
                await on_delta(delta)
    return False


def _read(adapter: _Adapter, reader: Callable[[Any], _T], document: Any, what: str) -> _T:
    """A vendor reader's verdict on a document: a malformed one is one precise error."""
    try:
        return reader(document)
    except ProviderError:
        raise
    except Exception as exc:  # a shape the reader did not expect: KeyError, TypeError…
        raise ProviderError(
            f"{adapter.name} sent a {what} this engine cannot read "
            f"({type(exc).__name__}: {quote(str(exc))}).",
            code="invalid_response",
            retryable=True,
        ) from None


def _neutral(adapter: _Adapter, response: dict[str, Any]) -> dict[str, Any]:
    """What the reader made of the vendor's answer must be a neutral LlmResponse (string
    ids, string arguments…): the machine records it as it is."""
    _check(adapter, LlmResponse, response, "response")
    return response


def _check(adapter: _Adapter, model: type[BaseModel], value: Any, what: str) -> None:
    try:
        model.model_validate(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ProviderError(
            f"{adapter.name} sent a {what} this engine cannot record: {where}: {first['msg']}.",
            code="invalid_response",
            retryable=True,
        ) from None


def _event_json(name: str, data: str) -> dict[str, Any]:
    try:
        payload = loads_checked(data)
    except JsonEdgeError as exc:
        if not exc.syntax:
            raise ProviderError(
                f"{name} sent a stream event this engine refuses ({exc.message}).",
                code="invalid_response",
                retryable=True,
            ) from None
        payload = None
    if not isinstance(payload, dict):
        raise ProviderError(
            f"{name} sent a stream event that is not a JSON object.",
            code="invalid_response",
            retryable=True,
        )
    return payload


def _where(target: LlmTarget) -> str:
    """Which block and URL a connection went to: a wrong `base_url` is the usual cause."""
    block = f"[llm.{target.block}] " if target.block else ""
    return f" ({block}base_url {target.base_url})"


def _reason(exc: Exception) -> str:
    return quote(failure_text(exc)).rstrip(".") or failure_name(exc)
