"""Ingest: trace files or decoded requests through normalisation into the store.

Files go through the shard pipeline (`pipeline/`): every core decodes and normalises, the
store commits span batches (one transaction each) and each trace is assembled once, at the end of
a run of files. The receiver runs the same shards, so a span means the same thing however it
arrived.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from plumbline_otel.decode import Unit, iter_trace_files, iter_units
from plumbline_otel.errors import MalformedTraceFile, Problem
from plumbline_otel.normalise import Limits
from plumbline_otel.pipeline import (
    Flushed,
    LogPart,
    Part,
    PartWriter,
    ShardPool,
    ShardSettings,
    SpanPart,
    default_workers,
    first_traces,
)
from plumbline_otel.store import ROW_GROUP_SIZE, Store, WriteResult


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

    def count(self, part: Part) -> None:
        """Count a part the shards made, before the writer takes it."""
        if isinstance(part, SpanPart):
            self.spans_read += part.spans
            self.rejected_spans += part.rejected
            self.problems.extend(part.problems)
            if part.error:
                self.problems.append(Problem(f"unit {part.seq}", f"not normalised: {part.error}"))
        elif isinstance(part, LogPart):
            self.log_records += part.rows.kept  # read, whether or not a retried record was stored before

    def written(self, result: WriteResult) -> None:
        """Count a span transaction the writer committed."""
        self.stored += result.stored
        self.duplicate += result.duplicate

    def add(self, other: IngestSummary) -> None:
        """Fold another summary's counts into this one."""
        for name in ("files", "requests", "spans_read", "stored", "duplicate", "rejected_spans", "trajectories", "log_records"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.problems.extend(other.problems)


_IN_PROCESS_SPANS = 5000


def transaction_spans(workers: int) -> int:
    """Spans an ingest commits at a time: whole row groups with workers, 5,000 in one process.

    With workers, a writer holds little but the parts it is committing (the rest wait in the spool),
    and whole row groups go into the file once (`PartWriter`'s `whole_groups`). One process holds its parts, its
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
    writer = PartWriter(store, batch_spans or transaction_spans(workers), source, whole_groups=True, on_spans=summary.written)
    with store.beside_workers(workers), ShardPool(settings, workers, collector=workers > 0) as pool:
        parts = _fed(pool, units, summary) if workers else _in_process(pool, units, summary)
        with contextlib.closing(parts):  # a failed write stops the feeder before the pool closes
            if workers:
                for part in parts:
                    summary.count(part)
                    writer.take(part)
            else:
                _written_beside(writer, parts, summary)  # and committed
    if workers:
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


_WRITES_AHEAD = 4  # parts made in one process and not yet taken by its writer thread


def _written_beside(writer: PartWriter, parts: Iterable[Part], summary: IngestSummary) -> None:
    """In one process, the writer takes the parts (and commits the last of them) on a thread of its own.

    The store's commits are DuckDB's work, done without Python's lock: on the caller's thread a
    commit stopped normalisation for its whole length, a fifth of an ingest in one process
    (`bench/ingest_files.py`'s stages: write 23 of ~100 µs a span), while the other core idled. The
    writer takes the parts in the order they were made, exactly as before, and at most
    `_WRITES_AHEAD` wait for it; a failed write stops the shards, and a failed shard stops the
    writer before it commits what it gathered.
    """
    waiting: queue.Queue[Part | None] = queue.Queue(_WRITES_AHEAD)
    failed: list[BaseException] = []
    stop = threading.Event()  # the caller failed: commit nothing more

    def write() -> None:
        try:
            while (part := waiting.get()) is not None:
                if stop.is_set():
                    return
                writer.take(part)
            if not stop.is_set():
                writer.commit()
        except BaseException as exc:  # re-raised on the caller's thread
            failed.append(exc)
            stop.set()

    def give(part: Part | None) -> None:
        while not failed:
            try:
                waiting.put(part, timeout=0.1)
                return
            except queue.Full:
                continue
        raise failed[0]

    thread = threading.Thread(target=write, name="plumbline-write", daemon=True)
    thread.start()
    try:
        for part in parts:
            summary.count(part)
            give(part)
        give(None)
    except BaseException:
        stop.set()
        with contextlib.suppress(queue.Full):
            waiting.put_nowait(None)
        raise
    finally:
        thread.join()
    if failed:
        raise failed[0]


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
