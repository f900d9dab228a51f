"""What the lake tests build the same way: an instance's store filled with fresh runs (the commit tests sync them, round
after round), and two instances' lake holding a misrouted trace (a trace whose root is in one store, its other spans in
the other), which every reader must name and leave out."""

from __future__ import annotations

import shutil
from pathlib import Path

from plumbline_otel.lake import Lake, LakeSink
from plumbline_otel.model import SpanRecord
from plumbline_otel.spec.testing import call, run, span_records
from plumbline_otel.store import Store


def add_runs(store: Store, instance: str, first: int, count: int, start_ns: int) -> None:
    """Runs ``first`` to ``first + count - 1`` of ``instance`` (ids ``<instance>-run-NNNN``, three tasks), assembled in
    ``store``: what a sync of that instance commits next."""
    records = []
    for i in range(first, first + count):
        t = run(call("lookup_invoice", {"id": i}, {"ok": True}), call("pay", {"amount": i}), task=f"T{i % 3}",
                start_ns=start_ns + i * 1_000_000, id=f"{instance}-run-{i:04d}")
        records += span_records(t)
    store.write_spans(records)
    store.assemble()


def misrouted_lake(corpus: Path, tmp_path: Path) -> tuple[str, list[SpanRecord]]:
    """The corpus's first two shards, copied into ``tmp_path`` (``i0.duckdb``, ``i1.duckdb``), with every span but the
    root of one of i0's runs written into i1 too, each synced to a lake there as its instance: (the lake's URI, that
    run's span records, its root first)."""
    lake = str(tmp_path / "lake")
    for shard in (0, 1):
        shutil.copy(corpus / f"i{shard}.duckdb", tmp_path / f"i{shard}.duckdb")
    with Store(tmp_path / "i0.duckdb") as store:
        stray = span_records(next(t for t in store.trajectories() if t.steps))
    with Store(tmp_path / "i1.duckdb") as store:
        store.write_spans(stray[1:])
        store.assemble()
    for shard in (0, 1):
        with Store(tmp_path / f"i{shard}.duckdb", read_only=True) as store:
            LakeSink(Lake(lake), f"i{shard}").sync(store.connection)
    return lake, stray
