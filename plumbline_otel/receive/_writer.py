"""The ingest pipeline behind the transports: a bounded queue, the shard workers, and the one DuckDB thread.

    handler threads ──admit/submit──► queue of requests (bounded in spans and in bytes): protobuf bytes for
        shard workers, the handler's decoded request for an in-process shard (never parsed again)
        ──► dispatch thread: each request to every shard (`pipeline/`:
            worker processes sharded by trace id apply the content rules, normalise, build Arrow
            span tables and assemble each trace once it has been quiet for `assemble_interval`)
        ──► collect thread: the shards' parts, in the order each shard made them
        ──► commit thread (the only one that touches DuckDB): span parts in one transaction per
            `batch_max_spans` (through `PartWriter`, the writer file ingest uses too), then every
            request whose parts are all committed is answered; assembled trajectories stored when
            their span counts match; reads for the API (`call`) run here too

Request handlers only decode (protobuf parsing is C) and wait on a `Ticket`; the Python-heavy work
runs in the shard processes, on every core. A request is answered only after the transactions
holding its spans committed. Traces a shard could not assemble alone (spans from before a restart,
a trace it let go of to bound memory) stay dirty and are rebuilt from the store when the queue is
idle (at the latest `assemble_max_delay` after the first), and once more on close.
Whatever an earlier process left pending (a crash, or a shutdown whose assembly budget ran out) is
assembled when the store opens, before `start()` returns, so the server listens only once every
stored span is in a trajectory; `recovered` and `left_pending` report both ends.

Admission is two-step so memory stays bounded before decoding starts: `admit(nbytes)` reserves the
body's bytes in the server's one `MemoryBudget` (`_budget.py`; the transports reserve them while
reading and hand them over as `held`), `submit` adds its span count; either past its bound raises
`Overloaded` (`OverBudget` for bytes; unless nothing else is in flight, so one request larger than a
bound still gets through alone). A queued request holds its protobuf bytes' worth until committed.

A store DuckDB invalidated (a checkpoint failed: a full disk) refuses every statement. The commit
thread then marks the store unusable (`store_problem`, which health checks and `/metrics` report, and
`on_store_state` listeners hear), answers every queued request and call with `StoreError` (retryable:
503 / UNAVAILABLE) without touching the store, refuses new requests at `submit`, and tries to attach
the file again (`Store.reattach`) after 1 s, then twice as long each time up to 30 s. A reattach
succeeds once the checkpoint after it does, that is once there is room again; then the store is
usable, and everything pending is assembled. Nothing acknowledged is lost: a request is answered
only after its commit, and a commit reported failed but durable is recognised when retried.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from plumbline_otel.decode import Decoded, Unit
from plumbline_otel.errors import PlumblineError, Problem, StoreError
from plumbline_otel.memory import IdleRelease
from plumbline_otel.pipeline import Flushed, PartWriter, ShardPool, ShardSettings, SpanPart, TrajectoryPart
from plumbline_otel.receive._budget import MemoryBudget
from plumbline_otel.receive._metrics import Metrics
from plumbline_otel.store import Store, WriteResult, invalidated

log = logging.getLogger("plumbline.receive")

_MAX_PENDING_CALLS = 64
_MAX_COMMIT_QUEUE = 64  # parts waiting for the commit thread before the collector waits
_REATTACH_FIRST, _REATTACH_MAX = 1.0, 30.0  # seconds before attaching an invalidated store again: doubled each time
_ASSEMBLE_RETRY_MAX = 30.0  # a failed assembly waits its interval, doubled each time, up to this

# What a request comes back as once committed: the problems met in it and how many spans it rejected.
Prepared = tuple[list[Problem], int]


class Overloaded(PlumblineError):
    """The queue is full (or the server is draining); the client should retry after a delay."""


class OverBudget(Overloaded):
    """The memory budget for bytes in flight is spent; the client should retry after a delay."""


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
    work: Unit | Decoded | None  # what the shards read, until it is sent to them: the request's protobuf bytes, or in-process its decoded form
    parts_left: int = 0
    problems: list[Problem] = field(default_factory=list)
    rejected: int = 0
    error: BaseException | None = None
    unstored: list[Problem] = field(default_factory=list)  # met while decoding: stored with the request's first part


@dataclass
class _Call:
    ticket: Ticket
    fn: Callable[[Store], Any]


_END = "end"  # the collector's last word: every shard has flushed


class WriteQueue:
    """Owns the `Store` on the commit thread and the shard pool; see the module docstring for the contract."""

    def __init__(self, open_store: Callable[[], Store], metrics: Metrics, *, max_spans: int, max_bytes: int,
                 settings: ShardSettings | None = None, workers: int = 0, batch_max_spans: int = 8192,
                 assemble_interval: float = 1.0, assemble_max_delay: float = 10.0, budget: MemoryBudget | None = None) -> None:
        self._open_store = open_store
        self._metrics = metrics
        self._settings, self._workers = settings or ShardSettings(), workers
        self.budget = budget or MemoryBudget(max_bytes)  # shared with the transports: bytes being read, decoded and queued
        self.max_spans, self.max_bytes, self.batch_max_spans = max_spans, self.budget.limit, batch_max_spans
        self._assemble_interval, self._assemble_max_delay = assemble_interval, assemble_max_delay
        self._lock = threading.Lock()
        self._inbound: deque[_Request] = deque()
        self._inbound_ready = threading.Condition(self._lock)
        self._commit: deque[SpanPart | TrajectoryPart | _Call | str] = deque()
        self._commit_ready = threading.Condition(self._lock)
        self._commit_room = threading.Condition(self._lock)
        self._by_seq: dict[int, _Request] = {}
        self._spans = 0  # submitted, not yet committed
        self.progress = 0  # counts parts the shards handed over and parts committed: a waiting request sees the pipeline move
        self._calls = 0
        self._closing = False
        self._dispatch_done = False
        self._pool: ShardPool | None = None
        self._dispatcher = threading.Thread(target=self._run_dispatch, name="plumbline-dispatch", daemon=True)
        self._collector = threading.Thread(target=self._run_collect, name="plumbline-collect", daemon=True)
        self._committer = threading.Thread(target=self._run_commit, name="plumbline-writer", daemon=True)
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self._dirty_since: float | None = None
        self._task_keys: tuple[str, ...] = ()
        self._last_write = time.monotonic()
        self._close_budget: float | None = None
        self.recovered = 0  # traces an earlier process left pending, assembled at start
        self.left_pending = 0  # traces still pending when the store closed
        self.store_problem: str | None = None  # why the store is unusable now (None: it is usable)
        self.on_store_state: list[Callable[[str | None], None]] = []  # told the problem (None once usable again)
        self._reattach_at = 0.0
        self._reattach_wait = _REATTACH_FIRST
        self._assemble_wait = 0.0  # extra wait after a failed assembly (0: none failed)
        self._idle = IdleRelease()  # the writer's process gives a burst's memory back once quiet
        self._db_dir = ""  # the store's folder, kept out of what clients are told
        metrics.gauge("plumbline_store_usable", lambda: 0 if self.store_problem else 1)
        metrics.inc("plumbline_store_invalidated_total", 0)
        metrics.inc("plumbline_store_reattached_total", 0)
        metrics.gauge("plumbline_queue_spans", lambda: self._spans)
        metrics.gauge("plumbline_queue_bytes", lambda: self.budget.used)
        metrics.gauge("plumbline_memory_budget_bytes", lambda: self.budget.limit)
        metrics.gauge("plumbline_memory_budget_peak_bytes", lambda: self.budget.peak)

    # --- producer side (any thread) ---------------------------------------------------------

    def start(self) -> None:
        """Open the store on the commit thread and start the shards; raise a `StoreError` here if that fails."""
        self._committer.start()
        self._started.wait()
        if self._start_error is not None:
            raise self._start_error
        try:
            self._pool = ShardPool(replace(self._settings, task_keys=self._task_keys), self._workers, collector=True)
        except Exception as exc:  # nothing was accepted yet: the commit thread closes the store, and the server exits
            self._forward([_END])
            self._committer.join()
            raise PlumblineError(f"the shard workers could not start ({exc}; a worker's own error, if any, is above)") from exc
        self._dispatcher.start()
        if self._workers:
            self._collector.start()

    @property
    def depth(self) -> tuple[int, int]:
        """(spans, bytes) accepted and not yet committed."""
        return self._spans, self.budget.used

    def admit(self, nbytes: int, held: int = 0) -> None:
        """Make a request's reservation `nbytes`, from the `held` bytes it has (0: reserve them now).

        Raises `Overloaded` (and gives back `held`) when closing, `OverBudget` past the budget.
        """
        if self._closing:
            self.budget.give(held)
            raise Overloaded("the server is shutting down")
        if nbytes < held:
            self.budget.give(held - nbytes)
        elif not self.budget.take(nbytes - held, held):
            used, limit = self.budget.used, self.budget.limit
            self.budget.give(held)
            raise OverBudget(f"the ingest queue is full ({used >> 20} of the {limit >> 20} MiB for requests in flight are taken)")

    def release(self, nbytes: int) -> None:
        """Give back an admission whose request will not be queued (bad body, overload, nothing in it)."""
        self.budget.give(nbytes)

    def submit(self, nbytes: int, decoded: Decoded, spans: int) -> Ticket:
        """Queue an admitted, decoded request of `spans` spans; the ticket's result is its `Prepared`.

        Raises `Overloaded` (and releases the admission) past `max_spans`. With shard workers the request
        goes to them as protobuf bytes and keeps those bytes' worth of the admission (the decoded form
        goes when the caller drops it); an in-process shard prepares the decoded request itself, never
        parsing it again, so it keeps the whole admission until then.
        """
        work: Unit | Decoded = Unit("protobuf", decoded.protobuf(), decoded.where) if self._workers else decoded
        with self._lock:
            if self._dispatch_done or self._closing:
                self.budget.give(nbytes)
                raise Overloaded("the server is shutting down")
            if self.store_problem is not None:
                self.budget.give(nbytes)
                raise Overloaded(f"the store is unusable ({self.store_problem}); retry later")
            if self._spans and self._spans + spans > self.max_spans:
                self.budget.give(nbytes)
                raise Overloaded(f"the ingest queue is full ({self._spans} spans waiting to be stored)")
            self._spans += spans
            if isinstance(work, Unit) and nbytes > len(work.data):
                self.budget.give(nbytes - len(work.data))
                nbytes = len(work.data)
            request = _Request(Ticket(), nbytes, spans, work, problems=list(decoded.problems),
                               rejected=sum(p.spans for p in decoded.problems), unstored=list(decoded.problems))
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
        """Stop taking work, commit everything queued, assemble everything, close the store.

        The final assembly from the store may take `assemble_budget` seconds (unbounded when
        None); traces it could not reach stay pending in the store, are counted in `left_pending`
        and logged.
        """
        with self._lock:
            self._close_budget = assemble_budget
            self._closing = True
            self._inbound_ready.notify_all()
            self._commit_ready.notify_all()
        for thread in (self._dispatcher, self._collector, self._committer):
            if thread.is_alive():
                thread.join(timeout)
        if self._pool is not None:
            self._pool.close()

    # --- the dispatch thread: requests to the shards ------------------------------------------

    def _take_request(self) -> _Request | None | str:
        """The next request; "tick" when the shards should look for quiet traces; None once closed and drained."""
        with self._lock:
            while not self._inbound:
                if self._closing:
                    return None
                if not self._inbound_ready.wait(self._assemble_interval / 2):
                    return "tick"
            return self._inbound.popleft()

    def _run_dispatch(self) -> None:
        pool = self._pool
        assert pool is not None
        last_tick = time.monotonic()
        while (request := self._take_request()) is not None:
            if isinstance(request, _Request):
                work, request.work = request.work, None
                assert work is not None
                request.parts_left = pool.shards
                seq = pool.submit(work) if not self._workers else self._submit_remote(pool, work, request)
                del work  # not kept while the thread waits for the next request (a burst's body would stay in memory)
                if not self._workers:
                    self._by_seq[seq] = request
            if time.monotonic() - last_tick >= self._assemble_interval / 2:
                pool.tick(self._assemble_interval)
                last_tick = time.monotonic()
            if not self._workers:
                self._forward(list(pool.parts()))
        pool.request_flush()
        with self._lock:
            self._dispatch_done = True
        if not self._workers:
            self._forward([*pool.parts(), _END])

    def _submit_remote(self, pool: ShardPool, work: Unit | Decoded, request: _Request) -> int:
        with self._lock:  # registered before any part of it can come back
            seq = pool.next_seq
            self._by_seq[seq] = request
        return pool.submit(work)

    # --- the collect thread (worker processes only) -------------------------------------------

    def _run_collect(self) -> None:
        pool = self._pool
        assert pool is not None
        flushed = 0
        while flushed < pool.shards:
            try:
                part = pool.next_part(timeout=0.5)
            except RuntimeError:  # a worker died: nothing more will come; the commit thread reports it
                log.exception("a shard worker exited")
                break
            if isinstance(part, Flushed):
                flushed += 1
            elif part is not None:
                self._forward([part])
        self._forward([_END])

    def _forward(self, parts: list[Any]) -> None:
        self.progress += 1
        with self._lock:
            for part in parts:
                while len(self._commit) >= _MAX_COMMIT_QUEUE and not isinstance(part, str):
                    self._commit_room.wait(0.5)
                self._commit.append(part)
            self._commit_ready.notify()

    # --- the commit thread (the only one that touches DuckDB) ------------------------------------

    def _run_commit(self) -> None:
        try:
            store = self._open_store()
        except BaseException as exc:  # reported by start()
            self._start_error = exc
            self._started.set()
            return
        self._task_keys = store.task_keys
        self._db_dir = os.path.dirname(os.path.abspath(store.path)) + os.sep
        self._recover(store)
        self._writer = PartWriter(store, self.batch_max_spans, "otlp", on_spans=self._spans_written,
                                  on_trajectories=self._trajectories_written)
        self._started.set()
        try:
            while (work := self._next_work()) is not None:
                self._do(store, work)
                del work  # the last batch's tables are not kept while the thread waits
            self._assemble_before_close(store)
        finally:
            self._fail_unfinished(StoreError("the server stopped before these spans were committed"))
            store.close()

    def _do(self, store: Store, work: list[SpanPart] | TrajectoryPart | _Call | str) -> None:
        if self.store_problem is not None and time.monotonic() >= self._reattach_at:
            self._reattach(store)
        if self.store_problem is not None:
            self._refuse(work)
            return
        if isinstance(work, _Call):
            self._run_call(store, work)
        elif isinstance(work, list):
            self._write(work)
            self._idle.worked()
        elif isinstance(work, TrajectoryPart):
            self._store_assembled(work)
            self._idle.worked()
        elif work == "release":
            self._idle.release_if_due()
        if self._assemble_due_in() == 0.0:
            self._assemble(store)
            self._idle.worked()

    # --- an invalidated store: refuse, back off, attach it again ----------------------------------

    def _failed(self, exc: BaseException) -> None:
        """Note a store error: an invalidating one makes the store unusable until `_reattach` succeeds."""
        if self.store_problem is not None or not invalidated(exc):
            return
        self.store_problem = self.client_text(f"DuckDB invalidated the database: {str(exc).splitlines()[0][:300]}")
        self._reattach_wait = _REATTACH_FIRST
        self._reattach_at = time.monotonic() + self._reattach_wait
        self._metrics.inc("plumbline_store_invalidated_total")
        log.error("the store is unusable (%s); requests are pushed back and it is attached again in %.0f s "
                  "(then at most every %.0f s) until that succeeds, which needs room on its disk",
                  str(exc).splitlines()[0], self._reattach_wait, _REATTACH_MAX)
        self._tell(self.store_problem)

    def _reattach(self, store: Store) -> None:
        try:
            store.reattach()
        except Exception as exc:
            self._reattach_wait = min(2 * self._reattach_wait, _REATTACH_MAX)
            self._reattach_at = time.monotonic() + self._reattach_wait
            log.warning("the store is still unusable (%s); next attempt in %.0f s", str(exc).splitlines()[0], self._reattach_wait)
            return
        self.store_problem = None
        self._metrics.inc("plumbline_store_reattached_total")
        self._dirty_since = time.monotonic()  # whatever is pending, assembled from the store
        self._assemble_wait = 0.0
        log.warning("the store is usable again (attached again after it was invalidated)")
        self._tell(None)

    def _tell(self, problem: str | None) -> None:
        for listener in self.on_store_state:
            try:
                listener(problem)
            except Exception:
                log.exception("a store-state listener failed")

    def _refuse(self, work: list[SpanPart] | TrajectoryPart | _Call | str) -> None:
        """Answer work that reached the commit thread while the store is unusable, without touching it."""
        error = StoreError(f"the store is unusable ({self.store_problem}); retry later")
        if isinstance(work, _Call):
            with self._lock:
                self._calls -= 1
            work.ticket.finish(None, error)
        elif isinstance(work, list):
            self._settle(work, error)
        # a trajectory part is dropped: its traces stay dirty in the store and are rebuilt once it is usable

    def client_text(self, text: str) -> str:
        """`text` without the store's folder: clients are told the file's name, never where the server keeps it."""
        return text.replace(self._db_dir, "") if self._db_dir else text

    def _recover(self, store: Store) -> None:
        """Assemble what an earlier process left pending; a failure is logged and leaves it pending."""
        try:
            self.recovered = store.assemble() if store.pending_traces() else 0
        except Exception:
            log.exception("assembling the traces left pending by an earlier stop failed")

    def _assemble_before_close(self, store: Store) -> None:
        budget = self._close_budget
        if self.store_problem is not None:
            log.warning("the store is unusable at shutdown (%s): what is pending is assembled at the next start", self.store_problem)
            return
        try:
            store.assemble(deadline=None if budget is None else time.monotonic() + budget)
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
        if self._assemble_wait:  # the last assembly failed: it is not retried before its wait is over
            return max(0.0, self._last_write + self._assemble_wait - now)
        return max(0.0, min(self._last_write + self._assemble_interval, self._dirty_since + self._assemble_max_delay) - now)

    def _next_work(self) -> list[SpanPart] | TrajectoryPart | _Call | str | None:
        """Span parts (as many as one transaction takes), a trajectory part or a call; "assemble" (or,
        with the store unusable, "reattach") when only that is due, "release" when quiet after work
        with nothing in flight; None at the end."""
        with self._lock:
            while not self._commit:
                if self.store_problem is not None:
                    due: float | None = max(0.0, self._reattach_at - time.monotonic())
                    if due == 0.0:
                        return "reattach"
                else:
                    due = self._assemble_due_in()
                    if due == 0.0:
                        return "assemble"
                    release = self._idle.due_in() if not self._inbound and not self._spans else None
                    if release == 0.0:
                        return "release"  # quiet after work: the burst's memory goes back (`memory.py`)
                    due = release if due is None else due if release is None else min(due, release)
                self._commit_ready.wait(due if due is not None else 0.5)
            work = self._commit.popleft()
            if work == _END:
                return None
            if isinstance(work, SpanPart):
                batch, spans = [work], work.spans
                while self._commit and isinstance(self._commit[0], SpanPart) and spans + self._commit[0].spans <= self.batch_max_spans:
                    part = self._commit.popleft()
                    assert isinstance(part, SpanPart)
                    batch.append(part)
                    spans += part.spans
                work = batch  # type: ignore[assignment]
            self._commit_room.notify_all()
            return work  # type: ignore[return-value]

    def _write(self, parts: list[SpanPart]) -> None:
        """Commit a batch of span parts in one transaction, with the problems met decoding their requests, then answer."""
        with self._lock:
            requests = [self._by_seq.get(part.seq) for part in parts]
        error: BaseException | None = None
        try:
            for part, request in zip(parts, requests):
                unstored = request.unstored if request is not None else []
                if request is not None:
                    request.unstored = []
                self._writer.take(part, unstored)
            self._writer.commit()
        except Exception as exc:  # the store failed: every request in the batch is told to retry
            self._writer.drop()
            log.exception("writing %d spans failed", sum(part.spans for part in parts))
            error = StoreError(self.client_text(f"the store could not commit: {exc}"))
            self._failed(exc)
        self._last_write = time.monotonic()
        self._settle(parts, error, requests)

    def _spans_written(self, result: WriteResult) -> None:
        self._metrics.inc("plumbline_spans_stored_total", result.stored)
        self._metrics.inc("plumbline_spans_duplicate_total", result.duplicate)

    def _settle(self, parts: list[SpanPart], error: BaseException | None, requests: list[_Request | None] | None = None) -> None:
        """Count the parts of a transaction and answer each request whose parts are all settled (`error`: none committed)."""
        if requests is None:
            with self._lock:
                requests = [self._by_seq.get(part.seq) for part in parts]
        self.progress += 1
        for part, request in zip(parts, requests):
            self._metrics.inc("plumbline_spans_received_total", part.spans)
            self._metrics.inc("plumbline_spans_rejected_total", part.rejected)
            if request is None:
                continue
            request.problems.extend(part.problems)
            request.rejected += part.rejected
            if part.error:
                request.error = RuntimeError(f"request could not be processed: {part.error}")
            request.error = request.error or error
            request.parts_left -= 1
            if request.parts_left == 0:
                self._finish(part.seq, request)

    def _finish(self, seq: int, request: _Request) -> None:
        with self._lock:
            self._by_seq.pop(seq, None)
            self._spans -= request.spans
        self.budget.give(request.nbytes)
        if request.error is None:
            self._metrics.inc("plumbline_spans_committed_total", request.spans - request.rejected)
        request.ticket.finish((request.problems, request.rejected), request.error)

    def _fail_unfinished(self, error: BaseException) -> None:
        with self._lock:
            left = list(self._by_seq.items())
        for seq, request in left:
            request.error = request.error or error
            self._finish(seq, request)

    def _store_assembled(self, part: TrajectoryPart) -> None:
        try:
            self._writer.take(part)  # no spans are gathered between batches: stored at once
        except Exception as exc:
            log.exception("storing the trajectories of %d assembled traces failed; the store will rebuild them", len(part.counts))
            self._failed(exc)
            self._trajectories_written(part, 0)

    def _trajectories_written(self, part: TrajectoryPart, stored: int) -> None:
        if (stored < len(part.counts) or part.let_go) and self._dirty_since is None:  # the rest stays dirty: rebuilt from the store
            self._dirty_since = time.monotonic()

    def _run_call(self, store: Store, call: _Call) -> None:
        try:
            result, error = call.fn(store), None
        except BaseException as exc:
            result, error = None, exc
            self._failed(exc)
        with self._lock:
            self._calls -= 1
        if store.logs_written:  # log records re-open their traces: assemble them like a span write would
            store.logs_written = False
            self._dirty_since = self._dirty_since or time.monotonic()
        call.ticket.finish(result, error)

    def _assemble(self, store: Store) -> None:
        if self._dirty_since is None:
            return
        started = time.monotonic()
        try:
            n = store.assemble()
            log.debug("assembled %d trajectories from the store in %.3fs", n, time.monotonic() - started)
        except Exception as exc:
            self._assemble_wait = min(2 * max(self._assemble_wait, self._assemble_interval / 2), _ASSEMBLE_RETRY_MAX)
            log.exception("assembling trajectories failed; will retry in %.1f s", self._assemble_wait)
            self._last_write = time.monotonic()
            self._failed(exc)
            return
        self._dirty_since = None
        self._assemble_wait = 0.0


__all__ = ["Overloaded", "Prepared", "Ticket", "WriteQueue"]
