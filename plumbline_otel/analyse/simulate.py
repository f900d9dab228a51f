"""Simulated clustered runs, to measure how often an interval's lower bound covers the true rate.

Used by the coverage test (tests/analyse/test_cluster_coverage.py) and bench/cluster_coverage.py.
Each task gets its own pass rate drawn from a beta distribution with mean `rate` and intraclass
correlation `rho` (a + b = 1/rho - 1), then its repeats are Bernoulli draws at that rate: the
beta-binomial model of "an agent that fails a task tends to fail it on every run". Everything
is vectorised over samples, so a grid cell of thousands of simulated studies takes milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import norm

from plumbline_otel.analyse.stats import cluster_bounds


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


__all__ = ["Coverage", "coverage", "simulate_counts", "wilson_lower"]
