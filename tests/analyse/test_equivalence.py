"""Equivalence of two agents on effect paths, outcomes and a paired conformance test."""

from typing import Any

from click.testing import CliRunner

from plumbline_otel.analyse.equivalence import equivalence, render_text
from plumbline_otel.spec import parse_spec
from plumbline_otel.spec.testing import call, llm, run, span_records

SPEC = parse_spec(
    "version: 1\nname: eq\neffect_tools: [schedule_payment, flag_exception, post_audit_log]\n"
    "invariants:\n  - {id: AUDIT, severity: critical, must_call: post_audit_log}\n"
)


def a_run(task="T1", pert="baseline", repeat=0, outcome="paid:100"):
    return run(llm(), call("get_invoice"), llm(), call("schedule_payment", {"amount": 100}), call("post_audit_log"),
               service="old", task=task, plumbline__perturbation=pert, plumbline__variant="0",
               plumbline__trial__repeat=repeat, plumbline__outcome=outcome)


def b_run(*steps, task="T1", pert="baseline", repeat=0, outcome="paid:100", **ctx):
    return run(*steps, service="new", task=task, plumbline__perturbation=pert, plumbline__variant="0",
               plumbline__trial__repeat=repeat, plumbline__outcome=outcome, **ctx)


def test_deliberation_steps_are_not_compared_only_effects():
    same = b_run(call("schedule_payment", {"amount": 100}), call("post_audit_log"))  # no get_invoice, no llm
    report = equivalence([a_run(), same], "old", "new", SPEC).as_dict()
    assert report["same_effect_path"] == 1 and report["same_arguments"] == 1 and report["divergences"] == []


def test_divergences_are_localised_and_grouped():
    runs = [a_run(repeat=i) for i in range(2)]
    runs += [
        b_run(call("schedule_payment", {"amount": 100}), repeat=0, outcome="paid:100"),  # skipped audit
        b_run(call("flag_exception"), call("post_audit_log"), repeat=1, outcome="held"),  # substituted
        b_run(call("schedule_payment", {"amount": 1000}), call("post_audit_log"), task="T1", pert="paraphrase"),
        a_run(pert="paraphrase"),
    ]
    report = equivalence(runs, "old", "new", SPEC)
    d = report.as_dict()
    kinds = {g["kind"] for g in d["divergences"]}
    assert kinds == {"skipped", "substituted", "argument_changed"}
    assert d["outcome"] == {"agree": 2, "known": 3, "unknown": 0}
    assert d["a_self_consistency"] == {"k": 3, "n": 3}
    by_pert = d["conformance"]["by_perturbation"]
    assert (by_pert["baseline"]["pairs"], by_pert["baseline"]["only_a"]) == (2, 1)
    assert (by_pert["paraphrase"]["pairs"], by_pert["paraphrase"]["only_a"]) == (1, 0)
    text = render_text(report)
    assert "McNemar" in text and "Holm p" in text and "skipped" in text


def test_unpaired_cells_are_counted_not_compared():
    runs = [a_run(task="T1"), a_run(task="T2"), b_run(call("post_audit_log"), task="T3")]
    d = equivalence(runs, "old", "new", SPEC).as_dict()
    assert d["runs"] == 0 and d["unpaired"] == {"a_cells": 2, "b_cells": 1, "a_runs": 2, "b_runs": 1}


def test_without_a_spec_every_tool_call_is_an_effect_and_no_test_is_run():
    d = equivalence([a_run(), b_run(call("schedule_payment", {"amount": 100}), call("post_audit_log"))], "old", "new").as_dict()
    assert d["same_effect_path"] == 0 and d["conformance"] is None


def test_mcnemar_on_a_clear_paired_difference():
    runs = []
    for i in range(12):
        runs.append(a_run(task=f"T{i}"))
        runs.append(b_run(call("schedule_payment", {"amount": 100}), task=f"T{i}"))
    c = equivalence(runs, "old", "new", SPEC).as_dict()["conformance"]["by_perturbation"]["baseline"]
    assert (c["only_a"], c["only_b"]) == (12, 0) and c["mcnemar_p"] < 0.001 and c["holm_p"] == c["mcnemar_p"]


def test_compare_command_over_a_store(tmp_path):
    from plumbline_otel.cli.compare import compare
    from plumbline_otel.store import Store

    db = str(tmp_path / "p.duckdb")
    with Store(db) as store:
        for t in [a_run(), b_run(call("schedule_payment", {"amount": 100}))]:
            store.write_spans(span_records(t))
        store.assemble()
    spec_path = tmp_path / "s.yaml"
    spec_path.write_text("version: 1\nname: eq\neffect_tools: [schedule_payment, post_audit_log]\n"
                         "invariants:\n  - {id: AUDIT, severity: critical, must_call: post_audit_log}\n")
    result = CliRunner().invoke(compare, ["old", "new", "--db", db, "--spec", str(spec_path), "--consistency"])
    assert result.exit_code == 0, result.output
    assert "same effect path: 0/1" in result.output and "post_audit_log skipped" in result.output
    assert "consistency:" in result.output


def test_runs_beyond_the_pairs_are_tested_unpaired():
    runs = [a_run(repeat=0), b_run(call("schedule_payment", {"amount": 100}), call("post_audit_log"), repeat=0)]
    runs += [b_run(call("schedule_payment", {"amount": 100}), repeat=r) for r in (1, 2)]
    report = equivalence(runs, "old", "new", SPEC)
    c = report.as_dict()["conformance"]["by_perturbation"]["baseline"]
    assert c["pairs"] == 1 and c["all_runs"]["b"] == {"k": 1, "n": 3}
    assert "not in the paired test" in render_text(report)


FAULT: dict[str, Any] = {"plumbline__fault__tool": "get_invoice", "plumbline__fault__error": "503 Service Unavailable"}


def test_compare_does_not_score_runs_the_fault_never_hit():
    # Issue 8, case 6: runs whose fault never fired certified as n=0 but compared as 8/8.
    runs = []
    for i in range(8):
        runs.append(run(call("get_invoice", error="ToolError: 503 Service Unavailable"), call("get_invoice"),
                        call("schedule_payment", {"amount": 100}), call("post_audit_log"), service="old", task=f"T{i}",
                        plumbline__perturbation="tool_fault", plumbline__variant="0", **FAULT))
        runs.append(b_run(call("schedule_payment", {"amount": 100}), call("post_audit_log"), task=f"T{i}",
                          pert="tool_fault", **FAULT))  # B's fault never hit it: no failed get_invoice
    d = equivalence(runs, "old", "new", SPEC).as_dict()
    assert d["runs"] == 0 and d["excluded"]["b"] == {"missing": 0, "unexposed": 8, "errored": 0}
    assert d["conformance"]["by_perturbation"] == {} and d["unpaired"]["a_cells"] == 8


def test_one_paired_test_per_perturbation_with_holm_across_them():
    # B is worse only under distractor; pooled with 3 perturbations where they agree, one test would dilute it.
    runs = []
    for pert in ("baseline", "paraphrase", "sampling", "distractor"):
        for i in range(10):
            runs.append(a_run(task=f"T{i}", pert=pert))
            steps = [call("schedule_payment", {"amount": 100})] + ([] if pert == "distractor" else [call("post_audit_log")])
            runs.append(b_run(*steps, task=f"T{i}", pert=pert))
    c = equivalence(runs, "old", "new", SPEC).as_dict()["conformance"]
    assert c["perturbations"] == 4 and c["test"].startswith("McNemar exact per perturbation, Holm")
    worse = c["by_perturbation"]["distractor"]
    assert (worse["only_a"], worse["only_b"]) == (10, 0)
    assert worse["holm_p"] == min(1.0, 4 * worse["mcnemar_p"]) and worse["differs"]
    assert all(not c["by_perturbation"][p]["differs"] and c["by_perturbation"][p]["holm_p"] == 1.0
               for p in ("baseline", "paraphrase", "sampling"))


def test_errored_runs_fail_the_paired_test_and_have_no_effect_path():
    runs = [a_run(task=f"T{i}") for i in range(6)]
    runs += [run(service="new", task=f"T{i}", plumbline__perturbation="baseline", plumbline__variant="0",
                 plumbline__trial__status="errored", plumbline__trial__reason="timeout") for i in range(6)]
    d = equivalence(runs, "old", "new", SPEC).as_dict()
    assert d["runs"] == 0 and d["excluded"]["b"]["errored"] == 6
    c = d["conformance"]["by_perturbation"]["baseline"]
    assert (c["pairs"], c["only_a"], c["b_rate"]) == (6, 6, 0.0)


def test_outcome_agreement_when_runs_carry_an_outcome():
    runs = [a_run(task=f"T{i}", outcome="paid:100") for i in range(4)]
    runs += [b_run(call("schedule_payment", {"amount": 100}), call("post_audit_log"), task=f"T{i}",
                   outcome="paid:100" if i < 3 else "held") for i in range(4)]
    runs += [a_run(task="T9", outcome=None), b_run(call("post_audit_log"), task="T9", outcome=None)]
    d = equivalence(runs, "old", "new", SPEC).as_dict()
    assert d["outcome"] == {"agree": 3, "known": 4, "unknown": 1}
    assert "outcome agrees: 3/4 where known (1 unknown)" in render_text(equivalence(runs, "old", "new", SPEC))
