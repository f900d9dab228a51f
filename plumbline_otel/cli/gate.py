"""`plumbline gate`: a CI gate on a certificate's headline bound (the verdict is `report/gate.py`).

Exit codes: 0 the headline lower bound (the clustered gate bound, see README "Statistics")
meets --min-bound; 1 it does not (the message names the cells holding it down and what they
lack); 2 the certificate is unusable (missing, not JSON, another kind or version, a field it
cannot fully read). A gate never passes on a certificate it cannot fully read.
"""

from __future__ import annotations

import click


@click.command("gate")
@click.argument("certificate", type=click.Path(dir_okay=False))
@click.option("--min-bound", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=0.95, show_default=True,
              help="the lower 95% bound of critical conformance (clustered by task) the headline must reach")
def gate(certificate: str, min_bound: float) -> None:
    """Pass (0) when the certificate's headline bound reaches --min-bound, else fail (1); unusable: 2."""
    from plumbline_otel.report import CertificateError, gate_verdict, load_certificate

    try:
        cert = load_certificate(certificate)
    except CertificateError as exc:
        click.echo(f"unusable certificate: {exc}", err=True)
        raise SystemExit(2) from None
    verdict = gate_verdict(cert, min_bound)
    click.echo(verdict.text())
    if not verdict.passed:
        raise SystemExit(1)
