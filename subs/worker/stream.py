"""Streamed answers: `llm.token.delta` frames, then exactly one `decision.result`.

A worker running the model itself (`llm.execute` with `stream: true`) can show the
reply as it comes: the engine passes each delta to the session's event stream, and
records only the final `decision.result`. A `Stream` turns an async iterable of deltas
ending in a DecisionResponse into those frames; anything raised on the way becomes a
`decision.error` frame, so the engine records a failed attempt with the reason.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

from subs.worker.models import DecisionResponse, LlmResultAction, StreamDelta

__all__ = ["Stream", "frame", "stream_text"]

Item = StreamDelta | DecisionResponse | dict[str, Any]


def frame(event: str, data: Any) -> bytes:
    """One server-sent event: its name and its data as one line of JSON."""
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


class Stream:
    """A streamed answer: iterate `items`, whose deltas (`StreamDelta`, or a dict of its
    members) are sent as they come, and whose one `DecisionResponse` ends it."""

    def __init__(self, items: AsyncIterable[Item]) -> None:
        self.items = items

    async def frames(self) -> AsyncIterator[bytes]:
        """The bytes of the `text/event-stream` body."""
        try:
            async for item in self.items:
                if isinstance(item, DecisionResponse):
                    yield frame("decision.result", item.to_wire())
                    return
                delta = item if isinstance(item, StreamDelta) else StreamDelta.model_validate(item)
                yield frame("llm.token.delta", delta.model_dump(mode="json"))
        except Exception as exc:  # the worker's own failure: the engine records it, retries
            yield frame("decision.error", {"message": f"{type(exc).__name__}: {exc}"})
            return
        yield frame("decision.error", {"message": "the stream ended without a decision.result"})


def stream_text(chunks: AsyncIterable[str], *, model: str) -> Stream:
    """An `llm.execute` answered as text: each chunk a delta, then the `llm.result` of
    the whole text (the neutral `LlmResponse`; for a `format`, build your own Stream)."""

    async def items() -> AsyncIterator[Item]:
        text = []
        async for chunk in chunks:
            text.append(chunk)
            yield StreamDelta(text=chunk)
        yield StreamDelta(finish_reason="stop")
        response = {"model": model, "content": "".join(text), "finish_reason": "stop"}
        yield DecisionResponse(actions=[LlmResultAction(response=response)])

    return Stream(items())
