"""Reading a certificate back (validated) and rendering it as text.

`load_certificate` is what a gate trusts: it rejects a file that is missing, is not JSON, has
another kind or version, lacks a field the gate reads, or whose headline is not the minimum of
its own cells' lower bounds (a hand-edited headline). It raises `CertificateError`. A cell's
``unexposed`` count (runs whose fault never fired) is optional, so certificates written before it
existed still load, but when present it must be a non-negative integer.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from plumbline_otel.errors import InputError
from plumbline_otel.report.certificate import CERTIFICATE_KIND, CERTIFICATE_VERSION

_CELL_FIELDS = {"agent": str, "perturbation": str, "n": int, "conforming": int, "lower": float, "missing": int,
                "trials_needed": int, "short_by": int}


class CertificateError(InputError):
    """A certificate file that cannot be used: names the file and what is wrong."""


def load_certificate(path: str | Path) -> dict[str, Any]:
    """Read and validate a certificate; raises CertificateError."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CertificateError(f"{path}: cannot read certificate ({exc.strerror or exc})") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise CertificateError(f"{path}: not JSON ({exc})") from None
    problem = validate(data)
    if problem:
        raise CertificateError(f"{path}: {problem}")
    return data


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _bad_cell(cell: Any, where: str) -> str | None:
    if not isinstance(cell, dict):
        return f"{where} is not an object"
    for name, kind in _CELL_FIELDS.items():
        value = cell.get(name)
        ok = _number(value) if kind is float else isinstance(value, kind) and not isinstance(value, bool)
        if not ok:
            return f"{where}.{name} missing or not a {kind.__name__}"
    unexposed = cell.get("unexposed", 0)
    if not isinstance(unexposed, int) or isinstance(unexposed, bool) or unexposed < 0:
        return f"{where}.unexposed is not a non-negative int"
    return None


def validate(data: Any) -> str | None:
    """The first reason `data` is not a usable certificate, or None."""
    if not isinstance(data, dict):
        return "not a certificate (a JSON object is expected)"
    if data.get("kind") != CERTIFICATE_KIND:
        return f"not a certificate (kind {data.get('kind')!r}, expected {CERTIFICATE_KIND!r})"
    version = data.get("version")
    if version != CERTIFICATE_VERSION:
        newer = isinstance(version, int) and version > CERTIFICATE_VERSION
        return f"certificate version {version!r} is not supported (this reads {CERTIFICATE_VERSION})" + (
            "; it was written by a newer plumbline" if newer else ""
        )
    head = data.get("headline")
    if not isinstance(head, dict) or not _number(head.get("lower_bound")) or not 0 <= head["lower_bound"] <= 1:
        return "headline.lower_bound missing or not a number in [0, 1]"
    if not isinstance(head.get("cells"), list):
        return "headline.cells missing"
    for i, cell in enumerate(head["cells"]):
        if (bad := _bad_cell(cell, f"headline.cells[{i}]")) is not None:
            return bad
    agents = data.get("agents")
    if not isinstance(agents, list):
        return "agents missing"
    lowers = []
    for a, agent in enumerate(agents):
        cells = agent.get("perturbations") if isinstance(agent, dict) else None
        if not isinstance(cells, list):
            return f"agents[{a}].perturbations missing"
        for c, cell in enumerate(cells):
            if (bad := _bad_cell(cell, f"agents[{a}].perturbations[{c}]")) is not None:
                return bad
            lowers.append(cell["lower"])
    expected = min(lowers) if lowers else 0.0
    if not math.isclose(expected, head["lower_bound"], rel_tol=0.0, abs_tol=1e-9):
        return f"headline.lower_bound {head['lower_bound']} is not the minimum of its cells' lower bounds ({expected})"
    if lowers and not head["cells"]:
        return "headline.cells is empty although there are cells"
    return None


def _pct(x: float | None) -> str:
    return "  n/a" if x is None else f"{100 * x:5.1f}%"


def _never_fired(count: int, perturbation: str) -> str:
    if count == 1:
        return f"1 {perturbation} run never met its fault and is not scored"
    return f"{count} {perturbation} runs never met their fault and are not scored"


def render_text(cert: dict[str, Any]) -> str:
    """A fixed-width text certificate: headline, one table per agent, top violations, provenance."""
    head = cert["headline"]
    target = cert.get("target_bound", 0.95)
    verdict = "MEETS" if head["lower_bound"] >= target else "BELOW"
    lines = [
        f"plumbline certificate  (spec {cert['spec']['name']}, {cert['spec']['hash'][:12]})",
        f"headline: critical conformance lower 95% bound = {head['lower_bound']:.4f}  [{verdict} target {target}]",
    ]
    for c in head["cells"]:
        unexposed = f" ({c['unexposed']} unexposed run(s) not scored)" if c.get("unexposed") else ""
        lines.append(f"  set by {c['agent']} / {c['perturbation']}: {c['conforming']}/{c['n']} conforming, n={c['n']}{unexposed}")
    if len(head["cells"]) > 1:
        lines.append(f"  ({len(head['cells'])} cells tie for the minimum)")
    if head.get("note"):
        lines.append(f"  n is short: {head['note']}")
    if head.get("missing"):
        lines.append(f"  missing trials (not counted in n, never as passes): {head['missing']}")
    if head.get("unexposed"):
        lines.append(f"  runs whose fault never fired (not counted in n, not scored): {head['unexposed']}")
    for agent in cert["agents"]:
        lines += ["", f"agent {agent['agent']}", "  perturbation        n   conforming   rate    Wilson 95%        clustered        missing  unexposed  needs"]
        for c in sorted(agent["perturbations"], key=lambda c: (c["lower"], c["perturbation"])):
            lines.append(
                f"  {c['perturbation']:<16}{c['n']:>5}   {c['conforming']:>10}  {_pct(c['rate'])}  "
                f"[{c['lower']:.3f}, {c['upper']:.3f}]  [{c['clustered_lower']:.3f}, {c['clustered_upper']:.3f}]"
                f"  {c['missing']:>7}  {c.get('unexposed', 0):>9}  {c['trials_needed'] if c['short_by'] else 'ok':>5}"
            )
        for c in sorted(agent["perturbations"], key=lambda c: c["perturbation"]):
            if c.get("unexposed"):
                lines.append(f"  {_never_fired(c['unexposed'], c['perturbation'])} (n={c['n']} is the exposed runs only)")
        totals: dict[str, list[int]] = {}
        for c in agent["perturbations"]:
            for inv, count in c["violations"].items():
                t = totals.setdefault(inv, [0, 0])
                t[0] += count
            for inv, count in c["applicable"].items():
                totals.setdefault(inv, [0, 0])[1] += count
        worst = sorted(((v[0], inv, v[1]) for inv, v in totals.items() if v[0]), reverse=True)[:8]
        if worst:
            lines.append("  violations (runs violating / runs it applied to):")
            lines += [f"    {inv:<28} {k}/{n}" for k, inv, n in worst]
    prov = cert["provenance"]
    win = prov["data_window"]
    scored = f" ({prov['scored_runs']} scored)" if prov.get("scored_runs", prov["runs"]) != prov["runs"] else ""
    lines += [
        "",
        f"runs: {prov['runs']}{scored}   window: {win['start']} .. {win['end']}",
        f"evidence sha256: {prov['evidence_sha256']}",
        f"spec sha256: {cert['spec']['hash']}   plumbline {prov['plumbline_version']}",
    ]
    return "\n".join(lines)
