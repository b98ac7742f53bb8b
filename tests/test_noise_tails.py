"""Tails of the total absolute noise: exact discrete Laplace mixture, sub-Gaussian bound."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binom

from dpopt.privacy.noise_tails import (
    gaussian_abs_sum_bound,
    gaussian_abs_sum_t,
    laplace_abs_sum_log_sf,
    laplace_abs_sum_quantile,
)
from dpopt.privacy.randomness import make_random
from dpopt.privacy.samplers import discrete_gaussian, discrete_laplace


def brute_force_abs_sum_pmf(scale: float, m: int, support: int) -> np.ndarray:
    """pmf of sum |Z_i| by convolving the pmf of |Z| m times (truncated far in the tail)."""
    p = math.exp(-1.0 / scale)
    j = np.arange(support)
    pmf = np.where(j == 0, (1 - p) / (1 + p), 2 * (1 - p) / (1 + p) * p**j)
    out = np.array([1.0])
    for _ in range(m):
        out = np.convolve(out, pmf)[:support]
    return out


@pytest.mark.parametrize("scale,m", [(0.7, 1), (2.5, 7), (10.0, 12)])
def test_laplace_tail_equals_convolution(scale, m):
    pmf = brute_force_abs_sum_pmf(scale, m, 3000)
    for s in (0, 1, 5.5, 3 * m * scale, 8 * m * scale):
        expected = pmf[int(math.floor(s)) + 1:].sum()
        assert math.exp(laplace_abs_sum_log_sf(scale, m, s)) == pytest.approx(expected, rel=1e-9, abs=1e-300)
    assert laplace_abs_sum_log_sf(scale, m, -1) == 0.0


def test_laplace_tail_matches_the_sampler():
    """Monte Carlo with the library's own exact sampler: the parameterisation agrees."""
    scale, m, reps = 3.0, 20, 4000
    z = discrete_laplace(scale, (reps, m), make_random(3)).astype(float)
    sums = np.abs(z).sum(axis=1)
    for s in (40, 60, 80):
        p = math.exp(laplace_abs_sum_log_sf(scale, m, s))
        hits = int((sums > s).sum())
        assert binom.cdf(hits, reps, p) > 1e-5 and binom.sf(hits - 1, reps, p) > 1e-5


@pytest.mark.parametrize("t", [0.1, 1.0, 5.0, 40.0])
def test_laplace_quantile_is_the_smallest_certified_integer(t):
    scale, m = 4.0, 30
    s = laplace_abs_sum_quantile(scale, m, t)
    assert laplace_abs_sum_log_sf(scale, m, s) <= -t < laplace_abs_sum_log_sf(scale, m, s - 1)


def test_gaussian_bound_inverts_and_holds():
    sigma, m = 3.0, 25
    for t in (0.3, 2.0, 9.0):
        assert gaussian_abs_sum_t(sigma, m, gaussian_abs_sum_bound(sigma, m, t)) == pytest.approx(t)
    assert gaussian_abs_sum_t(sigma, m, sigma * m) == 0.0  # sqrt(m) * sigma sqrt(m): not beyond the mean
    reps, t = 4000, 1.0
    z = discrete_gaussian(sigma**2, (reps, m), make_random(4)).astype(float)
    exceed = int((np.abs(z).sum(axis=1) > gaussian_abs_sum_bound(sigma, m, t)).sum())
    assert binom.sf(exceed - 1, reps, math.exp(-t)) > 1e-5  # one-sided: not exceeded more often than e^{-t}
