"""The private side of DualQuery: its (ε, δ) guarantee and the query player.

DualQuery (Gaboardi, Gallego Arias, Hsu, Roth, Wu, ICML 2014) touches the data only through
the query player's distribution, so its privacy is that of ``s`` samples per round from that
distribution; how well the data player solves its integer programs does not enter.

The guarantee (derived here; see ``docs/pages/algorithms/dualquery.md`` for what the paper
states and the derivation). ``n`` records, neighbours differ in one record (``n`` public, as in
the paper), workload ``Q`` of counting queries with ``q(D) in [0, 1]`` (record fractions), so
``|q(D) - q(D')| <= 1/n``. In round ``t`` the query player samples ``s`` queries from

    Q_t(q) ∝ exp(η Σ_{i<t} (q(D) - q(x_i)))

(``x_i`` the data player's earlier records, functions of earlier samples only). Each
log-weight moves by at most ``η (t-1)/n`` between neighbours and the normaliser by at most the
same factor, so one sample of round ``t`` is ``ε_t = 2η(t-1)/n``-DP (exponential mechanism
argument, McSherry & Talwar 2007); round 1 is uniform (``ε_1 = 0``). The ``s(T-1)``
data-dependent samples are each at most ``ε_0 = 2η(T-1)/n``-DP; advanced composition
(Dwork, Rothblum, Vadhan 2010, Theorem III.3; Dwork & Roth 2014, Theorem 3.20) with slack δ
gives (ε, δ)-DP for

    ε = ε_0 sqrt(2 s(T-1) ln(1/δ)) + s(T-1) ε_0 (e^{ε_0} - 1),   ε_0 = 2η(T-1)/n.

This is the bound the paper's code release computes as ``epsilon_delta_b2`` and the one
Private-PGM's DualQuery example uses. :func:`dualquery_epsilon` evaluates it exactly (rounded
up) with :func:`dpopt.privacy.conversions.advanced_composition`; :func:`solve_rounds` and
:func:`solve_samples` invert it for ``T`` or ``s``.

The query player keeps the exact integer scores ``u_q = (t-1) c_q - n m_q`` (``c_q`` the count
of records satisfying ``q``, ``m_q`` the number of earlier synthetic records satisfying it),
so that ``Q_t(q) ∝ exp((η/n) u_q)`` exactly, and draws with
:func:`dpopt.privacy.exp_weights.sample_exp_weights` (exact, no floating-point weights).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from dpopt.errors import ParameterError, PrivacyParameterError
from dpopt.privacy.accountant import as_fraction
from dpopt.privacy.conversions import advanced_composition, validate_delta
from dpopt.privacy.exp_weights import exp_weights_probabilities, sample_exp_weights
from dpopt.privacy.randomness import RandomSource

__all__ = ["dualquery_epsilon", "per_sample_epsilon", "solve_rounds", "solve_samples", "QueryPlayer",
           "MAX_ROUNDS", "MAX_SAMPLES"]

#: Largest T and s the solvers search (a run beyond them is never practical).
MAX_ROUNDS = 10**6
MAX_SAMPLES = 10**9


def _positive_int(value, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ParameterError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _eta(eta) -> Fraction:
    try:
        q = as_fraction(eta, "eta")
    except PrivacyParameterError as exc:
        raise ParameterError(str(exc)) from None
    if q <= 0:
        raise ParameterError(f"eta must be > 0, got {eta!r}")
    return q


def per_sample_epsilon(eta, rounds: int, records: int) -> Fraction:
    """``ε_0 = 2η(T-1)/n``: the privacy of one sample of the last (most data-dependent) round."""
    return 2 * _eta(eta) * (_positive_int(rounds, "rounds") - 1) / _positive_int(records, "records")


def dualquery_epsilon(eta, rounds: int, samples: int, records: int, delta) -> Fraction:
    """ε of DualQuery's (ε, δ) guarantee for ``T = rounds``, ``s = samples``, ``n = records`` (module notes).

    Exact rational, rounded up; 0 for ``T = 1`` (the only round samples uniformly).
    """
    t = _positive_int(rounds, "rounds")
    s = _positive_int(samples, "samples")
    n = _positive_int(records, "records")
    dlt = validate_delta(delta, "delta")
    if t == 1:
        return Fraction(0)
    eps0 = 2 * _eta(eta) * (t - 1) / n
    return advanced_composition(eps0, 0, s * (t - 1), dlt)[0]


def _largest(fits, lo: int, cap: int) -> int:
    """Largest integer in ``[lo, cap]`` with ``fits`` true (``fits`` decreasing, ``fits(lo)`` true)."""
    hi = lo
    while hi < cap and fits(min(2 * hi, cap)):
        hi = min(2 * hi, cap)
    if hi == cap:
        return cap
    top = min(2 * hi, cap)  # fits(top) is false
    while top - hi > 1:
        mid = (hi + top) // 2
        if fits(mid):
            hi = mid
        else:
            top = mid
    return hi


def solve_rounds(epsilon, eta, samples: int, records: int, delta) -> int:
    """The largest ``T >= 2`` whose guarantee is within ``epsilon`` (ParameterError if even 2 is not)."""
    eps = as_fraction(epsilon, "epsilon")
    s, n = _positive_int(samples, "samples"), _positive_int(records, "records")
    if dualquery_epsilon(eta, 2, s, n, delta) > eps:
        raise ParameterError(f"even T = 2 rounds of s = {s} samples need epsilon = "
                             f"{float(dualquery_epsilon(eta, 2, s, n, delta)):.4g} > {float(eps):.4g} "
                             f"(eta = {eta}, n = {n}); lower samples or eta")
    return _largest(lambda t: dualquery_epsilon(eta, t, s, n, delta) <= eps, 2, MAX_ROUNDS)


def solve_samples(epsilon, eta, rounds: int, records: int, delta) -> int:
    """The largest ``s >= 1`` whose guarantee with ``T = rounds`` is within ``epsilon``."""
    eps = as_fraction(epsilon, "epsilon")
    t, n = _positive_int(rounds, "rounds", 2), _positive_int(records, "records")
    if dualquery_epsilon(eta, t, 1, n, delta) > eps:
        raise ParameterError(f"even s = 1 sample per round for T = {t} rounds needs epsilon = "
                             f"{float(dualquery_epsilon(eta, t, 1, n, delta)):.4g} > {float(eps):.4g} "
                             f"(eta = {eta}, n = {n}); lower rounds or eta")
    return _largest(lambda s: dualquery_epsilon(eta, t, s, n, delta) <= eps, 1, MAX_SAMPLES)


class QueryPlayer:
    """Multiplicative weights over a workload's rows, on exact integer scores (module notes).

    Parameters
    ----------
    counts : int array, shape (m,)
        ``c_q``: records satisfying each row (negated rows included). PRIVATE.
    records : int
        The public ``n`` (answers are ``c_q / n``).
    eta : number
        The learning rate η (exact rational).
    """

    def __init__(self, counts: np.ndarray, records: int, eta) -> None:
        self.counts = np.asarray(counts, dtype=np.int64)
        if self.counts.ndim != 1 or self.counts.size == 0:
            raise ParameterError("the query player needs a non-empty vector of counts")
        self.records = _positive_int(records, "records")
        self.eta = _eta(eta)
        self.satisfied = np.zeros(self.counts.size, dtype=np.int64)  # m_q
        self.updates = 0                                               # t - 1
        self.coef = self.eta / self.records

    @property
    def scores(self) -> np.ndarray:
        """``u_q = (t-1) c_q - n m_q``, so that ``Q_t(q) ∝ exp((η/n) u_q)``."""
        return self.updates * self.counts - self.records * self.satisfied

    def distribution(self) -> np.ndarray:
        """The current ``Q_t`` in floating point (for tests and diagnostics; sampling is exact)."""
        return exp_weights_probabilities(self.scores, self.coef)

    def sample(self, size: int, rng: RandomSource) -> np.ndarray:
        """``size`` i.i.d. rows from ``Q_t``, exactly."""
        return sample_exp_weights(self.scores, self.coef, size, rng)

    def update(self, satisfied: np.ndarray) -> None:
        """Multiplicative-weights step after the data player's record ``x_t``: the loss of row
        ``q`` is ``q(D) - q(x_t)`` (its weight grows when the record under-represents it)."""
        sat = np.asarray(satisfied, dtype=bool)
        if sat.shape != self.counts.shape:
            raise ParameterError(f"update needs one flag per row ({self.counts.size}), got {sat.shape}")
        self.satisfied += sat
        self.updates += 1
