"""The one memory budget for request bytes in flight, and the deadlines that keep slow peers from holding it.

`MemoryBudget` counts every byte a request holds on either transport, and only bytes it holds: an
HTTP body as it arrives (each piece of at most 256 KiB, or each chunk, just before it is read), a
gRPC message once grpcio handed it over whole, a body being inflated (each piece before it is kept), a request being decoded (a multiple of its size), and a request
queued until its commit. Past the limit a request is pushed back (HTTP 503 + Retry-After, gRPC
RESOURCE_EXHAUSTED + RetryInfo) instead of growing memory. One request alone may hold more than the
limit (nothing else is in flight then), so the bound is max(limit, one request's charge). A
caller that declares a large body, or opens a gRPC call, and then sends nothing holds at most one
piece (HTTP) or nothing (gRPC): it used to hold the most it might send, and four idle gRPC calls
took the whole 256 MiB from every exporter (issue 43).

Bytes a transport reserves while it reads a request are also counted against the client's address
(`owner`), which may hold at most `owner_limit` of them: one address holding bodies short of
complete cannot take the budget from the others. Once read, the bytes are the request's alone
(`disown`): decoding and queueing take bounded time, so only reading is capped per address. An
address holding nothing may still read one request larger than its share.

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
Reclaimer = Callable[[int, Hashable | None], int]  # asked to free `needed` bytes (of one owner's); returns the bytes it will give back


class MemoryBudget:
    """Bytes in flight across all connections and both transports; thread-safe."""

    def __init__(self, limit: int, owner_limit: int | None = None) -> None:
        self.limit = limit
        self.owner_limit = owner_limit or limit  # bytes one client address may hold while its requests are read
        self._used = 0
        self._owned: dict[Hashable, int] = {}
        self.refused_owner = 0  # requests refused for their address's share
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

    def owned(self, owner: Hashable) -> int:
        return self._owned.get(owner, 0)

    def _owner_fits(self, nbytes: int, held: int, owner: Hashable | None) -> bool:
        if owner is None:
            return True
        owned = self._owned.get(owner, 0)
        return owned + nbytes <= self.owner_limit or owned <= held

    def _add(self, nbytes: int, owner: Hashable | None) -> None:
        self._used += nbytes
        self.peak = max(self.peak, self._used)
        if owner is not None:
            self._owned[owner] = self._owned.get(owner, 0) + nbytes

    def take(self, nbytes: int, held: int = 0, timeout: float = 0.0, owner: Hashable | None = None) -> bool:
        """Reserve `nbytes` more for a request already holding `held`; False (nothing taken) when they do not fit.

        They fit under the limit, or when that request would be alone (it holds all that is in
        flight), so one request larger than the limit still gets through by itself; with an
        `owner` (the client's address, while the request is read), also under `owner_limit` for
        that owner, or when the request holds all the owner's bytes. Without room, the reclaimers
        are asked for it first, past the owner's share for that owner's reads only (and what they
        free is waited for, up to `RECLAIM_WAIT`); with a `timeout`, wait that long for room before
        giving up.
        """
        if nbytes <= 0:
            return True
        with self._changed:
            owner_fits, fits = self._owner_fits(nbytes, held, owner), self._fits(nbytes, held)
            if owner_fits and fits:
                self._add(nbytes, owner)
                return True
            owner_needs = 0 if owner_fits else self._owned.get(owner, 0) + nbytes - self.owner_limit
            needs = 0 if fits else self._used + nbytes - self.limit
            reclaimers = list(self._reclaimers)
        freed = 0
        for reclaim in reclaimers:  # outside the lock: they close sockets, whose threads give bytes back
            if owner_needs > 0:  # the owner's own stalled reads first: its share is what binds
                got = reclaim(owner_needs, owner)
                owner_needs, needs, freed = owner_needs - got, needs - got, freed + got
            if needs > 0 and owner_needs <= 0:
                got = reclaim(needs, None)
                needs, freed = needs - got, freed + got
        if freed:
            self.reclaimed += freed
            timeout = max(timeout, RECLAIM_WAIT)
        deadline = time.monotonic() + timeout
        with self._changed:
            while not (self._fits(nbytes, held) and self._owner_fits(nbytes, held, owner)):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self.refused += 1
                    self.refused_owner += not self._owner_fits(nbytes, held, owner)
                    return False
                self._changed.wait(remaining)
            self._add(nbytes, owner)
            return True

    def _fits(self, nbytes: int, held: int) -> bool:
        return self._used + nbytes <= self.limit or self._used <= held

    def give(self, nbytes: int, owner: Hashable | None = None) -> None:
        """Return bytes taken earlier (for `owner`, if they were taken for it and not disowned since)."""
        if nbytes <= 0:
            return
        with self._changed:
            self._used -= nbytes
            assert self._used >= 0, "more bytes given back than taken"
            if owner is not None:
                self._disown(nbytes, owner)
            self._changed.notify_all()

    def disown(self, nbytes: int, owner: Hashable) -> None:
        """`owner`'s request was read: its `nbytes` stay in the budget, no longer in the owner's share."""
        if nbytes <= 0:
            return
        with self._changed:
            self._disown(nbytes, owner)
            self._changed.notify_all()

    def _disown(self, nbytes: int, owner: Hashable) -> None:
        left = self._owned.get(owner, 0) - nbytes
        assert left >= 0, "more bytes disowned than the owner took"
        if left:
            self._owned[owner] = left
        else:
            self._owned.pop(owner, None)


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
