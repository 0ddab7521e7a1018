"""The worker itself: handlers by trigger type, and one request in, one answer out.

`Worker.handle` is the whole protocol without a web framework (signature, parsing,
dispatch, encoding); `subs.worker.aio` and `subs.worker.asgi` only carry its bytes.
A trigger with no handler gets the engine's own plan (`proposed`), which is what an
engine-decided agent does, so a worker writes only the steps it cares about.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import ValidationError

from subs.worker.models import (
    DecisionRequest,
    DecisionResponse,
    ToolErrorAction,
    ToolExecuteTrigger,
    ToolResultAction,
)
from subs.worker.signature import SignatureError, verify
from subs.worker.stream import Stream

__all__ = ["LATER", "TRIGGER_TYPES", "Later", "Reply", "ToolError", "Worker"]

log = logging.getLogger("subs.worker")

TRIGGER_TYPES = frozenset(
    {
        "session.start",
        "client.messages",
        "client.action",
        "tool.execute",
        "tool.finished",
        "llm.execute",
        "llm.finished",
        "subagent.finished",
        "interrupt.resumed",
        "turn.finished",
    }
)
MAX_BODY = 64 * 1024 * 1024  # a long conversation is a big request


class Later:
    """Answer nothing now (`{}`): for `tool.execute`, the call stays open until
    `SubsClient.settle`; for another trigger, until `SubsClient.submit_decision`."""


LATER = Later()


class ToolError(Exception):
    """Raised by a tool to answer `tool.error` (`retryable=False`: no retry)."""

    def __init__(self, message: str, *, retryable: bool | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable


Answer = DecisionResponse | dict[str, Any] | Stream | Later | None
Handler = Callable[[DecisionRequest], Awaitable[Answer]]
ToolHandler = Callable[[dict[str, Any], DecisionRequest], Awaitable[Any]]
H = TypeVar("H", bound=Callable[..., Awaitable[Any]])


@dataclass(frozen=True)
class Reply:
    """An HTTP answer: JSON `body`, or a `text/event-stream` of `stream`'s bytes."""

    status: int
    body: bytes = b""
    stream: AsyncIterator[bytes] | None = None

    @property
    def content_type(self) -> str:
        """What the body is."""
        return "text/event-stream" if self.stream is not None else "application/json"

    @staticmethod
    def error(status: int, message: str) -> Reply:
        """A refusal the engine records as the attempt's reason."""
        return Reply(status, json.dumps({"error": message}).encode())


class Worker:
    """Handlers by trigger type (`@worker.on("llm.finished")`) and worker tools by name
    (`@worker.tool("runbook")`). `secret` (what the agent's `signing_secret_env` holds)
    makes every request's signature checked; `None` checks none (tests, a private net)."""

    def __init__(self, secret: str | bytes | None, *, window: int = 300) -> None:
        self.secret = secret
        self.window = window
        self.handlers: dict[str, Handler] = {}
        self.tools: dict[str, ToolHandler] = {}

    def on(self, trigger_type: str) -> Callable[[H], H]:
        """Register the handler of one trigger type; it returns a DecisionResponse (or
        its dict), a `Stream`, `LATER`, or `None` for the engine's plan."""
        if trigger_type not in TRIGGER_TYPES:
            raise ValueError(f"no trigger {trigger_type!r}; one of {sorted(TRIGGER_TYPES)}")

        def register(handler: H) -> H:
            self.handlers[trigger_type] = handler
            return handler

        return register

    def tool(self, name: str) -> Callable[[H], H]:
        """Register a worker tool: called with its (valid) arguments and the request, it
        returns the result (any JSON), raises `ToolError`, or returns `LATER` (async)."""

        def register(handler: H) -> H:
            self.tools[name] = handler
            return handler

        return register

    async def decide(self, request: DecisionRequest) -> DecisionResponse | Stream | Later:
        """The answer to one request."""
        handler = self.handlers.get(request.trigger.type)
        if handler is not None:
            answer = await handler(request)
        elif isinstance(request.trigger, ToolExecuteTrigger):
            answer = await self._run_tool(request, request.trigger)
        else:
            answer = None
        if answer is None:
            return request.proposed
        if isinstance(answer, DecisionResponse | Stream | Later):
            return answer
        return DecisionResponse.model_validate(answer)

    async def _run_tool(self, request: DecisionRequest, trigger: ToolExecuteTrigger) -> Answer:
        if trigger.input.status != "valid":
            return None  # the engine proposes the tool.error that says what is wrong
        tool = self.tools.get(trigger.name)
        if tool is None:
            error = f"this worker has no tool {trigger.name!r}"
            return DecisionResponse(actions=[ToolErrorAction(error=error, retryable=False)])
        try:
            result = await tool(trigger.input.value, request)
        except ToolError as exc:
            return DecisionResponse(
                actions=[ToolErrorAction(error=str(exc), retryable=exc.retryable)]
            )
        if isinstance(result, Later):
            return result
        return DecisionResponse(actions=[ToolResultAction(result=result)])

    async def handle(self, body: bytes, headers: Mapping[str, str]) -> Reply:
        """One HTTP request's bytes and headers to its answer: 401 for a signature that
        does not hold, 400 for a body that is not a DecisionRequest, 500 for a handler
        that raised (the engine records each as a failed attempt and retries)."""
        if self.secret is not None:
            try:
                verify(self.secret, body, headers, window=self.window)
            except SignatureError as exc:
                return Reply.error(401, str(exc))
        try:
            request = DecisionRequest.model_validate_json(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "body"
            return Reply.error(400, f"not a DecisionRequest: {where}: {first['msg']}")
        try:
            answer = await self.decide(request)
        except Exception as exc:
            log.exception("decision %s (%s) failed", request.decision_id, request.trigger.type)
            return Reply.error(500, f"the worker failed: {type(exc).__name__}: {exc}")
        if isinstance(answer, Stream):
            return Reply(200, stream=answer.frames())
        if isinstance(answer, Later):
            return Reply(200, b"{}")
        return Reply(200, json.dumps(answer.to_wire()).encode())
