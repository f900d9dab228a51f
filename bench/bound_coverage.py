"""Coverage, width and monotonicity of every candidate gate bound (issue 28), by simulation.

    python bench/bound_coverage.py [--samples 4000] [--seed 2026] [--cases 3000]

Estimand: the mean conformance over the task population (mean over tasks of each task's rate).
For every cell of the grid (3-100 tasks; repeats 1, 3, 10, 20 each or spread 1-5 and 1-20; true
rates 0.80-0.999; beta-binomial task rates with within-task correlation 0-0.9, and two-point
mixtures where 2% or 5% of tasks always (or 95% of the time) fail and the rest are
flaky-but-good) it simulates `--samples` studies and scores each method's lower bound on the same
studies: coverage is the share at or below the true mean (one-sided; 0.95 is the requirement),
shortfall the mean of truth - lower (the one-sided width). Then the worst cells per method, random
(study, one more run) pairs that move a bound the wrong way, the issue's named cases, and a
summary table. `wilson_tasks` is the gate's method; `betting_cs` is the anytime-valid one.
"""

from __future__ import annotations

import argparse
import time
from itertools import product

import numpy as np

from plumbline_otel.analyse.simulate import METHODS, Cell, Population, cell, monotonicity_violations

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


def grid(samples: int, seed: int) -> list[Cell]:
    """Every cell; with one run per task the correlation cannot matter, so only rho 0 is run there."""
    rng = np.random.default_rng(seed)
    cells = []
    for g, pattern, q in product(TASKS, PATTERNS, populations()):
        if pattern == "1" and q.rho and not q.bad_share:
            continue
        cells.append(cell(rng, g, pattern, q, samples))
    return cells


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
    args = parser.parse_args()
    started = time.perf_counter()
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
