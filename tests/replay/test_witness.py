"""The driver is the witness: what happened in a trial is what the driver recorded, never what the agent's spans say.

Each case goes through the command line as a user would (`replay`, `ingest`, `certify`, `gate`),
with toy agents of each adapter kind that crash after exporting a clean run, hang, exit, lie about
their fault, redact it, or report costs above their maximum.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from plumbline_otel.cli.main import cli
from plumbline_otel.report import Certificate, build_certificate
from plumbline_otel.runs import (
    COST_METERED,
    COST_USD,
    FAULT_FIRED,
    FAULT_SOURCE,
    RECORD_AT,
    RECORD_KIND,
    TRIAL_REASON,
    TRIAL_STATUS,
    is_record,
)
from plumbline_otel.spec import load_spec
from plumbline_otel.store import Store

from .toy import ROOT, cell, driver_records, study


def command(mode: str) -> str:
    return f"command:{sys.executable} -m tests.replay.cmd_agent {mode}"


def test_a_command_agent_that_exits_1_after_exporting_is_errored_and_fails_the_gate(tmp_path: Path, db: Path) -> None:
    replayed, cert, gate = study(tmp_path, db, command("crash"), "--adapter-option", f"cwd={ROOT}")
    assert replayed.exit_code == 3 and "ran 4 (0 ok, 0 missing, 4 errored)" in replayed.output
    c = cell(cert)
    # Before: the agent's exported root outvoted the marker, and this certified 4/4 conforming.
    assert (c.n, c.conforming, c.errored, c.exposed) == (4, 0, 4, 0)
    assert all("command exited 1" in r.reason for r in c.errored_runs)
    assert gate.exit_code in (1, 3)  # FAIL or INCONCLUSIVE: never PASS on crashed trials


def test_a_command_agent_killed_by_the_timeout_is_errored(tmp_path: Path, db: Path) -> None:
    _, cert, gate = study(tmp_path, db, command("hang"), "--adapter-option", "timeout_s=1.5", "--adapter-option", f"cwd={ROOT}",
                          repeats=1)
    c = cell(cert)
    assert (c.n, c.conforming, c.errored) == (2, 0, 2)
    assert all("timed out" in r.reason for r in c.errored_runs) and gate.exit_code in (1, 3)


@pytest.mark.parametrize("agent, why", [("CrashAfterExport", "RuntimeError"), ("ExitAfterExport", "SystemExit")])
def test_an_in_process_agent_that_raises_or_exits_after_exporting_is_errored_and_the_runner_survives(
        tmp_path: Path, db: Path, agent: str, why: str) -> None:
    replayed, cert, gate = study(tmp_path, db, f"python:tests.replay.toy:{agent}", perturbations="baseline,tool_fault")
    assert replayed.exit_code == 3 and "ran 8 (0 ok, 0 missing, 8 errored)" in replayed.output
    for perturbation in ("baseline", "tool_fault"):  # no cell vanishes with the runner
        c = cell(cert, perturbation)
        assert (c.n, c.errored, c.conforming) == (4, 4, 0)
        assert all(why in r.reason for r in c.errored_runs)
    assert gate.exit_code in (1, 3)  # FAIL or INCONCLUSIVE: never PASS on crashed trials


def test_a_fault_the_agent_claims_is_not_believed_and_the_conflict_is_reported(tmp_path: Path, db: Path) -> None:
    replayed, cert, gate = study(tmp_path, db, "python:tests.replay.toy:ClaimsFaults", perturbations="tool_fault")
    assert "fire in 0/4 faulted trials" in replayed.output
    c = cell(cert, "tool_fault")
    assert (c.n, c.unexposed, c.exposed) == (0, 4, 0)  # before: 4/4 conforming on the agent's word
    assert len(c.notes) == 8 and all("conflict" in n.note for n in c.notes)  # its spans and its adapter, per trial
    assert gate.exit_code in (1, 3)  # FAIL or INCONCLUSIVE: never PASS on crashed trials


def test_a_command_agent_that_claims_its_fault_is_unexposed(tmp_path: Path, db: Path) -> None:
    _, cert, _ = study(tmp_path, db, command("claim"), "--adapter-option", f"cwd={ROOT}", perturbations="tool_fault", repeats=1)
    c = cell(cert, "tool_fault")
    assert (c.n, c.unexposed) == (0, 2) and c.evidence_from == {}


def test_a_fault_the_framework_redacts_is_exposed_on_the_driver_s_record(tmp_path: Path, db: Path) -> None:
    _, cert, _ = study(tmp_path, db, "python:tests.replay.toy:RedactsErrors", perturbations="tool_fault")
    c = cell(cert, "tool_fault")
    # Before: "4 tool_fault runs never met their fault", though the driver saw it fire in each.
    assert (c.n, c.exposed, c.unexposed, c.conforming) == (4, 4, 0, 4)
    assert c.evidence_from == {"injector": 4}
    assert len(c.notes) == 4 and all("unconfirmed by the trace" in n.note for n in c.notes)


def test_a_self_reported_cost_above_the_maximum_stops_the_study_and_is_marked_unmetered(tmp_path: Path, db: Path) -> None:
    replayed, cert, _ = study(tmp_path, db, command("overspend"), "--adapter-option", f"cwd={ROOT}", "--concurrency", "1",
                              "--budget-usd", "6", "--trial-max-usd", "0.5")
    assert "OVERRUN" in replayed.output and "UNMETERED: 1 trial(s)" in replayed.output
    c = cell(cert)
    assert (c.n, c.missing) == (1, 3)  # the study stopped before the next trial: the rest are missing
    assert c.unmetered == 1 and c.cost_usd == pytest.approx(5.0)
    assert all("not started" in r.reason for r in c.missing_runs)


def test_no_agent_written_attribute_changes_a_trial_s_status_exposure_or_cost(tmp_path: Path, db: Path) -> None:
    study(tmp_path, db, "python:tests.replay.toy:ToyAgent", perturbations="baseline,tool_fault", name="honest")
    spec = load_spec(tmp_path / "spec.yaml")
    with Store(db) as store:
        stored, keys = list(store.trajectories()), store.study_keys()
    honest = build_certificate(spec, stored, study="honest", keys=keys)
    lies = {TRIAL_STATUS: "missing", TRIAL_REASON: "nothing happened", FAULT_FIRED: False, FAULT_SOURCE: "mcp_proxy",
            COST_USD: 99.0, COST_METERED: True, RECORD_KIND: "attempt"}
    forged = [t if is_record(t) else replace(t, context={**t.context, **lies}) for t in stored]
    lied = build_certificate(spec, forged, study="honest", keys=keys)

    def counts(cert: Certificate) -> list[tuple[Any, ...]]:
        return [(c.perturbation, c.n, c.conforming, c.exposed, c.errored, c.unexposed, c.missing,
                 c.cost_usd, c.unmetered, c.evidence_from) for a in cert.agents for c in a.perturbations]

    assert counts(lied) == counts(honest)
    assert counts(honest) == [("baseline", 4, 4, 4, 0, 0, 0, 0.0, 0, {}), ("tool_fault", 4, 4, 4, 0, 0, 0, 0.0, 0, {"injector": 4})]
    assert all("conflict" in n.note for n in cell(lied, "tool_fault").notes)  # the lie is reported, not believed


def test_an_isolated_agent_that_kills_its_interpreter_is_errored_and_the_rest_of_the_study_runs(tmp_path: Path, db: Path) -> None:
    replayed, cert, _ = study(tmp_path, db, "python:tests.replay.toy:DiesAfterExport", "--isolate", "--concurrency", "2",
                              perturbations="baseline,tool_fault")
    assert replayed.exit_code == 3 and "ran 8 (4 ok, 0 missing, 4 errored)" in replayed.output
    for perturbation in ("baseline", "tool_fault"):
        c = cell(cert, perturbation)
        assert (c.n, c.errored, c.conforming) == (4, 2, 2)
        assert all("exited with code 1" in r.reason for r in c.errored_runs)
    # the driver's injector fired in the child, and the child's word reached the parent's record
    assert cell(cert, "tool_fault").evidence_from == {"injector": 2}


def test_isolate_is_refused_for_agents_already_in_their_own_process(tmp_path: Path, db: Path) -> None:
    result = CliRunner().invoke(cli, ["replay", "--db", str(db), "--study", "x", "--adapter", command("ok"), "--isolate",
                                      "--otlp-file", str(tmp_path / "x.jsonl")])
    assert result.exit_code == 1 and "--isolate applies to python: adapters" in str(result.exception)


def test_a_record_the_agent_forges_in_its_own_trace_is_not_the_driver_s(tmp_path: Path, db: Path) -> None:
    study(tmp_path, db, "python:tests.replay.toy:ToyAgent", name="honest")
    spec = load_spec(tmp_path / "spec.yaml")
    with Store(db) as store:
        stored, keys = list(store.trajectories()), store.study_keys()
    honest = build_certificate(spec, stored, study="honest", keys=keys)
    # An agent that exports, in its attempt's trace, a span with no steps dressed as an earlier record saying it errored.
    forged = [t if is_record(t) else replace(t, steps=(), context={**t.context, RECORD_KIND: "attempt", TRIAL_STATUS: "errored",
                                                                   TRIAL_REASON: "forged", RECORD_AT: 1})
              for t in stored]
    assert [r.trial_id for r in driver_records(forged, keys)] == [r.trial_id for r in driver_records(stored, keys)]  # no new record
    lied = build_certificate(spec, forged + [t for t in stored if not is_record(t)], study="honest", keys=keys)
    assert cell(lied, "baseline").errored == cell(honest, "baseline").errored == 0


def test_a_trial_whose_only_late_evidence_is_plumbline_s_own_is_never_errored_for_it(tmp_path: Path) -> None:
    from plumbline_otel.replay import SpanSink, StudyConfig, TrialOutcome, run_study

    from .toy import StandInProxy, tasks

    # the model proxy served every call of the attempt and wrote their spans into its trace; they reach the sink only
    # later (ingest under load): what it witnessed reaches the driver directly
    config = StudyConfig("p", sink=SpanSink(otlp_file=str(tmp_path / "o.jsonl")), trace_wait_s=0.05, grace_s=0.0,
                         proxies=[StandInProxy("model_proxy", {"calls": 2})])
    summary = run_study(config, tasks(3), lambda trial: TrialOutcome(output="done"))  # exports nothing itself
    assert (summary.ok, summary.errored) == (3, 0)


def test_a_trial_whose_trace_holds_several_turns_is_judged_on_all_of_them(tmp_path: Path, db: Path) -> None:
    from plumbline_otel.trials import account

    study(tmp_path, db, "python:tests.replay.toy:ToyAgent", name="turns")
    with Store(db) as store:
        stored, keys = list(store.trajectories()), store.study_keys()
    whole = {r.trial_id: r.run for r in account(stored, keys).results}
    # the same traces assembled as a conversation of two turns each (a run per turn, assemble rule 6)
    turns: list[Any] = []
    for t in stored:
        if is_record(t) or len(t.steps) < 2:
            turns.append(t)
            continue
        half = len(t.steps) // 2
        turns += [replace(t, trajectory_id=t.trace_id + ":turn:1", steps=t.steps[:half], end_ns=t.start_ns + 1),
                  replace(t, trajectory_id=t.trace_id + ":turn:2", steps=t.steps[half:], start_ns=t.start_ns + 1)]
    split = account(turns, keys)
    assert split.unwitnessed == [] and len(split.results) == len(whole)
    for r in split.results:
        before = whole[r.trial_id]
        assert r.run is not None and before is not None
        assert [s.name for s in r.run.steps] == [s.name for s in before.steps]  # both turns, in order
