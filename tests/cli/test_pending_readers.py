"""Readers on a file a crash left pending: they assemble first, or say how many traces their figures exclude."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner
from waits import EVENT_DEADLINE_S

from plumbline_otel.cli.main import cli
from plumbline_otel.decode import decode_unit, iter_trace_files, iter_units
from plumbline_otel.normalise import normalise_request
from plumbline_otel.store import Store

SAMPLES = Path(__file__).resolve().parents[2] / "runs" / "samples"


def _crashed_store(db: Path) -> int:
    """The sample traces committed span by span and never assembled (what a SIGKILL leaves); their trace count."""
    with Store(db) as store:
        for path in iter_trace_files([str(SAMPLES)]):
            for unit in iter_units(path):
                store.write_spans(*normalise_request(decode_unit(unit).request))
        traces = store.connection.execute("SELECT count(DISTINCT trace_id) FROM spans").fetchall()[0][0]
        assert store.pending_traces() == traces > 0
        assert store.connection.execute("SELECT count(*) FROM trajectories").fetchall()[0][0] == 0
    return traces


def test_trajectories_and_coverage_assemble_pending_traces_before_reading(tmp_path: Path) -> None:
    db = tmp_path / "crashed.duckdb"
    traces = _crashed_store(db)
    runner = CliRunner()
    listed = runner.invoke(cli, ["trajectories", "--db", str(db)])
    assert listed.exit_code == 0, listed.output
    assert len(listed.stdout.strip().splitlines()) == traces
    assert "not yet assembled" not in listed.stderr
    report = json.loads(runner.invoke(cli, ["coverage", "--db", str(db), "--format", "json"]).stdout)
    assert report["overall"]["trajectories"]["trajectories"] == traces
    assert report["pending_traces"] == 0
    with Store(db, read_only=True) as store:
        assert store.pending_traces() == 0


def test_readers_on_a_file_another_reader_holds_count_the_pending_traces_they_exclude(tmp_path: Path) -> None:
    db = tmp_path / "crashed.duckdb"
    traces = _crashed_store(db)
    holder = subprocess.Popen([sys.executable, "-c", "import duckdb, sys; c = duckdb.connect(sys.argv[1], read_only=True); "
                               "print('held', flush=True); sys.stdin.read()", str(db)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        runner = CliRunner()
        listed = runner.invoke(cli, ["trajectories", "--db", str(db)])
        assert listed.exit_code == 0, listed.output
        assert listed.stdout == ""
        assert f"note: {traces} traces not yet assembled into trajectories are excluded from these figures" in listed.stderr
        covered = runner.invoke(cli, ["coverage", "--db", str(db), "--format", "json"])
        assert json.loads(covered.stdout)["pending_traces"] == traces
        assert f"note: {traces} traces" in covered.stderr
    finally:
        holder.communicate("", timeout=EVENT_DEADLINE_S)


def test_readers_on_a_missing_file_create_nothing(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["trajectories", "--db", str(tmp_path / "absent.duckdb")])
    assert "cannot open" in str(result.exception)
    assert not (tmp_path / "absent.duckdb").exists()
