"""One replay study, two runner processes, one Postgres state: every trial runs exactly once, under one exact cap."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from waits import EVENT_DEADLINE_S

from plumbline_otel.ingest import ingest_files
from plumbline_otel.replay.pgstate import PgLedger, PgSpendCap, shared_keys
from plumbline_otel.store import Store
from plumbline_otel.trials import account

ROOT = Path(__file__).resolve().parents[2]
RUNNER = """
import json, sys, time
from plumbline_otel.replay import SpanSink, StudyConfig, run_study
from tests.replay.toy import ToyAgent, tasks

class Slow(ToyAgent):
    def run(self, trial):
        time.sleep(0.15)
        return super().run(trial)

url, state, spans = sys.argv[1:4]
sink = SpanSink(otlp_file=spans)
config = StudyConfig("shared", repeats=3, concurrency=2, state_url=url, state_dir=state, sink=sink,
                     budget_usd=0.95, trial_max_usd=0.05)
summary = run_study(config, tasks(8), Slow(cost_usd=0.05))
sink.close()
print(json.dumps({"ok": [r.trial_id for r in summary.records if r.status == "ok"], "elsewhere": summary.elsewhere,
                  "missing": summary.missing, "spent": summary.spent_usd}))
"""


@pytest.mark.slow
def test_two_runners_share_one_study_each_trial_once_under_one_cap(postgres_db: str, tmp_path: Path) -> None:
    procs = [subprocess.Popen([sys.executable, "-c", RUNNER, postgres_db, str(tmp_path / f"state{i}"), str(tmp_path / f"spans{i}.jsonl")],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=2 * EVENT_DEADLINE_S)  # ends when the runner does: this only bounds a hang
        assert proc.returncode == 0, err[-3000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    ran = [tid for o in outs for tid in o["ok"]]
    # 24 trials, $0.05 each, a $0.95 cap: exactly 19 run, across both runners, none twice.
    assert len(ran) == len(set(ran)) == 19
    # (Which runner took how many depends on when each process got going; none ran a trial the other had.)
    assert PgSpendCap(postgres_db, "shared", 0.95).spent == pytest.approx(0.95)  # the cap, exact across both
    assert len(PgLedger(postgres_db, "shared").decided()) == 19
    with Store(tmp_path / "p.duckdb") as store:
        ingest_files(store, [str(tmp_path / "spans0.jsonl"), str(tmp_path / "spans1.jsonl")])
        books = account(store.trajectories(), shared_keys(postgres_db))  # one key for every runner of the shared study
    statuses = sorted(r.status for r in books.results)
    assert (statuses.count("exposed"), statuses.count("missing")) == (19, 5)  # the five the cap refused are missing
