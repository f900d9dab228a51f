"""The gate's clustered bound covers the true rate by simulation, where plain Wilson does not."""

from __future__ import annotations

import numpy as np

from plumbline_otel.analyse.simulate import coverage

TASKS = (5, 8, 15, 30)
REPEATS = (1, 2, 4, 8)
RATES = (0.80, 0.90, 0.95, 0.98)
RHOS = (0.0, 0.3, 0.6)


def test_cluster_bound_covers_in_every_cell_of_the_grid() -> None:
    rng = np.random.default_rng(2026)
    cells = [coverage(rng, g, m, p, rho, 2000) for g in TASKS for m in REPEATS for p in RATES for rho in RHOS]
    low = [c for c in cells if c.cluster_kg < 0.95]
    assert not low, low
    # The scenario the issue measured: 8 tasks x 8 repeats at 0.90, where Wilson covered 0.895 and 0.813.
    eight = {c.rho: c for c in cells if (c.tasks, c.repeats, c.rate) == (8, 8, 0.90)}
    assert eight[0.3].wilson < 0.93 and eight[0.6].wilson < 0.85
    assert eight[0.3].cluster_kg >= 0.95 and eight[0.6].cluster_kg >= 0.95


def test_with_one_run_per_task_the_coverage_is_wilsons() -> None:
    rng = np.random.default_rng(1)
    for p in RATES:
        c = coverage(rng, 30, 1, p, 0.0, 2000)
        assert c.cluster_kg == c.wilson
