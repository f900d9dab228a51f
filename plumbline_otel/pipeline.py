"""The prepare stage on every core: decode, normalise, columnar span batches and assembly, sharded by trace id.

    reader / receiver ──unit (raw request bytes)──► every shard
        a shard keeps only the spans whose trace id falls in it (the way the Collector's
        loadbalancing exporter routes), applies the content rules, normalises them into an Arrow
        span table, holds its traces' records and assembles each trace once, when it goes quiet
        (or on flush), into trajectory rows
    ◄──parts── the writer, the one owner of the DuckDB file, commits span tables, then the
        trajectories whose span count equals the store's (`Store.write_assembled`)

A worker's part crosses to the writer as a small message; its Arrow table goes as a file in a
spool directory in memory (`/dev/shm`), which the writer maps without copying (`_Spool`).

A shard runs in a worker process (`workers` > 0) or in the caller's process (`workers` = 0, for
small inputs where starting processes costs more than it saves); both run the same `Shard` code,
so they store the same rows. Nothing here needs the spans of a trace to arrive together: a trace
whose stored spans differ from the ones its shard held (spans from before a restart, a trace the
shard let go of to bound memory, a retry of an assembled trace) stays dirty and the store rebuilds
it from its rows. Sharding only decides where work is done, never what is stored.

A unit that is a logs request (a logs file) is read by shard 0 alone, which sends its GenAI records
to the writer (`LogPart`). Shards never fold log records: the store refuses a shard's trajectory for
a trace that has log records and rebuilds it with them, so the order logs and spans arrive in does
not matter.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import multiprocessing
import os
import queue
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
import pyarrow.ipc

from plumbline_otel.assemble import DEFAULT_TASK_KEYS, LONG_TRACE_SPANS, assembly_keys, iter_runs, trim_for_assembly
from plumbline_otel.config import ContentRules
from plumbline_otel.content import ContentFilter
from plumbline_otel.decode import Problem, Unit, decode_unit
from plumbline_otel.model import SpanRecord, Trajectory
from plumbline_otel.normalise import Limits, LogRows, log_rows, normalise_request
from plumbline_otel.rows import span_table, trajectory_table, unique_spans

_IN_FLIGHT_PER_WORKER = 8  # units queued for one worker before `submit` waits: bounds memory
_WORKER_START_TIMEOUT = 60.0
_PARENT_CHECK_SECONDS = 0.5  # how often a worker's watchdog thread checks that its writer is still alive
_PR_SET_PDEATHSIG = 1  # prctl(2): the signal the kernel sends this process when its parent dies
_PARENT_GONE_RT = 4  # that signal: SIGRTMIN + this, which nothing else sends


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


@dataclass
class SpanPart:
    """One shard's share of one unit: its spans as an Arrow table, and what was rejected."""

    seq: int
    shard: int
    table: pa.Table | None
    problems: list[Problem]
    spans: int
    rejected: int
    error: str | None = None  # an internal failure: the unit's spans of this shard were not prepared


@dataclass
class TrajectoryPart:
    """Trajectories a shard assembled, with the number of spans each was built from.

    `let_go` names the quiet traces the shard stopped holding because they grew long: the store
    rebuilds them from their rows, run by run.
    """

    shard: int
    table: pa.Table
    counts: dict[str, int]
    let_go: list[str] = field(default_factory=list)


@dataclass
class LogPart:
    """GenAI log records met in a file (one shard, the first, reads them): the writer stores them."""

    seq: int
    rows: LogRows


@dataclass
class Flushed:
    """A shard has assembled everything it held (the answer to `flush`)."""

    shard: int


Part = SpanPart | TrajectoryPart | LogPart | Flushed


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

    def prepare(self, seq: int, unit: Unit) -> list[Part]:
        """Decode and normalise this shard's spans of `unit`; hold them for assembly."""
        n, me = self.settings.shards, self.index
        decoded = decode_unit(unit, (lambda raw: json_shard_of(raw, n) == me) if n > 1 else None)
        # JSON spans were filtered, by their text ids, while decoding; protobuf ones (the C parser reads
        # them all cheaply) are skipped as they are read
        own = (lambda trace_id: shard_of(trace_id, n) == me) if n > 1 and unit.kind != "json" else None
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


def collect_less_often() -> None:
    """Run the garbage collector a fourteenth as often, in a process that prepares or writes spans.

    Normalising makes millions of short-lived objects and no cycles worth chasing: the collector's
    default (a pass every 700 allocations) cost 15% of an in-process ingest's time. The commands
    that ingest (`ingest`, `serve`, `demo`) call it for their own process. A shard worker goes
    further (`_COLLECT_SECONDS`).
    """
    gc.set_threshold(10_000, 20, 100)


# A shard worker runs the collector itself, once every this many seconds, instead of on allocation
# counts. Its own objects make no reference cycles (none found over the bench corpus, every
# fixture and the odd-type requests), so the automatic passes only re-read the records it holds for
# assembly: at a pass every 10,000 allocations they cost 15% of a worker's CPU (7.0-7.2 s per
# 100,000 spans, 5.9-6.1 s with none). The explicit pass catches any cycle a rare path makes, so
# garbage never outlives it by long. It was once every 64 messages; in `serve`, whose units are
# small, that came every second or two and took ~10% of a worker's CPU (perf), for a pass reads
# every record the shard holds.
_COLLECT_SECONDS = 10.0


_SPOOL_PREFIX = "plumbline-parts-"


class _Spool:
    """Where workers leave their parts' Arrow tables for the writer: files in memory, mapped, never copied.

    Pickled down the queue's pipe, a table was copied four times (pickled, written, read in 64 KiB
    pieces, unpickled): 10 µs of CPU a span across the workers and the writer, a tenth of a
    2-worker ingest. Written as an Arrow IPC file to `/dev/shm` it is copied once, and the writer's
    DuckDB reads the mapped buffers in place. The writer unlinks each file as it maps it (the pages
    live until the table is dropped), and removes the directory when the pool closes; workers remove
    it when they find their writer gone (killed), and a new pool removes those of writers that died.
    A table the spool has no room for goes down the pipe as before.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._written = 0

    @staticmethod
    def base() -> str:
        """The spool's parent: `/dev/shm` (memory) where there is one, else the temporary directory."""
        return "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()

    @classmethod
    def create(cls) -> _Spool:
        """A new spool directory named for this process, after removing those of writers that died."""
        base = cls.base()
        for name in os.listdir(base):
            if name.startswith(_SPOOL_PREFIX) and not _alive(name[len(_SPOOL_PREFIX):].split("-")[0]):
                shutil.rmtree(os.path.join(base, name), ignore_errors=True)
        return cls(tempfile.mkdtemp(prefix=f"{_SPOOL_PREFIX}{os.getpid()}-", dir=base))

    def ship(self, part: Part, shard: int) -> tuple[Part, str | None]:
        """`part` without its table, and the file holding the table (None: the part goes whole)."""
        if not isinstance(part, SpanPart | TrajectoryPart) or part.table is None:
            return part, None
        table = part.table
        self._written += 1
        path = os.path.join(self.path, f"{shard}-{self._written}.arrow")
        try:
            with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)
        except OSError:  # no room (a container's small /dev/shm), or the directory is gone
            with contextlib.suppress(OSError):
                os.unlink(path)
            return part, None
        return replace(part, table=None), path

    @staticmethod
    def land(message: tuple[Any, str | None]) -> Any:
        """The part a worker shipped, its table mapped from the spool (and the file unlinked)."""
        part, path = message
        if path is None:
            return part
        table = pa.ipc.open_file(pa.memory_map(path)).read_all()
        os.unlink(path)
        return replace(part, table=table)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def _alive(pid: str) -> bool:
    """Whether a process `pid` (text from a spool's name) exists; what is not a pid counts as alive."""
    if not pid.isdigit():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    return True


def spools(pid: int) -> list[str]:
    """The spool directories of the writer process `pid`."""
    base = _Spool.base()
    return [os.path.join(base, name) for name in os.listdir(base) if name.startswith(f"{_SPOOL_PREFIX}{pid}-")]


def spooled_bytes(pid: int) -> int:
    """Bytes the spools of the writer `pid` hold now: parts made and not yet mapped (for memory figures)."""
    total = 0
    for path in spools(pid):
        with contextlib.suppress(OSError):  # a part mapped, or the spool removed, while counting
            total += sum(entry.stat().st_size for entry in os.scandir(path))
    return total


def _leave(spool: _Spool) -> None:
    """End this worker at once: its writer is gone, so nobody will read its parts or its spool."""
    spool.remove()
    os._exit(1)  # not sys.exit: the queues' feeder threads would wait forever to flush into pipes nobody reads


def _die_with_parent(parent: int, spool: _Spool, kernel: bool) -> None:
    """Leave as soon as the writer `parent` is gone, whatever the worker is doing then.

    Killed with SIGKILL, a writer cannot tell its workers, and a worker may then be blocked for good:
    in the middle of reading a unit the writer was writing when it died (the worker holds the write
    end of its own inbox, so the read never ends), or at exit, its feeder thread flushing parts into
    a pipe nobody reads. Two watchers, so either suffices:
    - with `kernel` (Linux, the pool made on the main thread), prctl(PR_SET_PDEATHSIG) has the kernel
      send a real-time signal the moment the thread that started the worker ends: the writer's main
      thread ends only when the writer does (killed, its threads die one by one, and the worker may
      briefly still see the same parent id). The signal is one nobody else sends, and its handler
      removes the spool and exits (a blocked pipe read is interrupted for it);
    - a watchdog thread polls the parent's id every `_PARENT_CHECK_SECONDS` and does the same.
    The parent may have died before either was armed: checked once after both are.
    """
    if kernel and sys.platform.startswith("linux"):
        gone = signal.SIGRTMIN + _PARENT_GONE_RT
        signal.signal(gone, lambda *_: _leave(spool))
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, gone, 0, 0, 0)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_PARENT_CHECK_SECONDS)
        _leave(spool)

    threading.Thread(target=watch, name="plumbline-parent-watch", daemon=True).start()
    if os.getppid() != parent:
        _leave(spool)


def _worker(index: int, settings: ShardSettings, inbox: Any, outbox: Any, spool: _Spool, parent: int = 0,
            kernel_watch: bool = False) -> None:
    """A worker process: one shard, messages in order, parts out in order.

    It leaves when told (None), or when its parent (`parent`, the writer) is gone: a writer killed
    with SIGKILL cannot say so, and a worker left waiting would hold its memory forever
    (`_die_with_parent`).
    """
    _die_with_parent(parent or os.getppid(), spool, kernel_watch)
    gc.freeze()  # the imported modules, out of the collector's sight for good
    gc.disable()
    shard = Shard(index, settings)
    outbox.put(("ready", None))  # every message is (part, its table's file in the spool or None)
    collected = time.monotonic()
    while True:
        try:
            message = inbox.get(timeout=_COLLECT_SECONDS)
        except queue.Empty:
            continue
        if message is None:
            return
        kind, payload = message
        if time.monotonic() - collected >= _COLLECT_SECONDS:
            gc.collect()
            collected = time.monotonic()
        try:
            if kind == "unit":
                seq, unit = payload
                parts = shard.prepare(seq, unit)
            else:  # "assemble": quiet seconds, or None for everything
                parts = shard.assemble_quiet(payload)
        except Exception as exc:  # a bug costs this unit's spans of this shard, never the worker
            if kind != "unit":
                raise
            parts = [SpanPart(payload[0], index, None, [], 0, 0, error=f"{type(exc).__name__}: {exc}")]
        for part in parts:
            outbox.put(spool.ship(part, index))


class ShardPool:
    """Shards behind one interface: `submit` units, `tick`/`flush` for assembly, `parts` to collect.

    With `workers` = 0 one in-process shard does the work as it is submitted. Otherwise each
    worker process owns one shard; every unit goes to every worker, parts come back on one queue,
    each worker's in the order it produced them, which is what lets the writer commit a shard's
    spans before the trajectories assembled from them.
    """

    def __init__(self, settings: ShardSettings | None = None, workers: int = 0, collector: bool = False) -> None:
        """`collector`: another thread reads the parts (`next_part`), so `submit` only waits when inboxes are full."""
        settings = settings or ShardSettings()
        self.workers, self.collector = workers, collector
        self._ready: deque[Part] = deque()
        self._seq = 0
        self._inboxes: list[Any] = []
        self._procs: list[Any] = []
        self._spool: _Spool | None = None
        if workers == 0:
            self._local: Shard | None = Shard(0, replace(settings, shards=1))
            return
        self._local = None
        context = multiprocessing.get_context("spawn")  # no fork: the receiver runs threads
        self._outbox = context.Queue()
        self._inboxes = [context.Queue(maxsize=_IN_FLIGHT_PER_WORKER) for _ in range(workers)]
        self._spool = _Spool.create()
        shard_settings = replace(settings, shards=workers)
        # the kernel's parent-death signal follows the thread that started a worker: armed only when that is the main thread
        kernel_watch = threading.current_thread() is threading.main_thread()
        self._procs = [context.Process(target=_worker, args=(i, shard_settings, self._inboxes[i], self._outbox, self._spool,
                                                             os.getpid(), kernel_watch),
                                       name=f"plumbline-shard-{i}", daemon=True) for i in range(workers)]
        try:
            for proc in self._procs:
                proc.start()
            for _ in range(workers):
                if self._get(_WORKER_START_TIMEOUT) is None:
                    raise RuntimeError("shard workers did not start")
        except BaseException:  # one that did start is not left waiting for units that will never come
            self.close()
            raise

    @property
    def next_seq(self) -> int:
        """The sequence number the next `submit` will return."""
        return self._seq + 1

    def submit(self, unit: Unit) -> int:
        """Send one unit to every shard; returns its sequence number (its parts carry it)."""
        self._seq += 1
        if self._local is not None:
            self._ready.extend(self._local.prepare(self._seq, unit))
        else:
            for inbox in self._inboxes:
                self._put(inbox, ("unit", (self._seq, unit)))
        return self._seq

    def tick(self, quiet_seconds: float) -> None:
        """Ask every shard to assemble the traces quiet for `quiet_seconds`."""
        if self._local is not None:
            self._ready.extend(self._local.assemble_quiet(quiet_seconds))
        else:
            for inbox in self._inboxes:
                self._put(inbox, ("assemble", quiet_seconds))

    def request_flush(self) -> None:
        """Ask every shard to assemble everything it holds; each answers with `Flushed` after its parts."""
        if self._local is not None:
            self._ready.extend(self._local.assemble_quiet(None))
        else:
            for inbox in self._inboxes:
                self._put(inbox, ("assemble", None))

    def flush(self) -> Iterator[Part]:
        """`request_flush`, then every part until all shards have flushed (for a single-threaded caller)."""
        self.request_flush()
        flushed = 0
        while flushed < self.shards:
            part = self.next_part(timeout=None)
            if isinstance(part, Flushed):
                flushed += 1
            elif part is not None:
                yield part

    def next_part(self, timeout: float | None = 0.0) -> Part | None:
        """The next part, waiting up to `timeout` seconds (None: until one comes); None when none came."""
        if self._ready:
            return self._ready.popleft()
        if self._local is not None:
            return None
        part: Part | None = self._get(timeout)
        return part

    @property
    def pids(self) -> list[int]:
        """The worker processes' ids (none in-process)."""
        return [p.pid for p in self._procs if p.pid is not None]

    @property
    def shards(self) -> int:
        """How many parts each unit comes back as."""
        return max(1, self.workers)

    def parts(self) -> Iterator[Part]:
        """The parts ready now, without waiting."""
        while (part := self.next_part()) is not None:
            yield part

    def _put(self, inbox: Any, message: Any) -> None:
        while True:  # while a worker's inbox is full, collect what the workers made so they can go on
            try:
                inbox.put(message, timeout=0.05)
                return
            except queue.Full:
                self._check_alive()
                if not self.collector and (part := self._get(0.0)) is not None:
                    self._ready.append(part)

    def _get(self, timeout: float | None) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = 0.5 if deadline is None else max(0.0, min(0.5, deadline - time.monotonic()))
            try:
                return _Spool.land(self._outbox.get(timeout=wait) if wait > 0 else self._outbox.get_nowait())
            except queue.Empty:
                self._check_alive()
                if deadline is not None and time.monotonic() >= deadline:
                    return None

    def _check_alive(self) -> None:
        dead = [p.name for p in self._procs if not p.is_alive()]
        if dead:
            raise RuntimeError(f"shard worker(s) {', '.join(dead)} exited")

    def close(self) -> None:
        """Stop the workers (they hold nothing that is not also in the store or still to be flushed)."""
        for inbox in self._inboxes:
            try:
                inbox.put(None, timeout=1.0)
            except queue.Full:
                pass
        for proc in self._procs:
            if proc.pid is None:  # never started: `start()` itself failed (a spawn error is raised as it was)
                continue
            proc.join(timeout=5.0)
            if proc.is_alive():
                proc.terminate()
        self._procs = []
        if self._spool is not None:
            self._spool.remove()
            self._spool = None

    def __enter__(self) -> ShardPool:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()


def concat_parts(parts: Iterable[SpanPart]) -> tuple[pa.Table | None, list[Problem]]:
    """The span tables of several parts as one table (for one transaction), with their problems."""
    tables, problems = [], []
    for part in parts:
        if part.table is not None:
            tables.append(part.table)
        problems.extend(part.problems)
    return (pa.concat_tables(tables) if tables else None), problems
