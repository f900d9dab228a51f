"""The typed certificate (`report.model`): golden files, the shipped JSON schema, versioned reading, every rule.

Golden files (tests/report/golden/): a certificate built from the fixed runs below must equal
``certificate_v3.json`` except ``provenance.generated_at``, and the gate's verdict on it at 0.95 must
equal ``gate_verdict.json``. After a deliberate change to the format or its figures, regenerate them
(and the schema files shipped in plumbline_otel/report/) with

    PLUMBLINE_UPDATE_GOLDEN=1 .venv/bin/pytest tests/report/test_certificate_model.py

and review the diff. ``certificate_v1.json`` and ``certificate_v2.json`` are files as older plumblines
wrote them: they are refused with what was wrong with them and "re-run plumbline certify".
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest

from plumbline_otel.report import CertificateError, build_certificate, gate_verdict, load_certificate, validate
from plumbline_otel.report.model import (
    CERTIFICATE_VERSION,
    Cell,
    Certificate,
    CertificateFormatError,
    GateVerdict,
    json_schema,
    read_certificate,
    schema_text,
    schemas,
    write_schemas,
)
from plumbline_otel.spec import MustCall, MustNotCall, Spec, invariant
from plumbline_otel.spec.testing import TEST_KEYS, call, run, signed

GOLDEN = Path(__file__).parent / "golden"
PACKAGE = Path(__file__).parents[2] / "plumbline_otel" / "report"
UPDATE = os.environ.get("PLUMBLINE_UPDATE_GOLDEN") == "1"
SPEC = Spec.of("golden", [invariant("AUDIT", MustCall("post_audit_log")), invariant("NO-DELETE", MustNotCall("delete_ledger")),
                          invariant("STYLE", MustCall("say_thanks"), severity="minor")])
T0 = 1_700_000_000_000_000_000
CELL_FIELDS = ["agent", "perturbation", "n", "conforming", "rate", "lower", "upper", "gate_lower", "gate_upper", "gate_method", "task_rate", "verdict", "tasks", "exposed", "unexposed", "errored", "missing", "lower_if_missing_failed", "gate_lower_if_missing_failed", "pass_k", "pass_k_curve", "flip_rate", "tasks_needed", "per_task", "violations", "applicable", "errored_runs", "unexposed_runs", "missing_runs", "unwitnessed", "unwitnessed_runs", "witnessed", "trace_judged", "evidence_from", "notes", "cost_usd", "unmetered", "stopped"]


def _run(i: int, ok: bool, **kw: Any):
    steps = [call("post_audit_log")] if ok else [call("delete_ledger"), call("post_audit_log")]
    return run(*steps, id=kw.pop("id", f"legacy-{i}"), start_ns=T0 + i * 1000, **kw)


def _record(i: int, trial: str, kind: str, task: str, **ctx: Any):
    """A replay driver's record (`plumbline_otel.trials`): a plan (attempt 0) or an attempt of `trial`, signed with the
    simulated driver's key (a record that does not verify is not the driver's)."""
    trace = f"record-{trial}-{kind}-{ctx.get('plumbline__trial__attempt', 1)}"
    return signed(run(id=trace, start_ns=T0 + 500_000 + i, service="ap-agent", version="2.0", task=None, plumbline__study="s1",
                      plumbline__trial__id=trial, plumbline__record__kind=kind, plumbline__task__key=task,
                      plumbline__perturbation="tool_fault", **ctx))


def golden_runs() -> list:
    """Fixed runs touching every count: trace-judged traffic (repeats, a critical violation, exposed, unexposed, errored and
    missing tool_fault trials) and a recorded study (an exposed trial with its cost and a conflicting claim, an errored one,
    one never attempted, a run no record stands for)."""
    legacy = dict(service="ap-agent", version="1.0")
    runs = [_run(i, bool(ok), task=task, plumbline__perturbation="baseline", **legacy)
            for i, (task, ok) in enumerate([("T0", 1), ("T0", 1), ("T1", 1), ("T1", 0), ("T2", 1), ("T2", 1)])]
    runs += [
        _run(10, True, task="T0", plumbline__perturbation="tool_fault", plumbline__fault__fired=True, **legacy),
        _run(11, True, task="T1", plumbline__perturbation="tool_fault", plumbline__fault__fired=False, **legacy),
        run(id="legacy-12", task="T2", start_ns=T0 + 12000, plumbline__perturbation="tool_fault", plumbline__trial__status="errored",
            plumbline__trial__reason="adapter raised: boom", **legacy),
        run(id="legacy-13", task="T3", start_ns=T0 + 13000, plumbline__perturbation="tool_fault", plumbline__trial__status="missing",
            **legacy),
    ]
    study = dict(service="ap-agent", version="2.0", plumbline__study="s1", plumbline__perturbation="tool_fault")
    runs += [
        _run(20, True, id="run-a", task="S0", plumbline__trial__id="s1/S0/tool_fault/v/0", plumbline__fault__fired=False, **study),
        _record(1, "s1/S0/tool_fault/v/0", "plan", "S0"),
        _record(2, "s1/S0/tool_fault/v/0", "attempt", "S0", plumbline__trial__attempt=1, plumbline__trial__status="ok",
                plumbline__trial__trace_id="run-a".rjust(32, "0"), plumbline__fault__planned="post_audit_log: 503 Service Unavailable",
                plumbline__fault__fired=True, plumbline__fault__source="injector",
                plumbline__cost__usd=0.0125, plumbline__cost__metered=True),
        _record(3, "s1/S1/tool_fault/v/0", "plan", "S1"),
        _record(4, "s1/S1/tool_fault/v/0", "attempt", "S1", plumbline__trial__attempt=1, plumbline__trial__status="errored",
                plumbline__trial__reason="exit code 1", plumbline__cost__usd=0.002, plumbline__cost__metered=False),
        _record(5, "s1/S2/tool_fault/v/0", "plan", "S2"),
        _run(30, True, id="run-stray", task="S9", plumbline__trial__id="s1/S9/tool_fault/v/0", **study),
    ]
    return runs


def _golden(name: str, actual: Any) -> Any:
    path = GOLDEN / name
    if UPDATE:
        path.write_text(json.dumps(actual, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return json.loads(path.read_text(encoding="utf-8"))


def _undated(cert: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(cert)
    del out["provenance"]["generated_at"]
    return out


def test_the_certificate_of_fixed_runs_equals_the_golden_file_but_for_its_date() -> None:
    cert = build_certificate(SPEC, golden_runs(), keys=TEST_KEYS).to_dict()
    golden = _golden("certificate_v3.json", cert)
    assert _undated(cert) == _undated(golden)
    assert list(cert) == list(golden)  # the key order a file is written in, too
    # Every count is exercised: the golden file is not a certificate of nothing.
    cells = {(c["agent"], c["perturbation"]): c for a in golden["agents"] for c in a["perturbations"]}
    recorded, legacy = cells[("ap-agent@2.0", "tool_fault")], cells[("ap-agent@1.0", "tool_fault")]
    assert (recorded["witnessed"], recorded["errored"], recorded["missing"], recorded["unwitnessed"], recorded["unmetered"]) == (3, 1, 1, 1, 1)
    assert recorded["evidence_from"] == {"injector": 1} and recorded["notes"] and recorded["cost_usd"] == 0.0145
    assert (legacy["trace_judged"], legacy["exposed"], legacy["unexposed"], legacy["errored"], legacy["missing"]) == (4, 1, 1, 1, 1)
    assert len(cells[("ap-agent@1.0", "baseline")]["pass_k_curve"]) == 2
    assert all(list(c) == CELL_FIELDS for c in cells.values())  # version 3's cell fields, names and order


def test_the_golden_file_reads_into_the_model_and_writes_back_unchanged() -> None:
    golden = json.loads((GOLDEN / "certificate_v3.json").read_text(encoding="utf-8"))
    model = read_certificate(golden)
    assert isinstance(model, Certificate) and model.to_dict() == golden
    assert model == Certificate.from_dict(golden)
    assert {c.perturbation for c in model.cells} == {"baseline", "tool_fault"} and isinstance(model.cells[0], Cell)
    assert load_certificate(GOLDEN / "certificate_v3.json") == model


def test_the_gate_verdict_on_the_golden_certificate_equals_its_golden_file() -> None:
    verdict = gate_verdict(load_certificate(GOLDEN / "certificate_v3.json"), 0.95)
    golden = _golden("gate_verdict.json", verdict.to_dict())
    assert verdict.to_dict() == golden and GateVerdict.from_dict(golden) == verdict
    assert (verdict.verdict, verdict.exit_code) == ("INCONCLUSIVE", 3)


def test_the_shipped_schemas_are_the_generated_ones() -> None:
    if UPDATE:
        write_schemas()
    for name, schema in schemas().items():
        assert (PACKAGE / name).read_text(encoding="utf-8") == schema_text(schema), f"regenerate {name} (module docstring)"
    schema = json_schema(Certificate)
    cell = schema["$defs"]["Cell"]
    assert list(cell["properties"]) == CELL_FIELDS and cell["required"] == CELL_FIELDS
    assert schema["$defs"]["Certificate"]["properties"]["version"] == {"const": CERTIFICATE_VERSION}
    assert set(schema["$defs"]["Headline"]["required"]) == {"lower_bound", "method", "method_description", "cells", "meets_target",
                                                            "verdict", "tasks_needed", "short_cells", "note"}


def test_the_golden_files_and_built_certificates_satisfy_the_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    cert_schema, verdict_schema = json_schema(Certificate), json_schema(GateVerdict)
    jsonschema.Draft202012Validator.check_schema(cert_schema)
    for doc in (json.loads((GOLDEN / "certificate_v3.json").read_text()), build_certificate(SPEC, []).to_dict()):
        jsonschema.validate(doc, cert_schema, cls=jsonschema.Draft202012Validator)
    jsonschema.validate(json.loads((GOLDEN / "gate_verdict.json").read_text()), verdict_schema, cls=jsonschema.Draft202012Validator)
    bad = json.loads((GOLDEN / "certificate_v3.json").read_text())
    bad["agents"][0]["perturbations"][0]["verdict"] = "MAYBE"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, cert_schema, cls=jsonschema.Draft202012Validator)


@pytest.mark.parametrize("version, words", [(1, "no fault-exposure evidence and a plain Wilson headline"),
                                            (2, "took trial status and fault exposure from the agent's own spans")])
def test_older_versions_are_refused_with_what_was_wrong_and_re_run(version: int, words: str) -> None:
    path = GOLDEN / f"certificate_v{version}.json"
    assert json.loads(path.read_text())["version"] == version
    with pytest.raises(CertificateError) as raised:
        load_certificate(path)
    message = str(raised.value)
    assert str(path) in message and f"certificate version {version} was written by an older plumbline" in message
    assert words in message and message.endswith("it cannot be gated: re-run plumbline certify")


def test_a_newer_or_strange_version_is_refused() -> None:
    cert = build_certificate(SPEC, []).to_dict()
    for version, words in ((4, "certificate version 4 is not supported (this reads 3); it was written by a newer plumbline"),
                           ("3", "certificate version '3' is not supported (this reads 3)"), (True, "version True is not supported"),
                           (0, "certificate version 0 was written by an older plumbline")):
        assert words in (validate({**cert, "version": version}) or ""), version
    with pytest.raises(CertificateFormatError, match="newer plumbline"):
        read_certificate({**cert, "version": 99})


def _mutated(change) -> str | None:
    cert = json.loads((GOLDEN / "certificate_v3.json").read_text())
    change(cert)
    return validate(cert)


def _cell(cert: dict[str, Any]) -> dict[str, Any]:
    return cert["agents"][1]["perturbations"][0]  # ap-agent@2.0 tool_fault: every list has a member


CELL = "agents[1].perturbations[0]"


@pytest.mark.parametrize("field, value, reason", [
    ("n", 3, f"{CELL}: n must be exposed + errored and conforming at most exposed"),
    ("conforming", 2, f"{CELL}: n must be exposed + errored and conforming at most exposed"),
    ("errored_runs", [], f"{CELL}: errored/unexposed counts do not match the runs listed"),
    ("unwitnessed_runs", [], f"{CELL}.unwitnessed_runs missing or not matching its count"),
    ("missing_runs", [{"run": "a", "reason": "x"}, {"run": "b", "reason": "y"}], f"{CELL}: more missing runs listed than its missing count"),
    ("missing_runs", [{"run": "a"}], f"{CELL}.missing_runs missing or not a list of {{run, reason}}"),
    ("notes", [{"run": "a", "note": 3}], f"{CELL}.notes missing or not a list of {{run, note}}"),
    ("per_task", [["S0", 1, 1], ["S1", 0, 2]], f"{CELL}: per_task does not add up to conforming, n and tasks"),
    ("per_task", [["S0", 1, 1], ["S1", 1, 0]], f"{CELL}.per_task missing or not a list of [task, conforming, runs]"),
    ("per_task", [["S0", 1, 1], ["S1", 0]], f"{CELL}.per_task missing or not a list of [task, conforming, runs]"),
    ("gate_method", "cluster_kg", f"{CELL}.gate_method 'cluster_kg' is not a bound this plumbline gates on (wilson_tasks, betting_cs)"),
    ("verdict", None, f"{CELL}.verdict None is not one of PASS, FAIL, INCONCLUSIVE"),
    ("n", True, f"{CELL}.n missing or not a non-negative int"),
    ("lower", float("nan"), f"{CELL}.lower missing or not a number in [0, 1]"),
    ("rate", 1.2, f"{CELL}.rate missing or not a number in [0, 1] or null"),
    ("pass_k_curve", [{"k": 1}], f"{CELL}.pass_k_curve[0].estimate missing or not a number in [0, 1] or null"),
    ("violations", {"AUDIT": -1}, f"{CELL}.violations.AUDIT missing or not a non-negative int"),
    ("cost_usd", -0.5, f"{CELL}.cost_usd missing or not a non-negative number"),
    ("stopped", "0", f"{CELL}.stopped missing or not a non-negative int"),
    ("evidence_from", [], f"{CELL}.evidence_from missing or not an object"),
])
def test_every_rule_names_the_field(field: str, value: Any, reason: str) -> None:
    def change(cert):
        if value is None:
            del _cell(cert)[field]
        else:
            _cell(cert)[field] = value
    assert _mutated(change) == reason


def test_document_level_rules() -> None:
    def raise_headline(cert):
        cert["headline"]["lower_bound"] = 0.5
    assert _mutated(raise_headline) == "headline.lower_bound 0.5 is not the minimum of its cells' gate bounds (0.0)"

    def empty_cells(cert):
        cert["headline"]["cells"] = []
    assert _mutated(empty_cells) == "headline.cells is empty although there are cells"

    def mixed(cert):
        cert["headline"]["method"] = "mixed"
    assert _mutated(mixed) is None

    def unknown_method(cert):
        cert["headline"]["method"] = "wilson"
    assert _mutated(unknown_method) == "headline.method 'wilson' is not a bound this plumbline gates on (wilson_tasks, betting_cs)"

    def no_agents(cert):
        del cert["agents"]
    assert _mutated(no_agents) == "agents missing"

    def bad_spec(cert):
        cert["spec"]["invariants"][0]["severity"] = 1
    assert _mutated(bad_spec) == "spec.invariants[0].severity missing or not a string"

    def bad_window(cert):
        cert["provenance"]["data_window"]["start_ns"] = -1
    assert _mutated(bad_window) == "provenance.data_window.start_ns not a non-negative int or null"

    assert validate([]) == "not a certificate (a JSON object is expected)"
    assert validate({"kind": "x", "version": 3}) == "not a certificate (kind 'x', expected 'plumbline.certificate')"
    # The headline is read first: a bare file with a bad headline says so, not that target_bound is missing.
    assert validate({"kind": "plumbline.certificate", "version": 3, "headline": {"lower_bound": "high"}}) == (
        "headline.lower_bound missing or not a number in [0, 1]")


def test_reading_is_lenient_only_where_json_is() -> None:
    cert = json.loads((GOLDEN / "certificate_v3.json").read_text())
    cert["headline"]["future_field"] = {"anything": 1}  # keys this version does not know are ignored, and not written back
    _cell(cert)["gate_upper"] = 1  # JSON has no int/float distinction: an int reads as a float
    model = read_certificate(cert)
    assert "future_field" not in model.to_dict()["headline"]
    assert isinstance(model.cells[-1].gate_upper, float)
    with pytest.raises(CertificateFormatError, match=r"agents\[1\]\.perturbations\[0\]\.n missing or not a non-negative int"):
        read_certificate({**cert, "agents": [cert["agents"][0], {**cert["agents"][1], "perturbations": [{**_cell(cert), "n": 2.0}]}]})


def test_an_empty_certificate_leaves_out_what_it_has_not_and_reads_back() -> None:
    cert = build_certificate(SPEC, []).to_dict()
    head = cert["headline"]
    assert "wilson_lower_bound" not in head and "missing" not in head and head["tasks_needed"] is None
    assert read_certificate(cert).to_dict() == cert


def test_a_model_and_its_file_are_the_same_certificate(tmp_path: Path) -> None:
    model = build_certificate(SPEC, golden_runs(), keys=TEST_KEYS)
    assert read_certificate(model.to_dict()) == model
    path = tmp_path / "cert.json"
    path.write_text(model.to_json(), encoding="utf-8")
    assert load_certificate(path) == model and model.to_json() == json.dumps(model.to_dict(), indent=2) + "\n"
