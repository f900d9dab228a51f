"""The lake (plumbline_otel/lake.py): three instances' stores committed to one Iceberg table set read, through
`--lake`, exactly as one store holding everything; late spans, repeated and concurrent commits, a sync killed
mid-commit, and maintenance change none of the answers."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner
from core.test_sources import _runs
from replay.toy import ToyAgent, tasks
from waits import EVENT_DEADLINE_S

from lake.lake_support import misrouted_lake
from plumbline_otel.cli.main import cli
from plumbline_otel.ingest import ingest_files
from plumbline_otel.lake import Lake, LakeReader, LakeSink, maintain, parse_lake_uri
from plumbline_otel.replay import SpanSink, StudyConfig, run_study
from plumbline_otel.runs import is_record
from plumbline_otel.spec.testing import span_records
from plumbline_otel.store import Store

SPEC = "version: 1\nname: lake\ninvariants:\n  - {id: PAYS, severity: critical, must_call: pay}\n  - {id: LOOKS, severity: major, must_call: lookup_invoice}\n"
SHARDS = 3


def _keep(path: Path, shard: int) -> None:
    """Keep one shard of a trace-id split (every third trace by sorted id), as the loadbalancing exporter would."""
    with duckdb.connect(str(path)) as connection:
        ids = sorted(r[0] for r in connection.execute("SELECT DISTINCT trace_id FROM spans").fetchall())
        for table in ("spans", "trajectories", "logs"):
            connection.execute(f"DELETE FROM {table} WHERE NOT list_contains(?::VARCHAR[], trace_id)", [ids[shard::SHARDS]])
        if shard:  # the rejected input reached the first instance only
            connection.execute("DELETE FROM problems")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A replay study (runs and the driver's records) plus a second service's traffic; one whole store and three shards."""
    root = tmp_path_factory.mktemp("lake-corpus")
    config = StudyConfig("lake", perturbations=("baseline", "paraphrase"), repeats=2, concurrency=4,
                         sink=SpanSink(otlp_file=str(root / "src" / "study.otlp.jsonl")), state_dir=root / "state")
    summary = run_study(config, tasks(6), ToyAgent())
    assert summary.ok == 24
    whole = root / "whole.duckdb"
    with Store(whole) as store:
        ingest_files(store, [str(root / "src")])
        for t in _runs():  # another service's runs, with an unrecognised key
            records = span_records(t)
            records[1].unknown_keys = [f"vendor.key.{t.task_key}"]
            store.write_spans(records)
        store.assemble()
        store.connection.execute("INSERT INTO problems VALUES (1, 'x.json', 'line 3', 'not JSON', 2)")
        records = [t for t in store.trajectories() if is_record(t)]
        assert len(records) == 24 + 24 + 24  # the plan, every attempt and its seal
    for shard in range(SHARDS):
        shutil.copy(whole, root / f"i{shard}.duckdb")
        _keep(root / f"i{shard}.duckdb", shard)
    (root / "spec.yaml").write_text(SPEC)
    return root


def _sync(db: Path, lake: str, instance: str) -> dict:
    result = CliRunner().invoke(cli, ["lake", "sync", "--db", str(db), "--lake", lake, "--instance", instance])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _answers(stores: list[str], spec: Path, tmp: Path) -> dict[str, object]:
    """What the readers say: trajectories (JSON lines), coverage (JSON), check (JSON), certificate, comparison."""
    runner = CliRunner()
    out: dict[str, object] = {}
    for name, args in {"trajectories": ["trajectories"], "coverage": ["coverage", "--format", "json"],
                       "check": ["check", "--spec", str(spec), "--format", "json"],
                       "compare": ["compare", "toy-agent", "alpha", "--format", "json", "--consistency", "--state", str(spec.parent / "state")]}.items():
        done = runner.invoke(cli, [*args, *stores])
        assert done.exit_code == 0, (name, done.output)
        out[name] = done.stdout
    cert = tmp / "cert.json"
    done = runner.invoke(cli, ["certify", "--spec", str(spec), *stores, "--state", str(spec.parent / "state"), "--out", str(cert),
                               "--format", "none"])
    assert done.exit_code == 0, done.output
    certificate = json.loads(cert.read_text())
    assert "untrusted_records" not in certificate["provenance"]  # every driver record verified, wherever it was read from
    certificate["provenance"].pop("generated_at")
    out["certify"] = certificate
    return out


def _same(a: dict[str, object], b: dict[str, object]) -> None:
    assert a["trajectories"] == b["trajectories"]
    coverage_a, coverage_b = json.loads(str(a["coverage"])), json.loads(str(b["coverage"]))
    assert coverage_a == coverage_b
    check_a, check_b = json.loads(str(a["check"])), json.loads(str(b["check"]))
    check_a.pop("violations_written"), check_b.pop("violations_written")  # one file stores them; several stores only report
    assert check_a == check_b
    assert a["compare"] == b["compare"]
    assert a["certify"] == b["certify"]


def test_parse_lake_uri_names_catalog_and_warehouse(tmp_path: Path) -> None:
    assert parse_lake_uri(str(tmp_path / "lake")) == (f"sqlite:///{tmp_path / 'lake' / 'catalog.db'}", (tmp_path / "lake" / "data").as_uri())
    assert parse_lake_uri("postgresql://u@h/db?warehouse=s3://b/p") == ("postgresql+psycopg://u@h/db", "s3://b/p")
    with pytest.raises(Exception, match="warehouse"):
        parse_lake_uri("postgresql://u@h/db")


def test_three_instances_through_the_lake_answer_as_one_store(corpus: Path, tmp_path: Path) -> None:
    lake = str(tmp_path / "lake")
    for shard in range(SHARDS):
        first = _sync(corpus / f"i{shard}.duckdb", lake, f"i{shard}")
        assert first["groups"]["runs"] > 0
        again = _sync(corpus / f"i{shard}.duckdb", lake, f"i{shard}")  # idempotent: nothing to commit
        assert not any(again["groups"].values()), again
    whole = _answers(["--db", str(corpus / "whole.duckdb")], corpus / "spec.yaml", tmp_path)
    through = _answers(["--lake", lake], corpus / "spec.yaml", tmp_path)
    assert json.loads(str(whole["coverage"]))["overall"]["trajectories"]["trajectories"] > 48
    assert whole["certify"]["provenance"]["evidence_sha256"]  # type: ignore[index]
    _same(whole, through)
    # the federation of the three files agrees too (the lake replaces it, it does not change the answer)
    files = _answers([arg for s in range(SHARDS) for arg in ("--db", str(corpus / f"i{s}.duckdb"))], corpus / "spec.yaml", tmp_path)
    coverage = json.loads(str(files["coverage"]))
    coverage.pop("stores"), coverage.pop("misrouted_traces")
    files["coverage"] = json.dumps(coverage)
    _same(whole, files)
    # replay's task selection reads the lake as one store
    args = ["replay", "--study", "again", "--agent", "toy-agent", "--perturbations", "baseline",
            "--adapter", "python:domains.accounts_payable.replay_adapter:plan_execute_retry", "--state-dir", str(tmp_path / "st"), "--dry-run"]
    one = CliRunner().invoke(cli, [*args, "--db", str(corpus / "whole.duckdb")])
    many = CliRunner().invoke(cli, [*args, "--lake", lake])
    assert one.exit_code == 0 and many.exit_code == 0, (one.output, many.output)
    assert many.stdout == one.stdout


def test_a_late_span_replaces_its_run_exactly_once(corpus: Path, tmp_path: Path) -> None:
    lake = str(tmp_path / "lake")
    stores = []
    for shard in range(SHARDS):
        shutil.copy(corpus / f"i{shard}.duckdb", tmp_path / f"i{shard}.duckdb")
        stores.append(tmp_path / f"i{shard}.duckdb")
        _sync(stores[-1], lake, f"i{shard}")
    shutil.copy(corpus / "whole.duckdb", tmp_path / "whole.duckdb")
    # a late tool span of one stored run reaches its instance (and the single store)
    with Store(stores[1]) as store:
        run = next(t for t in store.trajectories() if t.steps and not is_record(t))
    late = span_records(run)[-1]
    late.span_id = "f" * 16
    late.tool_name = "pay"
    late.start_ns += 1
    for path in (stores[1], tmp_path / "whole.duckdb"):
        with Store(path) as store:
            store.write_spans([late])
            store.assemble()
    synced = _sync(stores[1], lake, "i1")
    assert synced["groups"]["runs"] == 1 and synced["groups"]["spans"] == 1 and synced["groups"]["steps"] == 1
    runs = Lake(lake).scan("runs", fields=("trajectory_id",))["trajectory_id"].to_pylist()
    assert runs.count(run.trajectory_id) == 1 and len(runs) == len(set(runs))
    assert not any(_sync(stores[1], lake, "i1")["groups"].values())
    _same(_answers(["--db", str(tmp_path / "whole.duckdb")], corpus / "spec.yaml", tmp_path),
          _answers(["--lake", lake], corpus / "spec.yaml", tmp_path))


def test_a_misrouted_trace_is_named_and_left_out_as_across_files(corpus: Path, tmp_path: Path) -> None:
    lake, stray = misrouted_lake(corpus, tmp_path)
    from plumbline_otel.sources import Sources

    files = Sources([str(tmp_path / "i0.duckdb"), str(tmp_path / "i1.duckdb")])
    through = Sources(lake=lake)
    assert [m.trace_id for m in through.misrouted] == [m.trace_id for m in files.misrouted] == [stray[0].trace_id]
    assert through.misrouted[0].stores == (f"{lake}#i0", f"{lake}#i1")
    assert [t.trajectory_id for t in through.trajectories()] == [t.trajectory_id for t in files.trajectories()]
    a, b = through.coverage(), files.coverage()
    for report in (a, b):
        report.pop("stores", None), report.pop("misrouted_traces", None)
    assert a == b


def test_concurrent_syncs_are_retried_and_a_killed_one_leaves_nothing_half_done(corpus: Path, tmp_path: Path) -> None:
    lake = str(tmp_path / "lake")
    Lake(lake).table("runs")  # made once, before the racers
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    # one sync is killed with -9 while it commits (in the middle of its tables): it waits there until it is (the wait is
    # far longer than a loaded machine takes to send the signal, so the sync never goes on to finish first)
    slow = ("import sys, time; from plumbline_otel.lake import Lake, LakeSink; from plumbline_otel.store import Store; "
            "s = Store(sys.argv[1]); k = LakeSink(Lake(sys.argv[2]), 'i0', batch_rows=5, "
            "before_commit=lambda n: (print(n, flush=True), time.sleep(300) if n == 'spans' else None)); k.sync(s.connection)")
    victim = subprocess.Popen([sys.executable, "-c", slow, str(corpus / "i0.duckdb"), lake], stdout=subprocess.PIPE, text=True, env=env)
    assert victim.stdout is not None
    for line in victim.stdout:
        if line.strip() == "spans":
            victim.send_signal(signal.SIGKILL)
            break
    victim.wait()
    assert victim.returncode == -signal.SIGKILL
    # then the three instances commit at once
    racers = [subprocess.Popen([sys.executable, "-c", "from plumbline_otel.cli.main import main; main()", "lake", "sync", "--db", str(corpus / f"i{s}.duckdb"),
                                "--lake", lake, "--instance", f"i{s}"], stdout=subprocess.PIPE, text=True, env=env)
              for s in range(SHARDS)]
    outs = [json.loads(r.communicate(timeout=EVENT_DEADLINE_S)[0]) for r in racers]  # ends when they do: bounds a hang
    assert all(r.returncode == 0 for r in racers)
    assert all(o["retries"] >= 0 for o in outs)  # whether they collided depends on timing (see the next test for one that must)
    with Store(corpus / "whole.duckdb", read_only=True) as store:
        expected = sorted(t.trajectory_id for t in store.trajectories())
    assert sorted(Lake(lake).scan("runs", fields=("trajectory_id",))["trajectory_id"].to_pylist()) == expected
    _same(_answers(["--db", str(corpus / "whole.duckdb")], corpus / "spec.yaml", tmp_path),
          _answers(["--lake", lake], corpus / "spec.yaml", tmp_path))


def _files_on_disk(lake: str, table: str) -> int:
    return sum(1 for p in (Path(lake) / "data" / "plumbline" / table / "data").rglob("*.parquet"))


def test_maintenance_compacts_expires_and_frees_the_files_without_changing_an_answer(corpus: Path, tmp_path: Path) -> None:
    lake = str(tmp_path / "lake")
    for shard in range(SHARDS):
        store = Store(corpus / f"i{shard}.duckdb", read_only=True)
        with store:
            LakeSink(Lake(lake), f"i{shard}", batch_rows=10).sync(store.connection)  # many small files
    before = LakeReader(Lake(lake))
    trajectories = [t.trajectory_id for t in before.trajectories()]
    table = Lake(lake).table("runs")
    files = table.inspect.files().num_rows
    partitions = len({(p["instance"], p["hour"]) for p in table.inspect.files()["partition"].to_pylist()})
    on_disk = _files_on_disk(lake, "runs")
    assert on_disk == files
    done = CliRunner().invoke(cli, ["lake", "maintain", "--lake", lake, "--older-than", "0s", "--settle", "0s"])
    assert done.exit_code == 0, done.output
    report = json.loads(done.stdout)
    assert report["runs"]["data_files_before"] == files > partitions
    assert report["runs"]["data_files_after"] == partitions  # one per (instance, hour)
    assert report["runs"]["snapshots"] == 1  # the watermarks moved to it: the instances committed nothing since
    # the files only expired snapshots held are gone, and said so: what is left on disk is what the live snapshot reads
    assert report["runs"]["files_deleted"] >= files and report["runs"]["bytes_freed"] > 0
    assert report["total"]["bytes_freed"] >= report["runs"]["bytes_freed"]
    assert _files_on_disk(lake, "runs") == partitions
    assert [t.trajectory_id for t in LakeReader(Lake(lake)).trajectories()] == trajectories
    shown = CliRunner().invoke(cli, ["lake", "tables", "--lake", lake])
    assert shown.exit_code == 0 and '"i0"' in shown.stdout
    again = maintain(Lake(lake), older_than_s=3600)
    assert again["runs"]["snapshots_expired"] == 0 and again["total"]["files_deleted"] == 0


def test_a_postgres_catalog_serves_several_instances_as_one_store(corpus: Path, tmp_path: Path, postgres_db: str) -> None:
    lake = f"{postgres_db}?warehouse={tmp_path / 'warehouse'}"
    for shard in range(SHARDS):
        _sync(corpus / f"i{shard}.duckdb", lake, f"i{shard}")
    assert not any(_sync(corpus / "i2.duckdb", lake, "i2")["groups"].values())
    _same(_answers(["--db", str(corpus / "whole.duckdb")], corpus / "spec.yaml", tmp_path),
          _answers(["--lake", lake], corpus / "spec.yaml", tmp_path))


def test_a_commit_refused_for_a_concurrent_one_is_redone_on_the_new_table(corpus: Path, tmp_path: Path) -> None:
    lake = str(tmp_path / "lake")
    other = LakeSink(Lake(lake), "i1")
    cut_in: list[int] = []

    def meanwhile(table: str) -> None:  # another instance commits between this one's transaction and its commit
        if table == "runs" and not cut_in:
            cut_in.append(1)
            with Store(corpus / "i1.duckdb", read_only=True) as store:
                other.sync(store.connection)

    with Store(corpus / "i0.duckdb", read_only=True) as store:
        Lake(lake).table("runs")
        result = LakeSink(Lake(lake), "i0", before_commit=meanwhile).sync(store.connection)
    assert result.retries == 1
    with Store(corpus / "i0.duckdb", read_only=True) as a, Store(corpus / "i1.duckdb", read_only=True) as b:
        expected = sorted(t.trajectory_id for s in (a, b) for t in s.trajectories())
    assert sorted(Lake(lake).scan("runs", fields=("trajectory_id",))["trajectory_id"].to_pylist()) == expected


def test_each_kept_certificate_s_cells_reach_the_lake_once(tmp_path: Path) -> None:
    from replay.toy import traffic_store

    db = traffic_store(tmp_path, 3)
    spec = tmp_path / "spec.yaml"
    spec.write_text("version: 1\nname: toy\ninvariants:\n  - {id: PAY, severity: critical, must_call: pay}\n")
    runner = CliRunner()
    for target in ("0.3", "0.95"):  # two certificates kept in the store
        done = runner.invoke(cli, ["certify", "--spec", str(spec), "--db", str(db), "--target", target, "--out", str(tmp_path / "c.json"),
                                   "--format", "none"])
        assert done.exit_code == 0, done.output
    lake = str(tmp_path / "lake")
    first, again = _sync(db, lake, "one"), _sync(db, lake, "one")
    cells = Lake(lake).scan("certificate_cells").to_pylist()
    assert sorted((c["agent"], c["perturbation"], c["n"], c["verdict"]) for c in cells) == [
        ("toy-agent@1", "baseline", 3, "INCONCLUSIVE"), ("toy-agent@1", "baseline", 3, "PASS")]
    assert all(json.loads(c["cell"])["per_task"] for c in cells) and first != again  # the second sync commits nothing new
