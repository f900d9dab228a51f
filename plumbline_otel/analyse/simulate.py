"""Simulated clustered runs, to measure how often an interval's lower bound covers the true rate.

Used by the coverage tests (tests/analyse/test_cluster_coverage.py, test_bound_coverage.py),
bench/bound_coverage.py and bench/sequential_stopping.py. The first part
(`coverage`) is the cluster_kg-era grid; the second (`Population`, `cell`, `METHODS`) is issue 28's:
beta-binomial populations and two-point mixtures, unequal repeats, every candidate bound scored on
the same studies, and random (study, one more run) pairs for monotonicity.
Each task gets its own pass rate drawn from a beta distribution with mean `rate` and intraclass
correlation `rho` (a + b = 1/rho - 1), then its repeats are Bernoulli draws at that rate: the
beta-binomial model of "an agent that fails a task tends to fail it on every run". Everything
is vectorised over samples, so a grid cell of thousands of simulated studies takes milliseconds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import beta as beta_dist
from scipy.stats import norm

from plumbline_otel.analyse.stats import (
    BETS,
    CLUSTER_METHOD,
    SEQUENTIAL_METHOD,
    TASK_METHOD,
    _wilson_arrays,
    betting_lower,
    cluster_bounds,
    fail_p_value,
    task_bounds,
    task_lower,
)


@dataclass(frozen=True)
class Coverage:
    """Share of simulated studies whose lower bound was at or below the true rate, per method."""

    tasks: int
    repeats: int
    rate: float
    rho: float
    samples: int
    cluster_kg: float
    wilson: float


def simulate_counts(rng: np.random.Generator, tasks: int, repeats: int, rate: float, rho: float, samples: int) -> np.ndarray:
    """Per-task pass counts, shape (samples, tasks), under the beta-binomial model above."""
    if rho <= 0.0:
        return rng.binomial(repeats, rate, size=(samples, tasks))
    spread = 1.0 / rho - 1.0
    return rng.binomial(repeats, rng.beta(rate * spread, (1.0 - rate) * spread, size=(samples, tasks)))


def wilson_lower(k: np.ndarray, n: float, confidence: float = 0.95) -> np.ndarray:
    """Two-sided Wilson lower bounds for pass counts k out of n runs (runs treated as independent)."""
    z = float(norm.ppf(1.0 - (1.0 - confidence) / 2.0))
    p, z2n = k / n, z * z / n
    centre = (p + z2n / 2.0) / (1.0 + z2n)
    return np.where(p == 0.0, 0.0, centre - z / (1.0 + z2n) * np.sqrt(p * (1.0 - p) / n + z2n / (4.0 * n)))


def coverage(rng: np.random.Generator, tasks: int, repeats: int, rate: float, rho: float, samples: int) -> Coverage:
    """Coverage of the `cluster_kg` lower bound and of plain Wilson on the same simulated studies."""
    ks = simulate_counts(rng, tasks, repeats, rate, rho, samples)
    lower, _, _ = cluster_bounds(ks, np.full(tasks, repeats))
    plain = wilson_lower(ks.sum(axis=1), tasks * repeats)
    return Coverage(tasks, repeats, rate, rho, samples, float((lower <= rate).mean()), float((plain <= rate).mean()))




# ---- The issue-28 grid: every candidate bound on beta-binomial and two-point task populations -----


@dataclass(frozen=True)
class Population:
    """A population of tasks whose mean conformance (the estimand) is `rate`.

    With `bad_share` 0, task rates are beta with mean `rate` and intraclass correlation `rho` (0:
    every task at `rate`). Otherwise a `bad_share` of tasks conform at `bad_rate` (0: always fail)
    and the rest are flaky-but-good: beta with correlation `rho` around the mean that makes the
    whole population's mean `rate`.
    """

    rate: float
    rho: float = 0.0
    bad_share: float = 0.0
    bad_rate: float = 0.0

    @property
    def good_rate(self) -> float:
        return (self.rate - self.bad_share * self.bad_rate) / (1.0 - self.bad_share)

    @property
    def valid(self) -> bool:
        return 0.0 < self.good_rate <= 1.0

    @property
    def label(self) -> str:
        if not self.bad_share:
            return f"beta rho={self.rho:g}"
        return f"mix {self.bad_share:.0%} at {self.bad_rate:g}, rho={self.rho:g}"


def _beta_rates(rng: np.random.Generator, mean: float, rho: float, size: tuple[int, int]) -> np.ndarray:
    if rho <= 0.0 or mean >= 1.0:
        return np.full(size, mean)
    spread = 1.0 / rho - 1.0
    return rng.beta(mean * spread, (1.0 - mean) * spread, size=size)


def simulate_population(rng: np.random.Generator, population: Population, ns: np.ndarray, samples: int) -> np.ndarray:
    """Per-task pass counts, shape (samples, tasks), for tasks of run counts `ns` drawn from `population`."""
    size = (samples, len(ns))
    rates = _beta_rates(rng, population.good_rate, population.rho, size)
    if population.bad_share:
        rates = np.where(rng.random(size) < population.bad_share, population.bad_rate, rates)
    return rng.binomial(np.broadcast_to(ns, size), rates)


def repeat_pattern(tasks: int, pattern: str) -> np.ndarray:
    """Run counts per task: "10" is 10 each, "1-20" spreads counts evenly from 1 to 20 over the tasks."""
    low, _, high = pattern.partition("-")
    if not high:
        return np.full(tasks, int(low))
    return np.round(np.linspace(int(low), int(high), tasks)).astype(np.int64)


def _rates(ks: np.ndarray, ns: np.ndarray) -> np.ndarray:
    ks = np.atleast_2d(ks).astype(float)
    return np.asarray(ks / np.broadcast_to(ns, ks.shape))


def _wilson_tasks_one_sided(ks: np.ndarray, ns: np.ndarray) -> np.ndarray:
    """Wilson on per-task means at the one-sided z (0.90 two-sided): shown to undercover by discreteness."""
    return task_lower(ks, ns, 0.90)


def _clopper_pearson_tasks(ks: np.ndarray, ns: np.ndarray) -> np.ndarray:
    """One-sided 95% Clopper-Pearson on per-task means (successes = sum of rates, n = tasks)."""
    y = _rates(ks, ns)
    x, g = y.sum(axis=1), y.shape[1]
    lower = beta_dist.ppf(0.05, np.maximum(x, 1e-12), g - x + 1.0)
    return np.asarray(np.where(((y > 0).sum(axis=1) >= 2) & (x > 0), lower, 0.0))


def _empirical_bernstein(ks: np.ndarray, ns: np.ndarray) -> np.ndarray:
    """One-sided 95% empirical-Bernstein bound of Maurer and Pontil (2009) on per-task means."""
    y = _rates(ks, ns)
    g = y.shape[1]
    if g < 2:
        return np.zeros(y.shape[0])
    log_term = math.log(2.0 / 0.05)
    var = y.var(axis=1, ddof=1)
    return np.asarray(np.maximum(0.0, y.mean(axis=1) - np.sqrt(2.0 * var * log_term / g) - 7.0 * log_term / (3.0 * (g - 1))))


def _cluster_kg(ks: np.ndarray, ns: np.ndarray) -> np.ndarray:
    """Today's gate: ``cluster_kg`` as `clustered_interval` computes it (two-sided 95%, so its lower end)."""
    ks = np.atleast_2d(ks)
    ns2 = np.broadcast_to(ns, ks.shape)
    if (ns2 == ns2[0]).all():
        return np.asarray(cluster_bounds(ks, ns2[0])[0])
    return np.array([cluster_bounds(k[None, :], n)[0][0] for k, n in zip(ks, ns2)])


def _betting_cs(ks: np.ndarray, ns: np.ndarray) -> np.ndarray:
    """The anytime-valid ``betting_cs`` lower bound; it depends only on the multiset of rates, so
    each distinct sorted row is computed once (most rows repeat at high rates)."""
    rates = np.sort(_rates(ks, ns), axis=1)
    distinct, back = np.unique(rates, axis=0, return_inverse=True)
    return np.asarray(betting_lower(distinct)[np.ravel(back)])


LowerBound = Callable[[np.ndarray, np.ndarray], np.ndarray]
# Every candidate lower bound, as f(ks (samples, tasks), ns broadcastable) -> lower (samples,).
METHODS: dict[str, LowerBound] = {
    TASK_METHOD: lambda ks, ns: task_lower(ks, ns),
    "wilson_tasks_1sided": _wilson_tasks_one_sided,
    "clopper_pearson_tasks": _clopper_pearson_tasks,
    "empirical_bernstein": _empirical_bernstein,
    SEQUENTIAL_METHOD: _betting_cs,
    CLUSTER_METHOD: _cluster_kg,
}


@dataclass(frozen=True)
class Cell:
    """One grid cell: per method, the share of studies whose lower bound is <= the truth, and the mean truth - lower."""

    tasks: int
    pattern: str
    population: Population
    samples: int
    coverage: dict[str, float]
    shortfall: dict[str, float]


def cell(
    rng: np.random.Generator, tasks: int, pattern: str, population: Population, samples: int,
    methods: Sequence[str] = tuple(METHODS),
) -> Cell:
    """Simulate `samples` studies of one cell and score every method on the same studies."""
    ns = repeat_pattern(tasks, pattern)
    ks = simulate_population(rng, population, ns, samples)
    lowers = {m: METHODS[m](ks, ns) for m in methods}
    truth = population.rate
    return Cell(
        tasks, pattern, population, samples,
        {m: float((lo <= truth + 1e-12).mean()) for m, lo in lowers.items()},
        {m: float((truth - lo).mean()) for m, lo in lowers.items()},
    )


def random_tasks(rng: np.random.Generator, max_tasks: int = 40, max_runs: int = 10) -> list[tuple[int, int]]:
    """A random small study, biased towards high rates: per-task (conforming, runs)."""
    tasks = []
    for _ in range(int(rng.integers(1, max_tasks + 1))):
        n = int(rng.integers(1, max_runs + 1))
        c = n - int(rng.binomial(n, float(rng.choice([0.02, 0.1, 0.5]))))
        tasks.append((c, n))
    return tasks


def one_more_run(tasks: list[tuple[int, int]], conforming: bool, where: int) -> list[tuple[int, int]]:
    """`tasks` with one more run: in task `where`, or as a new task when `where` == len(tasks)."""
    if where == len(tasks):
        return [*tasks, (int(conforming), 1)]
    c, n = tasks[where]
    return [*tasks[:where], (c + int(conforming), n + 1), *tasks[where + 1:]]


def _wrong_moves(value: Callable[[np.ndarray, np.ndarray], float], rng: np.random.Generator, cases: int) -> int:
    """How many of `cases` random (study, extra run) pairs move `value` (a bound of one study's per-task counts) the
    wrong way: down after a conforming run, up after a failing one."""
    wrong = 0
    for _ in range(cases):
        tasks = random_tasks(rng)
        where = int(rng.integers(0, len(tasks) + 1))
        conforming = bool(rng.random() < 0.5)
        after = one_more_run(tasks, conforming, where)
        before_v, after_v = (value(np.array([[c for c, _ in t]]), np.array([n for _, n in t])) for t in (tasks, after))
        wrong += (after_v < before_v - 1e-9) if conforming else (after_v > before_v + 1e-9)
    return wrong


def monotonicity_violations(method: str, rng: np.random.Generator, cases: int) -> int:
    """How many of `cases` random (study, extra run) pairs move `method`'s lower bound the wrong way."""
    bound = METHODS[method]
    return _wrong_moves(lambda ks, ns: float(bound(ks, ns)[0]), rng, cases)


# ---- Sequential stopping ---------------------------------------------------------------------------


def _capital_paths(values: np.ndarray, m: float) -> np.ndarray:
    """Log wealth after each task of betting that the mean of `values` (samples, tasks) is above m."""
    bets = np.array(BETS)
    logs = np.cumsum(np.log1p(bets[None, None, :] * (values[:, :, None] / m - 1.0)), axis=1)
    peak = logs.max(axis=2)
    return np.asarray(peak + np.log(np.exp(logs - peak[:, :, None]).mean(axis=2)))


def sequential_stops(
    rates: np.ndarray, target: float, min_tasks: int = 2, confidence: float = 0.95
) -> tuple[np.ndarray, np.ndarray]:
    """`stop_decision` after every task of each simulated study (rows of per-task rates, in order).

    Returns the decision (1 pass, -1 fail, 0 still undecided after the last task) and the number of
    tasks run when it was taken. A lower bound at or above the target is the bettor's wealth at m =
    target reaching 1 / alpha, so the wealth path at that one m decides every look at once.
    """
    threshold = math.log(1.0 / (1.0 - confidence))
    seen = np.arange(1, rates.shape[1] + 1)[None, :] >= min_tasks
    passing = (_capital_paths(rates, target) >= threshold) & (np.cumsum(rates > 0, axis=1) >= 2) & seen
    failing = (_capital_paths(1.0 - rates, 1.0 - target) >= threshold) & (np.cumsum(rates < 1, axis=1) >= 2) & seen
    decided = passing | failing
    first = np.where(decided.any(axis=1), decided.argmax(axis=1), rates.shape[1] - 1)
    rows = np.arange(rates.shape[0])
    decision = np.where(passing[rows, first], 1, np.where(failing[rows, first], -1, 0))
    return decision, first + 1


# ---- Issue 38: the upper end and the three verdicts --------------------------------------------------


def _failure_stats(ks: np.ndarray, ns: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Per study: the summed failure (sum of 1 - rate), how many tasks fell short of 1, and the task count."""
    y = _rates(ks, ns)
    return (1.0 - y).sum(axis=1), (y < 1.0).sum(axis=1), y.shape[1]


def gate_fails(ks: np.ndarray, ns: np.ndarray, target: float, confidence: float = 0.95) -> np.ndarray:
    """Whether the gate's upper end (``wilson_tasks``) is below `target`: its FAIL, without bisecting the bound.

    The upper bound is below the target exactly when the failures' p-value at the target is at
    most 1 - confidence (`stats.fail_p_value`) and two tasks fell short; a test holds this equal to
    `task_bounds`'s upper end.
    """
    failures, short, tasks = _failure_stats(ks, ns)
    distinct, back = np.unique(np.round(failures, 9), return_inverse=True)
    p = fail_p_value(distinct, tasks, target)[np.ravel(back)]
    return np.asarray((short >= 2) & (p <= 1.0 - confidence))


def _previous_upper(ks: np.ndarray, ns: np.ndarray) -> np.ndarray:
    """The gate's upper end before issue 38: Wilson at the two-sided z on per-task means, 1 until two tasks fail."""
    y = _rates(ks, ns)
    g = y.shape[1]
    upper = _wilson_arrays(y.mean(axis=1), np.full(y.shape[0], float(g)), float(norm.ppf(0.975)))[1]
    return np.asarray(np.where((y < 1.0).sum(axis=1) >= 2, upper, 1.0))


def _kl_upper(ks: np.ndarray, ns: np.ndarray, steps: int = 45) -> np.ndarray:
    """Hoeffding's (1963) Chernoff bound in its KL form: valid for any [0, 1] task rates, looser than Bentkus's."""
    y = _rates(ks, ns)
    g, p = y.shape[1], np.clip(y.mean(axis=1), 0.0, 1.0)
    threshold = math.log(1.0 / 0.05) / g

    def kl(m: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            a = np.where(p > 0, p * np.log(p / m), 0.0)
            b = np.where(p < 1, (1 - p) * np.log((1 - p) / (1 - m)), 0.0)
        return np.asarray(a + b)

    low, high = p.copy(), np.ones_like(p)
    for _ in range(steps):
        mid = (low + high) / 2.0
        kept = kl(mid) <= threshold
        low, high = np.where(kept, mid, low), np.where(kept, high, mid)
    return np.asarray(np.where(p >= 1.0, 1.0, low))


def _betting_upper(ks: np.ndarray, ns: np.ndarray) -> np.ndarray:
    """The anytime-valid ``betting_cs`` upper end (1 - the lower bound on 1 - rates)."""
    rates = np.sort(1.0 - _rates(ks, ns), axis=1)
    distinct, back = np.unique(rates, axis=0, return_inverse=True)
    return np.asarray(1.0 - betting_lower(distinct)[np.ravel(back)])


# Every candidate upper bound, f(ks, ns) -> upper (samples,); the gate's is scored by `gate_fails`.
UPPERS: dict[str, LowerBound] = {
    "wilson_upper (previous gate)": _previous_upper,
    "hoeffding_kl": _kl_upper,
    SEQUENTIAL_METHOD: _betting_upper,
}


@dataclass(frozen=True)
class VerdictCell:
    """One grid cell scored at both ends: coverage of each end and the gate's verdicts around the truth.

    `upper_coverage` maps each method (the gate's as TASK_METHOD) to the share of studies whose
    upper end is at or above the truth. `wrong_fail` is the gate's FAIL rate at target = truth (the
    worst case for a wrong FAIL), `wrong_pass` its PASS rate at a target just above the truth (the
    worst case for a wrong PASS), `inconclusive` its INCONCLUSIVE rate at target = truth;
    `pass_power` / `fail_power` its PASS rate at truth - `gap` and FAIL rate at truth + `gap`
    (None where that target is outside (0, 1)).
    """

    tasks: int
    pattern: str
    population: Population
    samples: int
    lower_coverage: float
    upper_coverage: dict[str, float]
    wrong_pass: float
    wrong_fail: float
    inconclusive: float
    pass_power: float | None
    fail_power: float | None


def verdict_cell(
    rng: np.random.Generator, tasks: int, pattern: str, population: Population, samples: int,
    uppers: Sequence[str] = tuple(UPPERS), gap: float = 0.05,
) -> VerdictCell:
    """Simulate `samples` studies of one cell; score both ends of the gate and the candidate upper ends on them."""
    ns = repeat_pattern(tasks, pattern)
    ks = simulate_population(rng, population, ns, samples)
    truth = population.rate
    lower = task_lower(ks, ns)
    fails_at_truth = gate_fails(ks, ns, truth)
    coverage = {TASK_METHOD: float(1.0 - fails_at_truth.mean())}
    coverage.update({m: float((UPPERS[m](ks, ns) >= truth - 1e-12).mean()) for m in uppers})
    passes_at_truth = lower >= truth
    below, above = truth - gap, truth + gap
    return VerdictCell(
        tasks, pattern, population, samples,
        lower_coverage=float((lower <= truth + 1e-12).mean()),
        upper_coverage=coverage,
        wrong_pass=float((lower > truth + 1e-12).mean()),
        wrong_fail=float(fails_at_truth.mean()),
        inconclusive=float((~passes_at_truth & ~fails_at_truth).mean()),
        pass_power=float((lower >= below).mean()) if below > 0.0 else None,
        fail_power=float(gate_fails(ks, ns, above).mean()) if above < 1.0 else None,
    )


def upper_monotonicity_violations(rng: np.random.Generator, cases: int) -> int:
    """How many of `cases` random (study, extra run) pairs move the gate's upper end the wrong way."""
    return _wrong_moves(lambda ks, ns: float(task_bounds(ks, ns)[1][0]), rng, cases)
