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

Issue 38 adds two tables (`--part orders`, `--part looks`; both run by default):

* orders: a study's 100 planned tasks, 80 of one kind (always clean) then 20 of another
  (conforming half the time): true mean 0.90 against a target of 0.95. Judged in plan order
  (keys sorted, the kinds in blocks) the rule passes wrongly; in a random order (what a sequential
  study now does, `replay.sequential.task_order`) it must not. Also the reverse (failing kind first).
* looks: what happens when a fixed-n study is looked at more than once, at a true mean just under
  the target (wrong PASS) and at the target (wrong FAIL): the gate's fixed-n bound looked at after
  every task; the old advice followed (INCONCLUSIVE at n0, add the fixed-n bound's "N more" tasks
  and gate again, as often as it stays INCONCLUSIVE); and the advice now given (INCONCLUSIVE at
  n0, continue as a sequential study: betting_cs over all the tasks after every new one).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from plumbline_otel.analyse.simulate import Population, gate_fails, repeat_pattern, sequential_stops, simulate_population
from plumbline_otel.analyse.stats import task_lower, tasks_needed

TRUE_RATES = (0.70, 0.80, 0.85, 0.88, 0.93, 0.96, 0.98, 0.995, 1.0)
MIN_POWER = 0.5  # rows where the sequential rule is right less often than this are not compared


def populations(rate: float) -> list[Population]:
    mixed = Population(rate, 0.05, 0.03, 0.0)
    return [Population(rate, 0.3)] + ([mixed] if mixed.valid else [])


def fixed_n_power(ks: np.ndarray, ns: np.ndarray, target: float, truth_passes: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per n = 1..tasks: the share of right verdicts and of wrong verdicts of the fixed-n gate."""
    right, wrong = [], []
    for n in range(1, ks.shape[1] + 1):
        passed, failed = task_lower(ks[:, :n], ns[:n]) >= target, gate_fails(ks[:, :n], ns[:n], target)
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


def order_table(rng: np.random.Generator, studies: int, repeats: int, target: float = 0.95, min_tasks: int = 5) -> list[str]:
    """Wrong PASS of the sequential rule on 80 clean tasks + 20 half-failing ones, by the order they are judged in."""
    ns = np.full(100, repeats)
    kind = np.array([1.0] * 80 + [0.5] * 20)
    ks = rng.binomial(ns, np.broadcast_to(kind, (studies, 100)))
    rates = ks / ns
    orders = {
        "plan order (clean kind first)": rates,
        "plan order (failing kind first)": rates[:, ::-1],
        "random order (task_order)": np.take_along_axis(rates, np.argsort(rng.random(rates.shape), axis=1), axis=1),
    }
    lines = [f"80 clean tasks then 20 conforming half the time (true mean 0.90), target {target}, {repeats} runs per task:",
             f"{'order':<34} {'wrong PASS':>10} {'FAIL':>6} {'undecided':>9} {'tasks':>6}"]
    for label, ordered in orders.items():
        decision, used = sequential_stops(ordered, target, min_tasks)
        lines.append(f"{label:<34} {float((decision == 1).mean()):>10.3f} {float((decision == -1).mean()):>6.3f} "
                     f"{float((decision == 0).mean()):>9.3f} {used.mean():>6.1f}")
    return lines


def _looks(ks: np.ndarray, ns: np.ndarray, target: float, start: int) -> np.ndarray:
    """The fixed-n gate looked at after every task from `start` on: the first PASS (1) or FAIL (-1), else 0."""
    decision = np.zeros(ks.shape[0], dtype=int)
    for t in range(start, ks.shape[1] + 1):
        open_ = decision == 0
        passed = task_lower(ks[:, :t], ns[:t]) >= target
        failed = gate_fails(ks[:, :t], ns[:t], target)
        decision = np.where(open_ & passed, 1, np.where(open_ & failed, -1, decision))
    return decision


def looks_table(rng: np.random.Generator, studies: int, repeats: int, n0: int = 30, cap: int = 400) -> list[str]:
    """Wrong verdicts of three ways of looking again at a fixed-n study (module docstring)."""
    lines = [f"fixed-n study of {n0} tasks x {repeats} runs, looked at again (continuing up to {cap} tasks):",
             f"{'target':>6} {'truth':>6} {'population':<24} {'every look':>10} {'old advice':>10} {'new advice':>10}"]
    for target, gap in ((0.90, 0.01), (0.90, 0.0), (0.95, 0.005), (0.95, 0.0)):
        truth = target - gap
        for q in (Population(truth, 0.3), Population(truth, 0.05, 0.03, 0.0)):
            if not q.valid:
                continue
            ns = repeat_pattern(cap, str(repeats))
            ks = simulate_population(rng, q, ns, studies)
            wrong = -1 if gap == 0.0 else 1  # at the target a FAIL is wrong, below it a PASS
            every = _looks(ks, ns, target, 5)
            first_pass = task_lower(ks[:, :n0], ns[:n0]) >= target
            first_fail = gate_fails(ks[:, :n0], ns[:n0], target)
            first = np.where(first_pass, 1, np.where(first_fail, -1, 0))
            old = first.copy()
            for i in np.flatnonzero(first == 0):  # follow the advice until the gate decides or the cap
                t = n0
                while old[i] == 0 and t < cap:
                    per = [(int(k), int(n)) for k, n in zip(ks[i, :t], ns[:t])]
                    t = min(cap, t + max(1, tasks_needed(target, per) or cap))
                    old[i] = 1 if task_lower(ks[i:i + 1, :t], ns[:t])[0] >= target else (
                        -1 if gate_fails(ks[i:i + 1, :t], ns[:t], target)[0] else 0)
            seq, _ = sequential_stops(ks / ns, target, n0)
            new = np.where(first != 0, first, seq)
            lines.append(f"{target:>6} {truth:>6} {q.label:<24} {float((every == wrong).mean()):>10.3f} "
                         f"{float((old == wrong).mean()):>10.3f} {float((new == wrong).mean()):>10.3f}"
                         f"   ({'wrong PASS' if wrong == 1 else 'wrong FAIL'})")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", type=int, default=2000)
    parser.add_argument("--max-tasks", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--target", type=float, default=0.90)
    parser.add_argument("--min-tasks", type=int, default=5)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--part", choices=("all", "savings", "orders", "looks"), default="all")
    args = parser.parse_args()
    started = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    if args.part in ("all", "orders"):
        print("\n".join(order_table(rng, args.studies, args.repeats)) + "\n")
    if args.part in ("all", "looks"):
        print("\n".join(looks_table(rng, args.studies, args.repeats)) + "\n")
    if args.part not in ("all", "savings"):
        print(f"{time.perf_counter() - started:.0f} s")
        return
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
