"""`plumbline gate`: a CI gate on a certificate's headline bound.

Exit codes: 0 the headline lower bound (the clustered gate bound, see README "Statistics")
meets --min-bound; 1 it does not (the message names the cells holding it down and what they
lack); 2 the certificate is unusable (missing, not JSON, another kind or version, a field it
cannot fully read). A gate never passes on a certificate it cannot fully read.

Both PASS and FAIL messages name the errored, missing and unexposed counts beside n, and every
cell's pass^k and flip rate, so a pass is never read without what it left out. The clean runs a
cell needs depend only on its n and failures (runs from distinct tasks); missing trials and
unexposed runs are not in n, so they neither count toward it nor change the failures.
"""

from __future__ import annotations

from typing import Any

import click


def _counts(c: dict[str, Any]) -> str:
    pass_k = "n/a" if c["pass_k"]["value"] is None else f"{c['pass_k']['value']:.3f}"
    flip = "n/a" if c["flip_rate"] is None else f"{c['flip_rate']:.3f}"
    return (f"n={c['n']} ({c['exposed']} exposed + {c['errored']} errored) from {c['tasks']} task(s), "
            f"{c['missing']} missing, {c['unexposed']} unexposed; pass^{c['pass_k']['k']} {pass_k}, flip rate {flip}")


def _totals(cells: list[dict[str, Any]]) -> str:
    return (f"errored runs {sum(c['errored'] for c in cells)} (in n, failures), "
            f"missing trials {sum(c['missing'] for c in cells)} and unexposed runs {sum(c['unexposed'] for c in cells)} "
            "(not in n)")


def _held(c: dict[str, Any], head: dict[str, Any]) -> str:
    return "held down by" if any(c["agent"] == h["agent"] and c["perturbation"] == h["perturbation"] for h in head["cells"]) else "also below:"


def _why(c: dict[str, Any], min_bound: float) -> str:
    from plumbline_otel.analyse.stats import trials_needed

    if c["n"] == 0:
        return "no evidence: no scored run, it certifies nothing"
    failures = c["n"] - c["conforming"]
    needed = trials_needed(min_bound, failures=failures)
    why = f"needs {needed} runs at {failures} failure(s), i.e. {max(0, needed - c['n'])} more clean runs, from distinct tasks"
    if needed <= c["n"]:
        why = f"{c['n']} runs would do as independent runs, but they come from {c['tasks']} task(s): run more distinct tasks"
    if c["missing"]:
        why += f"; if the {c['missing']} missing trial(s) had failed the bound would be {c['gate_lower_if_missing_failed']:.4f}"
    return why


@click.command("gate")
@click.argument("certificate", type=click.Path(dir_okay=False))
@click.option("--min-bound", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=0.95, show_default=True,
              help="the lower 95% bound of critical conformance (clustered by task) the headline must reach")
def gate(certificate: str, min_bound: float) -> None:
    """Pass (0) when the certificate's headline bound reaches --min-bound, else fail (1); unusable: 2."""
    from plumbline_otel.report import CertificateError, load_certificate

    try:
        cert = load_certificate(certificate)
    except CertificateError as exc:
        click.echo(f"unusable certificate: {exc}", err=True)
        raise SystemExit(2) from None
    head = cert["headline"]
    bound = head["lower_bound"]
    cells = [c for a in cert["agents"] for c in a["perturbations"]]
    if bound >= min_bound:
        where = ", ".join(f"{c['agent']} {c['perturbation']} (n={c['n']}, {c['tasks']} tasks)" for c in head["cells"])
        click.echo(f"PASS: headline bound {bound:.4f} >= {min_bound} ({head['method']}, clustered by task; "
                   f"minimum set by {where or 'no cells'}); {_totals(cells)}")
        for c in sorted(cells, key=lambda c: (c["agent"], c["perturbation"])):
            click.echo(f"  {c['agent']} / {c['perturbation']}: {c['conforming']}/{c['n']} conforming, bound {c['gate_lower']:.4f}; {_counts(c)}")
        return
    click.echo(f"FAIL: headline bound {bound:.4f} < {min_bound} ({head['method']}, clustered by task); {_totals(cells)}")
    below = [c for c in cells if c["gate_lower"] < min_bound]
    if not below:
        click.echo("  no runs were certified")
    for c in sorted(below, key=lambda c: (c["gate_lower"], c["agent"], c["perturbation"])):
        click.echo(
            f"  {_held(c, head)} {c['agent']} / {c['perturbation']}: {c['conforming']}/{c['n']} conforming, "
            f"bound {c['gate_lower']:.4f} (Wilson {c['lower']:.4f}); {_counts(c)}; {_why(c, min_bound)}"
        )
    raise SystemExit(1)
