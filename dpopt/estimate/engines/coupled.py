"""Least squares under bounds and disjoint sum rows, any measurements: the top-down parent's problem.

    minimise  ½ ‖W (M x − y)‖²   subject to  x ≥ 0 (free cells),  Σ_{j ∈ g} x_j = b_g  (disjoint rows)

This is the problem of every top-down parent below the root (Abowd et al. 2022, §6: children
add up to the parent cell by cell, each cell of the parent one row over its children) and of
any release whose invariants are disjoint 0/1 rows (a total, state totals) with non-diagonal
measurements beside an identity (the detailed table and its marginals). The lifted QP the
general L2 engine builds for it couples every child through the rows, and an interior-point
solver's factorisation grows superlinearly with the children (a parent of 110,000 cells took
28 s in Clarabel, one of 378,000 about two minutes). Here the feasible set's Euclidean
projection is cheap — per row a simplex projection (Held, Wolfe and Crowder 1974; Duchi et al.
2008), all rows at once — and the objective is strongly convex (an identity observes every
free cell), so:

1. **Start** at the minimiser on the rows alone (conjugate gradients in the rows' null space),
   projected onto the feasible set.
2. **Accelerated projected gradient** (FISTA, Beck and Teboulle 2009, Algorithm 2 with the
   gradient restart of O'Donoghue and Candès 2015, §3.2) with step ``1/L`` (``L`` the largest
   eigenvalue of ``(WM)ᵀWM`` by power iteration, with a margin; doubled if the objective ever
   rises) until the natural residual ``‖x − P(x − ∇f/L)‖∞`` is below :data:`NATURAL_TOL`
   relative. With condition number ``κ`` it converges linearly at about ``1 − 1/√κ`` per step.

**Certificate.** The returned point is checked on the KKT conditions of the full problem,
independently of how it was found (the separable engine's check): each row's multiplier
fitted from its cells strictly inside their bound, the reduced gradient zero on those cells and
non-negative on the cells at their bound, every row's sum exact — to
:data:`~dpopt.estimate.certificates.verify.CERTIFICATE_TOL` relative. A point that fails it is never
released: :func:`dpopt.estimate.reconstruct` then solves with the general engine.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from dpopt.estimate.problem import ConsistencyProblem
from dpopt.estimate.result import Result, make_result
from dpopt.estimate.engines.separable import _kkt, row_groups
from dpopt.estimate.status import Status
from dpopt.estimate.certificates.verify import CERTIFICATE_TOL, largest_eigenvalue

__all__ = ["COUPLED_MIN_CELLS", "coupled_applies", "solve_coupled"]

#: Below this many free cells the general engine's lifted QP takes well under a second (and is used).
COUPLED_MIN_CELLS = 1_000
#: Largest condition number ``L/μ`` handed to the accelerated projection (``√κ`` steps per digit).
MAX_CONDITION = 1e6
#: The natural residual (relative) at which the accelerated projection stops.
NATURAL_TOL = 1e-12
#: FISTA iterations between two checks of the natural residual.
CHECK_EVERY = 10
#: ``L`` is the power iteration's estimate (from below) times this.
LIPSCHITZ_MARGIN = 1.1
#: FISTA iterations before giving up (the certificate then decides).
MAX_ITERATIONS = 20_000
SOLVER = "dpopt accelerated projected gradient (FISTA)"


def coupled_applies(problem: ConsistencyProblem) -> bool:
    """L2; disjoint 0/1 invariant rows; non-negative free cells without upper bounds; no
    inequalities; at least :data:`COUPLED_MIN_CELLS` free cells. (Strong convexity, from rows that
    read one cell each, is checked by :func:`solve_coupled`, which leaves the problem to the
    general engine without it.)"""
    cs = problem.constraints
    if problem.objective != "l2" or not problem.noisy or cs.inequalities or not cs.invariants:
        return False
    if not cs.nonnegative:
        return False
    free = problem.free_cells()
    if free.size < COUPLED_MIN_CELLS:
        return False
    if np.isfinite(problem.cell_bounds()[1][free]).any():
        return False
    return row_groups(problem) is not None


@dataclass
class _Rows:
    """What :func:`_kkt` reads: bounds, the row of each free cell (−1: none) and the row targets."""

    lower: np.ndarray
    upper: np.ndarray
    group: np.ndarray
    targets: np.ndarray


class _Projector:
    """Euclidean projection onto ``{x ≥ l : Σ_{j ∈ g} x_j = b_g}``: per row the simplex projection
    of ``x − l`` onto ``{z ≥ 0 : Σ z = b_g − Σ l}``; cells in no row are clipped at ``l``.

    Rows of similar length are laid out in one padded array and sorted along its rows (one
    ``np.sort``, several times faster than a lexsort of the flat vector)."""

    def __init__(self, rows: _Rows) -> None:
        self.lower = rows.lower
        g = rows.group
        self.in_row = np.flatnonzero(g >= 0)
        self.loose = np.flatnonzero(g < 0)
        k = rows.targets.size
        gi = g[self.in_row]
        self.count = np.bincount(gi, minlength=k)
        self.target = rows.targets - np.bincount(gi, weights=self.lower[self.in_row], minlength=k)
        order = np.argsort(gi, kind="stable")
        starts = np.concatenate([[0], np.cumsum(self.count)[:-1]])
        position = np.empty(gi.size, dtype=np.int64)
        position[order] = np.arange(gi.size) - np.repeat(starts, self.count)
        self.width = int(self.count.max(initial=0))
        self.padded = k * self.width <= 4 * max(gi.size, 1)
        self.gi, self.col, self.rows = gi, position, k

    def __call__(self, v: np.ndarray) -> np.ndarray:
        out = np.empty_like(v)
        out[self.loose] = np.maximum(v[self.loose], self.lower[self.loose])
        if self.in_row.size:
            z = v[self.in_row] - self.lower[self.in_row]
            out[self.in_row] = self.lower[self.in_row] + self._simplex(z)
        return out

    def _simplex(self, z: np.ndarray) -> np.ndarray:
        if not self.padded:
            from dpopt.estimate.certificates.verify import project_rows

            return project_rows(z, self.gi, self.target)
        buf = np.full((self.rows, self.width), -np.inf)
        buf[self.gi, self.col] = z
        s = -np.sort(-buf, axis=1)  # descending within each row, padding last
        with np.errstate(invalid="ignore"):
            cum = np.cumsum(np.where(np.isfinite(s), s, 0.0), axis=1)
            rank = np.arange(1, self.width + 1)
            active = np.isfinite(s) & (s - (cum - self.target[:, None]) / rank > 0)
        last = np.maximum(active.sum(axis=1) - 1, 0)  # the active ranks are a prefix of each sorted row
        theta = (cum[np.arange(self.rows), last] - self.target) / (last + 1)
        theta = np.where(self.count > 0, theta, 0.0)
        return np.maximum(z - theta[self.gi], 0.0)


class _Quadratic:
    """``f(x) = ½‖A x − c‖²`` with ``A = W M`` on the free cells (sparse, or an operator)."""

    def __init__(self, A, c: np.ndarray) -> None:
        self.A, self.c = A, c
        self.AT = A.T.tocsr() if sp.issparse(A) else None
        self.scale = max(float(np.abs(self.rmatvec(c)).max(initial=0.0)), 1e-300)

    def matvec(self, v):
        return self.A @ v

    def rmatvec(self, u):
        return self.AT @ u if self.AT is not None else self.A.rmatvec(u)

    def value(self, x) -> float:
        r = self.matvec(x) - self.c
        return 0.5 * float(r @ r)

    def gradient(self, x) -> np.ndarray:
        return self.rmatvec(self.matvec(x) - self.c)

    def hess(self, v) -> np.ndarray:
        return self.rmatvec(self.matvec(v))


def solve_coupled(problem: ConsistencyProblem, time_limit: float | None = None) -> Result:
    """Solve an L2 problem for which :func:`coupled_applies` holds (see the module notes).

    Returns a :class:`~dpopt.estimate.result.Result` with ``backend="coupled"``: OPTIMAL when the
    KKT certificate holds, NUMERICAL_ERROR (an incumbent, never released) or TIME_LIMIT otherwise;
    ``info`` has the steps taken, ``L``, the strong-convexity bound ``μ`` and the certificate.
    """
    from dpopt.estimate.engines.least_squares import normalised_sigmas

    start = time.perf_counter()
    deadline = None if time_limit is None else start + float(time_limit)
    free = problem.free_cells()
    lower, upper = problem.cell_bounds()
    group, targets = row_groups(problem)
    rows = _Rows(lower[free], upper[free], group[free], targets)
    w = 1.0 / normalised_sigmas(problem)
    f = _Quadratic(sp.csr_matrix(sp.diags(w) @ problem.stacked_sparse()[:, free]), w * problem.targets())
    project = _Projector(rows)
    lipschitz = LIPSCHITZ_MARGIN * largest_eigenvalue(f.hess, free.size, steps=30)
    mu = _strong_convexity(f, free.size)
    info = {"method": "coupled (accelerated projected gradient, KKT-certified)", "cells": int(free.size),
            "rows": int(targets.size), "lipschitz": lipschitz, "strong_convexity": mu}
    counters = {"fista": 0, "cg": 0, "restarts": 0}
    if mu <= 0 or lipschitz / mu > MAX_CONDITION:
        return make_result(Status.NUMERICAL_ERROR, None, message=f"condition number {lipschitz / max(mu, 1e-300):.1e} "
                           f"above {MAX_CONDITION:g}: left to the general engine", fun=None, objective="l2",
                           backend="coupled", solver=SOLVER, time=time.perf_counter() - start, nit=0, info=info)
    x = project(_rows_minimiser(f, project(rows.lower.copy()), rows, counters))
    x, lipschitz = _fista(f, project, x, lipschitz, NATURAL_TOL, counters, deadline)
    certificate = _kkt(f.gradient(x), x, rows, "KKT residual", counters["fista"], scale=f.scale)
    if certificate["residual"] <= CERTIFICATE_TOL:
        status = Status.OPTIMAL
    elif deadline is not None and time.perf_counter() > deadline:
        status = Status.TIME_LIMIT
    else:
        status = Status.NUMERICAL_ERROR
    info.update(counters, certificate=certificate, final_lipschitz=lipschitz)
    out = np.zeros(problem.num_cells)
    out[free] = x
    message = (f"solved by accelerated projected gradient ({free.size} cells, {targets.size} rows, "
               f"{counters['cg']} CG and {counters['fista']} projected-gradient steps); KKT residual "
               f"{certificate['residual']:.1e}")
    if status is Status.NUMERICAL_ERROR:
        message += f" above the tolerance {CERTIFICATE_TOL:g}"
    elif status is Status.TIME_LIMIT:
        message = "time limit reached; " + message
    return make_result(status, out, message=message, fun=None, objective="l2", backend="coupled", solver=SOLVER,
                       time=time.perf_counter() - start, nit=counters["fista"] + counters["cg"], problem=problem,
                       info=info, incumbent=status is not Status.OPTIMAL)


def _strong_convexity(f: _Quadratic, n: int) -> float:
    """A lower bound on the smallest eigenvalue of ``AᵀA``: the squared weights of the diagonal
    rows (an identity) every free cell has, the other rows adding a positive semidefinite term."""
    A = f.A.tocsr()
    part = A[np.flatnonzero(np.diff(A.indptr) == 1)]  # rows that read one cell
    weight = np.asarray(part.multiply(part).sum(axis=0)).ravel()
    return float(weight.min()) if n else 0.0


def _rows_minimiser(f: _Quadratic, x: np.ndarray, rows: _Rows, counters: dict, tol: float = 1e-11) -> np.ndarray:
    """The minimiser of ``f`` on ``{x + d : Σ_{j ∈ g} d_j = 0 per row}`` (the bounds ignored), from
    ``x`` on the rows: conjugate gradients on the Hessian projected onto the rows' null space."""
    g, k = rows.group, rows.targets.size
    in_row = g >= 0
    count = np.bincount(g[in_row], minlength=k)

    def null(d):
        if k:
            d[in_row] -= (np.bincount(g[in_row], weights=d[in_row], minlength=k) / np.maximum(count, 1))[g[in_row]]
        return d

    x = x.copy()
    r = null(-f.gradient(x))
    p = r.copy()
    rr = float(r @ r)
    stop = (tol * f.scale) ** 2 * x.size  # about tol × scale per cell
    for _ in range(max(200, 4 * int(np.sqrt(x.size)))):
        if rr <= stop:
            break
        hp = null(f.hess(p))
        curvature = float(p @ hp)
        if curvature <= 0:
            break
        alpha = rr / curvature
        x += alpha * p
        r -= alpha * hp
        counters["cg"] += 1
        rr, previous = float(r @ r), rr
        p = r + (rr / previous) * p
    return x


def _fista(f: _Quadratic, project: _Projector, x: np.ndarray, lipschitz: float, eps: float, counters: dict,
           deadline: float | None) -> tuple[np.ndarray, float]:
    """Accelerated projected gradient with the gradient restart, until the natural residual ≤ ``eps``
    (relative to ``1 + max |x|``); ``L`` doubles when the objective rises between two checks."""
    y, t = x.copy(), 1.0
    checked = f.value(x)
    for k in range(MAX_ITERATIONS):
        if k % CHECK_EVERY == 0 and k:
            value = f.value(x)
            if value > checked * (1.0 + 1e-12) + 1e-300:  # the step was too long for L
                lipschitz *= 2.0
                counters["restarts"] += 1
                t, y = 1.0, x.copy()
            checked = min(checked, value)
            step = x - project(x - f.gradient(x) / lipschitz)
            if float(np.abs(step).max(initial=0.0)) <= eps * (1.0 + float(np.abs(x).max(initial=0.0))):
                break
            if deadline is not None and time.perf_counter() > deadline:
                break
        new = project(y - f.gradient(y) / lipschitz)
        counters["fista"] += 1
        if float((y - new) @ (new - x)) > 0:  # the momentum points uphill: restart it
            t, y = 1.0, new.copy()
            counters["restarts"] += 1
        else:
            t_next = 0.5 * (1.0 + np.sqrt(1.0 + 4.0 * t * t))
            y = new + ((t - 1.0) / t_next) * (new - x)
            t = t_next
        x = new
    return x, lipschitz
