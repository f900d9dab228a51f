"""Replay's task selection and resume state read several stores as one (`--db` repeated or a glob)."""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
from click.testing import CliRunner

from domains.accounts_payable.run import run_domain
from domains.accounts_payable.tasks import TASKS
from plumbline_otel.cli.main import cli
from plumbline_otel.ingest import ingest_files
from plumbline_otel.store import Store

ARM = "plan_execute_retry"
AGENT = f"ap-agent-{ARM}"


def _keep(path: Path, parity: int) -> None:
    """Keep every other trace (by sorted trace id), starting at `parity`: one shard of a trace-id split."""
    with duckdb.connect(str(path)) as connection:
        ids = sorted(r[0] for r in connection.execute("SELECT DISTINCT trace_id FROM spans").fetchall())
        for table in ("spans", "trajectories"):
            connection.execute(f"DELETE FROM {table} WHERE NOT list_contains(?::VARCHAR[], trace_id)", [ids[parity::2]])


def test_replay_selects_the_same_tasks_from_two_shards_as_from_one_store(tmp_path: Path) -> None:
    run_domain(ARM, [t.task_id for t in TASKS[:4]], otlp_file=tmp_path / "src" / f"{ARM}.otlp.jsonl", offline=True,
               imperfections={}, study="traffic")
    whole = tmp_path / "whole.duckdb"
    with Store(whole) as store:
        assert ingest_files(store, [str(tmp_path / "src")]).trajectories == 4
    for parity in (0, 1):
        shutil.copy(whole, tmp_path / f"shard-{parity}.duckdb")
        _keep(tmp_path / f"shard-{parity}.duckdb", parity)
    with duckdb.connect(str(tmp_path / "shard-0.duckdb"), read_only=True) as connection:
        assert 0 < connection.execute("SELECT count(*) FROM trajectories").fetchall()[0][0] < 4  # a real split

    args = ["replay", "--study", "s", "--agent", AGENT, "--perturbations", "baseline,paraphrase",
            "--adapter", f"python:domains.accounts_payable.replay_adapter:{ARM}", "--state-dir", str(tmp_path / "state"),
            "--dry-run"]
    one = CliRunner().invoke(cli, [*args, "--db", str(whole)])
    assert one.exit_code == 0, one.output
    assert "4 task(s) × baseline, paraphrase × 1 repeat(s): 8 trials" in one.output
    for stores in (["--db", str(tmp_path / "shard-0.duckdb"), "--db", str(tmp_path / "shard-1.duckdb")],
                   ["--db", str(tmp_path / "shard-*.duckdb")]):
        many = CliRunner().invoke(cli, [*args, *stores])
        assert many.exit_code == 0, many.output
        assert many.stdout == one.stdout
