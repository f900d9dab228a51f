"""What an operator of the lake relies on beyond the answers: an instance keeps its name when its store file moves or its
host changes, readers see each instance as of one complete sync (also when a sync is killed between tables), the sync's
state is on /metrics, `check --lake` names what it left out, and the catalog's name is a setting."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from lake.lake_support import misrouted_lake
from lake.test_lake import corpus  # noqa: F401 - the module's corpus fixture, shared
from plumbline_otel.cli.main import cli
from plumbline_otel.errors import ConfigError
from plumbline_otel.lake import Lake, LakeReader, LakeSink, LakeSync, stored_instance
from plumbline_otel.spec.testing import span_records
from plumbline_otel.store import Store

ROOT = Path(__file__).resolve().parents[2]


def _runs_in(lake: str) -> list[str]:
    return sorted(t.trajectory_id for t in LakeReader(Lake(lake)).trajectories())


def test_an_instance_keeps_its_name_when_its_file_moves_and_its_host_changes(corpus: Path, tmp_path: Path) -> None:  # noqa: F811
    lake = str(tmp_path / "lake")
    shutil.copy(corpus / "i0.duckdb", tmp_path / "a.duckdb")
    first = CliRunner().invoke(cli, ["lake", "sync", "--db", str(tmp_path / "a.duckdb"), "--lake", lake])
    assert first.exit_code == 0, first.output
    name = json.loads(first.stdout)["instance"]
    runs = _runs_in(lake)
    assert runs
    # moved, on another host (the name is not derived from either)
    moved = tmp_path / "elsewhere" / "b.duckdb"
    moved.parent.mkdir()
    shutil.move(tmp_path / "a.duckdb", moved)
    again = subprocess.run([sys.executable, "-c", "import socket, sys; socket.gethostname = lambda: 'new-host'; "
                            "from plumbline_otel.cli.main import main; sys.argv[0] = 'plumbline'; main()",
                            "lake", "sync", "--db", str(moved), "--lake", lake], capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)
    assert json.loads(again.stdout)["instance"] == name and not any(json.loads(again.stdout)["groups"].values())
    assert _runs_in(lake) == runs
    with Store(moved, read_only=True) as store:
        assert stored_instance(store.connection) == name
    # another name for the same store is refused, saying what it is and how to rename
    other = CliRunner().invoke(cli, ["lake", "sync", "--db", str(moved), "--lake", lake, "--instance", "renamed"])
    assert other.exit_code != 0 and name in str(other.exception) and "lake rename" in str(other.exception)
    # a copy without its kept name (an old store) whose runs the lake holds under another name is refused, not doubled
    shutil.copy(corpus / "i0.duckdb", tmp_path / "old.duckdb")
    with Store(tmp_path / "old.duckdb", read_only=True) as store, pytest.raises(ConfigError, match=f"under instance '{name}'"):
        LakeSink(Lake(lake), "host:/old/path").sync(store.connection)
    assert _runs_in(lake) == runs
    # rename moves the rows, and the store keeps the new name
    done = CliRunner().invoke(cli, ["lake", "rename", "--lake", lake, "--from", name, "--to", "renamed", "--db", str(moved)])
    assert done.exit_code == 0, done.output
    assert _runs_in(lake) == runs
    synced = CliRunner().invoke(cli, ["lake", "sync", "--db", str(moved), "--lake", lake])
    assert json.loads(synced.stdout)["instance"] == "renamed" and not any(json.loads(synced.stdout)["groups"].values())


_KILLED = ("import sys; from plumbline_otel.lake import Lake, LakeSink; from plumbline_otel.store import Store; "
           "import time; s = Store(sys.argv[1]); k = LakeSink(Lake(sys.argv[2]), 'i0', batch_rows=5, "
           "before_commit=lambda n: (print(n, flush=True), time.sleep(300) if n == 'spans' else None)); k.sync(s.connection)")  # killed there, however slowly


def test_a_sync_killed_between_tables_is_not_seen_by_readers(corpus: Path, tmp_path: Path) -> None:  # noqa: F811
    lake = str(tmp_path / "lake")
    db = tmp_path / "i0.duckdb"
    shutil.copy(corpus / "i0.duckdb", db)
    with Store(db) as store:
        LakeSink(Lake(lake), "i0").sync(store.connection)
        before = sorted(t.trajectory_id for t in store.trajectories())
        more = span_records(next(iter(Store(corpus / "i1.duckdb", read_only=True).trajectories())))
        store.write_spans(more)
        store.assemble()
        after = sorted(t.trajectory_id for t in store.trajectories())
    assert set(after) - set(before)
    victim = subprocess.Popen([sys.executable, "-c", _KILLED, str(db), lake], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert victim.stdout is not None
    for line in victim.stdout:
        if line.strip() == "spans":  # runs and steps are committed, spans and the rest not
            victim.send_signal(signal.SIGKILL)
            break
    victim.wait()
    raw = sorted(Lake(lake).scan("runs", fields=("trajectory_id",))["trajectory_id"].to_pylist())
    assert raw == after  # the runs table itself holds the unfinished sync's runs …
    assert _runs_in(lake) == before  # … but a reader sees the instance as of its last complete sync, in every table
    spans = LakeReader(Lake(lake)).scan("spans", fields=("trace_id",))["trace_id"].to_pylist()
    assert more[0].trace_id not in spans
    with Store(db, read_only=True) as store:
        LakeSink(Lake(lake), "i0").sync(store.connection)
    assert _runs_in(lake) == after


def test_lake_metrics_say_when_it_last_committed_and_how_far_behind_it_is(corpus: Path, tmp_path: Path) -> None:  # noqa: F811
    db = tmp_path / "i0.duckdb"
    shutil.copy(corpus / "i0.duckdb", db)
    store = Store(db)
    try:
        bad = LakeSync(LakeSink(Lake(str(tmp_path / "lake")), "i0"), lambda: (_ for _ in ()).throw(RuntimeError("catalog down")))
        assert bad.sync_once() is None and bad.failures == 1
        sync = LakeSync(LakeSink(Lake(str(tmp_path / "lake")), "i0"), store.connection.cursor)
        before = sync.render_metrics()
        assert 'plumbline_lake_last_commit_timestamp_seconds{instance="i0"} 0' in before
        assert sync.lag_rows() == store.connection.execute("SELECT count(*) FROM spans").fetchone()[0] > 0
        assert sync.sync_once() is not None
        text = sync.render_metrics()
        assert 'plumbline_lake_syncs_total{instance="i0"} 1' in text and 'plumbline_lake_lag_rows{instance="i0"} 0' in text
        assert "plumbline_lake_commit_retries_total" in text and "plumbline_lake_sync_failures_total" in text
        lag = float(next(line.split()[-1] for line in text.splitlines() if line.startswith("plumbline_lake_lag_seconds")))
        assert 0 <= lag < 60
    finally:
        store.close()


def test_check_through_the_lake_names_the_misrouted_traces_it_left_out(corpus: Path, tmp_path: Path) -> None:  # noqa: F811
    lake, stray = misrouted_lake(corpus, tmp_path)
    done = CliRunner().invoke(cli, ["check", "--spec", str(corpus / "spec.yaml"), "--lake", lake, "--format", "json"])
    assert done.exit_code == 0, done.output
    assert [m["trace_id"] for m in json.loads(done.stdout)["misrouted_traces"]] == [stray[0].trace_id]
    text = CliRunner().invoke(cli, ["check", "--spec", str(corpus / "spec.yaml"), "--lake", lake])
    assert stray[0].trace_id in text.stdout


def test_the_catalog_name_is_a_setting(corpus: Path, tmp_path: Path, postgres_db: str) -> None:  # noqa: F811
    lake = f"{postgres_db}?warehouse={tmp_path / 'w'}&catalog=analytics"
    with Store(corpus / "i0.duckdb", read_only=True) as store:
        LakeSink(Lake(lake), "i0").sync(store.connection)
    import psycopg

    with psycopg.connect(postgres_db) as connection:
        names = {r[0] for r in connection.execute("SELECT DISTINCT catalog_name FROM iceberg_tables").fetchall()}
    assert names == {"analytics"}
    assert _runs_in(lake)
    assert not _runs_in(f"{postgres_db}?warehouse={tmp_path / 'w'}")  # another name sees another (empty) catalog
