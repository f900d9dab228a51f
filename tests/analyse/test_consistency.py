"""Consistency: sequences and arguments against the modal baseline run, localised by alignment."""

from plumbline_otel.analyse.consistency import build_reference, consistency, diverge, path_of, render_text, summarise
from plumbline_otel.spec import MustCall, Spec, invariant, parse_spec
from plumbline_otel.spec.testing import call, llm, run


def pay(amount=100, task="T1", pert="baseline", audit=True, **kw):
    steps = [call("get_invoice", {"id": "INV-1"}), llm(), call("schedule_payment", {"amount": amount, "memo": "x"})]
    if audit:
        steps.append(call("post_audit_log"))
    return run(*steps, task=task, plumbline__perturbation=pert, **kw)


def test_reference_is_the_modal_baseline_path_and_arguments():
    runs = [pay(), pay(), pay(amount=999), pay(audit=False, pert="paraphrase"), pay(audit=False, pert="paraphrase"),
            pay(audit=False, pert="paraphrase")]
    ref = build_reference(runs, prefer=lambda t: t.context["plumbline.perturbation"] == "baseline")
    assert ref.names == ("get_invoice", "schedule_payment", "post_audit_log")  # the paraphrase majority does not win
    assert ref.args[1]["amount"] == 100 and ref.source == "baseline" and ref.support == 3


def test_a_skipped_step_is_one_divergence_not_a_cascade():
    ref = build_reference([pay()])
    t = run(call("schedule_payment", {"amount": 100, "memo": "x"}), call("post_audit_log"))
    divergences = diverge(ref, path_of(t))
    assert [d.kind for d in divergences] == ["skipped"]
    assert divergences[0].expected == "get_invoice"


def test_argument_changes_are_found_on_the_same_path_and_typed_rules_apply():
    ref = build_reference([pay()])
    (d,) = diverge(ref, path_of(pay(amount=1000)))
    assert d.kind == "argument_changed" and "10× too large" in d.detail
    assert diverge(ref, path_of(pay(amount="100.00"))) == []  # a numeric string against a number compares as numbers
    other_memo = run(call("get_invoice", {"id": " inv-1"}), call("schedule_payment", {"amount": "100.00", "memo": "y"}),
                     call("post_audit_log"))
    assert [d.kind for d in diverge(ref, path_of(other_memo))] == ["argument_changed"]
    spec = parse_spec("version: 1\nname: t\narg_types:\n  schedule_payment: {amount: number, memo: ignore}\n"
                      "invariants:\n  - {id: A, severity: minor, must_call: x}\n")
    assert diverge(ref, path_of(run(call("get_invoice", {"id": " inv-1"}), call("schedule_payment", {"amount": "100.00", "memo": "y"}),
                                    call("post_audit_log"))), spec) == []


def test_failed_calls_are_not_part_of_the_path():
    ref = build_reference([pay()])
    retried = run(call("get_invoice", {"id": "INV-1"}), call("schedule_payment", {"amount": 100, "memo": "x"}, error="503"),
                  call("schedule_payment", {"amount": 100, "memo": "x"}), call("post_audit_log"))
    assert diverge(ref, path_of(retried)) == []


def test_consistency_per_task_with_pass_hat_k_and_conformance():
    spec = Spec.of("t", [invariant("AUDIT", MustCall("post_audit_log"))])
    runs = [pay(), pay(), pay(), pay(audit=False), pay(task="T2"), pay(task="T2"), run(task="T2", plumbline__trial__status="missing")]
    tasks = consistency(runs, spec)
    t1 = next(t for t in tasks if t.task_key == "T1").as_dict()
    assert (t1["n"], t1["consistent"], t1["same_path"]) == (4, 3, 3)
    assert t1["pass_hat_k"][1] == 0.75 and t1["pass_hat_k"][4] == 0.0
    assert t1["divergent_runs"][0]["first_divergence"]["kind"] == "skipped"
    assert t1["conforming"] == 3 and t1["conformance_pass_hat_k"][2] == 0.5
    t2 = next(t for t in tasks if t.task_key == "T2").as_dict()
    assert t2["n"] == 2 and t2["consistent"] == 2
    s = summarise(tasks)
    assert s["runs"] == 6 and s["consistent"] == 5 and s["pass_hat_k"][1]["tasks"] == 2
    assert "T1: 3/4 consistent" in render_text(tasks)


def test_modal_ties_do_not_depend_on_input_order():
    a, b = pay(amount=1), pay(amount=2)
    assert build_reference([a, b]).args == build_reference([b, a]).args
