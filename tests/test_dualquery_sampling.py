"""The exact sampler of the query player: its law (chi-square, with power), edge cases and input checks."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

import dpopt.privacy.exp_weights as exp_weights
from dpopt.errors import PrivacyParameterError
from dpopt.privacy.exp_weights import exp_weights_probabilities, sample_exp_weights
from dpopt.privacy.randomness import SeededRandom

ALPHA = 1e-3


def chi_square_pvalue(draws: np.ndarray, p: np.ndarray) -> float:
    """Pearson's test of the draws against ``p``, cells with expected count < 5 pooled."""
    obs = np.bincount(draws, minlength=p.size).astype(np.float64)
    exp = p * draws.size
    small = exp < 5
    if small.any():
        obs = np.append(obs[~small], obs[small].sum())
        exp = np.append(exp[~small], exp[small].sum())
    return stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


CASES = [
    ("few buckets", np.array([0, 5, -3, 12, 7, 7, -20, 1]), Fraction(3, 10)),
    ("many buckets", np.arange(-60, 1) * 3, Fraction(7, 11)),
    ("dualquery-like", np.array([50 * 321 - 321 * k for k in range(6)] * 5) + np.arange(30), Fraction(1, 642)),
]


@pytest.mark.parametrize("name, scores, coef", CASES)
def test_the_draws_follow_the_multiplicative_weights_law(name, scores, coef):
    p = exp_weights_probabilities(scores, coef)
    draws = sample_exp_weights(scores, coef, 60_000, SeededRandom(1))
    assert chi_square_pvalue(draws, p) > ALPHA


@pytest.mark.parametrize("factor", [0.7, 1.3])
def test_the_chi_square_test_has_power_against_a_wrong_rate(factor):
    scores, coef = CASES[0][1], CASES[0][2]
    draws = sample_exp_weights(scores, coef, 60_000, SeededRandom(2))
    wrong = exp_weights_probabilities(scores, coef * Fraction(factor))
    assert chi_square_pvalue(draws, wrong) < ALPHA


def test_undecided_words_are_refined_exactly(monkeypatch):
    # A 3-bit grid makes most first words undecided, so the refinement path does the work.
    monkeypatch.setattr(exp_weights, "GRID_BITS", 3)
    scores, coef = CASES[0][1], CASES[0][2]
    draws = sample_exp_weights(scores, coef, 20_000, SeededRandom(3))
    assert chi_square_pvalue(draws, exp_weights_probabilities(scores, coef)) > ALPHA


def test_zero_rate_is_uniform_and_one_bucket_needs_no_word_for_it():
    draws = sample_exp_weights(np.array([4, -9, 2, 0]), 0, 40_000, SeededRandom(4))
    assert chi_square_pvalue(draws, np.full(4, 0.25)) > ALPHA
    same = sample_exp_weights(np.zeros(5, dtype=np.int64), Fraction(1, 3), 40_000, SeededRandom(7))
    assert chi_square_pvalue(same, np.full(5, 0.2)) > ALPHA


def test_huge_exponents_take_the_big_integer_path():
    scores = np.array([0, -10**15, 10**15, 10**15 - 3])
    coef = Fraction(10**9 + 7, 10**24)  # (u_max - u) * numerator overflows int64
    draws = sample_exp_weights(scores, coef, 30_000, SeededRandom(6))
    p = exp_weights_probabilities(scores, coef)
    assert chi_square_pvalue(draws, p) > ALPHA


def test_seeded_draws_are_reproducible():
    scores, coef = CASES[1][1], CASES[1][2]
    assert np.array_equal(sample_exp_weights(scores, coef, 1000, SeededRandom(9)),
                          sample_exp_weights(scores, coef, 1000, SeededRandom(9)))


@pytest.mark.parametrize("scores, coef, size, message", [
    (np.array([0.5, 1.0]), 1, 3, "integers"),
    (np.array([], dtype=np.int64), 1, 3, "non-empty"),
    (np.array([1, 2]), -1, 3, "coef"),
    (np.array([1, 2]), 1, -1, "size"),
])
def test_bad_inputs_are_refused(scores, coef, size, message):
    with pytest.raises(PrivacyParameterError, match=message):
        sample_exp_weights(scores, coef, size, SeededRandom(0))
