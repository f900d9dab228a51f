"""Product code narrows the runs it reads with a typed `store.RunFilter` (values bound as parameters), not SQL fragments:
it picks what the fragments it replaced picked, a value is never read as SQL, and a run already read is tested the same way."""

from __future__ import annotations

from pathlib import Path

import pytest

from plumbline_otel.sources import Sources
from plumbline_otel.spec.testing import call, run
from plumbline_otel.store import RunFilter, Store

_STUDIES = ("ap-demo-1", "ap-demo-2", "other", "o'hara", None)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    runs = []
    for i, study in enumerate(_STUDIES * 2):
        context = {"plumbline__study": study} if study is not None else {}
        runs.append(run(call("lookup_invoice", {"id": i}), id=f"rf-{i:03d}", start_ns=1_000 + i, **context))
    with Store(tmp_path / "s.duckdb") as writer:
        writer.add_trajectories(runs)
    return Store(tmp_path / "s.duckdb", read_only=True)


def _ids(runs: object) -> list[str]:
    return [t.trajectory_id for t in runs]  # type: ignore[attr-defined]


@pytest.mark.parametrize(("typed", "fragment"), [
    (RunFilter(study_prefix="ap-demo-"), "json_extract_string(doc, '$.context.\"plumbline.study\"') LIKE 'ap-demo-%'"),
    (RunFilter(study="o'hara"), "json_extract_string(doc, '$.context.\"plumbline.study\"') = 'o''hara'"),
    (RunFilter(study="other"), "json_extract_string(doc, '$.context.\"plumbline.study\"') = 'other'"),
    (RunFilter(trace_id="rf-003".rjust(32, "0")), f"trace_id = '{'rf-003'.rjust(32, '0')}'"),
], ids=["demo", "quoted", "study", "trace"])
def test_a_run_filter_picks_what_the_sql_fragment_it_replaced_picked(store: Store, typed: RunFilter, fragment: str) -> None:
    with store:
        picked = _ids(store.trajectories(runs=typed))
        assert picked == _ids(store.trajectories(where=fragment))
        assert picked and picked == _ids(t for t in store.trajectories() if typed.matches(t))


def test_a_run_filter_binds_its_values_and_combines_its_fields(store: Store) -> None:
    with store:
        assert _ids(store.trajectories(runs=RunFilter(study="x' OR TRUE OR '"))) == []  # a value, never SQL
        both = RunFilter(study_prefix="ap-demo-", run_ids=("rf-001", "rf-005", "rf-002"))
        assert _ids(store.trajectories(runs=both)) == ["rf-001", "rf-005"]
        assert _ids(store.trajectories(runs=RunFilter(run_ids=()))) == []
        assert len(_ids(store.trajectories(runs=RunFilter()))) == 2 * len(_STUDIES)


def test_several_stores_take_the_run_filter(store: Store, tmp_path: Path) -> None:
    store.close()
    sources = Sources(dbs=[str(tmp_path / "s.duckdb")])
    assert _ids(sources.trajectories(runs=RunFilter(study="other"))) == ["rf-002", "rf-007"]
