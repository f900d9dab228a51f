"""Intervals, tests and planning numbers for conformance rates (DESIGN.md section 7).

Rates here come from small samples (tens of runs per cell) that often sit at or near 100%, so the
Wald interval (p +/- z*se) is useless: it collapses to a point at 0% and 100%. Wilson's score
interval stays honest at the boundaries and is what the certificate headline is built on.

Runs of one task are not independent: an agent that fails a task tends to fail it on every run.
`clustered_interval` widens the interval by how much the tasks disagree with each other; its
default is the design-effect-adjusted Wilson interval, not the cluster bootstrap, because

* it reduces exactly to the plain Wilson interval when the tasks show no between-task variation,
  so the per-cell interval and the clustered one agree on the "73 clean runs" arithmetic;
* it stays sensible at 0% and 100%, where a percentile bootstrap degenerates to a single point
  (every resample of all-passing tasks passes) and would claim certainty;
* with the handful of tasks a typical suite has (5 to 20), a percentile bootstrap undercovers;
* it needs no seed, so a report is reproducible without carrying one.

The bootstrap is kept as an option for many tasks and mid-range rates, where it makes no
parametric assumption about how the between-task variation is shaped.

Every result carries the counts it came from: a reported number without its n is not reported.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy.stats import binomtest, hypergeom, norm

ClusterMethod = Literal["design_effect", "bootstrap"]
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


def _z(confidence: float, two_sided: bool) -> float:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    tail = (1.0 - confidence) / 2.0 if two_sided else 1.0 - confidence
    return float(norm.ppf(1.0 - tail))


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


def _icc(clusters: Sequence[tuple[int, int]]) -> float:
    """ANOVA estimator of the intraclass correlation of binary outcomes, clipped to [0, 1].

    Not estimable (one cluster, no within-cluster replication, or no variation at all) means no
    evidence of clustering, so it returns 0 and the design effect is 1.
    """
    g = len(clusters)
    total_n = sum(n for _, n in clusters)
    total_k = sum(k for k, _ in clusters)
    if g < 2 or total_n <= g:
        return 0.0
    between = sum(k * k / n for k, n in clusters)
    msb = (between - total_k * total_k / total_n) / (g - 1)
    msw = (total_k - between) / (total_n - g)
    n0 = (total_n - sum(n * n for _, n in clusters) / total_n) / (g - 1)
    denominator = msb + (n0 - 1.0) * msw
    if denominator <= 0.0:
        return 0.0
    return min(1.0, max(0.0, (msb - msw) / denominator))


def _design_effect_interval(
    clusters: list[tuple[int, int]], k: int, n: int, confidence: float, two_sided: bool
) -> Interval:
    # Kish's size-weighted mean cluster size: equal to the cluster size when all are equal.
    mean_size = sum(ni * ni for _, ni in clusters) / n
    deff = 1.0 + (mean_size - 1.0) * _icc(clusters)
    lower, upper = _wilson_bounds(k / n, n / deff, _z(confidence, two_sided))
    return Interval(
        k,
        n,
        k / n,
        lower,
        upper if two_sided else 1.0,
        confidence,
        "wilson_design_effect",
        clusters=len(clusters),
        design_effect=deff,
    )


def _bootstrap_interval(
    clusters: list[tuple[int, int]],
    k: int,
    n: int,
    confidence: float,
    two_sided: bool,
    resamples: int,
    seed: int,
) -> Interval:
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    _z(confidence, two_sided)  # validates confidence
    # Sorted so that the result, for a given seed, does not depend on the order tasks were listed.
    ks, ns = (np.array(column, dtype=np.int64) for column in zip(*sorted(clusters)))
    picks = np.random.default_rng(seed).integers(0, len(clusters), size=(resamples, len(clusters)))
    rates = ks[picks].sum(axis=1) / ns[picks].sum(axis=1)
    alpha = 1.0 - confidence
    if two_sided:
        lower, upper = (float(q) for q in np.quantile(rates, [alpha / 2.0, 1.0 - alpha / 2.0]))
    else:
        lower, upper = float(np.quantile(rates, alpha)), 1.0
    return Interval(
        k, n, k / n, lower, upper, confidence, "cluster_bootstrap", clusters=len(clusters)
    )


def clustered_interval(
    clusters: Iterable[tuple[int, int]],
    confidence: float = 0.95,
    two_sided: bool = True,
    method: ClusterMethod = "design_effect",
    resamples: int = 2000,
    seed: int = 0,
) -> Interval:
    """Interval for the pooled rate of per-task (k_i, n_i) counts, treating tasks as clusters.

    The default and the reasons for it are in the module docstring. Tasks with no runs carry no
    information and are dropped; with no runs at all the result is the n == 0 Wilson interval.
    """
    if method not in ("design_effect", "bootstrap"):
        raise ValueError(f"unknown clustered interval method {method!r}")
    kept = []
    for k_i, n_i in clusters:
        _check_counts(k_i, n_i)
        if n_i:
            kept.append((k_i, n_i))
    k = sum(k_i for k_i, _ in kept)
    n = sum(n_i for _, n_i in kept)
    if n == 0:
        empty = wilson_interval(0, 0, confidence, two_sided)
        name = "wilson_design_effect" if method == "design_effect" else "cluster_bootstrap"
        return Interval(0, 0, None, empty.lower, empty.upper, confidence, name, clusters=0)
    if method == "design_effect":
        return _design_effect_interval(kept, k, n, confidence, two_sided)
    return _bootstrap_interval(kept, k, n, confidence, two_sided, resamples, seed)


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

    def extremity(x: np.ndarray | int) -> np.ndarray | int:
        # |x/na - (successes - x)/nb| scaled by na*nb, so comparisons are exact in integers.
        return abs(x * nb - (successes - x) * na)

    observed = extremity(ka)
    if method == "exact":
        support = np.arange(max(0, na - (total - successes)), min(na, successes) + 1)
        pmf = hypergeom(total, successes, na).pmf(support)
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
    p = binomtest(only_a, discordant, 0.5).pvalue if discordant else 1.0
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
