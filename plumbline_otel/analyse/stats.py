"""Intervals, tests and planning numbers for conformance rates (DESIGN.md section 7).

Rates here come from small samples (tens of runs per cell) that often sit at or near 100%, so the
Wald interval (p +/- z*se) is useless: it collapses to a point at 0% and 100%. Wilson's score
interval stays honest at the boundaries and is what the certificate headline is built on.

Runs of one task are not independent: an agent that fails a task tends to fail it on every run.
`clustered_interval` treats tasks as clusters. Its default, ``cluster_kg``, is the bound the
certificate headline and the gate use. It is a Wilson score interval on an *effective* number of
runs, in the manner of Korn and Graubard (1998):

* the design effect is taken at its upper confidence bound, not at its point estimate. The
  one-way ANOVA F statistic of the per-task counts bounds the intraclass correlation from above
  (``rho_U``); where the data cannot estimate it (no within-task variation: every task all-pass
  or all-fail, or all clean) ``rho_U`` is 1 and every task counts as one run. Zero failures
  cannot show that repeats are independent, so they are not credited as if they were;
* the effective n is scaled by ``(t[n-1] / t[G-1])**2`` for G tasks, the small-sample correction
  for estimating a variance from G clusters. One task therefore certifies nothing (bound 0);
* the two stages split the error rate (Bonferroni): half to the design effect, half to the rate.
  When every task ran once there is nothing to estimate about clustering, and the result is the
  plain Wilson interval exactly.

Its coverage is measured by simulation (tests/analyse/test_cluster_coverage.py,
bench/cluster_coverage.py): at least 0.95 for the lower bound over 5-30 tasks, 1-8 repeats, true
rates 0.80-0.98 and within-task correlation 0-0.6, where plain Wilson falls to 0.68. The price is
width: with repeats and no failures the bound counts tasks, not runs.

The design-effect Wilson interval at the *point* estimate of the correlation and a percentile
cluster bootstrap were rejected: both undercover with few tasks (the bootstrap degenerates to a
point at 0% and 100%).

Every result carries the counts it came from: a reported number without its n is not reported.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

CLUSTER_METHOD = "cluster_kg"
PermutationMethod = Literal["exact", "monte_carlo"]


@dataclass(frozen=True)
class Interval:
    """A rate with its confidence interval and the counts behind it.

    `clusters` and `design_effect` are set only by `clustered_interval`; `effective_n` is then the
    number of independent runs the clustered sample is worth.
    """

    k: int
    n: int
    rate: float | None  # None when n == 0: there is no rate to report
    lower: float
    upper: float
    confidence: float
    method: str
    clusters: int | None = None
    design_effect: float | None = None

    @property
    def effective_n(self) -> float:
        """Runs the sample is worth once correlation within tasks is accounted for."""
        return self.n / self.design_effect if self.design_effect else float(self.n)


@dataclass(frozen=True)
class PermutationResult:
    """A two-sample test of rate1 - rate2 == 0; `mc_se` is set only for the Monte Carlo test."""

    k1: int
    n1: int
    k2: int
    n2: int
    difference: float | None  # rate1 - rate2, None when either side has no runs
    p_value: float
    method: str
    resamples: int | None = None
    mc_se: float | None = None


@dataclass(frozen=True)
class PairedResult:
    """Exact McNemar test over pairs (a passed, b passed) of the same task and variant."""

    n: int
    both: int
    only_a: int
    only_b: int
    neither: int
    p_value: float


@dataclass(frozen=True)
class HolmResult:
    """Holm step-down adjustment; both tuples are in the order the p-values were given."""

    adjusted: tuple[float, ...]
    reject: tuple[bool, ...]
    alpha: float


def _scipy_stats() -> Any:
    """scipy.stats, imported on first use: it costs ~64 MB of memory and a second to import, which
    `plumbline serve` and `ingest` (that never compute a bound) should not pay."""
    import scipy.stats

    return scipy.stats


def _z(confidence: float, two_sided: bool) -> float:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    tail = (1.0 - confidence) / 2.0 if two_sided else 1.0 - confidence
    return float(_scipy_stats().norm.ppf(1.0 - tail))


def _check_counts(k: int, n: int) -> None:
    if n < 0 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")


def _wilson_bounds(p: float, n: float, z: float) -> tuple[float, float]:
    """Wilson bounds for a proportion p over n (n may be fractional: an effective sample size)."""
    z2n = z * z / n
    centre = (p + z2n / 2.0) / (1.0 + z2n)
    half = z / (1.0 + z2n) * math.sqrt(p * (1.0 - p) / n + z2n / (4.0 * n))
    # At p == 0 or 1 the formula gives the boundary exactly in reals; pin it against rounding.
    lower = 0.0 if p == 0.0 else max(0.0, centre - half)
    upper = 1.0 if p == 1.0 else min(1.0, centre + half)
    return lower, upper


def wilson_interval(k: int, n: int, confidence: float = 0.95, two_sided: bool = True) -> Interval:
    """Wilson score interval; one-sided (`two_sided=False`) gives a lower bound with upper 1.

    n == 0 is a normal state for an empty cell of a report, so it returns the whole [0, 1] with
    rate None rather than raising.
    """
    _check_counts(k, n)
    z = _z(confidence, two_sided)
    method = "wilson" if two_sided else "wilson_lower"
    if n == 0:
        return Interval(k, n, None, 0.0, 1.0, confidence, method)
    lower, upper = _wilson_bounds(k / n, n, z)
    return Interval(k, n, k / n, lower, upper if two_sided else 1.0, confidence, method)


def cluster_bounds(
    ks: np.ndarray, ns: np.ndarray, confidence: float = 0.95, two_sided: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ``cluster_kg`` bounds (and design effect used) for samples of per-task counts.

    `ks` and `ns` have shape (samples, tasks), every task with at least one run and every sample
    the same tasks' sizes: one call scores a whole simulation grid cell, and `clustered_interval`
    calls it with one sample. The method and its reasons are in the module docstring.
    """
    ks = np.atleast_2d(ks).astype(float)
    ns = np.broadcast_to(np.atleast_2d(ns), ks.shape).astype(float)
    g = ks.shape[1]
    n = float(ns[0].sum())
    k = ks.sum(axis=1)
    alpha = (1.0 - confidence) / (2.0 if two_sided else 1.0)
    if n == g:  # every task ran once: nothing to estimate about clustering, plain Wilson
        return (*_wilson_arrays(k / n, np.full(k.shape, n), float(_scipy_stats().norm.ppf(1.0 - alpha))), np.ones(k.shape))
    if g < 2:  # one task says nothing about the others
        return np.zeros(k.shape), np.ones(k.shape), np.full(k.shape, n)
    half = alpha / 2.0  # Bonferroni: half for the design effect, half for the rate
    deff = 1.0 + (float((ns[0] ** 2).sum()) / n - 1.0) * _rho_upper(ks, ns, half)
    df_scale = (_scipy_stats().t.ppf(1.0 - half, n - 1) / _scipy_stats().t.ppf(1.0 - half, g - 1)) ** 2
    lower, upper = _wilson_arrays(k / n, n / deff * df_scale, float(_scipy_stats().norm.ppf(1.0 - half)))
    return lower, upper, deff


def _rho_upper(ks: np.ndarray, ns: np.ndarray, gamma: float) -> np.ndarray:
    """Upper 1 - gamma confidence bound of the intraclass correlation, from the ANOVA F ratio.

    Under the one-way random-effects model F / ((1 + (n0 - 1) rho) / (1 - rho)) follows
    F(G - 1, n - G). No within-task variation (MSW == 0) leaves rho unestimable: 1.
    """
    g, n = ks.shape[1], float(ns[0].sum())
    k = ks.sum(axis=1)
    between = (ks * ks / ns).sum(axis=1)
    msb = (between - k * k / n) / (g - 1)
    msw = (k - between) / (n - g)
    n0 = (n - float((ns[0] ** 2).sum()) / n) / (g - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = (msb / msw) / _scipy_stats().f.ppf(gamma, g - 1, n - g)
        rho = (ratio - 1.0) / (ratio + n0 - 1.0)
    return np.where(msw > 1e-12, np.clip(np.nan_to_num(rho, nan=1.0), 0.0, 1.0), 1.0)


def _wilson_arrays(p: np.ndarray, n: np.ndarray, z: float) -> tuple[np.ndarray, np.ndarray]:
    """`_wilson_bounds` over arrays (n may be fractional)."""
    z2n = z * z / n
    centre = (p + z2n / 2.0) / (1.0 + z2n)
    half = z / (1.0 + z2n) * np.sqrt(p * (1.0 - p) / n + z2n / (4.0 * n))
    lower = np.where(p == 0.0, 0.0, np.maximum(0.0, centre - half))
    upper = np.where(p == 1.0, 1.0, np.minimum(1.0, centre + half))
    return lower, upper


def _kg_interval(clusters: list[tuple[int, int]], k: int, n: int, confidence: float, two_sided: bool) -> Interval:
    ks, ns = (np.array([column], dtype=np.int64) for column in zip(*clusters))
    lower, upper, deff = cluster_bounds(ks, ns, confidence, two_sided)
    return Interval(
        k, n, k / n, float(lower[0]), float(upper[0]) if two_sided else 1.0, confidence, CLUSTER_METHOD,
        clusters=len(clusters), design_effect=float(deff[0]),
    )


def clustered_interval(clusters: Iterable[tuple[int, int]], confidence: float = 0.95, two_sided: bool = True) -> Interval:
    """Interval for the pooled rate of per-task (k_i, n_i) counts, treating tasks as clusters (``cluster_kg``).

    The method and the reasons for it are in the module docstring. Tasks with no runs carry no
    information and are dropped; with no runs at all the result is the n == 0 Wilson interval.
    """
    _z(confidence, two_sided)  # validates confidence
    kept = []
    for k_i, n_i in clusters:
        _check_counts(k_i, n_i)
        if n_i:
            kept.append((k_i, n_i))
    k = sum(k_i for k_i, _ in kept)
    n = sum(n_i for _, n_i in kept)
    if n == 0:
        empty = wilson_interval(0, 0, confidence, two_sided)
        return Interval(0, 0, None, empty.lower, empty.upper, confidence, CLUSTER_METHOD, clusters=0)
    return _kg_interval(kept, k, n, confidence, two_sided)


def permutation_test(
    k1: int,
    n1: int,
    k2: int,
    n2: int,
    method: PermutationMethod = "exact",
    resamples: int = 20000,
    seed: int = 0,
) -> PermutationResult:
    """Two-sided permutation test of equal rates, on |rate1 - rate2|.

    With binary outcomes the permutation distribution of the number of successes landing in
    sample 1 is hypergeometric, so the exact test sums its probabilities over every table at
    least as extreme in |rate1 - rate2| (compared in integers, so ties are exact). The Monte
    Carlo variant draws that same count for random relabellings instead of shuffling the pooled
    outcomes one by one; it is there to check the exact test and for callers that want a
    resampling p-value. Its estimate is (hits + 1) / (resamples + 1), which is never 0.
    """
    if method not in ("exact", "monte_carlo"):
        raise ValueError(f"unknown permutation test method {method!r}")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    _check_counts(k1, n1)
    _check_counts(k2, n2)
    if n1 == 0 or n2 == 0:
        return PermutationResult(k1, n1, k2, n2, None, 1.0, method)
    difference = k1 / n1 - k2 / n2
    # Canonical order: the statistic is symmetric, and this makes the Monte Carlo draws (and so
    # its p-value) the same whichever sample the caller lists first.
    (ka, na), (kb, nb) = sorted([(k1, n1), (k2, n2)], key=lambda c: (c[1], c[0]))
    total, successes = na + nb, ka + kb

    def extremity(x: Any) -> Any:
        # |x/na - (successes - x)/nb| scaled by na*nb, so comparisons are exact in integers (x: an int or an integer array).
        return abs(x * nb - (successes - x) * na)

    observed = extremity(ka)
    if method == "exact":
        support = np.arange(max(0, na - (total - successes)), min(na, successes) + 1)
        pmf = _scipy_stats().hypergeom(total, successes, na).pmf(support)
        p = float(min(1.0, pmf[extremity(support) >= observed].sum()))
        return PermutationResult(k1, n1, k2, n2, difference, p, "exact")
    draws = np.random.default_rng(seed).hypergeometric(
        successes, total - successes, na, size=resamples
    )
    hits = int((extremity(draws.astype(np.int64)) >= observed).sum())
    p = (hits + 1) / (resamples + 1)
    se = math.sqrt(p * (1.0 - p) / resamples)
    return PermutationResult(k1, n1, k2, n2, difference, p, "monte_carlo", resamples, se)


def mcnemar_exact(pairs: Iterable[tuple[bool, bool]]) -> PairedResult:
    """Exact McNemar (sign test on discordant pairs) for two agents run on the same items.

    Pairing removes the between-task variation that dominates unpaired comparisons, so when both
    sides ran the same tasks and variants this is the more powerful test. Only pairs where exactly
    one side passed carry information; with none, p is 1.
    """
    counts = {(True, True): 0, (True, False): 0, (False, True): 0, (False, False): 0}
    for a, b in pairs:
        counts[(bool(a), bool(b))] += 1
    only_a, only_b = counts[(True, False)], counts[(False, True)]
    discordant = only_a + only_b
    p = _scipy_stats().binomtest(only_a, discordant, 0.5).pvalue if discordant else 1.0
    return PairedResult(
        n=sum(counts.values()),
        both=counts[(True, True)],
        only_a=only_a,
        only_b=only_b,
        neither=counts[(False, False)],
        p_value=float(p),
    )


def holm(p_values: Sequence[float], alpha: float = 0.05) -> HolmResult:
    """Holm step-down adjustment: controls the family-wise error over several comparisons.

    A report compares many (agent, perturbation) cells; without adjustment one of twenty is
    "significant" by chance. Holm is uniformly more powerful than Bonferroni and needs no
    independence assumption.
    """
    for p in p_values:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"p-values must be in [0, 1], got {p}")
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return HolmResult(tuple(adjusted), tuple(a <= alpha for a in adjusted), alpha)


def _check_k(n: int, c: int, k: int) -> None:
    _check_counts(c, n)
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={n}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased chance that at least one of k runs succeeds, from n runs with c successes.

    Using (c/n) directly, 1 - (1 - c/n)**k, is biased upward for small n; the combinatorial form
    counts the k-subsets of the observed runs instead.
    """
    _check_k(n, c, k)
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """Unbiased chance that all of k runs succeed (pass^k), from n runs with c successes.

    Reliability, not capability: an agent deployed to run a task repeatedly must succeed every
    time, which pass@k hides.
    """
    _check_k(n, c, k)
    return math.comb(c, k) / math.comb(n, k)


def trials_needed(
    target_lower_bound: float,
    failures: int = 0,
    confidence: float = 0.95,
    two_sided: bool = True,
) -> int:
    """Smallest n whose Wilson lower bound for (n - failures)/n reaches the target.

    Lets a report say how many runs a perturbation still needs ("73 clean runs for 0.95").
    The bound rises with n at a fixed failure count, so a doubling search then bisection finds
    the smallest n.
    """
    if not 0.0 < target_lower_bound < 1.0:
        raise ValueError(f"target lower bound must be in (0, 1), got {target_lower_bound}")
    if failures < 0:
        raise ValueError(f"failures must be >= 0, got {failures}")
    z = _z(confidence, two_sided)

    def reaches(n: int) -> bool:
        return _wilson_bounds((n - failures) / n, n, z)[0] >= target_lower_bound

    # n == failures means a rate of 0, which reaches no positive target; n == 1 (no failures) may.
    low = max(1, failures)
    if reaches(low):
        return low
    high = 2 * low
    while not reaches(high):
        low, high = high, 2 * high
    while high - low > 1:  # invariant: not reaches(low), reaches(high)
        mid = (low + high) // 2
        if reaches(mid):
            high = mid
        else:
            low = mid
    return high


@dataclass(frozen=True)
class RepeatAgreement:
    """What teams read beside a bound: pass^k over each task's repeats, and how often repeats disagree.

    `k` is the fewest runs any task has (so every task can supply k), `pass_k` the mean over tasks
    of the unbiased pass^k (`pass_hat_k`); `flip_rate` the share of tasks with two or more runs
    whose runs disagree. Either value is None when no task can supply it.
    """

    k: int
    pass_k: float | None
    flip_rate: float | None


def repeat_agreement(per_task: Iterable[tuple[int, int]]) -> RepeatAgreement:
    """pass^k and flip rate from per-task (passed, runs) counts; tasks with no runs are ignored."""
    tasks = [(c, n) for c, n in per_task if n > 0]
    if not tasks:
        return RepeatAgreement(0, None, None)
    k = min(n for _, n in tasks)
    pass_k = sum(pass_hat_k(n, c, k) for c, n in tasks) / len(tasks)
    repeated = [(c, n) for c, n in tasks if n > 1]
    flips = sum(0 < c < n for c, n in repeated) / len(repeated) if repeated else None
    return RepeatAgreement(k, pass_k, flips)
