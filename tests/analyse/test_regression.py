"""The paired sign-flip test behind `gate --baseline` (issue 38 item 4): valid at task level, never
fails the same agent, and with real power at the demo's size where the betting test had almost none."""

from __future__ import annotations

import math

import numpy as np
import pytest

from plumbline_otel.analyse.regression import EXACT_TASKS, drop_test
from plumbline_otel.analyse.stats import paired_task_regression, regression_verdicts

Counts = dict[str, dict[str, tuple[int, int]]]


def _pair(rng: np.random.Generator, tasks: int, perts: int, repeats: int, drop: float) -> tuple[Counts, Counts]:
    rates = np.clip(rng.beta(0.9 * 2.33, 0.1 * 2.33, size=tasks)[:, None] - np.linspace(0, 0.1, perts)[None, :], 0, 1)
    kb, kc = rng.binomial(repeats, rates), rng.binomial(repeats, np.clip(rates - drop, 0, 1))

    def counts(k: np.ndarray) -> Counts:
        return {f"p{j}": {f"t{i}": (int(k[i, j]), repeats) for i in range(tasks)} for j in range(perts)}

    return counts(kc), counts(kb)


def test_the_same_certificate_is_never_worse_at_any_margin() -> None:
    _, base = _pair(np.random.default_rng(1), 22, 6, 2, 0.0)
    for margin in (0.0, 0.05):
        result = drop_test(base, base, margin=margin)
        assert not result.worse and result.difference == 0.0 and result.p_value > 0.5


def test_identical_agents_are_failed_at_most_alpha_exactly() -> None:
    # Runs drawn independently for two identical agents: with EXACT_TASKS tasks every sign flip is
    # enumerated, so the size is exact up to Monte Carlo error over the simulated studies.
    rng = np.random.default_rng(2)
    studies = 400
    worse = sum(drop_test(*_pair(rng, EXACT_TASKS, 3, 2, 0.0)).worse for _ in range(studies))
    assert worse / studies <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / studies)
    with_margin = sum(drop_test(*_pair(rng, EXACT_TASKS, 3, 2, 0.0), margin=0.05).worse for _ in range(studies))
    assert with_margin <= worse


def test_a_02_drop_at_the_demos_size_is_caught_where_the_betting_test_missed_it() -> None:
    rng = np.random.default_rng(3)
    new = old = 0
    for _ in range(60):
        cand, base = _pair(rng, 22, 6, 2, 0.2)
        new += drop_test(cand, base, margin=0.05, flips=2000).worse
        old += "worse" in regression_verdicts({p: paired_task_regression(cand[p], base[p], margin=0.05) for p in cand}).values()
    assert new / 60 >= 0.8 and old / 60 <= 0.2


def test_exact_flips_give_p_values_on_the_grid_and_the_identity_counts() -> None:
    cand = {"p": {f"t{i}": (0, 2) for i in range(6)}}
    base = {"p": {f"t{i}": (2, 2) for i in range(6)}}
    result = drop_test(cand, base)
    assert result.exact and result.flips == 64
    assert result.p_value == pytest.approx(1 / 64) and result.worse  # every task worse: only the identity is as extreme


def test_it_uses_shared_tasks_and_perturbations_only() -> None:
    cand = {"a": {"t1": (0, 2), "t2": (0, 2), "x": (0, 1)}, "only_cand": {"t1": (0, 1)}}
    base = {"a": {"t1": (2, 2), "t2": (2, 2), "y": (1, 1)}}
    result = drop_test(cand, base)
    assert (result.tasks, result.perturbations, result.difference) == (2, ("a",), -1.0)
    assert drop_test({}, base).difference is None and not drop_test({}, base).worse


def test_the_printed_detectable_drop_shrinks_with_more_tasks_and_matches_simulated_power() -> None:
    rng = np.random.default_rng(4)
    small = drop_test(*_pair(rng, 10, 6, 2, 0.0), margin=0.05, flips=2000).detectable_drop
    large = drop_test(*_pair(rng, 80, 6, 2, 0.0), margin=0.05, flips=2000).detectable_drop
    assert small is not None and large is not None and large < small
    printed = drop_test(*_pair(rng, 22, 6, 2, 0.0), margin=0.05, flips=2000).detectable_drop
    assert printed is not None
    caught = sum(drop_test(*_pair(rng, 22, 6, 2, printed + 0.03), margin=0.05, flips=1000).worse for _ in range(60))
    assert caught / 60 >= 0.6  # ~80% expected at the printed drop; a little above it, well over half


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        drop_test({}, {}, margin=1.0)
    with pytest.raises(ValueError):
        drop_test({}, {}, alpha=0.0)
