"""Tracing: each turn is one OpenTelemetry trace, projected from the facts its log records.

`ids` derives trace and span ids from the turn (so a turn finished by another process
continues the same trace), `spans` turns committed events into span records (pure),
and `export` hands them to the OpenTelemetry SDK's OTLP exporter (only imported when
tracing is configured).
"""
