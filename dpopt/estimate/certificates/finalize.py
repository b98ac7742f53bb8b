"""From an engine's result on the scaled problem to the result :func:`reconstruct` returns.

The engines solve the problem :func:`dpopt.estimate.scaling.prepare` built (counts divided
by a power of two, over-precise measurements as equalities). Here the estimate is mapped
back to the original units and checked against the *original* problem:

- the objective, the constraint table and the measurement table are recomputed by dpopt
  at the returned table (never taken from a solver);
- every constraint must hold to :func:`~dpopt.estimate.certificates.verify.feasibility_tolerance`. A
  solver's point that misses an invariant by a little more than that (CBC stops at 1e-7
  relative) is *polished*: the smallest change of its positive cells that meets every
  equality exactly (:func:`polish_equalities`), recorded in ``info["polished"]``. A point
  that still violates a constraint is not an optimum: status NUMERICAL_ERROR, ``success``
  False, the point kept only as an incumbent.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import lsqr

from dpopt.estimate.problem import ConsistencyProblem
from dpopt.estimate.result import Result, constraint_tolerance, make_result
from dpopt.estimate.scaling import Prepared
from dpopt.estimate.status import Status

__all__ = ["in_original_units", "polish_equalities"]


def in_original_units(result: Result, problem: ConsistencyProblem, prepared: Prepared) -> Result:
    """``result`` (of ``prepared.problem``) as a result of ``problem``, checked (module notes)."""
    scale = prepared.scale
    x = None if result.x is None else np.asarray(result.x, dtype=np.float64) * scale
    info = dict(result.info)
    if problem.objective == "smooth":
        from dpopt.estimate.engines.smooth import in_units

        info = in_units(info, scale)
    if scale != 1.0:
        info["count_scale"] = scale
    if prepared.exact_by_resolution:
        info["exact_by_resolution"] = list(prepared.exact_by_resolution)
    if prepared.variance_floored:
        info["variance_floored"] = list(prepared.variance_floored)
    message = result.message
    note = prepared.describe()
    if note:
        message = f"{message}; {note}"
    status = result.status
    fun = result.fun
    if x is not None and status is Status.OPTIMAL:
        tol = constraint_tolerance(problem)
        worst = _worst_violation(problem, x, tol)
        if worst is not None:
            polished = polish_equalities(problem, x)
            after = None if polished is None else _worst_violation(problem, polished, tol)
            if polished is not None and after is None:
                info["polished"] = {"constraint": worst[0], "violation_before": worst[1]}
                x = polished
            else:
                status = Status.NUMERICAL_ERROR
                message = (f"{message}; the solver called its point optimal but constraint {worst[0]!r} is violated "
                           f"by {worst[1]:.3g} (tolerance {tol:.3g}), and no polishing of the equalities fixed it")
    own = problem.objective not in ("l1", "l2", "linf", "entropy")
    out = make_result(status, x, message=message, fun=fun if own else None, objective=problem.objective,
                      backend=result.backend, solver=result.solver, time=result.time, nit=result.nit,
                      problem=problem, info=info, incumbent=bool(result.get("incumbent")) or status is not Status.OPTIMAL)
    if "solver_objective" in out.info and not own:
        out.info.pop("solver_objective")  # the engine's figure was in the scaled problem's weights
    return out


def _worst_violation(problem: ConsistencyProblem, x: np.ndarray, tol: float):
    """``(constraint, violation)`` of the most violated constraint beyond ``tol``, or None."""
    # Integrality is the rounding's to impose (reconstruct(integer=...)), not the solve's.
    rows = [r for r in problem.constraints.residuals(x, tol=tol)
            if not r["satisfied"] and not r["constraint"].startswith("integer:")]
    if not rows:
        return None
    worst = max(rows, key=lambda r: r["max_violation"])
    return worst["constraint"], float(worst["max_violation"])


def polish_equalities(problem: ConsistencyProblem, x: np.ndarray) -> np.ndarray | None:
    """The smallest change of ``x``'s positive free cells that makes every invariant hold
    exactly (a minimum-norm least-squares correction, LSQR), or None when that change would
    turn a cell negative under non-negativity or there are no invariants to polish."""
    A, b, _ = problem.constraints.equality_rows()
    if A.shape[0] == 0:
        return None
    A = sp.csr_matrix(A)
    residual = b - A @ x
    lower, upper = problem.cell_bounds()
    movable = np.flatnonzero((x > lower) & (x < upper) & (upper > lower))
    if movable.size == 0:
        return None
    sub = A[:, movable]
    delta = lsqr(sub, residual, atol=1e-15, btol=1e-15, iter_lim=10 * max(sub.shape))[0]
    out = x.copy()
    out[movable] += delta
    if problem.constraints.nonnegative and (out[movable] < lower[movable]).any():
        return None
    return out
