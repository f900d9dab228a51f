"""`plumbline gate`: a CI gate on a certificate's headline bound.

Exit codes: 0 the headline lower bound meets --min-bound; 1 it does not (the message names the
cells holding it down and the clean runs they would need); 2 the certificate is unusable
(missing, not JSON, another kind or version, wrong shape).

The clean runs a cell needs depend only on its n and failures. Missing trials and unexposed runs
(a configured fault that never fired) are not in n, so they neither count toward it nor change
the failures; the message names them so nobody mistakes them for runs already made.
"""

from __future__ import annotations

import click


@click.command("gate")
@click.argument("certificate", type=click.Path(dir_okay=False))
@click.option("--min-bound", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=0.95, show_default=True,
              help="the lower 95% bound of critical conformance the headline must reach")
def gate(certificate: str, min_bound: float) -> None:
    """Pass (0) when the certificate's headline bound reaches --min-bound, else fail (1); unusable: 2."""
    from plumbline_otel.analyse.stats import trials_needed
    from plumbline_otel.report import CertificateError, load_certificate

    try:
        cert = load_certificate(certificate)
    except CertificateError as exc:
        click.echo(f"unusable certificate: {exc}", err=True)
        raise SystemExit(2) from None
    head = cert["headline"]
    bound = head["lower_bound"]
    if bound >= min_bound:
        where = ", ".join(f"{c['agent']} {c['perturbation']} (n={c['n']})" for c in head["cells"])
        click.echo(f"PASS: headline bound {bound:.4f} >= {min_bound} (minimum set by {where or 'no cells'})")
        return
    click.echo(f"FAIL: headline bound {bound:.4f} < {min_bound}")
    below = [c for a in cert["agents"] for c in a["perturbations"] if c["lower"] < min_bound]
    if not below:
        click.echo("  no runs were certified")
    for c in sorted(below, key=lambda c: (c["lower"], c["agent"], c["perturbation"])):
        failures = c["n"] - c["conforming"]
        needed = trials_needed(min_bound, failures=failures)
        held = "held down by" if any(c["agent"] == h["agent"] and c["perturbation"] == h["perturbation"] for h in head["cells"]) else "also below:"
        missing = f", {c['missing']} missing trial(s) not counted" if c["missing"] else ""
        if c.get("unexposed"):
            missing += f", {c['unexposed']} run(s) whose fault never fired not scored"
        click.echo(
            f"  {held} {c['agent']} / {c['perturbation']}: {c['conforming']}/{c['n']} conforming, "
            f"lower bound {c['lower']:.4f}{missing}; needs {needed} runs at {failures} failure(s), "
            f"i.e. {max(0, needed - c['n'])} more clean runs"
        )
    raise SystemExit(1)
