"""Self-metrics in the Prometheus text format: counters, gauges read at scrape time, one histogram."""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

_HELP = {
    "plumbline_http_bodies_cut_total": "HTTP bodies cut before complete: slower than the rate floor (408), or reclaimed for requests waiting for the memory budget (503).",
    "plumbline_spans_received_total": "Spans decoded from export requests (before storage).",
    "plumbline_spans_stored_total": "Spans committed to the store for the first time.",
    "plumbline_spans_duplicate_total": "Spans committed that were already stored (exporter retries).",
    "plumbline_spans_rejected_total": "Spans rejected as unusable (reported as partial success).",
    "plumbline_log_records_received_total": "Log records decoded from export requests.",
    "plumbline_log_records_stored_total": "gen_ai.* log records committed to the logs table.",
    "plumbline_requests_total": "Export requests answered, by transport, signal and outcome.",
    "plumbline_pushback_total": "Export requests refused because the queue was full.",
    "plumbline_queue_spans": "Spans accepted and waiting to be committed.",
    "plumbline_queue_bytes": "Request bytes accepted and not yet committed.",
    "plumbline_grpc_calls_evicted": "gRPC calls cancelled while waiting for their message, to give their slot to a new call past the cap.",
    "plumbline_request_duration_seconds": "Time from receiving an export request to answering it.",
    "plumbline_runs_checked_total": "Runs the standing check judged (check.spec).",
    "plumbline_violations_found_total": "Violations the standing check found that were not stored before.",
}


class Metrics:
    """Thread-safe counters keyed by (name, labels); gauges are callables read when scraped."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self._hist: dict[tuple[tuple[str, str], ...], list[float]] = {}  # bucket counts + [sum, count]
        self._gauges: dict[str, Callable[[], float]] = {}

    def inc(self, name: str, value: float = 1, **labels: str) -> None:
        """Add `value` to a counter."""
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            self._counters[key] = self._counters.get(key, 0) + value

    def get(self, name: str, **labels: str) -> float:
        """A counter's value (0 when never incremented); for tests and the Health RPC."""
        with self._lock:
            return self._counters.get((name, tuple(sorted(labels.items()))), 0)

    def gauge(self, name: str, read: Callable[[], float]) -> None:
        """Register a gauge whose value is read at scrape time."""
        self._gauges[name] = read

    def observe(self, seconds: float, **labels: str) -> None:
        """Record one request latency."""
        key = tuple(sorted(labels.items()))
        with self._lock:
            row = self._hist.setdefault(key, [0.0] * (len(_LATENCY_BUCKETS) + 3))  # buckets, +Inf, sum, count
            row[bisect.bisect_left(_LATENCY_BUCKETS, seconds)] += 1
            row[-2] += seconds
            row[-1] += 1

    def render(self) -> str:
        """The Prometheus text exposition (version 0.0.4)."""
        lines: list[str] = []
        with self._lock:
            counters = sorted(self._counters.items())
            hist = sorted((k, list(v)) for k, v in self._hist.items())
        seen: set[str] = set()
        for (name, labels), value in counters:
            if name not in seen:
                seen.add(name)
                lines += [f"# HELP {name} {_HELP.get(name, name)}", f"# TYPE {name} counter"]
            lines.append(f"{name}{_labels(labels)} {_num(value)}")
        for name, read in sorted(self._gauges.items()):
            lines += [f"# HELP {name} {_HELP.get(name, name)}", f"# TYPE {name} gauge", f"{name} {_num(read())}"]
        name = "plumbline_request_duration_seconds"
        if hist:
            lines += [f"# HELP {name} {_HELP[name]}", f"# TYPE {name} histogram"]
        for labels, row in hist:
            cumulative = 0.0
            for bound, count in zip((*_LATENCY_BUCKETS, float("inf")), row):
                cumulative += count
                le = "+Inf" if bound == float("inf") else repr(bound)
                lines.append(f"{name}_bucket{_labels((*labels, ('le', le)))} {_num(cumulative)}")
            lines += [f"{name}_sum{_labels(labels)} {row[-2]!r}", f"{name}_count{_labels(labels)} {_num(row[-1])}"]
        return "\n".join(lines) + "\n"


def _labels(labels: tuple[tuple[str, str], ...]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}"


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)
