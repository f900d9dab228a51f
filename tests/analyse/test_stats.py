"""Statistics against published and hand-computed values."""

from __future__ import annotations

import math

import pytest

from plumbline_otel.analyse.stats import (
    Interval,
    RepeatAgreement,
    clustered_interval,
    holm,
    mcnemar_exact,
    pass_at_k,
    pass_hat_k,
    permutation_test,
    repeat_agreement,
    trials_needed,
    wilson_interval,
)


def pct(x: float | None) -> float | None:
    return None if x is None else round(100 * x, 1)


# ---- Wilson -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("k", "n", "rate", "lower", "upper"),
    [
        (52, 64, 81.2, 70.0, 88.9),
        (64, 64, 100.0, 94.3, 100.0),
        (55, 56, 98.2, 90.6, 99.7),
        (57, 58, 98.3, 90.9, 99.7),
        (34, 34, 100.0, 89.8, 100.0),
        (56, 56, 100.0, 93.6, 100.0),
    ],
)
def test_wilson_reproduces_published_figures(
    k: int, n: int, rate: float, lower: float, upper: float
) -> None:
    interval = wilson_interval(k, n)
    assert (interval.k, interval.n) == (k, n)
    assert (pct(interval.rate), pct(interval.lower), pct(interval.upper)) == (rate, lower, upper)
    assert interval.confidence == 0.95
    assert interval.method == "wilson"


def test_wilson_all_pass_upper_is_exactly_one_and_none_pass_lower_is_exactly_zero() -> None:
    assert wilson_interval(64, 64).upper == 1.0
    assert wilson_interval(0, 64).lower == 0.0
    # Closed form at k == n: lower = n / (n + z^2).
    z = 1.959963984540054
    assert wilson_interval(64, 64).lower == pytest.approx(64 / (64 + z * z), rel=1e-12)


def test_wilson_n_zero_says_so() -> None:
    interval = wilson_interval(0, 0)
    assert interval == Interval(0, 0, None, 0.0, 1.0, 0.95, "wilson")


def test_wilson_one_sided_lower_bound() -> None:
    one = wilson_interval(64, 64, two_sided=False)
    assert one.method == "wilson_lower"
    assert one.upper == 1.0
    z = 1.6448536269514722  # one-sided 95%
    assert one.lower == pytest.approx(64 / (64 + z * z), rel=1e-12)
    # One-sided 95% uses a smaller z than two-sided, so its lower bound is higher.
    assert one.lower > wilson_interval(64, 64).lower
    # One-sided 97.5% is the lower end of the two-sided 95%.
    assert wilson_interval(52, 64, 0.975, two_sided=False).lower == pytest.approx(
        wilson_interval(52, 64).lower, rel=1e-12
    )


@pytest.mark.parametrize(("k", "n"), [(-1, 5), (6, 5), (0, -1)])
def test_wilson_rejects_impossible_counts(k: int, n: int) -> None:
    with pytest.raises(ValueError):
        wilson_interval(k, n)


def test_wilson_rejects_bad_confidence() -> None:
    with pytest.raises(ValueError):
        wilson_interval(5, 10, confidence=1.0)


# ---- Clustered intervals ------------------------------------------------------------------------

HOMOGENEOUS = [(8, 10)] * 8  # every task at 80%: no between-task variation at all
HETEROGENEOUS = [(10, 10)] * 6 + [(2, 10)] * 2  # also 64/80, but tasks either pass or fail
# Variation between tasks about as large as binomial noise alone would give (p = 0.8, n = 10).
BINOMIAL_LIKE = [(7, 10), (9, 10), (8, 10), (6, 10), (10, 10), (8, 10), (9, 10), (7, 10)]







def test_cluster_kg_is_plain_wilson_when_every_task_ran_once() -> None:
    for k, n in ((52, 64), (73, 73), (5, 9)):
        clustered = clustered_interval([(1, 1)] * k + [(0, 1)] * (n - k))
        plain = wilson_interval(k, n)
        assert (clustered.lower, clustered.upper) == (plain.lower, plain.upper)
        assert clustered.method == "cluster_kg" and clustered.design_effect == 1.0


def test_cluster_kg_one_task_certifies_nothing() -> None:
    # The case: 80 clean runs of one task gave 0.954 and passed a 0.95 gate.
    assert wilson_interval(80, 80).lower > 0.95
    one = clustered_interval([(80, 80)])
    assert (one.lower, one.upper, one.clusters) == (0.0, 1.0, 1)


def test_cluster_kg_with_no_failures_counts_tasks_not_runs() -> None:
    # No within-task variation: clustering cannot be estimated, so the design effect is the task size.
    clean = clustered_interval([(8, 8)] * 8)
    assert clean.design_effect == 8.0 and clean.lower < wilson_interval(8, 8).lower
    # 100 clean tasks x 4 repeats reach 0.95; 80 clean tasks x 2 repeats do not.
    assert clustered_interval([(4, 4)] * 100).lower > 0.95 > clustered_interval([(2, 2)] * 80).lower


def test_cluster_kg_widens_with_heterogeneous_tasks_and_stays_below_wilson() -> None:
    for tasks in (HOMOGENEOUS, BINOMIAL_LIKE, HETEROGENEOUS):
        clustered = clustered_interval(tasks)
        assert clustered.lower < wilson_interval(64, 80).lower
    assert clustered_interval(HETEROGENEOUS).lower < clustered_interval(BINOMIAL_LIKE).lower - 0.1





def test_clustered_one_sided() -> None:
    two = clustered_interval(HETEROGENEOUS)
    one = clustered_interval(HETEROGENEOUS, two_sided=False)
    assert one.upper == 1.0
    assert one.lower > two.lower


def test_clustered_with_no_runs_says_so() -> None:
    empty = clustered_interval([(0, 0)])
    assert (empty.k, empty.n, empty.rate, empty.lower, empty.upper) == (0, 0, None, 0.0, 1.0)
    assert empty.clusters == 0 and empty.method == "cluster_kg"


def test_clustered_drops_empty_tasks() -> None:
    assert clustered_interval(HETEROGENEOUS + [(0, 0)]) == clustered_interval(HETEROGENEOUS)


# ---- Permutation test ---------------------------------------------------------------------------


def test_exact_permutation_published_values() -> None:
    result = permutation_test(52, 64, 64, 64)
    assert float(f"{result.p_value:.2g}") == 0.00028
    assert result.difference == pytest.approx(52 / 64 - 1)
    assert result.method == "exact"
    assert (result.k1, result.n1, result.k2, result.n2) == (52, 64, 64, 64)
    assert round(permutation_test(64, 64, 55, 56).p_value, 3) == 0.467


def test_exact_permutation_hand_computed() -> None:
    # 64/64 vs 55/56: one failure among 120 runs. Only the table with the failure in the second
    # sample is as extreme as observed (|diff| 1/56 > 1/64), and it has probability 56/120.
    assert permutation_test(64, 64, 55, 56).p_value == pytest.approx(56 / 120, rel=1e-12)
    # Identical rates: every table is at least as extreme as a zero difference.
    assert permutation_test(5, 10, 5, 10).p_value == pytest.approx(1.0)


def test_exact_permutation_is_symmetric() -> None:
    forward = permutation_test(52, 64, 64, 64)
    backward = permutation_test(64, 64, 52, 64)
    assert forward.p_value == backward.p_value
    assert forward.difference == -backward.difference  # type: ignore[operator]


@pytest.mark.parametrize(("k1", "n1", "k2", "n2"), [(52, 64, 64, 64), (64, 64, 55, 56)])
def test_monte_carlo_agrees_with_exact(k1: int, n1: int, k2: int, n2: int) -> None:
    exact = permutation_test(k1, n1, k2, n2)
    mc = permutation_test(k1, n1, k2, n2, method="monte_carlo")
    assert mc.method == "monte_carlo"
    assert mc.resamples == 20000
    assert mc.mc_se is not None and mc.mc_se > 0
    assert abs(mc.p_value - exact.p_value) <= 4 * mc.mc_se


def test_monte_carlo_is_seeded_and_independent_of_input_order() -> None:
    forward = permutation_test(52, 64, 60, 70, method="monte_carlo", seed=3)
    backward = permutation_test(60, 70, 52, 64, method="monte_carlo", seed=3)
    assert forward.p_value == backward.p_value
    assert forward.mc_se == backward.mc_se
    again = permutation_test(52, 64, 60, 70, method="monte_carlo", seed=3)
    assert again == forward


def test_monte_carlo_p_is_never_zero() -> None:
    mc = permutation_test(0, 200, 200, 200, method="monte_carlo", resamples=1000)
    assert mc.p_value == pytest.approx(1 / 1001)


def test_permutation_with_an_empty_side() -> None:
    result = permutation_test(3, 5, 0, 0)
    assert result.difference is None
    assert result.p_value == 1.0


# ---- Paired and multiple comparisons ------------------------------------------------------------


def test_mcnemar_exact_sign_test() -> None:
    # 9 discordant pairs, 1 favouring A: p = 2 * (1 + 9) / 2^9.
    pairs = [(True, True)] * 20 + [(True, False)] + [(False, True)] * 8 + [(False, False)] * 3
    result = mcnemar_exact(pairs)
    assert (result.n, result.both, result.only_a, result.only_b, result.neither) == (32, 20, 1, 8, 3)
    assert result.p_value == pytest.approx(20 / 512, rel=1e-12)


def test_mcnemar_without_discordant_pairs() -> None:
    result = mcnemar_exact([(True, True), (False, False)])
    assert result.p_value == 1.0
    assert result.n == 2


def test_holm_known_values_in_input_order() -> None:
    # Sorted: 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 = 0.04 -> monotone 0.06.
    result = holm([0.01, 0.04, 0.03, 0.005])
    assert result.adjusted == pytest.approx((0.03, 0.06, 0.06, 0.02))
    assert result.reject == (True, False, False, True)
    assert result.alpha == 0.05


def test_holm_caps_at_one_and_handles_empty() -> None:
    assert holm([0.5, 0.9]).adjusted == (1.0, 1.0)
    assert holm([]) == holm([], 0.05)
    assert holm([]).adjusted == ()
    with pytest.raises(ValueError):
        holm([1.5])


# ---- pass@k and pass^k --------------------------------------------------------------------------


def test_pass_at_k_known_values() -> None:
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(10, 3, 2) == pytest.approx(1 - 21 / 45)
    assert pass_at_k(10, 0, 5) == 0.0
    assert pass_at_k(10, 8, 3) == 1.0  # any 3 of 10 include a success when only 2 fail


def test_pass_hat_k_known_values() -> None:
    assert pass_hat_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_hat_k(10, 3, 2) == pytest.approx(3 / 45)
    assert pass_hat_k(10, 3, 4) == 0.0
    assert pass_hat_k(10, 10, 10) == 1.0


@pytest.mark.parametrize(("n", "c", "k"), [(5, 2, 0), (5, 2, 6), (5, 6, 1)])
def test_pass_k_rejects_impossible_arguments(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)
    with pytest.raises(ValueError):
        pass_hat_k(n, c, k)


# ---- Planning -----------------------------------------------------------------------------------


def test_trials_needed_for_095_is_73() -> None:
    assert trials_needed(0.95) == 73
    assert wilson_interval(73, 73).lower >= 0.95 > wilson_interval(72, 72).lower


def _brute_force(target: float, failures: int, confidence: float, two_sided: bool) -> int:
    n = max(1, failures)
    while wilson_interval(n - failures, n, confidence, two_sided).lower < target:
        n += 1
    return n


@pytest.mark.parametrize("target", [0.1, 0.5, 0.8, 0.9, 0.95, 0.99])
@pytest.mark.parametrize("failures", [0, 1, 2, 5])
@pytest.mark.parametrize("two_sided", [True, False])
def test_trials_needed_is_the_smallest_n(target: float, failures: int, two_sided: bool) -> None:
    assert trials_needed(target, failures, 0.95, two_sided) == _brute_force(
        target, failures, 0.95, two_sided
    )


def test_trials_needed_grows_with_failures() -> None:
    needed = [trials_needed(0.95, f) for f in range(8)]
    assert needed == sorted(set(needed))  # strictly increasing
    assert needed[0] == 73
    # One-sided needs fewer runs than two-sided at the same confidence.
    assert trials_needed(0.95, two_sided=False) < 73
    assert trials_needed(0.95, two_sided=False) == math.ceil(0.95 * 1.6448536269514722**2 / 0.05)


@pytest.mark.parametrize("target", [0.0, 1.0, -0.1])
def test_trials_needed_rejects_unreachable_targets(target: float) -> None:
    with pytest.raises(ValueError):
        trials_needed(target)


def test_permutation_rejects_unknown_method_even_with_an_empty_side() -> None:
    with pytest.raises(ValueError):
        permutation_test(3, 5, 0, 0, method="bootstrap")  # type: ignore[arg-type]


def test_repeat_agreement_pass_k_and_flip_rate() -> None:
    # Three tasks of 4 repeats: all pass, 2 of 4, all fail. pass^4 = (1 + 0 + 0) / 3; one task flips.
    agreement = repeat_agreement([(4, 4), (2, 4), (0, 4)])
    assert agreement.k == 4 and agreement.pass_k == pytest.approx(1 / 3) and agreement.flip_rate == pytest.approx(1 / 3)
    # Unequal repeats: k is the fewest (2); pass^2 of 2/3 is C(2,2)/C(3,2) = 1/3.
    unequal = repeat_agreement([(2, 3), (2, 2)])
    assert unequal.k == 2 and unequal.pass_k == pytest.approx((1 / 3 + 1) / 2) and unequal.flip_rate == 0.5
    # Every task ran once: pass^1 is the rate and there is no flip rate to report.
    once = repeat_agreement([(1, 1), (0, 1), (1, 1)])
    assert once.k == 1 and once.pass_k == pytest.approx(2 / 3) and once.flip_rate is None
    assert repeat_agreement([]) == RepeatAgreement(0, None, None)


def test_cluster_kg_never_claims_more_than_wilson() -> None:
    import random

    rng = random.Random(5)
    for _ in range(300):
        tasks = []
        for _ in range(rng.randint(1, 12)):
            n = rng.randint(1, 8)
            tasks.append((rng.randint(0, n), n))
        k, n = sum(t[0] for t in tasks), sum(t[1] for t in tasks)
        clustered, plain = clustered_interval(tasks), wilson_interval(k, n)
        assert clustered.lower <= plain.lower + 1e-12, tasks
        assert clustered.upper >= plain.upper - 1e-12, tasks
