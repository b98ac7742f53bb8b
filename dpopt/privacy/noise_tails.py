"""Tail bounds for the total absolute noise ``sum_i |Z_i|`` of a measurement.

The Barak et al. shift (Theorem 6) makes a reconstructed table non-negative whenever the
shift is at least ``sum_alpha |z_alpha|``, so what it can certify is a tail bound on that
sum. Both are exact statements about the noise the samplers draw, not approximations:

* **Discrete Laplace**, ``P(z) ∝ p^|z|`` with ``p = exp(-1/scale)``. ``|Z|`` is 0 with
  probability ``(1 - p)/(1 + p)`` and otherwise ``1 + G`` with ``G`` geometric
  (``P(G = j) = (1 - p) p^j``). So ``S = sum_{i<=m} |Z_i| = K + NB(K, 1 - p)`` with
  ``K ~ Binomial(m, 2p/(1 + p))`` nonzero draws and ``NB`` the negative binomial count of
  failures; :func:`laplace_abs_sum_log_sf` sums that mixture exactly (in logs).
* **Discrete Gaussian** ``N_Z(0, sigma^2)`` is sigma-sub-Gaussian (Canonne, Kamath, Steinke
  2020, Cor. 9), so ``P(||z||^2 > sigma^2 (m + 2 sqrt(m t) + 2 t)) <= e^{-t}`` (Hsu, Kakade,
  Zhang 2012, Thm. 1), and ``sum |z_i| <= sqrt(m) ||z||`` by Cauchy--Schwarz.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import logsumexp

__all__ = [
    "laplace_abs_sum_log_sf",
    "laplace_abs_sum_quantile",
    "gaussian_abs_sum_bound",
    "gaussian_abs_sum_t",
]


def laplace_abs_sum_log_sf(scale: float, m: int, s: float) -> float:
    """``log P(sum_{i<=m} |Z_i| > s)`` for ``m`` independent discrete Laplace(``scale``) draws.

    Exact: the mixture over the number ``K`` of nonzero draws (module notes), in log space so
    that tails far below ``1e-300`` keep their value.
    """
    from scipy import stats  # here, not at the top: importing scipy.stats costs 0.3 s of every start

    if m <= 0 or s < 0:
        return 0.0 if s < 0 else -math.inf
    p = math.exp(-1.0 / scale)
    k = np.arange(1, m + 1)  # K = 0 means S = 0 <= s: no contribution to the tail
    log_weight = stats.binom.logpmf(k, m, 2.0 * p / (1.0 + p))
    # S > s given K  <=>  NB(K, 1 - p) > floor(s) - K failures
    log_tail = stats.nbinom.logsf(math.floor(s) - k, k, 1.0 - p)
    return float(logsumexp(log_weight + log_tail))


def laplace_abs_sum_quantile(scale: float, m: int, t: float) -> int:
    """The smallest integer ``s`` with ``P(sum_{i<=m} |Z_i| > s) <= e^{-t}`` (discrete Laplace)."""
    lo, hi = 0, max(1, math.ceil(m * (scale * (t + math.log(m) + 1.0) + 1.0)))
    # hi: every |Z_i| <= 1 + scale (t + log m) except with probability e^{-t} (union bound)
    while laplace_abs_sum_log_sf(scale, m, hi) > -t:
        hi *= 2
    if laplace_abs_sum_log_sf(scale, m, lo) <= -t:
        return lo
    while hi - lo > 1:  # invariant: sf(lo) > e^{-t} >= sf(hi)
        mid = (lo + hi) // 2
        if laplace_abs_sum_log_sf(scale, m, mid) <= -t:
            hi = mid
        else:
            lo = mid
    return hi


def gaussian_abs_sum_bound(sigma: float, m: int, t: float) -> float:
    """``sigma sqrt(m (m + 2 sqrt(m t) + 2 t))``: ``sum |z_i|`` exceeds it with probability ``<= e^{-t}``."""
    return sigma * math.sqrt(m * (m + 2.0 * math.sqrt(m * t) + 2.0 * t))


def gaussian_abs_sum_t(sigma: float, m: int, amount: float) -> float:
    """The largest ``t`` certified by :func:`gaussian_abs_sum_bound` for ``amount`` (0 if none)."""
    a = amount**2 / (sigma**2 * m)  # = m + 2 sqrt(m t) + 2 t, solved for u = sqrt(t)
    if a <= m:
        return 0.0
    u = (math.sqrt(2.0 * a - m) - math.sqrt(m)) / 2.0
    return u * u
