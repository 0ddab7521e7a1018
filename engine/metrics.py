"""Prometheus metrics (text format 0.0.4): what the engine and the API count.

Both sides write into one `Metrics` object per process; `/metrics` renders it. Below the
runtime, the effect runners and the API, which all count into it.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import accumulate

_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# The bucket boundaries the OpenTelemetry GenAI conventions advise for their client metrics.
_GENAI_SECONDS = tuple(0.01 * 2**i for i in range(14))  # 0.01, 0.02, 0.04, ... 81.92
_GENAI_TOKENS = tuple(float(4**i) for i in range(14))  # 1, 4, 16, ... 67108864
# subs_model_input_tokens_total's `cache` label values, and the usage field each counts.
_INPUT_CACHES = ("uncached", "cache_read", "cache_write")
_INPUT_FIELDS = ("uncached_input", "cache_read", "cache_write")


@dataclass
class _Histogram:
    buckets: tuple[float, ...] = _SECONDS
    # Observations by the first bucket they fall in (the last slot: above every bound);
    # `cumulative()` gives Prometheus' counts. One bisect per observation, not a scan of
    # every bound: a model call observes three of these.
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = self.counts or [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        if value == value:  # NaN falls in no bucket (no bound is >= it), only the count
            self.counts[bisect_left(self.buckets, value)] += 1
        self.total += value
        self.count += 1

    def cumulative(self) -> list[int]:
        """Per bound, the observations at or below it."""
        return list(accumulate(self.counts[: len(self.buckets)]))


Key = tuple[tuple[str, str], ...]  # a series' labels, sorted by name


def _key(labels: Mapping[str, str]) -> Key:
    return tuple(sorted(labels.items())) if labels else ()


def _labels(pairs: tuple[tuple[str, str], ...]) -> str:
    if not pairs:
        return ""
    escaped = (
        (k, v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")) for k, v in pairs
    )
    return "{" + ",".join(f'{k}="{v}"' for k, v in escaped) + "}"


class Metrics:
    """Counters, gauges and histograms in Prometheus text format 0.0.4.

    The API feeds the HTTP and SSE series; the engine calls the hooks for turns,
    steps, partitions and call durations.
    """

    _HELP = {
        "subs_turns_started_total": ("counter", "Turns started."),
        "subs_turns_completed_total": ("counter", "Turns that completed."),
        "subs_turns_failed_total": ("counter", "Turns that failed."),
        "subs_steps_committed_total": ("counter", "Machine transitions committed to Redis."),
        "subs_partition_leases_lost_total": ("counter", "Partition leases lapsed before renewal."),
        "subs_sse_overflows_total": ("counter", "Event streams dropped as too slow."),
        "subs_http_requests_total": ("counter", "HTTP requests answered."),
        "subs_slack_refusals_total": (
            "counter",
            "Slack inputs refused by an agent's allow list or external = false.",
        ),
        "subs_sse_streams_open": ("gauge", "Event streams open now."),
        "subs_sse_readers": ("gauge", "Redis readers behind the event streams (one a partition)."),
        "subs_partitions_owned": ("gauge", "Partitions this process owns."),
        "subs_redis_used_memory_bytes": ("gauge", "Redis used_memory, as last read."),
        "subs_redis_maxmemory_bytes": ("gauge", "Redis maxmemory (0: no limit)."),
        "subs_store_full": (
            "gauge",
            "1 while Redis is past 90% of maxmemory: new sessions are refused (store_full).",
        ),
        "subs_store_oom_total": ("counter", "Commits Redis refused at maxmemory (retried)."),
        "subs_sessions_archived_total": ("counter", "Sessions the retention sweep removed."),
        "subs_model_call_seconds": ("histogram", "Duration of one model call attempt."),
        "subs_worker_call_seconds": ("histogram", "Duration of one worker delivery."),
        "subs_http_request_seconds": ("histogram", "HTTP request duration (to the last byte)."),
        "subs_model_input_tokens_total": (
            "counter",
            "Input tokens of answered model calls, by cache: uncached, cache_read (read from "
            "the vendor's prompt cache, at its price) or cache_write (written to it).",
        ),
        # The OpenTelemetry GenAI client metrics, under their Prometheus names.
        "gen_ai_client_operation_duration_seconds": (
            "histogram",
            "GenAI operation duration (gen_ai.client.operation.duration): one model call attempt.",
        ),
        "gen_ai_client_token_usage": (
            "histogram",
            "Tokens used per model call (gen_ai.client.token.usage), by gen_ai_token_type.",
        ),
    }
    _BUCKETS = {
        "gen_ai_client_operation_duration_seconds": _GENAI_SECONDS,
        "gen_ai_client_token_usage": _GENAI_TOKENS,
    }

    def __init__(self) -> None:
        self._values: dict[str, dict[tuple[tuple[str, str], ...], float]] = {
            name: {} for name, (kind, _) in self._HELP.items() if kind != "histogram"
        }
        self._histograms: dict[str, dict[tuple[tuple[str, str], ...], _Histogram]] = {
            name: {} for name, (kind, _) in self._HELP.items() if kind == "histogram"
        }
        # The series keys of a model call's metrics by (provider, model, error): worked out
        # once, not sorted again at every call (a few of each: they are series already).
        self._chat_keys: dict[tuple[str, str, str | None], tuple[Key, dict[str, Key]]] = {}
        self._input_keys: dict[tuple[str, str], tuple[Key, ...]] = {}

    def inc(self, name: str, amount: float = 1, **labels: str) -> None:
        """Add to a counter."""
        series = self._values[name]
        key = _key(labels)
        series[key] = series.get(key, 0) + amount

    def set(self, name: str, value: float, **labels: str) -> None:
        """Set a gauge."""
        self._values[name][_key(labels)] = value

    def observe(self, name: str, value: float, **labels: str) -> None:
        """Add one observation to a histogram."""
        self._observe(name, _key(labels), value)

    def _observe(self, name: str, key: Key, value: float) -> None:
        series = self._histograms[name]
        histogram = series.get(key)
        if histogram is None:
            histogram = series[key] = _Histogram(self._BUCKETS.get(name, _SECONDS))
        histogram.observe(value)

    def value(self, name: str, **labels: str) -> float:
        """A counter's or gauge's value now (tests, benches)."""
        return self._values[name].get(_key(labels), 0)

    # The engine's hooks.
    def turn_started(self) -> None:
        """Hook: a turn started."""
        self.inc("subs_turns_started_total")

    def turn_completed(self) -> None:
        """Hook: a turn completed."""
        self.inc("subs_turns_completed_total")

    def turn_failed(self) -> None:
        """Hook: a turn failed."""
        self.inc("subs_turns_failed_total")

    def steps_committed(self, n: int = 1) -> None:
        """Hook: `n` steps were committed."""
        self.inc("subs_steps_committed_total", n)

    def lease_lost(self) -> None:
        """Hook: another engine took one of our partitions."""
        self.inc("subs_partition_leases_lost_total")

    def partitions_owned(self, n: int) -> None:
        """Hook: how many partitions this engine holds now."""
        self.set("subs_partitions_owned", n)

    def store_memory(self, used: int, limit: int, full_at: float) -> None:
        """Redis's memory as last read, and whether new sessions are refused for it."""
        self.set("subs_redis_used_memory_bytes", used)
        self.set("subs_redis_maxmemory_bytes", limit)
        self.set("subs_store_full", 1 if limit and used >= full_at * limit else 0)

    def observe_model_call(self, seconds: float) -> None:
        """Hook: one model call attempt took `seconds`."""
        self.observe("subs_model_call_seconds", seconds)

    def observe_chat(
        self,
        seconds: float,
        *,
        provider: str,
        model: str,
        tokens: Mapping[str, int],
        error: str | None = None,
    ) -> None:
        """One model call attempt, as the GenAI conventions count it: its duration (with
        `error_type` when it failed) and its input and output tokens (when it answered)."""
        keys = self._chat_keys.get((provider, model, error))
        if keys is None:
            labels = {
                "gen_ai_operation_name": "chat",
                "gen_ai_provider_name": provider,
                "gen_ai_request_model": model,
            }
            if error is not None:
                labels["error_type"] = error
            by_kind = {k: _key({**labels, "gen_ai_token_type": k}) for k in ("input", "output")}
            keys = self._chat_keys[(provider, model, error)] = (_key(labels), by_kind)
        duration, by_kind = keys
        self._observe("gen_ai_client_operation_duration_seconds", duration, seconds)
        for kind, count in tokens.items():
            key = by_kind.get(kind)
            if key is None:  # a kind beyond input and output
                key = by_kind[kind] = _key({**dict(duration), "gen_ai_token_type": kind})
            self._observe("gen_ai_client_token_usage", key, count)

    def model_input(self, usage: Mapping[str, object], *, provider: str, model: str) -> None:
        """Hook: an answered call's input tokens by how the prompt cache served them, so a
        dashboard can show the cache hit share (cache_read over all input)."""
        keys = self._input_keys.get((provider, model))
        if keys is None:
            labels = {"provider": provider, "model": model}
            keys = self._input_keys[(provider, model)] = tuple(
                _key({**labels, "cache": cache}) for cache in _INPUT_CACHES
            )
        series = self._values["subs_model_input_tokens_total"]
        for field_, key in zip(_INPUT_FIELDS, keys, strict=True):
            count = usage.get(field_)
            if isinstance(count, int):
                series[key] = series.get(key, 0) + count

    def observe_worker_call(self, seconds: float) -> None:
        """Hook: one worker delivery took `seconds`."""
        self.observe("subs_worker_call_seconds", seconds)

    def render(self) -> str:
        """Everything in Prometheus' text format, with HELP and TYPE lines."""
        lines: list[str] = []
        for name, (kind, text) in self._HELP.items():
            lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
            if kind != "histogram":
                series = self._values[name] or {(): 0}
                lines += [f"{name}{_labels(k)} {_num(v)}" for k, v in sorted(series.items())]
                continue
            empty = [((), _Histogram(self._BUCKETS.get(name, _SECONDS)))]
            for key, h in sorted(self._histograms[name].items()) or empty:
                for bound, n in zip(h.buckets, h.cumulative(), strict=True):
                    lines.append(f"{name}_bucket{_labels((*key, ('le', _num(bound))))} {n}")
                lines.append(f"{name}_bucket{_labels((*key, ('le', '+Inf')))} {h.count}")
                lines.append(f"{name}_sum{_labels(key)} {_num(h.total)}")
                lines.append(f"{name}_count{_labels(key)} {h.count}")
        return "\n".join(lines) + "\n"


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))
