"""Conformance over runs: summaries, missing trials, and violations stored idempotently in DuckDB."""

import json

import duckdb
from click.testing import CliRunner

from plumbline_otel.analyse.conformance import check, evaluate, render_text, write_violations
from plumbline_otel.cli.check import check as check_cmd
from plumbline_otel.cli.options import parse_since
from plumbline_otel.runs import fault_exposed, is_errored, is_missing, run_status, strict_bool
from plumbline_otel.spec import ArgEquals, MustCall, MustNotCall, Ordering, Rule, Spec, invariant, parse_spec
from plumbline_otel.spec.testing import call, run, span_records
from plumbline_otel.store import Store

SPEC = Spec.of(
    "t",
    [
        invariant("VENDOR-FIRST", Ordering(("check_vendor_status", "schedule_payment"))),
        invariant("AMOUNT", ArgEquals("schedule_payment", "amount", from_context="payable", rule=Rule("number")), when={"action": "pay"}),
        invariant("NO-PAY-HELD", MustNotCall("schedule_payment"), when={"action": "hold"}),
        invariant("AUDIT", MustCall("post_audit_log"), severity="minor"),
    ],
    context_provider=lambda task: {"T-PAY": {"action": "pay", "payable": 100}, "T-HOLD": {"action": "hold"}}.get(task, {}),
)


def good(task="T-PAY"):
    return run(call("check_vendor_status"), call("schedule_payment", {"amount": 100}), call("post_audit_log"), task=task)


def bad_amount():
    return run(call("check_vendor_status"), call("schedule_payment", {"amount": 1000}), task="T-PAY")


def test_evaluate_reports_violations_most_severe_first():
    result = evaluate(SPEC, bad_amount())
    assert [i.id for i, _ in result.violations] == ["AMOUNT", "AUDIT"]
    assert not result.conforms("critical") and not result.conforms("minor")
    assert evaluate(SPEC, good()).conforms("minor")


def test_summary_counts_applicability_tasks_and_one_example():
    held_paid = run(call("schedule_payment", {"amount": 5}), call("post_audit_log"), task="T-HOLD")
    summary = check(SPEC, [good(), bad_amount(), bad_amount(), held_paid])
    amount = summary.invariants["AMOUNT"]
    assert (amount.applicable, amount.failed, len(amount.tasks)) == (3, 2, 1)
    assert amount.example is not None and amount.example["step_index"] == 1 and "10× too large" in amount.example["detail"]
    held = summary.invariants["NO-PAY-HELD"]
    assert (held.applicable, held.failed) == (1, 1)
    assert (summary.runs, summary.critical_conforming) == (4, 1)
    text = render_text(summary)
    assert "CRITICAL" in text and "AMOUNT" in text and "10× too large" in text


def test_missing_trials_are_counted_apart_and_not_judged():
    missing = run(task="T-PAY", plumbline__trial__status="missing")
    summary = check(SPEC, [good(), missing])
    assert (summary.runs, summary.missing, summary.critical_conforming) == (1, 1, 1)
    assert summary.invariants["AUDIT"].failed == 0


def test_runs_no_invariant_applies_to_are_reported():
    spec = Spec.of("t", [invariant("X", MustNotCall("pay"), when={"action": "hold"})])
    summary = check(spec, [run(task="unknown")])
    assert summary.not_covered == 1 and summary.invariants["X"].applicable == 0


def test_writing_violations_twice_adds_nothing_twice(tmp_path):
    path = str(tmp_path / "v.duckdb")
    results = [evaluate(SPEC, t) for t in (good(), bad_amount(), bad_amount())]
    with Store(path) as store:
        first = write_violations(store, results, SPEC.hash)
        write_violations(store, results, SPEC.hash)
    con = duckdb.connect(path)
    assert first == 4
    assert con.execute("SELECT count(*) FROM violations").fetchall()[0][0] == 4
    con.close()


def test_a_run_that_now_conforms_loses_its_stale_violation(tmp_path):
    with Store(tmp_path / "v.duckdb") as store:
        t = bad_amount()
        write_violations(store, [evaluate(SPEC, t)], SPEC.hash)
        assert store.stored_violations(SPEC.hash, [t.trajectory_id]) == {(t.trajectory_id, "AMOUNT"), (t.trajectory_id, "AUDIT")}
        fixed = run(*good().steps, id=t.trajectory_id, task="T-PAY")
        write_violations(store, [evaluate(SPEC, fixed)], SPEC.hash)
        assert store.stored_violations(SPEC.hash, [t.trajectory_id]) == set()


def _store_with(path, trajectories):
    with Store(path) as store:
        for t in trajectories:
            store.write_spans(span_records(t))
        store.assemble()


SPEC_YAML = """
version: 1
name: cli
invariants:
  - {id: VENDOR-FIRST, severity: critical, ordering: [check_vendor_status, schedule_payment]}
  - {id: AUDIT, severity: minor, must_call: post_audit_log}
"""


def test_check_command_on_a_real_store_is_idempotent(tmp_path):
    db = str(tmp_path / "p.duckdb")
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(SPEC_YAML)
    paid_first = run(call("schedule_payment"), call("check_vendor_status"), call("post_audit_log"), task="A")
    _store_with(db, [good("A"), paid_first, run(call("check_vendor_status"), task="B")])
    runner = CliRunner()
    first = runner.invoke(check_cmd, ["--spec", str(spec_path), "--db", db, "--format", "json"])
    assert first.exit_code == 0, first.output
    data = json.loads(first.output)
    assert data["runs"] == 3 and data["violations_written"] == 2
    critical = {t["id"]: t for t in data["by_severity"]["critical"]}
    assert critical["VENDOR-FIRST"]["failed"] == 1 and critical["VENDOR-FIRST"]["example"]["step_index"] == 0
    again = runner.invoke(check_cmd, ["--spec", str(spec_path), "--db", db])
    assert again.exit_code == 0 and "VENDOR-FIRST" in again.output
    con = duckdb.connect(db)
    rows = con.execute("SELECT invariant_id, severity, step_index, step_name FROM violations ORDER BY 1").fetchall()
    assert rows == [("AUDIT", "minor", None, "post_audit_log"), ("VENDOR-FIRST", "critical", 0, "schedule_payment")]
    con.close()
    tripped = runner.invoke(check_cmd, ["--spec", str(spec_path), "--db", db, "--fail-on", "critical"])
    assert tripped.exit_code == 3


def test_since_accepts_iso_times_and_ages():
    assert parse_since("1970-01-01T00:00:01Z") == 1_000_000_000
    assert parse_since("24h", now_ns=100 * 3600 * 10**9) == 76 * 3600 * 10**9
    assert parse_since(None) is None
    import pytest

    from plumbline_otel.errors import ConfigError

    with pytest.raises(ConfigError):
        parse_since("last tuesday")


def test_spec_from_yaml_checks_like_the_python_form():
    spec = parse_spec(SPEC_YAML)
    summary = check(spec, [good("A")])
    assert summary.critical_conforming == 1


# ---- run status: missing / errored / exposure (issue 8) ------------------------------------------

FAULT_MSG = "503 Service Unavailable: the check_duplicate backend is temporarily unavailable"


def faulted(*steps, **ctx):
    return run(*steps, plumbline__perturbation="tool_fault", plumbline__fault__tool="check_duplicate",
               plumbline__fault__error=FAULT_MSG, **ctx)


def test_strict_bool_reads_only_true_false_one_and_zero():
    for value, expected in ((True, True), ("true", True), (" TRUE ", True), (1, True), ("1", True),
                            (False, False), ("false", False), (0, False), ("0", False),
                            ("no", None), ("yes", None), (2, None), ("", None), (None, None), (1.0, None)):
        assert strict_bool(value) is expected, value


def test_a_tool_fault_run_is_exposed_only_on_positive_evidence():
    hit = faulted(call("check_duplicate", error=f"ToolError: {FAULT_MSG}"), call("post_audit_log"))
    assert fault_exposed(hit) and run_status(hit) == "exposed"
    # The agent never called the targeted tool, or called it and it succeeded: the fault never hit.
    for steps in ((call("post_audit_log"),), (call("check_duplicate"), call("post_audit_log"))):
        assert run_status(faulted(*steps)) == "unexposed"
    # A failure of the tool with some other error, or of another tool with the injected text, is not the fault.
    assert run_status(faulted(call("check_duplicate", error="KeyError: vendor"))) == "unexposed"
    assert run_status(faulted(call("validate_po", error=FAULT_MSG))) == "unexposed"
    # The driver's own word: fired strictly true exposes; "0", "no", 0, absent do not.
    assert run_status(run(call("x"), plumbline__perturbation="tool_fault", plumbline__fault__fired="true")) == "exposed"
    for value in (False, 0, "0", "no", "yes", None):
        assert run_status(run(call("x"), plumbline__perturbation="tool_fault", plumbline__fault__fired=value)) == "unexposed"
    # Other perturbations need no fault evidence.
    assert run_status(run(call("x"), plumbline__perturbation="paraphrase")) == "exposed"
    assert run_status(run(call("x"), plumbline__perturbation="baseline", plumbline__fault__fired=False)) == "exposed"


def test_errored_and_missing_markers_and_the_legacy_error_value():
    assert run_status(run(plumbline__trial__status="missing")) == "missing"
    for value in ("errored", "error", "ERRORED"):
        marker = run(plumbline__trial__status=value, plumbline__perturbation="tool_fault")
        assert is_errored(marker) and not is_missing(marker) and run_status(marker) == "errored"


def test_check_counts_errored_trials_apart_from_missing_ones():
    data = [run(call("a")), run(plumbline__trial__status="missing"), run(plumbline__trial__status="error"),
            run(plumbline__trial__status="errored")]
    summary = check(Spec.of("s", [invariant("A", MustCall("a"))]), data)
    assert (summary.runs, summary.missing, summary.errored) == (1, 1, 2)
    assert "errored trials (started, no run to judge" in render_text(summary)
