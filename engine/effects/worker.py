"""Run a worker's effects: the live decision and a call's `tool.execute` / `llm.execute`.

Each function turns one delivery attempt into the machine input that reports
it. The request body is built from the committed state before any await, so a
later transition cannot change what was sent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import aiohttp
import orjson
from pydantic import TypeAdapter, ValidationError

from engine.effects.delivery import DecisionFailure, Deferred, Delivery, deliver
from engine.effects.llm import ProviderError, anthropic, caching, openai, prompts
from engine.effects.llm.files import Fetch, resolve_files
from engine.errors import SubsError
from engine.jsonedge import encode
from engine.machine import (
    DecisionAnswered,
    DecisionDeferred,
    DecisionFailed,
    ExecuteAnswered,
    ExecuteFailed,
    Input,
    SessionState,
)
from engine.machine.request import control_request, execute_request
from engine.machine.shapes import Answer
from engine.protocol import (
    DecisionRequest,
    LlmResponse,
    Message,
    Nullable,
    StreamDelta,
    WireModel,
    to_json,
)
from engine.telemetry.ids import SpanContext
from engine.telemetry.spans import attempt_context, call_context, turn_context

AddDelta = Callable[[dict[str, Any]], None]

_VENDORS: dict[str, Any] = {"openai": openai, "anthropic": anthropic}


@dataclass(frozen=True)
class WorkerTarget:
    """Where an agent's worker answers, and the secret its requests are signed with."""

    url: str
    secret: str | None


def _body(request: dict[str, Any]) -> bytes:
    return encode(request)


def _checked(response: dict[str, Any]) -> Answer:
    """A DecisionResponse `deliver` validated (its pydantic model, dumped by `to_json`)
    as the machine's shape of it."""
    return cast(Answer, response)


def _timeout(deadline_ms: int | None, now_ms: int) -> float:
    return 300.0 if deadline_ms is None else max((deadline_ms - now_ms) / 1000, 0.5)


class DecisionRun:
    """One attempt of the live decision."""

    def __init__(
        self,
        state: SessionState,
        target: WorkerTarget,
        now_ms: int,
        checked: CheckedMessages,
        sampled: bool = False,
    ) -> None:
        d = state.decision
        assert d is not None
        self.decision_id, self.attempt = d.id, d.attempt
        request = control_request(state)
        _check_outgoing(request, checked)
        span = tracestate = None
        if state.turn is not None:
            turn = turn_context(state.session_id, state.turn.id, sampled, state.turn.trace)
            span = attempt_context(turn, "decision", d.id, d.attempt).traceparent()
            tracestate = state.turn.tracestate
        timeout = _timeout(d.deadline, now_ms)
        self.delivery = Delivery(
            target.url, _body(request), target.secret, timeout, span, tracestate
        )

    async def run(self, http: aiohttp.ClientSession) -> Input:
        """Deliver the decision; the answer or the failure is one machine input."""
        try:
            response = await deliver(http, self.delivery, defer=True)
        except Deferred:  # an empty body: the worker submits its answer later
            return DecisionDeferred(self.decision_id, self.attempt)
        except DecisionFailure as failure:
            return DecisionFailed(self.decision_id, self.attempt, failure.info(), failure.retryable)
        return DecisionAnswered(self.decision_id, self.attempt, _checked(response))


class ExecuteRun:
    """One attempt of a worker call's execute; normalises vendor-format model answers."""

    def __init__(
        self,
        state: SessionState,
        call_id: str,
        target: WorkerTarget,
        now_ms: int,
        checked: CheckedMessages,
        sampled: bool = False,
        cache: bool = True,
    ) -> None:
        call = state.calls[call_id]
        self.call_id, self.attempt, self.kind = call.id, call.attempt, call.kind
        request = execute_request(state, call)
        _check_outgoing(request, checked)  # with the neutral LlmRequest, before any vendor body
        self.request = request
        self.format: str | None = request["trigger"].get("format")
        ctx = call_context(state, call.id, call.attempt)
        assert ctx is not None  # the call is open
        span = SpanContext(ctx.trace_id, ctx.span_id, sampled).traceparent()
        self.target, self.timeout = target, _timeout(call.deadline, now_ms)
        self.traceparent = span
        turn = state.turn
        self.tracestate = turn.tracestate if turn is not None and turn.id == call.turn_id else None
        self.accumulator = _VENDORS[self.format].StreamAccumulator() if self.format else None
        self.delta_seq = 0
        self.cache = cache  # the agent's `[llm.<id>] cache`: breakpoints as the engine puts them

    def _vendor_body(self, neutral: dict[str, Any]) -> dict[str, Any]:
        """The vendor's own body, ready to send but for `stream` (the trigger's is
        authoritative), with the cache breakpoints the engine would put on it (the Anthropic
        format: engine/effects/llm/caching.py); content the format cannot carry
        (input_audio…) is unroutable."""
        assert self.format is not None
        vendor = _VENDORS[self.format]
        wants = caching.caching_for(self.format, str(neutral.get("model") or ""), self.cache)
        try:
            if wants is None:
                body: dict[str, Any] = vendor.build_request(neutral, stream=False)
            else:
                encoded = prompts.encode_body(
                    neutral,
                    scope=("", self.format),
                    groups=vendor.message_groups,
                    convert=vendor.convert_group,
                    build=vendor.build_request,
                    stream=False,
                    kept=prompts.EncodedMessages(),
                    caching=wants,
                )
                body = orjson.loads(encoded)
        except ProviderError as err:
            raise SubsError(
                f"the model request cannot be sent in the {self.format} format: {err.message}",
                code="unroutable",
            ) from None
        body.pop("stream", None)
        return body

    async def delivery(self, fetch: Fetch) -> Delivery:
        """What is sent: with a `format`, the vendor's body, the session's stored files
        (images, PDFs) read and put in it as that vendor takes them (`fetch` reads them)."""
        request = self.request
        if self.format:
            trigger = request["trigger"]
            neutral = await resolve_files(trigger["request"], fetch, self.format)
            request = {**request, "trigger": {**trigger, "request": self._vendor_body(neutral)}}
        target, body = self.target, _body(request)
        trace, state = self.traceparent, self.tracestate
        return Delivery(target.url, body, target.secret, self.timeout, trace, state)

    async def run(
        self, http: aiohttp.ClientSession, add_delta: AddDelta, fetch: Fetch | None = None
    ) -> Input:
        """Deliver the call to the worker, streaming its deltas; one machine input at the end.

        `fetch` reads the session's stored files (None: a request that holds none)."""

        async def on_delta(frame: dict[str, Any]) -> None:
            for delta in self._deltas(frame):
                self.delta_seq += 1
                # Ours last: a frame cannot overwrite the call, attempt or order it belongs to.
                add_delta(
                    {
                        **delta,
                        "call_id": self.call_id,
                        "attempt": self.attempt,
                        "seq": self.delta_seq,
                    }
                )

        try:
            delivery = await self.delivery(fetch or _no_files)
        except SubsError as err:
            return ExecuteFailed(self.call_id, self.attempt, err.info(), False)
        try:
            response = await deliver(http, delivery, on_delta)
            if self.kind == "llm":
                response = self._neutral(response)
        except DecisionFailure as failure:
            return ExecuteFailed(self.call_id, self.attempt, failure.info(), failure.retryable)
        return ExecuteAnswered(self.call_id, self.attempt, _checked(response))

    def _deltas(self, frame: dict[str, Any]) -> list[dict[str, Any]]:
        """One `llm.token.delta` frame as neutral StreamDeltas, or a precise failure."""
        where = f"llm.token.delta {self.delta_seq + 1}"
        if self.accumulator is None:
            return [_validated(StreamDelta, frame, where)]
        try:
            deltas = self.accumulator.feed(frame)
        except ProviderError as err:
            raise _unreadable(f"{where}: {err.message}") from None
        except Exception as err:  # a vendor event our reader cannot take apart
            raise _unreadable(
                f"{where}: not a valid {self.format} stream event ({type(err).__name__}: {err})"
            ) from None
        # What the vendor reader made of the event must be a neutral delta too.
        return [_validated(StreamDelta, delta, where) for delta in deltas]

    def _neutral(self, response: dict[str, Any]) -> dict[str, Any]:
        """Every `llm.result` as a neutral LlmResponse (SPEC §7), or a precise failure."""
        actions = []
        for i, action in enumerate(response.get("actions") or ()):
            if action["type"] == "llm.result":
                action = {**action, "response": self._normalise(action["response"], i)}
            actions.append(action)
        return {**response, "actions": actions} if actions else response

    def _normalise(self, body: Any, i: int) -> dict[str, Any]:
        where = f"actions.{i}.response"
        if not self.format:
            return _validated(LlmResponse, body, where)
        try:
            parsed = _VENDORS[self.format].parse_response(body)
        except ProviderError as err:
            raise _unreadable(f"{where}: {err.message}", param=where) from None
        except Exception as err:  # a vendor body our reader cannot take apart
            raise _unreadable(
                f"{where}: not a valid {self.format} response ({type(err).__name__}: {err})",
                param=where,
            ) from None
        # What the vendor reader made of it must be a neutral response too (ids are strings…).
        return _validated(LlmResponse, parsed, where)


async def _no_files(digests: Sequence[str]) -> list[bytes | None]:
    return [None for _ in digests]


class Unsendable(SubsError):
    """A request we built would not be a valid protocol document: our bug, never sent."""

    code = "internal"


class _CheckedNode(WireModel):
    message: Any  # checked by CheckedMessages
    parent_id: Nullable[str] = None


class _CheckedTree(WireModel):
    nodes: list[_CheckedNode]
    head_id: Nullable[str] = None


class _RequestAround(DecisionRequest):
    """A DecisionRequest but for its recorded messages, which CheckedMessages checks."""

    messages: list[Any]
    # A narrower field on purpose: this model only validates, it is never used as a
    # DecisionRequest, so the Liskov rule mypy applies to the attribute does not bear.
    message_tree: _CheckedTree  # type: ignore[assignment]


_MESSAGE: TypeAdapter[Message] = TypeAdapter(Message)


class CheckedMessages:
    """Recorded messages found valid, by identity, so each is checked once, not at every
    decision (at turn 5 they were 90% of a request's check, and they grow with it).

    A recorded message is a fact: the state holds the same dict from step to step
    and never changes it. Each is held here, so its `id()` stays its own; `limit`
    bounds what is held past its session's state (a reload makes new dicts), the
    oldest going first (a miss costs only a check).
    """

    def __init__(self, limit: int = 20_000) -> None:
        self.limit = limit
        self._held: dict[int, Any] = {}

    def check(self, where: str, message: Any) -> None:
        """Refuse a message the protocol would not accept, before it is sent anywhere."""
        if id(message) in self._held:
            return
        try:
            _MESSAGE.validate_python(message)
        except ValidationError as err:
            raise _unsendable(err, where) from None
        if len(self._held) >= self.limit:
            del self._held[next(iter(self._held))]  # the oldest
        self._held[id(message)] = message


def _check_outgoing(request: dict[str, Any], checked: CheckedMessages) -> None:
    """What goes to a worker must validate against the protocol (SPEC: our output is checked)."""
    try:
        _RequestAround.model_validate(request)
    except ValidationError as err:
        raise _unsendable(err, "") from None
    for i, message in enumerate(request["messages"]):
        checked.check(f"messages.{i}.", message)
    for i, node in enumerate(request["message_tree"]["nodes"]):
        checked.check(f"message_tree.nodes.{i}.message.", node["message"])


def _unsendable(err: ValidationError, where: str) -> Unsendable:
    first = err.errors()[0]
    loc = where + ".".join(str(p) for p in first["loc"])
    return Unsendable(f"the decision request is invalid at {loc.rstrip('.')}: {first['msg']}")


def _validated(model: type[WireModel], body: Any, where: str) -> dict[str, Any]:
    try:
        return to_json(model.model_validate(body))
    except ValidationError as err:
        first = err.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        param = f"{where}.{loc}" if loc else where
        raise _unreadable(f"{param}: {first['msg']}", param=param) from None


def _unreadable(message: str, *, param: str | None = None) -> DecisionFailure:
    return DecisionFailure(message, code="invalid_response", param=param)
