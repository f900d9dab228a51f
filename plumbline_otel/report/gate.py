"""The CI gate's verdict on a certificate: pass when the headline bound reaches the minimum, and why.

Both verdicts name the errored, missing and unexposed counts beside n, and every cell's pass^k and
flip rate, so a pass is never read without what it left out. A failing verdict names the cells
holding the bound down and the clean runs each needs; those depend only on a cell's n and failures
(runs from distinct tasks): missing trials and unexposed runs are not in n, so they neither count
toward it nor change the failures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from plumbline_otel.analyse.stats import trials_needed


@dataclass(frozen=True)
class GateVerdict:
    """Whether a certificate passes `min_bound`, with the lines that say why."""

    passed: bool
    bound: float
    min_bound: float
    lines: tuple[str, ...]

    def text(self) -> str:
        return "\n".join(self.lines)


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


def gate_verdict(cert: dict[str, Any], min_bound: float) -> GateVerdict:
    """The verdict on a certificate `load_certificate` accepted (so every field read here is there)."""
    head = cert["headline"]
    bound = head["lower_bound"]
    cells = [c for a in cert["agents"] for c in a["perturbations"]]
    if bound >= min_bound:
        where = ", ".join(f"{c['agent']} {c['perturbation']} (n={c['n']}, {c['tasks']} tasks)" for c in head["cells"])
        lines = [f"PASS: headline bound {bound:.4f} >= {min_bound} ({head['method']}, clustered by task; "
                 f"minimum set by {where or 'no cells'}); {_totals(cells)}"]
        lines += [f"  {c['agent']} / {c['perturbation']}: {c['conforming']}/{c['n']} conforming, bound {c['gate_lower']:.4f}; {_counts(c)}"
                  for c in sorted(cells, key=lambda c: (c["agent"], c["perturbation"]))]
        return GateVerdict(True, bound, min_bound, tuple(lines))
    lines = [f"FAIL: headline bound {bound:.4f} < {min_bound} ({head['method']}, clustered by task); {_totals(cells)}"]
    below = [c for c in cells if c["gate_lower"] < min_bound]
    if not below:
        lines.append("  no runs were certified")
    lines += [f"  {_held(c, head)} {c['agent']} / {c['perturbation']}: {c['conforming']}/{c['n']} conforming, "
              f"bound {c['gate_lower']:.4f} (Wilson {c['lower']:.4f}); {_counts(c)}; {_why(c, min_bound)}"
              for c in sorted(below, key=lambda c: (c["gate_lower"], c["agent"], c["perturbation"]))]
    return GateVerdict(False, bound, min_bound, tuple(lines))


__all__ = ["GateVerdict", "gate_verdict"]
