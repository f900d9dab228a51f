"""The lake's tables come from their declarations (plumbline_otel/shapes.py), and a table an older plumbline made gains
the columns declared since (Iceberg schema evolution), on the Postgres catalog the other lake tests use."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from core.test_sources import _runs

from plumbline_otel.lake import _TABLE_PROPERTIES, NAMESPACE, SCHEMAS, Lake, LakeReader, LakeSink, _evolved, _partition_spec
from plumbline_otel.shapes import LAKE_SHAPES, LakeShape
from plumbline_otel.spec.testing import span_records
from plumbline_otel.store import RunFilter, Store

# What an older plumbline declared for `runs`: two of today's columns had not been added yet.
LATER = ("conventions", "n_tool_calls")


def _store(path: Path) -> Path:
    with Store(path) as store:
        for t in _runs():
            store.write_spans(span_records(t))
        store.assemble()
    return path


def _old_runs_table(lake: Lake) -> tuple[LakeShape, dict[str, int]]:
    """A `runs` table as the older plumbline made it, holding one row of an instance that stopped since; its field ids."""
    old = LakeShape("runs", tuple(c for c in LAKE_SHAPES["runs"].columns if c.name not in LATER))
    lake.catalog.create_namespace(NAMESPACE)
    schema = old.iceberg()
    table = lake.catalog.create_table(f"{NAMESPACE}.runs", schema=schema, partition_spec=_partition_spec(schema),
                                      properties=_TABLE_PROPERTIES)
    row = {c.name: None for c in old.all_columns} | {"instance": "old", "trajectory_id": "old-run", "trace_id": "old-trace", "hour": 0}
    table.append(pa.Table.from_pylist([row], schema=old.arrow()))
    return old, {f.name: f.field_id for f in table.schema().fields}


def test_a_lake_table_made_by_an_older_version_gains_the_new_columns_and_keeps_its_rows(tmp_path: Path, postgres_db: str) -> None:
    uri = f"{postgres_db}?warehouse={tmp_path / 'warehouse'}"
    _, ids = _old_runs_table(Lake(uri))
    stale = Lake(uri).catalog.load_table(f"{NAMESPACE}.runs")  # another instance's copy, loaded before the table evolves

    lake = Lake(uri)
    with Store(_store(tmp_path / "i0.duckdb"), read_only=True) as store:
        result = LakeSink(lake, "i0").sync(store.connection)
        expected = [t.export() for t in store.trajectories()]
    assert result.rows["runs"] == 12

    table = Lake(uri).table("runs")
    fields = {f.name: f.field_id for f in table.schema().fields}
    assert list(fields) == [*ids, *LATER]  # added at the end, the old columns' ids kept
    assert {n: fields[n] for n in ids} == ids
    rows = Lake(uri).scan("runs")
    assert rows.schema == SCHEMAS["runs"]
    old = rows.filter(pc.equal(rows["instance"], "old")).to_pylist()
    assert [(r["trajectory_id"], r["conventions"], r["n_tool_calls"]) for r in old] == [("old-run", None, None)]
    assert [t.export() for t in LakeReader(Lake(uri)).trajectories()] == expected  # the old instance never synced: left out

    schema_id = table.schema().schema_id
    assert Lake(uri).table("runs").schema().schema_id == schema_id  # nothing more to add: no new schema
    # The other instance evolves its stale copy at once: its update is refused (the schema changed), and reloaded it finds
    # the columns there.
    assert [f.name for f in _evolved(stale, "runs").schema().fields] == [*ids, *LATER]
    assert Lake(uri).table("runs").schema().schema_id == schema_id


def test_the_lake_reader_takes_a_typed_run_filter(tmp_path: Path) -> None:
    uri = str(tmp_path / "lake")
    with Store(_store(tmp_path / "i0.duckdb"), read_only=True) as store:
        LakeSink(Lake(uri), "i0").sync(store.connection)
        runs = list(store.trajectories())
    one, two = runs[3], runs[7]
    reader = LakeReader(Lake(uri))
    assert [t.trajectory_id for t in reader.trajectories(runs=RunFilter(trace_id=one.trace_id))] == [one.trajectory_id]
    picked = RunFilter(run_ids=(two.trajectory_id, one.trajectory_id))
    assert [t.trajectory_id for t in reader.trajectories(runs=picked)] == [one.trajectory_id, two.trajectory_id]
    assert list(reader.trajectories(runs=RunFilter(study="no-such-study"))) == []
