"""Exact integer rounding: the L1-closest integer table that keeps every equality exactly.

Given a fractional table ``x~``, find an integer table ``x`` minimising ``sum |x - x~|``
subject to the invariants (and hierarchy equalities), inequalities, structural zeros and
non-negativity. Writing ``x = floor(x~) + a + b - c`` with ``a in [0, 1]`` (cost
``1 - 2 frac(x~)``), ``b, c >= 0`` (cost 1) makes the cost linear and exact at integers
(the L1 rounding step of the 2020 Census TopDown algorithm, generalised beyond
floor-or-ceiling). When the equality rows are totally unimodular (a total, one or two
families of disjoint counting rows such as nested marginals) every vertex of the LP is
integral, so the LP is solved and its integrality verified; otherwise, or if the vertex is
not integral, the same model is solved as a MIP.
"""

from __future__ import annotations

import time

import numpy as np
import scipy.sparse as sp

from dpopt.errors import QueryError
from dpopt.estimate.backends import get_backend
from dpopt.estimate.form import ProgramForm
from dpopt.estimate.result import Result, from_outcome, make_result
from dpopt.estimate.status import Status
from dpopt.model.constraints import ConstraintSet

INTEGRAL_TOL = 1e-6


def round_to_integers(
    x: np.ndarray,
    constraints: ConstraintSet,
    *,
    backend: str | None = None,
    time_limit: float | None = None,
    **options,
) -> Result:
    """Round a table to integers exactly under the constraints (see the module notes).

    Parameters
    ----------
    x : ndarray, shape (domain.size,)
        The fractional estimate (e.g. ``reconstruct(...).x``).
    constraints : ConstraintSet
        Invariant values must be integers on integer queries, else no integer table exists.
    backend : str
        ``"highs"`` (default), ``"pulp"``, ``"cvxpy"`` or ``"scipy"``: any with LP and MILP.

    Returns
    -------
    Result
        ``x`` integer-valued; ``fun`` = ``sum |x - x~|``; ``info["method"]`` says whether
        the LP vertex was integral or a MIP was needed.
    """
    start = time.perf_counter()
    domain = constraints.domain
    n = domain.require_dense("integer rounding over the full domain")
    target = np.asarray(x, dtype=np.float64)
    if target.shape != (n,) or not np.isfinite(target).all():
        raise QueryError(f"the table to round must be {n} finite values, got shape {target.shape}")
    engine = get_backend(backend or "highs")
    pinned = constraints.zero_mask() if constraints.zero_rules else np.zeros(n, dtype=bool)
    free = np.flatnonzero(~pinned)
    base = np.floor(target[free])
    frac = target[free] - base
    cost_offset = 0.0
    c_upper = np.full(free.size, np.inf)
    if constraints.nonnegative:
        negative = base < 0
        cost_offset = float(-target[free][negative].sum())
        base[negative], frac[negative] = 0.0, 0.0
        c_upper = base.copy()  # c > floor would make a cell negative (see module notes)
    k = free.size
    cost = np.concatenate([1.0 - 2.0 * frac, np.ones(k), np.ones(k)])
    lower = np.zeros(3 * k)
    upper = np.concatenate([np.ones(k), np.full(k, np.inf), c_upper])
    A_eq, b_eq, eq_names = constraints.equality_rows()
    A_in, l_in, u_in, in_names = constraints.inequality_rows()
    A_rows = sp.vstack([A_eq, A_in]).tocsr()[:, free]
    shift = A_rows @ base
    lift = sp.hstack([A_rows, A_rows, -A_rows]).tocsr()
    row_lo = np.concatenate([b_eq, l_in]) - shift
    row_hi = np.concatenate([b_eq, u_in]) - shift
    names = [f"invariant:{nm}" for nm in eq_names] + [f"inequality:{nm}" for nm in in_names]
    constant = float(frac.sum()) + cost_offset

    def build(integral: bool) -> ProgramForm:
        return ProgramForm(c=cost, A=lift, row_lower=row_lo, row_upper=row_hi, row_names=names,
                           lower=lower, upper=upper, c0=constant,
                           integrality=np.ones(3 * k, dtype=bool) if integral else None)

    tu = _looks_totally_unimodular(constraints)
    method = "LP vertex (integral)"
    outcome = engine.solve(build(False), time_limit=time_limit, **options)
    v = outcome.x
    if outcome.success and not _integral(v):
        method = "MIP (LP vertex was fractional)"
        outcome = engine.solve(build(True), time_limit=time_limit, **options)
        v = outcome.x
    info = {"method": method, "totally_unimodular_rows": tu, "variables": 3 * k}
    if v is None:
        return from_outcome(outcome, None, objective="round", problem=None, time=time.perf_counter() - start, info=info)
    steps = np.round(v[:k] + v[k : 2 * k] - v[2 * k :])
    rounded = np.zeros(n)
    rounded[free] = base + steps
    if outcome.success and not _integral(v):
        return make_result(Status.NUMERICAL_ERROR, None, message=f"{outcome.solver} returned a non-integral point",
                           fun=None, objective="round", backend=outcome.backend, solver=outcome.solver,
                           time=time.perf_counter() - start, nit=outcome.iterations, info=info)
    result = from_outcome(outcome, rounded, objective="round", problem=_Holder(constraints),
                          time=time.perf_counter() - start, info=info)
    result.fun = float(np.abs(rounded - target).sum())
    return result


class _Holder:
    """Just enough of a problem for the residual tables of a rounding result."""

    def __init__(self, constraints):
        self.constraints = constraints
        self.measurements = []


def _integral(v: np.ndarray) -> bool:
    return bool(np.all(np.abs(v - np.round(v)) <= INTEGRAL_TOL))


def _looks_totally_unimodular(constraints: ConstraintSet) -> bool:
    """Sufficient test: at most two families of disjoint 0/1 rows (two laminar families)."""
    queries = [c.query for c in constraints.invariants] + [c.query for c in constraints.inequalities]
    if len(queries) > 2:
        return False
    for q in queries:
        coverage = q.rmatvec(np.ones(q.num_rows))
        l1, l2 = q.column_norm_powers(1), q.column_norm_powers(2)
        if not (q.is_integer and np.allclose(coverage, l1) and np.allclose(l1, l2) and np.all(coverage <= 1)):
            return False
    return True
