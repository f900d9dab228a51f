"""The CI gate's verdict on a certificate: PASS, FAIL or INCONCLUSIVE, and why.

Each cell's bounds (on the mean conformance over tasks) do not depend on the target, so the gate
recomputes them from the cell's own ``per_task`` counts with the cell's method, and each cell's
verdict at its own ``--min-bound``: PASS when the lower bound reaches it (a wrong PASS at most 5%),
FAIL when the upper bound is below it (a wrong FAIL at most 5%), INCONCLUSIVE otherwise. Recomputing
means a certificate written before issue 38, whose stored upper end could FAIL an agent at the
target 9% of the time, is gated with the upper end that holds its 5%.

An INCONCLUSIVE cell is told how to settle it without voiding the error (`advice`): a fixed-n
study (``wilson_tasks``) gated again after more tasks does not keep its stated 5% (a wrong PASS up
to 0.095 when the advice was followed that way), so the number given is the more distinct clean
tasks a *sequential* continuation needs (``betting_cs`` over all the cell's tasks, valid at every
look). The certificate is PASS when every cell passes and FAIL when any cell fails.

Against a baseline certificate (``--baseline``) the gate compares the two on the tasks both ran:
FAIL when a paired sign-flip test with tasks as the units, over all perturbations jointly and each
alone (`regression.drop_test`), shows the candidate worse by more than the margin; PASS when every
perturbation is shown not worse by more than it (`stats.paired_task_regression`, Holm); INCONCLUSIVE
otherwise, with the smallest drop the evidence would catch at 80% power. The betting test alone
caught a true 0.2 drop 6.5% of the time at the demo's size; this one 95% (bench/baseline_power.py).

Every verdict names the errored, missing and unexposed counts beside n, so a pass is never read
without what it left out.

Both take the typed certificate (`report.model.Certificate`, read and validated once by
`load_certificate` or built by `build_certificate`); the verdict is `report.model.GateVerdict` (its
schema ships as ``gate_verdict.schema.json``).
"""

from __future__ import annotations

from collections import defaultdict

from plumbline_otel.analyse.regression import drop_test
from plumbline_otel.analyse.stats import (
    FAIL,
    INCONCLUSIVE,
    PASS,
    SEQUENTIAL_METHOD,
    Interval,
    gate_decision,
    paired_task_regression,
    regression_verdicts,
    sequential_interval,
    task_interval,
    tasks_to_settle,
)
from plumbline_otel.report.certificate import advice, overall
from plumbline_otel.report.model import EXIT_CODES, Cell, CellVerdict, Certificate, GateVerdict


def _counts(c: Cell) -> str:
    pass_k = "n/a" if c.pass_k.value is None else f"{c.pass_k.value:.3f}"
    flip = "n/a" if c.flip_rate is None else f"{c.flip_rate:.3f}"
    return (f"n={c.n} ({c.exposed} exposed + {c.errored} errored) from {c.tasks} task(s), "
            f"{c.missing} missing, {c.unexposed} unexposed; pass^{c.pass_k.k} {pass_k}, flip rate {flip}")


def _totals(cells: list[Cell]) -> str:
    return (f"errored runs {sum(c.errored for c in cells)} (in n, failures), "
            f"missing trials {sum(c.missing for c in cells)} and unexposed runs {sum(c.unexposed for c in cells)} "
            "(not in n)")


def cell_bounds(c: Cell) -> Interval:
    """The cell's gate bounds recomputed from its ``per_task`` counts with its method (module docstring)."""
    counts = [(k, n) for _, k, n in c.per_task]
    return sequential_interval(counts) if c.gate_method == SEQUENTIAL_METHOD else task_interval(counts)


def cell_verdict(c: Cell, min_bound: float) -> tuple[str, int | None]:
    """A cell's verdict at `min_bound`, and the more distinct clean tasks a sequential continuation needs (None: no number will do)."""
    if c.n == 0:
        return INCONCLUSIVE, tasks_to_settle(INCONCLUSIVE, [], min_bound)
    bounds = cell_bounds(c)
    verdict = gate_decision(bounds.lower, bounds.upper, min_bound)
    counts = [(k, n) for _, k, n in c.per_task]
    return verdict, (tasks_to_settle(verdict, counts, min_bound) if verdict == INCONCLUSIVE else 0)


def _why(c: Cell, verdict: str, more: int | None, min_bound: float, bounds: Interval) -> str:
    if c.n == 0:
        return "no evidence: no scored run, it certifies nothing"
    if verdict == FAIL:
        why = f"its upper bound {bounds.upper:.4f} is below {min_bound}: it is shown not to meet the target"
    else:
        why = advice(c.gate_method, more, min_bound) + " (repeats of the same tasks do not count)"
    if c.missing:
        why += f"; if the {c.missing} missing trial(s) had failed the bound would be {c.gate_lower_if_missing_failed:.4f}"
    return why


def gate_verdict(model: Certificate, min_bound: float) -> GateVerdict:
    """The verdict on a certificate at `min_bound` (module docstring)."""
    bound = model.headline.lower_bound
    cells = sorted(model.cells, key=lambda c: (c.gate_lower, c.agent, c.perturbation))
    judged = [(c, *cell_verdict(c, min_bound)) for c in cells]
    verdict = overall([v for _, v, _ in judged])
    lines = [f"{verdict}: headline bound {bound:.4f} against {min_bound} (lower bound on the mean conformance over tasks, "
             f"{model.headline.method}; PASS when a cell's lower bound reaches it, FAIL when its upper bound is below it, "
             f"each wrong at most {1 - model.confidence:.0%}); {_totals(cells)}"]
    if not cells:
        lines.append("  no runs were certified")
    for c, v, more in judged:
        bounds = cell_bounds(c)
        text = (f"  {v:<12} {c.agent} / {c.perturbation}: {c.conforming}/{c.n} conforming, "
                f"bounds [{bounds.lower:.4f}, {bounds.upper:.4f}] (Wilson {c.lower:.4f}); {_counts(c)}")
        lines.append(text if v == PASS else f"{text}; {_why(c, v, more, min_bound, bounds)}")
    if verdict == INCONCLUSIVE:
        needs = [more for _, v, more in judged if v == INCONCLUSIVE]
        most = None if None in needs else max((m for m in needs if m is not None), default=0)
        lines.append("  run more distinct tasks: " + ("no number of clean tasks settles it" if most is None
                                                        else f"{most} more clean task(s) in the cell that needs the most, "
                                                             "as a sequential study (replay --resume --target)"))
    return GateVerdict(verdict, bound, min_bound, tuple(lines),
                       cells=tuple(CellVerdict(c.agent, c.perturbation, v, more) for c, v, more in judged))


def _per_task(cert: Certificate) -> dict[str, dict[str, tuple[int, int]]]:
    """perturbation -> task -> (conforming, runs), summed over the certificate's agents."""
    out: dict[str, dict[str, tuple[int, int]]] = defaultdict(dict)
    for c in cert.cells:
        for task, k, n in c.per_task:
            old = out[c.perturbation].get(task, (0, 0))
            out[c.perturbation][task] = (old[0] + k, old[1] + n)
    return out


def regression_verdict(candidate: Certificate, baseline: Certificate, margin: float) -> GateVerdict:
    """The candidate against the baseline on shared tasks (module docstring).

    FAIL when the paired sign-flip test (`regression.drop_test`: tasks as units, all perturbations
    jointly and each alone, max-T) shows it worse by more than the margin; PASS when every
    perturbation is shown not worse by more than the margin (betting bound, Holm); INCONCLUSIVE
    otherwise. It prints the smallest drop this evidence would catch with 80% power.
    """
    cand, base = _per_task(candidate), _per_task(baseline)
    shared = sorted(set(cand) & set(base))
    results = {p: paired_task_regression(cand[p], base[p], margin=margin) for p in shared}
    fine = regression_verdicts(results)
    drop = drop_test({p: cand[p] for p in shared}, {p: base[p] for p in shared}, margin=margin)
    verdicts = {p: "worse" if drop.p_values.get(p, 1.0) <= drop.alpha else "not worse" if fine[p] == "not worse" else "inconclusive"
                for p in shared}
    words = {"not worse": PASS, "inconclusive": INCONCLUSIVE}
    verdict = FAIL if drop.worse else overall([words[v] for v in verdicts.values() if v in words]) if verdicts else INCONCLUSIVE
    flips = f"all {drop.flips} sign flips" if drop.exact else f"{drop.flips} random sign flips"
    lines = [f"{verdict}: candidate against baseline on the tasks both ran, margin {margin} (worse: a paired sign-flip test "
             f"with tasks as units, all {len(shared)} perturbation(s) jointly and each alone, {flips}, a wrong FAIL at most "
             f"{drop.alpha:.0%}; not worse: betting_cs per perturbation, Holm)"]
    if drop.difference is not None:
        detect = ("no drop" if drop.detectable_drop is None else f"a drop of {drop.detectable_drop:.3f} in every perturbation")
        one = ("" if drop.detectable_drop_one is None else f", {drop.detectable_drop_one:.3f} in one perturbation alone")
        lines.append(f"  jointly: {drop.tasks} shared task(s), mean difference {drop.difference:+.4f}, p(worse) {drop.p_joint:.4f}; "
                     f"with this evidence it would catch {detect}{one} with 80% power")
    for p in shared:
        r = results[p]
        diff = "n/a" if r.difference is None else f"{r.difference:+.4f}"
        lines.append(f"  {verdicts[p]:<12} {p}: {r.tasks} shared task(s), mean difference {diff}, "
                     f"p(worse) {drop.p_values.get(p, 1.0):.4f} (sign flip), bounds [{r.lower:+.4f}, {r.upper:+.4f}], "
                     f"p(not worse) {r.p_not_worse:.4f}")
    for p in sorted(set(cand) ^ set(base)):
        lines.append(f"  not compared {p}: only the {'candidate' if p in cand else 'baseline'} has it")
    return GateVerdict(verdict, candidate.headline.lower_bound, margin, tuple(lines))


__all__ = ["EXIT_CODES", "CellVerdict", "GateVerdict", "advice", "cell_bounds", "cell_verdict", "gate_verdict", "regression_verdict"]
