"""The spend cap never overshoots, however many threads spend at once."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest
from waits import EVENT_DEADLINE_S

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
    ran = 40 - len(missing)
    # the plan, then every attempt, and a seal of each attempt the agent ran
    assert len(records) == 40 + 40 + ran and sorted(statuses).count("missing") == len(missing)

    # The cap is the study's: resuming with the same cap runs nothing more; a larger one continues.
    again = run_study(StudyConfig("capped", repeats=5, concurrency=8, budget_usd=2.0, trial_max_usd=0.15,
                                  resume=True, state_dir=tmp_path / "state"), tasks(8), spender)
    assert again.ok == 0 and again.skipped == summary.ok
    more = run_study(StudyConfig("capped", repeats=5, concurrency=8, budget_usd=100.0, trial_max_usd=0.15,
                                 resume=True, state_dir=tmp_path / "state", sink=config.sink), tasks(8), spender)
    assert more.ok == 40 - summary.ok and more.missing == 0


# --- issue 26 item 6: refused calls cost nothing, dead runners release, reservations wait ----------


def test_a_trial_whose_every_call_was_refused_costs_nothing() -> None:
    cap = SpendCap(1.0)
    assert cap.reserve(0.99)  # another trial holds nearly all of it
    budget = TrialBudget.open(cap, 0.0)
    assert budget is not None
    with pytest.raises(BudgetExceeded):
        budget.ensure(0.05)
    assert budget.refused == 1 and budget.close() == 0.0 and cap.spent == 0.0


def test_a_dead_runner_s_reservations_are_released_at_what_they_metered(tmp_path: Path) -> None:
    import subprocess
    import sys

    journal = tmp_path / "ledger.jsonl"
    code = ("import sys; from plumbline_otel.replay.budget import SpendCap, TrialBudget; cap = SpendCap(1.0, journal=sys.argv[1]); "
            "b = TrialBudget.open(cap, 0.4); b.ensure(0.1); b.add(0.07); TrialBudget.open(cap, 0.3)")  # dies holding both
    done = subprocess.run([sys.executable, "-c", code, str(journal)], check=True)
    assert done.returncode == 0
    cap = SpendCap(1.0, journal=journal)
    assert cap.reserved == pytest.approx(0.7)
    mine = TrialBudget.open(cap, 0.1)  # a live reservation of this process is never released
    released = cap.release_dead()  # the runner's pid is gone: every reservation it held is released
    assert sorted((r.usd, r.used, r.metered) for r in released) == [(0.3, 0.3, False), (0.4, 0.07, True)]
    assert cap.spent == pytest.approx(0.37) and cap.reserved == pytest.approx(0.1)  # unmetered: may have been spent
    assert mine is not None and cap.release_dead([12345678]) == []


def test_a_reservation_that_does_not_fit_waits_for_running_trials_to_settle() -> None:
    cap = SpendCap(1.0)
    running = TrialBudget.open(cap, 0.8)
    assert running is not None

    def settle_soon() -> None:
        time.sleep(0.2)
        running.add(0.1)  # metered: it settles at what the meter counted
        running.close()

    started = time.monotonic()  # before the settle's 0.2 s begins: however the threads are scheduled, the wait takes longer
    threading.Thread(target=settle_soon).start()
    waited = TrialBudget.open_wait(cap, 0.5, timeout=EVENT_DEADLINE_S, running=lambda: not running.settled)
    # Woken by the settle, not at its timeout: a bound far from both the settle's time and the timeout.
    assert waited is not None and 0.1 < time.monotonic() - started < EVENT_DEADLINE_S / 2
    assert cap.reserved == pytest.approx(0.5) and cap.spent == pytest.approx(0.1)
    # Never fits (settled spend alone leaves no room), or nothing left to settle: give up at once.
    assert not cap.reserve_wait(0.95, timeout=5.0, running=lambda: True)
    assert not cap.reserve_wait(0.45, timeout=5.0, running=lambda: False)


def test_a_report_can_raise_a_trial_s_charge_never_lower_it() -> None:
    def settled(reported: float | None, metered: float | None = None, ran: bool = True) -> float:
        budget = TrialBudget.open(SpendCap(10.0), 0.5)
        assert budget is not None
        if metered is not None:
            budget.add(metered)
        return budget.close(reported, ran=ran)

    assert settled(0.0) == pytest.approx(0.5)  # "it cost nothing": no meter saw it, so the reservation
    assert settled(None) == pytest.approx(0.5)
    assert settled(0.7) == pytest.approx(0.7)  # more than reserved: what it says it spent
    assert settled(0.0, metered=0.2) == pytest.approx(0.2)  # a meter's figure stands against a lower report
    assert settled(0.3, metered=0.2) == pytest.approx(0.3)  # and a higher report raises it
    assert settled(None, ran=False) == 0.0  # never reached the agent: nothing spent
