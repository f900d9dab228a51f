"""Several store files read as one (plumbline_otel.sources), in-process: the rules the sharded
end-to-end test (tests/receive/test_receive_sharded.py) relies on, each alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from plumbline_otel.coverage import coverage_report
from plumbline_otel.errors import ConfigError
from plumbline_otel.sources import Misrouted, Sources, expand_dbs, find_misrouted, sum_counts
from plumbline_otel.spec.testing import call, run, span_records
from plumbline_otel.store import Store


def _runs():
    """Two services, tasks repeated across them, one unrecognised key on some spans."""
    out = []
    for i in range(12):
        t = run(call("lookup_invoice", {"id": i}), call("schedule_payment", None), task=f"T{i % 4}",
                service="alpha" if i % 3 else "beta", start_ns=1_700_000_000_000_000_000 + i * 1000, id=f"run-{i:03d}")
        out.append(t)
    return out


def _write(path: Path, runs) -> None:
    with Store(path) as store:
        for t in runs:
            records = span_records(t)
            records[1].unknown_keys = [f"vendor.key.{t.task_key}"]
            store.write_spans(records)
        store.assemble()


def test_coverage_of_files_split_by_trace_equals_one_file_holding_all(tmp_path: Path) -> None:
    runs = _runs()
    _write(tmp_path / "all.duckdb", runs)
    # each shard holds one service only, and every task is split across the shards
    _write(tmp_path / "s-1.duckdb", [t for t in runs if t.service == "alpha"])
    _write(tmp_path / "s-2.duckdb", [t for t in runs if t.service == "beta"])
    with Store(tmp_path / "all.duckdb", read_only=True) as store:
        one = coverage_report(store)
    many = Sources([str(tmp_path / "s-*.duckdb")]).coverage()
    assert many.pop("stores") == [str(tmp_path / "s-1.duckdb"), str(tmp_path / "s-2.duckdb")]
    assert many.pop("misrouted_traces") == []
    assert many == one
    assert set(one["services"]) == {"alpha", "beta"}  # per-service sections though each shard has one
    assert one["overall"]["trajectories"]["tasks"] == 4  # not 4 + 3: a task counts once across shards
    trajectories = [t.trajectory_id for t in Sources([str(tmp_path / "s-1.duckdb"), str(tmp_path / "s-2.duckdb")]).trajectories()]
    with Store(tmp_path / "all.duckdb", read_only=True) as store:
        assert trajectories == [t.trajectory_id for t in store.trajectories()]


def test_a_trace_in_two_files_is_named_and_left_out(tmp_path: Path) -> None:
    runs = _runs()
    _write(tmp_path / "a.duckdb", runs[:6])
    _write(tmp_path / "b.duckdb", runs[6:])
    stray = span_records(runs[0])
    with Store(tmp_path / "b.duckdb") as store:  # half of run 0's spans also reached b
        store.write_spans(stray[1:])
        store.assemble()
    stores = Sources([str(tmp_path / "a.duckdb"), str(tmp_path / "b.duckdb")])
    assert stores.misrouted == [Misrouted(stray[0].trace_id, (str(tmp_path / "a.duckdb"), str(tmp_path / "b.duckdb")))]
    assert [t.trace_id for t in stores.trajectories()] == [span_records(t)[0].trace_id for t in runs[1:]]
    assert stray[0].trace_id in (stores.notice() or "")
    _write(tmp_path / "routed.duckdb", runs[1:])  # coverage leaves both pieces out too
    with Store(tmp_path / "routed.duckdb", read_only=True) as store:
        routed = coverage_report(store)
    coverage = stores.coverage()
    assert coverage.pop("misrouted_traces") == [{"trace_id": stray[0].trace_id, "stores": list(stores.names)}]
    coverage.pop("stores")
    assert coverage == routed


def test_counts_add_and_shapes_must_agree() -> None:
    a = {"version": 1, "form": "counts", "x": {"n": 2, "keys": {"k": 1}}, "label": "same"}
    b = {"version": 1, "form": "counts", "x": {"n": 3, "keys": {"k": 2, "j": 1}}, "label": "same"}
    assert sum_counts([a, b]) == {"version": 1, "form": "counts", "x": {"n": 5, "keys": {"k": 3, "j": 1}}, "label": "same"}
    with pytest.raises(ConfigError, match="disagree on 'version'"):
        sum_counts([a, {**b, "version": 2}])


def test_find_misrouted_names_every_store_holding_the_trace() -> None:
    found = find_misrouted({"a": ["t1", "t2"], "b": ["t3", "t2"], "c": ["t2", "t4"]})
    assert found == [Misrouted("t2", ("a", "b", "c"))]


def test_a_glob_matching_nothing_or_a_missing_file_among_several_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no file matches"):
        expand_dbs([str(tmp_path / "none-*.duckdb")])
    _write(tmp_path / "a.duckdb", _runs()[:1])
    assert expand_dbs([str(tmp_path / "a.duckdb"), str(tmp_path / "*.duckdb")]) == (str(tmp_path / "a.duckdb"),)
    with pytest.raises(ConfigError, match="no such store file"):
        Sources([str(tmp_path / "a.duckdb"), str(tmp_path / "typo.duckdb")])


def test_report_and_show_read_several_files_as_one(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from plumbline_otel.cli.main import cli

    runs = _runs()
    _write(tmp_path / "s-1.duckdb", runs[::2])
    _write(tmp_path / "s-2.duckdb", runs[1::2])
    stores = ["--db", str(tmp_path / "s-1.duckdb"), "--db", str(tmp_path / "s-2.duckdb")]
    shown = CliRunner().invoke(cli, ["show", span_records(runs[1])[0].trace_id, *stores])
    assert shown.exit_code == 0, shown.output
    assert "schedule_payment" in shown.output
    out = tmp_path / "r.html"
    written = CliRunner().invoke(cli, ["report", *stores, "--out", str(out)])
    assert written.exit_code == 0, written.output
    assert f"{tmp_path / 's-1.duckdb'}, {tmp_path / 's-2.duckdb'}" in out.read_text()
