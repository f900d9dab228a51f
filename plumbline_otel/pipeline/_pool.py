"""The shard pool: shard worker processes (or one shard in-process) behind `submit`, `tick`, `flush` and `next_part`."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from plumbline_otel.decode import Decoded, Unit
from plumbline_otel.memory import IdleRelease
from plumbline_otel.pipeline._parts import Flushed, Part, SpanPart
from plumbline_otel.pipeline._shard import Shard, ShardSettings
from plumbline_otel.pipeline._spool import Spool

_IN_FLIGHT_PER_WORKER = 8  # units queued for one worker before `submit` waits: bounds memory
_WORKER_START_TIMEOUT = 60.0
_PARENT_CHECK_SECONDS = 0.5  # how often a worker's watchdog thread checks that its writer is still alive
_PR_SET_PDEATHSIG = 1  # prctl(2): the signal the kernel sends this process when its parent dies
_PARENT_GONE_RT = 4  # that signal: SIGRTMIN + this, which nothing else sends


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


def _leave(spool: Spool) -> None:
    """End this worker at once: its writer is gone, so nobody will read its parts or its spool."""
    spool.remove()
    os._exit(1)  # not sys.exit: the queues' feeder threads would wait forever to flush into pipes nobody reads


def _die_with_parent(parent: int, spool: Spool, kernel: bool) -> None:
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


def _worker(index: int, settings: ShardSettings, inbox: Any, outbox: Any, spool: Spool, parent: int = 0,
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
    idle = IdleRelease()  # a burst's memory goes back once the worker is quiet (`memory.py`)
    while True:
        try:
            message = inbox.get(timeout=_COLLECT_SECONDS)
        except queue.Empty:
            idle.release_if_due()
            continue
        if message is None:
            return
        kind, payload = message  # both rebound by the next message (the writer's ticks come every half interval)
        if time.monotonic() - collected >= _COLLECT_SECONDS:
            gc.collect()
            collected = time.monotonic()
        try:
            if kind == "unit":
                parts = shard.prepare(*payload)  # no local keeps the unit's bytes while the worker waits
                idle.worked()
            else:  # "assemble": quiet seconds, or None for everything
                parts = shard.assemble_quiet(payload)
                if parts:
                    idle.worked()
                else:
                    idle.release_if_due()
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
        self._spool: Spool | None = None
        if workers == 0:
            self._local: Shard | None = Shard(0, replace(settings, shards=1))
            return
        self._local = None
        context = multiprocessing.get_context("spawn")  # no fork: the receiver runs threads
        self._outbox = context.Queue()
        self._inboxes = [context.Queue(maxsize=_IN_FLIGHT_PER_WORKER) for _ in range(workers)]
        self._spool = Spool.create()
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

    def submit(self, work: Unit | Decoded) -> int:
        """Send one unit to every shard; returns its sequence number (its parts carry it).

        A request a receiver decoded (`Decoded`) is prepared as it is in-process, never parsed again;
        worker processes get its protobuf bytes.
        """
        self._seq += 1
        if self._local is not None:
            self._ready.extend(self._local.prepare(self._seq, work))
        else:
            unit = work if isinstance(work, Unit) else Unit("protobuf", work.protobuf(), work.where)
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
                return Spool.land(self._outbox.get(timeout=wait) if wait > 0 else self._outbox.get_nowait())
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
