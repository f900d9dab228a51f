"""What the writer keeps in memory about the stored spans, so a write never scans the spans table to ask."""

from __future__ import annotations

import numpy as np


class SpanKeys:
    """The 64-bit hashes of every stored (trace_id, span_id), so a retried span is recognised without an index.

    A primary-key index on two strings halves DuckDB's insert rate; this costs 8 bytes a stored
    span instead. The keys are DuckDB's own `hash(trace_id, span_id)`, read from the table when the
    first write comes (so they never go stale across versions), kept as a sorted array plus a set of
    recent keys. A hit is only a suspicion (two spans can share a hash): the writer confirms it
    against the rows before it skips anything.
    """

    def __init__(self, stored: np.ndarray) -> None:
        self.base = np.sort(stored)
        self.recent: set[int] = set()

    def suspects(self, keys: np.ndarray) -> bool:
        """True when some key was seen before, or occurs twice in `keys`."""
        if len(np.unique(keys)) < len(keys):
            return True
        if len(self.base):
            at = np.searchsorted(self.base, keys).clip(max=len(self.base) - 1)
            if bool((self.base[at] == keys).any()):
                return True
        return bool(self.recent) and not self.recent.isdisjoint(keys.tolist())

    def add(self, keys: np.ndarray) -> None:
        """Remember newly stored keys; the recent set is folded into the sorted array as it grows."""
        self.recent.update(keys.tolist())
        if len(self.recent) > max(1 << 18, len(self.base) // 4):
            self.base = np.union1d(self.base, np.fromiter(self.recent, np.uint64, len(self.recent)))
            self.recent = set()


class TraceCounts:
    """How many spans the store holds of each trace, by DuckDB's 64-bit `hash(trace_id)`.

    Storing a shard's trajectories asks "are these all of the trace's stored spans?" for every
    assembled batch; answered by a scan of the spans table, that grew with the store (~45 ms a batch
    at 3M spans, several a second in `plumbline serve`). Kept like `SpanKeys`: sorted arrays read
    from the table when the first write comes, plus the counts added since (16 bytes a trace). Two
    traces whose hashes collide share one count, larger than either trace's own, so neither ever
    matches a shard's count and both are rebuilt from their rows: a collision costs time, never a
    wrong trajectory.
    """

    def __init__(self, hashes: np.ndarray, counts: np.ndarray) -> None:
        order = np.argsort(hashes)
        self.hashes, self.counts = hashes[order], counts[order].astype(np.int64)
        self.recent: dict[int, int] = {}

    def get(self, keys: np.ndarray) -> list[int]:
        """The stored span count of each trace hash in `keys`."""
        if len(self.hashes):
            at = np.searchsorted(self.hashes, keys).clip(max=len(self.hashes) - 1)
            base = np.where(self.hashes[at] == keys, self.counts[at], 0).tolist()
        else:
            base = [0] * len(keys)
        return [n + self.recent.get(k, 0) for n, k in zip(base, keys.tolist())]

    def add(self, keys: np.ndarray) -> None:
        """Count newly stored spans (one trace hash each); the recent counts are folded into the arrays as they grow."""
        for key, n in zip(*(a.tolist() for a in np.unique(keys, return_counts=True))):
            self.recent[key] = self.recent.get(key, 0) + n
        if len(self.recent) > max(1 << 16, len(self.hashes) // 4):
            hashes = np.concatenate([self.hashes, np.fromiter(self.recent, np.uint64, len(self.recent))])
            counts = np.concatenate([self.counts, np.fromiter(self.recent.values(), np.int64, len(self.recent))])
            order = np.argsort(hashes, kind="stable")
            self.hashes, first = np.unique(hashes[order], return_index=True)
            self.counts = np.add.reduceat(counts[order], first)
            self.recent = {}
