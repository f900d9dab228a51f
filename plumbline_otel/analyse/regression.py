"""Is a candidate agent worse than its baseline? A paired sign-flip test with tasks as the units (issue 38).

`gate --baseline` compared each perturbation's per-task differences with an anytime-valid betting
bound and Holm across perturbations: valid, but at the demo's size (22 tasks x 2 repeats x 6
perturbations) it caught a true 0.2 drop 6.5% of the time. This test keeps tasks as the units and
uses every perturbation at once:

* **Per task, paired differences.** For task t and perturbation p, d[t, p] = the candidate's rate
  minus the baseline's (both ran it). A task's joint difference is the mean of its d[t, p] over
  the perturbations both ran.
* **Exact sign flips.** If the two agents are the same (the null), a task's block of candidate runs
  and its block of baseline runs are exchangeable, so the task's whole row of differences is as
  likely negated: flipping the sign of each task's row (all perturbations together, so their
  correlation is kept) gives the null distribution, whatever the task rates, repeats or
  correlation of runs. Exact (all 2^tasks flips) up to `EXACT_TASKS` tasks, else `FLIPS` random
  flips with p = (1 + hits) / (1 + flips), which is exact too as a randomised test.
* **Max-T over the joint and each perturbation.** Statistics: the joint mean and each
  perturbation's, each a sum studentised by its own flip-invariant scale; the test's p-value for
  each is the flip share whose smallest statistic is at or below it. So a drop everywhere (the
  joint) and a drop in one perturbation (its own) are both caught, with the chance of any wrong
  "worse" at most alpha together (no Holm needed: the flips carry the dependence).
* **Margin.** "Worse by more than `margin`" shifts every difference by +margin before the test: for
  identical agents the differences are symmetric about 0, so after the shift the test rejects less
  often than alpha (identical agents are never failed; measured in bench/baseline_power.py). With
  margin 0 it is the exact test of "the same agent".
* **What it could detect.** `detectable_drop`: the smallest drop in every perturbation that this
  evidence (these tasks, their repeats, the baseline's own rates) would catch with 80% power, by the
  normal approximation to the studentised sum; `detectable_drop_one` the same for a drop in one
  perturbation alone (the largest over perturbations). bench/baseline_power.py checks them against
  simulated power.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import product

import numpy as np

FLIP_METHOD = "sign_flip_tasks"
EXACT_TASKS = 14  # up to 2^14 = 16,384 flips: enumerate them all
FLIPS = 20_000
POWER = 0.80

Counts = Mapping[str, Mapping[str, tuple[int, int]]]  # perturbation -> task -> (conforming, runs)


@dataclass(frozen=True)
class DropTest:
    """The paired sign-flip test of candidate against baseline (module docstring).

    `differences` holds the mean per-task difference (candidate - baseline) per perturbation and
    `difference` the joint one (None with no shared task); `p_values` the max-T adjusted p-value
    of "worse by more than margin" per perturbation, `p_joint` the joint one, `p_value` the
    smallest; `worse` whether it is at most alpha.
    """

    tasks: int
    perturbations: tuple[str, ...]
    difference: float | None
    differences: dict[str, float] = field(default_factory=dict)
    p_joint: float = 1.0
    p_values: dict[str, float] = field(default_factory=dict)
    p_value: float = 1.0
    margin: float = 0.0
    alpha: float = 0.05
    worse: bool = False
    detectable_drop: float | None = None
    detectable_drop_one: float | None = None
    flips: int = 0
    exact: bool = True
    method: str = FLIP_METHOD


def paired_rows(candidate: Counts, baseline: Counts) -> tuple[list[str], list[str], np.ndarray, np.ndarray, np.ndarray]:
    """Shared tasks and perturbations, and per (task, perturbation): the difference of rates (NaN where
    either did not run it), the baseline's rate and the harmonic run count (1 / (1/n_c + 1/n_b))."""
    perts = sorted(p for p in set(candidate) & set(baseline))
    tasks = sorted({t for p in perts for t, (_, n) in candidate[p].items() if n and baseline[p].get(t, (0, 0))[1]})
    shape = (len(tasks), len(perts))
    diff, base, runs = np.full(shape, np.nan), np.full(shape, np.nan), np.full(shape, np.nan)
    for (i, t), (j, p) in product(enumerate(tasks), enumerate(perts)):
        kc, nc = candidate[p].get(t, (0, 0))
        kb, nb = baseline[p].get(t, (0, 0))
        if nc and nb:
            diff[i, j], base[i, j], runs[i, j] = kc / nc - kb / nb, kb / nb, 1.0 / (1.0 / nc + 1.0 / nb)
    return tasks, perts, diff, base, runs


def _columns(diff: np.ndarray, margin: float) -> np.ndarray:
    """The statistics' per-task terms: the joint (row mean) first, then each perturbation; absent terms 0."""
    shifted = diff + margin
    joint = np.nanmean(shifted, axis=1)
    return np.asarray(np.nan_to_num(np.column_stack([joint, shifted]), nan=0.0))


def _studentised(signs: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Sum over tasks of sign * x per column, over the flip-invariant scale sqrt(sum x^2); 0 where that is 0."""
    scale = np.sqrt((x * x).sum(axis=0))
    with np.errstate(divide="ignore", invalid="ignore"):
        out = (signs @ x) / scale
    return np.asarray(np.where(scale > 0, out, 0.0))


def _signs(tasks: int, rng: np.random.Generator, flips: int = FLIPS) -> tuple[np.ndarray, bool]:
    """Every sign vector (exact) for few tasks, else FLIPS random ones (the identity first either way)."""
    if tasks <= EXACT_TASKS:
        grid = ((np.arange(2**tasks)[:, None] >> np.arange(tasks)[None, :]) & 1) * -2 + 1
        return grid.astype(float), True
    draws = rng.choice([-1.0, 1.0], size=(flips, tasks))
    return np.vstack([np.ones((1, tasks)), draws]), False


def _power(drop: float, base: np.ndarray, runs: np.ndarray, columns: list[int], margin: float, critical: float) -> float:
    """Normal-approximation power of the studentised statistic of `columns` (perturbation indices) for a
    drop of `drop` there (rates floored at 0), given the baseline's rates and the paired run counts."""
    present = ~np.isnan(base[:, columns])
    if not present.any():
        return 0.0
    r = np.where(present, base[:, columns], 0.0)
    dropped = np.maximum(r - drop, 0.0)
    n = np.where(present, runs[:, columns], 1.0)
    var = np.where(present, (r * (1 - r) + dropped * (1 - dropped)) / 2.0 / n, 0.0)  # per-run variance, both sides
    count = present.sum(axis=1)
    used = count > 0
    mean = np.where(used, ((dropped - r) * present).sum(axis=1) / np.maximum(count, 1), 0.0) + margin * used
    v = np.where(used, var.sum(axis=1) / np.maximum(count, 1) ** 2, 0.0)
    total_var = max(float(v.sum()), 1e-12)
    z = (critical * math.sqrt(total_var + float((mean * mean).sum())) - float(mean.sum())) / math.sqrt(total_var)
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


def _detectable(base: np.ndarray, runs: np.ndarray, columns: list[int], margin: float, critical: float) -> float | None:
    """The smallest drop (to 1e-4) with power >= POWER, or None if even a drop of 1 falls short."""
    if _power(1.0, base, runs, columns, margin, critical) < POWER:
        return None
    low, high = 0.0, 1.0
    while high - low > 1e-4:
        mid = (low + high) / 2.0
        low, high = (low, mid) if _power(mid, base, runs, columns, margin, critical) >= POWER else (mid, high)
    return high


def drop_test(candidate: Counts, baseline: Counts, margin: float = 0.0, alpha: float = 0.05, seed: int = 38,
              flips: int = FLIPS) -> DropTest:
    """Is the candidate worse than the baseline by more than `margin` on the tasks both ran? (module docstring)."""
    if not 0.0 <= margin < 1.0:
        raise ValueError(f"margin must be in [0, 1), got {margin}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    tasks, perts, diff, base, runs = paired_rows(candidate, baseline)
    if not tasks:
        return DropTest(0, tuple(perts), None, margin=margin, alpha=alpha)
    x = _columns(diff, margin)
    signs, exact = _signs(len(tasks), np.random.default_rng(seed), flips)
    observed = _studentised(np.ones((1, len(tasks))), x)[0]
    smallest = _studentised(signs, x).min(axis=1)
    hits = (smallest[None, :] <= observed[:, None] + 1e-12).sum(axis=1)
    p = hits / len(signs) if exact else (hits + 1) / (len(signs) + 1)  # random flips: the identity is row 0 already
    p = np.minimum(1.0, p)
    # The critical value for power: the alpha-quantile of the smallest statistic under flips of the
    # baseline's per-task scale (the observed differences may all be 0 when nothing changed).
    scale = np.nan_to_num(np.sqrt(np.clip(base * (1 - base), 0.05, None) / np.where(np.isnan(runs), 1.0, runs)), nan=0.0)
    scale = np.where(np.isnan(diff), 0.0, scale)
    critical = float(np.quantile(_studentised(signs, np.column_stack([scale.mean(axis=1), scale])).min(axis=1), alpha))
    differences = {q: float(np.nanmean(diff[:, j])) for j, q in enumerate(perts) if not np.isnan(diff[:, j]).all()}
    ones = [_detectable(base, runs, [j], margin, critical) for j in range(len(perts))]
    return DropTest(
        tasks=len(tasks), perturbations=tuple(perts), difference=float(np.nanmean(np.nanmean(diff, axis=1))),
        differences=differences, p_joint=float(p[0]), p_values={q: float(p[j + 1]) for j, q in enumerate(perts)},
        p_value=float(p.min()), margin=margin, alpha=alpha, worse=bool(p.min() <= alpha),
        detectable_drop=_detectable(base, runs, list(range(len(perts))), margin, critical),
        detectable_drop_one=None if None in ones else max((o for o in ones if o is not None), default=None),
        flips=len(signs), exact=exact,
    )
