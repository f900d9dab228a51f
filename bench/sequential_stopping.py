"""Tasks saved by stopping a cell as soon as its anytime-valid bound decides, against fixed-n.

    python bench/sequential_stopping.py [--studies 2000] [--max-tasks 300] [--repeats 2]
                                        [--target 0.90] [--min-tasks 5] [--seed 2026]

The reference domain's study runs each task twice (accounts_payable: 22 tasks x 2 repeats per
cell); here a cell draws up to `--max-tasks` tasks from a population whose mean conformance is the
true rate, runs each `--repeats` times, and:

* sequential: after every task from `--min-tasks` on, `stop_decision` (betting_cs, anytime-valid,
  each wrong verdict at most 5%) stops at the first "pass" or "fail"; undecided at the cap is
  INCONCLUSIVE;
* fixed-n: the gate's `wilson_tasks` bound, looked at once after n tasks. At each true rate the n
  printed is the smallest whose chance of the right verdict (PASS above the target, FAIL below)
  matches the sequential rule's, so both rules are compared at the same power, and both keep each
  wrong verdict at or under 5% (their observed wrong-verdict rates are printed).

Trials saved = 1 - (mean tasks the sequential rule ran) / n, for the same runs per task; rows
where the sequential rule is right less than half the time (true rate close to the target) are
not compared.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from plumbline_otel.analyse.simulate import Population, repeat_pattern, sequential_stops, simulate_population
from plumbline_otel.analyse.stats import task_bounds

TRUE_RATES = (0.70, 0.80, 0.85, 0.88, 0.93, 0.96, 0.98, 0.995, 1.0)
MIN_POWER = 0.5  # rows where the sequential rule is right less often than this are not compared


def populations(rate: float) -> list[Population]:
    mixed = Population(rate, 0.05, 0.03, 0.0)
    return [Population(rate, 0.3)] + ([mixed] if mixed.valid else [])


def fixed_n_power(ks: np.ndarray, ns: np.ndarray, target: float, truth_passes: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per n = 1..tasks: the share of right verdicts and of wrong verdicts of the fixed-n gate."""
    right, wrong = [], []
    for n in range(1, ks.shape[1] + 1):
        lower, upper = task_bounds(ks[:, :n], ns[:n])
        passed, failed = lower >= target, upper < target
        right.append((passed if truth_passes else failed).mean())
        wrong.append((failed if truth_passes else passed).mean())
    return np.array(right), np.array(wrong)


def row(rng: np.random.Generator, q: Population, args: argparse.Namespace) -> tuple[str, float, float]:
    ns = repeat_pattern(args.max_tasks, str(args.repeats))
    ks = simulate_population(rng, q, ns, args.studies)
    decision, used = sequential_stops(ks / ns, args.target, args.min_tasks)
    truth_passes = q.rate >= args.target
    right = float((decision == (1 if truth_passes else -1)).mean())
    wrong = float((decision == (-1 if truth_passes else 1)).mean())
    fixed_right, fixed_wrong = fixed_n_power(ks, ns, args.target, truth_passes)
    # The n from which on fixed-n is at least as often right (small n can be right by discreteness).
    stays = np.minimum.accumulate(fixed_right[::-1])[::-1] >= right - 1e-12
    n = int(np.flatnonzero(stays)[0]) + 1 if stays.any() and right >= MIN_POWER else None
    saved = f"{1.0 - float(used.mean()) / n:>6.1%}" if n else f"{'-':>6}"
    fixed = f"{n:>5} {fixed_right[n - 1]:>6.3f} {fixed_wrong[n - 1]:>6.3f}" if n else f"{'-':>5} {'-':>6} {'-':>6}"
    line = (f"{q.rate:>6} {q.label:<24} {right:>6.3f} {wrong:>6.3f} {float((decision == 0).mean()):>6.3f} "
            f"{used.mean():>7.1f}  {fixed}  {saved}")
    return line, float(used.mean()) * args.repeats, (n or 0) * args.repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", type=int, default=2000)
    parser.add_argument("--max-tasks", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--target", type=float, default=0.90)
    parser.add_argument("--min-tasks", type=int, default=5)
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args()
    started = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    print(f"target {args.target}, {args.repeats} runs per task, at most {args.max_tasks} tasks, first look after {args.min_tasks}")
    print(f"{'truth':>6} {'population':<24} {'right':>6} {'wrong':>6} {'undec':>6} {'tasks':>7}  "
          f"{'n':>5} {'right':>6} {'wrong':>6}  {'saved':>6}")
    print(f"{'':>31}{'--- sequential (betting_cs) ---':>33}  {'--- fixed n (wilson) ---':>19}")
    seq_trials = fixed_trials = 0.0
    for rate in TRUE_RATES:
        for q in populations(rate):
            line, seq, fixed = row(rng, q, args)
            print(line)
            if fixed:
                seq_trials, fixed_trials = seq_trials + seq, fixed_trials + fixed
    print(f"\nOver the rows with a matching fixed n: {seq_trials:.0f} trials sequential vs {fixed_trials:.0f} fixed-n "
          f"({1 - seq_trials / fixed_trials:.0%} saved); {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
