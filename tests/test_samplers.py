"""Statistical and exactness tests of the discrete Laplace and Gaussian samplers.

Every statistical test draws from a :class:`SeededRandom` (test-only: seeded noise is NOT
private) with a fixed seed, so the suite is deterministic. Each null test uses level
``ALPHA = 1e-3``; the power checks require the *same* chi-square test to reject samples
drawn at 0.7x and 1.3x the scale (sigma for the Gaussian) at that level.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from dpopt.errors import PrivacyParameterError
from dpopt.privacy.randomness import SecureRandom, SeededRandom
from dpopt.privacy.samplers import (
    MAX_GAUSSIAN_SIGMA2,
    MAX_LAPLACE_SCALE,
    SamplerInfo,
    _theta_sums,
    bernoulli_exp,
    discrete_gaussian,
    discrete_gaussian_pmf,
    discrete_gaussian_variance,
    discrete_laplace,
    discrete_laplace_pmf,
    discrete_laplace_variance,
)

ALPHA = 1e-3
Z_CRIT = stats.norm.isf(ALPHA / 2)  # two-sided z-test at ALPHA
N = 20_000

LAPLACE_SCALES = [Fraction(1, 2), 1, 3.7, 10, 250]
GAUSSIAN_SIGMA2 = [Fraction(1, 4), 1, 10, 100, 2500, 10**12]


# ---- helpers ----------------------------------------------------------------------------------
def binned_chisquare(samples: np.ndarray, pmf_window: np.ndarray, half_width: int) -> float:
    """p-value of a chi-square test of ``samples`` against a symmetric law on the integers.

    ``pmf_window[i]`` is P(X = i - half_width); the mass outside the window (split evenly,
    the laws being symmetric) joins the two end cells, and samples outside are clipped into
    them. Adjacent cells are merged (a) on a cumulative grid of about N/100 expected draws
    and (b) until every bin expects at least 5 draws.
    """
    n = samples.size
    tail = max(0.0, (1.0 - float(pmf_window.sum())) / 2.0)
    expected = n * pmf_window.astype(np.float64)
    expected[0] += n * tail
    expected[-1] += n * tail
    observed = np.bincount(np.clip(samples, -half_width, half_width) + half_width,
                           minlength=2 * half_width + 1).astype(np.float64)
    cum = np.cumsum(expected)
    target = max(5.0, n / 100.0)
    ends = np.unique(np.searchsorted(cum, np.arange(1, int(cum[-1] // target) + 1) * target))
    starts = np.unique(np.r_[0, ends + 1])
    starts = starts[starts < expected.size]
    exp_bins = np.add.reduceat(expected, starts)
    obs_bins = np.add.reduceat(observed, starts)
    merged_e, merged_o, acc_e, acc_o = [], [], 0.0, 0.0  # greedy merge over bins (few hundred)
    for e, o in zip(exp_bins, obs_bins):
        acc_e, acc_o = acc_e + e, acc_o + o
        if acc_e >= 5.0:
            merged_e.append(acc_e)
            merged_o.append(acc_o)
            acc_e, acc_o = 0.0, 0.0
    merged_e[-1] += acc_e
    merged_o[-1] += acc_o
    e, o = np.array(merged_e), np.array(merged_o)
    assert e.min() >= 5.0 and e.size >= 2
    e *= n / e.sum()  # float round-off only: the window plus tails holds all the mass
    return float(stats.chisquare(o, e).pvalue)


def laplace_window(scale) -> tuple[np.ndarray, int]:
    w = math.ceil(20 * float(scale)) + 5
    return discrete_laplace_pmf(np.arange(-w, w + 1), scale), w


def gaussian_window(sigma2) -> tuple[np.ndarray, int]:
    w = math.ceil(6 * math.sqrt(float(sigma2))) + 5
    return discrete_gaussian_pmf(np.arange(-w, w + 1), sigma2), w


def laplace_fourth_moment(scale) -> float:
    w = math.ceil(80 * float(scale)) + 10
    x = np.arange(-w, w + 1, dtype=np.float64)
    return float(np.sum(x**4 * discrete_laplace_pmf(x, scale)))


def gaussian_fourth_moment(sigma2) -> float:
    s2 = float(sigma2)
    if s2 > 1e6:
        # Poisson summation: the lattice corrections are O(exp(-2 pi^2 sigma^2)), far below
        # float resolution, so the continuous value 3 sigma^4 is exact to rounding
        # (checked against the direct sum in test_gaussian_fourth_moment_formula).
        return 3.0 * s2 * s2
    w = math.ceil(40 * math.sqrt(s2)) + 10
    x = np.arange(-w, w + 1, dtype=np.float64)
    return float(np.sum(x**4 * discrete_gaussian_pmf(x, sigma2)))


def moment_z_scores(samples: np.ndarray, variance: float, fourth: float) -> tuple[float, float]:
    """z of the sample mean (law's mean 0) and of mean(x^2) (expectation ``variance``)."""
    x = samples.astype(np.float64)
    n = x.size
    z_mean = x.mean() / math.sqrt(variance / n)
    z_var = (np.mean(x * x) - variance) / math.sqrt((fourth - variance**2) / n)
    return float(z_mean), float(z_var)


# ---- discrete Laplace ------------------------------------------------------------------------
@pytest.mark.parametrize("seed, scale", list(enumerate(LAPLACE_SCALES, start=101)))
def test_discrete_laplace_fits_its_law(seed, scale):
    rng = SeededRandom(seed)
    x = discrete_laplace(scale, N, rng)
    assert x.dtype == np.int64 and x.shape == (N,)
    pmf, w = laplace_window(scale)
    assert binned_chisquare(x, pmf, w) > ALPHA
    z_mean, z_var = moment_z_scores(x, discrete_laplace_variance(scale), laplace_fourth_moment(scale))
    assert abs(z_mean) < Z_CRIT
    assert abs(z_var) < Z_CRIT


@pytest.mark.parametrize("seed, scale", list(enumerate(LAPLACE_SCALES, start=201)))
@pytest.mark.parametrize("factor", [Fraction(7, 10), Fraction(13, 10)])
def test_discrete_laplace_chisquare_rejects_wrong_scale(seed, scale, factor):
    rng = SeededRandom(seed + int(10 * factor))
    x = discrete_laplace(Fraction(scale) * factor, N, rng)
    pmf, w = laplace_window(scale)
    assert binned_chisquare(x, pmf, w) < ALPHA


def test_discrete_laplace_float_scale_is_exact_and_reported():
    x, info = discrete_laplace(3.7, 10, SeededRandom(5), return_info=True)
    assert isinstance(info, SamplerInfo)
    assert info.requested == info.used == Fraction(3.7)  # the float's exact binary value
    assert not info.rounded and not info.big_integer_fallback and info.arithmetic == "int64"
    assert not info.private and "NOT private" in info.random_source


def test_discrete_laplace_big_integer_fallback():
    # t = 2**70 + 1 > int64: U, U + tV and the Bernoulli bounds are Python ints.
    scale = Fraction(2**70 + 1, 2**70)
    x, info = discrete_laplace(scale, N, SeededRandom(7), return_info=True)
    assert info.big_integer_fallback and info.arithmetic.endswith("fallback")
    assert x.dtype == np.int64
    pmf, w = laplace_window(scale)
    assert binned_chisquare(x, pmf, w) > ALPHA
    z_mean, z_var = moment_z_scores(x, discrete_laplace_variance(scale), laplace_fourth_moment(scale))
    assert abs(z_mean) < Z_CRIT and abs(z_var) < Z_CRIT


def test_tiny_parameters_with_huge_denominators():
    # s = 2**70 > int64: Y = floor(X / s) is 0 unless X >= 2**70 (probability ~ exp(-2**70)).
    x, info = discrete_laplace(Fraction(1, 2**70), 1000, SeededRandom(9), return_info=True)
    assert not x.any() and info.big_integer_fallback
    # sigma^2 = 1e-10: P(X != 0) ~ 2 exp(-5e9).
    y, info = discrete_gaussian(1e-10, 1000, SeededRandom(10), return_info=True)
    assert not y.any() and info.big_integer_fallback


def test_discrete_laplace_rounding_up_is_reported():
    x, info = discrete_laplace(Fraction(10**6 + 1, 10**6), 5, SeededRandom(8), max_denominator=1000,
                               return_info=True)
    assert info.used == Fraction(1001, 1000) and info.used > info.requested and info.rounded


# ---- discrete Gaussian -----------------------------------------------------------------------
@pytest.mark.parametrize("seed, sigma2", list(enumerate(GAUSSIAN_SIGMA2, start=301)))
def test_discrete_gaussian_fits_its_law(seed, sigma2):
    rng = SeededRandom(seed)
    x, info = discrete_gaussian(sigma2, N, rng, return_info=True)
    assert x.dtype == np.int64 and x.shape == (N,)
    # sigma^2 = 10^12 cannot stay in int64 (2 p q t^2 ~ 2e24): the exact fallback must run.
    assert info.big_integer_fallback == (sigma2 == 10**12)
    pmf, w = gaussian_window(sigma2)
    assert binned_chisquare(x, pmf, w) > ALPHA
    variance = discrete_gaussian_variance(sigma2)
    z_mean, z_var = moment_z_scores(x, variance, gaussian_fourth_moment(sigma2))
    assert abs(z_mean) < Z_CRIT
    assert abs(z_var) < Z_CRIT


@pytest.mark.parametrize("seed, sigma2", list(enumerate(GAUSSIAN_SIGMA2, start=401)))
@pytest.mark.parametrize("factor", [Fraction(7, 10), Fraction(13, 10)])
def test_discrete_gaussian_chisquare_rejects_wrong_sigma(seed, sigma2, factor):
    rng = SeededRandom(seed + int(10 * factor))
    x = discrete_gaussian(Fraction(sigma2) * factor**2, N, rng)  # sigma scaled by factor
    pmf, w = gaussian_window(sigma2)
    assert binned_chisquare(x, pmf, w) < ALPHA


def test_discrete_gaussian_mixed_int64_and_big_integer_path():
    # sigma^2 = 9.00000001 = p/q with q = 10^8, t = 4: 2 p q t^2 ~ 2.9e18 fits int64 but
    # doubles past it at K = 4 in Algorithm 1, and |Y| > 7 makes (|Y| q t - p)^2 overflow,
    # so both per-element fallbacks run next to the int64 path.
    sigma2 = Fraction(9 * 10**8 + 1, 10**8)
    x, info = discrete_gaussian(sigma2, N, SeededRandom(11), return_info=True)
    assert info.big_integer_fallback and not info.rounded
    pmf, w = gaussian_window(sigma2)
    assert binned_chisquare(x, pmf, w) > ALPHA
    z_mean, z_var = moment_z_scores(x, discrete_gaussian_variance(sigma2), gaussian_fourth_moment(sigma2))
    assert abs(z_mean) < Z_CRIT and abs(z_var) < Z_CRIT


def test_discrete_gaussian_float_sigma2_exact_and_rounded():
    # Exact: Fraction(2.3) has denominator 2**49, so the big-integer path runs.
    x, info = discrete_gaussian(2.3, N, SeededRandom(12), return_info=True)
    assert info.used == Fraction(2.3) and info.big_integer_fallback and not info.rounded
    pmf, w = gaussian_window(2.3)
    assert binned_chisquare(x, pmf, w) > ALPHA
    # Rounded up to denominator 1000: 23/10 >= Fraction(2.3), back on int64.
    y, info = discrete_gaussian(2.3, N, SeededRandom(13), max_denominator=1000, return_info=True)
    assert info.rounded and info.used == Fraction(23, 10) and info.used >= info.requested
    assert not info.big_integer_fallback
    pmf, w = gaussian_window(info.used)
    assert binned_chisquare(y, pmf, w) > ALPHA


# ---- Bernoulli(exp(-gamma)) -----------------------------------------------------------------------
@pytest.mark.parametrize("seed, num, den", [(501, 0, 1), (502, 3, 10), (503, 1, 1), (504, 5, 2)])
def test_bernoulli_exp_frequency(seed, num, den):
    n = 200_000
    draws = bernoulli_exp(np.full(n, num), np.full(n, den), SeededRandom(seed))
    assert draws.dtype == bool and draws.shape == (n,)
    p = math.exp(-num / den)
    if num == 0:
        assert draws.all()  # exp(0) = 1 exactly
    else:
        assert stats.binomtest(int(draws.sum()), n, p).pvalue > ALPHA


def test_bernoulli_exp_mixed_gammas_and_big_integers():
    n = 100_000
    big = 10**30
    num = np.array([3 * big, 0, 25 * big], dtype=object)  # gamma = 0.3, 0, 2.5 as huge ratios
    den = np.array([10 * big, big, 10 * big], dtype=object)
    draws = bernoulli_exp(np.tile(num, n), np.tile(den, n), SeededRandom(505)).reshape(n, 3)
    assert draws[:, 1].all()
    for col, gamma in [(0, 0.3), (2, 2.5)]:
        assert stats.binomtest(int(draws[:, col].sum()), n, math.exp(-gamma)).pvalue > ALPHA


def test_bernoulli_exp_broadcasts_scalars():
    draws = bernoulli_exp(np.zeros((2, 3), dtype=np.int64), 7, SeededRandom(1))
    assert draws.shape == (2, 3) and draws.all()


# ---- closed forms ------------------------------------------------------------------------------------
@pytest.mark.parametrize("scale", LAPLACE_SCALES)
def test_laplace_closed_forms_match_direct_sums(scale):
    w = math.ceil(80 * float(scale)) + 10
    x = np.arange(-w, w + 1)
    pmf = discrete_laplace_pmf(x, scale)
    assert pmf.sum() == pytest.approx(1.0, rel=1e-12)
    assert float(np.sum(x.astype(float) ** 2 * pmf)) == pytest.approx(discrete_laplace_variance(scale), rel=1e-10)
    # ratio of neighbours is exp(-1/scale) (the defining law)
    assert pmf[w + 1] / pmf[w] == pytest.approx(math.exp(-1 / float(scale)), rel=1e-12)


@pytest.mark.parametrize("sigma2", GAUSSIAN_SIGMA2)
def test_gaussian_closed_forms(sigma2):
    s2 = float(sigma2)
    pmf, w = gaussian_window(sigma2)
    assert pmf.sum() == pytest.approx(1.0, abs=1e-8)  # window of 6 sigma holds all but ~2e-9
    assert pmf[w + 1] / pmf[w] == pytest.approx(math.exp(-1 / (2 * s2)), rel=1e-12)
    var = discrete_gaussian_variance(sigma2)
    assert var <= s2
    # Poisson summation: the deficit is 8 pi^2 s2^2 exp(-2 pi^2 s2) to leading order.
    deficit = 8 * math.pi**2 * s2 * s2 * math.exp(-2 * math.pi**2 * s2)
    if s2 >= 10:
        assert var == pytest.approx(s2, rel=1e-14)  # deficit below 1e-80
    elif s2 >= 1:
        assert s2 - var == pytest.approx(deficit, rel=1e-6)


def test_gaussian_variance_small_sigma_by_hand():
    # sigma^2 = 1/4: P(x) ∝ exp(-2 x^2); terms beyond |x| = 4 are below 1e-20.
    e = math.exp
    by_hand = (2 * e(-2) + 8 * e(-8) + 18 * e(-18) + 32 * e(-32)) / (1 + 2 * e(-2) + 2 * e(-8) + 2 * e(-18) + 2 * e(-32))
    assert discrete_gaussian_variance(Fraction(1, 4)) == pytest.approx(by_hand, rel=1e-14)
    assert by_hand < 0.216  # well below sigma^2 = 0.25 at this small scale


@pytest.mark.parametrize("sigma2", [0.25, 1.0, 7.5, 100.0, 1e4, 1e6])
def test_poisson_summation_matches_direct_sums(sigma2):
    w = math.ceil(40 * math.sqrt(sigma2)) + 10
    x = np.arange(-w, w + 1, dtype=float)
    weights = np.exp(-x * x / (2 * sigma2))
    s0, s1 = _theta_sums(sigma2)
    assert weights.sum() == pytest.approx(math.sqrt(2 * math.pi * sigma2) * s0, rel=1e-12)
    assert np.sum(x * x * weights) / weights.sum() == pytest.approx(sigma2 * s1 / s0, rel=1e-11)


def test_gaussian_large_sigma_uses_continuous_normaliser():
    s2 = 10**12
    assert discrete_gaussian_pmf([0], s2)[0] == pytest.approx(1 / math.sqrt(2 * math.pi * s2), rel=1e-14)
    assert discrete_gaussian_variance(s2) == pytest.approx(s2, rel=1e-14)


def test_gaussian_fourth_moment_formula():
    # Supports the 3 sigma^4 shortcut of gaussian_fourth_moment for sigma^2 > 1e6.
    for s2 in [100.0, 2500.0, 1e6]:
        w = math.ceil(40 * math.sqrt(s2)) + 10
        x = np.arange(-w, w + 1, dtype=float)
        assert np.sum(x**4 * discrete_gaussian_pmf(x, s2)) == pytest.approx(3 * s2 * s2, rel=1e-11)


# ---- shapes, default source, validation -----------------------------------------------------------
def test_shapes_and_empty():
    rng = SeededRandom(2)
    assert discrete_laplace(2, (3, 4), rng).shape == (3, 4)
    assert discrete_gaussian(2, (2, 0), rng).shape == (2, 0)
    assert discrete_gaussian(2, 0, rng).dtype == np.int64


def test_default_source_is_secure():
    x, info = discrete_laplace(10, 1000, return_info=True)
    assert x.dtype == np.int64 and info.private and info.random_source == SecureRandom.description
    y, info = discrete_gaussian(100, 1000, SecureRandom(), return_info=True)
    assert y.dtype == np.int64 and info.private


def test_same_seed_same_noise():
    assert np.array_equal(discrete_gaussian(50, 1000, SeededRandom(9)), discrete_gaussian(50, 1000, SeededRandom(9)))
    assert np.array_equal(discrete_laplace(5, 1000, SeededRandom(9)), discrete_laplace(5, 1000, SeededRandom(9)))
    assert not np.array_equal(discrete_laplace(5, 1000, SeededRandom(9)), discrete_laplace(5, 1000, SeededRandom(10)))


BAD_PARAMETERS = [
    (0, "positive"), (-1, "positive"), (Fraction(-1, 3), "positive"), (0.0, "positive"),
    (float("nan"), "finite"), (float("inf"), "finite"), (-float("inf"), "finite"),
    ("1", "an int, Fraction or float"), (None, "an int, Fraction or float"),
    (1 + 2j, "an int, Fraction or float"), (True, "a positive number"),
]


@pytest.mark.parametrize("value, why", BAD_PARAMETERS)
def test_laplace_rejects_bad_scale(value, why):
    with pytest.raises(PrivacyParameterError, match=f"scale must be {why}"):
        discrete_laplace(value, 3, SeededRandom(1))
    with pytest.raises(PrivacyParameterError, match="scale"):
        discrete_laplace_variance(value)
    with pytest.raises(PrivacyParameterError, match="scale"):
        discrete_laplace_pmf([0], value)


@pytest.mark.parametrize("value, why", BAD_PARAMETERS)
def test_gaussian_rejects_bad_sigma2(value, why):
    with pytest.raises(PrivacyParameterError, match=f"sigma2 must be {why}"):
        discrete_gaussian(value, 3, SeededRandom(1))
    with pytest.raises(PrivacyParameterError, match="sigma2"):
        discrete_gaussian_variance(value)
    with pytest.raises(PrivacyParameterError, match="sigma2"):
        discrete_gaussian_pmf([0], value)


def test_parameters_above_int64_output_range_are_refused():
    with pytest.raises(PrivacyParameterError, match="scale must be at most"):
        discrete_laplace(MAX_LAPLACE_SCALE + 1, 3, SeededRandom(1))
    with pytest.raises(PrivacyParameterError, match="sigma2 must be at most"):
        discrete_gaussian(MAX_GAUSSIAN_SIGMA2 * 2, 3, SeededRandom(1))


@pytest.mark.parametrize("size", [-1, 2.5, "3", (2, -1), [3], None, True, (2, 1.0)])
def test_samplers_reject_bad_size(size):
    with pytest.raises(PrivacyParameterError, match="size must be"):
        discrete_laplace(1, size, SeededRandom(1))
    with pytest.raises(PrivacyParameterError, match="size must be"):
        discrete_gaussian(1, size, SeededRandom(1))


def test_samplers_reject_bad_rng_and_max_denominator():
    with pytest.raises(PrivacyParameterError, match="rng must be a RandomSource"):
        discrete_laplace(1, 3, np.random.default_rng(0))
    with pytest.raises(PrivacyParameterError, match="rng must be a RandomSource"):
        bernoulli_exp(1, 2, rng=object())
    for bad in [0, -5, 1.5, True]:
        with pytest.raises(PrivacyParameterError, match="max_denominator"):
            discrete_gaussian(2.3, 3, SeededRandom(1), max_denominator=bad)


def test_bernoulli_exp_rejects_bad_input():
    rng = SeededRandom(1)
    with pytest.raises(PrivacyParameterError, match="num must be non-negative"):
        bernoulli_exp(-1, 2, rng)
    with pytest.raises(PrivacyParameterError, match="den must be at least 1"):
        bernoulli_exp(1, 0, rng)
    with pytest.raises(PrivacyParameterError, match="num must be an integer"):
        bernoulli_exp(np.array([0.5]), 2, rng)
    with pytest.raises(PrivacyParameterError, match="den must hold integers"):
        bernoulli_exp(1, np.array([2, "a"], dtype=object), rng)
    with pytest.raises(PrivacyParameterError, match="do not broadcast"):
        bernoulli_exp(np.zeros(2, dtype=int), np.ones(3, dtype=int), rng)


def test_pmf_rejects_non_integer_points():
    with pytest.raises(PrivacyParameterError, match="x must hold integers"):
        discrete_laplace_pmf([0.5], 1)
    with pytest.raises(PrivacyParameterError, match="x must hold integers"):
        discrete_gaussian_pmf(["a"], 1)
