"""Which runs of a certificate become evaluation events, and what each says (pure: no collector)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from plumbline_otel.evaluation_events import certificate_events
from plumbline_otel.model import Step, Trajectory
from plumbline_otel.report import Certificate, build_certificate
from plumbline_otel.report.model import Agent, AgentHeadline, Cell, PassK, RunReason
from plumbline_otel.spec import Spec, load_spec

SPEC = "version: 1\nname: pay\ninvariants:\n  - {id: MUST-PAY, severity: critical, must_call: pay}\n  - {id: LOG, severity: minor, must_call: log}\n"


def _run(run_id: str, perturbation: str, *tools: str, **context: str) -> Trajectory:
    steps = tuple(Step("tool_call", name, span_id=f"{i:016x}") for i, name in enumerate(tools))
    return Trajectory(run_id, run_id.ljust(32, "0"), f"task-{run_id}", "attribute:task", "agent", None, None, None, None, ("genai",),
                      steps, context={"plumbline.perturbation": perturbation, **context})


def _cell(**fields: Any) -> Cell:
    """A cell of the typed model: `fields`, the rest empty (the events read only what a test sets)."""
    empty: dict[str, Any] = {
        "rate": None, "task_rate": None, "verdict": "INCONCLUSIVE", "tasks": 0, "exposed": 0, "unexposed": 0, "errored": 0, "missing": 0,
        "lower_if_missing_failed": 0.0, "gate_lower_if_missing_failed": 0.0, "pass_k": PassK(k=0, value=None), "pass_k_curve": (),
        "flip_rate": None, "tasks_needed": None, "per_task": (), "violations": {}, "applicable": {}, "errored_runs": (),
        "unexposed_runs": (), "missing_runs": (), "unwitnessed": 0, "unwitnessed_runs": (), "witnessed": 0, "trace_judged": 0,
        "evidence_from": {}, "notes": (), "cost_usd": 0.0, "unmetered": 0, "stopped": 0}
    return Cell(**{**empty, **fields})


def _cert(cells: list[Cell], spec: Spec) -> Certificate:
    empty = build_certificate(spec, [])
    return dataclasses.replace(
        empty, target_bound=0.9, provenance=dataclasses.replace(empty.provenance, evidence_sha256="e" * 64),
        agents=(Agent(agent="agent", headline=AgentHeadline(lower_bound=0.0, method="wilson_tasks", cells=(), meets_target=False,
                                                            verdict="INCONCLUSIVE", tasks_needed=None, wilson_lower_bound=0.0),
                      perturbations=tuple(cells)),))


def test_only_scored_runs_become_events_and_errored_runs_fail_with_their_reason(tmp_path: Path) -> None:
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(SPEC)
    cell = _cell(agent="agent", perturbation="tool_fault", n=3, conforming=1, lower=0.1, upper=0.9, gate_lower=0.05, gate_upper=0.95,
                 gate_method="betting_cs", unexposed_runs=("t-unexposed",), errored_runs=(RunReason("t-errored", "adapter timed out"),))
    runs = [_run("ok", "tool_fault", "pay", **{"plumbline.trial.id": "t-ok"}),  # the minor LOG violation does not fail it
            _run("bad", "tool_fault", "lookup", **{"plumbline.trial.id": "t-bad"}),
            _run("err", "tool_fault", **{"plumbline.trial.id": "t-errored", "plumbline.trial.status": "errored"}),
            _run("unexp", "tool_fault", "pay", **{"plumbline.trial.id": "t-unexposed"}),
            _run("miss", "tool_fault", **{"plumbline.trial.id": "t-missing", "plumbline.trial.status": "missing"}),
            _run("other", "baseline", "pay")]  # a cell the certificate does not have
    spec = load_spec(spec_path)
    events = certificate_events(_cert([cell], spec), spec, runs, now_ns=7)
    assert [(e.name, e.attributes.get("plumbline.run.id"), e.score_value, e.score_label) for e in events] == [
        ("plumbline.certificate.lower_bound", None, 0.05, "fail"),
        ("plumbline.critical_conformance", "ok", 1.0, "pass"),
        ("plumbline.critical_conformance", "bad", 0.0, "fail"),
        ("plumbline.critical_conformance", "err", 0.0, "fail")]
    cell_event, ok, bad, errored = events
    assert cell_event.attributes["plumbline.bound.method"] == "betting_cs" and cell_event.trace_id is None
    assert cell_event.explanation == ("agent under tool_fault: 1 of 3 runs hold every critical invariant; "
                                      "lower 95% bound 0.0500 (betting_cs) against a target of 0.9000")
    # The gate's interval as the proposed score.ci.*, on the cell only; the evaluator's provenance on every event.
    assert {k: v for k, v in cell_event.otel_attributes().items() if ".ci." in k} == {
        "gen_ai.evaluation.score.ci.lower": 0.05, "gen_ai.evaluation.score.ci.upper": 0.95, "gen_ai.evaluation.score.ci.level": 0.95}
    assert not any(".ci." in k for k in ok.otel_attributes())
    assert {e.otel_attributes()["gen_ai.evaluation.evaluator.type"] for e in events} == {"deterministic"}
    assert {e.otel_attributes()["gen_ai.evaluation.evaluator.id"] for e in events} == {"plumbline"}
    assert errored.explanation == "the trial errored: adapter timed out"
    assert bad.explanation.startswith("violates MUST-PAY") and bad.trace_id == "bad".ljust(32, "0") and bad.span_id is None
    assert ok.explanation == "holds every critical invariant of pay"
    assert all(e.time_ns == 7 and e.attributes["plumbline.evidence.sha256"] == "e" * 64 for e in events)
