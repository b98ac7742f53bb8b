"""Fourier release with consistency (Barak, Chaudhuri, Dwork, Kale, McSherry, Talwar, PODS 2007).

A plan of three steps over the shared model (design notes §2)::

    plan = fourier_plan(domain, marginals)                 # B = downward closure; public
    m = measure_fourier(plan, data, accountant)             # noisy parities of B, in integers
    release = fourier_consistency(plan, m, method="linf")   # consistent marginals

or all at once with :func:`barak_release`.

**Measurement** (Barak et al. §4, Eq. 6). The unnormalised parities
``u_alpha = sum_beta (-1)^<alpha,beta> x_beta = 2^{k/2} <f^alpha, x>`` of the integer table
are integers; every column of the ``|B|`` rows has L1 norm ``|B|`` (and squared L2 norm
``|B|``), so discrete Laplace noise of scale ``|B| / eps``, derived by
:func:`~dpopt.privacy.mechanisms.laplace_mechanism` from the query, is eps-DP. In the
orthonormal basis this is the paper's ``Lap(|B| / (eps 2^{k/2}))``. Under zCDP or
(eps, delta) the noise is discrete Gaussian with ``sigma^2 = |B| / (2 rho)``.

**Consistency** (``method``):

* ``"linf"`` — the paper's LP: minimise ``b`` subject to ``w >= 0`` and
  ``|phi_alpha - <f^alpha, w>| <= b`` for ``alpha`` in ``B``, solved by
  :func:`dpopt.estimate.reconstruct` (column generation over cells on large domains), then
  rounded to integers;
* ``"l1"``, ``"l2"`` — least absolute / weighted least-squares deviations, same constraints;
* ``"entropy"`` — the maximum-entropy table among the best least-squares fits of the
  coefficients (exact, :mod:`dpopt.estimate.engines.max_entropy`); with
  ``engine_options={"max_passes": ...}`` multiplicative weights from all coefficients, the
  "modified Barak" baseline of Hardt, Ligett, McSherry (NIPS 2012, §3);
* ``"shift"`` — no optimisation (Barak et al. Theorem 6 / Corollary 1): add
  ``t |B|^2 / (eps 2^{k/2})`` to the zeroth normalised coefficient, i.e. ``t * |B| * b``
  with ``b = |B| / eps`` the Laplace scale of the unnormalised coefficients, and read the
  marginals straight off the coefficients (Theorem 3). The table with these coefficients is
  ``x + 2^{-k} (sum_alpha z_alpha chi_alpha + shift)``, non-negative whenever
  ``sum_alpha |z_alpha| <= shift``; so every released marginal is non-negative with at least
  that event's probability, which the report gives exactly (:func:`shift_probability`).
  It is *not* always ``1 - e^{-t}``: ``sum |z_alpha|`` has mean ``|B| b``, so at ``t = 1``
  the paper's shift certifies only about 1/2 (0.53 for ``|B| = 22``, eps = 1), while for ``t >= 2``
  it certifies far more than ``1 - e^{-t}``. ``shift_calibration="exact"`` instead takes
  the ``1 - e^{-t}`` quantile of ``sum |z_alpha|``, the smallest shift this argument
  allows. For Gaussian noise the shift is ``sigma sqrt(|B| (|B| + 2 sqrt(|B| t) + 2 t))``:
  by Cauchy--Schwarz ``sum |z_alpha| <= sqrt(|B|) ||z||``, the discrete Gaussian is
  sigma-sub-Gaussian (Canonne, Kamath, Steinke 2020) and the chi-square tail of a
  sub-Gaussian vector (Hsu, Kakade, Zhang 2012, Thm. 1) bounds the excess by ``e^{-t}``.

Non-binary attributes are binary-encoded (Barak et al. §6); the unused codes are declared
structural zeros, so the optimising methods never put mass on them.

**Report** (:class:`BarakRelease`): the released table and marginals, the Theorem 5 bound
``2^{|alpha|} 2|B| log(|B|/delta) / eps + |B|`` on ``||C^alpha x - C^alpha w'||_1`` (with
probability ``1 - delta``) for each requested marginal next to the achieved error when the
true data are given, the LP's status and size, and the privacy ledger.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from itertools import combinations
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from dpopt.algorithms.base import Algorithm, AlgorithmParams, PlannedMeasure
from dpopt.algorithms.base import Release, check_marginals, make_release, register
from dpopt.errors import DataError, DpoptError, ParameterError, PrivacyParameterError, QueryError, SolverError, at_key
from dpopt.estimate.status import Status
from dpopt.model.constraints import ConstraintSet, Integrality, NonNegativity, StructuralZeros
from dpopt.model.data import Dataset, cells_frame
from dpopt.model.domain import Domain
from dpopt.model.measurement import Measurement
from dpopt.model.queries import marginalize
from dpopt.model.queries.binary import BinaryEncoding, binary_encoding
from dpopt.model.queries.fourier import FourierParity, downward_closure, marginal_from_fourier
from dpopt.privacy.accountant import Accountant, PrivacyCost
from dpopt.privacy.budget import Budget
from dpopt.privacy.mechanisms import calibrate, measure
from dpopt.privacy.noise_tails import (
    gaussian_abs_sum_bound,
    gaussian_abs_sum_t,
    laplace_abs_sum_log_sf,
    laplace_abs_sum_quantile,
)
from dpopt.privacy.randomness import RandomSource, make_random
from dpopt.spec.model import ReconstructSpec

__all__ = [
    "Barak", "BarakParams", "METHODS", "FourierPlan", "BarakRelease", "fourier_plan", "measure_fourier",
    "fourier_consistency", "barak_release", "theorem5_bound", "shift_amount", "shift_probability",
]

#: Consistency methods: the engines' objectives plus the Theorem 6 shift.
METHODS = ("linf", "l1", "l2", "entropy", "shift")
#: How the shift is sized: the paper's ``t |B| b``, or the exact ``1 - e^{-t}`` quantile of ``sum |z|``.
SHIFT_CALIBRATIONS = ("paper", "exact")


# ---- plan ---------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class FourierPlan:
    """The public part of a Fourier release: which parities to measure.

    Attributes
    ----------
    source : Domain
        The domain of the data and of the released marginals.
    domain : Domain
        The binary domain the parities live on (``source`` itself when already binary).
    encoding : BinaryEncoding or None
        The binary encoding, None when ``source`` is binary.
    marginals : tuple of tuple of str
        The requested marginals, attributes in ``source`` order.
    bits : dict of str to tuple of str
        The binary attributes of each source attribute.
    query : FourierParity
        The unnormalised parities of the downward closure ``B`` (``query.subsets``).
    """

    source: Domain
    domain: Domain
    encoding: BinaryEncoding | None
    marginals: tuple[tuple[str, ...], ...]
    bits: dict
    query: FourierParity

    @property
    def closure_size(self) -> int:
        """``|B|``."""
        return self.query.num_rows

    def marginal_bits(self, attrs: Sequence[str]) -> tuple[str, ...]:
        """The binary attributes of a source marginal, in binary-domain order."""
        return tuple(b for a in self.source.canonical(attrs) for b in self.bits[a])

    def unused_code_zeros(self) -> list[StructuralZeros]:
        """One structural-zero rule per attribute with unused binary codes (Barak et al. §6)."""
        return [] if self.encoding is None else self.encoding.unused_code_zeros()


def fourier_plan(domain: Domain, marginals: Iterable[Sequence[str]] | int) -> FourierPlan:
    """The parities a Fourier release of ``marginals`` must measure: the downward closure ``B``.

    Parameters
    ----------
    domain : Domain
        Any attributes; non-binary ones are binary-encoded.
    marginals : iterable of attribute-name sequences, or int
        The requested marginals ``A``; an int ``k`` means every ``k``-way marginal.

    Returns
    -------
    FourierPlan
    """
    if not isinstance(domain, Domain):
        raise QueryError(f"fourier_plan: domain must be a Domain, got {type(domain).__name__}")
    if isinstance(marginals, (int, np.integer)) and not isinstance(marginals, bool):
        k = int(marginals)
        if not 1 <= k <= len(domain):
            raise QueryError(f"fourier_plan: marginals = {k} must be between 1 and {len(domain)} attributes")
        marginals = list(combinations(domain.attrs, k))
    if isinstance(marginals, str):
        raise QueryError(f"fourier_plan: marginals must be a list of attribute lists, got {marginals!r}")
    requested: list[tuple[str, ...]] = []
    for i, attrs in enumerate(marginals):
        attrs = (attrs,) if isinstance(attrs, str) else tuple(attrs)
        if not attrs:
            raise QueryError(f"fourier_plan: marginals[{i}] is empty")
        try:
            canon = domain.canonical(attrs)
        except Exception as exc:  # DomainError names the unknown attribute
            raise QueryError(f"fourier_plan: marginals[{i}] {attrs!r}: {exc}") from None
        if canon not in requested:
            requested.append(canon)
    if not requested:
        raise QueryError("fourier_plan: marginals is empty")
    if all(s == 2 for s in domain.sizes):
        encoding, binary = None, domain
        bits = {a: (a,) for a in domain.attrs}
    else:
        encoding = binary_encoding(domain)
        binary, bits = encoding.domain, dict(encoding.bits)
    plan_bits = [tuple(b for a in m for b in bits[a]) for m in requested]
    closure = downward_closure(plan_bits, binary)
    query = FourierParity(binary, closure, normalized=False)
    return FourierPlan(domain, binary, encoding, tuple(requested), bits, query)


# ---- measurement ---------------------------------------------------------------------------------
def binary_data(plan: FourierPlan, data: Dataset) -> Dataset:
    """The records of ``data`` over the plan's binary domain."""
    if not isinstance(data, Dataset):
        raise DataError(f"data must be a Dataset, got {type(data).__name__}")
    if data.domain != plan.source:
        raise DataError(f"data: its domain {data.domain} differs from the plan's {plan.source}")
    if plan.encoding is None:
        return data
    return Dataset(plan.encoding.encode_codes(data.codes), plan.domain, data.weights)


def measure_fourier(
    plan: FourierPlan,
    data: Dataset,
    accountant: Accountant,
    rng: RandomSource | None = None,
    *,
    cost: PrivacyCost | None = None,
    label: str = "fourier",
) -> Measurement:
    """Measure the parities of ``B`` on ``data`` with exact noise (Barak et al. §4).

    ``cost`` (default: all that remains of ``accountant``) buys the noise
    :func:`~dpopt.privacy.mechanisms.calibrate` derives: discrete Laplace of scale
    ``|B| / epsilon`` (the query's L1 sensitivity) for a pure cost, the discrete Gaussian with
    ``sigma^2 = |B| / (2 rho)`` under zCDP or (epsilon, delta). Charged before any draw.
    """
    bdata = binary_data(plan, data)
    law = calibrate(plan.query, accountant.remaining if cost is None else cost)
    return measure(plan.query, bdata, law, accountant, rng, label=label)


# ---- bounds -------------------------------------------------------------------------------------
def theorem5_bound(order: int, closure_size: int, epsilon: float, delta: float) -> float:
    """Barak et al. Theorem 5: ``2^{|alpha|} 2|B| log(|B|/delta) / eps + |B|``.

    With probability ``1 - delta`` the L1 error of a released marginal over ``|alpha|``
    binary attributes is at most this.
    """
    if not 0 < delta < 1:
        raise PrivacyParameterError(f"theorem5_bound: delta must be in (0, 1), got {delta!r}")
    if epsilon <= 0:
        raise PrivacyParameterError(f"theorem5_bound: epsilon must be positive, got {epsilon!r}")
    b = closure_size
    return 2.0**order * 2.0 * b * math.log(b / delta) / epsilon + b


def shift_amount(measurement: Measurement, t: float, calibration: str = "paper") -> float:
    """The Theorem 6 shift of the zeroth unnormalised coefficient.

    ``calibration="paper"``: Laplace ``t * Delta_1 * b`` with ``Delta_1 = |B|`` the query's
    L1 sensitivity and ``b = |B| / eps`` the noise scale, i.e. ``t |B|^2 / eps`` (the paper's
    ``t |B|^2 / (eps 2^{k/2})`` in the normalised basis). It certifies non-negativity with
    probability :func:`shift_probability`. That was at least ``1 - e^{-t}`` for ``t >= 2`` in
    every case computed (``|B|`` from 2 to 1,351, scales 0.3 to 10^4), but it is *not* at
    ``t = 1``: ``sum |z|`` is Gamma-like with mean ``|B| b``. The report gives the figure.

    ``calibration="exact"``: the smallest integer shift that certifies ``1 - e^{-t}``, the
    ``1 - e^{-t}`` quantile of ``sum |z|`` (:func:`dpopt.privacy.noise_tails.laplace_abs_sum_quantile`);
    about ``|B| b (1 + sqrt(2t/|B|))``, far below the paper's shift for ``t > 1``.

    Gaussian noise (both calibrations): ``sigma sqrt(|B| (|B| + 2 sqrt(|B| t) + 2 t))``
    (module notes), which certifies ``1 - e^{-t}``.
    """
    if not (isinstance(t, (int, float, np.integer, np.floating)) and t > 0 and math.isfinite(t)):
        raise ParameterError(f"t must be a positive number, got {t!r}")
    if calibration not in SHIFT_CALIBRATIONS:
        raise ParameterError(f"calibration must be one of {list(SHIFT_CALIBRATIONS)}, got {calibration!r}")
    m = measurement.query.num_rows
    if measurement.noise == "discrete_laplace":
        if calibration == "exact":
            return float(laplace_abs_sum_quantile(measurement.scale, m, float(t)))
        return float(t) * measurement.query.sensitivity(1) * measurement.scale
    if measurement.noise == "discrete_gaussian":
        return gaussian_abs_sum_bound(measurement.scale, m, float(t))
    if measurement.noise == "none":
        return 0.0
    raise SolverError(f"the shift is derived for discrete Laplace or Gaussian noise, not {measurement.noise!r}")


def shift_probability(measurement: Measurement, amount: float) -> float:
    """A certified lower bound on the probability that the shifted table is non-negative.

    The shifted table is non-negative whenever ``sum_alpha |z_alpha| <= amount`` (module
    notes), so this is that event's probability: exact for discrete Laplace noise, the
    Hsu--Kakade--Zhang bound ``1 - e^{-t}`` for discrete Gaussian noise, 1 without noise.
    """
    m = measurement.query.num_rows
    if measurement.noise == "discrete_laplace":
        return -math.expm1(laplace_abs_sum_log_sf(measurement.scale, m, amount))
    if measurement.noise == "discrete_gaussian":
        return -math.expm1(-gaussian_abs_sum_t(measurement.scale, m, amount))
    if measurement.noise == "none":
        return 1.0
    raise SolverError(f"the shift is derived for discrete Laplace or Gaussian noise, not {measurement.noise!r}")


# ---- the release --------------------------------------------------------------------------------
class BarakRelease(Release):
    """A Fourier release and its report: a :class:`~dpopt.algorithms.base.Release` with Barak's extras.

    Attributes (besides those of :class:`~dpopt.algorithms.base.Release`)
    -----------------------------------------------------------------------
    method : str
    marginals : dict of tuple to DataFrame
        Each requested marginal (source attributes in domain order) with a ``count`` column
        (also in ``answers``, keyed ``"a, b"``).
    table : DataFrame or None
        Every source cell with its released ``count`` (None for the shift, which releases
        marginals only).
    bounds : DataFrame
        Per marginal: ``bits`` (``|alpha|``), ``theorem5_bound`` (at ``bound_delta``),
        ``l1_error`` (when the truth was given, else NaN), ``within_bound``.
    lp : dict
        Status, objective, sizes (rows, cell columns, column-generation rounds), backend,
        time; ``max_coefficient_error`` is ``b`` of the LP in unnormalised units.
    shift : dict or None
        ``t``, ``calibration``, the shift in unnormalised and normalised units,
        ``probability_bound`` (certified probability that the shifted table is non-negative,
        :func:`shift_probability`) and ``paper_probability`` ``1 - e^{-t}`` (the paper's claim).
    ledger : DataFrame or None
        The accountant's ledger (exact fractions).
    measurement : Measurement
    plan : FourierPlan
    binary_table : ndarray or None
        The released table over the binary domain.

    ``status`` is the consistency solve's :class:`~dpopt.estimate.status.Status`; the shift, which
    makes no optimality claim, is ``COMPLETED``.
    """

    @property
    def ledger(self):
        return self.get("ledger_frame")

    def marginal(self, attrs: Sequence[str]) -> pd.DataFrame:
        """The released marginal over ``attrs`` (any order)."""
        key = self.plan.source.canonical(attrs)
        if key not in self.marginals:
            raise QueryError(f"marginal {tuple(attrs)!r} was not requested; released: {list(self.marginals)}")
        return self.marginals[key]


def fourier_consistency(
    plan: FourierPlan,
    measurement: Measurement,
    method: str = "linf",
    constraints: ConstraintSet | None = None,
    *,
    integer: bool | None = None,
    t: float = 1.0,
    shift_calibration: str = "paper",
    bound_delta: float = 0.05,
    truth: Dataset | None = None,
    accountant: Accountant | None = None,
    backend: str | None = None,
    time_limit: float | None = None,
    engine_options: dict | None = None,
) -> BarakRelease:
    """Make the measured coefficients consistent and release the requested marginals.

    Parameters
    ----------
    plan, measurement
        From :func:`fourier_plan` and :func:`measure_fourier` (or any measurement of
        ``plan.query``, e.g. a noise-free one for tests).
    method : {"linf", "l1", "l2", "entropy", "shift"}
        See the module notes.
    constraints : ConstraintSet, optional
        Public constraints over ``plan.source`` (structural zeros, hierarchy, invariants,
        inequalities, integrality). Non-negativity is always imposed; unused binary codes
        are structural zeros.
    integer : bool, optional
        Round the table exactly to integers (default: True for the optimising methods).
    t : float
        Shift parameter (method ``"shift"``): the paper's shift ``t |B| b``, or with
        ``shift_calibration="exact"`` the smallest shift certifying probability ``1 - e^{-t}``.
    shift_calibration : {"paper", "exact"}
        See :func:`shift_amount`. Either way the report's ``probability_bound`` is the
        probability the shift certifies (:func:`shift_probability`), not ``1 - e^{-t}``.
    bound_delta : float
        Failure probability of the reported Theorem 5 bounds.
    truth : Dataset, optional
        The confidential data, to report achieved errors (NOT private).
    accountant : Accountant, optional
        Its ledger goes into the report.
    backend, time_limit, engine_options
        Passed to :func:`dpopt.estimate.reconstruct` (``engine_options`` as its keyword
        options, e.g. ``{"method": "ipm"}`` for HiGHS or ``{"max_passes": 500}`` for "mw").
    """
    from dpopt.estimate import reconstruct, round_to_integers

    if method not in METHODS:
        raise ParameterError(f"method must be one of {list(METHODS)}, got {method!r}")
    if not isinstance(measurement, Measurement) or measurement.query is not plan.query:
        if not (isinstance(measurement, Measurement) and isinstance(measurement.query, FourierParity)
                and measurement.query.subsets == plan.query.subsets and not measurement.query.normalized
                and measurement.query.domain == plan.domain):
            raise QueryError("measurement must measure the plan's unnormalised parities (plan.query)")
    source_cs = constraints if constraints is not None else ConstraintSet(plan.source)
    if not isinstance(source_cs, ConstraintSet) or source_cs.domain != plan.source:
        raise QueryError(f"constraints must be a ConstraintSet over {plan.source}")
    if not 0 < bound_delta < 1:
        raise PrivacyParameterError(f"bound_delta must be in (0, 1), got {bound_delta!r}")
    lp: dict = {}
    shift_info = None
    reconstruction = None
    rounding = None
    counts = binary_table = None
    if method == "shift":
        if source_cs.invariants or source_cs.inequalities:
            raise ParameterError("method 'shift' reads marginals straight from the coefficients and cannot keep "
                              "invariants or inequalities; use method 'linf', 'l1', 'l2' or 'entropy'")
        amount = shift_amount(measurement, t, shift_calibration)
        k = len(plan.domain)
        shift_info = {"t": float(t), "calibration": shift_calibration, "amount": amount,
                      "amount_normalized": amount / 2.0 ** (k / 2),
                      "probability_bound": shift_probability(measurement, amount),
                      "paper_probability": -math.expm1(-t)}
        values = np.array(measurement.values, dtype=np.float64)
        values[plan.query.subsets.index(())] += amount
        coeffs = plan.query.coefficient_map(values)
        marginal_values = {m: _drop_unused(plan, m, marginal_from_fourier(plan.domain, plan.marginal_bits(m), coeffs))
                           for m in plan.marginals}
        marginal_values = {m: _zero_forbidden(source_cs, m, v) for m, v in marginal_values.items()}
        success, status, message = True, Status.COMPLETED, f"zeroth coefficient shifted by {amount:.6g} (t = {t:g})"
    else:
        cs = _binary_constraints(plan, source_cs)
        ms = [measurement]
        if method == "entropy":
            ms = _split_total(plan, measurement, cs, time_limit)
        reconstruction = reconstruct(ms, cs, method, backend=backend, time_limit=time_limit, integer=False,
                                     **dict(engine_options or {}))
        success = bool(reconstruction.success)
        status = reconstruction.status
        message = reconstruction.message
        lp = _lp_report(reconstruction, measurement)
        x = reconstruction.x
        if x is not None and not np.isfinite(x).all():  # an engine that diverged releases nothing
            success, status, x = False, Status.NUMERICAL_ERROR, None
            message = f"{message}; the estimate is not finite"
        do_round = True if integer is None else bool(integer)
        if x is not None and do_round:
            rounding = round_to_integers(x, cs, method="cellwise", time_limit=time_limit)
            if not rounding.success:
                success, status = False, rounding.status
                message = f"integer rounding failed: {rounding.message}"
                x = None
            else:
                x = rounding.x
        if x is not None:
            binary_table = x
            counts = plan.encoding.decode_histogram(x) if plan.encoding is not None else x
            if do_round:
                counts = np.rint(counts).astype(np.int64)
        marginal_values = ({m: _drop_unused(plan, m, marginalize(binary_table, plan.domain, plan.marginal_bits(m)))
                            for m in plan.marginals} if binary_table is not None else {})
    marginals = {m: cells_frame(plan.source.project(m), v) for m, v in marginal_values.items()}
    table = cells_frame(plan.source, counts) if counts is not None else None
    bounds = _bounds_frame(plan, measurement, marginal_values, truth, bound_delta)
    ledger = accountant.ledger_frame() if accountant is not None else None
    return BarakRelease(
        counts=counts, records=None, answers={", ".join(m): frame for m, frame in marginals.items()},
        status=status, success=success, message=message, measurements=[measurement],
        reconstruction=reconstruction, rounding=rounding, accountant=accountant, algorithm="barak",
        reference=Barak.reference, title=Barak.title, parameters={"method": method}, notes=[], info={},
        domain=plan.source, method=method, marginals=marginals, table=table, bounds=bounds, lp=lp,
        shift=shift_info, ledger_frame=ledger, measurement=measurement, plan=plan, binary_table=binary_table)


def barak_release(
    data: Dataset,
    marginals: Iterable[Sequence[str]] | int,
    *,
    epsilon=None,
    rho=None,
    delta=None,
    method: str = "linf",
    accountant: Accountant | None = None,
    rng: RandomSource | None = None,
    constraints: ConstraintSet | None = None,
    evaluate: bool = False,
    **options,
) -> BarakRelease:
    """Plan, measure and make consistent in one call (see the module notes).

    Parameters
    ----------
    data : Dataset
    marginals : iterable of attribute lists, or int k (every k-way marginal)
    epsilon, rho, delta
        The budget: ``epsilon`` alone (pure, discrete Laplace), ``rho`` (zCDP) or
        ``epsilon`` and ``delta`` (discrete Gaussian). A fresh accountant holding exactly
        this budget is created unless ``accountant`` is given.
    method : {"linf", "l1", "l2", "entropy", "shift"}
    rng : RandomSource, optional
        Default: a fresh cryptographically secure source (a seeded one is not private).
    constraints : ConstraintSet over ``data.domain``, optional
    evaluate : bool
        Report the achieved errors against ``data`` (NOT private; for testing).
    **options
        Passed to :func:`fourier_consistency` (``t``, ``integer``, ``bound_delta``,
        ``backend``, ``time_limit``, ``engine_options``).
    """
    if not isinstance(data, Dataset):
        raise DataError(f"data must be a Dataset, got {type(data).__name__}")
    if method not in METHODS:
        raise ParameterError(f"method must be one of {list(METHODS)}, got {method!r}")
    plan = fourier_plan(data.domain, marginals)
    budget = _budget(epsilon, rho, delta)
    if accountant is None:
        accountant = budget.accountant()
    if constraints is not None:
        constraints.check()  # public: before any noise is drawn
    rng = rng or make_random()
    m = measure_fourier(plan, data, accountant, rng, cost=budget.total)
    return fourier_consistency(plan, m, method, constraints, truth=data if evaluate else None,
                               accountant=accountant, **options)


# ---- helpers ----------------------------------------------------------------------------------------
def _budget(epsilon, rho, delta) -> Budget:
    """The budget of the convenience function: epsilon (pure), rho (zCDP) or epsilon and delta."""
    if rho is not None:
        if epsilon is not None or delta is not None:
            raise PrivacyParameterError("barak_release: give rho alone, epsilon alone, or epsilon and delta")
        return Budget.zcdp(rho)
    if epsilon is None:
        raise PrivacyParameterError("barak_release: give epsilon, rho, or epsilon and delta")
    return Budget.pure(epsilon) if delta is None else Budget.approx(epsilon, delta)


def _binary_constraints(plan: FourierPlan, source_cs: ConstraintSet) -> ConstraintSet:
    """The source constraints over the binary domain, with non-negativity and the unused codes."""
    if plan.encoding is None:
        cs = ConstraintSet(plan.domain, [c for c in source_cs if not isinstance(c, Integrality)])
    else:
        cs = plan.encoding.lift_constraints(
            ConstraintSet(plan.source, [c for c in source_cs if not isinstance(c, Integrality)]))
    if not cs.nonnegative:
        cs.add(NonNegativity())
    return cs


def _drop_unused(plan: FourierPlan, attrs: tuple[str, ...], binary_marginal: np.ndarray) -> np.ndarray:
    """A marginal over the bits of ``attrs`` as a marginal over ``attrs`` (unused codes dropped)."""
    if plan.encoding is None:
        return np.asarray(binary_marginal)
    return plan.encoding.source_marginal(attrs, binary_marginal)


def _zero_forbidden(cs: ConstraintSet, attrs: tuple[str, ...], values: np.ndarray) -> np.ndarray:
    """Zero the cells of a marginal that a structural-zero rule within its attributes forbids."""
    sub = cs.domain.project(attrs)
    out = np.array(values, dtype=np.float64).reshape(sub.shape)
    for rule in cs.zero_rules:
        rattrs, mask = rule.pattern(cs.domain)
        if set(rattrs) <= set(attrs):
            shape = [sub.size_of(a) if a in rattrs else 1 for a in attrs]
            out[np.broadcast_to(mask.reshape(shape), sub.shape)] = 0.0
    return out.reshape(-1)


def _split_total(plan: FourierPlan, m: Measurement, cs: ConstraintSet,
                 time_limit: float | None = None) -> list[Measurement]:
    """The same noisy answers as two measurements: the total (empty parity) and the rest.

    Post-processing only (the cost stays on ``m``); the entropy engine reads the table's
    total from a measurement whose rows cover every cell once, and needs it positive. A
    noisy total at or below zero is replaced by the total of the non-negative least-squares
    fit of all the coefficients under the constraints (a projection, not a clamp).
    """
    from dpopt.estimate import reconstruct

    subsets = plan.query.subsets
    zero = subsets.index(())
    rest = [s for s in subsets if s != ()]
    values = np.asarray(m.values)
    total_value = float(values[zero])
    label = f"{m.label}:total"
    if total_value <= 0:
        fit = reconstruct([m], cs, "l2", time_limit=time_limit)
        projected = float(fit.x.sum()) if fit.success else 0.0
        if projected <= 1e-6 * (1.0 + float(np.abs(values).max())):  # zero up to the QP solver's accuracy
            raise SolverError(f"method 'entropy' needs a positive total: the noisy total is {total_value:g} and the "
                              f"least-squares fit of the coefficients has total {projected:g} ({fit.message}); "
                              f"use method 'l2', 'l1' or 'linf'")
        total_value, label = projected, f"{m.label}:total (least-squares projection of {total_value:g})"
    total = Measurement(FourierParity(plan.domain, [()]), np.array([total_value]), m.noise, m.scale, m.variance,
                        None, label, dict(m.info))
    if not rest:
        return [total]
    others = Measurement(FourierParity(plan.domain, rest), np.delete(values, zero), m.noise, m.scale,
                         m.variance, None, f"{m.label}:parities", dict(m.info))
    return [total, others]


def _lp_report(result, measurement: Measurement) -> dict:
    info = dict(result.info or {})
    out = {
        "status": getattr(result.status, "name", str(result.status)),
        "objective": result.objective,
        "fun": result.fun,
        "backend": result.backend,
        "solver": result.solver,
        "time": result.time,
        "iterations": result.nit,
        "rows": info.get("rows"),
        "cell_columns": info.get("cell_columns"),
        "rounds": info.get("rounds"),
        "column_generation": info.get("column_generation"),
    }
    if result.objective == "linf" and result.fun is not None:
        # fun = max |residual| / sigma: b in the units of the unnormalised coefficients.
        out["max_coefficient_error"] = float(result.fun) * measurement.stddev
    return out


def _bounds_frame(plan, measurement, marginal_values, truth, bound_delta) -> pd.DataFrame:
    eps = measurement.info.get("epsilon")
    pure = measurement.noise == "discrete_laplace" and eps is not None
    rows = []
    for m in plan.marginals:
        order = len(plan.marginal_bits(m))
        bound = theorem5_bound(order, plan.closure_size, float(Fraction(eps)), bound_delta) if pure else float("nan")
        err = float("nan")
        if truth is not None and m in marginal_values:
            err = float(np.abs(np.asarray(marginal_values[m], dtype=np.float64) - truth.marginal(m)).sum())
        rows.append({"marginal": ", ".join(m), "bits": order, "theorem5_bound": bound, "l1_error": err,
                     "within_bound": bool(err <= bound) if not (math.isnan(err) or math.isnan(bound)) else None})
    return pd.DataFrame(rows)


# ---- the registered algorithm -------------------------------------------------------------------
#: Consistency methods a release can use: the shift releases marginals without a table.
RELEASE_METHODS = ("linf", "l1", "l2", "entropy")


@dataclass(frozen=True)
class BarakParams(AlgorithmParams):
    """``[barak]``: the marginals to release and the consistency method; ``[reconstruct]``: backend, time limit.

    Attributes
    ----------
    marginals : int or tuple of tuple of str
        An order ``k`` (every ``k``-way marginal) or the list of marginals ``A``.
    method : {"linf", "l1", "l2", "entropy"}
        See the module notes (the Theorem 6 shift is available from :func:`barak_release`).
    reconstruct : ReconstructSpec
        Its objective is ``method``; ``backend`` and ``time_limit`` are passed to the engine.
    """

    marginals: int | tuple[tuple[str, ...], ...] = 2
    method: str = "linf"
    reconstruct: ReconstructSpec = field(default_factory=lambda: ReconstructSpec("linf"))

    def validate(self) -> None:
        check_marginals(self.marginals, "marginals")
        if self.method not in RELEASE_METHODS:
            raise ParameterError(f"method must be one of {list(RELEASE_METHODS)}, got {self.method!r}")
        if self.reconstruct.objective != self.method:
            object.__setattr__(self, "reconstruct", ReconstructSpec(self.method, self.reconstruct.backend,
                                                                    self.reconstruct.time_limit))

    @classmethod
    def from_spec(cls, reader) -> "BarakParams":
        from dpopt.spec.queries import parse_marginals
        from dpopt.spec.sections import parse_reconstruct

        t = reader.table("barak", required=True)
        marginals = parse_marginals(t)
        if t.raw.get("method") == "shift":
            raise t.error(("method",), "method 'shift' (Barak et al. Theorem 6) releases marginals without a "
                          f"table, which a release publishes; choose one of {list(RELEASE_METHODS)}, or call "
                          "dpopt.algorithms.barak.barak_release(method='shift') from Python")
        method = t.str("method", default="linf", choices=RELEASE_METHODS)
        raw = reader.top.raw.get("reconstruct")
        if isinstance(raw, dict) and "objective" in raw:
            raise reader.error(("reconstruct", "objective"),
                               "does not apply to algorithm = 'barak'; set [barak] method instead")
        return cls(marginals, method, parse_reconstruct(reader.table("reconstruct"), objective=method))


@register
class Barak(Algorithm):
    """The Fourier release with consistency of Barak et al. (module notes)."""

    name = "barak"
    title = "Fourier coefficients of the downward closure, made consistent by an LP or QP"
    reference = "Barak, Chaudhuri, Dwork, Kale, McSherry, Talwar, PODS 2007 (Theorems 3, 5 and 6)"
    accountings = ("pure", "approx", "zcdp")
    supports = frozenset({"nonnegative", "integer", "structural_zeros", "hierarchy", "invariants", "inequalities"})
    sections = {"barak": ("marginals", "method"), "reconstruct": ("backend", "time_limit")}
    Params = BarakParams

    def plan(self, domain, constraints, budget):
        try:
            fplan = fourier_plan(domain, self.params.marginals)
        except DpoptError as exc:
            raise at_key(QueryError(str(exc).removeprefix("fourier_plan: ")), ("barak", "marginals")) from None
        law = calibrate(fplan.query, budget.total)
        noise = "discrete Laplace" if law.mechanism == "laplace" else "discrete Gaussian"
        step = PlannedMeasure("fourier parities", fplan.query, law.mechanism, Fraction(1), budget.total, law,
                              what=f"|B| = {fplan.closure_size} unnormalised parities")
        lines = [f"one measurement of the |B| = {fplan.closure_size} unnormalised parities of the downward "
                 f"closure of {len(fplan.marginals)} marginals, {noise} noise, the whole budget"]
        if fplan.encoding is not None:
            lines.append(f"non-binary attributes binary-encoded: {len(fplan.domain)} bits, "
                         f"{fplan.domain.size:,} binary cells")
        return self.new_plan(domain, constraints, budget, steps=[step], details=fplan, lines=lines)

    def run(self, plan, data, accountant, rng) -> Release:
        fplan, params = plan.details, self.params
        step = plan.steps[0]
        m = measure(fplan.query, binary_data(fplan, data), step.law, accountant, rng, label=step.label)
        rel = fourier_consistency(fplan, m, params.method, plan.constraints, integer=plan.constraints.integral,
                                  accountant=accountant, backend=params.reconstruct.backend,
                                  time_limit=params.reconstruct.time_limit)
        if fplan.encoding is not None:
            # The parities live on the binary encoding; as a query of the source cells they are
            # Q P (P maps each source cell to its code), so reports and evaluation can compare
            # them with the released table over the source domain.
            m = Measurement(fplan.encoding.lower_query(fplan.query), m.values, m.noise, m.scale, m.variance, m.cost, m.label, dict(m.info))
        counts = rel.counts
        if counts is not None and not plan.constraints.integral:
            counts = np.asarray(counts, dtype=np.float64)
        notes = [
            f"The whole budget buys one measurement: the {fplan.closure_size} unnormalised Fourier parities of the "
            "downward closure of the requested marginals.",
            "The released marginals are read from the released table, so they are mutually consistent; they "
            "have no 'noisy' column because the marginals themselves were not measured.",
            "The released total is noisy (the empty parity), not the record count.",
        ]
        if fplan.encoding is not None:
            notes.append(f"Non-binary attributes were binary-encoded ({len(fplan.domain)} bits); the table was "
                         "solved over the binary domain with the unused codes as structural zeros and decoded back.")
        notes.append("Theorem 5 bounds are reported for pure DP only." if plan.budget.accounting != "pure" else
                     "Theorem 5 bounds (probability 0.95) on each marginal's L1 error are listed under 'bounds'.")
        info = {"closure_size": fplan.closure_size, "lp": rel.lp, "bounds": rel.bounds.to_dict(orient="records"),
                "binary_domain": {"attributes": len(fplan.domain), "cells": fplan.domain.size,
                                  "encoded": fplan.encoding is not None},
                "marginals": [list(a) for a in fplan.marginals]}
        if not rel.success:
            info["spec_key"] = ("barak", "method")
        return make_release(self, plan, accountant, status=rel.status, message=rel.message,
                            counts=counts, answers=rel.answers, measurements=[m],
                            reconstruction=rel.reconstruction, rounding=rel.rounding, notes=notes, info=info)

    @classmethod
    def example(cls, domain):
        return cls.Params(marginals=min(2, len(domain)), method="l2")
