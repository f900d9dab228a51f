"""Sequential studies: a cell stops as soon as its anytime-valid bound decides it, and the certificate stays valid."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from plumbline_otel.cli.main import cli
from plumbline_otel.replay import StudyConfig
from plumbline_otel.replay.sequential import SequentialStop, order_seed, task_order, task_rank
from plumbline_otel.store import Store

from .toy import ToyAgent, agent_runs, tasks, traffic_store

SPEC = """version: 1
name: toy
invariants:
  - {id: PAY, severity: critical, must_call: pay}
"""


class PaysUnlessDistracted(ToyAgent):
    """Clean on baseline; under distractor it never pays (a failing cell)."""

    def run(self, trial):
        self.tools = ("lookup_invoice",) if trial.identity.perturbation == "distractor" else ("lookup_invoice", "pay")
        return super().run(trial)


def _traffic(tmp_path: Path, n: int) -> Path:
    (tmp_path / "spec.yaml").write_text(SPEC)
    return traffic_store(tmp_path, n)


def test_a_failing_cell_stops_early_and_its_certificate_uses_the_anytime_bound(tmp_path: Path) -> None:
    db = _traffic(tmp_path, 40)
    spans = tmp_path / "seq.jsonl"
    runner = CliRunner()
    result = runner.invoke(cli, ["replay", "--db", str(db), "--study", "seq", "--agent", "toy-agent",
                                 "--adapter", "python:tests.replay.test_sequential:PaysUnlessDistracted",
                                 "--perturbations", "baseline,distractor", "--otlp-file", str(spans), "--spec", str(tmp_path / "spec.yaml"),
                                 "--target", "0.8", "--min-tasks", "5", "--concurrency", "1", "--quiet"])
    assert result.exit_code == 0, result.output
    # Failing from the first task, distractor is decided at --min-tasks; clean baseline passes 0.8 at 17 tasks.
    assert "sequential: distractor was decided FAIL against 0.8 after 5 task(s)" in result.output
    assert "sequential: baseline was decided PASS against 0.8 after 17 task(s)" in result.output
    summary = json.loads((db.with_suffix("").parent / "p.replay" / "seq" / "summary.json").read_text())
    assert (summary["ok"], summary["stopped"]) == (22, 58)  # 80 planned: 17 + 5 ran
    assert runner.invoke(cli, ["ingest", str(spans), "--db", str(db), "--quiet"]).exit_code == 0
    out = tmp_path / "cert.json"
    assert runner.invoke(cli, ["certify", "--spec", str(tmp_path / "spec.yaml"), "--db", str(db), "--study", "seq",
                               "--target", "0.8", "--out", str(out), "--format", "none"]).exit_code == 0
    cells = {c["perturbation"]: c for a in json.loads(out.read_text())["agents"] for c in a["perturbations"]}
    assert cells["distractor"]["gate_method"] == "betting_cs" and cells["distractor"]["verdict"] == "FAIL"
    assert (cells["distractor"]["n"], cells["distractor"]["stopped"], cells["distractor"]["missing"]) == (5, 35, 0)
    assert (cells["baseline"]["gate_method"], cells["baseline"]["verdict"], cells["baseline"]["stopped"]) == ("betting_cs", "PASS", 23)
    with Store(db) as store:
        ran = [t for t in agent_runs(store.trajectories()) if t.context.get("plumbline.study") == "seq"]
    assert len(ran) == 22  # the stopped trials never reached the agent


def test_the_stopping_rule_waits_for_whole_tasks_in_plan_order() -> None:
    from plumbline_otel.replay import plan_study

    plan = plan_study(StudyConfig("s", perturbations=("baseline",), repeats=2), tasks(6))
    stop = SequentialStop(plan.trials, target=0.9, min_tasks=2)
    by_task: dict[str, list] = {}
    for t in plan.trials:
        by_task.setdefault(t.identity.task_key or "", []).append(t)
    order = sorted(by_task)
    stop.finish(by_task[order[1]][0], False)  # a later task fails first: nothing is decided out of order
    stop.finish(by_task[order[1]][1], False)
    assert stop.stopped(plan.trials[0]) is None
    stop.finish(by_task[order[0]][0], False)
    assert stop.stopped(plan.trials[0]) is None  # the first task is not whole yet
    stop.finish(by_task[order[0]][1], False)
    assert stop.stopped(plan.trials[0]) is not None and "FAIL" in (stop.stopped(plan.trials[0]) or "")


class FailsLateKeys(ToyAgent):
    """Clean on the first 24 task keys in sorted order (INV-1000 ... INV-1023), never pays on the last 16."""

    def run(self, trial):
        late = int((trial.identity.task_key or "INV-0").split("-")[1]) >= 1024
        self.tools = ("lookup_invoice",) if late else ("lookup_invoice", "pay")
        return super().run(trial)


def test_a_sorted_key_study_is_judged_in_its_random_order_not_plan_order(tmp_path: Path) -> None:
    # Issue 38: in plan order (keys sorted) the 17 clean tasks first would PASS 0.8 while the true
    # mean is 0.6 (24 clean of 40). In the study's random order that needs the first 17 of 40 to be
    # 17 of the 24 clean ones (probability 3e-6), so a PASS here would mean the order is sorted.
    db = _traffic(tmp_path, 40)
    spans = tmp_path / "late.jsonl"
    runner = CliRunner()
    args = ["replay", "--db", str(db), "--study", "late", "--agent", "toy-agent",
            "--adapter", "python:tests.replay.test_sequential:FailsLateKeys", "--perturbations", "baseline",
            "--otlp-file", str(spans), "--spec", str(tmp_path / "spec.yaml"), "--target", "0.8", "--min-tasks", "5",
            "--concurrency", "1", "--quiet"]
    result = runner.invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "decided PASS" not in result.output
    state = db.with_suffix("").parent / "p.replay" / "late"
    seed = json.loads((state / "study.json").read_text())["order_seed"]
    assert isinstance(seed, str) and len(seed) == 32
    # The trials ran in the recorded order: whole tasks, ranked by the seed, not by key.
    assert runner.invoke(cli, ["ingest", str(spans), "--db", str(db), "--quiet"]).exit_code == 0
    with Store(db) as store:
        ran = sorted((t for t in agent_runs(store.trajectories()) if t.context.get("plumbline.study") == "late"),
                     key=lambda t: t.start_ns or 0)
    keys = list(dict.fromkeys(t.task_key or "" for t in ran))
    assert keys == sorted(keys, key=lambda k: task_rank(seed, k or "")) and keys != sorted(keys)


def test_a_resumed_study_keeps_its_order_and_a_new_task_does_not_move_the_others(tmp_path: Path) -> None:
    from plumbline_otel.replay import plan_study
    from plumbline_otel.replay.runner import study_state

    first = study_state(tmp_path / "state")
    seed = order_seed(tmp_path / "state", first[0])
    assert study_state(tmp_path / "state") == first and order_seed(tmp_path / "state", first[0]) == seed
    plan = plan_study(StudyConfig("s", perturbations=("baseline",), repeats=2), tasks(12))
    ordered = [t.identity.task_key or "" for t in task_order(plan.trials, seed)]
    assert ordered != sorted(ordered) and all(ordered[i] == ordered[i + 1] for i in range(0, 24, 2))  # whole tasks
    again = [t.identity.task_key for t in task_order(list(reversed(plan.trials))[5:], seed)]
    order = list(dict.fromkeys(ordered))
    assert [k for k in order if k in again] == list(dict.fromkeys(again))  # resumed: the rest, same order
    more = plan_study(StudyConfig("s", perturbations=("baseline",), repeats=2), tasks(15))
    grown = [t.identity.task_key for t in task_order(more.trials, seed)]
    assert [k for k in dict.fromkeys(grown) if k in order] == order  # added tasks slot in, the others keep their order
    assert order_seed(tmp_path / "elsewhere", "instance-id") == "instance-id"


def test_following_the_advice_continues_a_fixed_n_study_as_a_sequential_one(tmp_path: Path) -> None:
    # Issue 38 item 3: a fixed-n study is INCONCLUSIVE; the advice names a procedure that keeps its
    # error (continue as a sequential study) and says plainly that gating it again does not. Followed
    # through the CLI, the certificate over all the tasks uses the anytime-valid bound and settles it.
    import re

    db = _traffic(tmp_path, 40)
    spans, spec, cert = tmp_path / "adv.jsonl", str(tmp_path / "spec.yaml"), tmp_path / "cert.json"
    runner = CliRunner()
    base = ["replay", "--db", str(db), "--study", "adv", "--agent", "toy-agent", "--adapter", "python:tests.replay.toy:ToyAgent",
            "--perturbations", "baseline", "--otlp-file", str(spans), "--concurrency", "1", "--quiet"]
    first = runner.invoke(cli, [*base, "--task", ",".join(f"INV-{1000 + i}" for i in range(10))])
    assert first.exit_code == 0, first.output

    def certify() -> dict:
        assert runner.invoke(cli, ["ingest", str(spans), "--db", str(db), "--quiet"]).exit_code == 0
        done = runner.invoke(cli, ["certify", "--spec", spec, "--db", str(db), "--study", "adv", "--target", "0.8",
                                   "--out", str(cert), "--format", "none"])
        assert done.exit_code == 0, done.output
        return json.loads(cert.read_text())["agents"][0]["perturbations"][0]

    cell = certify()
    assert (cell["gate_method"], cell["verdict"], cell["tasks"]) == ("wilson_tasks", "INCONCLUSIVE", 10)
    gated = runner.invoke(cli, ["gate", str(cert), "--min-bound", "0.8"])
    assert gated.exit_code == 3, gated.output
    assert "as a sequential study (plumbline replay --resume --target 0.8, with the new tasks)" in gated.output
    assert "adding tasks to this fixed-n study and gating it again with wilson_tasks does not keep its stated 5%" in gated.output
    found = re.search(r"(\d+) more distinct clean task\(s\) would settle it", gated.output)
    assert found is not None, gated.output
    more = int(found.group(1))
    assert more == cell["tasks_needed"] >= 1
    # Follow it: the same study, resumed as a sequential one over the new tasks.
    resumed = runner.invoke(cli, [*base, "--resume", "--spec", spec, "--target", "0.8", "--min-tasks", "5"])
    assert resumed.exit_code == 0, resumed.output
    cell = certify()
    assert cell["gate_method"] == "betting_cs" and cell["verdict"] == "PASS" and cell["tasks"] >= 10 + more
    assert runner.invoke(cli, ["gate", str(cert), "--min-bound", "0.8"]).exit_code == 0
