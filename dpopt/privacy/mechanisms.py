"""Mechanisms: a query's true answers plus exact noise, charged to an accountant first.

Each mechanism derives its noise scale from the query's sensitivity (computed from the
operator, never taken on trust) and the budget it is given, charges that budget to the
:class:`~dpopt.privacy.accountant.Accountant` *before* any random draw, and returns a
:class:`~dpopt.model.measurement.Measurement`.

Integer-valued queries (counts, unnormalised parities) get integer noise directly.
Real-valued queries are first rounded to a public power-of-two grid ``g``; rounding moves
each answer by at most ``g/2``, so the grid adds at most ``g`` per row to the sensitivity,
and the noise is drawn in grid units (Mironov 2012 shows why floating-point Laplace
noise must not be used).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence

import numpy as np

from dpopt.errors import PrivacyParameterError, QueryError
from dpopt.model.data import Dataset
from dpopt.model.measurement import Measurement
from dpopt.model.queries.base import LinearQuery
from dpopt.privacy.accountant import Accountant, PrivacyCost, as_fraction
from dpopt.privacy.conversions import approx_dp_to_zcdp
from dpopt.privacy.randomness import RandomSource, make_random
from dpopt.privacy.samplers import (
    bernoulli_exp,
    discrete_gaussian,
    discrete_gaussian_variance,
    discrete_laplace,
    discrete_laplace_variance,
)

#: Grid resolution relative to the sensitivity for real-valued answers: the grid adds at
#: most this fraction of the sensitivity to it.
GRID_RELATIVE = 2.0**-20


@dataclass(frozen=True)
class NoiseLaw:
    """The noise a query gets for a cost, known before any data is read.

    Attributes
    ----------
    mechanism : {"laplace", "gaussian"}
    family : {"discrete_laplace", "discrete_gaussian"}
        The exact law drawn (see :mod:`dpopt.privacy.samplers`).
    parameter : Fraction
        The sampler's parameter in grid units: the Laplace scale, or the Gaussian ``sigma^2``.
    grid : Fraction
        The public grid the answers are rounded to first (1 for integer queries).
    sensitivity : Fraction
        L1 sensitivity (Laplace) or squared L2 sensitivity (Gaussian) of the gridded answers.
    scale : float
        Laplace scale ``b`` or Gaussian ``sigma``, in the units of the query.
    variance : float
        Exact variance of the discrete law on each answer, in the units of the query.
    cost : PrivacyCost
        What a draw from this law is charged.
    """

    mechanism: str
    family: str
    parameter: Fraction
    grid: Fraction
    sensitivity: Fraction
    scale: float
    variance: float
    cost: PrivacyCost

    @property
    def stddev(self) -> float:
        return math.sqrt(self.variance)

    def describe(self) -> str:
        kind = "L1" if self.mechanism == "laplace" else "squared L2"
        return f"{self.family.replace('_', ' ')}, {kind} sensitivity {float(self.sensitivity):g}"


def calibrate(query: LinearQuery, cost: PrivacyCost, mechanism: str | None = None) -> NoiseLaw:
    """The noise law of ``query`` measured at ``cost``, derived from its sensitivity. Reads no data.

    The same function serves the plan preview (``dpopt check``) and the draw
    (:func:`measure`), so the two cannot disagree.

    Parameters
    ----------
    query : LinearQuery
    cost : PrivacyCost
        The budget this measurement may spend, e.g. a share from
        :meth:`dpopt.privacy.budget.Budget.shares`: pure ``epsilon``; ``(epsilon, delta)``;
        or ``rho``.
    mechanism : {"laplace", "gaussian"}, optional
        Default: Laplace for a pure cost, the discrete Gaussian otherwise.

    Notes
    -----
    Laplace: scale ``b = Delta_1 / epsilon`` (Dwork, McSherry, Nissim, Smith 2006); the discrete
    law is epsilon-DP on integer answers (Canonne, Kamath, Steinke 2020). It is charged its
    epsilon only: under (epsilon, delta) accounting the cost's delta stays unspent (the release
    is then more private than declared, and the report says so).
    Gaussian: ``sigma^2 = Delta_2^2 / (2 rho)`` is rho-zCDP (CKS 2020, Theorem 14); from
    ``(epsilon, delta)``, rho is the largest value whose conversion stays within epsilon at
    delta (:func:`~dpopt.privacy.conversions.approx_dp_to_zcdp`).
    """
    if not isinstance(cost, PrivacyCost):
        raise PrivacyParameterError(f"cost must be a PrivacyCost, got {type(cost).__name__}")
    if mechanism is None:
        mechanism = "laplace" if cost.rho is None and cost.delta == 0 else "gaussian"
    if mechanism == "laplace":
        if cost.epsilon <= 0:
            raise PrivacyParameterError(f"{query.name}: the Laplace mechanism needs epsilon > 0; this cost states "
                                        f"{cost} (a Laplace measurement cannot spend an exact share of rho)")
        grid, sensitivity = _grid_and_sensitivity(query, p=1)
        scale_units = sensitivity / (cost.epsilon * grid)  # scale in grid units, exact rational
        charged = PrivacyCost.pure(cost.epsilon)
        return NoiseLaw("laplace", "discrete_laplace", scale_units, grid, sensitivity, float(scale_units * grid),
                        discrete_laplace_variance(scale_units) * float(grid) ** 2, charged)
    if mechanism != "gaussian":
        raise PrivacyParameterError(f"mechanism must be 'laplace' or 'gaussian', got {mechanism!r}")
    if cost.rho is not None and cost.rho > 0:
        rho, charged = cost.rho, cost
    elif cost.epsilon > 0 and 0 < cost.delta < 1:
        rho = approx_dp_to_zcdp(cost.epsilon, cost.delta)
        charged = PrivacyCost(epsilon=cost.epsilon, delta=cost.delta, rho=rho)
    else:
        raise PrivacyParameterError(f"{query.name}: the Gaussian mechanism needs rho > 0, or epsilon > 0 and "
                                    f"0 < delta < 1; this cost states {cost}")
    grid, sens_sq = _grid_and_sensitivity(query, p=2)
    sigma2_units = sens_sq / (2 * rho * grid * grid)
    return NoiseLaw("gaussian", "discrete_gaussian", sigma2_units, grid, sens_sq,
                    math.sqrt(float(sigma2_units)) * float(grid),
                    discrete_gaussian_variance(sigma2_units) * float(grid) ** 2, charged)


def measure(
    query: LinearQuery,
    data: Dataset,
    law: NoiseLaw,
    accountant: Accountant,
    rng: RandomSource | None = None,
    *,
    label: str | None = None,
    answers: np.ndarray | None = None,
) -> Measurement:
    """Answer ``query`` on ``data`` with noise of law ``law`` (from :func:`calibrate`).

    The accountant is charged ``law.cost`` before any draw; the answers are rounded to the
    law's public grid and integer noise is added in grid units (Mironov 2012 shows why
    floating-point noise must not be used).
    """
    label = label or f"{law.mechanism}:{query.name}"
    true = _true_answers(query, data, answers)
    accountant.charge(law.cost, label, detail=law.describe())
    rng = rng or make_random()
    sampler = discrete_laplace if law.family == "discrete_laplace" else discrete_gaussian
    g = float(law.grid)
    noise = sampler(law.parameter, true.shape[0], rng)
    values = (np.round(true / g) + noise) * g
    if law.mechanism == "laplace":
        info = {"mechanism": "laplace", "sensitivity_l1": float(law.sensitivity), "epsilon": str(law.cost.epsilon)}
    else:
        rho = law.cost.rho
        info = {"mechanism": "gaussian", "sensitivity_l2_squared": float(law.sensitivity), "rho": str(rho)}
    return Measurement(query, values, law.family, law.scale, law.variance, law.cost, label,
                       {**info, "grid": g, "random": rng.description})


def laplace_mechanism(
    query: LinearQuery,
    data: Dataset,
    epsilon,
    accountant: Accountant,
    rng: RandomSource | None = None,
    *,
    label: str | None = None,
    answers: np.ndarray | None = None,
) -> Measurement:
    """Answer ``query`` with discrete Laplace noise under pure ``epsilon``-DP.

    ``calibrate(query, PrivacyCost.pure(epsilon), "laplace")`` then :func:`measure`: scale
    ``b = Delta_1 / epsilon`` with ``Delta_1`` the query's L1 sensitivity (Dwork, McSherry,
    Nissim, Smith 2006), charged ``epsilon`` before any draw.

    Parameters
    ----------
    query, data
        What to answer and on which records.
    epsilon : number
        The budget of this measurement (exact rational; 0.1 means 1/10).
    accountant
        Charged ``PrivacyCost.pure(epsilon)`` before any draw.
    rng
        Random source; default a fresh cryptographically secure one.
    answers
        Precomputed true answers (e.g. from one pass over a marginal); must equal
        ``query.answer(data)``.
    """
    law = calibrate(query, PrivacyCost.pure(_positive(epsilon, "epsilon")), "laplace")
    return measure(query, data, law, accountant, rng, label=label or f"laplace:{query.name}", answers=answers)


def gaussian_mechanism(
    query: LinearQuery,
    data: Dataset,
    accountant: Accountant,
    rng: RandomSource | None = None,
    *,
    rho=None,
    epsilon=None,
    delta=None,
    label: str | None = None,
    answers: np.ndarray | None = None,
) -> Measurement:
    """Answer ``query`` with discrete Gaussian noise (Canonne, Kamath, Steinke 2020).

    With ``rho`` given, ``sigma^2 = Delta_2^2 / (2 rho)`` and the mechanism is rho-zCDP
    (CKS 2020, Theorem 14). With ``(epsilon, delta)`` instead, ``rho`` is the largest value
    whose zCDP-to-(epsilon, delta) conversion stays within ``epsilon`` at ``delta``; the
    charge then carries both. Real-valued queries go on a public grid first (see module
    notes), which is how a "continuous" Gaussian is offered.
    """
    if rho is not None:
        if epsilon is not None or delta is not None:
            raise PrivacyParameterError("give either rho or (epsilon, delta) to the Gaussian mechanism, not both")
        cost = PrivacyCost.zcdp(_positive(rho, "rho"))
    else:
        if epsilon is None or delta is None:
            raise PrivacyParameterError("the Gaussian mechanism needs rho, or both epsilon and delta")
        cost = PrivacyCost.approx(_positive(epsilon, "epsilon"), _unit_interval(delta, "delta"))
    law = calibrate(query, cost, "gaussian")
    return measure(query, data, law, accountant, rng, label=label or f"gaussian:{query.name}", answers=answers)


def exponential_mechanism(
    scores: Sequence[float] | np.ndarray,
    epsilon,
    accountant: Accountant,
    rng: RandomSource | None = None,
    *,
    sensitivity: float = 1.0,
    label: str = "exponential",
) -> int:
    """Pick index ``i`` with probability proportional to ``exp(epsilon * u_i / (2 Delta))``.

    McSherry and Talwar 2007. Sampling is exact: scores are floored to a public
    power-of-two grid ``h`` (at most ``Delta * 2^-20``), which adds ``h`` to the
    sensitivity, so each exponent ``gamma_i = epsilon (q_max - q_i) / (2 (Delta + h))``
    is rational; a uniformly proposed candidate is then accepted with exact probability
    ``exp(-gamma_i)`` (rejection sampling, vectorised in batches). Scores in the millions
    are fine: only differences to the best score enter.
    """
    u, delta_u, h = _scores_on_grid(scores, sensitivity, "the exponential mechanism")
    eps = _positive(epsilon, "epsilon")
    steps = _grid_steps(u, h)  # (q_max - q_i) / h on the grid, exact integers
    # gamma_i = eps * steps_i * h / (2 (Delta + h)) = steps_i * coef, coef exact rational
    coef = eps * h / (2 * (delta_u + h))
    accountant.charge(PrivacyCost.pure(eps), label, detail=f"exponential mechanism over {u.size} candidates")
    rng = rng or make_random()
    return int(_exact_exponential_draw(steps, coef, rng))


def report_noisy_max(
    scores: Sequence[float] | np.ndarray,
    epsilon,
    accountant: Accountant,
    rng: RandomSource | None = None,
    *,
    sensitivity: float = 1.0,
    monotone: bool = False,
    label: str = "report_noisy_max",
) -> int:
    """Index of the largest score after discrete Laplace noise of scale ``2 Delta / epsilon``.

    Dwork and Roth 2014, Claim 3.9 (scale ``Delta / epsilon`` when every score moves in the
    same direction between neighbours, ``monotone=True``). Scores are floored to a public
    grid as in :func:`exponential_mechanism`; ties go to the lowest index.
    """
    u, delta_u, h = _scores_on_grid(scores, sensitivity, "report-noisy-max")
    eps = _positive(epsilon, "epsilon")
    # Minus the steps below the best score on the grid (exact integers, as the exponential
    # mechanism's): a float cast of scores 1e14 apart wrapped int64 round and chose at random.
    steps = -_grid_steps(u, h)
    scale_units = (1 if monotone else 2) * (delta_u + h) / (eps * h)
    accountant.charge(PrivacyCost.pure(eps), label, detail=f"report noisy max over {u.size} candidates")
    rng = rng or make_random()
    noisy = steps + discrete_laplace(scale_units, u.size, rng)
    return int(np.argmax(noisy))


# ---- helpers ------------------------------------------------------------------------
def _scores_on_grid(scores, sensitivity, who: str) -> tuple[np.ndarray, Fraction, Fraction]:
    """Validated scores, their sensitivity, and the public power-of-two grid ``h`` they go on."""
    u = np.asarray(scores, dtype=np.float64).ravel()
    if u.size == 0:
        raise QueryError(f"{who} needs at least one candidate")
    if not np.isfinite(u).all():
        raise QueryError(f"{who}: scores must be finite")
    delta_u = _positive(sensitivity, "sensitivity")
    return u, delta_u, Fraction(2) ** math.floor(math.log2(float(delta_u) * GRID_RELATIVE))


def _grid_steps(u: np.ndarray, h: Fraction) -> np.ndarray:
    """``floor(q_max / h) - floor(q_i / h)``: each score floored to the grid ``h`` (a power of two),
    then differenced exactly. int64 when every value fits, else Python integers (object array):
    scores spread over more than ``2^62 h`` (e.g. ``1e14`` at ``h = 2^-20``) must not wrap around."""
    scaled = u / float(h)  # a power-of-two scaling: exact unless it overflows
    if np.isfinite(scaled).all() and np.abs(scaled).max() < 2.0**61:
        floors = np.floor(scaled).astype(np.int64)
        return floors.max() - floors
    floors = np.array([math.floor(Fraction(float(x)) / h) for x in u], dtype=object)  # rare: exact big integers
    return floors.max() - floors


def _exact_exponential_draw(steps: np.ndarray, coef: Fraction, rng: RandomSource) -> int:
    """Propose uniformly, accept with probability exp(-steps_i * coef); batches of proposals.

    ``steps_i * coef.numerator`` and ``coef.denominator`` stay in int64 while they fit; beyond
    ``2^62`` (a huge score spread, or an epsilon such as ``Fraction(1, 2**64)``) both become
    Python integers, which :func:`~dpopt.privacy.samplers.bernoulli_exp` takes exactly."""
    n = steps.size
    big = _overflows(steps, coef)
    num = np.asarray(steps, dtype=object) * coef.numerator if big else steps * coef.numerator
    den = coef.denominator
    batch = max(64, min(1 << 16, n))
    dens = np.full(batch, den, dtype=object if big else np.int64)
    while True:
        idx = rng.uniform_below(n, batch)
        accept = bernoulli_exp(num[idx], dens, rng)
        hits = np.flatnonzero(accept)
        if hits.size:
            return int(idx[hits[0]])


def _overflows(steps: np.ndarray, coef: Fraction) -> bool:
    return (steps.dtype == object or int(steps.max(initial=0)) * coef.numerator >= 2**62
            or coef.denominator >= 2**62)


def _true_answers(query: LinearQuery, data: Dataset, answers) -> np.ndarray:
    if data.domain != query.domain:
        raise QueryError(f"{query.name}: the data's domain {data.domain} differs from the query's {query.domain}")
    true = query.answer(data) if answers is None else np.asarray(answers, dtype=np.float64)
    if true.shape != (query.num_rows,):
        raise QueryError(f"{query.name}: {true.shape} precomputed answers for {query.num_rows} rows")
    return np.asarray(true, dtype=np.float64)


def _grid_and_sensitivity(query: LinearQuery, p: int) -> tuple[Fraction, Fraction]:
    """Grid ``g`` and the sensitivity of the gridded answers (L1, or squared L2 for p=2).

    Integer queries have ``g = 1`` and their own sensitivity. Otherwise rounding each of
    the ``m`` answers to the grid moves it by at most ``g/2`` on each neighbour, hence by
    at most ``g`` between them: L1 grows by ``m g``; the L2 norm by ``sqrt(m) g``.
    """
    if p == 1:
        base = Fraction(query.sensitivity(1))
    else:
        base = Fraction(query.squared_l2_sensitivity())
    if base <= 0:
        raise QueryError(f"{query.name}: zero sensitivity, nothing to protect (is the query empty?)")
    if query.is_integer:
        return Fraction(1), base
    m = query.num_rows
    if p == 1:
        grid = Fraction(2) ** math.floor(math.log2(float(base) * GRID_RELATIVE / m))
        return grid, base + m * grid
    l2 = math.sqrt(float(base))
    grid = Fraction(2) ** math.floor(math.log2(l2 * GRID_RELATIVE / math.sqrt(m)))
    # (sqrt(base) + sqrt(m) g)^2, bounded above by an exact rational.
    bound = Fraction(l2 + math.sqrt(m) * float(grid)) * (1 + Fraction(1, 10**9))
    return grid, bound * bound


def _positive(value, name: str) -> Fraction:
    frac = as_fraction(value, name)
    if frac <= 0:
        raise PrivacyParameterError(f"{name} must be positive, got {value!r}")
    return frac


def _unit_interval(value, name: str) -> Fraction:
    frac = as_fraction(value, name)
    if not 0 < frac < 1:
        raise PrivacyParameterError(f"{name} must be in (0, 1), got {value!r}")
    return frac
