"""The audit's tests of significance against closed forms and simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dpopt.audit.stats import (
    clopper_pearson_lower,
    clopper_pearson_upper,
    delta_thinning,
    epsilon_lower_bound,
    fisher_pvalue,
)


@pytest.mark.parametrize("k, n", [(0, 10), (3, 10), (10, 10), (417, 1000)])
def test_clopper_pearson_bounds_are_the_binomial_tail_inversions(k, n):
    alpha = 0.025
    low, up = float(clopper_pearson_lower(k, n, alpha)), float(clopper_pearson_upper(k, n, alpha))
    # Definition: L is the p at which P(X >= k) = alpha, U the p at which P(X <= k) = alpha.
    if k > 0:
        assert stats.binom.sf(k - 1, n, low) == pytest.approx(alpha, rel=1e-6)
    else:
        assert low == 0
    if k < n:
        assert stats.binom.cdf(k, n, up) == pytest.approx(alpha, rel=1e-6)
    else:
        assert up == 1
    assert low <= k / n <= up


def test_the_epsilon_bound_is_ln_of_the_bound_ratio_and_zero_without_evidence():
    n = 1000
    expected = math.log(float(clopper_pearson_lower(600, n, 0.025)) / float(clopper_pearson_upper(300, n, 0.025)))
    assert epsilon_lower_bound(600, n, 300, n) == pytest.approx(expected)
    assert epsilon_lower_bound(300, n, 600, n) == 0.0
    assert epsilon_lower_bound(0, n, 0, n) == 0.0
    # delta-thinning: subtracting delta from the lower bound of p_a
    low, up = float(clopper_pearson_lower(600, n, 0.025)), float(clopper_pearson_upper(300, n, 0.025))
    assert epsilon_lower_bound(600, n, 300, n, delta=0.1) == pytest.approx(math.log((low - 0.1) / up))
    assert epsilon_lower_bound(5, n, 0, n, delta=0.01) == 0.0  # 5 hits in 1000 are within delta


def test_the_epsilon_bound_covers_the_true_epsilon():
    """At the true ratio e^eps of the probabilities, the 95% bound exceeds eps in at most ~5% of trials."""
    gen = np.random.default_rng(3)  # simulation of counts, not privacy noise
    eps, p_b, n, trials = 0.5, 0.2, 2000, 2000
    k_a = gen.binomial(n, p_b * math.exp(eps), trials)
    k_b = gen.binomial(n, p_b, trials)
    bounds = epsilon_lower_bound(k_a, n, k_b, n)
    assert np.mean(bounds > eps) <= 0.05  # exact intervals are conservative: typically far below
    assert np.median(bounds) > 0.3  # and not vacuous


def test_with_delta_the_bound_covers_an_epsilon_delta_pair():
    gen = np.random.default_rng(4)
    eps, delta, p_b, n, trials = 0.3, 0.05, 0.1, 2000, 2000
    k_a = gen.binomial(n, p_b * math.exp(eps) + delta, trials)
    k_b = gen.binomial(n, p_b, trials)
    assert np.mean(epsilon_lower_bound(k_a, n, k_b, n, delta=delta) > eps) <= 0.05
    assert np.mean(epsilon_lower_bound(k_a, n, k_b, n) > eps) > 0.5  # ignoring delta would wrongly flag


def test_fisher_at_epsilon_zero_is_scipys_one_sided_fisher_test():
    for k_a, k_b, n in ((30, 12, 100), (5, 5, 50), (0, 3, 40)):
        expected = stats.fisher_exact([[k_a, n - k_a], [k_b, n - k_b]], alternative="greater")[1]
        assert fisher_pvalue(k_a, n, k_b, n, epsilon=0.0) == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_fisher_is_the_exact_average_of_statdps_randomised_p_value():
    """StatDP draws B ~ Bin(k_a, e^-eps) and averages Fisher's p-value; the exact sum equals the limit."""
    gen = np.random.default_rng(5)
    k_a, k_b, n, eps = 140, 70, 400, 0.4
    draws = gen.binomial(k_a, math.exp(-eps), 20000)
    values, counts = np.unique(draws, return_counts=True)
    tails = stats.hypergeom.sf(values - 1, 2 * n, values + k_b, n)
    monte_carlo = float(np.dot(counts, tails) / counts.sum())
    assert fisher_pvalue(k_a, n, k_b, n, eps) == pytest.approx(monte_carlo, abs=0.01)


def test_fisher_rejects_a_true_excess_and_keeps_a_valid_claim():
    n = 5000
    assert fisher_pvalue(int(n * 0.2 * math.exp(1.0)), n, int(n * 0.2), n, epsilon=0.5) < 1e-6
    assert fisher_pvalue(int(n * 0.2 * math.exp(0.4)), n, int(n * 0.2), n, epsilon=0.5) > 0.5


def test_delta_thinning_is_the_upper_quantile_of_the_delta_hits():
    assert delta_thinning(1000, 0.0, 0.005) == 0
    q = delta_thinning(10000, 1e-3, 0.005)
    assert stats.binom.sf(q, 10000, 1e-3) <= 0.005 < stats.binom.sf(q - 1, 10000, 1e-3)
    # a thinned count that the delta hits can explain is not evidence
    assert fisher_pvalue(q, 10000, 0, 10000, epsilon=0.5, delta=1e-3) == 1.0


@pytest.mark.parametrize("p_hi, n, eps, excess, delta", [(0.3, 400, 0.5, 0.6, 0.0), (0.05, 2000, 1.0, 0.8, 0.0),
                                                          (0.5, 300, 0.5, 1.0, 0.01)])
def test_the_power_of_the_test_matches_a_simulation_of_it(p_hi, n, eps, excess, delta):
    """The exact power (a sum over the binomial laws) against the frequency of flags over simulated counts."""
    from dpopt.audit.stats import alternative, detection_power

    p_lo = alternative(p_hi, eps, excess, delta)
    assert p_hi == pytest.approx(math.exp(eps + excess) * p_lo + delta)
    gen = np.random.default_rng(11)  # simulation of counts, not privacy noise
    trials = 20_000
    k_hi, k_lo = gen.binomial(n, p_hi, trials), gen.binomial(n, p_lo, trials)
    flagged = np.asarray(epsilon_lower_bound(k_hi, n, k_lo, n, delta, 0.05)) > eps
    power = detection_power(p_hi, n, n, eps, excess, delta)
    assert abs(flagged.mean() - power) < 4 * math.sqrt(power * (1 - power) / trials) + 1e-3


def test_the_detectable_excess_is_where_the_power_reaches_95_percent():
    from dpopt.audit.stats import POWER, detectable_excess, detection_power, runs_for_excess

    x = detectable_excess(0.3, 1000, 1000, 0.5)
    assert 0 < x < 2
    assert detection_power(0.3, 1000, 1000, 0.5, x) >= POWER > detection_power(0.3, 1000, 1000, 0.5, x - 0.01)
    assert detectable_excess(0.3, 4000, 4000, 0.5) < x  # more runs, a smaller detectable excess
    assert math.isinf(detectable_excess(0.3, 5, 5, 0.5))  # 5 runs certify nothing
    assert math.isinf(detectable_excess(0.0, 1000, 1000, 0.5))  # an event never hit
    n = runs_for_excess(0.3, 0.5, x)
    assert n is not None and abs(n - 1000) <= 150  # the inverse, up to the binomial's discreteness
    assert runs_for_excess(0.3, 0.5, 0.01, max_runs=10_000) is None
