"""One declaration per stored shape (plumbline_otel/shapes.py): the store's tables, the Arrow rows the workers build and
the lake's Arrow and Iceberg schemas are what the declarations say, for a new file and for one migrated from version 1."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from plumbline_otel import rows, shapes
from plumbline_otel.lake import SCHEMAS, SYNCS_SCHEMA
from plumbline_otel.store import Store
from plumbline_otel.store._schema import MIGRATIONS

_STORE_SHAPES = [v for v in vars(shapes).values() if isinstance(v, shapes.Shape)]
_TYPES = {"string": "VARCHAR", "json": "JSON", "int64": "BIGINT", "int32": "INTEGER", "float64": "DOUBLE", "bool": "BOOLEAN",
          "strings": "VARCHAR[]"}


def _tables(path: Path) -> dict[str, list[tuple[str, str, bool]]]:
    with duckdb.connect(str(path), read_only=True) as con:
        found = con.execute("SELECT table_name, column_name, data_type, is_nullable FROM duckdb_columns() WHERE NOT internal "
                            "ORDER BY table_name, column_index").fetchall()
    out: dict[str, list[tuple[str, str, bool]]] = {}
    for table, column, kind, nullable in found:
        out.setdefault(table, []).append((column, kind, nullable))
    return out


def _declared(shape: shapes.Shape) -> list[tuple[str, str, bool]]:
    keyed = set(shape.primary_key)
    return [(c.name, _TYPES[c.type], not (c.required or c.key or c.name in keyed)) for c in shape.columns]


def test_a_new_store_holds_exactly_the_declared_tables(tmp_path: Path) -> None:
    Store(tmp_path / "new.duckdb").close()
    assert _tables(tmp_path / "new.duckdb") == {s.name: _declared(s) for s in _STORE_SHAPES}


def test_a_version_1_store_migrates_to_the_declared_tables(tmp_path: Path) -> None:
    with duckdb.connect(str(tmp_path / "old.duckdb")) as con:
        for statement in MIGRATIONS[1]:
            con.execute(statement)
        con.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    Store(tmp_path / "old.duckdb").close()
    Store(tmp_path / "new.duckdb").close()
    assert _tables(tmp_path / "old.duckdb") == _tables(tmp_path / "new.duckdb")


def test_the_rows_the_workers_build_are_the_declared_columns() -> None:
    assert rows._SCHEMA.names == list(shapes.SPANS.names)
    assert rows._TRAJECTORY_SCHEMA.names == list(shapes.TRAJECTORIES.names)
    assert list(rows.SPAN_COLUMNS) == list(shapes.SPANS.names)
    assert {**rows.SPAN_COLUMNS_V1, **{c.name: c.duckdb_type for c in shapes.SPANS.added_in(3)}, **rows.SPAN_COLUMNS_V4,
            **rows.SPAN_COLUMNS_V8, **rows.SPAN_COLUMNS_V9} == rows.SPAN_COLUMNS


@pytest.mark.parametrize("name", list(shapes.LAKE_SHAPES))
def test_a_lake_table_s_arrow_and_iceberg_schemas_are_its_declaration(name: str) -> None:
    shape = shapes.LAKE_SHAPES[name]
    arrow = SYNCS_SCHEMA if name == "syncs" else SCHEMAS[name]
    assert arrow == shape.arrow()
    assert arrow.names == ["instance", *(c.name for c in shape.columns), "hour"]
    iceberg = shape.iceberg()
    assert [f.name for f in iceberg.fields] == arrow.names
    assert [f.field_id for f in iceberg.fields] == list(range(1, len(arrow.names) + 1))
    assert not any(f.required for f in iceberg.fields)


def test_the_shapes_module_is_core_and_imports_nothing_of_the_package() -> None:
    source = Path(shapes.__file__).read_text()
    assert "from plumbline_otel" not in source and "import plumbline_otel" not in source
