"""The spend cap never overshoots, however many threads spend at once."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest

from plumbline_otel.replay import (
    BudgetExceeded,
    Ledger,
    SpanSink,
    SpendCap,
    StudyConfig,
    Trial,
    TrialBudget,
    current_scope,
    run_study,
)

from .toy import ToyAgent, read_lines, tasks


def test_reserve_then_settle_holds_the_cap_under_eight_threads() -> None:
    cap = SpendCap(10.0)
    barrier = threading.Barrier(8)
    started = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        barrier.wait()
        while True:
            budget = TrialBudget.open(cap, 0.05)
            if budget is None:
                return
            started.append(1)
            try:
                for _ in range(rng.randint(1, 6)):  # metered calls, some dearer than the trial's estimate
                    cost = rng.uniform(0.001, 0.08)
                    budget.ensure(cost)
                    time.sleep(0)  # let the other threads interleave between check and spend
                    budget.add(cost)
            except BudgetExceeded:
                pass
            finally:
                budget.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert cap.spent <= 10.0 + 1e-9
    assert cap.high_water <= 10.0 + 1e-9  # spent + reserved never passed the cap, at any moment
    assert cap.spent > 9.5 and cap.refusals > 0 and cap.reserved < 1e-9
    assert len(started) > 50


def test_a_concurrent_study_stops_at_the_cap_and_records_the_rest_missing(tmp_path: Path) -> None:
    costs = random.Random(1)
    lock = threading.Lock()
    agent = ToyAgent()

    def spender(trial: Trial) -> object:
        scope = current_scope()
        assert scope is not None
        for _ in range(3):
            with lock:
                cost = costs.uniform(0.01, 0.05)
            scope.charge(cost)  # what the caching transport does before each model call
            time.sleep(0.001)
            scope.spent(cost)
        return agent.run(trial)

    config = StudyConfig("capped", repeats=5, concurrency=8, budget_usd=2.0, trial_max_usd=0.15,
                         sink=SpanSink(otlp_file=str(tmp_path / "spans.jsonl")), state_dir=tmp_path / "state")
    summary = run_study(config, tasks(8), spender)
    assert summary.planned == 40 and summary.ok + summary.missing == 40 and summary.errored == 0
    assert 0 < summary.ok < 40
    assert summary.spent_usd <= 2.0 + 1e-9 and summary.budget_high_water_usd <= 2.0 + 1e-9
    ledger = Ledger(tmp_path / "state" / "ledger.jsonl")
    assert ledger.spent_usd() == pytest.approx(summary.spent_usd)
    assert len(ledger.latest()) == 40
    missing = [r for r in summary.records if r.status == "missing"]
    assert all(r.reason and ("budget" in r.reason) for r in missing)
    records = [s for line in read_lines(tmp_path / "spans.jsonl") for rs in line["resourceSpans"]
               for ss in rs["scopeSpans"] for s in ss["spans"] if s["name"] == "plumbline.trial.record"]
    statuses = [a["value"].get("stringValue") for s in records for a in s["attributes"] if a["key"] == "plumbline.trial.status"]
    assert len(records) == 40 + 40 and sorted(statuses).count("missing") == len(missing)  # the plan, then every attempt

    # The cap is the study's: resuming with the same cap runs nothing more; a larger one continues.
    again = run_study(StudyConfig("capped", repeats=5, concurrency=8, budget_usd=2.0, trial_max_usd=0.15,
                                  resume=True, state_dir=tmp_path / "state"), tasks(8), spender)
    assert again.ok == 0 and again.skipped == summary.ok
    more = run_study(StudyConfig("capped", repeats=5, concurrency=8, budget_usd=100.0, trial_max_usd=0.15,
                                 resume=True, state_dir=tmp_path / "state", sink=config.sink), tasks(8), spender)
    assert more.ok == 40 - summary.ok and more.missing == 0
