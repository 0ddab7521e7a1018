"""Hands span records to the OpenTelemetry SDK's OTLP/HTTP exporter.

Imported only when tracing is configured (`[telemetry] endpoint`, or the standard
`OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), so an engine
without it loads none of the SDK and starts no exporter thread. The SDK's batch
processor does the sending on its own thread, off the event loop; `emit` only queues.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from opentelemetry import trace as otel
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Status, StatusCode

from engine.telemetry.spans import SpanRecord

__all__ = ["Exporter"]

_KINDS = {
    "internal": otel.SpanKind.INTERNAL,
    "client": otel.SpanKind.CLIENT,
    "server": otel.SpanKind.SERVER,
}
_SCOPE = InstrumentationScope("subs.engine")


def _context(trace_id: str, span_id: str, sampled: bool = True) -> otel.SpanContext:
    flags = otel.TraceFlags(otel.TraceFlags.SAMPLED if sampled else otel.TraceFlags.DEFAULT)
    return otel.SpanContext(int(trace_id, 16), int(span_id, 16), False, flags)


def readable(record: SpanRecord, resource: Resource) -> ReadableSpan:
    """The SDK's finished-span object for one record (ids and times as recorded)."""
    ctx = record.context
    parent = _context(ctx.trace_id, record.parent_id) if record.parent_id else None
    status = (
        Status(StatusCode.ERROR, record.message or record.error)
        if record.error
        else Status(StatusCode.UNSET)
    )
    return ReadableSpan(
        name=record.name,
        context=_context(ctx.trace_id, ctx.span_id, ctx.sampled),
        parent=parent,
        resource=resource,
        attributes=dict(record.attributes),
        events=[Event(e.name, dict(e.attributes), e.at_ms * 1_000_000) for e in record.events],
        kind=_KINDS[record.kind],
        status=status,
        start_time=record.start_ms * 1_000_000,
        end_time=max(record.end_ms, record.start_ms) * 1_000_000,
        instrumentation_scope=_SCOPE,
    )


class Exporter:
    """Queues finished spans for the OTLP exporter; `aclose` flushes what is queued."""

    def __init__(
        self,
        *,
        endpoint: str | None,
        service_name: str,
        version: str,
        exporter: SpanExporter | None = None,
    ) -> None:
        # Without an endpoint the SDK's exporter reads OTEL_EXPORTER_OTLP_* itself.
        self.resource = Resource.create({"service.name": service_name, "service.version": version})
        self.processor = BatchSpanProcessor(exporter or OTLPSpanExporter(endpoint=endpoint))

    def emit(self, records: Iterable[SpanRecord]) -> None:
        for record in records:
            self.processor.on_end(readable(record, self.resource))

    async def aclose(self) -> None:
        """Send what is queued (bounded by the SDK's export timeout), then stop its thread."""
        await asyncio.to_thread(self.processor.shutdown)
