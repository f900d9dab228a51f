"""Giving a burst's memory back to the system once a process goes quiet.

After one large request (200,000 spans, 86 MB of protobuf) the serve tree stayed ~1.3 GiB above its
idle size for good, none of it live: the allocators kept what the burst had freed, for reuse.
- Arrow's default pool (mimalloc) kept ~210 MiB in each shard worker: it returns freed pages only
  when asked (`release_unused`).
- glibc's malloc keeps freed chunks below the top of each arena's heap (protobuf's arenas, the
  body's pieces, Python objects past pymalloc's sizes); `malloc_trim(0)` hands their pages back.
- DuckDB's own allocator (jemalloc) kept ~200 MiB in the writer: it purges only from background
  threads, which `plumbline serve` turns on for its store (DuckDB's `allocator_background_threads`).

`give_back()` does the first two; the shard workers and the writer call it once they have been
idle for `IDLE_SECONDS` after work, so a steady load never pays for it and a burst's memory goes
back a few seconds after its last commit.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import time
from collections.abc import Callable

import pyarrow as pa

log = logging.getLogger("plumbline.memory")

IDLE_SECONDS = 2.0  # quiet this long after work before a process gives memory back


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None where the C library has none (musl, macOS)."""
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


_TRIM = _malloc_trim()


def give_back() -> None:
    """Return the pages Arrow's pool and glibc's malloc hold free; costs milliseconds, so only when idle."""
    started = time.perf_counter()
    pa.default_memory_pool().release_unused()
    if _TRIM is not None:
        _TRIM(0)
    log.debug("gave freed memory back in %.1f ms", 1000 * (time.perf_counter() - started))


class IdleRelease:
    """When a process that did work has been idle `IDLE_SECONDS`: `due` says so, `done` notes it was given back."""

    def __init__(self, idle_seconds: float = IDLE_SECONDS) -> None:
        self.idle_seconds = idle_seconds
        self._worked_at: float | None = None

    def worked(self) -> None:
        self._worked_at = time.monotonic()

    def due_in(self) -> float | None:
        """Seconds until memory should be given back (0: now); None when nothing was done since the last time."""
        if self._worked_at is None:
            return None
        return max(0.0, self._worked_at + self.idle_seconds - time.monotonic())

    def release_if_due(self) -> bool:
        """`give_back()` if due now; whether it ran."""
        if self.due_in() != 0.0:
            return False
        self._worked_at = None
        give_back()
        return True


__all__ = ["IDLE_SECONDS", "IdleRelease", "give_back"]
