"""The gate's bound (wilson_tasks) covers the mean conformance over tasks on beta-binomial and
two-point task populations, and the issue-28 failures of cluster_kg do not happen with it.

The full grid and every candidate are in bench/bound_coverage.py; this is a reduced grid for the
chosen method only.
"""

from __future__ import annotations

import math
from itertools import product

import numpy as np
import pytest
from scipy.stats import binom

from plumbline_otel.analyse.simulate import Population, cell, verdict_cell
from plumbline_otel.analyse.stats import CLUSTER_METHOD, TASK_METHOD, clustered_interval, task_interval

SAMPLES = 4000
# Monte Carlo slack: a cell whose true coverage is exactly 0.95 is estimated from SAMPLES studies
# with standard error sqrt(0.95 * 0.05 / SAMPLES) = 0.0034; it reads below 0.95 - 3.5 se = 0.938
# with probability 2e-4, so over the grid's ~400 cells a valid bound fails this by chance less
# than 1 time in 10. The exact (no Monte Carlo) check on single runs is in test_task_bounds.py.
SLACK = 3.5 * math.sqrt(0.95 * 0.05 / SAMPLES)
TASKS = (3, 5, 10, 30, 100)
PATTERNS = ("1", "3", "20", "1-20")
BETA = [Population(p, rho) for p in (0.80, 0.90, 0.95, 0.98, 0.999) for rho in (0.0, 0.3, 0.9)]
MIXED = [Population(p, 0.02, s, b) for p, s, b in product((0.80, 0.95), (0.02, 0.05), (0.0, 0.05))]


def test_the_gate_bound_covers_in_every_cell_of_the_reduced_grid() -> None:
    rng = np.random.default_rng(2028)
    cells = [
        cell(rng, g, pattern, q, SAMPLES, (TASK_METHOD,))
        for g, pattern, q in product(TASKS, PATTERNS, BETA + [q for q in MIXED if q.valid])
        if not (pattern == "1" and q.rho and not q.bad_share)
    ]
    coverage = [c.coverage[TASK_METHOD] for c in cells]
    worst = min(cells, key=lambda c: c.coverage[TASK_METHOD])
    assert min(coverage) >= 0.95 - SLACK, worst
    assert float(np.mean(coverage)) >= 0.97


def test_cluster_kg_undercovers_on_mixtures_where_the_gate_bound_does_not() -> None:
    # The cell: 30 tasks x 20 repeats, a few always-failing tasks among flaky-but-good ones.
    rng = np.random.default_rng(30)
    mixture = cell(rng, 30, "20", Population(0.95, 0.02, 0.05, 0.05), SAMPLES, (TASK_METHOD, CLUSTER_METHOD))
    assert mixture.coverage[CLUSTER_METHOD] < 0.9
    assert mixture.coverage[TASK_METHOD] >= 0.95


# ---- Regression tests: the named failures of cluster_kg ------------------------------------------


def test_one_failure_never_raises_the_bound_30_tasks_x_10() -> None:
    clean, one_failure = [(10, 10)] * 30, [(10, 10)] * 29 + [(9, 10)]
    # cluster_kg: 0.844 clean, 0.961 with one failure, so a 0.95 gate passed the failing agent.
    assert clustered_interval(one_failure).lower > 0.95 > clustered_interval(clean).lower
    assert task_interval(one_failure).lower <= task_interval(clean).lower
    assert task_interval(one_failure).lower < 0.95


@pytest.mark.parametrize(("tasks", "few", "many"), [(5, 1, 10), (73, 1, 2), (30, 3, 10)])
def test_clean_repeats_never_lower_the_bound(tasks: int, few: int, many: int) -> None:
    # cluster_kg: 5 tasks 0.566 with one run each, 0.303 with ten; 73 tasks 0.950 with one, 0.934 with two.
    assert task_interval([(many, many)] * tasks).lower >= task_interval([(few, few)] * tasks).lower
    if (tasks, few) in ((5, 1), (73, 1)):
        assert clustered_interval([(many, many)] * tasks).lower < clustered_interval([(few, few)] * tasks).lower


def test_73_clean_tasks_certify_095_whatever_their_repeats() -> None:
    for repeats in (1, 2, 10):
        assert task_interval([(repeats, repeats)] * 73).lower >= 0.95
        assert task_interval([(repeats, repeats)] * 72).lower < 0.95


def test_decoy_tools_43_of_44_does_not_certify_above_44_of_44() -> None:
    # The demo's react decoy_tools cell: 43/44 certified 0.8109 above its clean 44/44 cells at 0.8022.
    for shape in ((44, 1), (22, 2), (11, 4)):
        tasks, runs = shape
        clean = [(runs, runs)] * tasks
        failing = [(runs, runs)] * (tasks - 1) + [(runs - 1, runs)]
        assert task_interval(failing).lower <= task_interval(clean).lower


# ---- Issue 38: both ends, and the three verdicts ----------------------------------------------------

NEAR_ONE = [Population(round(1 - 0.55 / g, 4), rho) for g in TASKS for rho in (0.0, 0.3)]


def test_both_ends_hold_their_stated_error_in_every_cell_of_the_reduced_grid() -> None:
    # A wrong PASS (target just above the truth) and a wrong FAIL (target at the truth) are each at
    # most 5% in every cell: beta populations, mixtures, unequal repeats, and means near 1 - 0.55 /
    # tasks where Wilson's upper end (the previous gate) was worst.
    rng = np.random.default_rng(2038)
    cells = [
        verdict_cell(rng, g, pattern, q, SAMPLES, uppers=("wilson_upper (previous gate)",))
        for g, pattern, q in product(TASKS, PATTERNS, BETA + NEAR_ONE + [q for q in MIXED if q.valid])
        if not (pattern == "1" and q.rho and not q.bad_share)
    ]
    worst_fail = max(cells, key=lambda c: c.wrong_fail)
    worst_pass = max(cells, key=lambda c: c.wrong_pass)
    assert worst_fail.wrong_fail <= 0.05 + SLACK, worst_fail
    assert worst_pass.wrong_pass <= 0.05 + SLACK, worst_pass
    # The grid is one the previous upper end fails: this test can tell the two apart.
    assert sum(c.upper_coverage["wilson_upper (previous gate)"] < 0.95 - SLACK for c in cells) >= 5


@pytest.mark.parametrize(("tasks", "truth", "target", "power"), [(100, 0.80, 0.90, 0.80), (50, 0.90, 0.99, 0.85), (200, 0.95, 0.99, 0.90)])
def test_a_valid_upper_end_still_fails_agents_clearly_below_the_target(tasks: int, truth: float, target: float, power: float) -> None:
    # Exactly, on single runs: validity is not bought by never failing anyone.
    failures = np.arange(tasks + 1)
    upper = task_interval_uppers(tasks, failures)
    assert (binom.pmf(failures, tasks, 1 - truth) * (upper < target)).sum() >= power


def task_interval_uppers(tasks: int, failures: np.ndarray) -> np.ndarray:
    from plumbline_otel.analyse.stats import mean_bounds

    return mean_bounds((tasks - failures).astype(float), np.full(failures.size, tasks), tasks - failures, failures)[1]
