"""A table that reproduces every measurement exactly, when one exists.

Such a table has objective 0 under L1, L-infinity and L2, their lower bound, so it is a
certified optimum of each. When the domain has many more cells than there are
measurements, as with Barak et al.'s Fourier coefficients on 2^20 cells, exact fits usually
exist, and finding one is far cheaper than any working-set or simplex method.

**The maximum-entropy exact fit.** It is ``v = w exp(Q^T lam - 1)``, the solution of
``min sum v log(v / w)`` subject to ``Q v = y``, and so it is also the entropy objective's
answer. ``lam`` maximises the concave dual ``lam . y - sum w exp(Q^T lam - 1)`` (Boyd and
Vandenberghe 2004, ch. 5 for the dual of entropy maximisation, §9.5 for Newton's method).
Newton's method with backtracking finds it.

- Every step solves with the ``m x m`` Hessian ``Q diag(v) Q^T``. For Fourier parities that
  Hessian comes from one Walsh–Hadamard transform of ``v``: entry ``(S, T)`` is
  ``v^(S xor T)`` (:meth:`dpopt.model.queries.fourier.FourierParity.weighted_gram`).
- At 2^20 cells and 1,351 parities a step takes about 0.15 s.
- When no positive exact fit exists the dual is unbounded or has no interior maximiser, and
  Newton's method stops without converging. When the total ``N`` is among the rows, a dual
  above ``N log(N / min w)`` proves this at once (weak duality). The caller then falls back
  to its general method.

**A vertex.** :func:`basic_exact_fit` turns the dense maximum-entropy fit into a basic one,
with at most ``m`` positive cells, which is what rounding to integers needs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import scipy.linalg as la
from scipy.optimize import nnls

from dpopt.estimate.problem import ConsistencyProblem
from dpopt.estimate.result import Result, make_result
from dpopt.estimate.status import Status

#: Dense Hessians up to this many rows (the Cholesky factor is m^3 / 3 flops).
MAX_EXACT_FIT_ROWS = 5000


@dataclass
class ExactFit:
    """An exact fit: the table, the Newton steps taken, the time and the largest residual."""

    x: np.ndarray
    steps: int
    time: float
    max_residual: float


def exact_fit_applies(problem: ConsistencyProblem) -> bool:
    """One noisy measurement with a fast weighted Gram matrix, non-negativity and structural
    zeros only (equality and inequality rows would need their own multipliers)."""
    if len(problem.noisy) != 1 or not problem.constraints.nonnegative:
        return False
    query = problem.noisy[0].query
    if not getattr(query, "fast_weighted_gram", False) or query.num_rows > MAX_EXACT_FIT_ROWS:
        return False
    A_eq, _, _ = problem.constraints.equality_rows()
    A_in, _, _, _ = problem.constraints.inequality_rows()
    return A_eq.shape[0] == 0 and A_in.shape[0] == 0


def positive_exact_fit(problem: ConsistencyProblem, prior: np.ndarray | None = None,
                       max_steps: int = 40) -> ExactFit | None:
    """The maximum-entropy (relative to ``prior``, default uniform) table on the free cells
    with ``Q x = y`` exactly, or None when Newton's method finds none (see the module notes).
    """
    if not exact_fit_applies(problem):
        return None
    weights = prior_weights(problem.num_cells, problem.free_cells(), prior)
    return fit_exactly(problem.noisy[0].query, problem.noisy[0].values, weights, max_steps)


def prior_weights(num_cells: int, free: np.ndarray, prior: np.ndarray | None) -> np.ndarray:
    """The entropy reference ``w``: the prior (default uniform) on the free cells, 0 elsewhere."""
    weights = np.zeros(num_cells)
    weights[free] = 1.0 if prior is None else np.asarray(prior, dtype=np.float64)[free]
    return weights


def fit_exactly(query, y: np.ndarray, weights: np.ndarray, max_steps: int = 40) -> ExactFit | None:
    """The table ``x = w exp(Q^T lam - 1)`` with ``Q x = y``: the minimiser of
    ``sum x log(x / w)`` among exact fits, positive wherever ``w`` is (``w = 0`` pins a
    cell to zero). None when Newton's method finds none. ``query`` needs ``weighted_gram``."""
    start = time.perf_counter()
    y = np.asarray(y, dtype=np.float64)
    weights = np.asarray(weights, dtype=np.float64)
    positive = weights > 0
    if not positive.any() or (weights < 0).any():
        return None
    total = _known_total(query, y)
    if total is not None and total <= 0:
        return None  # no positive table has a non-positive total
    # Weak duality: the dual never exceeds sum v log(v/w) <= N log(N / min w) over tables
    # with total N, so a dual above that proves no exact fit exists.
    bound = None if total is None else total * np.log(total / weights[positive].min())
    outcome = newton_dual(query.matvec, query.rmatvec, query.weighted_gram, y, weights,
                          np.zeros(y.size), max_steps=max_steps, dual_bound=bound)
    if outcome is None:
        return None
    v, steps = outcome
    residual = float(np.abs(query.matvec(v) - y).max())
    return ExactFit(v, steps, time.perf_counter() - start, residual)


def exact_fit_result(problem: ConsistencyProblem, start: float, how: str = "basic",
                     time_limit: float | None = None) -> Result | None:
    """An exact fit returned as a certified optimum of ``problem.objective`` (``"l1"``,
    ``"linf"`` or ``"l2"``, whose lower bound 0 it meets), or None when there is none.

    ``how="basic"`` gives a vertex (:func:`basic_exact_fit`), ``"interior"`` the
    maximum-entropy exact fit. The fit must reproduce every measurement to 1e-9 of the largest
    weighted answer and satisfy every constraint. Past ``time_limit`` seconds from ``start``
    (checked between the Newton and NNLS phases) it gives up, so that the caller reports the
    time limit.
    """
    def out_of_time() -> bool:
        return time_limit is not None and time.perf_counter() - start > time_limit

    fit = positive_exact_fit(problem)
    if fit is not None and how == "basic" and not out_of_time():
        fit = basic_exact_fit(problem, fit)
    if fit is None or out_of_time():
        return None
    method = "Newton's method on the entropy dual" + (", then NNLS for a vertex" if how == "basic" else "")
    return certified_exact_fit(problem, fit.x, start, solver=f"{method} (exact fit)", nit=fit.steps,
                               what=f"a non-negative table ({fit.steps} Newton steps)")


def certified_exact_fit(problem: ConsistencyProblem, x: np.ndarray, start: float, *, solver: str, nit: int | None,
                        what: str) -> Result | None:
    """``x`` as the optimum of ``problem.objective`` (``"l1"``, ``"linf"`` or ``"l2"``) when it
    reproduces every measurement to 1e-9 of the largest weighted answer and satisfies every
    constraint, so that it meets the objective's lower bound 0; else None."""
    weights = 1.0 / problem.sigmas()
    y = problem.targets()
    residual = np.abs(problem.stacked_operator().matvec(x) - y) * weights
    tol = 1e-9 * max(1.0, float(np.abs(y * weights).max()))
    if residual.max() > tol or not all(row["satisfied"] for row in problem.constraints.residuals(x)):
        return None
    value = {"linf": residual.max(), "l1": residual.sum(), "l2": np.sum(residual**2)}[problem.objective]
    return make_result(
        Status.OPTIMAL, x, fun=float(value), objective=problem.objective, backend="scipy", solver=solver,
        time=time.perf_counter() - start, nit=nit, problem=problem,
        info={"exact_fit": True, "rows": int(y.size), "cell_columns": int((x > 0).sum()), "rounds": 0},
        message=(f"{what} reproduces every measurement (largest weighted residual {residual.max():.2e}): "
                 f"it meets the objective's lower bound, so it is optimal"))


def _known_total(query, y: np.ndarray) -> float | None:
    """The table's total when one of the query's rows is the all-ones row (a parity query's
    empty parity), else None."""
    subsets = getattr(query, "subsets", None)
    if subsets is None or () not in subsets:
        return None
    value = float(y[subsets.index(())])
    return value / query.scale if getattr(query, "normalized", False) else value


def basic_exact_fit(problem: ConsistencyProblem, fit: ExactFit, first: int = 3,
                    max_entries: int = 50_000_000) -> ExactFit | None:
    """A basic (vertex) exact fit, with at most as many positive cells as rows, or None.

    Non-negative least squares (``scipy.optimize.nnls``, Lawson–Hanson) on the cells where
    the positive fit ``fit`` is largest: ``first`` times the row count, doubled until the
    least-squares residual is zero or the dense columns would exceed ``max_entries``.
    Lawson–Hanson keeps its positive columns linearly independent, so a zero-residual answer
    is a vertex of ``{x >= 0 : Q x = y}``. A vertex is what a simplex method returns and what
    rounding to integers needs: Barak et al.'s Theorem 5 charges rounding at most ``|B|``,
    one unit per positive cell. Rounding the dense maximum-entropy fit instead would move
    most of the mass.
    """
    start = time.perf_counter()
    query = problem.noisy[0].query
    y = np.asarray(problem.noisy[0].values, dtype=np.float64)
    m = y.size
    order = np.argsort(-fit.x, kind="stable")
    order = order[fit.x[order] > 0]
    count = first * m
    tol = 1e-9 * max(1.0, float(np.abs(y).max()))
    while count * m <= max_entries:
        cells = np.sort(order[:count])
        block = query.columns(cells).toarray().astype(np.float64)
        values, norm = nnls(block, y, maxiter=10 * cells.size)
        if norm <= tol:
            x = np.zeros(problem.num_cells)
            x[cells] = values
            return ExactFit(x, fit.steps, fit.time + time.perf_counter() - start,
                            float(np.abs(block @ values - y).max()))
        if count >= order.size:
            return None
        count = min(2 * count, order.size)
    return None


def newton_dual(
    matvec: Callable[[np.ndarray], np.ndarray],
    rmatvec: Callable[[np.ndarray], np.ndarray],
    gram: Callable[[np.ndarray], np.ndarray],
    d: np.ndarray,
    weights: np.ndarray,
    lam: np.ndarray,
    max_steps: int = 100,
    tol: float = 1e-11,
    dual_bound: float | None = None,
) -> tuple[np.ndarray, int] | None:
    """Maximise ``lam . d - sum w exp(C^T lam - 1)``, the dual of ``min sum v log(v / w)``
    subject to ``C v = d``; return ``(v, steps)`` with ``v = w exp(C^T lam - 1)`` once
    ``C v = d`` holds to ``tol`` relative to ``max |d|``, else None.

    ``matvec``, ``rmatvec`` and ``gram`` give ``C v``, ``C^T u`` and ``C diag(v) C^T``. The
    Newton system is solved by Cholesky with iterative refinement (least squares when
    redundant rows make it singular). A step is kept when it raises the dual enough (Armijo)
    *or* shrinks the residual. Near the solution the dual's increase falls below its
    rounding error, while the residual still shrinks quadratically. Five steps in a row that
    grow the residual mean the dual is unbounded: no exact fit exists. So does a dual above
    ``dual_bound``, an upper bound on the primal optimum when one is known.
    """
    with np.errstate(over="ignore", invalid="ignore"):  # a diverging dual is detected, not warned about
        return _newton_dual(matvec, rmatvec, gram, np.asarray(d, dtype=np.float64), weights, lam, max_steps, tol,
                            dual_bound)


def _newton_dual(matvec, rmatvec, gram, d, weights, lam, max_steps, tol, dual_bound):
    scale = max(float(np.abs(d).max()), 1e-300)
    exponent = np.asarray(rmatvec(lam), dtype=np.float64)

    def primal(e):
        return weights * np.exp(np.minimum(e - 1.0, 700.0))

    def dual(lam_, e):
        return float(lam_ @ d - primal(e).sum())

    v = primal(exponent)
    residual = d - matvec(v)
    growing = 0
    for steps in range(max_steps + 1):
        norm = float(np.linalg.norm(residual))
        if np.abs(residual).max() <= tol * scale:
            return v, steps
        if steps == max_steps:
            return None
        step = _newton_step(gram(v), residual)
        direction = np.asarray(rmatvec(step), dtype=np.float64)
        t, current, slope = 1.0, dual(lam, exponent), float(residual @ step)
        while t > 1e-12:
            trial_v = primal(exponent + t * direction)
            trial_residual = d - matvec(trial_v)
            if (dual(lam + t * step, exponent + t * direction) >= current + 1e-4 * t * slope
                    or np.linalg.norm(trial_residual) < (1.0 - 1e-4 * t) * norm):
                break
            t /= 2
        else:
            return None
        lam, exponent = lam + t * step, exponent + t * direction
        v, residual = trial_v, trial_residual
        if not np.isfinite(residual).all():
            return None
        if dual_bound is not None and dual(lam, exponent) > dual_bound + 1e-9 * abs(dual_bound):
            return None
        growing = growing + 1 if np.linalg.norm(residual) > norm else 0
        if growing >= 5:
            return None
    return None


def _newton_step(hessian: np.ndarray, residual: np.ndarray) -> np.ndarray:
    try:
        factor = la.cho_factor(hessian)
    except la.LinAlgError:
        return np.linalg.lstsq(hessian, residual, rcond=None)[0]
    step = la.cho_solve(factor, residual)
    for _ in range(2):  # iterative refinement: the Hessian is ill-conditioned near the boundary
        step += la.cho_solve(factor, residual - hessian @ step)
    if np.linalg.norm(hessian @ step - residual) > 1e-6 * np.linalg.norm(residual):
        # Redundant rows make the Hessian singular, and Cholesky can then succeed on rounding
        # noise: take the least-squares step instead.
        return np.linalg.lstsq(hessian, residual, rcond=None)[0]
    return step


__all__ = [
    "ExactFit", "exact_fit_applies", "positive_exact_fit", "fit_exactly", "basic_exact_fit",
    "exact_fit_result", "certified_exact_fit", "prior_weights", "newton_dual", "MAX_EXACT_FIT_ROWS",
]
