"""`plumbline gate`: a CI gate on a certificate (the verdict is `report/gate.py`).

Exit codes: 0 PASS (every cell's lower bound on the mean conformance over tasks reaches
--min-bound: a wrong PASS at most 5%); 1 FAIL (some cell's upper bound is below it: shown not to
meet it, a wrong FAIL at most 5%); 3 INCONCLUSIVE (neither: the message says how many more distinct
tasks would settle it as a sequential study, and that gating a fixed-n study again after adding
tasks does not keep its 5%); 2 the certificate is unusable (missing, not JSON, another kind or
version, a field it cannot fully read). A gate never passes on a certificate it cannot fully read.
With --baseline the same codes answer "is the candidate no worse than the baseline, on the tasks
both ran?" (FAIL from a paired sign-flip test with tasks as units; it prints the smallest drop it
could detect at 80% power).
"""

from __future__ import annotations

import click


@click.command("gate")
@click.argument("certificate", type=click.Path(dir_okay=False))
@click.option("--min-bound", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=0.95, show_default=True,
              help="the lower bound on the mean critical conformance over tasks that every cell must reach")
@click.option("--baseline", type=click.Path(dir_okay=False), default=None,
              help="the previous certificate: gate on no regression against it (shared tasks, per perturbation) instead")
@click.option("--margin", type=click.FloatRange(0, 1, max_open=True), default=0.05, show_default=True,
              help="with --baseline: how much worse the candidate may be and still count as not worse")
def gate(certificate: str, min_bound: float, baseline: str | None, margin: float) -> None:
    """PASS (0), FAIL (1) or INCONCLUSIVE (3) on a certificate; unusable: 2."""
    from plumbline_otel.report import CertificateError, gate_verdict, load_certificate
    from plumbline_otel.report.gate import regression_verdict

    try:
        cert = load_certificate(certificate)
        base = load_certificate(baseline) if baseline else None
    except CertificateError as exc:
        click.echo(f"unusable certificate: {exc}", err=True)
        raise SystemExit(2) from None
    verdict = regression_verdict(cert, base, margin) if base is not None else gate_verdict(cert, min_bound)
    click.echo(verdict.text())
    raise SystemExit(verdict.exit_code)
