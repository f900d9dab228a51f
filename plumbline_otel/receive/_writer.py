"""The one thread that touches DuckDB, fed by a queue bounded in spans and in bytes.

Request handlers decode and normalise on their own threads, then hand the records here and wait on
a `Ticket`. The writer takes everything queued (up to `batch_max_spans`) and commits it in one
transaction, then releases every ticket in that batch: a request is answered only after the
transaction holding its spans committed. Reads for the API (`call`) run on the same thread between
batches, so nothing else ever shares the connection. Trajectories are assembled when the queue has
been idle for `assemble_interval` (and at the latest `assemble_max_delay` after the first unassembled
write), and once more on close.

Admission is two-step so memory stays bounded before decoding starts: `admit(nbytes)` reserves the
request's bytes, `submit_spans` adds its span count; either past its bound raises `Overloaded`
(unless the queue is empty, so one request larger than the bound still gets through alone).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from plumbline_otel.decode import Problem
from plumbline_otel.errors import PlumblineError, StoreError
from plumbline_otel.model import SpanRecord
from plumbline_otel.receive._metrics import Metrics
from plumbline_otel.store import Store

log = logging.getLogger("plumbline.receive")

_MAX_PENDING_CALLS = 64


class Overloaded(PlumblineError):
    """The queue is full (or the server is draining); the client should retry after a delay."""


@dataclass
class Ticket:
    """One queued piece of work; `wait` returns its result once the writer has done it."""

    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None

    def finish(self, result: Any = None, error: BaseException | None = None) -> None:
        self.result, self.error = result, error
        self.done.set()

    def wait(self, timeout: float | None = None) -> Any:
        """Block until done; re-raise the writer's error; `TimeoutError` past `timeout`."""
        if not self.done.wait(timeout):
            raise TimeoutError("the store did not commit in time")
        if self.error is not None:
            raise self.error
        return self.result


@dataclass
class _Item:
    kind: str  # "spans", "call"
    ticket: Ticket
    nbytes: int = 0
    records: list[SpanRecord] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    fn: Callable[[Store], Any] | None = None


class WriteQueue:
    """Owns the `Store` on one thread; see the module docstring for the contract."""

    def __init__(self, open_store: Callable[[], Store], metrics: Metrics, *, max_spans: int, max_bytes: int,
                 batch_max_spans: int = 8192, assemble_interval: float = 1.0, assemble_max_delay: float = 10.0) -> None:
        self._open_store = open_store
        self._metrics = metrics
        self.max_spans, self.max_bytes, self.batch_max_spans = max_spans, max_bytes, batch_max_spans
        self._assemble_interval, self._assemble_max_delay = assemble_interval, assemble_max_delay
        self._cond = threading.Condition()
        self._queue: deque[_Item] = deque()
        self._spans = 0  # queued, not yet committed
        self._bytes = 0  # admitted, not yet committed or released
        self._calls = 0
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="plumbline-writer", daemon=True)
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        metrics.gauge("plumbline_queue_spans", lambda: self._spans)
        metrics.gauge("plumbline_queue_bytes", lambda: self._bytes)

    # --- producer side (any thread) ---------------------------------------------------------

    def start(self) -> None:
        """Open the store on the writer thread; raise its `StoreError` here if that fails."""
        self._thread.start()
        self._started.wait()
        if self._start_error is not None:
            raise self._start_error

    @property
    def depth(self) -> tuple[int, int]:
        """(spans, bytes) accepted and not yet committed."""
        return self._spans, self._bytes

    def admit(self, nbytes: int) -> None:
        """Reserve room for a request body of `nbytes` before decoding it."""
        with self._cond:
            if self._closing:
                raise Overloaded("the server is shutting down")
            if self._bytes and self._bytes + nbytes > self.max_bytes:
                raise Overloaded(f"the ingest queue is full ({self._bytes >> 20} MiB waiting to be stored)")
            self._bytes += nbytes

    def release(self, nbytes: int) -> None:
        """Give back an admission whose request will not be queued (bad body, auth, overload)."""
        with self._cond:
            self._bytes -= nbytes

    def submit_spans(self, nbytes: int, records: list[SpanRecord], problems: list[Problem]) -> Ticket:
        """Queue an admitted request's records; `Overloaded` (admission released) past `max_spans`."""
        with self._cond:
            if self._closing and not self._thread.is_alive():
                self._bytes -= nbytes
                raise Overloaded("the server is shutting down")
            if self._spans and self._spans + len(records) > self.max_spans:
                self._bytes -= nbytes
                raise Overloaded(f"the ingest queue is full ({self._spans} spans waiting to be stored)")
            self._spans += len(records)
            item = _Item("spans", Ticket(), nbytes, records, problems)
            self._queue.append(item)
            self._cond.notify()
        return item.ticket

    def call(self, fn: Callable[[Store], Any], timeout: float = 60.0) -> Any:
        """Run `fn(store)` on the writer thread and return its result (reads for the API)."""
        with self._cond:
            if self._closing:
                raise Overloaded("the server is shutting down")
            if self._calls >= _MAX_PENDING_CALLS:
                raise Overloaded("too many queries waiting")
            self._calls += 1
            item = _Item("call", Ticket(), fn=fn)
            self._queue.append(item)
            self._cond.notify()
        return item.ticket.wait(timeout)

    def close(self, timeout: float | None = None) -> None:
        """Stop taking work, commit everything queued, assemble, close the store."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout)

    # --- the writer thread --------------------------------------------------------------------

    def _run(self) -> None:
        try:
            store = self._open_store()
        except BaseException as exc:  # reported by start()
            self._start_error = exc
            self._started.set()
            return
        self._started.set()
        self._dirty_since: float | None = None
        self._last_write = time.monotonic()
        try:
            while (batch := self._next_batch()) is not None:
                if batch:
                    self._process(store, batch)
                self._maybe_assemble(store)
            self._assemble(store)
        finally:
            store.close()

    def _assemble_due_in(self) -> float | None:
        if self._dirty_since is None:
            return None
        now = time.monotonic()
        return max(0.0, min(self._last_write + self._assemble_interval, self._dirty_since + self._assemble_max_delay) - now)

    def _next_batch(self) -> list[_Item] | None:
        """Everything queued up to one batch; [] when only an assembly is due; None when closed and empty."""
        with self._cond:
            while not self._queue:
                if self._closing:
                    return None
                due = self._assemble_due_in()
                if due == 0.0:
                    return []
                self._cond.wait(due)
            if self._queue[0].kind == "call":
                return [self._queue.popleft()]
            batch, spans = [], 0
            while self._queue and self._queue[0].kind == "spans" and (not batch or spans + len(self._queue[0].records) <= self.batch_max_spans):
                item = self._queue.popleft()
                batch.append(item)
                spans += len(item.records)
            return batch

    def _process(self, store: Store, batch: list[_Item]) -> None:
        if batch[0].kind == "call":
            self._run_call(store, batch[0])
            return
        records = [r for item in batch for r in item.records]
        problems = [p for item in batch for p in item.problems]
        error: BaseException | None = None
        try:
            result = store.write_spans(records, problems, source="otlp")
            self._metrics.inc("plumbline_spans_stored_total", result.stored)
            self._metrics.inc("plumbline_spans_duplicate_total", result.duplicate)
        except Exception as exc:  # the store failed: every request in the batch is told to retry
            log.exception("writing %d spans failed", len(records))
            error = StoreError(f"the store could not commit: {exc}")
        now = time.monotonic()
        self._last_write = now
        if records and error is None and self._dirty_since is None:
            self._dirty_since = now
        with self._cond:
            self._spans -= len(records)
            self._bytes -= sum(item.nbytes for item in batch)
        for item in batch:
            item.ticket.finish(error=error)

    def _run_call(self, store: Store, item: _Item) -> None:
        try:
            assert item.fn is not None
            result, error = item.fn(store), None
        except BaseException as exc:
            result, error = None, exc
        with self._cond:
            self._calls -= 1
        item.ticket.finish(result, error)

    def _maybe_assemble(self, store: Store) -> None:
        if self._assemble_due_in() == 0.0:
            self._assemble(store)

    def _assemble(self, store: Store) -> None:
        if self._dirty_since is None:
            return
        started = time.monotonic()
        try:
            n = store.assemble()
            log.debug("assembled %d trajectories in %.3fs", n, time.monotonic() - started)
        except Exception:
            log.exception("assembling trajectories failed; will retry")
            self._last_write = time.monotonic()
            return
        self._dirty_since = None


__all__ = ["Overloaded", "Ticket", "WriteQueue"]
