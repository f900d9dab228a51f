"""Ingest: trace files or decoded requests through normalisation into the store.

Files go through the shard pipeline (`pipeline.py`): every core decodes and normalises, the
store commits span batches (one transaction each) and each trace is assembled once, at the end of
a run of files. The receiver runs the same shards, so a span means the same thing however it
arrived.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from plumbline_otel.decode import Problem, Unit, iter_trace_files, iter_units
from plumbline_otel.errors import MalformedTraceFile
from plumbline_otel.normalise import Limits
from plumbline_otel.pipeline import (
    Flushed,
    LogPart,
    Part,
    ShardPool,
    ShardSettings,
    SpanPart,
    TrajectoryPart,
    concat_parts,
    default_workers,
    first_traces,
)
from plumbline_otel.store import ROW_GROUP_SIZE, Store


@dataclass
class IngestSummary:
    """Counts for the user: what was read, stored, already there, and rejected (with reasons)."""

    files: int = 0
    requests: int = 0
    spans_read: int = 0
    stored: int = 0
    duplicate: int = 0
    rejected_spans: int = 0
    trajectories: int = 0  # runs this ingest built that the store holds at its end (a run built twice counts once)
    log_records: int = 0  # GenAI log records read (stored once each; folded into their spans at assembly)
    workers: int = 0  # shard worker processes the ingest ran (0: in the caller's process)
    problems: list[Problem] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """0 everything accepted, 3 some input rejected (the rest kept), 2 nothing usable given."""
        if self.spans_read == 0 and self.log_records == 0:
            return 2
        return 3 if self.problems else 0

    def add(self, other: IngestSummary) -> None:
        """Fold another summary's counts into this one."""
        for name in ("files", "requests", "spans_read", "stored", "duplicate", "rejected_spans", "trajectories", "log_records"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.problems.extend(other.problems)


# Span rows (Arrow bytes) a writer gathers at most before it commits: a row group of the bench corpus's
# spans is ~27 MB, but one of spans of several KB each (the demo's replayed runs) held ~150 MB more.
_PENDING_BYTES = 48 << 20


class PartWriter:
    """The writer's side of the pipeline: commits the parts shards send, in the order they come.

    Span parts are gathered into transactions of whole row groups (`batch_spans`, by default
    `ROW_GROUP_SIZE`); the rows past the last whole group are carried to the next transaction.
    Spans of several KB each commit sooner, at `_PENDING_BYTES` of rows, whole groups or not. A
    trajectory part waits until the spans gathered before it are committed (its trajectories were
    built from them), then is stored for the traces whose stored spans match
    (`Store.write_assembled`); committing early for it would cut a transaction short.
    """

    def __init__(self, store: Store, summary: IngestSummary, batch_spans: int = ROW_GROUP_SIZE, source: str = "file") -> None:
        self.store, self.summary, self.batch_spans, self.source = store, summary, batch_spans, source
        self.pending: list[SpanPart] = []
        self.carried: pa.Table | None = None  # rows past the last whole group of the previous transaction
        self.pending_spans = 0  # rows gathered: carried and pending
        self.pending_bytes = 0  # their Arrow bytes
        self.assembled: list[tuple[int, TrajectoryPart]] = []  # each with the rows gathered before it

    def take(self, part: Part) -> None:
        """Count and commit (or gather) one part."""
        if isinstance(part, SpanPart):
            self.summary.spans_read += part.spans
            self.summary.rejected_spans += part.rejected
            self.summary.problems.extend(part.problems)
            if part.error:
                self.summary.problems.append(Problem(f"unit {part.seq}", f"not normalised: {part.error}"))
            self.pending.append(part)
            self.pending_spans += part.spans
            self.pending_bytes += part.table.nbytes if part.table is not None else 0
            if self.pending_spans >= self.batch_spans:
                self.commit(whole_groups=True)
            elif self.pending_bytes >= _PENDING_BYTES:
                self.commit()
        elif isinstance(part, TrajectoryPart):
            self.assembled.append((self.pending_spans, part))
            if not self.pending_spans:
                self.commit()
        elif isinstance(part, LogPart):
            self.store.write_logs(part.rows)  # a retried record is stored once; it was still read
            self.summary.log_records += part.rows.kept

    def commit(self, whole_groups: bool = False) -> None:
        """Commit the gathered spans in one transaction, then the trajectory parts whose spans are all committed.

        With `whole_groups`, only as many rows as fill whole row groups: DuckDB writes those into
        the file directly, while a transaction that leaves a group part-filled is rewritten at the
        next checkpoint (100,000 spans in commits of 16,600: a 0.36 s checkpoint and a 20 MB file;
        in commits of 16,384: 0.006 s and 11 MB).
        """
        table, problems = concat_parts(self.pending)
        if self.carried is not None:
            table = self.carried if table is None else pa.concat_tables([self.carried, table])
        rows = table.num_rows if table is not None else 0
        cut = rows - rows % self.batch_spans if whole_groups else rows
        if table is not None and cut < rows:
            self.carried, table = table.slice(cut), table.slice(0, cut)
        else:
            self.carried = None
        if cut or problems:
            result = self.store.write_span_table(table, problems, self.source)
            self.summary.stored += result.stored
            self.summary.duplicate += result.duplicate
        self.pending, self.pending_spans = [], rows - cut
        self.pending_bytes = self.carried.nbytes if self.carried is not None else 0
        ready = [part for before, part in self.assembled if before <= cut]
        self.assembled = [(before - cut, part) for before, part in self.assembled if before > cut]
        for part in ready:
            self.store.write_assembled(part.table, part.counts)


_IN_PROCESS_SPANS = 5000


def transaction_spans(workers: int) -> int:
    """Spans an ingest commits at a time: whole row groups with workers, 5,000 in one process.

    With workers, a writer holds little but the parts it is committing (the rest wait in the spool),
    and whole row groups go into the file once (`PartWriter`). One process holds its parts, its
    records for assembly and DuckDB's row-group buffers together: with whole row groups a
    100,000-span ingest in one process peaked at 490-496 MiB, with 5,000 at 378-394, and a
    20,000-span trace at ~292 against ~283 (`bench/ingest_files.py`).
    """
    return ROW_GROUP_SIZE if workers else _IN_PROCESS_SPANS


def _ingest_units(store: Store, units: Iterable[Unit], summary: IngestSummary, source: str, limits: Limits | None,
                  batch_spans: int | None, workers: int) -> IngestSummary:
    """Units through the shards into the store; then the traces no shard could assemble alone, from the store."""
    settings = ShardSettings(limits=limits or Limits(), task_keys=store.task_keys)
    started = time.time_ns()
    summary.workers = workers
    writer = PartWriter(store, summary, batch_spans or transaction_spans(workers), source=source)
    with store.beside_workers(workers), ShardPool(settings, workers, collector=workers > 0) as pool:
        parts = _fed(pool, units, summary) if workers else _in_process(pool, units, summary)
        with contextlib.closing(parts):  # a failed write stops the feeder before the pool closes
            for part in parts:
                writer.take(part)
    writer.commit()
    store.assemble()  # traces whose stored spans differ from what their shard held
    # Counted from the store, not from the writes: a trace assembled early (to bound a shard's memory)
    # and rebuilt when more of its spans came was written twice.
    summary.trajectories += store.trajectories_built_since(started)
    return summary


def _in_process(pool: ShardPool, units: Iterable[Unit], summary: IngestSummary) -> Generator[Part, None, None]:
    for unit in units:
        pool.submit(unit)
        summary.requests += 1
        yield from pool.parts()
    yield from pool.flush()


_UNITS_AHEAD = 16  # units sent to the workers and not yet taken by the writer: bounds the parts waiting in the spool


def _fed(pool: ShardPool, units: Iterable[Unit], summary: IngestSummary) -> Generator[Part, None, None]:
    """The workers' parts, while a thread feeds them the units.

    Fed from the writer's own loop, the workers went idle whenever a commit or checkpoint outlasted
    their queued units (a fifth of a 2-worker ingest's wall time had one core idle). The feeder
    keeps at most `_UNITS_AHEAD` units ahead of what the writer has taken, so parts never pile up.
    """
    shards = pool.shards
    room = threading.Semaphore(_UNITS_AHEAD * shards)  # a unit takes one permit per shard; each span part returns one
    stop = threading.Event()
    failed: list[BaseException] = []

    def feed() -> None:
        try:
            for unit in units:
                for _ in range(shards):
                    while not room.acquire(timeout=0.1):
                        if stop.is_set():
                            return
                pool.submit(unit)
                summary.requests += 1
            pool.request_flush()
        except BaseException as exc:  # re-raised by the writer's thread, which is waiting for parts
            failed.append(exc)

    feeder = threading.Thread(target=feed, name="plumbline-feed", daemon=True)
    feeder.start()
    try:
        flushed = 0
        while flushed < shards:
            part = pool.next_part(timeout=0.1)
            if part is None:
                if failed:
                    raise failed[0]
            elif isinstance(part, Flushed):
                flushed += 1
            else:
                if isinstance(part, SpanPart):
                    room.release()
                yield part
    finally:
        stop.set()
        feeder.join()


def ingest_files(
    store: Store,
    paths: Iterable[str],
    limits: Limits | None = None,
    batch_spans: int | None = None,
    on_file: Callable[[Path], None] | None = None,
    workers: int | None = None,
    on_read: Callable[[int], None] | None = None,
) -> IngestSummary:
    """Ingest trace files (files, directories, globs) and rebuild the trajectories they touched.

    `workers` processes share the work by trace id (None: `default_workers`, from the input's size
    and, for a large one, its first spans: `first_traces`); each trace is assembled once, after the
    last file, unless memory asks for it sooner. `batch_spans` (None: `transaction_spans`) are
    committed at a time. `on_read` is told the bytes of each request as it is read, `on_file` each
    file read to its end (both from the thread reading the input).
    """
    summary = IngestSummary()
    files = list(iter_trace_files(list(paths)))
    malformed: list[Problem] = []  # stored by the writer after the run: `units` may run in the feeder's thread

    def units() -> Iterator[Unit]:
        for path in files:
            summary.files += 1
            try:
                for unit in iter_units(path):
                    yield unit
                    if on_read:
                        on_read(len(unit.data))
            except MalformedTraceFile as exc:
                malformed.append(Problem(str(path), exc.reason))
            if on_file:
                on_file(path)

    stream: Iterator[Unit] = units()
    if workers is None:
        size = sum(os.path.getsize(p) for p in files)
        workers = default_workers(size)
        if workers:  # large enough: are its first spans all of one trace?
            head, traces = first_traces(stream)
            workers = default_workers(size, traces)
            stream = itertools.chain(head, stream)
    _ingest_units(store, stream, summary, "file", limits, batch_spans, workers)
    store.write_span_table(None, malformed, "file")
    summary.problems.extend(malformed)
    return summary


def ingest_requests(store: Store, requests: Iterable[ExportTraceServiceRequest], source: str, limits: Limits | None = None,
                    batch_spans: int | None = None, workers: int = 0) -> IngestSummary:
    """Ingest export requests built in-process (an importer's), exactly as if a receiver had decoded them."""
    units = (Unit("protobuf", r.SerializeToString(), f"{source} request {i}") for i, r in enumerate(requests))
    return _ingest_units(store, units, IngestSummary(), source, limits, batch_spans, workers)
