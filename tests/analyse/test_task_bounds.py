"""The gate's task-level bound (wilson_tasks), its anytime-valid twin (betting_cs), the three-valued
gate, regression against a baseline and the pass^k curve (issue 28)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from scipy import stats as sps

from plumbline_otel.analyse.simulate import one_more_run, random_tasks, sequential_stops
from plumbline_otel.analyse.stats import (
    FAIL,
    INCONCLUSIVE,
    PASS,
    SEQUENTIAL_METHOD,
    TASK_METHOD,
    PassKPoint,
    betting_lower,
    clustered_interval,
    fail_p_value,
    gate_decision,
    mean_bounds,
    paired_task_regression,
    pass_hat_k,
    pass_k_curve,
    regression_verdicts,
    sequential_interval,
    stop_decision,
    task_bounds,
    task_interval,
    tasks_needed,
    wilson_interval,
)

Tasks = list[tuple[int, int]]

# ---- task_interval -------------------------------------------------------------------------------


def test_with_one_run_per_task_its_lower_end_is_todays_wilson() -> None:
    # The upper end is Bentkus's since issue 38 (Wilson's undercovered): it lies above the rate.
    for k, n in ((52, 64), (73, 73), (5, 9), (2, 2), (64, 64)):
        tasks = [(1, 1)] * k + [(0, 1)] * (n - k)
        ours, plain = task_interval(tasks), wilson_interval(k, n)
        assert ours.lower == pytest.approx(plain.lower, abs=1e-12) and k / n <= ours.upper <= 1.0
        assert ours.method == TASK_METHOD and ours.clusters == n and ours.rate == pytest.approx(k / n)


def test_with_one_run_per_task_it_is_never_looser_than_wilson_once_two_tasks_pass() -> None:
    # The only exception: fewer than two conforming tasks, where one task's evidence certifies nothing.
    for n in range(1, 60):
        for k in range(n + 1):
            ours = task_interval([(1, 1)] * k + [(0, 1)] * (n - k)).lower
            assert ours >= wilson_interval(k, n).lower - 1e-12 if k >= 2 else ours == 0.0


def test_one_task_certifies_nothing() -> None:
    assert task_interval([(80, 80)]).lower == 0.0
    assert task_interval([(0, 80)]).upper == 1.0
    assert task_interval([(80, 80), (0, 3)]).lower == 0.0  # still only one task with a conforming run
    assert sequential_interval([(80, 80)]).lower == 0.0


def test_rate_is_the_mean_of_task_rates_not_the_pooled_rate() -> None:
    interval = task_interval([(1, 1), (5, 10)])
    assert interval.rate == pytest.approx(0.75) and (interval.k, interval.n) == (6, 11)


def test_empty_and_runless_tasks() -> None:
    empty = task_interval([(0, 0)])
    assert (empty.n, empty.rate, empty.lower, empty.upper, empty.clusters) == (0, None, 0.0, 1.0, 0)
    assert task_interval([(3, 3), (2, 3), (0, 0)]) == task_interval([(3, 3), (2, 3)])
    with pytest.raises(ValueError):
        task_interval([(4, 3)])
    with pytest.raises(ValueError):
        task_interval([(3, 3)], confidence=1.0)


def test_repeats_sharpen_a_task_but_never_stand_in_for_tasks() -> None:
    # Clean tasks: the bound counts tasks whatever the repeats.
    assert task_interval([(10, 10)] * 30).lower == task_interval([(1, 1)] * 30).lower
    # A flaky task pulls the mean down by its rate, not by a whole failure.
    assert task_interval([(3, 3)] * 29 + [(2, 3)]).lower > task_interval([(1, 1)] * 29 + [(0, 1)]).lower


# ---- Monotonicity: property tests over random studies ------------------------------------------


def _sufficient(studies: list[Tasks]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(total, count, some, short) of each study, as `mean_bounds` takes them."""
    rates = [[c / n for c, n in t if n] for t in studies]
    return (np.array([sum(r) for r in rates]), np.array([len(r) for r in rates]),
            np.array([sum(x > 0 for x in r) for r in rates]), np.array([sum(x < 1 for x in r) for r in rates]))


def test_task_interval_moves_only_the_right_way_over_random_studies() -> None:
    # Both ends, about 40,000 (study, one more run) cases, scored in one batch through `mean_bounds`
    # (what `task_interval` computes, checked equal on a sample below).
    rng = np.random.default_rng(28)
    before, up, down = [], [], []
    for _ in range(1000):
        tasks = random_tasks(rng)
        for where in range(len(tasks) + 1):
            before.append(tasks)
            up.append(one_more_run(tasks, True, where))
            down.append(one_more_run(tasks, False, where))
    (lo_b, hi_b), (lo_u, hi_u), (lo_d, hi_d) = (mean_bounds(*_sufficient(s)) for s in (before, up, down))
    assert len(before) > 20_000  # each with a conforming and a failing run: ~43,000 cases
    assert (lo_u >= lo_b - 1e-12).all() and (hi_u >= hi_b - 1e-12).all()
    assert (lo_d <= lo_b + 1e-12).all() and (hi_d <= hi_b + 1e-12).all()
    assert (hi_d < hi_b - 1e-6).sum() > 1000  # the upper end does move: failures lower it
    for i in range(0, len(before), 400):
        one = task_interval(down[i])
        assert (one.lower, one.upper) == pytest.approx((lo_d[i], hi_d[i]), abs=1e-12)


def test_sequential_bound_moves_only_the_right_way_and_ignores_order() -> None:
    rng = np.random.default_rng(7)
    for _ in range(300):
        tasks = random_tasks(rng)
        before = sequential_interval(tasks)
        where = int(rng.integers(0, len(tasks) + 1))
        up, down = sequential_interval(one_more_run(tasks, True, where)), sequential_interval(one_more_run(tasks, False, where))
        assert up.lower >= before.lower - 1e-9 and down.lower <= before.lower + 1e-9, (tasks, where)
        assert up.upper >= before.upper - 1e-9 and down.upper <= before.upper + 1e-9, (tasks, where)
        shuffled = list(tasks)
        random.Random(1).shuffle(shuffled)
        assert sequential_interval(shuffled).lower == pytest.approx(before.lower, abs=1e-9)


def test_cluster_kg_is_not_monotone_on_the_same_random_studies() -> None:
    # The reason for issue 28: today's bound moves the wrong way on a sizeable share of cases.
    rng = np.random.default_rng(28)
    wrong = 0
    for _ in range(300):
        tasks = random_tasks(rng)
        where = int(rng.integers(0, len(tasks) + 1))
        before, after = clustered_interval(tasks).lower, clustered_interval(one_more_run(tasks, False, where)).lower
        wrong += after > before + 1e-9
    assert wrong > 20


# ---- Tasks needed --------------------------------------------------------------------------------


def _brute_tasks_needed(target: float, tasks: Tasks) -> int:
    typical = int(np.median([n for _, n in tasks])) if tasks else 1
    extra = 0
    while task_interval(tasks + [(typical, typical)] * extra).lower < target:
        extra += 1
    return extra


@pytest.mark.parametrize("target", [0.5, 0.8, 0.9, 0.95])
@pytest.mark.parametrize("tasks", [[], [(3, 3)] * 10, [(3, 3)] * 20 + [(2, 3)], [(1, 1)] * 40 + [(0, 1)] * 2, [(5, 5)]])
def test_tasks_needed_is_the_smallest_number_of_clean_tasks(target: float, tasks: Tasks) -> None:
    assert tasks_needed(target, tasks) == _brute_tasks_needed(target, tasks)


def test_tasks_needed_edges() -> None:
    assert tasks_needed(0.95, []) == 73  # today's 73, now distinct tasks rather than runs
    assert tasks_needed(0.95, [(10, 10)] * 80) == 0
    assert tasks_needed(0.0, [(0, 3)]) == 0
    assert tasks_needed(1.0, [(3, 3)]) is None


# ---- The three-valued gate and sequential stopping -----------------------------------------------


def test_gate_decision() -> None:
    assert gate_decision(0.96, 1.0, 0.95) == PASS
    assert gate_decision(0.95, 1.0, 0.95) == PASS  # reaching the target is enough
    assert gate_decision(0.80, 0.949, 0.95) == FAIL
    assert gate_decision(0.90, 0.99, 0.95) == INCONCLUSIVE
    assert gate_decision(0.90, 0.95, 0.95) == INCONCLUSIVE  # upper exactly at the target is not a FAIL


def test_sequential_interval_needs_as_many_clean_tasks_as_the_fixed_bound() -> None:
    assert sequential_interval([(3, 3)] * 73).lower >= 0.95 > sequential_interval([(3, 3)] * 72).lower
    assert sequential_interval([(3, 3)] * 73).method == SEQUENTIAL_METHOD
    interval = sequential_interval([(3, 3)] * 20 + [(0, 3)] * 20)
    assert interval.lower < 0.5 < interval.upper


def test_stop_decision() -> None:
    assert stop_decision([(3, 3)] * 73, 0.95) == "pass"
    assert stop_decision([(3, 3)] * 40, 0.95) == "continue"
    assert stop_decision([(3, 3)] * 73, 0.95, min_tasks=100) == "continue"
    assert stop_decision([(0, 3)] * 3, 0.95) == "fail"
    assert stop_decision([(0, 3)] * 3, 0.95, min_tasks=5) == "continue"
    assert stop_decision([(3, 3)] * 20 + [(2, 3)] * 20, 0.95) == "fail"


def test_stopping_at_the_first_crossing_keeps_the_error_rate() -> None:
    # The anytime guarantee: look after every 5 tasks, stop at the first "pass"; at a true mean just
    # below the target, the chance of ever passing stays under 5%.
    rng = np.random.default_rng(3)
    studies, horizon, target = 300, 150, 0.95
    rates = np.where(rng.random((studies, horizon)) < 0.06, 0.0, 1.0)  # true mean 0.94 < target
    ever = np.zeros(studies, dtype=bool)
    for t in range(5, horizon + 1, 5):
        ever |= betting_lower(rates[:, :t]) >= target
    assert ever.mean() <= 0.05


# ---- Regression against a baseline ---------------------------------------------------------------


def _study(rates: list[tuple[int, int]]) -> dict[str, tuple[int, int]]:
    return {f"task-{i}": kn for i, kn in enumerate(rates)}


def test_regression_finds_a_candidate_that_broke_tasks() -> None:
    baseline = _study([(3, 3)] * 30)
    candidate = _study([(0, 3)] * 6 + [(3, 3)] * 24)
    result = paired_task_regression(candidate, baseline)
    assert result.verdict == "worse" and result.tasks == 30
    assert result.difference == pytest.approx(-6 / 30) and result.upper < 0.0 <= result.p_worse <= 0.05


def test_identical_agents_are_not_worse_only_within_a_margin() -> None:
    same = _study([(3, 3)] * 60)
    assert paired_task_regression(same, same).verdict == "inconclusive"  # margin 0 cannot be shown
    assert paired_task_regression(same, same, margin=0.1).verdict == "not worse"


def test_regression_uses_shared_tasks_only_and_is_paired() -> None:
    baseline = _study([(3, 3)] * 10)
    candidate = {**_study([(3, 3)] * 10), "new-task": (0, 3)}
    result = paired_task_regression(candidate, baseline)
    assert result.tasks == 10 and result.difference == 0.0
    assert paired_task_regression({}, baseline).verdict == "inconclusive"
    assert paired_task_regression({}, baseline).tasks == 0


def test_regression_p_values_are_valid_when_nothing_changed() -> None:
    # Same agent on both sides (each task's rate drawn once, runs twice): "worse" at most 5% of the time.
    rng = np.random.default_rng(11)
    worse = 0
    for _ in range(300):
        p = rng.beta(2.0, 0.2, size=30)
        base = _study([(int(k), 3) for k in rng.binomial(3, p)])
        cand = _study([(int(k), 3) for k in rng.binomial(3, p)])
        worse += paired_task_regression(cand, base).verdict == "worse"
    assert worse / 300 <= 0.05


def test_regression_verdicts_holm_across_perturbations() -> None:
    baseline = _study([(3, 3)] * 30)
    results = {
        "broken": paired_task_regression(_study([(0, 3)] * 8 + [(3, 3)] * 22), baseline),
        "borderline": paired_task_regression(_study([(0, 3)] * 6 + [(3, 3)] * 24), baseline),
        "same": paired_task_regression(baseline, baseline, margin=0.2),
    }
    verdicts = regression_verdicts(results)
    assert verdicts["broken"] == "worse" and verdicts["same"] == "not worse"
    # On its own "borderline" is worse (p < 0.05); Holm over three asks p <= 0.05 / 2 of the second smallest.
    assert results["borderline"].verdict == "worse"
    assert verdicts["borderline"] == ("worse" if results["borderline"].p_worse <= 0.025 else "inconclusive")
    assert regression_verdicts({}) == {}


# ---- pass^k curve --------------------------------------------------------------------------------


def test_pass_k_curve_points() -> None:
    per_task = [(3, 3), (2, 3), (5, 5), (1, 1), (0, 2)]
    curve = pass_k_curve(per_task, 6)
    assert [p.k for p in curve] == [1, 2, 3, 4, 5, 6]
    assert [p.tasks_used for p in curve] == [5, 4, 3, 1, 1, 0]
    two = [pass_hat_k(n, c, 2) for c, n in per_task if n >= 2]
    assert curve[1].estimate == pytest.approx(sum(two) / len(two))
    assert curve[0].estimate == pytest.approx(task_interval(per_task).rate)
    assert (curve[0].lower, curve[0].upper) == pytest.approx((task_interval(per_task).lower, task_interval(per_task).upper))
    assert curve[5] == PassKPoint(6, None, 0.0, 1.0, 0)
    assert curve[3].lower == 0.0  # one task certifies nothing
    for point in curve[:5]:
        assert point.estimate is not None and point.lower <= point.estimate <= point.upper
    with pytest.raises(ValueError):
        pass_k_curve(per_task, 0)


def test_pass_k_falls_with_k_on_flaky_tasks() -> None:
    curve = pass_k_curve([(8, 10)] * 40, 10)
    estimates = [p.estimate for p in curve]
    assert estimates == sorted(estimates, key=lambda e: -float(e or 0.0))
    assert curve[9].estimate == pytest.approx(math.comb(8, 10) / math.comb(10, 10))


# ---- Exact coverage where it can be computed: one run per task ----------------------------------


def test_exact_coverage_with_one_run_per_task_is_at_least_095() -> None:
    # One run per task is the binomial, the discrete worst case for a bounded mean: coverage is
    # computed exactly (no Monte Carlo). The one-sided z (1.645) falls to 0.911 here; ours does not.
    rates = np.linspace(0.80, 0.999, 400)
    for n in range(2, 101):
        ks = np.arange(n + 1)
        lower = np.array([task_interval([(1, 1)] * int(k) + [(0, 1)] * (n - int(k))).lower for k in ks])
        pmf = sps.binom.pmf(ks[None, :], n, rates[:, None])
        cover = (pmf * (lower[None, :] <= rates[:, None])).sum(axis=1)
        assert cover.min() >= 0.95, (n, rates[cover.argmin()], cover.min())


def test_the_benchs_vectorised_stopping_agrees_with_stop_decision() -> None:
    rng = np.random.default_rng(5)
    for _ in range(40):
        rates = np.where(rng.random(60) < rng.choice([0.0, 0.03, 0.15]), rng.choice([0.0, 0.5]), 1.0)
        per_task = [(int(2 * r), 2) for r in rates]
        decision, used = sequential_stops(rates[None, :], 0.9, 5)
        expected = next(
            ((t, s) for t in range(1, 61) if (s := stop_decision(per_task[:t], 0.9, 5)) != "continue"), (60, "continue")
        )
        assert (int(used[0]), {1: "pass", -1: "fail", 0: "continue"}[int(decision[0])]) == expected


# ---- The upper end (issue 38): a wrong FAIL at most 5%, for any task rates ------------------------


def test_exact_wrong_fail_with_one_run_per_task_is_at_most_005() -> None:
    # Single runs are the binomial, exactly: at a true mean equal to the target, P(FAIL) summed
    # over every outcome. The previous (Wilson) upper end failed 8.6-9.0% of these (issue 38).
    targets = np.concatenate([np.linspace(0.5, 0.99, 50), [0.995, 0.999]])
    for n in (2, 3, 5, 10, 11, 20, 30, 50, 73, 100, 200, 500):
        failures = np.arange(n + 1)
        total, count = (n - failures).astype(float), np.full(n + 1, n)
        upper = mean_bounds(total, count, n - failures, failures)[1]
        pmf = sps.binom.pmf(failures[None, :], n, 1.0 - targets[:, None])
        wrong = (pmf * (upper[None, :] < targets[:, None])).sum(axis=1)
        assert wrong.max() <= 0.05, (n, targets[wrong.argmax()], wrong.max())


def test_the_issues_example_48_of_50_is_inconclusive_at_099_not_fail() -> None:
    interval = task_interval([(1, 1)] * 48 + [(0, 1)] * 2)
    assert interval.upper >= 0.99 and gate_decision(interval.lower, interval.upper, 0.99) == INCONCLUSIVE
    # ... and one more failure is shown below 0.99: the upper end still decides.
    worse = task_interval([(1, 1)] * 47 + [(0, 1)] * 3)
    assert gate_decision(worse.lower, worse.upper, 0.99) == FAIL


def test_the_upper_end_is_below_a_target_exactly_when_the_failures_p_value_says_so() -> None:
    rng = np.random.default_rng(38)
    for _ in range(200):
        tasks = random_tasks(rng)
        interval = task_interval(tasks)
        failures = sum(1 - c / n for c, n in tasks)
        short = sum(c < n for c, n in tasks)
        for target in rng.uniform(max(0.01, interval.upper - 0.05), min(0.999, interval.upper + 0.05), 4):
            below = interval.upper < target - 1e-9
            rejects = short >= 2 and float(fail_p_value(np.array([failures]), len(tasks), float(target))[0]) <= 0.05
            if abs(interval.upper - target) > 1e-9:
                assert below == rejects, (tasks, target, interval.upper)


def test_the_upper_end_holds_on_a_task_mixture_where_the_previous_one_failed() -> None:
    # 30 tasks near 1 - 0.55 / tasks, every task twice, a few flaky ones: the distribution-free
    # bound covers; Wilson's upper end (the previous gate) did not.
    from plumbline_otel.analyse.simulate import Population, gate_fails, verdict_cell

    rng = np.random.default_rng(3)
    q = Population(round(1 - 0.55 / 30, 4))
    c = verdict_cell(rng, 30, "1", q, 20_000, uppers=("wilson_upper (previous gate)",))
    assert c.upper_coverage["wilson_upper (previous gate)"] < 0.93
    assert c.wrong_fail <= 0.05 and c.upper_coverage[TASK_METHOD] >= 0.95
    ks = rng.binomial(2, rng.beta(0.5, 0.5 * 0.02 / 0.98, size=(2000, 20)))
    direct = gate_fails(ks, np.full(20, 2), 0.9)
    assert (direct == (task_bounds(ks, np.full(20, 2))[1] < 0.9)).all()
