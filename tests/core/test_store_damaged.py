"""A damaged store file (issue 30 item 8) is a clear error, not a traceback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from plumbline_otel.errors import StoreError
from plumbline_otel.store import Store


def _cut(tmp_path: Path) -> Path:
    path = tmp_path / "cut.duckdb"
    with Store(path) as store:
        store.connection.execute("CHECKPOINT")
    os.truncate(path, os.path.getsize(path) // 2)
    return path


@pytest.mark.parametrize("read_only", [False, True])
def test_a_store_file_cut_to_half_is_a_store_error_naming_it(tmp_path: Path, read_only: bool) -> None:
    path = _cut(tmp_path)
    with pytest.raises(StoreError, match=r"cannot read .*cut\.duckdb.*damaged"):
        Store(path, read_only=read_only)
    with Store(tmp_path / "other.duckdb"):  # nothing of the failed open is left attached
        pass


def test_serve_on_a_cut_store_exits_with_the_message(tmp_path: Path) -> None:
    from plumbline_otel.cli.serve import serve

    path = _cut(tmp_path)
    result = CliRunner().invoke(serve, ["--db", str(path), "--grpc-port", "0", "--http-port", "0", "--workers", "0"])
    assert result.exit_code == 1 and "damaged" in result.output and "Traceback" not in result.output
