"""The gate's verdict as a library call: the same answer `plumbline gate` prints, without a CLI."""

from plumbline_otel.report import build_certificate, gate_verdict
from plumbline_otel.spec import MustCall, Spec, invariant
from plumbline_otel.spec.testing import call, run

SPEC = Spec.of("g", [invariant("AUDIT", MustCall("post_audit_log"))])


def _runs(perturbation: str, clean: int, failing: int = 0) -> list:
    return [run(*([call("post_audit_log")] if i < clean else []), task=f"{perturbation}-T{i}", plumbline__perturbation=perturbation)
            for i in range(clean + failing)]


def test_the_verdict_passes_at_the_bound_and_fails_just_above_it() -> None:
    cert = build_certificate(SPEC, _runs("baseline", 80) + _runs("paraphrase", 75))
    bound = cert["headline"]["lower_bound"]
    assert gate_verdict(cert, bound).passed  # reaching the minimum is enough
    failed = gate_verdict(cert, bound + 1e-6)
    assert not failed.passed and failed.bound == bound
    assert failed.lines[0].startswith(f"FAIL: headline bound {bound:.4f}")
    assert any(line.startswith("  held down by agent / paraphrase: 75/75 conforming") for line in failed.lines)


def test_a_failing_cell_is_told_how_many_clean_runs_it_lacks() -> None:
    verdict = gate_verdict(build_certificate(SPEC, _runs("baseline", 70, failing=1)), 0.95)
    assert not verdict.passed
    # Wilson at one failure first reaches 0.95 at n = 110 (109/110 gives 0.9503, 108/109 gives 0.9499).
    assert "needs 110 runs at 1 failure(s), i.e. 39 more clean runs, from distinct tasks" in verdict.text()


def test_a_certificate_with_no_runs_fails_and_says_so() -> None:
    verdict = gate_verdict(build_certificate(SPEC, []), 0.5)
    assert not verdict.passed and "no runs were certified" in verdict.text()
