"""A shard: its share of each unit (by trace id) decoded, filtered, normalised into an Arrow span table, and assembled once quiet."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from plumbline_otel.assemble import DEFAULT_TASK_KEYS, LONG_TRACE_SPANS, assembly_keys, iter_runs, trim_for_assembly
from plumbline_otel.config import ContentRules
from plumbline_otel.content import ContentFilter
from plumbline_otel.decode import Decoded, Unit, decode_unit
from plumbline_otel.errors import Problem
from plumbline_otel.model import SpanRecord, Trajectory
from plumbline_otel.normalise import Limits, log_rows, normalise_request
from plumbline_otel.pipeline._parts import Flushed, LogPart, Part, SpanPart, TrajectoryPart
from plumbline_otel.rows import span_table, trajectory_table, unique_spans


def shard_of(trace_id: bytes, shards: int) -> int:
    """The shard owning a trace: the low 32 bits of its id, modulo the shard count."""
    return int.from_bytes(trace_id[-4:], "big") % shards if len(trace_id) == 16 else 0


def json_shard_of(trace_id: Any, shards: int) -> int:
    """`shard_of` for an OTLP JSON hex trace id, read before it is decoded; 0 for anything malformed."""
    if isinstance(trace_id, str) and len(trace_id) == 32:
        try:
            return int(trace_id[-8:], 16) % shards
        except ValueError:
            return 0
    return 0


_SMALL_INPUT_BYTES = 8 << 20  # below this, starting workers costs more than they save
_PEEK_SPANS, _PEEK_UNITS = 1000, 64  # how much of an input `first_traces` reads to count its traces


def default_workers(input_bytes: int | None = None, traces: int | None = None) -> int:
    """Worker processes to use: every core, unless workers cannot repay their start.

    They cannot for an input under 8 MiB, nor for one whose first spans (`first_traces`) are all
    of one trace: a long trace exported alone, which one shard would own whole while the others read
    every request for nothing. In one process a 20,000-span trace took 283-293 MiB and ran 2-10%
    faster; with two workers the processes held 360-375 MiB. Only where the work runs depends on
    this, never what is stored.
    """
    if input_bytes is not None and input_bytes < _SMALL_INPUT_BYTES:
        return 0
    if traces == 1:
        return 0
    return os.cpu_count() or 1


def first_traces(units: Iterator[Unit]) -> tuple[list[Unit], int]:
    """The first units of an input (up to `_PEEK_SPANS` spans or `_PEEK_UNITS` units) and how many traces they hold.

    A request of one trace says little (an exporter may send a span or a trace at a time, a
    directory may hold a trace per file), so it reads on, across files, until it has seen enough.
    """
    head: list[Unit] = []
    traces: set[bytes] = set()
    spans = 0
    for unit in units:
        head.append(unit)
        request = decode_unit(unit).request
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                spans += len(ss.spans)
                traces.update(span.trace_id for span in ss.spans)
        if spans >= _PEEK_SPANS or len(head) >= _PEEK_UNITS:
            break
    return head, len(traces)


@dataclass(frozen=True)
class ShardSettings:
    """What every shard needs to know; sent once to each worker."""

    shards: int = 1
    limits: Limits = field(default_factory=Limits)
    task_keys: tuple[str, ...] = DEFAULT_TASK_KEYS
    content: ContentRules | None = None
    hold_spans: int = 20_000  # records a shard holds for assembly before it assembles the oldest traces
    long_trace_spans: int = LONG_TRACE_SPANS  # a trace this long is let go, for the store to rebuild run by run


def _span_problem(problem: Problem) -> bool:
    """A problem about one span, met only by the shard that owns the span; others are met by every shard."""
    return problem.where.startswith("span ") or ".spans[" in problem.where


class Shard:
    """One shard's work and state: the same code in a worker process and in-process."""

    def __init__(self, index: int, settings: ShardSettings) -> None:
        self.index, self.settings = index, settings
        self.content = ContentFilter(settings.content) if settings.content else None
        self.held: dict[str, list[SpanRecord]] = {}
        self.let_go: set[str] = set()  # long traces whose spans are no longer held (`LONG_TRACE_SPANS`)
        self.last_seen: dict[str, float] = {}  # of every trace held or let go
        self.held_spans = 0
        self.keep = assembly_keys(settings.task_keys)  # what a held record keeps (`trim_for_assembly`)

    def prepare(self, seq: int, work: Unit | Decoded) -> list[Part]:
        """Decode (unless a receiver already did: `Decoded`) and normalise this shard's spans of `work`; hold them for assembly."""
        n, me = self.settings.shards, self.index
        text_ids = isinstance(work, Unit) and work.kind == "json"
        decoded = work if isinstance(work, Decoded) else decode_unit(work, (lambda raw: json_shard_of(raw, n) == me) if n > 1 else None)
        # JSON spans were filtered, by their text ids, while decoding; protobuf ones (the C parser reads
        # them all cheaply) are skipped as they are read
        own = (lambda trace_id: shard_of(trace_id, n) == me) if n > 1 and not text_ids else None
        if self.content:
            self.content.apply_traces(decoded.request, own)
        log_parts: list[Part] = []
        if decoded.logs is not None and me == 0:  # its records are folded into their spans by the store
            if self.content:
                self.content.apply_logs(decoded.logs)
            log_parts.append(LogPart(seq, log_rows(decoded.logs)))
        records, problems = normalise_request(decoded.request, self.settings.limits, own)
        problems = decoded.problems + problems
        if me != 0:
            problems = [p for p in problems if _span_problem(p)]
        table = span_table(records, time.time_ns()) if records else None
        now = time.monotonic()
        resources: dict[int, dict[str, Any]] = {}  # trimmed resource maps, by the id of the one they came from
        for rec in records:
            self.last_seen[rec.trace_id] = now
            if rec.trace_id in self.let_go:
                continue
            trim_for_assembly(rec, self.keep, resources)
            held = self.held.setdefault(rec.trace_id, [])
            held.append(rec)
            self.held_spans += 1
            if len(held) >= self.settings.long_trace_spans:  # never held whole: the store rebuilds it run by run
                self.let_go.add(rec.trace_id)
                self.held_spans -= len(self.held.pop(rec.trace_id))
        parts: list[Part] = [SpanPart(seq, me, table, problems, len(records), sum(p.spans for p in problems)), *log_parts]
        if self.held_spans > self.settings.hold_spans:  # memory stays bounded: assemble the oldest traces now
            oldest = sorted(self.held, key=self.last_seen.__getitem__)
            now_due, freed = [], 0
            for trace_id in oldest:
                if self.held_spans - freed <= self.settings.hold_spans // 2:
                    break
                now_due.append(trace_id)
                freed += len(self.held[trace_id])
            parts.extend(self._assemble(now_due))
        return parts

    def assemble_quiet(self, quiet_seconds: float | None) -> list[Part]:
        """Assemble the traces with no new span for `quiet_seconds` (all of them when None)."""
        if quiet_seconds is None:
            return [*self._assemble(list(self.last_seen)), Flushed(self.index)]
        cutoff = time.monotonic() - quiet_seconds
        return self._assemble([t for t, seen in self.last_seen.items() if seen <= cutoff])

    def _assemble(self, trace_ids: list[str]) -> list[Part]:
        if not trace_ids:
            return []
        let_go = [t for t in trace_ids if t in self.let_go]
        for trace_id in let_go:
            self.let_go.remove(trace_id)
            del self.last_seen[trace_id]
        trace_ids = [t for t in trace_ids if t in self.held]
        counts: dict[str, int] = {}

        def runs() -> Iterator[Trajectory]:  # each trace released as its runs are turned into rows
            for trace_id in trace_ids:
                held = self.held.pop(trace_id)
                del self.last_seen[trace_id]
                self.held_spans -= len(held)
                records = unique_spans(held)
                counts[trace_id] = len(records)  # counted even when no run: its stale trajectory is removed
                yield from iter_runs(records, self.settings.task_keys)

        table = trajectory_table(runs(), time.time_ns())
        return [TrajectoryPart(self.index, table, counts, let_go)]
