"""The spend cap is exact: no trial starts unless its reservation fits, and the ledger's account is
shared by every thread and process, so the cap is never passed by a cent.

The seed system reserved a default estimate of 0: adapters that reported their own cost spent
$3.30 on a $1.00 cap, and two processes on one study $1.80.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import anthropic
import pytest

from plumbline_otel.errors import ReplayError
from plumbline_otel.replay import (
    Ledger,
    ReplayTask,
    SpanSink,
    SpendCap,
    StudyConfig,
    Trial,
    TrialBudget,
    TrialIdentity,
    TrialOutcome,
    TrialScope,
    run_study,
)
from plumbline_otel.replay.scope import activate

from .test_replay_cache import FakeModel, ask
from .toy import ToyAgent, tasks

ROOT = Path(__file__).resolve().parents[2]
CAP = 1.00
REPORTED_MAX = 0.03  # the declared per-trial maximum of the reporting adapter


def hammer(state: Path, seed: int) -> dict[str, Any]:
    """8 threads spending from one study account until it refuses: half the trials report their own
    cost (at most their declared maximum), half are metered call by call through the anthropic
    client's caching transport (a priced model behind a mock transport)."""
    cap = SpendCap(CAP, journal=state / "ledger.jsonl")
    model = FakeModel()
    client = model.client()
    started = [0, 0]
    lock = threading.Lock()

    def worker(n: int) -> None:
        rng = random.Random(seed * 100 + n)
        refused = 0
        while refused < 3:
            metered = rng.random() < 0.5
            budget = TrialBudget.open(cap, 0.001 if metered else REPORTED_MAX)
            if budget is None:
                refused += 1
                continue
            with lock:
                started[metered] += 1
            reported = None
            try:
                if metered:
                    ident = TrialIdentity(f"s/t{seed}-{n}/baseline/0/k0", "baseline", "0", "s")
                    with activate(TrialScope(ident, budget=budget)):
                        for _ in range(rng.randint(1, 4)):
                            ask(client, f"call {rng.random()}")
                else:
                    reported = rng.uniform(0.0, REPORTED_MAX)
            except anthropic.APIStatusError:
                pass  # a metered call the cap refused: the agent stops there
            finally:
                budget.close(reported)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"reporting": started[0], "metered": started[1], "model_calls": len(model.calls), "high_water": cap.high_water}


def test_eight_threads_in_two_processes_never_pass_the_cap_by_a_cent(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    argv = [sys.executable, "-m", "tests.replay.study_proc", str(state), "-", "spend"]
    procs = [subprocess.Popen([*argv, f"{seed / 1000}"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for seed in (1, 2)]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    (state / "go").touch()
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert all(o["reporting"] > 0 and o["metered"] > 0 and o["model_calls"] > 0 for o in outs)  # both processes spent
    spent = Ledger(state / "ledger.jsonl").spent_usd()
    assert spent <= CAP + 1e-9  # never exceeded by a cent (nor by a fraction of one)
    assert spent > CAP - 0.05  # and the cap was actually reached
    assert all(o["high_water"] <= CAP + 1e-9 for o in outs)
    assert SpendCap(CAP, journal=state / "ledger.jsonl").reserved == pytest.approx(0.0)  # every reservation settled


def test_a_capped_study_without_a_reservation_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ReplayError, match="--trial-max-usd"):
        run_study(StudyConfig("c", budget_usd=1.0, state_dir=tmp_path / "s"), tasks(2), ToyAgent(cost_usd=0.5))


def test_the_reservation_comes_from_the_price_table_and_the_task_s_recorded_tokens(tmp_path: Path) -> None:
    # haiku-4-5: 10,000 in × $1/M + 2,000 out × $5/M = $0.02; reserved × 1.5 = $0.03
    priced = [ReplayTask(t.task_key, t.input, t.source_trajectory_id, "toy-agent", "1", 0, t.tools,
                         "claude-haiku-4-5", 10_000, 2_000) for t in tasks(10)]
    summary = run_study(StudyConfig("c", budget_usd=0.10, state_dir=tmp_path / "s", concurrency=1,
                                    sink=SpanSink(otlp_file=str(tmp_path / "o.jsonl"))), priced, ToyAgent(cost_usd=0.02))
    assert [r.reserved_usd for r in summary.records if r.status == "ok"] == pytest.approx([0.03] * 4)
    assert summary.ok == 4  # 4 × $0.02 = $0.08; a fifth would need $0.08 + $0.03 > $0.10
    assert summary.spent_usd == pytest.approx(0.08) and summary.budget_high_water_usd <= 0.10 + 1e-12
    assert all(r.reason and "budget: not started" in r.reason for r in summary.records if r.status == "missing")


def test_a_report_over_the_declared_maximum_is_reconciled_and_stops_the_study(tmp_path: Path) -> None:
    inner = ToyAgent()

    def greedy(trial: Trial) -> TrialOutcome:
        outcome = inner.run(trial)
        outcome.cost_usd = 0.25 if trial.identity.task_key == "INV-1001" else 0.05
        return outcome

    summary = run_study(StudyConfig("c", budget_usd=1.0, trial_max_usd=0.10, state_dir=tmp_path / "s", concurrency=1,
                                    sink=SpanSink(otlp_file=str(tmp_path / "o.jsonl"))), tasks(6), greedy)
    over = [r for r in summary.records if r.overrun_usd > 0]
    assert [r.task_key for r in over] == ["INV-1001"] and over[0].overrun_usd == pytest.approx(0.15)
    assert summary.ok == 2 and summary.missing == 4  # nothing started after the overrun
    assert "OVERRUN" in summary.render() and summary.as_dict()["overruns"][0]["overrun_usd"] == pytest.approx(0.15)
    assert summary.spent_usd == pytest.approx(0.30)
