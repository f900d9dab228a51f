"""The certificate is typed end to end (issue 42 item 2), and runs that could not join their trial are listed once.

`report.model.Certificate` is what is built, loaded (and validated once), gated, rendered and emitted: no module
outside the model reads a certificate by its JSON keys. An instrumented agent whose trace did not continue its
trial's TRACEPARENT leaves runs that claim a recorded trial in a trace of their own: the certificate lists them once
(``unattributed_runs``), not a warning per run in every cell (issue 40 item 12).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import typing
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import plumbline_otel
from plumbline_otel.cli.gate import gate
from plumbline_otel.evaluation_events import certificate_events
from plumbline_otel.model import Trajectory
from plumbline_otel.parquet_export import export_parquet
from plumbline_otel.report import Certificate, CertificateError, build_certificate, gate_verdict, load_certificate, render_text
from plumbline_otel.report import model as report_model
from plumbline_otel.report import render as report_render
from plumbline_otel.report.certificate import UNJOINED
from plumbline_otel.report.gate import regression_verdict
from plumbline_otel.report.html import chart_rows, render
from plumbline_otel.report.model import Record, read_certificate
from plumbline_otel.report.pages import report_html
from plumbline_otel.spec import MustCall, Spec, invariant
from plumbline_otel.spec.testing import TEST_KEYS, call, run, signed
from plumbline_otel.store import Store

PACKAGE = Path(plumbline_otel.__file__).parent
MODEL = PACKAGE / "report" / "model.py"
SPEC = Spec.of("typed", [invariant("AUDIT", MustCall("post_audit_log"))])

# Field names of the certificate that other shapes in the product use as keys too (a coverage report's "tasks", a
# store row's "agent", a step's "name", an equivalence report's "perturbations", ...): a read of one of these says
# nothing about whether a certificate is being read. Every other field name is the certificate's own.
SHARED_WORDS = frozenset({
    "agent", "agents", "applicable", "bound", "cells", "confidence", "conforming", "cost_usd", "end", "end_ns", "errored", "estimate",
    "exposed", "filters", "hash", "id", "invariants", "k", "kind", "lines", "lower", "method", "min_bound", "missing", "n", "name",
    "note", "notes", "perturbation", "perturbations", "rate", "reason", "run", "runs", "severity", "source", "start", "start_ns",
    "stopped", "study", "tasks", "trial", "trials", "unexposed", "upper", "value", "verdict", "version", "violations",
})
# Modules that still read a certificate's JSON by its keys, outside the files the typed certificate was made in (none now). Each is
# a debt, not a licence: fixing one means taking it out of this list (the test says so), and no module may join it.
KNOWN_READERS: dict[str, str] = {}


def _record_types() -> list[type[Record]]:
    return [t for t in vars(report_model).values() if isinstance(t, type) and issubclass(t, Record) and t is not Record]


def certificate_keys() -> frozenset[str]:
    """The keys only a certificate has: every field name of the model's records but the shared words."""
    return frozenset(f.name for t in _record_types() for f in dataclasses.fields(t)) - SHARED_WORDS


def _string_key(node: ast.AST) -> str | None:
    """The string of ``x["key"]`` or ``x.get("key", ...)`` (also pop/setdefault), else None."""
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        return node.slice.value
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "pop", "setdefault")
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        return node.args[0].value
    return None


def string_key_reads(keys: frozenset[str]) -> dict[str, list[str]]:
    """Module path -> ``line: key`` of every read of one of `keys` by string, outside the model."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == MODEL:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            key = _string_key(node)
            if key in keys:
                found.setdefault(path.relative_to(PACKAGE.parent).as_posix(), []).append(f"{getattr(node, 'lineno', 0)}: {key}")
    return found


def test_the_shared_words_are_field_names_of_the_certificate() -> None:
    fields = {f.name for t in _record_types() for f in dataclasses.fields(t)}
    assert fields >= SHARED_WORDS, f"not a field of the certificate any more: {sorted(SHARED_WORDS - fields)}"
    assert {"headline", "provenance", "gate_lower", "per_task", "target_bound", "unattributed_runs"} <= certificate_keys()


def test_no_module_outside_the_model_reads_a_certificate_by_its_json_keys() -> None:
    found = string_key_reads(certificate_keys())
    new = {path: lines for path, lines in found.items() if path not in KNOWN_READERS}
    assert not new, f"read the typed model (report.model.Certificate) instead of the certificate's JSON keys: {new}"
    fixed = sorted(set(KNOWN_READERS) - set(found))
    assert not fixed, f"no longer reads a certificate by its keys: take it out of KNOWN_READERS: {fixed}"


def test_an_export_refuses_a_certificate_file_the_model_cannot_read_naming_the_file_and_field(tmp_path: Path) -> None:
    data = build_certificate(SPEC, [run(call("post_audit_log"), task=f"T{i}") for i in range(3)]).to_dict()
    del data["provenance"]["evidence_sha256"]
    path = tmp_path / "cert.json"
    path.write_text(json.dumps(data))
    out = tmp_path / "lake"
    with Store(tmp_path / "store.duckdb") as store, pytest.raises(CertificateError) as refused:
        export_parquet(store, out, certificate=path)
    assert str(path) in str(refused.value) and "evidence_sha256" in str(refused.value)
    assert not out.exists()  # refused before anything is written


def test_the_rule_sees_a_reader(tmp_path: Path) -> None:
    tree = ast.parse('def f(cert):\n    return cert["headline"]["lower_bound"], cert.get("provenance"), rows["name"]\n')
    keys = [k for node in ast.walk(tree) if (k := _string_key(node)) is not None]
    assert sorted(k for k in keys if k in certificate_keys()) == ["headline", "lower_bound", "provenance"]


@pytest.mark.parametrize("function, parameter", [
    (build_certificate, "return"), (load_certificate, "return"), (gate_verdict, "model"), (regression_verdict, "candidate"),
    (render_text, "cert"), (chart_rows, "cert"), (certificate_events, "cert"), (report_html, "cert"),
])
def test_the_certificate_is_built_loaded_gated_rendered_and_emitted_as_the_model(function: Any, parameter: str) -> None:
    hint = typing.get_type_hints(function)[parameter]
    assert hint is Certificate or set(typing.get_args(hint)) == {Certificate, type(None)}, f"{function.__name__}: {hint}"


def test_the_gate_reads_and_validates_a_certificate_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "cert.json"
    path.write_text(build_certificate(SPEC, [run(call("post_audit_log"), task=f"T{i}") for i in range(5)]).to_json())
    reads: list[Any] = []

    def counted(data: Any) -> Certificate:
        reads.append(data)
        return read_certificate(data)

    monkeypatch.setattr(report_render, "read_certificate", counted)
    monkeypatch.setattr(report_model, "read_certificate", counted)
    result = CliRunner().invoke(gate, [str(path), "--min-bound", "0.5"])
    assert result.exit_code in (0, 3), result.output
    assert len(reads) == 1


# Runs that could not join their trial.

STUDY = "s1"


def _record(trial: str, kind: str, i: int, **ctx: Any) -> Trajectory:
    """The replay driver's record of `trial` (a plan, or its first attempt), signed with the test study's key."""
    return signed(run(id=f"record-{trial}-{kind}", start_ns=1_700_000_000_000_000_000 + i, service="ap-agent", version="2.0", task=None,
                      plumbline__study=STUDY, plumbline__trial__id=trial, plumbline__record__kind=kind, plumbline__task__key=trial,
                      plumbline__perturbation="baseline", **ctx))


def unjoined_study(trials: int) -> list[Trajectory]:
    """A study of `trials` trials whose agent traced itself in traces of its own: each carries its trial's identity (from
    OTEL_RESOURCE_ATTRIBUTES) but not the trace the driver minted (it did not continue TRACEPARENT). One more trial's run is
    where it should be."""
    out: list[Trajectory] = []
    for i in range(trials + 1):
        trial = f"{STUDY}/T{i}/baseline/v/0"
        minted = f"minted-{i}".rjust(32, "0")
        out += [_record(trial, "plan", 2 * i),
                _record(trial, "attempt", 2 * i + 1, plumbline__trial__attempt=1, plumbline__trial__status="ok", plumbline__trial__trace_id=minted)]
        identity: dict[str, Any] = dict(service="ap-agent", version="2.0", task=trial, plumbline__study=STUDY, plumbline__trial__id=trial,
                        plumbline__perturbation="baseline", start_ns=1_700_000_000_000_000_000 + 100 + i)
        if i < trials:
            out.append(run(call("post_audit_log"), id=f"own-{i}", **identity))  # the agent's own trace
        else:
            out.append(run(call("post_audit_log"), id=minted, **identity))
    return out


def test_runs_that_could_not_join_their_trial_are_listed_once_not_per_cell() -> None:
    cert = build_certificate(SPEC, unjoined_study(44), keys=TEST_KEYS)
    (cell,) = cert.cells
    assert [(u.run, u.trial) for u in cert.unattributed_runs or ()][:2] == [("own-0", "s1/T0/baseline/v/0"), ("own-1", "s1/T1/baseline/v/0")]
    assert len(cert.unattributed_runs or ()) == 44
    assert (cell.unwitnessed, cell.unwitnessed_runs) == (0, ())  # not repeated in the cell
    assert (cell.n, cell.missing, cell.witnessed) == (1, 44, 45)
    assert {r.reason for r in cell.missing_runs} == {UNJOINED}  # one reason for all of them, not one per trace
    assert read_certificate(cert.to_dict()) == cert  # the field reads back

    text = render_text(cert)
    assert text.count("NOT JOINED TO THEIR TRIALS") == 1 and "44 run(s) claim a recorded trial in a trace of their own" in text
    assert "own-0: claims s1/T0/baseline/v/0" in text and "… and 39 more (the certificate's unattributed_runs)" in text
    assert text.count("why: ") == 1 and "other reason(s)" not in text

    how: dict[str, object] = {"checks": [], "note": None, "then": None, "standing": None, "check": None, "certify": None}
    page = render("console.html", lambda kind, **p: "/", cert=cert, stored_cert=False, chart=chart_rows(cert), source="s", how=how,
                  totals={"spans": 0, "runs": 89, "agents": 1, "tasks": 45}, violations=[], coverage=None, candidates=None)
    assert page.count('data-testid="unattributed"') == 1 and "44 run(s) claim a recorded trial in a trace of their own" in page


def test_a_certificate_with_every_run_joined_has_no_unattributed_runs_in_its_file() -> None:
    cert = build_certificate(SPEC, unjoined_study(0), keys=TEST_KEYS)
    assert cert.unattributed_runs is None and "unattributed_runs" not in cert.to_dict()  # the file is as before
    assert "NOT JOINED" not in render_text(cert)


def test_a_run_claiming_a_trial_no_record_stands_for_stays_unwitnessed_in_its_cell() -> None:
    stray = run(call("post_audit_log"), id="stray", service="ap-agent", version="2.0", task="S9", plumbline__study=STUDY,
                plumbline__trial__id=f"{STUDY}/S9/baseline/v/0", plumbline__perturbation="baseline")
    cert = build_certificate(SPEC, unjoined_study(0) + [stray], keys=TEST_KEYS)
    assert cert.unattributed_runs is None and cert.cells[0].unwitnessed_runs == (f"{STUDY}/S9/baseline/v/0",)
