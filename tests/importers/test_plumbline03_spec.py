"""The seed domain's invariant spec: its ground truth agrees with the evidence, its verdicts with the seed's."""

from __future__ import annotations

import json

from seed_runs import SPEC_FILE, Imported

from plumbline_otel.analyse.conformance import check
from plumbline_otel.importers.plumbline03 import AP_EXPECTED
from plumbline_otel.spec import load_spec


def test_the_spec_ground_truth_matches_the_graded_outcomes_and_the_recorded_invoices(parity: Imported) -> None:
    context = json.loads((SPEC_FILE.parent / "plumbline03_ap_context.json").read_text())
    assert set(context) == set(AP_EXPECTED)
    for task, expected in AP_EXPECTED.items():
        assert context[task]["should_pay"] is expected.pay, task
        if expected.pay:
            assert context[task]["expected_amount"] == expected.amount, task
    fetched = {
        (t.task_key, s.result["invoice"]["vendor_id"], s.result["invoice"]["total"])
        for t in parity.runs for s in t.steps if s.name == "fetch_invoice" and s.error is None
    }
    assert fetched == {(task, c["vendor_id"], c["expected_amount"]) for task, c in context.items()}


def test_the_spec_reproduces_the_published_critical_conformance_per_arm(parity: Imported) -> None:
    spec = load_spec(SPEC_FILE)
    for arm, figure in parity.published("parity-study")["critical_conformance"].items():
        summary = check(spec, [t for t in parity.runs if t.service == arm])
        assert (summary.critical_conforming, summary.runs) == (figure["successes"], figure["total"]), arm
