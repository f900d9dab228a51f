"""What a trial is: one trace per attempt, one runner per study, done only when its trace arrived,
and on a tool_fault trial the evidence of the fault the driver injected."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from waits import EVENT_DEADLINE_S

from plumbline_otel.analyse.conformance import evaluate
from plumbline_otel.errors import ReplayError
from plumbline_otel.ingest import ingest_files
from plumbline_otel.replay import (
    FaultPlan,
    InjectedFault,
    RetryPolicy,
    SpanSink,
    StudyConfig,
    StudyLock,
    StudyLocked,
    Trial,
    TrialOutcome,
    run_study,
    stored_trials,
)
from plumbline_otel.spec import CallAtMost, Spec, invariant
from plumbline_otel.store import Store
from plumbline_otel.trials import KeyRing

from .toy import ToyAgent, agent_runs, driver_records, tasks

ROOT = Path(__file__).resolve().parents[2]
FAST = RetryPolicy(max_attempts=2, base_delay_s=0.001)
PAID_ONCE = Spec.of("toy", [invariant("PAID-ONCE", CallAtMost("pay", 1), severity="critical")])


def _config(tmp_path: Path, **kw: object) -> StudyConfig:
    kw.setdefault("sink", SpanSink(otlp_file=str(tmp_path / "replay.otlp.jsonl")))
    kw.setdefault("state_dir", tmp_path / "state")
    kw.setdefault("grace_s", 0.2)
    kw.setdefault("retry", FAST)
    return StudyConfig("t", **kw)  # type: ignore[arg-type]


def _stored(tmp_path: Path, name: str = "p.duckdb") -> list:
    with Store(tmp_path / name) as store:
        ingest_files(store, [str(tmp_path / "replay.otlp.jsonl")])
        return list(store.trajectories())


def _runs(tmp_path: Path, name: str = "p.duckdb") -> list:
    return agent_runs(_stored(tmp_path, name))


def test_a_rerun_is_refused_without_the_flag_and_then_runs_new_trials(tmp_path: Path) -> None:
    agent = ToyAgent()
    first = run_study(_config(tmp_path), tasks(3), agent)
    assert first.ok == 3
    with pytest.raises(ReplayError, match="--rerun"):
        run_study(_config(tmp_path), tasks(3), agent)
    again = run_study(_config(tmp_path, rerun=True), tasks(3), agent)
    assert again.ok == 3 and again.skipped == 0 and again.rerun_as == 3
    assert "ran again as new trials" in again.render()
    runs = _runs(tmp_path)
    # The seed kept one trace per trial, so a re-run merged into the first: two `pay` calls in one
    # trajectory, a false "paid twice" on every trial. Now: a re-run is a new trial (the next
    # repeat number), each run in a trace of its own and paid once.
    assert len(runs) == 6 and len({t.trace_id for t in runs}) == 6
    assert sorted(str(t.context["plumbline.trial.id"]).rsplit("/", 1)[1] for t in runs) == ["k0"] * 3 + ["k1"] * 3
    for t in runs:
        assert all(v.ok for _, v in evaluate(PAID_ONCE, t).verdicts)


def test_the_same_study_from_two_state_directories_never_shares_a_trace(tmp_path: Path) -> None:
    agent = ToyAgent()
    run_study(_config(tmp_path, state_dir=tmp_path / "a"), tasks(2), agent)
    run_study(_config(tmp_path, state_dir=tmp_path / "b"), tasks(2), agent)  # the first state directory was lost
    runs = _runs(tmp_path)
    assert len(runs) == 4 and len({t.trace_id for t in runs}) == 4
    assert len({t.context["plumbline.study.instance"] for t in runs}) == 2
    for t in runs:  # never merged into one run that "paid twice"
        assert all(v.ok for _, v in evaluate(PAID_ONCE, t).verdicts)


def test_runners_opening_one_new_state_at_once_all_get_its_one_instance_and_key(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from plumbline_otel.replay.study import study_state

    for attempt in range(5):  # each a fresh state, opened by 8 at once (each made its own pair, the last write won)
        state = tmp_path / f"state{attempt}"
        with ThreadPoolExecutor(8) as pool:
            pairs = set(pool.map(study_state, [state] * 8))
        assert len(pairs) == 1, pairs
        assert pairs == {study_state(state)}  # and the one the file keeps


def test_two_concurrent_resume_processes_do_not_both_run_the_trials(tmp_path: Path) -> None:
    otlp = str(tmp_path / "replay.otlp.jsonl")
    argv = [sys.executable, "-m", "tests.replay.study_proc", str(tmp_path / "state"), otlp, "resume", "0.1"]
    procs = [subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    finished = [p.communicate(timeout=EVENT_DEADLINE_S) for p in procs]  # ends when they do: this only bounds a hang
    assert all(out.strip() for out, _ in finished), [err[-2000:] for _, err in finished]
    outs = [json.loads(out.strip().splitlines()[-1]) for out, _ in finished]
    ran = [o for o in outs if "ran" in o]
    locked = [o for o in outs if "locked" in o]
    # Either the second was refused while the first ran, or it came after and found all done.
    assert len(ran) >= 1
    total = [tid for o in ran for tid in o["ran"]]
    assert len(total) == len(set(total)) == 16
    assert all("is being run by" in o["locked"] for o in locked)  # by "pid N", or by "another process" in the instant before it wrote its pid
    trials = [t.context["plumbline.trial.id"] for t in _runs(tmp_path)]
    assert len(trials) == 16 and len(set(trials)) == 16
    assert sorted(r.trial_id for r in driver_records(_stored(tmp_path), KeyRing.load([tmp_path / "state"]))) == sorted(trials)  # one attempt each


def test_a_crashed_runner_does_not_hold_the_study(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from plumbline_otel.replay import StudyLock; "
        f"StudyLock({str(tmp_path)!r}, 'x').acquire(); print('held', flush=True); time.sleep(600)")],  # killed below, however slowly
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    with pytest.raises(StudyLocked, match=f"pid {holder.pid}"):
        StudyLock(tmp_path, "x").acquire()
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    with StudyLock(tmp_path, "x"):  # the kernel dropped the dead runner's lock
        pass


class HalfSilent(ToyAgent):
    """Runs every trial, but exports the spans of only every other one (an exporter that drops)."""

    def run(self, trial: Trial) -> TrialOutcome:
        if int((trial.identity.task_key or "0")[-1]) % 2:
            self.seen.append({"trial_id": trial.trial_id, "silent": True})
            return TrialOutcome(trace_id=trial.trace_id)
        return super().run(trial)


def test_a_trial_whose_trace_never_arrived_is_errored_and_resume_does_not_run_it_again(tmp_path: Path) -> None:
    summary = run_study(_config(tmp_path, repeats=2, trace_wait_s=0.05), tasks(8), HalfSilent())
    assert (summary.ok, summary.errored, summary.missing) == (8, 8, 0)
    silent = [r for r in summary.records if r.status == "errored"]
    assert all(r.reason and r.reason.startswith("no trace received") for r in silent)
    with Store(tmp_path / "p.duckdb") as store:
        ingest_files(store, [str(tmp_path / "replay.otlp.jsonl")])
        decided, only_missing = stored_trials(store, "t", summary.keys)
        records = driver_records(store.trajectories(), summary.keys)
    assert len(decided) == 16 and not only_missing
    assert sorted(r.status for r in records) == ["errored"] * 8 + ["ok"] * 8

    # The errored trials are results (no re-running until they pass); resume has nothing left to do.
    again = run_study(_config(tmp_path, repeats=2, resume=True), tasks(8), ToyAgent())
    assert (again.skipped, again.ok, again.errored) == (16, 0, 0)


def test_a_tool_fault_run_carries_the_driver_s_fault_evidence(tmp_path: Path) -> None:
    summary = run_study(_config(tmp_path, perturbations=("tool_fault",), repeats=2), tasks(2), ToyAgent())
    assert summary.ok == 4 and [r.fault_fired for r in summary.records] == [True] * 4
    for t in _runs(tmp_path):
        plan = FaultPlan.parse(str(t.context["plumbline.fault"])) if "plumbline.fault" in t.context else None
        tool, error = t.context["plumbline.fault.tool"], t.context["plumbline.fault.error"]
        assert plan is None or plan.tool == tool
        failed = [s for s in t.tool_steps if s.failed and s.name == tool]
        assert failed and error in (failed[0].error or "")
        assert t.context["plumbline.fault.fired"] is True
    assert str(InjectedFault(FaultPlan("pay", "429"))) == FaultPlan("pay", "429").error_message


def test_an_agent_that_ignores_the_fault_is_not_recorded_as_fired(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from . import toy

    monkeypatch.setattr(toy, "inject_fault", lambda tool: None)  # an agent whose tools skip the wrapper
    summary = run_study(_config(tmp_path, perturbations=("tool_fault",), repeats=3), tasks(2), ToyAgent())
    assert summary.ok == 6 and [r.fault_fired for r in summary.records] == [False] * 6
    assert "fire in 0/6 faulted trials" in summary.render()
    for t in _runs(tmp_path):
        assert t.context.get("plumbline.fault.fired") in (None, False)
        assert not [s for s in t.tool_steps if s.failed]


def test_an_attempt_a_dead_runner_left_unfinished_is_recorded_missing_and_runs_again(tmp_path: Path) -> None:
    from plumbline_otel.replay import Ledger, plan_study

    first = run_study(_config(tmp_path), tasks(2), ToyAgent())
    assert first.ok == 2
    # A runner that died in attempt 2 of a third trial left a "started" row and nothing after it.
    orphan = plan_study(_config(tmp_path), tasks(3)).trials[2].trial_id
    ledger = Ledger(tmp_path / "state" / "ledger.jsonl")
    ledger.append({"trial_id": orphan, "attempt": 1, "status": "started", "pid": 999998})
    ledger.append({"trial_id": orphan, "attempt": 2, "status": "started", "pid": 999999})
    again = run_study(_config(tmp_path, resume=True), tasks(3), ToyAgent())
    assert [(r.trial_id, r.attempt, r.status) for r in again.recovered] == [(orphan, 2, "missing")]
    assert "interrupted: runner pid 999999 stopped during attempt 2" in again.render()
    assert again.skipped == 2 and [(r.trial_id, r.attempt, r.status) for r in again.records] == [(orphan, 3, "ok")]
    recorded = [(r.status, r.attempt) for r in driver_records(_stored(tmp_path), again.keys) if r.trial_id == orphan]
    assert sorted(recorded) == [("missing", 2), ("ok", 3)]


def test_ctrl_c_lets_running_trials_finish_and_records_the_queued_ones_missing(tmp_path: Path) -> None:
    import os
    import signal

    class Interrupting(ToyAgent):
        def run(self, trial: Trial) -> TrialOutcome:
            if trial.identity.task_key == "INV-1001":
                time.sleep(0.05)  # the study loop is waiting on its trials by now
                os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C: it wakes the waiting main thread at once
                time.sleep(0.2)
            return super().run(trial)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # a shell's background job starts with SIGINT ignored
    try:
        with pytest.raises(KeyboardInterrupt):
            run_study(_config(tmp_path, concurrency=1), tasks(6), Interrupting())
    finally:
        signal.signal(signal.SIGINT, previous)
    from plumbline_otel.replay import Ledger

    latest = Ledger(tmp_path / "state" / "ledger.jsonl").latest()
    statuses = [row["status"] for row in latest.values()]
    # the trial running when Ctrl-C arrived (and at most the one the worker took next) finished
    assert len(statuses) == 6 and 2 <= statuses.count("ok") <= 3 and statuses.count("missing") >= 3
    assert all(row["reason"] == "not started: interrupted" for row in latest.values() if row["status"] == "missing")
