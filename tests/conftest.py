"""Shared fixtures; `tests/` is on sys.path so tests can import the `otlp` helpers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from demo_support import DemoRun, run_demo

from plumbline_otel.store import Store


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """`plumbline demo`, run once for every test that looks at what it produced (it takes most of a minute)."""
    return run_demo(tmp_path_factory.mktemp("demo"))


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """A real DuckDB file in a temporary directory."""
    with Store(tmp_path / "plumbline.duckdb") as s:
        yield s
