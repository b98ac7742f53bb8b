"""Mechanisms: scales derived from sensitivities, charges before any draw, noise laws,
exponential-mechanism frequencies, and a statistical DP audit on neighbouring datasets."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from dpopt.errors import BudgetExceededError, PrivacyParameterError, QueryError
from dpopt.model.data import Dataset
from dpopt.model.domain import Domain
from dpopt.model.queries import Identity, Marginal, Stack, Total, Weighted
from dpopt.privacy.accountant import Accountant
from dpopt.privacy.mechanisms import (
    exponential_mechanism,
    gaussian_mechanism,
    laplace_mechanism,
    report_noisy_max,
)
from dpopt.privacy.randomness import SeededRandom
from dpopt.privacy.samplers import discrete_gaussian_variance, discrete_laplace_pmf, discrete_laplace_variance


class CountingRandom(SeededRandom):
    """A seeded source that counts the words drawn, to prove that refusals draw nothing."""

    def __init__(self, seed):
        super().__init__(seed)
        self.drawn = 0

    def words(self, n):
        self.drawn += int(n)
        return super().words(n)


@pytest.fixture
def data(rng):
    dom = Domain.from_dict({"a": 3, "b": 2, "c": 4})
    return Dataset.from_histogram(rng.integers(0, 50, dom.size), dom)


def test_laplace_scale_from_sensitivity_and_budget(data):
    acct = Accountant.pure(1)
    q = Stack([Marginal(data.domain, ["a"]), Marginal(data.domain, ["b", "c"])])  # L1 sensitivity 2
    m = laplace_mechanism(q, data, Fraction(1, 2), acct, SeededRandom(1))
    assert m.scale == pytest.approx(4.0) and m.noise == "discrete_laplace"
    assert m.variance == pytest.approx(discrete_laplace_variance(4))
    assert np.all(m.values == np.round(m.values))  # integer query -> integer answers
    assert acct.spent.epsilon == Fraction(1, 2)


def test_refused_charge_draws_nothing(data):
    acct = Accountant.pure(Fraction(1, 10))
    rng = CountingRandom(3)
    with pytest.raises(BudgetExceededError):
        laplace_mechanism(Identity(data.domain), data, Fraction(1, 5), acct, rng)
    with pytest.raises(BudgetExceededError):
        exponential_mechanism([1.0, 2.0], Fraction(1, 5), acct, rng)
    assert rng.drawn == 0 and acct.spent.epsilon == 0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"epsilon": 0}, "epsilon must be positive"),
        ({"epsilon": -1}, "epsilon"),
        ({"epsilon": float("nan")}, "epsilon"),
        ({"epsilon": float("inf")}, "epsilon"),
    ],
)
def test_laplace_validation(data, kwargs, match):
    rng = CountingRandom(0)
    with pytest.raises(PrivacyParameterError, match=match):
        laplace_mechanism(Identity(data.domain), data, accountant=Accountant.pure(1), rng=rng, **kwargs)
    assert rng.drawn == 0


def test_gaussian_validation_and_scale(data):
    acct = Accountant.zcdp(1)
    with pytest.raises(PrivacyParameterError, match="delta must be in"):
        gaussian_mechanism(Total(data.domain), data, Accountant.approx(1, 1e-3), epsilon=1, delta=1.5)
    with pytest.raises(PrivacyParameterError, match="not both"):
        gaussian_mechanism(Total(data.domain), data, acct, rho=1, epsilon=1, delta=1e-6)
    q = Stack([Marginal(data.domain, ["a"]), Marginal(data.domain, ["b"])])  # squared L2 sensitivity 2
    m = gaussian_mechanism(q, data, acct, SeededRandom(2), rho=Fraction(1, 4))
    assert m.scale == pytest.approx(2.0)  # sigma^2 = 2 / (2 * 1/4) = 4
    assert m.variance == pytest.approx(discrete_gaussian_variance(4))
    assert acct.spent.rho == Fraction(1, 4)
    approx = Accountant.approx(2, Fraction(1, 1000))
    gaussian_mechanism(Total(data.domain), data, approx, SeededRandom(2), epsilon=1, delta=Fraction(1, 10**6))
    assert approx.spent.epsilon == 1 and approx.spent.delta == Fraction(1, 10**6)
    with pytest.raises(PrivacyParameterError):
        gaussian_mechanism(Total(data.domain), data, Accountant.pure(1), rho=Fraction(1, 10))


def test_laplace_noise_law(data, rng):
    """Residuals of many Laplace measurements follow the discrete Laplace pmf (chi-square)."""
    acct = Accountant.pure(10**6)
    q = Identity(data.domain)
    true = q.answer(data)
    src = SeededRandom(11)
    noise = np.concatenate([laplace_mechanism(q, data, 1, acct, src).values - true for _ in range(400)])
    support = np.arange(-6, 7)
    observed = np.array([(noise == k).sum() for k in support] + [(np.abs(noise) > 6).sum()])
    expected_p = discrete_laplace_pmf(support, 1)
    expected = np.append(expected_p, 1 - expected_p.sum()) * noise.size
    assert stats.chisquare(observed, expected).pvalue > 1e-3
    wrong = np.append(discrete_laplace_pmf(support, 1.3), 1 - discrete_laplace_pmf(support, 1.3).sum()) * noise.size
    assert stats.chisquare(observed, wrong).pvalue < 1e-3  # power: the test sees a 1.3x scale


def test_real_valued_query_on_a_grid(data):
    acct = Accountant.pure(1)
    q = Weighted(Marginal(data.domain, ["a"]), 0.3)
    m = laplace_mechanism(q, data, 1, acct, SeededRandom(5))
    grid = m.info["grid"]
    assert grid < 0.3 * 2**-19 and np.log2(grid) == int(np.log2(grid))
    assert np.allclose(m.values / grid, np.round(m.values / grid))
    assert m.info["sensitivity_l1"] == pytest.approx(0.3)
    assert m.scale > 0.3  # the grid's share is added to the sensitivity


def test_exponential_mechanism_frequencies():
    scores = np.array([0.0, 1.0, 2.5, 4.0, 4.0]) + 3e6  # large offsets must not matter
    eps = Fraction(1)
    acct = Accountant.pure(10**6)
    src = SeededRandom(7)
    picks = np.array([exponential_mechanism(scores, eps, acct, src) for _ in range(2000)])
    weights = np.exp(float(eps) * (scores - scores.max()) / 2)
    expected = weights / weights.sum() * picks.size
    observed = np.bincount(picks, minlength=scores.size)
    assert stats.chisquare(observed, expected).pvalue > 1e-3
    flat = np.full(scores.size, picks.size / scores.size)
    assert stats.chisquare(observed, flat).pvalue < 1e-6
    assert acct.spent.epsilon == 2000


def test_report_noisy_max_prefers_the_best():
    acct = Accountant.pure(10**6)
    src = SeededRandom(9)
    picks = [report_noisy_max([0, 0, 50, 0], 1, acct, src) for _ in range(200)]
    assert np.mean(np.array(picks) == 2) > 0.95
    with pytest.raises(QueryError, match="at least one candidate"):
        report_noisy_max([], 1, acct, src)



def test_report_noisy_max_keeps_exact_steps_for_scores_far_apart():
    """Scores 1e14 apart on a grid of 2^-20 are 1e20 steps apart, past int64: the best must win
    (a float-to-int64 cast wrapped round and made the choice uniform)."""
    src = SeededRandom(1)
    picks = [report_noisy_max([0.0] * 50 + [1e14], 1, Accountant.pure(100), src) for _ in range(20)]
    assert picks == [50] * 20

def test_dp_audit_laplace_on_neighbours():
    """Neighbouring datasets (one record apart), many runs: for the event {output >= t},
    P[M(D) in S] <= e^eps P[M(D') in S] must hold; Fisher's exact test must not find the
    ratio significantly larger, and must flag a mechanism calibrated at 3 eps."""
    dom = Domain(("a",), (2,))
    d1 = Dataset.from_histogram(np.array([5, 3]), dom)
    d2 = Dataset.from_histogram(np.array([6, 3]), dom)
    q = Marginal(dom, ["a"])
    eps = Fraction(1, 2)
    runs = 1500

    def outputs(data, epsilon, seed):
        acct = Accountant.pure(10**6)
        src = SeededRandom(seed)
        return np.array([laplace_mechanism(q, data, epsilon, acct, src).values[0] for _ in range(runs)])

    def audit(epsilon_used, seed):
        a, b = outputs(d2, epsilon_used, seed), outputs(d1, epsilon_used, seed + 1)
        hits_a, hits_b = int((a >= 6).sum()), int((b >= 6).sum())
        # Shrink the first count by e^eps (binomial thinning in expectation) and test for excess.
        scaled = int(round(hits_a / np.exp(float(eps))))
        table = [[scaled, runs - scaled], [hits_b, runs - hits_b]]
        return stats.fisher_exact(table, alternative="greater").pvalue

    assert audit(eps, 100) > 0.01
    assert audit(3 * eps, 200) < 1e-3  # a mechanism with a third of the noise is caught


def test_exponential_mechanism_big_denominator_and_spread():
    """An epsilon whose denominator is 2^64 (beyond int64) and scores spread over 1e14 (2^20 grid
    steps each: beyond int64 too) are sampled exactly: frequencies against the closed form."""
    eps = Fraction(2**64 + 1, 2**64)  # just above 1
    scores = np.array([0.0, 1.0, 2.5, 4.0, 4.0])
    acct = Accountant.pure(10**6)
    src = SeededRandom(11)
    picks = np.array([exponential_mechanism(scores, eps, acct, src) for _ in range(2000)])
    weights = np.exp(float(eps) * (scores - scores.max()) / 2)
    observed = np.bincount(picks, minlength=scores.size)
    assert stats.chisquare(observed, weights / weights.sum() * picks.size).pvalue > 1e-3
    assert acct.spent.epsilon == 2000 * eps
    # A candidate 1e14 below the best is never drawn (probability exp(-5e13)); the rest as above.
    wide = np.concatenate([scores, [-1e14]])
    picks = np.array([exponential_mechanism(wide, 1, acct, src) for _ in range(1000)])
    assert picks.max() < scores.size
    observed = np.bincount(picks, minlength=scores.size)
    w = np.exp((scores - scores.max()) / 2)
    assert stats.chisquare(observed, w / w.sum() * picks.size).pvalue > 1e-3
