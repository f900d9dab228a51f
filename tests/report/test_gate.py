"""The gate's verdict as a library call: the same answer `plumbline gate` prints, without a CLI."""

from plumbline_otel.report import build_certificate, gate_verdict
from plumbline_otel.spec import MustCall, Spec, invariant
from plumbline_otel.spec.testing import call, run

SPEC = Spec.of("g", [invariant("AUDIT", MustCall("post_audit_log"))])


def _runs(perturbation: str, clean: int, failing: int = 0) -> list:
    return [run(*([call("post_audit_log")] if i < clean else []), task=f"{perturbation}-T{i}", plumbline__perturbation=perturbation)
            for i in range(clean + failing)]


def test_the_verdict_passes_at_the_bound_and_is_inconclusive_just_above_it() -> None:
    cert = build_certificate(SPEC, _runs("baseline", 80) + _runs("paraphrase", 75))
    bound = cert.headline.lower_bound
    assert gate_verdict(cert, bound).passed  # reaching the minimum is enough
    above = gate_verdict(cert, bound + 1e-6)
    assert (above.verdict, above.exit_code, above.bound) == ("INCONCLUSIVE", 3, bound)
    assert above.lines[0].startswith(f"INCONCLUSIVE: headline bound {bound:.4f}")
    # The sequential bound on these 75 tasks already reaches it, but switching bounds after looking is
    # choosing a test by its answer: the advice is at least one more task, as a sequential study.
    assert any(line.startswith("  INCONCLUSIVE agent / paraphrase: 75/75 conforming") and "1 more distinct clean task(s) would settle it" in line
               for line in above.lines)
    assert any(line.startswith("  PASS         agent / baseline: 80/80") for line in above.lines)


def test_an_inconclusive_cell_is_told_how_many_distinct_tasks_it_lacks() -> None:
    verdict = gate_verdict(build_certificate(SPEC, _runs("baseline", 70, failing=1)), 0.95)
    assert verdict.verdict == "INCONCLUSIVE" and not verdict.passed
    # Wilson on 71 task rates, one failing, would first reach 0.95 at 110 tasks; but only a sequential
    # continuation keeps its error as tasks are added, and betting_cs at one failure needs 135 (issue 38).
    assert "64 more distinct clean task(s) would settle it as a sequential study" in verdict.text()
    assert "gating it again with wilson_tasks does not keep its stated 5%" in verdict.text()
    assert "run more distinct tasks: 64 more clean task(s)" in verdict.text()


def test_a_cell_whose_upper_bound_is_below_the_target_fails() -> None:
    verdict = gate_verdict(build_certificate(SPEC, _runs("baseline", 30, failing=30)), 0.9)
    assert (verdict.verdict, verdict.exit_code) == ("FAIL", 1)
    assert "is below 0.9: it is shown not to meet the target" in verdict.text()


def test_a_certificate_with_no_runs_is_inconclusive_and_says_so() -> None:
    verdict = gate_verdict(build_certificate(SPEC, []), 0.5)
    assert verdict.verdict == "INCONCLUSIVE" and "no runs were certified" in verdict.text()
