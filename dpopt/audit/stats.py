"""Tests of significance of the audit: a one-sided lower bound on ε, and Fisher's exact test.

Both read the same four numbers: an event ``S`` was hit ``k_a`` times in ``n_a`` runs on one
dataset and ``k_b`` times in ``n_b`` runs on its neighbour. (ε, δ)-DP promises

    p_a = P[M(D_a) ∈ S]  ≤  e^ε · P[M(D_b) ∈ S] + δ  =  e^ε p_b + δ.

**Clopper–Pearson lower bound** (the estimator of DP-Sniper, Bichsel, Steffen, Bogunovic and
Vechev, S&P 2021, ``EpsEstimator``): with exact binomial bounds ``L_a <= p_a`` and
``U_b >= p_b``, each holding with probability ``1 - alpha/2``,

    ε  >=  ln((L_a - δ) / U_b)                         (the δ-thinned estimator)

holds with probability at least ``1 - alpha`` (union bound). For pure DP (δ = 0) it is the
DP-Sniper bound; with δ > 0 the probability ``L_a`` is *thinned* by the δ that (ε, δ)-DP lets
an event carry regardless of ε, so the bound never charges the mechanism for the δ it
declared.

**Fisher's exact test, StatDP style** (Ding, Wang, Wang, Zhang, Kifer, CCS 2018, Section 4):
under H0 (``p_a <= e^ε p_b``) keeping each of the ``k_a`` hits with probability ``e^-ε`` gives
a count ``B ~ Bin(n_a, p_a e^-ε)`` with ``p_a e^-ε <= p_b``, so the one-sided Fisher test of
``B`` against ``k_b`` is valid. StatDP averages the p-value over random draws of ``B``; here
the average is computed exactly (a sum over the binomial law of ``B``), so the p-value is a
number, not a random variable. With δ > 0 the count is first thinned by ``q``, the upper
``alpha_delta`` quantile of ``Bin(n_a, δ)`` (the hits the δ part can explain): writing
``p_a = p' + d`` with ``p' <= e^ε p_b`` and ``d <= δ``, ``k_a - q`` exceeds a ``Bin(n_a, p')``
count only when the δ hits exceed ``q``, so the p-value of the thinned count plus
``alpha_delta`` is a valid p-value.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special, stats

__all__ = ["clopper_pearson_lower", "clopper_pearson_upper", "epsilon_lower_bound", "fisher_pvalue",
           "delta_thinning", "POWER", "alternative", "detection_power", "detectable_excess", "runs_for_excess"]


def beta_quantile(q, a, b):
    """``stats.beta.ppf(q, a, b)``, the same numbers: for ``0 < q < 1`` and ``a, b > 0`` the beta
    quantile is by definition the inverse of the regularised incomplete beta function,
    ``scipy.special.betaincinv(a, b, q)`` (the public function; checked equal to ``beta.ppf`` bit
    for bit on 200,000 random arguments with scipy 1.17), without ``ppf``'s generic argument
    handling, which cost 0.2 ms a call and half of a top-down audit's event search (thousands of
    small calls); other arguments go through ``ppf``."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if np.ndim(q) == 0 and 0.0 < float(q) < 1.0 and bool(np.all(a > 0)) and bool(np.all(b > 0)):
        return special.betaincinv(a, b, np.float64(q))
    return stats.beta.ppf(q, a, b)


def clopper_pearson_lower(k, n, alpha):
    """Exact one-sided lower bound on a binomial probability: ``P(p < L) <= alpha``.

    Vectorised over ``k`` (and ``n``); 0 where ``k = 0``.
    """
    k = np.asarray(k, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        low = beta_quantile(alpha, np.maximum(k, 1), np.maximum(n - k + 1, 1))
    return np.where(k > 0, low, 0.0)


def clopper_pearson_upper(k, n, alpha):
    """Exact one-sided upper bound on a binomial probability: ``P(p > U) <= alpha``.

    Vectorised; 1 where ``k = n``.
    """
    k = np.asarray(k, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        up = beta_quantile(1.0 - alpha, np.minimum(k + 1, n), np.maximum(n - k, 1))
    return np.where(k < n, up, 1.0)


def epsilon_lower_bound(k_a, n_a, k_b, n_b, delta: float = 0.0, alpha: float = 0.05):
    """``max(0, ln((L_a - δ) / U_b))``: a lower bound on ε holding with probability ``1 - alpha``.

    ``L_a`` and ``U_b`` are Clopper–Pearson bounds at ``alpha / 2`` each (module notes).
    Vectorised over the counts; 0 where the thinned probability ``L_a - δ`` is not positive
    (the counts show nothing beyond the declared δ).
    """
    low = clopper_pearson_lower(k_a, n_a, alpha / 2) - float(delta)
    up = clopper_pearson_upper(k_b, n_b, alpha / 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        eps = np.where(low > 0, np.log(np.maximum(low, 1e-300) / up), 0.0)
    eps = np.maximum(eps, 0.0)
    return float(eps) if np.ndim(eps) == 0 else eps


def delta_thinning(n_a: int, delta: float, alpha_delta: float) -> int:
    """``q``: the upper ``alpha_delta`` quantile of ``Bin(n_a, δ)`` (0 when δ = 0)."""
    if delta <= 0:
        return 0
    return int(stats.binom.isf(alpha_delta, n_a, delta))


def fisher_pvalue(k_a: int, n_a: int, k_b: int, n_b: int, epsilon: float, delta: float = 0.0,
                  alpha_delta: float = 0.005) -> float:
    """p-value of H0 "``p_a <= e^ε p_b + δ``" from StatDP's thinned Fisher test (module notes).

    The average of the one-sided Fisher p-value over ``B ~ Bin(k_a', e^-ε)`` is summed exactly
    over the law of ``B`` (``k_a'`` the δ-thinned count); ``alpha_delta`` is added when δ > 0.
    """
    q = delta_thinning(n_a, delta, alpha_delta)
    kept = max(int(k_a) - q, 0)
    extra = alpha_delta if q or delta > 0 else 0.0
    if kept == 0:
        return 1.0
    keep = math.exp(-float(epsilon))
    # stats.binom's methods with the law's arguments, not a frozen law (1.3 ms to build, hundreds
    # of times in a power search)
    lo, hi = (int(v) for v in stats.binom.ppf([1e-12, 1 - 1e-12], kept, keep))
    b = np.arange(max(lo, 0), min(hi, kept) + 1)
    weights = stats.binom.pmf(b, kept, keep)
    # One-sided Fisher: P(X >= b), X hypergeometric: n_a draws from n_a + n_b runs of which b + k_b hit S.
    tail = stats.hypergeom.sf(b - 1, n_a + n_b, b + int(k_b), n_a)
    p = float(np.dot(weights, tail) / weights.sum())
    return min(1.0, p + extra)


# ---- power: what a test of this size could have detected -----------------------------------------
#: The detection probability the power statements are given at.
POWER = 0.95


def alternative(p_hi: float, epsilon: float, excess: float, delta: float = 0.0) -> float:
    """``p_lo`` of the alternative at ``epsilon + excess``: ``p_hi = e^{ε + excess} p_lo + δ``.

    The power calculation keeps the favoured dataset's probability of the event at its observed
    frequency ``p_hi`` and lowers the other's to what a privacy loss of ``ε + excess`` on this
    event allows (module notes of the power section: :func:`detection_power`).
    """
    return max(p_hi - delta, 0.0) * math.exp(-(epsilon + excess))


def detection_power(p_hi: float, n_hi: int, n_lo: int, epsilon: float, excess: float, delta: float = 0.0,
                    alpha: float = 0.05) -> float:
    """Probability that the test flags the claim ``epsilon`` when the truth is ``epsilon + excess``.

    The test flags when its Clopper–Pearson lower bound exceeds the claim,
    ``L(K_hi) - δ > e^ε U(K_lo)`` (:func:`epsilon_lower_bound`), with ``K_hi ~ Bin(n_hi, p_hi)``
    and ``K_lo ~ Bin(n_lo, p_lo)`` independent, ``p_lo`` from :func:`alternative`. Exact: ``L``
    increases with ``K_hi``, so for each ``k_lo`` the flagging counts are ``K_hi >= k*(k_lo)``
    and the power is ``Σ P(K_lo = k_lo) P(K_hi >= k*(k_lo))`` (binomial laws truncated at
    ``1e-12`` in each tail).
    """
    if p_hi <= 0 or n_hi < 1 or n_lo < 1:
        return 0.0
    p_lo = alternative(p_hi, epsilon, excess, delta)
    n_lo, n_hi, p_top = int(n_lo), int(n_hi), min(p_hi, 1.0)  # the laws' arguments (unfrozen, as in fisher_pvalue)
    k_lo = np.arange(int(stats.binom.ppf(1e-12, n_lo, p_lo)), int(stats.binom.isf(1e-12, n_lo, p_lo)) + 2)
    k_lo = k_lo[(k_lo >= 0) & (k_lo <= n_lo)]
    need = float(delta) + math.exp(epsilon) * clopper_pearson_upper(k_lo, n_lo, alpha / 2)
    k_hi = np.arange(max(int(stats.binom.ppf(1e-12, n_hi, p_top)) - 1, 0), n_hi + 1)
    lower = clopper_pearson_lower(k_hi, n_hi, alpha / 2)
    first = np.searchsorted(lower, need, side="right")  # the first k_hi whose bound exceeds the need
    tail = stats.binom.sf(k_hi[np.minimum(first, k_hi.size - 1)] - 1, n_hi, p_top)
    flag = np.where(first < k_hi.size, tail, 0.0)
    return float(np.clip(np.dot(stats.binom.pmf(k_lo, n_lo, p_lo), flag), 0.0, 1.0))


def detectable_excess(p_hi: float, n_hi: int, n_lo: int, epsilon: float, delta: float = 0.0,
                      alpha: float = 0.05, power: float = POWER) -> float:
    """The smallest excess over ``epsilon`` this test detects with probability ``power`` (inf: none).

    Bisection on :func:`detection_power`, which grows with the excess (the other dataset's
    probability shrinks); ``inf`` when even a zero probability under the other dataset would
    not be flagged that often (too few runs, or an event too rare).
    """
    if p_hi <= 0:
        return math.inf
    top = max(math.log(max(p_hi, 1e-300) * n_lo * 1e9), 1.0)  # p_lo * n_lo < 1e-9 beyond this excess
    if detection_power(p_hi, n_hi, n_lo, epsilon, top, delta, alpha) < power:
        return math.inf
    lo, hi = 0.0, top
    if detection_power(p_hi, n_hi, n_lo, epsilon, 0.0, delta, alpha) >= power:
        return 0.0
    while hi - lo > 1e-3 * max(1.0, epsilon):
        mid = 0.5 * (lo + hi)
        if detection_power(p_hi, n_hi, n_lo, epsilon, mid, delta, alpha) >= power:
            hi = mid
        else:
            lo = mid
    return hi


def runs_for_excess(p_hi: float, epsilon: float, excess: float, delta: float = 0.0, alpha: float = 0.05,
                    power: float = POWER, max_runs: int = 10**7) -> int | None:
    """The fewest test runs per dataset at which :func:`detection_power` reaches ``power`` for
    ``excess`` (None: not within ``max_runs``). Doubling, then bisection (the power grows with
    the runs, up to the binomial laws' discreteness)."""
    if p_hi <= 0:
        return None

    def enough(n: int) -> bool:
        return detection_power(p_hi, n, n, epsilon, excess, delta, alpha) >= power

    n = 16
    while not enough(n):
        if n >= max_runs:
            return None
        n = min(2 * n, max_runs)
    lo = n // 2
    while n - lo > max(1, n // 100):
        mid = (lo + n) // 2
        if enough(mid):
            n = mid
        else:
            lo = mid
    return n
