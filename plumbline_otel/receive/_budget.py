"""The one memory budget for request bytes in flight, and the deadlines that keep slow peers from holding it.

`MemoryBudget` counts every byte a request holds on either transport: an HTTP body as it is read
(a declared length up front, each chunk before it is read), a gRPC message before grpcio is asked
to read it (the largest allowed size, cut to the real size once it arrived), a body being inflated
(each piece before it is kept), a request being decoded (a multiple of its size), and a request
queued until its commit. Past the limit a request is pushed back (HTTP 503 + Retry-After, gRPC
RESOURCE_EXHAUSTED + RetryInfo) instead of growing memory. One request alone may hold more than the
limit (nothing else is in flight then), so the bound is max(limit, one request's charge).

A request that finds no room first asks the budget's reclaimers (the HTTP server's: it cuts body
reads that have stopped making progress, `_http.py`) to free what it needs, and waits up to
`RECLAIM_WAIT` for what they free: a peer holding its reservation without sending cannot keep
others out.

`Deadlines` is one thread that runs an action (close a socket, cancel a call) for each armed key
whose absolute deadline passed: a peer that trickles a byte at a time cannot extend it.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Hashable

log = logging.getLogger("plumbline.receive")

RECLAIM_WAIT = 1.0  # longest a request waits for the bytes reclaimers said they freed
Reclaimer = Callable[[int], int]  # asked to free `needed` bytes; returns the bytes it will give back


class MemoryBudget:
    """Bytes in flight across all connections and both transports; thread-safe."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._used = 0
        self.peak = 0
        self.refused = 0
        self.reclaimed = 0  # bytes freed by reclaimers for requests that found no room
        self._changed = threading.Condition()
        self._reclaimers: list[Reclaimer] = []

    def add_reclaimer(self, reclaim: Reclaimer) -> None:
        with self._changed:
            self._reclaimers.append(reclaim)

    def remove_reclaimer(self, reclaim: Reclaimer) -> None:
        with self._changed:
            if reclaim in self._reclaimers:
                self._reclaimers.remove(reclaim)

    @property
    def used(self) -> int:
        return self._used

    def take(self, nbytes: int, held: int = 0, timeout: float = 0.0) -> bool:
        """Reserve `nbytes` more for a request already holding `held`; False (nothing taken) when they do not fit.

        They fit under the limit, or when that request would be alone (it holds all that is in
        flight), so one request larger than the limit still gets through by itself. Without room,
        the reclaimers are asked for it first (and what they free is waited for, up to
        `RECLAIM_WAIT`); with a `timeout`, wait that long for room before giving up.
        """
        if nbytes <= 0:
            return True
        with self._changed:
            if self._used + nbytes <= self.limit or self._used <= held:
                self._used += nbytes
                self.peak = max(self.peak, self._used)
                return True
            needed, reclaimers = self._used + nbytes - self.limit, list(self._reclaimers)
        freed = 0
        for reclaim in reclaimers:  # outside the lock: they close sockets, whose threads give bytes back
            if freed >= needed:
                break
            freed += reclaim(needed - freed)
        if freed:
            self.reclaimed += freed
            timeout = max(timeout, RECLAIM_WAIT)
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._used + nbytes > self.limit and self._used > held:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self.refused += 1
                    return False
                self._changed.wait(remaining)
            self._used += nbytes
            self.peak = max(self.peak, self._used)
            return True

    def give(self, nbytes: int) -> None:
        """Return bytes taken earlier."""
        if nbytes <= 0:
            return
        with self._changed:
            self._used -= nbytes
            assert self._used >= 0, "more bytes given back than taken"
            self._changed.notify_all()


class Deadlines:
    """One daemon thread running `action()` for every armed key whose deadline passed (unless disarmed first)."""

    def __init__(self, name: str = "plumbline-deadlines") -> None:
        self._lock = threading.Condition()
        self._heap: list[tuple[float, int, Hashable]] = []
        self._armed: dict[Hashable, tuple[int, Callable[[], None]]] = {}
        self._seq = itertools.count()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def arm(self, key: Hashable, seconds: float, action: Callable[[], None]) -> None:
        """Run `action` in `seconds` unless `key` is disarmed or armed again before then."""
        seq = next(self._seq)
        with self._lock:
            self._armed[key] = (seq, action)
            heapq.heappush(self._heap, (time.monotonic() + seconds, seq, key))
            if self._heap[0][1] == seq:
                self._lock.notify()

    def disarm(self, key: Hashable) -> None:
        with self._lock:
            self._armed.pop(key, None)

    def __len__(self) -> int:
        return len(self._armed)

    def _run(self) -> None:
        while True:
            due: list[Callable[[], None]] = []
            with self._lock:
                while not due:
                    now = time.monotonic()
                    while self._heap and self._heap[0][0] <= now:
                        _, seq, key = heapq.heappop(self._heap)
                        armed = self._armed.get(key)
                        if armed is not None and armed[0] == seq:
                            del self._armed[key]
                            due.append(armed[1])
                    if due:
                        break
                    # Entries of disarmed keys stay in the heap until their time; drop them when most are stale.
                    if len(self._heap) > 64 and len(self._heap) > 4 * len(self._armed):
                        live = {seq for seq, _ in self._armed.values()}
                        self._heap = [entry for entry in self._heap if entry[1] in live]
                        heapq.heapify(self._heap)
                    self._lock.wait(self._heap[0][0] - now if self._heap else None)
            for action in due:
                try:
                    action()
                except Exception:
                    log.debug("a deadline's action failed", exc_info=True)


__all__ = ["RECLAIM_WAIT", "Deadlines", "MemoryBudget", "Reclaimer"]
