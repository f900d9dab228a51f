"""Equivalence of two agents on effect paths, outcomes and a paired conformance test."""

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


def b_run(*steps, task="T1", pert="baseline", repeat=0, outcome="paid:100"):
    return run(*steps, service="new", task=task, plumbline__perturbation=pert, plumbline__variant="0",
               plumbline__trial__repeat=repeat, plumbline__outcome=outcome)


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
    assert d["conformance"]["pairs"] == 3 and d["conformance"]["only_a"] == 1
    text = render_text(report)
    assert "McNemar" in text and "skipped" in text


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
    c = equivalence(runs, "old", "new", SPEC).as_dict()["conformance"]
    assert (c["only_a"], c["only_b"]) == (12, 0) and c["mcnemar_p"] < 0.001


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
    c = report.as_dict()["conformance"]
    assert c["pairs"] == 1 and c["all_runs"]["b"] == {"k": 1, "n": 3}
    assert "not in the paired test" in render_text(report)
