"""The certificate over the imported parity study, under this product's exposure rules (the issue 8 contract).

The seed scored every tool_fault trial; its injector fired once per variant, so half the no-retry
executor's runs never met a fault. Here a run is exposed only on evidence in its own trace (a
failed call of the targeted tool with the injected error text), so the certificate says what the
cell really measured.
"""

from __future__ import annotations

import pytest
from seed_runs import SPEC_FILE, Imported

from plumbline_otel.analyse.conformance import evaluate
from plumbline_otel.importers import outcome_cells
from plumbline_otel.report import Certificate, build_certificate
from plumbline_otel.report.model import Cell
from plumbline_otel.spec import load_spec


def _cell(cert: Certificate, agent: str, perturbation: str) -> Cell:
    agent_doc = next(a for a in cert.agents if a.agent == agent)
    return next(c for c in agent_doc.perturbations if c.perturbation == perturbation)


@pytest.fixture(scope="module")
def certificate(parity: Imported) -> Certificate:
    return build_certificate(load_spec(SPEC_FILE), parity.runs, study="parity-study")


def test_plan_execute_tool_fault_scores_only_the_runs_the_fault_reached(parity: Imported, certificate: Certificate) -> None:
    cell = _cell(certificate, "plan_execute", "tool_fault")
    never_hit = sorted(tid for tid in parity.by_trial if tid.startswith("plan_execute/") and "/tool_fault/" in tid and tid.endswith("/1"))
    assert len(never_hit) == 32
    assert (cell.exposed, cell.unexposed, cell.errored, cell.missing) == (32, 32, 0, 0)
    assert sorted(cell.unexposed_runs) == never_hit
    assert cell.n == 32
    exposed = [parity.by_trial[tid] for tid in parity.by_trial
               if tid.startswith("plan_execute/") and "/tool_fault/" in tid and tid.endswith("/0")]
    spec = load_spec(SPEC_FILE)
    assert cell.conforming == sum(evaluate(spec, t).conforms("critical") for t in exposed) < 32


def test_react_tool_fault_measured_no_fault_at_all(certificate: Certificate) -> None:
    cell = _cell(certificate, "react", "tool_fault")
    assert (cell.exposed, cell.unexposed, cell.n, cell.missing) == (0, 56, 0, 8)


def test_exposure_aware_outcome_correctness_is_the_published_cell_without_its_unexposed_runs(
        parity: Imported, certificate: Certificate) -> None:
    unexposed = {tid for agent in certificate.agents for c in agent.perturbations for tid in c.unexposed_runs}
    cells = outcome_cells(parity.runs, scored=lambda t: str(t.context["plumbline.trial.id"]) not in unexposed)
    assert cells[("plan_execute", "tool_fault")] == (20, 32)  # published: 52/64
    assert ("react", "tool_fault") not in cells  # published: 55/56, none of them exposed
    assert cells[("react", "distractor")] == (57, 58)  # other perturbations are always exposed


def test_the_retry_studys_replays_without_a_response_are_errored_runs_with_their_reason(retry: Imported) -> None:
    cert = build_certificate(load_spec(SPEC_FILE), retry.runs)
    react = next(a for a in cert.agents if a.agent == "react")
    assert sum(c.errored for c in react.perturbations) == 52
    listed = [r for c in react.perturbations for r in c.errored_runs]
    assert len(listed) == 52 and all("no recorded response" in r.reason for r in listed)
