"""Shared fixtures; `tests/` is on sys.path so tests can import the `otlp` helpers."""

from __future__ import annotations

from pathlib import Path

import pytest

from plumbline_otel.store import Store


@pytest.fixture
def store(tmp_path: Path) -> Store:
    """A real DuckDB file in a temporary directory."""
    with Store(tmp_path / "plumbline.duckdb") as s:
        yield s
