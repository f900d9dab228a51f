"""Ingest: trace files or decoded requests through normalisation into the store.

The same `ingest_decoded` serves files and the receivers, so a span means the same thing however
it arrived. Spans are written in batches (one transaction each) and trajectories are rebuilt once
at the end of a run of files, for the traces that changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from plumbline_otel.decode import Decoded, Problem, decode_unit, iter_trace_files, iter_units
from plumbline_otel.errors import MalformedTraceFile
from plumbline_otel.model import SpanRecord
from plumbline_otel.normalise import Limits, normalise_request
from plumbline_otel.store import Store


@dataclass
class IngestSummary:
    """Counts for the user: what was read, stored, already there, and rejected (with reasons)."""

    files: int = 0
    requests: int = 0
    spans_read: int = 0
    stored: int = 0
    duplicate: int = 0
    rejected_spans: int = 0
    trajectories: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """0 everything accepted, 3 some input rejected (the rest kept), 2 nothing usable given."""
        if self.spans_read == 0:
            return 2
        return 3 if self.problems else 0

    def add(self, other: "IngestSummary") -> None:
        """Fold another summary's counts into this one."""
        for name in ("files", "requests", "spans_read", "stored", "duplicate", "rejected_spans", "trajectories"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.problems.extend(other.problems)


class _Batcher:
    """Collects span records and problems; writes one transaction per `size` spans."""

    def __init__(self, store: Store, size: int, summary: IngestSummary, source: str, keep: int = 20_000) -> None:
        self.store, self.size, self.summary, self.source, self.keep = store, size, summary, source, keep
        self.records: list[SpanRecord] = []
        self.problems: list[Problem] = []
        # Records written since the last assembly, by trace, so assembly need not read them back.
        self.recent: dict[str, list[SpanRecord]] = {}
        self.recent_count = 0

    def add(self, records: list[SpanRecord], problems: list[Problem]) -> None:
        self.records.extend(records)
        self.problems.extend(problems)
        if len(self.records) >= self.size:
            self.flush()

    def flush(self) -> None:
        if self.records or self.problems:
            result = self.store.write_spans(self.records, self.problems, self.source)
            self.summary.stored += result.stored
            self.summary.duplicate += result.duplicate
            for rec in self.records:
                self.recent.setdefault(rec.trace_id, []).append(rec)
            self.recent_count += len(self.records)
            self.records, self.problems = [], []
        if self.recent_count >= self.keep:  # memory stays bounded: assemble and let go
            self.assemble()

    def assemble(self) -> None:
        self.summary.trajectories += self.store.assemble(self.recent)
        self.recent, self.recent_count = {}, 0


def ingest_decoded(decoded: Decoded, limits: Limits, summary: IngestSummary) -> tuple[list[SpanRecord], list[Problem]]:
    """Normalise one decoded request and count it; the caller writes the records."""
    records, problems = normalise_request(decoded.request, limits)
    problems = decoded.problems + problems
    summary.requests += 1
    summary.spans_read += len(records)
    summary.rejected_spans += sum(p.spans for p in problems)
    summary.problems.extend(problems)
    return records, problems


def ingest_files(
    store: Store,
    paths: Iterable[str],
    limits: Limits | None = None,
    batch_spans: int = 5000,
    on_file: Callable[[Path], None] | None = None,
) -> IngestSummary:
    """Ingest trace files (files, directories, globs) and rebuild the trajectories they touched."""
    limits = limits or Limits()
    summary = IngestSummary()
    files = list(iter_trace_files(list(paths)))
    batcher = _Batcher(store, batch_spans, summary, source="file")
    for path in files:
        summary.files += 1
        try:
            for unit in iter_units(path):
                batcher.add(*ingest_decoded(decode_unit(unit), limits, summary))
        except MalformedTraceFile as exc:
            problem = Problem(str(path), exc.reason)
            summary.problems.append(problem)
            batcher.add([], [problem])
        if on_file:
            on_file(path)
    batcher.flush()
    batcher.assemble()
    return summary


def ingest_requests(store: Store, requests: Iterable[ExportTraceServiceRequest], source: str, limits: Limits | None = None,
                    batch_spans: int = 5000) -> IngestSummary:
    """Ingest export requests built in-process (an importer's), exactly as if a receiver had decoded them."""
    limits = limits or Limits()
    summary = IngestSummary()
    batcher = _Batcher(store, batch_spans, summary, source=source)
    for i, request in enumerate(requests):
        batcher.add(*ingest_decoded(Decoded(request, f"{source} request {i}"), limits, summary))
    batcher.flush()
    batcher.assemble()
    return summary
