"""`plumbline replay` on the command line: the cap needs a reservation, a re-run needs --rerun."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from plumbline_otel.cli.main import cli
from plumbline_otel.ingest import ingest_files
from plumbline_otel.store import Store

from .toy import agent_runs, traffic_store


def _store(tmp_path: Path) -> Path:
    return traffic_store(tmp_path)


def test_replay_cli_refuses_a_cap_without_a_reservation_and_a_rerun_without_the_flag(tmp_path: Path) -> None:
    db = _store(tmp_path)
    base = ["replay", "--db", str(db), "--study", "c", "--agent", "toy-agent", "--adapter", "python:tests.replay.toy:ToyAgent",
            "--otlp-file", str(tmp_path / "r.jsonl"), "--quiet"]
    runner = CliRunner()
    capped = runner.invoke(cli, [*base, "--budget-usd", "1"])
    assert capped.exit_code == 1 and "--trial-max-usd" in str(capped.exception)  # main() prints it, no traceback
    first = runner.invoke(cli, [*base, "--budget-usd", "1", "--trial-max-usd", "0.1"])
    assert first.exit_code == 0, first.output
    assert "ran 2 (2 ok, 0 missing, 0 errored)" in first.output
    again = runner.invoke(cli, [*base, "--budget-usd", "1", "--trial-max-usd", "0.1"])
    assert again.exit_code == 1 and "--rerun" in str(again.exception)
    rerun = runner.invoke(cli, [*base, "--budget-usd", "1", "--trial-max-usd", "0.1", "--rerun"])
    assert rerun.exit_code == 0 and "ran 2 (2 ok" in rerun.output
    with Store(tmp_path / "q.duckdb") as store:
        ingest_files(store, [str(tmp_path / "r.jsonl")])
        trials = sorted(str(t.context["plumbline.trial.id"]).rsplit("/", 1)[1] for t in agent_runs(store.trajectories()))
    assert trials == ["k0", "k0", "k1", "k1"]  # --rerun ran new trials
