"""Run a worker's effects: the live decision and a call's `tool.execute` / `llm.execute`.

Each function turns one delivery attempt into the machine input that reports
it. The request body is built from the committed state before any await, so a
later transition cannot change what was sent.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import ValidationError

from .llm import ProviderError, anthropic, openai
from .machine import (
    DecisionAnswered,
    DecisionFailed,
    ExecuteAnswered,
    ExecuteFailed,
    Input,
    SessionState,
)
from .machine.request import control_request, execute_request
from .protocol import LlmResponse, to_json
from .worker import DecisionFailure, Delivery, deliver

AddDelta = Callable[[dict[str, Any]], None]

_VENDORS: dict[str, Any] = {"openai": openai, "anthropic": anthropic}


@dataclass(frozen=True)
class WorkerTarget:
    url: str
    secret: str | None


def _body(request: dict[str, Any]) -> bytes:
    return json.dumps(request, separators=(",", ":"), ensure_ascii=False).encode()


def _timeout(deadline_ms: int | None, now_ms: int) -> float:
    return 300.0 if deadline_ms is None else max((deadline_ms - now_ms) / 1000, 0.5)


def _error(failure: DecisionFailure) -> dict[str, Any]:
    error: dict[str, Any] = {"message": failure.message, "code": failure.code}
    if failure.param:
        error["param"] = failure.param
    if failure.detail:
        error["detail"] = failure.detail
    return error


class DecisionRun:
    """One attempt of the live decision."""

    def __init__(self, state: SessionState, target: WorkerTarget, now_ms: int) -> None:
        d = state.decision
        assert d is not None
        self.decision_id, self.attempt = d.id, d.attempt
        self.delivery = Delivery(
            target.url, _body(control_request(state)), target.secret, _timeout(d.deadline, now_ms)
        )

    async def run(self, http: httpx.AsyncClient) -> Input:
        try:
            response = await deliver(http, self.delivery)
        except DecisionFailure as failure:
            return DecisionFailed(
                self.decision_id, self.attempt, _error(failure), failure.retryable
            )
        return DecisionAnswered(self.decision_id, self.attempt, response)


class ExecuteRun:
    """One attempt of a worker call's execute; normalises vendor-format model answers."""

    def __init__(
        self, state: SessionState, call_id: str, target: WorkerTarget, now_ms: int
    ) -> None:
        call = state.calls[call_id]
        self.call_id, self.attempt, self.kind = call.id, call.attempt, call.kind
        request = execute_request(state, call)
        trigger = request["trigger"]
        self.format: str | None = trigger.get("format")
        if self.format:
            # The vendor's own body, ready to send; the trigger's `stream` is authoritative.
            body = _VENDORS[self.format].build_request(trigger["request"], stream=False)
            body.pop("stream", None)
            trigger["request"] = body
        self.delivery = Delivery(
            target.url, _body(request), target.secret, _timeout(call.deadline, now_ms)
        )
        self.accumulator = _VENDORS[self.format].StreamAccumulator() if self.format else None
        self.delta_seq = 0

    async def run(self, http: httpx.AsyncClient, add_delta: AddDelta) -> Input:
        async def on_delta(frame: dict[str, Any]) -> None:
            deltas = self.accumulator.feed(frame) if self.accumulator else [frame]
            for delta in deltas:
                self.delta_seq += 1
                add_delta(
                    {
                        "call_id": self.call_id,
                        "attempt": self.attempt,
                        "seq": self.delta_seq,
                        **delta,
                    }
                )

        try:
            response = await deliver(http, self.delivery, on_delta)
            if self.kind == "llm":
                response = self._neutral(response)
        except DecisionFailure as failure:
            return ExecuteFailed(self.call_id, self.attempt, _error(failure), failure.retryable)
        return ExecuteAnswered(self.call_id, self.attempt, response)

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
        try:
            if self.format:
                return _VENDORS[self.format].parse_response(body)
            return to_json(LlmResponse.model_validate(body))
        except ProviderError as err:
            raise DecisionFailure(
                f"{where}: {err.message}", code="invalid_response", param=where
            ) from None
        except ValidationError as err:
            first = err.errors()[0]
            loc = ".".join(str(p) for p in first["loc"])
            raise DecisionFailure(
                f"{where}.{loc}: {first['msg']}", code="invalid_response", param=f"{where}.{loc}"
            ) from None
