"""The seed's parity and retry studies imported once per session into real DuckDB files."""

from __future__ import annotations

import pytest
from seed_runs import SEED_RUNS, Imported

from plumbline_otel.importers import import_run_dir
from plumbline_otel.store import Store


def _import(tmp_path_factory: pytest.TempPathFactory, study: str) -> Imported:
    db = tmp_path_factory.mktemp(study) / "seed.duckdb"
    with Store(db) as store:
        result = import_run_dir(store, SEED_RUNS / study)
    return Imported(db, result)


@pytest.fixture(scope="session")
def parity(tmp_path_factory: pytest.TempPathFactory) -> Imported:
    return _import(tmp_path_factory, "parity-study")


@pytest.fixture(scope="session")
def retry(tmp_path_factory: pytest.TempPathFactory) -> Imported:
    return _import(tmp_path_factory, "retry-study")
