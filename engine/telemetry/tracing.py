"""Whether this engine traces, and the one object its applier hands each commit to."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Protocol

from engine.config import Project
from engine.telemetry.spans import Before, Projector, SpanRecord

__all__ = ["Tracing", "tracing_from"]


class Sink(Protocol):
    def emit(self, records: Iterable[SpanRecord]) -> None: ...

    async def aclose(self) -> None: ...


class Tracing:
    """Projects each commit's events into spans and hands the finished ones on."""

    def __init__(self, sink: Sink, *, capture: bool = False) -> None:
        self.capture = capture  # prompts and completions on chat spans (capture_content)
        self.projector = Projector(capture=capture)
        self.sink = sink
        # Masks the secrets the process knows in captured content (set by the engine).
        self.scrub: Callable[[str], str] = lambda text: text

    def committed(
        self, before: Before, envelopes: Iterable[Mapping[str, Any]], decided: Sequence[str] = ()
    ) -> None:
        """A commit landed: its events become spans, the finished ones handed to the sink,
        with one for each trigger the engine decided itself in it (`decided`)."""
        spans = self.projector.project(before, envelopes, decided)
        if self.capture:
            spans = [_scrubbed(s, self.scrub) for s in spans]
        if spans:
            self.sink.emit(spans)

    def emit(self, records: Iterable[SpanRecord]) -> None:
        """Spans measured as they happened (the Slack bot's), exported as they are."""
        self.sink.emit(records)

    async def aclose(self) -> None:
        """Flush and close the sink: spans of a stopping engine are not lost."""
        await self.sink.aclose()


def _scrubbed(record: SpanRecord, scrub: Callable[[str], str]) -> SpanRecord:
    """`record` with the captured messages' secrets masked."""
    attributes = dict(record.attributes)
    for key in ("gen_ai.input.messages", "gen_ai.output.messages"):
        value = attributes.get(key)
        if isinstance(value, str):
            attributes[key] = scrub(value)
    return dataclasses.replace(record, attributes=attributes)


def _on(value: str | None) -> bool:
    return bool(value and value.strip())


def tracing_from(project: Project, env: Mapping[str, str]) -> Tracing | None:
    """The engine's tracing as `[telemetry]` and the standard `OTEL_*` variables say.

    Off (None) unless an endpoint is named, in the file or by `OTEL_EXPORTER_OTLP_ENDPOINT`
    / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (which, as every `SUBS_*` variable does, beat
    the file); `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` turn it off.
    """
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return None
    from_env = _on(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")) or _on(
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )
    endpoint = None
    if not from_env:
        if project.telemetry.endpoint is None:
            return None
        endpoint = project.telemetry.endpoint.rstrip("/") + "/v1/traces"
    from engine.telemetry.export import Exporter  # the SDK loads only when tracing is on

    try:
        subs_version = version("subs")
    except PackageNotFoundError:
        subs_version = "0"
    service = (env.get("OTEL_SERVICE_NAME") or "").strip() or project.telemetry.service_name
    exporter = Exporter(endpoint=endpoint, service_name=service, version=subs_version)
    return Tracing(exporter, capture=project.telemetry.capture_content)
