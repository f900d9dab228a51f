"""Coverage, width and monotonicity of every candidate gate bound (issues 28 and 38), by simulation.

    python bench/bound_coverage.py [--samples 4000] [--seed 2026] [--cases 3000] [--part all|lower|upper]

Estimand: the mean conformance over the task population (mean over tasks of each task's rate).
For every cell of the grid (3-100 tasks; repeats 1, 3, 10, 20 each or spread 1-5 and 1-20; true
rates 0.80-0.999; beta-binomial task rates with within-task correlation 0-0.9, and two-point
mixtures where 2% or 5% of tasks always (or 95% of the time) fail and the rest are
flaky-but-good) it simulates `--samples` studies and scores each method's lower bound on the same
studies: coverage is the share at or below the true mean (one-sided; 0.95 is the requirement),
shortfall the mean of truth - lower (the one-sided width). Then the worst cells per method, random
(study, one more run) pairs that move a bound the wrong way, the issue's named cases, and a
summary table. `wilson_tasks` is the gate's method; `betting_cs` is the anytime-valid one.

The upper end and the three verdicts (issue 38, `--part upper`): on the same grid, the coverage of
every candidate upper end (the gate's Bentkus bound, the Wilson upper end it replaced, Hoeffding's
KL bound, betting_cs), random pairs that move the gate's upper end the wrong way, and the gate's
verdicts around the truth: a wrong PASS (target just above the true mean), a wrong FAIL (target
equal to it), how often it is INCONCLUSIVE there, and its power 0.05 either side. Then the
issue's named cases, exactly (single runs: binomial sums, no simulation).
"""

from __future__ import annotations

import argparse
import time
from itertools import product

import numpy as np
from scipy.stats import binom

from plumbline_otel.analyse.simulate import (
    METHODS,
    UPPERS,
    Cell,
    Population,
    VerdictCell,
    cell,
    monotonicity_violations,
    upper_monotonicity_violations,
    verdict_cell,
)
from plumbline_otel.analyse.stats import TASK_METHOD, task_bounds, task_interval

TASKS = (3, 5, 10, 20, 30, 50, 100)
PATTERNS = ("1", "3", "10", "20", "1-5", "1-20")
RATES = (0.80, 0.90, 0.95, 0.98, 0.995, 0.999)
RHOS = (0.0, 0.1, 0.3, 0.6, 0.9)
MIX_RATES = (0.80, 0.90, 0.95, 0.98)
MIX_SHARES = (0.02, 0.05)
MIX_BAD_RATES = (0.0, 0.05)
MIX_RHOS = (0.02, 0.2)
NAMED = {
    "30 tasks x 10 clean": [(10, 10)] * 30,
    "30 x 10, one failure": [(10, 10)] * 29 + [(9, 10)],
    "5 tasks x 1 clean": [(1, 1)] * 5,
    "5 tasks x 10 clean": [(10, 10)] * 5,
    "73 tasks x 1 clean": [(1, 1)] * 73,
    "73 tasks x 2 clean": [(2, 2)] * 73,
    "1 task x 80 clean": [(80, 80)],
}


def populations() -> list[Population]:
    beta = [Population(p, rho) for rho, p in product(RHOS, RATES)]
    mixed = [Population(p, rho, s, b) for p, s, b, rho in product(MIX_RATES, MIX_SHARES, MIX_BAD_RATES, MIX_RHOS)]
    return [q for q in beta + mixed if q.valid]


def grid_points() -> list[tuple[int, str, Population]]:
    """Every cell; with one run per task the correlation cannot matter, so only rho 0 is run there."""
    return [(g, pattern, q) for g, pattern, q in product(TASKS, PATTERNS, populations())
            if not (pattern == "1" and q.rho and not q.bad_share)]


def grid(samples: int, seed: int) -> list[Cell]:
    rng = np.random.default_rng(seed)
    return [cell(rng, g, pattern, q, samples) for g, pattern, q in grid_points()]


def verdict_grid(samples: int, seed: int, uppers: tuple[str, ...]) -> list[VerdictCell]:
    """The grid, plus each task count at a true mean of 1 - 0.55 / tasks, where the previous upper end was worst."""
    rng = np.random.default_rng(seed)
    near_one = [(g, pattern, Population(round(1.0 - 0.55 / g, 5), rho)) for g, pattern, rho in product(TASKS, PATTERNS, (0.0, 0.3))
                if not (pattern == "1" and rho)]
    return [verdict_cell(rng, g, pattern, q, samples, uppers) for g, pattern, q in grid_points() + near_one]


def _where(c: VerdictCell) -> str:
    return f"{c.tasks} x {c.pattern}, {c.population.label}, p={c.population.rate}"


def upper_summary(cells: list[VerdictCell], violations: int, cases: int) -> list[str]:
    """Per upper end: its worst cell, cells under 0.95, and (the gate's) wrong-way moves."""
    lines = ["| upper end | min coverage (cell) | cells < 0.95 | mean coverage | monotonicity violations |",
             "|---|---|---|---|---|"]
    for m in (TASK_METHOD, *[u for u in UPPERS if u in cells[0].upper_coverage]):
        worst = min(cells, key=lambda c: c.upper_coverage[m])
        below = sum(c.upper_coverage[m] < 0.95 for c in cells)
        mean = float(np.mean([c.upper_coverage[m] for c in cells]))
        name = "wilson_tasks (the gate: Bentkus)" if m == TASK_METHOD else m
        moves = f"{violations} of {cases}" if m == TASK_METHOD else "-"
        lines.append(f"| {name} | {worst.upper_coverage[m]:.3f} ({_where(worst)}) | {below} of {len(cells)} | {mean:.3f} | {moves} |")
    return lines


def verdict_summary(cells: list[VerdictCell]) -> list[str]:
    """The gate's three verdicts over the grid: the worst wrong PASS and wrong FAIL, INCONCLUSIVE and power."""
    worst_pass = max(cells, key=lambda c: c.wrong_pass)
    worst_fail = max(cells, key=lambda c: c.wrong_fail)
    powers_p = [c.pass_power for c in cells if c.pass_power is not None]
    powers_f = [c.fail_power for c in cells if c.fail_power is not None]
    return [
        f"wrong PASS (target just above the truth): max {worst_pass.wrong_pass:.3f} ({_where(worst_pass)}), "
        f"cells over 0.05: {sum(c.wrong_pass > 0.05 for c in cells)} of {len(cells)}",
        f"wrong FAIL (target equal to the truth):  max {worst_fail.wrong_fail:.3f} ({_where(worst_fail)}), "
        f"cells over 0.05: {sum(c.wrong_fail > 0.05 for c in cells)} of {len(cells)}",
        f"INCONCLUSIVE at target = truth: mean {np.mean([c.inconclusive for c in cells]):.3f}",
        f"power 0.05 from the target: PASS at truth - 0.05 mean {np.mean(powers_p):.3f}; "
        f"FAIL at truth + 0.05 mean {np.mean(powers_f):.3f} ({len(powers_f)} cells where that target is below 1)",
    ]


ISSUE_CASES = ((0.95, 10), (0.99, 50), (0.995, 100), (0.999, 500))


def named_fail_cases() -> list[str]:
    """The issue's cases, exactly: single-run tasks at a true mean equal to the target; P(FAIL) by binomial sums."""
    lines = [f"{'target':>6} {'tasks':>5}  {'P(FAIL) gate':>12}  {'P(FAIL) previous':>16}"]
    for target, n in ISSUE_CASES:
        failures = np.arange(n + 1)
        ks = np.array([[1] * (n - f) + [0] * f for f in failures])
        upper = task_bounds(ks, np.ones(n))[1]
        z = 1.959963984540054
        p = (n - failures) / n
        centre = (p + z * z / (2 * n)) / (1 + z * z / n)
        half = z / (1 + z * z / n) * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
        previous = np.where(failures >= 2, np.minimum(1.0, centre + half), 1.0)
        pmf = binom.pmf(failures, n, 1.0 - target)
        lines.append(f"{target:>6} {n:>5}  {pmf[upper < target].sum():>12.4f}  {pmf[previous < target].sum():>16.4f}")
    example = task_interval([(1, 1)] * 48 + [(0, 1)] * 2)
    lines.append(f"48 of 50 single-run tasks: bounds [{example.lower:.4f}, {example.upper:.4f}]: "
                 f"at 0.99 {'FAIL' if example.upper < 0.99 else 'INCONCLUSIVE'} (the previous upper end 0.9890 said FAIL)")
    return lines


def full_table(cells: list[Cell]) -> list[str]:
    names = list(METHODS)
    lines = [f"{'tasks':>5} {'runs':>5} {'population':<26} {'rate':>6}  " + "  ".join(f"{m[:12]:>12}" for m in names)]
    for c in cells:
        lines.append(f"{c.tasks:>5} {c.pattern:>5} {c.population.label:<26} {c.population.rate:>6}  "
                     + "  ".join(f"{c.coverage[m]:>12.3f}" for m in names))
    return lines


def worst_cells(cells: list[Cell], count: int = 5) -> list[str]:
    lines = []
    for m in METHODS:
        worst = sorted(cells, key=lambda c: c.coverage[m])[:count]
        lines.append(f"{m}: " + "; ".join(f"{c.coverage[m]:.3f} ({c.tasks} x {c.pattern}, {c.population.label}, p={c.population.rate})" for c in worst))
    return lines


def named_cases() -> list[str]:
    names = list(METHODS)
    lines = [f"{'case':<22} " + "  ".join(f"{m[:12]:>12}" for m in names)]
    for label, tasks in NAMED.items():
        ks, ns = np.array([[c for c, _ in tasks]]), np.array([n for _, n in tasks])
        lines.append(f"{label:<22} " + "  ".join(f"{float(METHODS[m](ks, ns)[0]):>12.3f}" for m in names))
    return lines


def clean_tasks_for(method: str, target: float = 0.95, repeats: int = 3, limit: int = 400) -> int | None:
    """Fewest clean tasks of `repeats` runs whose lower bound reaches `target` (None beyond `limit`)."""
    for g in range(2, limit + 1):
        if float(METHODS[method](np.full((1, g), repeats), np.full(g, repeats))[0]) >= target:
            return g
    return None


def summary(cells: list[Cell], violations: dict[str, int], cases: int) -> list[str]:
    lines = ["| method | min coverage (cell) | cells < 0.95 | mean truth - lower | clean tasks x3 for 0.95 | monotonicity violations |",
             "|---|---|---|---|---|---|"]
    for m in METHODS:
        worst = min(cells, key=lambda c: c.coverage[m])
        below = sum(c.coverage[m] < 0.95 for c in cells)
        width = float(np.mean([c.shortfall[m] for c in cells]))
        lines.append(f"| {m} | {worst.coverage[m]:.3f} ({worst.tasks} x {worst.pattern}, {worst.population.label}, p={worst.population.rate}) "
                     f"| {below} of {len(cells)} | {width:.3f} | {clean_tasks_for(m)} | {violations[m]} of {cases} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--cases", type=int, default=3000, help="random (study, one more run) pairs per method")
    parser.add_argument("--with-betting", action="store_true",
                        help="also score betting_cs's upper end on the upper grid (about 20x slower)")
    parser.add_argument("--part", choices=("all", "lower", "upper"), default="all",
                        help="lower: the issue-28 tables; upper: the upper end and the three verdicts (issue 38)")
    args = parser.parse_args()
    started = time.perf_counter()
    if args.part in ("all", "upper"):
        uppers = tuple(u for u in UPPERS if args.with_betting or u != "betting_cs")
        upper_cells = verdict_grid(args.samples, args.seed, uppers)
        moves = upper_monotonicity_violations(np.random.default_rng(args.seed), args.cases)
        print("The upper end (coverage: share of studies whose upper end is at or above the true mean):")
        print("\n".join(upper_summary(upper_cells, moves, args.cases)))
        print("\nThe gate's three verdicts over the grid:")
        print("\n".join(verdict_summary(upper_cells)))
        print("\nThe issue's cases (single runs, exact):")
        print("\n".join(named_fail_cases()))
        print(f"\n{len(upper_cells)} cells x {args.samples} simulated studies, in {time.perf_counter() - started:.0f} s\n")
        if args.part == "upper":
            return
    cells = grid(args.samples, args.seed)
    violations = {m: monotonicity_violations(m, np.random.default_rng(args.seed), args.cases) for m in METHODS}
    print("\n".join(full_table(cells)))
    print("\nWorst cells per method:")
    print("\n".join(worst_cells(cells)))
    print("\nThe issue's named cases (lower bounds):")
    print("\n".join(named_cases()))
    print()
    print("\n".join(summary(cells, violations, args.cases)))
    print(f"\n{len(cells)} cells x {args.samples} simulated studies, {args.cases} monotonicity cases per method, "
          f"in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
