"""Power and size of `gate --baseline`: the paired sign-flip test against the betting test it replaced (issue 38).

    python bench/baseline_power.py [--studies 400] [--tasks 22] [--repeats 2] [--perturbations 6]
                                   [--margin 0.05] [--flips 4000] [--seed 2026]

The demo's size by default: 22 tasks x 2 repeats x 6 perturbations, for the baseline and for the
candidate. A task's rate is beta (mean 0.9, within-task correlation 0.3), lowered per perturbation
by 0-0.10, the same task rates for both agents; the candidate's rates are the baseline's minus a
drop (floored at 0), in every perturbation or in one alone; runs are Bernoulli at those rates.

For each scenario, over `--studies` simulated pairs of certificates, the share each test calls
"worse": with no drop (identical agents: size, which must be at most 5% and is 0 for the gate's
default margin) and with drops of 0.05-0.30 (power). "previous" is `stats.paired_task_regression`
per perturbation with Holm (the gate before issue 38); "sign flip" is `regression.drop_test`.
Last, the smallest drop the test prints as detectable at 80% power against the drop at which the
simulated power first reaches 0.80.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from plumbline_otel.analyse.regression import drop_test
from plumbline_otel.analyse.stats import paired_task_regression, regression_verdicts

DROPS = (0.0, 0.05, 0.10, 0.15, 0.20, 0.30)
SHIFTS = (0.0, 0.02, 0.05, 0.10, 0.03, 0.08)  # per-perturbation lowering of the task rates
Counts = dict[str, dict[str, tuple[int, int]]]


def pair(rng: np.random.Generator, args: argparse.Namespace, drop: float, only: int | None) -> tuple[Counts, Counts]:
    """One simulated (candidate, baseline) pair of per-task counts."""
    spread = 1.0 / 0.3 - 1.0
    task = rng.beta(0.9 * spread, 0.1 * spread, size=args.tasks)
    shifts = np.resize(np.array(SHIFTS), args.perturbations)
    base = np.clip(task[:, None] - shifts[None, :], 0.0, 1.0)
    cand = base.copy()
    columns = slice(None) if only is None else slice(only, only + 1)
    cand[:, columns] = np.clip(base[:, columns] - drop, 0.0, 1.0)
    kb, kc = rng.binomial(args.repeats, base), rng.binomial(args.repeats, cand)

    def counts(k: np.ndarray) -> Counts:
        return {f"p{j}": {f"t{i}": (int(k[i, j]), args.repeats) for i in range(args.tasks)} for j in range(args.perturbations)}

    return counts(kc), counts(kb)


def previous_worse(cand: Counts, base: Counts, margin: float) -> bool:
    results = {p: paired_task_regression(cand[p], base[p], margin=margin) for p in cand}
    return "worse" in regression_verdicts(results).values()


def scenario(rng: np.random.Generator, args: argparse.Namespace, drop: float, only: int | None) -> tuple[float, float, float]:
    """(previous power, sign-flip power, mean printed detectable drop) over the studies of one scenario."""
    old = new = 0
    printed = []
    for _ in range(args.studies):
        cand, base = pair(rng, args, drop, only)
        old += previous_worse(cand, base, args.margin)
        result = drop_test(cand, base, margin=args.margin, flips=args.flips)
        new += result.worse
        shown = result.detectable_drop if only is None else result.detectable_drop_one
        if shown is not None:
            printed.append(shown)
    return old / args.studies, new / args.studies, float(np.mean(printed)) if printed else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", type=int, default=400)
    parser.add_argument("--tasks", type=int, default=22)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--perturbations", type=int, default=6)
    parser.add_argument("--margin", type=float, default=0.05)
    parser.add_argument("--flips", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args()
    started = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    print(f"{args.tasks} tasks x {args.repeats} repeats x {args.perturbations} perturbations, margin {args.margin}, "
          f"{args.studies} studies per row; share called worse (a drop of 0 is the size)")
    print(f"{'drop':>5} {'where':<18} {'previous':>9} {'sign flip':>9} {'printed 80% drop':>17}")
    for where, only in (("every perturbation", None), ("one perturbation", 3)):
        powers = []
        for drop in DROPS:
            old, new, printed = scenario(rng, args, drop, only)
            powers.append(new)
            print(f"{drop:>5.2f} {where:<18} {old:>9.3f} {new:>9.3f} {printed:>17.3f}")
        reached = next((d for d, p in zip(DROPS, powers) if p >= 0.8), None)
        print(f"      simulated: power first reaches 0.80 at a drop of {reached} ({where}; drops tried {DROPS})")
    print(f"\n{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
