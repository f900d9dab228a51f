"""Giving a burst's memory back (`plumbline_otel/memory.py`): when it runs, and that it returns Arrow's freed pages."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pytest

from plumbline_otel import memory
from plumbline_otel.memory import IdleRelease, give_back


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_release_is_due_only_after_work_and_once_per_quiet_spell(monkeypatch: pytest.MonkeyPatch) -> None:
    # The module's clock, moved by the test: "not quiet long enough" cannot turn into "quiet" on a loaded machine
    # that pauses between two lines (a 0.2 s spell could), and the quiet spell needs no sleep.
    now = [1000.0]
    monkeypatch.setattr(memory, "time", SimpleNamespace(monotonic=lambda: now[0], perf_counter=time.perf_counter))
    idle = IdleRelease(idle_seconds=0.5)
    assert idle.due_in() is None and not idle.release_if_due()  # nothing done: nothing to give back
    idle.worked()
    now[0] += 0.25
    assert idle.due_in() == 0.25 and not idle.release_if_due()  # not quiet long enough
    now[0] += 0.25
    assert idle.due_in() == 0.0 and idle.release_if_due()
    assert idle.due_in() is None and not idle.release_if_due()  # once until the next work


def test_give_back_returns_what_arrows_pool_freed() -> None:
    pool = pa.default_memory_pool()
    before = _rss_mib()
    tables = [pa.table({"x": pa.array(range(i, i + 2_000_000), pa.int64())}) for i in range(8)]  # ~128 MB from the pool
    assert pool.bytes_allocated() >= 8 * 16_000_000
    grown = _rss_mib() - before
    del tables
    give_back()
    kept = _rss_mib() - before
    assert grown > 100 and kept < grown / 2, f"RSS grew {grown:.0f} MiB, {kept:.0f} MiB still held after give_back()"
