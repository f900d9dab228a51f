"""Intervals, tests and planning numbers for conformance rates (docs/statistics.md).

Rates here come from small samples (tens of runs per cell) that often sit at or near 100%, so the
Wald interval (p +/- z*se) is useless: it collapses to a point at 0% and 100%. Wilson's score
interval stays honest at the boundaries and is what the certificate headline is built on.

The gate's bound (issue 28) is ``wilson_tasks`` (`task_interval`). What it claims:

* **Estimand**: the mean conformance over the task population, the mean over tasks of each task's
  conformance rate (draw a task like the stored ones, run it once). Its point estimate is the mean
  of the per-task rates, not the pooled k/n.
* **Bound**: the lower end (PASS) is Wilson's score bound with p = that mean and n = the number of
  tasks. A task's rate lies in [0, 1], so its variance is at most mu (1 - mu), which is the variance
  Wilson assumes: the bound holds whatever the correlation of a task's runs and however many
  repeats each task had. It is computed at the two-sided 95% z (nominally 97.5%), because at the
  one-sided z the binomial's discreteness makes single-run tasks undercover (exactly 0.911 at 11
  tasks, p = 0.80; 0.924 in the grid below). The upper end (FAIL) is Bentkus's bound on the summed
  failures (`upper_bounds`, issue 38), valid for any distribution of task rates; Wilson's upper end
  covered only 0.895 near a mean of 1 - 0.55 / tasks. Each end's error is at most 5%. One task
  certifies nothing: the lower bound is 0 until two tasks have a conforming run, the upper 1 until
  two have a failing one.
* **Monotone**: one more conforming run (in a task or as a new task) never lowers either bound,
  one more failing run never raises it; property-tested on ~40,000 random cases.
* **Coverage** (bench/bound_coverage.py, 2,268 cells x 4,000 studies: 3-100 tasks, repeats 1, 3,
  10, 20 or spread 1-5 and 1-20, true means 0.80-0.999, beta-binomial task rates with within-task
  correlation 0-0.9, and mixtures where 2-5% of tasks fail always or 95% of the time among
  flaky-but-good ones):

  | method | min coverage (cell) | cells < 0.95 | mean truth - lower | clean tasks for 0.95 | monotonicity violations |
  |---|---|---|---|---|---|
  | wilson_tasks (the gate) | 0.973 (100 x 1, mix 5% at 0, p=0.9) | 0 | 0.251 | 73 | 0 of 3000 |
  | Wilson, one-sided z | 0.924 (20 x 1, mix 2% at 0, p=0.8) | 25 | 0.206 | 52 | 0 of 3000 |
  | Clopper-Pearson on task means | 0.945 (50 x 1, mix 5% at 0, p=0.8) | 7 | 0.254 | 59 | 0 of 3000 |
  | empirical Bernstein | 1.000 | 0 | 0.576 | 174 | 0 of 3000 |
  | betting_cs (anytime-valid) | 0.984 (20 x 1, mix 5% at 0.05, p=0.8) | 0 | 0.289 | 73 | 0 of 3000 |
  | cluster_kg (previous gate) | 0.809 (50 x 20, mix 2% at 0.05, p=0.98) | 34 | 0.325 | 98 | 178 of 3000 |

* **Cost in tasks**: 73 clean tasks for a lower bound of 0.95, whatever their repeats (repeats
  sharpen each task's rate, never stand in for tasks); `tasks_needed` says how many more.

``betting_cs`` (`sequential_interval`, `stop_decision`) is the anytime-valid twin for studies
that look after every task and stop once the answer is known: a betting confidence sequence for
bounded means (Waudby-Smith and Ramdas) with a fixed grid of bets, so it too is monotone. It needs
the same 73 clean tasks for 0.95; bench/sequential_stopping.py measures 52% fewer trials than a
fixed-n gate of the same power. `paired_task_regression` uses it on per-task differences (the
PASS side of `gate --baseline`; its FAIL side is `regression.drop_test`). It is also what an
INCONCLUSIVE fixed-n study's advice continues with (`tasks_to_settle`): the fixed-n bound holds for
one look at a number of tasks fixed in advance, this one at every look.

``cluster_kg`` (`clustered_interval`, a Wilson interval on a Korn-Graubard effective n) was the
gate's bound before issue 28 and is kept until its callers move: on its beta-binomial model it
covers, but it is not monotone (30 tasks x 10 clean: 0.844; with one failure 0.961), clean repeats
lower it (5 tasks: 0.566 with one run each, 0.303 with ten), and on mixtures it covers 0.81.

Every result carries the counts it came from: a reported number without its n is not reported.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, NamedTuple

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


# ---- Task-level bounds: the gate's estimand ------------------------------------------------------

TASK_METHOD = "wilson_tasks"
SEQUENTIAL_METHOD = "betting_cs"
PASS: Final = "PASS"
FAIL: Final = "FAIL"
INCONCLUSIVE: Final = "INCONCLUSIVE"
Verdict = Literal["PASS", "FAIL", "INCONCLUSIVE"]
VERDICTS: tuple[Verdict, ...] = (PASS, FAIL, INCONCLUSIVE)
StopDecision = Literal["pass", "fail", "continue"]
RegressionVerdict = Literal["worse", "not worse", "inconclusive"]
# Bets of the betting confidence sequence: fractions 1/16 ... 127/128 of the most a bet on one task
# may stake. A fixed grid (not a bet tuned on the data seen so far) keeps the bound monotone and
# order-free. Bold bets certify clean agents (the lower bound, m near 1); timid ones decide the
# upper bound, where the bettor stakes on failures and every clean task costs it (with bold bets
# only, a true rate of 0.80 failed a 0.90 target in 12% of 300-task studies; with these, 98%).
BETS: tuple[float, ...] = (*(2.0**-j for j in range(4, 0, -1)), *(1.0 - 2.0**-j for j in range(2, 8)))
MAX_TASKS_NEEDED = 10**9
MAX_SEQUENTIAL_TASKS_NEEDED = 2**16  # the betting bound is searched on arrays: past this, "more than we can say"


def _task_counts(per_task: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Validated (conforming, runs) pairs of the tasks that ran: a task with no runs says nothing."""
    kept = []
    for c, n in per_task:
        _check_counts(c, n)
        if n:
            kept.append((c, n))
    return kept


@functools.lru_cache(maxsize=64)
def _log_choose(n: int) -> np.ndarray:
    """log C(n, k) for k = 0..n."""
    from scipy.special import gammaln

    k = np.arange(n + 1, dtype=float)
    return np.asarray(gammaln(n + 1.0) - gammaln(k + 1.0) - gammaln(n - k + 1.0))


def _binomial_pmf(n: int, q: np.ndarray) -> np.ndarray:
    """Binomial(n, q) probabilities of 0..n, shape (len(q), n + 1); q = 0 and q = 1 exact."""
    from scipy.special import xlog1py, xlogy

    k = np.arange(n + 1, dtype=float)[None, :]
    q = np.asarray(q, dtype=float)[:, None]
    return np.asarray(np.exp(_log_choose(n)[None, :] + xlogy(k, q) + xlog1py(n - k, -q)))


def _failure_tail(failures: np.ndarray, tasks: int, q: np.ndarray) -> np.ndarray:
    """Bentkus's bound on P(sum of `tasks` independent values in [0, 1] with mean q >= `failures`).

    For h < x, P(S >= x) <= E (S - h)_+^2 / (x - h)^2 (Markov). A value in [0, 1] with mean q is
    smaller in the convex order than a Bernoulli(q), and convex order survives sums (Hoeffding
    1956), so E (S - h)_+^2 <= E (B - h)_+^2 for B ~ Binomial(tasks, q): the bound holds for any
    distribution of task rates and any repeats. It is the inf over h (Bentkus 2004), found exactly:
    between two integers E (B - h)_+^2 is a quadratic in h and the ratio has one stationary point.
    Within a factor e of the binomial tail itself (1.4x at 2-4 failures), so near 1 it needs about
    as many failures as an exact binomial test on single runs. `failures` and `q` broadcast.
    """
    x, q = np.broadcast_arrays(np.asarray(failures, dtype=float), np.asarray(q, dtype=float))
    shape = x.shape
    x, q = x.ravel(), q.ravel()
    k = np.arange(tasks + 1, dtype=float)
    pmf = _binomial_pmf(tasks, q)
    # Tails from i: E[B^j; B >= i] for j = 0, 1, 2; h in [i - 1, i) sees exactly the B >= i.
    c0, c1, c2 = (np.cumsum((pmf * k**j)[:, ::-1], axis=1)[:, ::-1] for j in (0, 1, 2))
    low = np.where(k == 0, -1e6, k - 1.0)[None, :]
    high = np.minimum(k[None, :], x[:, None])
    xx = x[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        stationary = np.nan_to_num((c1 * xx - c2) / (c0 * xx - c1), nan=-1e6, posinf=-1e6, neginf=-1e6)
        best = np.ones(x.shape)
        for h in (low, np.clip(stationary, low, high)):
            ratio = (c2 - 2.0 * h * c1 + h * h * c0) / (xx - h) ** 2
            best = np.minimum(best, np.where(h < xx, ratio, np.inf).min(axis=1))
    return np.where(x > 1e-9, np.clip(best, 0.0, 1.0), 1.0).reshape(shape)


def fail_p_value(failures: np.ndarray, tasks: int, target: float) -> np.ndarray:
    """How surprising `failures` (the sum over tasks of 1 - rate) would be if the mean conformance were `target`.

    FAIL at `target` when this is at most 1 - confidence: the upper bound is below the target exactly
    then. Valid for any distribution of task rates on [0, 1] (`_failure_tail`), so a wrong FAIL has
    probability at most 1 - confidence, whatever the mixture of tasks and repeats.
    """
    return _failure_tail(np.asarray(failures, dtype=float), tasks, np.asarray(1.0 - target))


_GRID = 32  # points per refinement round of `upper_bounds`: 8 rounds narrow the bracket by 33^8, to ~1e-12


def upper_bounds(total: np.ndarray, count: np.ndarray, confidence: float = 0.95, rounds: int = 8) -> np.ndarray:
    """One-sided `confidence` upper bounds on the mean of per-task values in [0, 1] (the FAIL end of the gate).

    The largest m whose `fail_p_value` exceeds 1 - confidence: Bentkus's bound on the failures,
    valid for any distribution of task rates (mixtures, rates near 1, unequal repeats), not an
    approximation with a special case for each way it undercovers. The p-value falls as m rises
    and is 1 at the mean, so the bound lies in [mean, 1]; each round evaluates a grid across the
    bracket at once and keeps the cell where the p-value crosses. Each distinct (total, count) is
    solved once, so a simulation's thousands of studies cost as many as their distinct outcomes.
    Monotone: a conforming run (less failure, or one more clean task) never lowers it, a failing
    run never raises it.
    """
    alpha = 1.0 - confidence
    total, count = np.broadcast_arrays(np.asarray(total, dtype=float), np.asarray(count, dtype=np.int64))
    keys = np.stack([np.round(count - total, 9), count.astype(float)], axis=-1).reshape(-1, 2)
    distinct, back = np.unique(keys, axis=0, return_inverse=True)
    solved = np.ones(len(distinct))
    steps = np.arange(1, _GRID + 1) / (_GRID + 1.0)
    for n in np.unique(distinct[:, 1]).astype(np.int64):
        rows = np.flatnonzero((distinct[:, 1] == n) & (distinct[:, 0] > 1e-9))
        if not rows.size or n < 1:
            continue
        failures = distinct[rows, 0]
        low, high = np.clip(1.0 - failures / n, 0.0, 1.0), np.ones(rows.size)
        for _ in range(rounds):
            grid = low[:, None] + (high - low)[:, None] * steps[None, :]
            kept = _failure_tail(np.repeat(failures[:, None], _GRID, axis=1), int(n), 1.0 - grid) > alpha
            last = kept.sum(axis=1)  # kept is a prefix: the p-value falls as m rises
            new_low = np.where(last > 0, grid[np.arange(rows.size), np.maximum(last - 1, 0)], low)
            high = np.where(last < _GRID, grid[np.arange(rows.size), np.minimum(last, _GRID - 1)], high)
            low = new_low
        solved[rows] = low
    return np.asarray(solved[np.ravel(back)].reshape(total.shape))


def mean_bounds(
    total: np.ndarray, count: np.ndarray, some: np.ndarray, short: np.ndarray, confidence: float = 0.95
) -> tuple[np.ndarray, np.ndarray]:
    """``wilson_tasks`` bounds for the mean of per-task values in [0, 1], from sufficient statistics.

    `total` is the sum of the values, `count` the number of tasks, `some` how many values are above
    0 and `short` how many are below 1 (arrays of one shape: one entry per simulated study).

    The lower end (PASS) is Wilson's score bound with n = tasks: the variance of any value in [0, 1]
    with mean mu is at most mu (1 - mu), which is the variance Wilson assumes, so it holds for a
    task's rate over any number of repeats, whatever the correlation of its runs. z is two-sided
    (nominal 1 - (1 - confidence) / 2) because the one-sided z undercovers on single runs by
    discreteness (0.911 at 11 tasks, p = 0.80).

    The upper end (FAIL) is `upper_bounds`, one-sided at `confidence` and valid for any
    distribution of task rates. Wilson's upper end was not (issue 38): near a mean of 1 - 0.55 /
    tasks it covered 0.895, so an agent exactly at the target failed it 9% of the time.

    Evidence from one task says nothing about the others: the lower bound is 0 until two tasks have
    a conforming run, the upper 1 until two have a failing one. Both ends only move the right way
    as runs are added.
    """
    n = np.maximum(count, 1).astype(float)
    upper = upper_bounds(np.minimum(total, n), np.asarray(count), confidence)
    return lower_bounds(total, count, some, confidence), np.where(short >= 2, upper, 1.0)


def lower_bounds(total: np.ndarray, count: np.ndarray, some: np.ndarray, confidence: float = 0.95) -> np.ndarray:
    """The lower (PASS) end of `mean_bounds` alone: simulations of the PASS end need not solve the upper one."""
    z = _z(confidence, two_sided=True)
    n = np.maximum(count, 1).astype(float)
    lower, _ = _wilson_arrays(np.clip(total / n, 0.0, 1.0), n, z)
    return np.asarray(np.where(some >= 2, lower, 0.0))


def task_lower(ks: np.ndarray, ns: np.ndarray, confidence: float = 0.95) -> np.ndarray:
    """`task_bounds`'s lower end alone."""
    ks = np.atleast_2d(ks).astype(float)
    ns = np.broadcast_to(ns, ks.shape).astype(float)
    return lower_bounds((ks / ns).sum(axis=1), np.full(ks.shape[0], ks.shape[1]), (ks > 0).sum(axis=1), confidence)


def task_bounds(ks: np.ndarray, ns: np.ndarray, confidence: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """`mean_bounds` of per-task rates k/n; `ks` of shape (samples, tasks), `ns` broadcastable, all n >= 1."""
    ks = np.atleast_2d(ks).astype(float)
    ns = np.broadcast_to(ns, ks.shape).astype(float)
    return mean_bounds(
        (ks / ns).sum(axis=1), np.full(ks.shape[0], ks.shape[1]), (ks > 0).sum(axis=1), (ks < ns).sum(axis=1), confidence
    )


def task_interval(per_task: Iterable[tuple[int, int]], confidence: float = 0.95) -> Interval:
    """The gate's bounds (``wilson_tasks``) on the mean conformance over the task population.

    The estimand is the mean over tasks of each task's conformance rate: draw a task like the
    stored ones, run it once. `rate` is that mean (not the pooled k/n); `lower` and `upper` are
    each a one-sided bound with coverage >= `confidence` (the module docstring gives the
    simulation), together a two-sided `confidence` interval. Tasks count, runs do not: repeats
    sharpen each task's rate but never stand in for more tasks, so adding runs never lowers the
    bound and one task certifies nothing.
    """
    kept = _task_counts(per_task)
    k, n = sum(c for c, _ in kept), sum(m for _, m in kept)
    if not kept:
        _z(confidence, two_sided=True)
        return Interval(0, 0, None, 0.0, 1.0, confidence, TASK_METHOD, clusters=0)
    lower, upper = task_bounds(np.array([[c for c, _ in kept]]), np.array([m for _, m in kept]), confidence)
    rate = sum(c / m for c, m in kept) / len(kept)
    return Interval(k, n, rate, float(lower[0]), float(upper[0]), confidence, TASK_METHOD, clusters=len(kept))


def tasks_needed(target: float, per_task: Iterable[tuple[int, int]], confidence: float = 0.95,
                 method: str = TASK_METHOD) -> int | None:
    """How many more distinct clean tasks ``wilson_tasks`` needs for its lower bound to reach `target`.

    Each added task runs the cell's median repeat count, all conforming (a clean task's rate is 1
    at any count, so the count does not change the answer today; it is there so the advice stays
    in tasks, not runs). 0 if the bound already reaches the target; None if no number of tasks can
    (target >= 1, or beyond a billion tasks; 65,536 for the sequential ``betting_cs``, `method`). The lower bound rises with every clean task, so a
    doubling search then bisection finds the smallest number.
    """
    kept = _task_counts(per_task)
    _z(confidence, two_sided=True)
    if target <= 0.0:
        return 0
    if target >= 1.0:
        return None
    total = sum(c / m for c, m in kept)
    some = sum(c > 0 for c, _ in kept)
    rates = [c / m for c, m in kept]
    limit = MAX_SEQUENTIAL_TASKS_NEEDED if method == SEQUENTIAL_METHOD else MAX_TASKS_NEEDED

    def reaches(extra: int) -> bool:
        if method == SEQUENTIAL_METHOD:
            return bool(betting_lower(np.array([rates + [1.0] * extra]), confidence)[0] >= target)
        args = (np.array([total + extra]), np.array([len(kept) + extra]), np.array([some + extra]))
        return bool(lower_bounds(*args, confidence=confidence)[0] >= target)

    if reaches(0):
        return 0
    low, high = 0, 1
    while not reaches(high):
        if high >= limit:
            return None
        low, high = high, 2 * high
    while high - low > 1:  # invariant: not reaches(low), reaches(high)
        mid = (low + high) // 2
        low, high = (low, mid) if reaches(mid) else (mid, high)
    return high


def tasks_to_settle(verdict: str, per_task: Iterable[tuple[int, int]], target: float, confidence: float = 0.95) -> int | None:
    """The certificate's advice: more distinct clean tasks that settle `target` by a procedure that keeps its error.

    A fixed-n bound (``wilson_tasks``) looked at again after more tasks loses its stated error
    (issue 38: a wrong PASS up to 0.095), so the count is the sequential bound's (``betting_cs``
    over all the tasks, valid at every look whatever looks came before), and at least 1 for an
    INCONCLUSIVE cell: switching to the sequential bound on the same tasks after looking would be
    choosing a test by its answer. 0 for a PASS; for a FAIL, what the sequential bound would need.
    """
    if verdict == PASS:
        return 0
    more = tasks_needed(target, per_task, confidence, method=SEQUENTIAL_METHOD)
    return None if more is None else max(more, 1 if verdict == INCONCLUSIVE else 0)


def gate_decision(interval_lower: float, interval_upper: float, target: float) -> Verdict:
    """PASS if the lower bound reaches the target, FAIL if the upper bound is below it, else INCONCLUSIVE.

    Each wrong verdict needs its one-sided bound to miss, so each has probability at most
    1 - confidence: the gate never has to guess when the interval straddles the target.
    """
    if interval_lower >= target:
        return PASS
    if interval_upper < target:
        return FAIL
    return INCONCLUSIVE


# ---- Anytime-valid bounds: stop a study as soon as the answer is known ----------------------------


def _log_capital(values: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Log wealth of betting that values (samples, tasks) in [0, 1] have a mean above m (samples,).

    The bettor splits its wealth evenly over `BETS` and stakes fraction c of the most it can lose
    on each task: factor 1 + c (y / m - 1). When the mean is m each factor has expectation 1, so
    the wealth is a nonnegative martingale and by Ville's inequality reaches 1 / alpha with
    probability at most alpha, at any time, however the study decides to stop.
    """
    bets = np.array(BETS)
    ratio = values[:, :, None] / m[:, None, None] - 1.0
    logs = np.log1p(bets[None, None, :] * ratio).sum(axis=1)
    peak = logs.max(axis=1)
    return np.asarray(peak + np.log(np.exp(logs - peak[:, None]).mean(axis=1)))


def betting_lower(values: np.ndarray, confidence: float = 0.95, steps: int = 40) -> np.ndarray:
    """Anytime-valid lower confidence bounds for the means of rows of `values` (samples, tasks) in [0, 1].

    The bound is the largest m the bettor's wealth (`_log_capital`) has grown to 1 / alpha
    against, alpha = 1 - confidence, one-sided. Wealth falls as m rises, so bisection finds it.
    Every factor rises with each value and a new task multiplies by a factor above 1 if it
    conformed and below 1 if it did not, so the bound moves only the right way, and it does not
    depend on the order of the tasks. Rows with fewer than two values above 0 get 0.
    """
    values = np.atleast_2d(np.asarray(values, dtype=float))
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    threshold = math.log(1.0 / (1.0 - confidence))
    low, high = np.zeros(values.shape[0]), np.ones(values.shape[0])
    for _ in range(steps):
        mid = (low + high) / 2.0
        grown = _log_capital(values, np.maximum(mid, 1e-300)) >= threshold
        low, high = np.where(grown, mid, low), np.where(grown, high, mid)
    return np.where((values > 0).sum(axis=1) >= 2, low, 0.0)


def sequential_bounds(ks: np.ndarray, ns: np.ndarray, confidence: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """``betting_cs`` bounds on per-task rates k/n, shapes as in `task_bounds`; the upper from 1 - rates."""
    ks = np.atleast_2d(ks).astype(float)
    rates = ks / np.broadcast_to(ns, ks.shape)
    return betting_lower(rates, confidence), 1.0 - betting_lower(1.0 - rates, confidence)


def sequential_interval(per_task_in_order: Iterable[tuple[int, int]], confidence: float = 0.95) -> Interval:
    """Anytime-valid bounds (``betting_cs``) on the mean conformance over tasks.

    Unlike `task_interval` these stay valid when a study looks after every task and stops as soon
    as they decide: with probability >= `confidence` the lower bound stays below the true mean at
    every look (one-sided, time-uniform; likewise the upper). Betting confidence sequences for
    bounded means (Waudby-Smith and Ramdas, 2023), with a fixed grid of bets so the bound is
    monotone and order-free. The price: none in clean tasks (73 for 0.95, as `task_interval`), more
    where tasks fail; `task_interval` is valid only when the number of tasks was fixed in advance.
    """
    kept = _task_counts(per_task_in_order)
    k, n = sum(c for c, _ in kept), sum(m for _, m in kept)
    if not kept:
        _z(confidence, two_sided=False)
        return Interval(0, 0, None, 0.0, 1.0, confidence, SEQUENTIAL_METHOD, clusters=0)
    lower, upper = sequential_bounds(np.array([[c for c, _ in kept]]), np.array([m for _, m in kept]), confidence)
    rate = sum(c / m for c, m in kept) / len(kept)
    return Interval(k, n, rate, float(lower[0]), float(upper[0]), confidence, SEQUENTIAL_METHOD, clusters=len(kept))


def stop_decision(
    per_task_in_order: Sequence[tuple[int, int]], target: float, min_tasks: int = 2, confidence: float = 0.95
) -> StopDecision:
    """"pass" once the anytime lower bound reaches `target`, "fail" once the upper bound is below it.

    Called after every task, a study stops at the first "pass" or "fail" with each wrong answer
    at most 1 - confidence likely; before `min_tasks` tasks have run it always continues.
    """
    kept = _task_counts(per_task_in_order)
    if len(kept) < min_tasks:
        return "continue"
    interval = sequential_interval(kept, confidence)
    verdict = gate_decision(interval.lower, interval.upper, target)
    return "pass" if verdict == PASS else "fail" if verdict == FAIL else "continue"


# ---- Regression against a baseline ---------------------------------------------------------------


@dataclass(frozen=True)
class RegressionResult:
    """Candidate minus baseline mean conformance over the tasks both ran, tasks as the units.

    `lower`/`upper` bound the mean per-task difference (``betting_cs``, anytime-valid, each
    one-sided at `confidence`); `p_worse` tests "worse by more than margin", `p_not_worse`
    "not worse by more than margin" (p = 1 / the bettor's wealth). Verdict as in
    `paired_task_regression`.
    """

    tasks: int
    difference: float | None
    lower: float
    upper: float
    margin: float
    confidence: float
    p_worse: float
    p_not_worse: float
    verdict: RegressionVerdict
    method: str = SEQUENTIAL_METHOD


def _difference_p(shifted: np.ndarray, m0: float) -> float:
    """1 / wealth of betting that the mean of `shifted` (values in [0, 1]) is above m0, capped at 1."""
    if shifted.size == 0 or m0 <= 0.0:
        return 1.0
    if m0 >= 1.0:
        return 1.0 if bool((shifted < 1.0).any()) or shifted.size < 2 else 0.0
    log_wealth = float(_log_capital(shifted[None, :], np.array([m0]))[0])
    return float(min(1.0, math.exp(-log_wealth)))


def paired_task_regression(
    candidate_per_task: Mapping[str, Sequence[int]],
    baseline_per_task: Mapping[str, Sequence[int]],
    margin: float = 0.0,
    confidence: float = 0.95,
) -> RegressionResult:
    """Is the candidate worse than the baseline by more than `margin`, on the tasks both ran?

    Per shared task the difference of rates d (candidate - baseline) lies in [-1, 1]; tasks, not
    runs, are the independent units, so the bound is on the mean of d over tasks: the betting
    bound for bounded means on (d + 1) / 2, which needs no normal approximation and no symmetry,
    and stays valid when a study stops early. "worse" if the upper bound is below -margin,
    "not worse" if the lower bound is at or above -margin, else "inconclusive": with margin 0, two
    identical agents are never "not worse", since no sample can rule out a tiny loss.
    """
    if not 0.0 <= margin < 1.0:
        raise ValueError(f"margin must be in [0, 1), got {margin}")
    shared = [t for t in candidate_per_task if t in baseline_per_task]
    pairs = [(candidate_per_task[t], baseline_per_task[t]) for t in shared]
    for (kc, nc), (kb, nb) in pairs:
        _check_counts(kc, nc)
        _check_counts(kb, nb)
    d = np.array([kc / nc - kb / nb for (kc, nc), (kb, nb) in pairs if nc and nb], dtype=float)
    alpha = 1.0 - confidence
    if d.size == 0:
        _z(confidence, two_sided=False)
        return RegressionResult(0, None, -1.0, 1.0, margin, confidence, 1.0, 1.0, "inconclusive")
    shifted = (d + 1.0) / 2.0
    lower = 2.0 * float(betting_lower(shifted[None, :], confidence)[0]) - 1.0
    upper = 1.0 - 2.0 * float(betting_lower(1.0 - shifted[None, :], confidence)[0])
    m0 = (1.0 - margin) / 2.0  # -margin on the [0, 1] scale
    p_worse, p_not_worse = _difference_p(1.0 - shifted, 1.0 - m0), _difference_p(shifted, m0)
    verdict: RegressionVerdict = (
        "worse" if p_worse <= alpha else "not worse" if p_not_worse <= alpha else "inconclusive"
    )
    return RegressionResult(int(d.size), float(d.mean()), lower, upper, margin, confidence, p_worse, p_not_worse, verdict)


def regression_verdicts(per_perturbation: Mapping[str, RegressionResult]) -> dict[str, RegressionVerdict]:
    """Three-valued verdicts per perturbation with Holm across them, for each direction separately.

    Comparing many perturbations, some would look worse by chance; Holm keeps the chance of any
    wrong "worse" (and, separately, of any wrong "not worse") at most 1 - confidence.
    """
    names = list(per_perturbation)
    if not names:
        return {}
    alpha = 1.0 - per_perturbation[names[0]].confidence
    worse = holm([per_perturbation[n].p_worse for n in names], alpha).reject
    fine = holm([per_perturbation[n].p_not_worse for n in names], alpha).reject
    return {n: "worse" if w else "not worse" if f else "inconclusive" for n, w, f in zip(names, worse, fine)}


# ---- pass^k as a curve ----------------------------------------------------------------------------


class PassKPoint(NamedTuple):
    """pass^k at one k: mean over tasks with at least k runs of the unbiased per-task pass^k, with bounds."""

    k: int
    estimate: float | None
    lower: float
    upper: float
    tasks_used: int


def pass_k_curve(per_task: Iterable[tuple[int, int]], max_k: int, confidence: float = 0.95) -> list[PassKPoint]:
    """pass^k for k = 1..max_k, each with the gate's task-level bounds (``wilson_tasks``).

    A task's C(c, k) / C(n, k) is an unbiased estimate of its chance that k runs all conform and
    lies in [0, 1], so the same bound for bounded means applies, over the tasks with n >= k. A k no
    task reaches has no estimate (None, bounds 0 and 1).
    """
    if max_k < 1:
        raise ValueError(f"max_k must be >= 1, got {max_k}")
    kept = _task_counts(per_task)
    points = []
    for k in range(1, max_k + 1):
        values = [pass_hat_k(n, c, k) for c, n in kept if n >= k]
        if not values:
            points.append(PassKPoint(k, None, 0.0, 1.0, 0))
            continue
        lower, upper = mean_bounds(
            np.array([sum(values)]), np.array([len(values)]),
            np.array([sum(v > 0 for v in values)]), np.array([sum(v < 1 for v in values)]), confidence,
        )
        points.append(PassKPoint(k, sum(values) / len(values), float(lower[0]), float(upper[0]), len(values)))
    return points
