"""certify and gate on runs whose fault never fired (or that carry no evidence it did): they are not in n,
so they never pass a gate."""

from typing import Any

from click.testing import CliRunner

from plumbline_otel.cli.certify import certify
from plumbline_otel.cli.gate import gate
from plumbline_otel.report import build_certificate, load_certificate
from plumbline_otel.spec import MustCall, Spec, invariant
from plumbline_otel.spec.testing import call, run, span_records
from plumbline_otel.store import Store

SPEC = Spec.of("g", [invariant("AUDIT", MustCall("post_audit_log"))])
SPEC_YAML = "version: 1\nname: g\ninvariants:\n  - {id: AUDIT, severity: critical, must_call: post_audit_log}\n"


def runs(perturbation, conforming, n, start=0, **ctx):
    return [
        run(*([call("post_audit_log")] if i < conforming else []), task=f"T{start + i}", id=f"{perturbation}-{start + i}",
            plumbline__perturbation=perturbation, **ctx)
        for i in range(n)
    ]


def write_cert(tmp_path, cert):
    path = tmp_path / "cert.json"
    path.write_text(cert.to_json())
    return str(path)


def test_clean_unexposed_runs_cannot_carry_a_cell_over_the_gate(tmp_path):
    # 80 clean tool_fault runs would pass 0.95 (Wilson lower 0.954), but only 40 met their fault.
    data = runs("baseline", 80, 80) + runs("tool_fault", 40, 40, plumbline__fault__fired=True) + runs(
        "tool_fault", 40, 40, start=40, plumbline__fault__fired=False)
    result = CliRunner().invoke(gate, [write_cert(tmp_path, build_certificate(SPEC, data)), "--min-bound", "0.95"])
    assert result.exit_code == 3, result.output  # INCONCLUSIVE: never PASS on runs the fault missed
    assert "INCONCLUSIVE agent / tool_fault: 40/40 conforming" in result.output
    assert "n=40 (40 exposed + 0 errored) from 40 task(s), 0 missing, 40 unexposed" in result.output
    # The tasks it needs come from the exposed tasks alone: 73 clean tasks in all, 33 more than the 40 exposed.
    assert "33 more clean task(s) in the cell that needs the most" in result.output
    # Without the attribute there is no evidence either: before issue 8 these 80 runs passed 0.95.
    bare = [run(*t.steps, task=t.task_key, id=t.trajectory_id, plumbline__perturbation="tool_fault") for t in data[80:]]
    result = CliRunner().invoke(gate, [write_cert(tmp_path, build_certificate(SPEC, data[:80] + bare)), "--min-bound", "0.95"])
    assert result.exit_code == 3 and "no evidence: no scored run, it certifies nothing" in result.output


def test_gate_passes_when_the_exposed_runs_alone_reach_the_bound(tmp_path):
    data = runs("baseline", 80, 80) + runs("tool_fault", 73, 73, plumbline__fault__fired=True) + runs(
        "tool_fault", 10, 10, start=73, plumbline__fault__fired=False)
    result = CliRunner().invoke(gate, [write_cert(tmp_path, build_certificate(SPEC, data)), "--min-bound", "0.95"])
    assert result.exit_code == 0, result.output
    assert "PASS         agent / tool_fault: 73/73 conforming" in result.output
    assert "errored runs 0 (in n, failures), missing trials 0 and unexposed runs 10 (not in n)" in result.output


def test_gate_is_inconclusive_on_a_cell_with_no_exposed_run(tmp_path):
    data = runs("baseline", 80, 80) + runs("tool_fault", 30, 30, plumbline__fault__fired=False)
    result = CliRunner().invoke(gate, [write_cert(tmp_path, build_certificate(SPEC, data)), "--min-bound", "0.5"])
    assert result.exit_code == 3, result.output  # no evidence is never a PASS
    assert "0/0 conforming" in result.output and "30 unexposed" in result.output


def _certify_stored(tmp_path, trajectories):
    """The runs written as span rows to a real store, then `plumbline certify` on it: its result and certificate path."""
    db = str(tmp_path / "p.duckdb")
    with Store(db) as store:
        for t in trajectories:
            store.write_spans(span_records(t))
        store.assemble()
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(SPEC_YAML)
    out = tmp_path / "cert.json"
    result = CliRunner().invoke(certify, ["--spec", str(spec_path), "--db", db, "--out", str(out)])
    assert result.exit_code == 0, result.output
    return result, out


def test_certify_reads_fault_fired_back_from_the_store(tmp_path):
    data = runs("tool_fault", 8, 10, plumbline__fault__fired=True, plumbline__fault__step=3) + runs(
        "tool_fault", 10, 10, start=10, plumbline__fault__fired=False) + runs("baseline", 10, 10)
    result, out = _certify_stored(tmp_path, data)
    assert "10 tool_fault runs never met their fault and are not scored" in result.output
    cert = load_certificate(out)
    cells = {c.perturbation: c for c in cert.cells}
    assert (cells["tool_fault"].n, cells["tool_fault"].conforming, cells["tool_fault"].unexposed) == (10, 8, 10)
    assert (cells["baseline"].n, cells["baseline"].unexposed) == (10, 0)
    assert cert.provenance.runs == 30 and cert.provenance.scored_runs == 20
    assert CliRunner().invoke(gate, [str(out), "--min-bound", "0.4"]).exit_code == 0
    # 8/10: Bentkus's upper end (issue 38 item 1) cannot show it below 0.95 with ten tasks, nor above: INCONCLUSIVE;
    # it is shown below 0.99
    assert CliRunner().invoke(gate, [str(out), "--min-bound", "0.95"]).exit_code == 3
    assert CliRunner().invoke(gate, [str(out), "--min-bound", "0.99"]).exit_code == 1


FAULT_MSG = "503 Service Unavailable: the post_audit_log backend is temporarily unavailable"


def test_certify_matches_the_injected_error_to_a_failed_step_in_the_store(tmp_path):
    # The driver records the fault's tool and text on the trial; only runs whose stored trace holds a
    # failed step of that tool with that text are exposed. Nothing says "fired" here.
    fault: dict[str, Any] = {"plumbline__fault__tool": "post_audit_log", "plumbline__fault__error": FAULT_MSG}
    hit = [run(call("post_audit_log", error=f"ToolError: {FAULT_MSG}"), *([call("post_audit_log")] if i < 6 else []),
               task=f"H{i}", id=f"hit-{i}", plumbline__perturbation="tool_fault", **fault) for i in range(8)]
    missed = [run(call("post_audit_log"), task=f"M{i}", id=f"miss-{i}", plumbline__perturbation="tool_fault", **fault)
              for i in range(5)]
    other_error = [run(call("post_audit_log", error="ToolError: 500 internal"), call("post_audit_log"), task="O0", id="other-0",
                       plumbline__perturbation="tool_fault", **fault)]
    result, out = _certify_stored(tmp_path, hit + missed + other_error)
    c = load_certificate(out).cells[0]
    assert (c.n, c.conforming, c.exposed, c.unexposed) == (8, 6, 8, 6)
    assert "6 tool_fault runs never met their fault and are not scored" in result.output
