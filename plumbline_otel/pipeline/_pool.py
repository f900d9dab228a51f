"""The shard pool: shard worker processes (or one shard in-process) behind `submit`, `tick`, `flush` and `next_part`."""

from __future__ import annotations

import gc
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Iterator
from dataclasses import replace
from multiprocessing.connection import Connection, wait
from typing import Any

from plumbline_otel.decode import Decoded, Unit
from plumbline_otel.memory import IdleRelease
from plumbline_otel.pipeline._parts import Flushed, Part, SpanPart
from plumbline_otel.pipeline._shard import Shard, ShardSettings
from plumbline_otel.pipeline._spool import Spool

_IN_FLIGHT_PER_WORKER = 8  # messages queued for one worker before `submit` waits: bounds memory
_WORKER_START_TIMEOUT = 60.0
# Where the first worker forks the others from itself once it has imported what a shard needs (`_first_worker`).
_FORK_SHARED = sys.platform.startswith("linux")

# What a worker process runs. It imports only what a shard needs: not numpy (pyarrow loads it when it can,
# and a shard never uses it: 6 MiB of heap and ~10 MiB of library pages in every worker), not the
# writer's `__main__` (multiprocessing's spawn ran it again in each worker: `python -m
# plumbline_otel.cli.serve` cost every worker the gRPC server, DuckDB and the rest, 143 MiB).
_BOOT = """import json, sys
sys.path[:] = json.loads(sys.argv[1])
sys.modules["numpy"] = None
from plumbline_otel.pipeline._pool import _first_worker
_first_worker(int(sys.argv[2]))
"""


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
    os._exit(1)


def _first_worker(setup_fd: int) -> None:
    """A launched worker process: reads its set-up, forks the pool's other workers it was given, then is shard `first`.

    Forked once it has imported everything a shard needs, the others share its pages instead of each
    importing its own: the kernel copies no page table of a library's code, so a forked worker's
    resident set holds only the library pages it touches (~8 MiB against ~40-65 MiB imported, most of
    them pyarrow's), and its ~25 MiB of imported heap is one copy in memory (counted in each
    process's RSS all the same). It is single-threaded when it forks: no thread has started yet.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the writer's to handle: it stops the pool
    with Connection(setup_fd, writable=False) as setup:
        settings, spool_path, ends = setup.recv()
    spool = Spool(spool_path)
    gc.freeze()  # the imported modules, out of the collector's sight (and a forked worker's pages unwritten)
    forked = []
    for index, inbox, outbox in ends[1:]:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                _close_ends(ends, index)
                _worker(index, settings, inbox, outbox, spool)
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)  # never back into the first worker's code
        forked.append(pid)
    index, inbox, outbox = ends[0]
    _close_ends(ends, index)
    try:
        _worker(index, settings, inbox, outbox, spool)
    finally:
        for pid in forked:
            os.waitpid(pid, 0)


def _close_ends(ends: list[tuple[int, int, int]], keep: int) -> None:
    """Close the pipe ends of every worker but `keep`: a writer sees a worker gone by the end of its outbox, which
    needs every process that could write to it gone."""
    for index, inbox, outbox in ends:
        if index != keep:
            os.close(inbox)
            os.close(outbox)


def _worker(index: int, settings: ShardSettings, inbox_fd: int, outbox_fd: int, spool: Spool) -> None:
    """A worker: one shard, messages in order, parts out in order.

    It leaves when told (None), or when its writer is gone: only the writer holds the other end of
    its pipes, so a writer killed with SIGKILL ends the worker's read (even one halfway through a
    message) or its write, and the worker removes the spool nobody will read.
    """
    inbox, outbox = Connection(inbox_fd, writable=False), Connection(outbox_fd, readable=False)
    gc.disable()
    shard = Shard(index, settings)
    collected = time.monotonic()
    idle = IdleRelease()  # a burst's memory goes back once the worker is quiet (`memory.py`)
    try:
        outbox.send(("ready", os.getpid()))
        while True:
            if not inbox.poll(_COLLECT_SECONDS):
                idle.release_if_due()
                continue
            message = inbox.recv()
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
                outbox.send(spool.ship(part, index))
    except (EOFError, OSError):  # the writer is gone: the end of the inbox, or a broken outbox
        _leave(spool)


class _Inbox:
    """A worker's inbox: messages wait here and a thread of their own sends them down the worker's pipe.

    `put` waits only while `_IN_FLIGHT_PER_WORKER` messages wait, never for the worker to read: the
    pipe holds 64 KiB and a unit is hundreds, so a send blocks until the worker takes it.
    """

    def __init__(self, index: int, fd: int) -> None:
        self.connection = Connection(fd, readable=False)
        self.broken = False  # the worker stopped reading (it exited)
        self._waiting: queue.Queue[Any] = queue.Queue(_IN_FLIGHT_PER_WORKER)
        self._thread = threading.Thread(target=self._send, name=f"plumbline-shard-{index}-send", daemon=True)
        self._thread.start()

    def put(self, message: Any, timeout: float) -> None:
        """Queue `message` (None: the worker's last), waiting up to `timeout` seconds for room (`queue.Full`)."""
        self._waiting.put(message, timeout=timeout)

    def _send(self) -> None:
        with self.connection:  # closed by this thread, which may be in the middle of a send when the pool closes
            while True:
                message = self._waiting.get()
                try:
                    self.connection.send(message)
                except OSError:
                    self.broken = True
                    return
                if message is None:
                    return

    def close(self) -> None:
        """Send the worker its last message, unless it is gone or its inbox stays full (its pipe is then closed when the
        worker exits)."""
        if not self.broken:
            try:
                self.put(None, timeout=1.0)
            except queue.Full:
                return
            self._thread.join(timeout=1.0)


class ShardPool:
    """Shards behind one interface: `submit` units, `tick`/`flush` for assembly, `parts` to collect.

    With `workers` = 0 one in-process shard does the work as it is submitted. Otherwise each
    worker process owns one shard; every unit goes to every worker, parts come back on each
    worker's pipe in the order it produced them, which is what lets the writer commit a shard's
    spans before the trajectories assembled from them.

    Workers are not started with multiprocessing: its spawn ran the writer's `__main__` again in every
    worker and added a resource-tracker process (13 MiB), and each spawned worker imported its own
    pyarrow. One process is launched (`_BOOT`), and on Linux it forks the others once it has
    imported (`_first_worker`); elsewhere each worker is launched the same way.
    """

    def __init__(self, settings: ShardSettings | None = None, workers: int = 0, collector: bool = False) -> None:
        """`collector`: another thread reads the parts (`next_part`), so `submit` only waits when inboxes are full."""
        settings = settings or ShardSettings()
        self.workers, self.collector = workers, collector
        self._ready: deque[Part] = deque()
        self._seq = 0
        self._inboxes: list[_Inbox] = []
        self._outboxes: list[Connection] = []
        self._procs: list[subprocess.Popen[bytes]] = []
        self._pids: list[int] = []
        self._turn = 0  # the outbox read first when several have parts: each in turn
        self._spool: Spool | None = None
        if workers == 0:
            self._local: Shard | None = Shard(0, replace(settings, shards=1))
            return
        self._local = None
        self._spool = Spool.create()
        shard_settings = replace(settings, shards=workers)
        try:
            ends = []
            for index in range(workers):
                inbox_r, inbox_w = os.pipe()
                outbox_r, outbox_w = os.pipe()
                self._inboxes.append(_Inbox(index, inbox_w))
                self._outboxes.append(Connection(outbox_r, writable=False))
                ends.append((index, inbox_r, outbox_w))
            groups = [ends] if _FORK_SHARED else [[end] for end in ends]
            for group in groups:
                self._launch(group, shard_settings)
            self._pids = [0] * workers
            for _ in range(workers):
                received = self._receive(_WORKER_START_TIMEOUT)
                if received is None:
                    raise RuntimeError("shard workers did not start")
                index, (_, pid) = received
                self._pids[index] = pid
        except BaseException:  # one that did start is not left waiting for units that will never come
            self.close()
            raise

    def _launch(self, ends: list[tuple[int, int, int]], settings: ShardSettings) -> None:
        """Start one worker process for `ends` (each a worker's index and its pipes' ends): it forks the rest of them."""
        assert self._spool is not None
        setup_r, setup_w = os.pipe()
        fds = [setup_r, *(fd for _, inbox, outbox in ends for fd in (inbox, outbox))]
        try:
            proc = subprocess.Popen([sys.executable, "-c", _BOOT, json.dumps(sys.path), str(setup_r)], pass_fds=fds,
                                    stdin=subprocess.DEVNULL)
        finally:
            for fd in fds:
                os.close(fd)  # the worker's now: the writer keeps only its own ends
        self._procs.append(proc)
        with Connection(setup_w, readable=False) as setup:
            setup.send((settings, self._spool.path, ends))

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
        received = self._receive(timeout)
        if received is None:
            return None
        part: Part = Spool.land(received[1])
        return part

    @property
    def pids(self) -> list[int]:
        """The worker processes' ids (none in-process)."""
        return list(self._pids)

    @property
    def shards(self) -> int:
        """How many parts each unit comes back as."""
        return max(1, self.workers)

    def parts(self) -> Iterator[Part]:
        """The parts ready now, without waiting."""
        while (part := self.next_part()) is not None:
            yield part

    def _put(self, inbox: _Inbox, message: Any) -> None:
        while True:  # while a worker's inbox is full, collect what the workers made so they can go on
            try:
                inbox.put(message, timeout=0.05)
                return
            except queue.Full:
                self._check_alive()
                if not self.collector and (part := self.next_part(0.0)) is not None:
                    self._ready.append(part)

    def _receive(self, timeout: float | None) -> tuple[int, Any] | None:
        """The next message from any worker, with the worker's index, each worker's in order; None if none came in time."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait_s = 0.5 if deadline is None else max(0.0, min(0.5, deadline - time.monotonic()))
            ready = wait(self._outboxes, wait_s)
            if ready:
                count = len(self._outboxes)
                index = min((i for i, c in enumerate(self._outboxes) if c in ready), key=lambda i: (i - self._turn) % count)
                self._turn = (index + 1) % count
                try:
                    return index, self._outboxes[index].recv()
                except (EOFError, OSError):
                    raise RuntimeError(f"shard worker plumbline-shard-{index} exited") from None
            self._check_alive()
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def _check_alive(self) -> None:
        dead = [f"plumbline-shard-{i}" for i, inbox in enumerate(self._inboxes) if inbox.broken]
        dead += [f"process {p.pid}" for p in self._procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"shard worker(s) {', '.join(dead)} exited")

    def close(self) -> None:
        """Stop the workers (they hold nothing that is not also in the store or still to be flushed)."""
        for inbox in self._inboxes:
            inbox.close()
        for proc in self._procs:  # each waits for the workers it forked
            try:
                proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                proc.terminate()
                proc.wait()
        for outbox in self._outboxes:  # a forked worker still running sees its writer gone, and leaves
            outbox.close()
        self._inboxes, self._outboxes, self._procs = [], [], []
        if self._spool is not None:
            self._spool.remove()
            self._spool = None

    def __enter__(self) -> ShardPool:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()
