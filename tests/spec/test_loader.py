"""Reading specs from YAML: the documented shape loads; every error names file, line and reason."""

from pathlib import Path

import pytest

from plumbline_otel.errors import SpecError
from plumbline_otel.spec import ArgEquals, MustCall, Spec, invariant, load_spec, parse_spec
from plumbline_otel.spec.testing import call, run

EXAMPLE = Path(__file__).resolve().parents[2] / "configs" / "examples" / "invoice_payments.invariants.yaml"

HEAD = "version: 1\nname: t\ninvariants:\n"


def write(tmp_path, text, name="spec.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_example_spec_loads_with_every_kind():
    spec = load_spec(EXAMPLE)
    assert spec.name == "invoice_payments_example"
    kinds = {inv.kind for inv in spec.invariants}
    assert kinds == {"ordering", "call_at_most", "arg_equals", "must_not_call", "arg_satisfies", "arg_matches_result", "call_at_least", "must_call"}
    assert spec.context_for("INV-1029")["expected_action"] == "pay"
    assert spec.get("PAY-AMOUNT").line == 21  # the line of "- id: PAY-AMOUNT"
    assert spec.is_effect("schedule_payment") and not spec.is_effect("get_invoice")
    assert "memo" in spec.arg_rules["schedule_payment"].ignore


def test_the_example_spec_judges_a_run():
    spec = load_spec(EXAMPLE)
    t = run(
        call("get_invoice"),
        call("check_vendor_status"),
        call("calculate_payable_amount", result={"payable_amount": 4820.0}),
        call("request_approval", {"approver_role": "manager"}),
        call("schedule_payment", {"amount": 48200.0, "invoice_id": "inv-1029"}),
        call("post_audit_log"),
        task="INV-1029",
    )
    failed = {inv.id: v for inv, v in spec.evaluate(t) if v.status == "fail"}
    assert set(failed) == {"PAY-AMOUNT", "PAID-EQUALS-PAYABLE"}
    assert "10× too large" in failed["PAY-AMOUNT"].detail


def test_invalid_yaml_names_file_and_line(tmp_path):
    path = write(tmp_path, HEAD + "  - id: A\n    severity: critical\n    must_call: [unclosed\n")
    with pytest.raises(SpecError, match=r"spec\.yaml:\d+: not valid YAML"):
        load_spec(path)


def test_duplicate_ids_are_rejected_with_the_line_of_the_second(tmp_path):
    text = HEAD + "  - id: A\n    severity: critical\n    must_call: x\n  - id: A\n    severity: minor\n    must_call: y\n"
    with pytest.raises(SpecError) as err:
        load_spec(write(tmp_path, text))
    assert f"{tmp_path / 'spec.yaml'}:7: duplicate invariant id 'A' (first declared at line 4)" == str(err.value)


def test_unknown_kind_is_rejected_at_its_line(tmp_path):
    text = HEAD + "  - id: A\n    severity: critical\n    must_cal: x\n"
    with pytest.raises(SpecError, match=r"spec\.yaml:6: invariant A: unknown kind or key 'must_cal'"):
        load_spec(write(tmp_path, text))


def test_unknown_predicate_is_rejected_at_its_line(tmp_path):
    (tmp_path / "preds_mod_for_test.py").write_text("PREDICATES = {'ok': lambda v, s, t, c: True}\n")
    text = (
        "version: 1\nname: t\npredicates: preds_mod_for_test\ninvariants:\n"
        "  - id: A\n    severity: critical\n    arg_satisfies: {tool: t, arg: a, predicate: nope}\n"
    )
    with pytest.raises(SpecError, match=r"spec\.yaml:7: invariant A: arg_satisfies: unknown predicate 'nope' \(known: ok\)"):
        load_spec(write(tmp_path, text))


def test_missing_severity_bad_params_and_two_kinds(tmp_path):
    cases = {
        HEAD + "  - id: A\n    must_call: x\n": r":4: invariant A: severity must be one of",
        HEAD + "  - id: A\n    severity: high\n    must_call: x\n": r":5: invariant A: severity must be one of",
        HEAD + "  - id: A\n    severity: minor\n    call_at_most: {tool: x}\n": r":6: invariant A: call_at_most: missing n",
        HEAD + "  - id: A\n    severity: minor\n    must_call: x\n    must_not_call: y\n": r":4: invariant A: exactly one kind",
        HEAD + "  - id: A\n    severity: minor\n    arg_equals: {tool: x, arg: a, value: 1, type: money}\n": r":6: .*unknown type 'money'",
        HEAD + "  - id: A\n    severity: minor\n    severity: major\n    must_call: x\n": r":6: duplicate key 'severity'",
        HEAD + "  - id: A\n    severity: minor\n    when: {a: {between: [1, 2]}}\n    must_call: x\n": r":6: invariant A: when.a",
        "version: 2\nname: t\ninvariants: []\n": r":1: unsupported spec version 2",
        "version: 1\nname: t\nrules: []\n": r":3: unknown top-level key 'rules'",
        "- just\n- a list\n": r":1: a spec is a mapping",
    }
    for text, pattern in cases.items():
        with pytest.raises(SpecError, match=pattern):
            parse_spec(text, source="s.yaml")


def test_bad_context_provider_is_rejected(tmp_path):
    text = "version: 1\nname: t\ncontext: {provider: 'file:nowhere.json'}\ninvariants:\n  - {id: A, severity: minor, must_call: x}\n"
    with pytest.raises(SpecError, match=r"spec\.yaml:3: context file .*nowhere\.json not found"):
        load_spec(write(tmp_path, text))


def test_csv_context_keyed_by_a_column(tmp_path):
    (tmp_path / "truth.csv").write_text("invoice,expected_action,payable_amount\nINV-1,pay,10.00\n")
    text = "version: 1\nname: t\ncontext: {provider: 'file:truth.csv', key: invoice}\ninvariants:\n  - {id: A, severity: minor, must_call: x}\n"
    spec = load_spec(write(tmp_path, text))
    assert spec.context_for("INV-1")["payable_amount"] == "10.00"
    assert spec.context_for("INV-2") == {}


def test_python_context_provider(tmp_path):
    (tmp_path / "truth_mod_for_test.py").write_text("def context_for(task):\n    return {'task': task}\n")
    text = "version: 1\nname: t\ncontext:\n  provider: 'python:truth_mod_for_test:context_for'\ninvariants:\n  - {id: A, severity: minor, must_call: x}\n"
    spec = load_spec(write(tmp_path, text))
    assert spec.context_for("T-9") == {"task": "T-9"}


def test_spec_hash_is_canonical_and_sensitive_to_meaning(tmp_path):
    a = parse_spec(HEAD + "  - {id: A, severity: minor, must_call: x}\n  - {id: B, severity: major, must_call: y}\n")
    b = parse_spec(HEAD + "  - id: B\n    severity: major\n    description: prose changes nothing\n    must_call: y\n  - {id: A, severity: minor, must_call: x}\n")
    c = parse_spec(HEAD + "  - {id: A, severity: critical, must_call: x}\n  - {id: B, severity: major, must_call: y}\n")
    assert a.hash == b.hash and len(a.hash) == 64
    assert a.hash != c.hash


def test_python_and_yaml_forms_hash_alike():
    yaml_spec = parse_spec(HEAD + "  - {id: A, severity: minor, must_call: x}\n  - id: B\n    severity: critical\n    arg_equals: {tool: t, arg: a, value: 5}\n")
    py_spec = Spec.of("t", [invariant("A", MustCall("x"), severity="minor"), invariant("B", ArgEquals("t", "a", value=5))])
    assert yaml_spec.hash == py_spec.hash


def test_python_duplicate_ids_are_rejected():
    with pytest.raises(SpecError, match="duplicate invariant id 'A'"):
        Spec.of("t", [invariant("A", MustCall("x")), invariant("A", MustCall("y"))])


def test_a_failing_context_provider_is_a_config_error_naming_the_task(tmp_path):
    from plumbline_otel.errors import ConfigError

    (tmp_path / "broken_truth_for_test.py").write_text("def context_for(task):\n    raise KeyError(task)\n")
    text = "version: 1\nname: t\ncontext: 'python:broken_truth_for_test:context_for'\ninvariants:\n  - {id: A, severity: minor, must_call: x}\n"
    spec = load_spec(write(tmp_path, text))
    with pytest.raises(ConfigError, match="context provider failed for task 'T-1'"):
        spec.context_for("T-1")
