"""The ingest pipeline behind the transports: a bounded queue, a normaliser thread, and the one DuckDB thread.

    handler threads ──admit/submit──► queue of decoded requests (bounded in spans and in bytes)
        ──► prepare thread: content rules + normalise, up to `batch_max_spans` per batch
        ──► commit thread (the only one that touches DuckDB): one transaction per batch, then
            every request in the batch is answered; reads for the API (`call`) run here too

Request handlers only decode (protobuf parsing is C) and wait on a `Ticket`; the Python-heavy
normalisation runs on one thread, overlapping with DuckDB's insert (which releases the GIL) on the
other. Two threads doing the Python work instead of dozens keeps the GIL from thrashing. A request is
answered only after the transaction holding its spans committed. Trajectories are assembled on the
commit thread when the queue has been idle for `assemble_interval` (and at the latest
`assemble_max_delay` after the first unassembled write), and once more on close; the records written
since the last assembly are kept (up to `keep_recent`) so assembly need not read them back.
Whatever an earlier process left pending (a crash, or a shutdown whose assembly budget ran out) is
assembled when the store opens, before `start()` returns, so the server listens only once every
stored span is in a trajectory; `recovered` and `left_pending` report both ends.

Admission is two-step so memory stays bounded before decoding starts: `admit(nbytes)` reserves the
body's bytes, `submit` adds its span count; either past its bound raises `Overloaded` (unless the
queue is empty, so one request larger than a bound still gets through alone).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from plumbline_otel.decode import Decoded, Problem
from plumbline_otel.errors import PlumblineError, StoreError
from plumbline_otel.model import SpanRecord
from plumbline_otel.receive._metrics import Metrics
from plumbline_otel.store import Store

log = logging.getLogger("plumbline.receive")

_MAX_PENDING_CALLS = 64
_MAX_PREPARED_BATCHES = 2  # normalised batches waiting for the commit thread

# What the prepare step makes of one request: its records, its problems and how many spans it rejected.
Prepared = tuple[list[SpanRecord], list[Problem], int]


class Overloaded(PlumblineError):
    """The queue is full (or the server is draining); the client should retry after a delay."""


@dataclass
class Ticket:
    """One queued piece of work; `wait` returns its result once the pipeline has done it."""

    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None

    def finish(self, result: Any = None, error: BaseException | None = None) -> None:
        self.result, self.error = result, error
        self.done.set()

    def wait(self, timeout: float | None = None) -> Any:
        """Block until done; re-raise the pipeline's error; `TimeoutError` past `timeout`."""
        if not self.done.wait(timeout):
            raise TimeoutError("the store did not commit in time")
        if self.error is not None:
            raise self.error
        return self.result


@dataclass
class _Request:
    ticket: Ticket
    nbytes: int
    spans: int
    decoded: Decoded | None
    prepared: Prepared | None = None


@dataclass
class _Batch:
    requests: list[_Request]

    @property
    def records(self) -> list[SpanRecord]:
        return [r for req in self.requests if req.prepared for r in req.prepared[0]]

    @property
    def problems(self) -> list[Problem]:
        return [p for req in self.requests if req.prepared for p in req.prepared[1]]


@dataclass
class _Call:
    ticket: Ticket
    fn: Callable[[Store], Any]


class WriteQueue:
    """Owns the `Store` on the commit thread; see the module docstring for the contract."""

    def __init__(self, open_store: Callable[[], Store], metrics: Metrics, *, max_spans: int, max_bytes: int,
                 prepare: Callable[[Decoded], Prepared] | None = None, batch_max_spans: int = 8192,
                 assemble_interval: float = 1.0, assemble_max_delay: float = 10.0, keep_recent: int = 20000) -> None:
        self._open_store = open_store
        self._metrics = metrics
        self._prepare = prepare or default_prepare
        self.max_spans, self.max_bytes, self.batch_max_spans = max_spans, max_bytes, batch_max_spans
        self._assemble_interval, self._assemble_max_delay, self._keep_recent = assemble_interval, assemble_max_delay, keep_recent
        self._lock = threading.Lock()
        self._inbound: deque[_Request] = deque()
        self._inbound_ready = threading.Condition(self._lock)
        self._commit: deque[_Batch | _Call] = deque()
        self._commit_ready = threading.Condition(self._lock)
        self._commit_room = threading.Condition(self._lock)
        self._spans = 0  # submitted, not yet committed
        self._bytes = 0  # admitted, not yet committed or released
        self._calls = 0
        self._closing = False
        self._prepare_done = False
        self._preparer = threading.Thread(target=self._run_prepare, name="plumbline-prepare", daemon=True)
        self._committer = threading.Thread(target=self._run_commit, name="plumbline-writer", daemon=True)
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self._recent: dict[str, list[SpanRecord]] = {}
        self._recent_count = 0
        self._dirty_since: float | None = None
        self._last_write = time.monotonic()
        self._close_budget: float | None = None
        self.recovered = 0  # traces an earlier process left pending, assembled at start
        self.left_pending = 0  # traces still pending when the store closed
        metrics.gauge("plumbline_queue_spans", lambda: self._spans)
        metrics.gauge("plumbline_queue_bytes", lambda: self._bytes)

    # --- producer side (any thread) ---------------------------------------------------------

    def start(self) -> None:
        """Open the store on the commit thread; raise its `StoreError` here if that fails."""
        self._committer.start()
        self._started.wait()
        if self._start_error is not None:
            raise self._start_error
        self._preparer.start()

    @property
    def depth(self) -> tuple[int, int]:
        """(spans, bytes) accepted and not yet committed."""
        return self._spans, self._bytes

    def admit(self, nbytes: int) -> None:
        """Reserve room for a request body of `nbytes` before decoding it."""
        with self._lock:
            if self._closing:
                raise Overloaded("the server is shutting down")
            if self._bytes and self._bytes + nbytes > self.max_bytes:
                raise Overloaded(f"the ingest queue is full ({self._bytes >> 20} MiB waiting to be stored)")
            self._bytes += nbytes

    def release(self, nbytes: int) -> None:
        """Give back an admission whose request will not be queued (bad body, overload, nothing in it)."""
        with self._lock:
            self._bytes -= nbytes

    def submit(self, nbytes: int, decoded: Decoded, spans: int) -> Ticket:
        """Queue an admitted, decoded request of `spans` spans; the ticket's result is its `Prepared`.

        Raises `Overloaded` (and releases the admission) past `max_spans`.
        """
        with self._lock:
            if self._prepare_done:
                self._bytes -= nbytes
                raise Overloaded("the server is shutting down")
            if self._spans and self._spans + spans > self.max_spans:
                self._bytes -= nbytes
                raise Overloaded(f"the ingest queue is full ({self._spans} spans waiting to be stored)")
            self._spans += spans
            request = _Request(Ticket(), nbytes, spans, decoded)
            self._inbound.append(request)
            self._inbound_ready.notify()
        return request.ticket

    def call(self, fn: Callable[[Store], Any], timeout: float = 60.0) -> Any:
        """Run `fn(store)` on the commit thread and return its result (reads and log writes)."""
        with self._lock:
            if self._closing:
                raise Overloaded("the server is shutting down")
            if self._calls >= _MAX_PENDING_CALLS:
                raise Overloaded("too many queries waiting")
            self._calls += 1
            call = _Call(Ticket(), fn)
            self._commit.append(call)
            self._commit_ready.notify()
        return call.ticket.wait(timeout)

    def close(self, timeout: float | None = None, assemble_budget: float | None = None) -> None:
        """Stop taking work, commit everything queued, assemble, close the store.

        The final assembly may take `assemble_budget` seconds (unbounded when None); traces it
        could not reach stay pending in the store, are counted in `left_pending` and logged.
        """
        with self._lock:
            self._close_budget = assemble_budget
            self._closing = True
            self._inbound_ready.notify_all()
            self._commit_ready.notify_all()
        if self._preparer.is_alive():
            self._preparer.join(timeout)
        self._committer.join(timeout)

    # --- the prepare thread -----------------------------------------------------------------

    def _take_requests(self) -> list[_Request] | None:
        with self._lock:
            while not self._inbound:
                if self._closing:
                    self._prepare_done = True
                    self._commit_ready.notify_all()
                    return None
                self._inbound_ready.wait()
            taken, spans = [], 0
            while self._inbound and (not taken or spans + self._inbound[0].spans <= self.batch_max_spans):
                request = self._inbound.popleft()
                taken.append(request)
                spans += request.spans
            return taken

    def _run_prepare(self) -> None:
        while (requests := self._take_requests()) is not None:
            for request in requests:
                assert request.decoded is not None
                try:
                    request.prepared = self._prepare(request.decoded)
                except Exception as exc:  # a bug costs one request, never the pipeline
                    log.exception("normalising a request failed")
                    request.prepared = ([], [], 0)
                    request.ticket.error = exc
                request.decoded = None  # let the protobuf go
            with self._lock:
                while len([b for b in self._commit if isinstance(b, _Batch)]) >= _MAX_PREPARED_BATCHES:
                    self._commit_room.wait()
                self._commit.append(_Batch(requests))
                self._commit_ready.notify()

    # --- the commit thread (the only one that touches DuckDB) ------------------------------------

    def _run_commit(self) -> None:
        try:
            store = self._open_store()
        except BaseException as exc:  # reported by start()
            self._start_error = exc
            self._started.set()
            return
        self._recover(store)
        self._started.set()
        try:
            while (work := self._next_work()) is not None:
                if isinstance(work, _Call):
                    self._run_call(store, work)
                elif isinstance(work, _Batch):
                    self._write(store, work)
                if self._assemble_due_in() == 0.0:
                    self._assemble(store)
            self._assemble_before_close(store)
        finally:
            store.close()

    def _recover(self, store: Store) -> None:
        """Assemble what an earlier process left pending; a failure is logged and leaves it pending."""
        try:
            self.recovered = store.assemble() if store.pending_traces() else 0
        except Exception:
            log.exception("assembling the traces left pending by an earlier stop failed")

    def _assemble_before_close(self, store: Store) -> None:
        budget = self._close_budget
        try:
            store.assemble(self._recent, deadline=None if budget is None else time.monotonic() + budget)
        except Exception:
            log.exception("assembling trajectories at shutdown failed")
        self.left_pending = store.pending_traces()
        if self.left_pending:
            log.warning("%d traces left pending: not assembled within the %.1f s shutdown grace; "
                        "the next start (or any writing reader) assembles them", self.left_pending, budget or 0.0)

    def _assemble_due_in(self) -> float | None:
        if self._dirty_since is None:
            return None
        now = time.monotonic()
        return max(0.0, min(self._last_write + self._assemble_interval, self._dirty_since + self._assemble_max_delay) - now)

    def _next_work(self) -> _Batch | _Call | str | None:
        """The next batch or call; "assemble" when only an assembly is due; None when drained and closed."""
        with self._lock:
            while not self._commit:
                if self._prepare_done or (self._closing and not self._preparer.is_alive()):
                    return None
                due = self._assemble_due_in()
                if due == 0.0:
                    return "assemble"
                self._commit_ready.wait(due)
            work = self._commit.popleft()
            self._commit_room.notify()
            return work

    def _write(self, store: Store, batch: _Batch) -> None:
        records = batch.records
        error: BaseException | None = None
        try:
            result = store.write_spans(records, batch.problems, source="otlp")
            self._metrics.inc("plumbline_spans_stored_total", result.stored)
            self._metrics.inc("plumbline_spans_duplicate_total", result.duplicate)
        except Exception as exc:  # the store failed: every request in the batch is told to retry
            log.exception("writing %d spans failed", len(records))
            error = StoreError(f"the store could not commit: {exc}")
        now = time.monotonic()
        self._last_write = now
        if records and error is None:
            self._remember(records)
            if self._dirty_since is None:
                self._dirty_since = now
        with self._lock:
            self._spans -= sum(req.spans for req in batch.requests)
            self._bytes -= sum(req.nbytes for req in batch.requests)
        for request in batch.requests:
            request.ticket.finish(request.prepared, request.ticket.error or error)

    def _remember(self, records: list[SpanRecord]) -> None:
        """Keep what was written for assembly, up to `keep_recent` records; past that, assembly reads back."""
        if self._recent_count + len(records) > self._keep_recent:
            self._recent, self._recent_count = {}, 0
            return
        for rec in records:
            self._recent.setdefault(rec.trace_id, []).append(rec)
        self._recent_count += len(records)

    def _run_call(self, store: Store, call: _Call) -> None:
        try:
            result, error = call.fn(store), None
        except BaseException as exc:
            result, error = None, exc
        with self._lock:
            self._calls -= 1
        call.ticket.finish(result, error)

    def _assemble(self, store: Store) -> None:
        if self._dirty_since is None:
            return
        started = time.monotonic()
        try:
            n = store.assemble(self._recent)
            log.debug("assembled %d trajectories in %.3fs", n, time.monotonic() - started)
        except Exception:
            log.exception("assembling trajectories failed; will retry")
            self._last_write = time.monotonic()
            return
        self._recent, self._recent_count = {}, 0
        self._dirty_since = None


def default_prepare(decoded: Decoded) -> Prepared:
    """Normalise with default limits and no content rules."""
    from plumbline_otel.ingest import IngestSummary, ingest_decoded
    from plumbline_otel.normalise import Limits

    summary = IngestSummary()
    records, problems = ingest_decoded(decoded, Limits(), summary)
    return records, problems, summary.rejected_spans


__all__ = ["Overloaded", "Prepared", "Ticket", "WriteQueue", "default_prepare"]
