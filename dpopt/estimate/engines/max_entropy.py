"""The exact entropy objective: the maximum-entropy table among the best fits.

The entropy objective asks for the table of total ``N`` that fits the measurements best
and, among all tables that fit them equally well, is closest in relative entropy to the
prior (uniform over the free cells unless one is given):

    minimise  KL(x || prior)   over   argmin { sum ((Q x - y)/sigma)^2 : x >= 0, sum x = N, x in C }.

It is the fixed point multiplicative weights converge to from the prior (Hardt, Ligett,
McSherry 2012, whose updates are entropic mirror descent on the squared loss; see
:mod:`dpopt.estimate.engines.entropy`), but mirror descent reaches boundary points only
sublinearly. Here it is computed exactly in two convex stages:

1. **The fit.** Non-negative least squares with the total as an exact equality
   (:func:`dpopt.estimate.engines.least_squares.solve_l2`). Its answers ``b* = Q x*`` are unique
   (the loss is strictly convex in ``Q x``), and so is its gradient ``g = Q^T W (Q x* - y)``.
2. **The face.** Every best fit ``x`` has ``Q x = b*`` and, by complementary slackness
   with the unique gradient, is zero wherever the reduced gradient ``g + A^T mu`` is
   positive. On the remaining cells the best fits are exactly
   ``{x >= 0 : Q x = b*, invariants}``; the minimum-KL point of that polytope is found by an
   exponential-cone program (cvxpy, on the row space of the face's columns) polished by
   Newton's method on its support, or is ``x*`` itself when the face's columns have full
   rank. Large faces (underdetermined problems) try Newton's method on the dual first,
   which converges when the optimum is interior.

Structural zeros are pinned cells; invariants join both stages as equalities.
"""

from __future__ import annotations

import time

import numpy as np
import scipy.sparse as sp

from dpopt.estimate.engines.exact_fit import MAX_EXACT_FIT_ROWS, fit_exactly, newton_dual, prior_weights
from dpopt.estimate.engines.least_squares import solve_l2
from dpopt.estimate.problem import ConsistencyProblem
from dpopt.estimate.result import Result, make_result
from dpopt.estimate.status import Status
from dpopt.model.constraints import ConstraintSet, Invariant
from dpopt.model.queries import Total
from dpopt.model.queries.fourier import FourierParity

#: Largest face (cells that some best fit may use) the exponential-cone stage takes on.
MAX_FACE_CELLS = 6000
#: Faces larger than this try Newton's method on the dual (interior optimum) first.
NEWTON_FIRST_CELLS = 2000


def exact_entropy_applies(problem: ConsistencyProblem) -> bool:
    """True when the two-stage method can solve ``problem`` (see the module notes)."""
    return bool(problem.noisy) and problem.constraints.nonnegative and not problem.constraints.inequalities


def solve_max_entropy(
    problem: ConsistencyProblem,
    total: float,
    time_limit: float | None = None,
    *,
    prior: np.ndarray | None = None,
    face_tol: float = 1e-6,
) -> Result:
    """The maximum-entropy best fit of ``problem`` with total ``total``; see the module notes.

    Parameters
    ----------
    problem : ConsistencyProblem
        Its objective is "entropy"; non-negativity is required.
    total : float
        ``N``, the table's total (an invariant when one fixes it).
    time_limit : float, optional
        Seconds for both stages together.
    prior : ndarray, optional
        Positive weights over the cells (default uniform): the reference of the KL.
    face_tol : float
        A cell is on the optimal face when its reduced gradient is at most ``face_tol``
        times the gradient's scale.

    Returns
    -------
    Result
        ``fun`` is the weighted squared residual of the fit; ``info["kl_to_prior"]`` the
        relative entropy of the table to the prior, ``info["face_cells"]`` the face size,
        ``info["fit"]`` the first stage's status and message.
    """
    start = time.perf_counter()
    free = problem.free_cells()
    shortcut = _exact_fourier_fit(problem, total, prior, free)
    if shortcut is not None:
        info = {"total": total, "face_cells": int(free.size), "kl_to_prior": _kl(shortcut.x, free, prior),
                "fit": {"status": "OPTIMAL", "message": "every measurement reproduced exactly",
                        "solver": "Newton's method on the entropy dual", "time": shortcut.time}}
        residual = problem.stacked_operator().matvec(shortcut.x) - problem.targets()
        return make_result(
            Status.OPTIMAL, shortcut.x, fun=float(np.sum(residual**2 / problem.sigmas() ** 2)), objective="entropy",
            backend="exact", solver="Newton's method on the entropy dual (exact fit)", time=time.perf_counter() - start,
            nit=shortcut.steps, problem=problem, info=info,
            message=(f"a positive table with total {total:g} reproduces every measurement ({shortcut.steps} Newton "
                     f"steps): the fit's loss is 0, every best fit is exact, and this is the one closest to the "
                     f"prior"))
    stage1 = _fit_problem(problem, total)
    fit = solve_l2(stage1, None, time_limit)
    fit_info = {"status": fit.status.name, "message": fit.message, "solver": fit.solver, "time": fit.time}
    if not fit.success:
        return make_result(fit.status, None, message=f"the least-squares fit failed: {fit.message}", fun=None,
                           objective="entropy", backend=fit.backend, solver=fit.solver,
                           time=time.perf_counter() - start, nit=fit.nit, problem=problem, info={"fit": fit_info})
    x_fit = np.zeros(problem.num_cells)
    x_fit[free] = np.maximum(fit.x[free], 0.0)
    if problem.observes_every_cell():
        # A measurement observes every free cell: the loss is strictly convex, the best fit is
        # unique, and it is the answer (no exponential-cone stage, no matrix over the cells).
        residual = problem.stacked_operator().matvec(x_fit) - problem.targets()
        return make_result(Status.OPTIMAL, x_fit, fun=float(np.sum(residual**2 / problem.sigmas() ** 2)),
                           objective="entropy", backend="exact", solver=f"fit: {fit.solver}",
                           time=time.perf_counter() - start, nit=fit.nit, problem=problem,
                           info={"total": total, "face_cells": int((x_fit > 0).sum()), "fit": fit_info,
                                 "kl_to_prior": _kl(x_fit, free, prior)},
                           message=("a measurement observes every free cell, so the least-squares fit with the "
                                    f"total is unique and is the maximum-entropy best fit ({fit.message})"))
    face, reduced = _optimal_face(stage1, x_fit, free, face_tol)
    remaining = None if time_limit is None else max(1e-3, time_limit - (time.perf_counter() - start))
    x, status, message, solver = _entropy_on_face(stage1, x_fit, face, prior, remaining)
    elapsed = time.perf_counter() - start
    info = {"total": total, "face_cells": int(face.size), "fit": fit_info,
            "smallest_reduced_gradient_off_face": float(reduced.min()) if reduced.size else 0.0}
    if x is None:
        return make_result(status, None, message=message, fun=None, objective="entropy", backend="exact",
                           solver=solver, time=elapsed, nit=fit.nit, problem=problem, info=info)
    info["kl_to_prior"] = _kl(x, free, prior)
    residual = problem.stacked_operator().matvec(x) - problem.targets()
    if not problem.constraints.invariants:
        info["duality_gap"] = simplex_gap(problem, x, free, residual)
    fun = float(np.sum(residual**2 / problem.sigmas() ** 2))
    return make_result(status, x, message=message, fun=fun, objective="entropy", backend="exact",
                       solver=f"fit: {fit.solver}; max entropy: {solver}", time=elapsed, nit=fit.nit, problem=problem, info=info)


def simplex_gap(problem: ConsistencyProblem, x: np.ndarray, free: np.ndarray,
                residual: np.ndarray | None = None) -> float:
    """Frank–Wolfe gap ``<g, x> - N min_j g_j`` of the loss over ``{x >= 0, sum x = N}``.

    For a convex loss it bounds ``loss(x) - min loss`` over that set from above, so it
    says how far an unconverged run is from the best fit with this total.
    """
    op = problem.stacked_operator()
    if residual is None:  # ``Q x - y``, when the caller has not computed it already
        residual = op.matvec(x) - problem.targets()
    gradient = op.rmatvec(2.0 * residual / problem.sigmas() ** 2)
    return float(gradient @ x - x.sum() * gradient[free].min())


def _exact_fourier_fit(problem: ConsistencyProblem, total: float, prior, free: np.ndarray):
    """Fourier coefficients with total ``N`` that some positive table reproduces exactly:
    that table, by Newton's method on the entropy dual over the parities and the total
    (:func:`dpopt.estimate.engines.exact_fit.fit_exactly`). It is the answer of both stages at once:
    the loss is 0, so the best fits are the exact fits, and it is their minimum-KL point.
    None when the measurements are not all unnormalised parities, constraints with equality
    or inequality rows are present, or no exact fit exists."""
    cs = problem.constraints
    if cs.equality_rows()[0].shape[0] or cs.inequality_rows()[0].shape[0] or not problem.noisy:
        return None
    if not all(isinstance(m.query, FourierParity) and not m.query.normalized and m.query.domain == problem.domain
               for m in problem.noisy):
        return None
    subsets = [s for m in problem.noisy for s in m.query.subsets]
    values = np.concatenate([m.values for m in problem.noisy])
    if () in subsets:
        if abs(values[subsets.index(())] - total) > 1e-9 * max(1.0, abs(total)):
            return None  # the measured total is not N: no table fits it exactly
    else:
        subsets, values = [(), *subsets], np.concatenate([[total], values])
    if len(set(subsets)) != len(subsets) or len(subsets) > MAX_EXACT_FIT_ROWS:
        return None
    return fit_exactly(FourierParity(problem.domain, subsets), values, prior_weights(problem.num_cells, free, prior))


def _fit_problem(problem: ConsistencyProblem, total: float) -> ConsistencyProblem:
    """The least-squares problem of stage 1: the same, with the total as an invariant."""
    cs = problem.constraints
    fixed = any(np.allclose(inv.query.rmatvec(np.ones(inv.query.num_rows)), 1.0) for inv in cs.invariants)
    if not fixed:
        cs = ConstraintSet(problem.domain, list(cs.constraints) + [Invariant(Total(problem.domain), [total], name="total")])
    return ConsistencyProblem(problem.noisy, cs, "l2")


def _optimal_face(stage1: ConsistencyProblem, x: np.ndarray, free: np.ndarray, face_tol: float):
    """Cells some best fit may use: the reduced gradient vanishes there (KKT)."""
    op = stage1.stacked_operator()
    w2 = 1.0 / stage1.sigmas() ** 2
    y = stage1.targets()
    gradient = op.rmatvec(w2 * (op.matvec(x) - y))
    scale = float(np.abs(op.rmatvec(w2 * y)).max()) or 1.0
    A, _, _ = stage1.constraints.equality_rows()
    A = sp.csr_matrix(A)
    positive = free[x[free] > 0]
    if A.shape[0] and positive.size:
        mu = np.linalg.lstsq(A[:, positive].toarray().T, -gradient[positive], rcond=None)[0]
        gradient = gradient + A.T @ mu
    reduced = gradient[free] / scale
    on_face = (reduced <= face_tol) | (x[free] > 0)  # the fit's own cells always belong
    return free[on_face], reduced[~on_face]


def _entropy_on_face(stage1, x_fit, face, prior, time_limit):
    """Minimum KL to the prior over ``{x >= 0 on face : Q x = Q x_fit, invariants}``."""
    A_eq, b_eq, _ = stage1.constraints.equality_rows()
    Q = sp.vstack([m.query.columns(face) for m in stage1.noisy] + [sp.csr_matrix(A_eq)[:, face]]).tocsr()
    total = float(x_fit.sum()) or 1.0
    weights = np.ones(face.size) if prior is None else np.asarray(prior, dtype=np.float64)[face]
    weights = weights / weights.sum()
    x = np.zeros(x_fit.size)
    if face.size > NEWTON_FIRST_CELLS:
        # A large face: the measurements usually leave the optimum in its interior (every cell
        # positive), where Newton's method on the dual from lam = 0 converges fast; it fails
        # on a boundary optimum, which the cone program (or the report) then deals with.
        rhs = Q @ (x_fit[face] / total)
        v = _newton_dual(Q if Q.nnz < 0.2 * Q.shape[0] * Q.shape[1] else Q.toarray(), rhs, weights,
                         np.zeros(Q.shape[0]))
        if v is None and face.size > MAX_FACE_CELLS:
            return None, Status.NOT_SOLVED, (
                f"{face.size} cells can carry a best fit, more than the {MAX_FACE_CELLS} the exponential-cone stage "
                "takes on, and Newton's method on the dual found no interior optimum; use backend 'mw' "
                "(multiplicative weights) for this problem"), "Newton on the dual"
        if v is not None:
            x[face] = v * total
            return x, Status.OPTIMAL, (
                f"maximum-entropy best fit over {face.size} candidate cells, all positive "
                "(Newton's method on the dual)"), "Newton on the dual"
    Q = Q.toarray()
    # Right-hand side from the fit itself (consistent by construction), in shares of the
    # total so that the cone program is well scaled whatever the counts.
    rhs = Q @ (x_fit[face] / total)
    # The face's equalities on their row space: independent rows, well conditioned.
    U, s, Vt = np.linalg.svd(Q, full_matrices=False)
    keep = s > 1e-10 * s[0]
    if keep.sum() == face.size:
        x[face] = x_fit[face]
        return x, Status.OPTIMAL, (
            f"the best fit is unique: its {face.size} candidate cells are pinned by the measurements"), "unique fit"
    C, d = Vt[keep], (U[:, keep].T @ rhs) / s[keep]
    x, status, message, solver = _exponential_cone(C, d, weights, x, face, time_limit)
    if x is not None:
        x *= total
    return x, status, message, solver


#: Solvers tried in turn for the exponential-cone stage (interior point first, then SCS).
CONE_SOLVERS = ("CLARABEL", "SCS")


def _exponential_cone(C, d, weights, x, face, time_limit):
    """Solve the cone program; accept an optimal solution, or an inaccurate one that Newton's
    method on its support turns into an exact stationary point; else try the next solver."""
    import warnings

    import cvxpy as cp

    attempts = []
    for name in CONE_SOLVERS:
        v = cp.Variable(face.size, nonneg=True)
        program = cp.Problem(cp.Minimize(cp.sum(cp.rel_entr(v, weights))), [C @ v == d])
        options = {} if time_limit is None else {"time_limit": float(time_limit)} if name == "CLARABEL" else \
            {"time_limit_secs": float(time_limit)}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # "may be inaccurate": judged below
                program.solve(solver=name, **options)
        except cp.SolverError as exc:  # the solver's own failure, reported with its message
            attempts.append(f"{name} failed ({exc})")
            continue
        if program.status in ("infeasible", "user_limit") or v.value is None:
            attempts.append(f"{name} ended {program.status!r}")
            status = Status.INFEASIBLE if program.status == "infeasible" else Status.TIME_LIMIT
            if program.status == "user_limit":
                return None, status, f"exponential-cone stage: {'; '.join(attempts)}", f"cvxpy/{name}"
            continue
        polished = _newton_polish(C, d, weights, np.maximum(v.value, 0.0))
        if program.status == "optimal" or polished is not None:
            x[face] = np.maximum(v.value, 0.0) if polished is None else polished
            how = "Newton-polished on its support" if polished is not None else "unpolished"
            tried = f"; before: {'; '.join(attempts)}" if attempts else ""
            return x, Status.OPTIMAL, (
                f"maximum-entropy best fit over {face.size} candidate cells (cvxpy/{name} {program.status}, "
                f"{how}{tried})"), f"cvxpy/{name}"
        attempts.append(f"{name} ended {program.status!r} and Newton's method did not converge on its support")
    return None, Status.NUMERICAL_ERROR, f"exponential-cone stage: {'; '.join(attempts)}", "cvxpy/" + "+".join(CONE_SOLVERS)


def _newton_polish(C, d, weights, v):
    """Refine an interior-point solution on its support by Newton's method on the dual.

    On the support ``S`` the optimum is ``v = w exp(C_S^T lam - 1)`` with ``C_S v = d``
    (stationarity of ``sum v log(v/w)`` under ``C v = d``); the dual is maximised from the
    least-squares fit of ``lam`` to the interior point. None when it does not converge
    (wrong support).
    """
    support = v > 1e-9 * max(float(v.max()), 1e-300)
    lam = np.linalg.lstsq(C[:, support].T, np.log(v[support] / weights[support]) + 1.0, rcond=None)[0]
    vs = _newton_dual(C[:, support], d, weights[support], lam)
    if vs is None:
        return None
    out = np.zeros_like(v)
    out[support] = vs
    return out


def _newton_dual(C, d, weights, lam, max_steps: int = 100):
    """Newton's method on the entropy dual (:func:`dpopt.estimate.engines.exact_fit.newton_dual`) for an
    explicit ``C`` (sparse or dense); the primal ``v`` once ``C v = d`` holds to 1e-11
    relative, else None. Redundant rows are fine (least-squares Newton steps)."""
    if sp.issparse(C):
        C = sp.csr_matrix(C)
        gram = lambda v: (C @ sp.diags(v) @ C.T).toarray()  # noqa: E731
    else:
        gram = lambda v: (C * v) @ C.T  # noqa: E731
    outcome = newton_dual(lambda v: np.asarray(C @ v).ravel(), lambda u: np.asarray(C.T @ u).ravel(), gram,
                          d, weights, lam, max_steps=max_steps)
    return None if outcome is None else outcome[0]


def _kl(x: np.ndarray, free: np.ndarray, prior: np.ndarray | None) -> float:
    """KL(x/N || prior/|prior|) over the free cells."""
    p = x[free] / x[free].sum()
    q = np.ones(free.size) if prior is None else np.asarray(prior, dtype=np.float64)[free]
    q = q / q.sum()
    keep = p > 0
    return float(np.sum(p[keep] * np.log(p[keep] / q[keep])))


__all__ = ["solve_max_entropy", "exact_entropy_applies", "simplex_gap", "MAX_FACE_CELLS"]
