"""Diagonal measurements, solved cell by cell: the identity at any size, without a matrix.

When every noisy measurement is diagonal (the identity, or the identity with weighted rows)
its Gram matrix is a vector, and every objective separates into one small problem per cell,
coupled only by invariants whose rows are disjoint (a total, state totals: each cell in at
most one row). Each row ``g`` then adds one multiplier ``τ_g``, and the optimum is

    x_j(τ_g) = argmin_{lower_j ≤ x ≤ upper_j}  f_j(x) + τ_g x,        Σ_{j ∈ g} x_j(τ_g) = b_g,

with ``f_j`` the cell's part of the objective. ``x_j(τ)`` is non-increasing in ``τ``, so each
``τ_g`` is found by bisection, all rows at once (vectorised over cells); at the end the cells
of a row are interpolated between the two sides of the final bracket, which are both
minimisers of the Lagrangian at its limit, so that the row sums exactly. Memory is a few
vectors over the cells: 10^6 cells need tens of megabytes, where the general engines would
build a 10^6-row program.

Per objective, with the diagonal entries ``d``, answers ``y`` and noise ``σ`` of measurement
``k`` read as observations ``t_kj = y_kj / d_kj`` of cell ``j`` with noise ``s_kj = σ_k / |d_kj|``:

- ``l2``: ``f_j = W_j (x − ȳ_j)²`` (``W_j = Σ_k s_kj⁻²``, ``ȳ_j`` the precision-weighted mean),
  so ``x_j(τ) = clip(ȳ_j − τ / (2 W_j))``: the projection of the weighted means onto the
  constraints.
- ``entropy``: every free cell is measured, so the best fit with the total is unique and is
  the answer (the maximum-entropy choice among best fits has nothing to choose); it is the
  ``l2`` solution with the total ``N`` as one more row when no invariant fixes it.
- ``l1``: ``f_j = Σ_k |x − t_kj| / s_kj``, piecewise linear: ``x_j(τ)`` is the point where
  the subgradient crosses ``−τ`` (a weighted quantile).
- ``smooth``: ``f_j = ½ W_j (x − ȳ_j)² + λ (x log(x/p_j) − x + p_j)``; ``x_j(τ)`` solves
  ``W_j (x − ȳ_j) + λ log(x/p_j) + τ = 0`` by Newton's method on ``log x`` (monotone from an
  upper bound: the function is convex and increasing).
- ``linf``: ``min β`` with ``|x_j − t_kj| ≤ β s_kj``: feasibility is monotone in ``β``, so ``β``
  is found by bisection; the cells take the points of their intervals that meet the rows.

**Certificates.** For ``l2``, ``entropy`` and ``smooth`` the gradient of the objective is
computed at ``x`` from the measurements, each row's multiplier is fitted from its interior
cells (independently of the bisection), and the KKT conditions are checked on every cell.
For ``l1`` the Lagrangian dual value at the final multipliers bounds the optimum from below
(weak duality) and the gap is checked; for ``linf`` the last infeasible ``β`` bounds it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from dpopt.estimate.problem import ConsistencyProblem, diagonal_of
from dpopt.estimate.result import Result, make_result
from dpopt.estimate.status import Status
from dpopt.estimate.certificates.verify import CERTIFICATE_TOL

__all__ = ["diagonal_of", "separable_applies", "solve_separable"]

#: Objectives the separable path solves.
SEPARABLE_OBJECTIVES = ("l2", "l1", "linf", "entropy", "smooth")
#: Bisection steps (a bracket of any width in double precision closes well within this).
BISECTION_STEPS = 200


def row_groups(problem: ConsistencyProblem):
    """``(group of each cell or −1, row targets)`` when the invariants' rows are disjoint 0/1
    rows (each cell in at most one row overall), else None."""
    n = problem.num_cells
    group = np.full(n, -1, dtype=np.int64)
    targets = []
    for inv in problem.constraints.invariants:
        q = inv.query
        if not q.is_integer:
            return None
        coverage = q.rmatvec(np.ones(q.num_rows))
        if not (np.allclose(coverage, q.column_norm_powers(1)) and np.allclose(q.column_norm_powers(1),
                                                                              q.column_norm_powers(2))):
            return None
        if np.any(coverage > 1 + 1e-12):
            return None
        labels = q.rmatvec(np.arange(q.num_rows, dtype=np.float64) + 1.0)  # row index + 1 on covered cells
        covered = coverage > 0.5
        if np.any(group[covered] >= 0):
            return None  # overlapping invariants: not separable
        group[covered] = len(targets) + np.rint(labels[covered]).astype(np.int64) - 1
        targets.extend(np.asarray(inv.values, dtype=np.float64))
    return group, np.asarray(targets, dtype=np.float64)


def separable_applies(problem: ConsistencyProblem) -> bool:
    """Every noisy measurement diagonal, every free cell measured, no inequalities, disjoint invariants."""
    if problem.objective not in SEPARABLE_OBJECTIVES or not problem.noisy or problem.constraints.inequalities:
        return False
    diagonals = [diagonal_of(m.query) for m in problem.noisy]
    if any(d is None for d in diagonals):
        return False
    free = problem.free_cells()
    measured = np.zeros(problem.num_cells, dtype=bool)
    for d in diagonals:
        measured |= d != 0
    if not measured[free].all():
        return False
    groups = row_groups(problem)
    if groups is None:
        return False
    # For entropy the total is one more row: it must not cross the invariants' rows.
    return not (problem.objective == "entropy" and problem.constraints.invariants and (groups[0][free] < 0).any())


@dataclass
class _Cells:
    """The observations of the free cells: ``t`` (K, n) values, ``s`` (K, n) noise (inf where unobserved)."""

    t: np.ndarray
    s: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    group: np.ndarray  # row of each free cell, −1 for none
    targets: np.ndarray

    @property
    def precision(self) -> np.ndarray:
        return np.sum(1.0 / self.s**2, axis=0)

    @property
    def mean(self) -> np.ndarray:
        w = 1.0 / self.s**2
        return np.sum(np.where(np.isfinite(self.t), self.t, 0.0) * w, axis=0) / np.sum(w, axis=0)


def _cells(problem: ConsistencyProblem, free: np.ndarray, extra_total: float | None) -> _Cells:
    t, s = [], []
    for m in problem.noisy:
        d = diagonal_of(m.query)[free]
        observed = d != 0
        safe = np.where(observed, d, 1.0)
        t.append(np.where(observed, m.values[free] / safe, 0.0))
        s.append(np.where(observed, m.stddev / np.abs(safe), np.inf))
    lower, upper = problem.cell_bounds()
    group, targets = row_groups(problem)
    group = group[free]
    if extra_total is not None:
        group = np.zeros(free.size, dtype=np.int64)
        targets = np.array([extra_total])
    return _Cells(np.array(t), np.array(s), lower[free], upper[free], group, targets)


def solve_separable(problem: ConsistencyProblem, time_limit: float | None = None) -> Result:
    """Solve a problem for which :func:`separable_applies` holds (module notes)."""
    start = time.perf_counter()
    free = problem.free_cells()
    extra_total = None
    if problem.objective == "entropy":
        total = problem.positive_total("entropy")  # the entropy engine's own refusal, not an uncertified point
        if not problem.constraints.invariants:
            extra_total = total
    if problem.objective == "smooth":
        from dpopt.estimate.engines.smooth import held_total

        extra_total = held_total(problem, "estimate")
    cells = _cells(problem, free, extra_total)
    objective = problem.objective
    info: dict = {"method": "separable (diagonal measurements)", "cells": int(free.size),
                  "rows": int(cells.targets.size)}
    if objective in ("l2", "entropy"):
        v, certificate = _quadratic(cells)
    elif objective == "smooth":
        from dpopt.estimate.engines.smooth import STEPS, default_smoothing, prior_total, relative_entropy, smooth_weight

        # The smooth engine's defaults: STEPS proximal steps from the uniform prior (its module notes).
        c = default_smoothing(STEPS)
        lam = smooth_weight(problem, c)
        total = prior_total(problem)
        first = previous = np.full(free.size, total / free.size)
        for step in range(STEPS):
            v, certificate = _smooth(cells, lam, previous)
            if step == STEPS - 1 or not (v > 0).all():
                break
            previous = v  # the next step's prior: this step's optimum
        positive = bool((v > 0).all())
        info.update({"lambda": lam, "smoothing": c, "steps": STEPS, "held_total": extra_total,
                     "prior_total": float(total), "full_support": positive,
                     "smallest_cell": float(v.min(initial=np.inf)),
                     "kl_to_prior": relative_entropy(v, first) if positive else float("inf"),
                     "kl_to_previous": relative_entropy(v, previous) if positive else float("inf")})
    elif objective == "l1":
        v, certificate = _l1(cells)
    else:
        v, certificate = _linf(cells)
    info["certificate"] = certificate
    x = np.zeros(problem.num_cells)
    x[free] = v
    ok = certificate["residual"] <= CERTIFICATE_TOL
    status = Status.OPTIMAL if ok else Status.NUMERICAL_ERROR
    message = (f"solved cell by cell ({free.size} cells, {cells.targets.size} invariant rows); certificate "
               f"{certificate['what']} {certificate['residual']:.1e}")
    if not ok:
        message += f" above the tolerance {CERTIFICATE_TOL:g}"
    fun = None
    if objective == "smooth":
        r = (problem.stacked_operator().matvec(x) - problem.targets()) / problem.sigmas()
        info["chi2"] = float(r @ r)
        fun = 0.5 * info["chi2"] + info["lambda"] * info["kl_to_previous"]
    return make_result(status, x, message=message, fun=fun, objective=objective, backend="separable",
                       solver="dpopt cell-by-cell (diagonal measurements)", time=time.perf_counter() - start,
                       nit=certificate.get("steps"), problem=problem, info=info, incumbent=not ok)


# ---- the rows' multipliers ----------------------------------------------------------------------
def _solve_rows(x_of_tau, cells: _Cells, scale: float, breakpoints: np.ndarray | None = None, slope=None):
    """``x`` with every row ``g`` summing to its target, ``x_j = x_j(τ_g)``, and ``τ`` (one per row).

    ``x_of_tau(tau_per_cell)`` is non-increasing in each cell's ``τ``; cells in no row use
    ``τ = 0``. First each row's bracket ``[lo, hi]`` is widened until ``Σ x(lo) ≥ b ≥ Σ x(hi)``.
    With ``breakpoints`` (shape ``(P, n)``: the ``τ`` where a cell's ``x_j(τ)`` changes formula,
    for the piecewise-linear ``l2`` and the step functions of ``l1``) each row's sorted
    breakpoints are searched by bisection, and on the final segment, where every cell is linear
    (or constant, with the jump of the ``l1`` cells at its end), the row is interpolated exactly.
    Otherwise (a smooth ``x(τ)``, with ``slope(x)`` = ``dx_j/dτ``) Newton's method on each row's
    sum, safeguarded by the bracket. Returns ``(x, tau, steps)``.
    """
    g = cells.group
    rows = cells.targets.size
    in_row = g >= 0
    if rows == 0:
        return x_of_tau(np.zeros(g.size)), np.zeros(0), 0
    cell_row = np.maximum(g, 0)

    def sums(tau_rows):
        x = x_of_tau(np.where(in_row, tau_rows[cell_row], 0.0))
        return x, np.bincount(g[in_row], weights=x[in_row], minlength=rows)

    b = cells.targets
    lo, hi = np.full(rows, -scale), np.full(rows, scale)
    x_lo, s_lo = sums(lo)
    x_hi, s_hi = sums(hi)
    for _ in range(BISECTION_STEPS):  # widen until Σx(lo) ≥ b ≥ Σx(hi) for every row
        low_bad, high_bad = s_lo < b, s_hi > b
        if not (low_bad.any() or high_bad.any()):
            break
        lo, hi = np.where(low_bad, 2.0 * lo, lo), np.where(high_bad, 2.0 * hi, hi)
        x_lo, s_lo = sums(lo)
        x_hi, s_hi = sums(hi)
    if breakpoints is None:
        return _newton_rows(x_of_tau, slope, sums, cells, lo, hi)
    # Every row's breakpoints inside its bracket, sorted, with the bracket's ends as sentinels.
    row_of = np.broadcast_to(g, breakpoints.shape)
    keep = (row_of >= 0) & np.isfinite(breakpoints)
    keep &= (breakpoints > lo[np.maximum(row_of, 0)]) & (breakpoints < hi[np.maximum(row_of, 0)])
    cand_row = np.concatenate([row_of[keep], np.arange(rows), np.arange(rows)])
    cand_tau = np.concatenate([breakpoints[keep], lo, hi])
    order = np.lexsort((cand_tau, cand_row))
    cand_row, cand_tau = cand_row[order], cand_tau[order]
    distinct = np.concatenate([[True], (np.diff(cand_row) != 0) | (np.diff(cand_tau) != 0)])
    cand_row, cand_tau = cand_row[distinct], cand_tau[distinct]
    counts = np.bincount(cand_row, minlength=rows)
    i_lo = np.concatenate([[0], np.cumsum(counts)[:-1]])
    i_hi = i_lo + counts - 1
    steps = 0
    while True:
        open_rows = i_hi - i_lo > 1
        if not open_rows.any():
            break
        steps += 1
        i_mid = np.where(open_rows, (i_lo + i_hi) // 2, i_lo)
        x_mid, s_mid = sums(cand_tau[i_mid])
        above = open_rows & (s_mid >= b)
        below = open_rows & ~above
        i_lo, s_lo = np.where(above, i_mid, i_lo), np.where(above, s_mid, s_lo)
        i_hi, s_hi = np.where(below, i_mid, i_hi), np.where(below, s_mid, s_hi)
        x_lo = np.where(above[cell_row] & in_row, x_mid, x_lo)
        x_hi = np.where(below[cell_row] & in_row, x_mid, x_hi)
    # On the final segment every cell is linear in τ (l2) or jumps only at its end (l1): the
    # interpolation between its two ends is the exact solution, and minimises the Lagrangian.
    width = s_lo - s_hi
    theta = np.clip(np.where(width > 0, (b - s_hi) / np.where(width > 0, width, 1.0), 0.0), 0.0, 1.0)
    t = np.where(in_row, theta[cell_row], 0.0)
    x = np.where(in_row, x_hi + t * (x_lo - x_hi), x_hi)
    # The multiplier: the segment's upper end, where the l1 cells jump (a minimiser of the
    # Lagrangian there is any point between the ends, so the bound of weak duality is tight).
    return x, cand_tau[i_hi], steps


def _newton_rows(x_of_tau, slope, sums, cells: _Cells, lo, hi, tol: float = 1e-13):
    """Newton's method on each row's sum ``Σ x(τ) − b`` (decreasing in ``τ``), kept in its bracket."""
    g = cells.group
    in_row = g >= 0
    cell_row = np.maximum(g, 0)
    b = cells.targets
    tau = np.clip(np.zeros_like(lo), lo, hi)
    steps = 0
    for steps in range(1, BISECTION_STEPS + 1):
        x, s = sums(tau)
        excess = s - b
        if np.all(np.abs(excess) <= tol * np.maximum(1.0, np.abs(b))):
            break
        lo = np.where(excess > 0, tau, lo)  # the sum is too large: τ must rise
        hi = np.where(excess < 0, tau, hi)
        derivative = np.bincount(g[in_row], weights=slope(x)[in_row], minlength=b.size)
        with np.errstate(divide="ignore", invalid="ignore"):
            newton = tau - excess / derivative
        inside = np.isfinite(newton) & (newton > lo) & (newton < hi)
        tau = np.where(inside, newton, 0.5 * (lo + hi))
    else:
        x, _ = sums(tau)
    del cell_row
    return x, tau, steps


def _kkt(gradient: np.ndarray, x: np.ndarray, cells: _Cells, what: str, steps: int, scale: float = 0.0) -> dict:
    """Relative KKT residual: each row's multiplier fitted as the median of ``−gradient`` over its
    cells strictly inside their bounds; then stationarity inside, the right sign at the bounds.
    ``scale``: the size of the objective's gradient terms (at an exact fit the gradient is 0)."""
    g = cells.group
    rows = cells.targets.size
    scale = max(float(np.abs(gradient).max(initial=0.0)), scale, 1e-300)
    width = 1.0 + float(np.abs(x).max(initial=0.0))
    inside = (x - cells.lower > 1e-9 * width) & (cells.upper - x > 1e-9 * width)
    tau = -_row_medians(gradient, np.where(inside, g, -1), rows)
    reduced = gradient + (np.where(g >= 0, tau[np.maximum(g, 0)], 0.0) if rows else 0.0)
    scale = max(scale, float(np.abs(tau).max(initial=0.0)))
    violation = np.where(inside, np.abs(reduced), 0.0)
    violation = np.maximum(violation, np.where(~inside & (x - cells.lower <= 1e-9 * width), -reduced, 0.0))
    violation = np.maximum(violation, np.where(~inside & (cells.upper - x <= 1e-9 * width), reduced, 0.0))
    row_error = 0.0
    if rows:
        sums = np.bincount(g[g >= 0], weights=x[g >= 0], minlength=rows)
        row_error = float(np.max(np.abs(sums - cells.targets) / np.maximum(1.0, np.abs(cells.targets))))
    return {"what": what, "residual": max(float(violation.max(initial=0.0)) / scale, row_error), "steps": steps}


def _row_medians(values: np.ndarray, group: np.ndarray, rows: int) -> np.ndarray:
    """The (lower) median of ``values`` over the cells of each row (0 for a row without cells)."""
    out = np.zeros(rows)
    keep = group >= 0
    if rows == 0 or not keep.any():
        return out
    g, v = group[keep], values[keep]
    order = np.lexsort((v, g))
    g, v = g[order], v[order]
    counts = np.bincount(g, minlength=rows)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    has = counts > 0
    out[has] = v[starts[has] + (counts[has] - 1) // 2]
    return out


# ---- per objective -------------------------------------------------------------------------------
def _quadratic(cells: _Cells):
    W, mean = cells.precision, cells.mean
    # x_j(τ) = clip(m_j − τ/(2 W_j)) changes formula where it meets a bound.
    breakpoints = np.vstack([2.0 * W * (mean - cells.lower), 2.0 * W * (mean - cells.upper)])
    x, _, steps = _solve_rows(lambda tau: np.clip(mean - tau / (2.0 * W), cells.lower, cells.upper), cells,
                              scale=2.0 * float(np.max(W * (np.abs(mean) + 1.0))), breakpoints=breakpoints)
    return x, _kkt(2.0 * W * (x - mean), x, cells, "KKT residual", steps,
                   scale=2.0 * float(np.max(W * np.abs(mean), initial=0.0)))


def _smooth(cells: _Cells, lam: float, prior: np.ndarray):
    W, mean = cells.precision, cells.mean
    log_p = np.log(prior)
    state = {"u": None}

    def x_of_tau(tau):
        # W e^u + λ u = r, convex and increasing in u = log x: Newton from an upper bound decreases
        # monotonically to the root (u* ≤ log(r/W) when r ≥ W, u* ≤ min(0, r/λ) otherwise).
        r = W * mean - tau + lam * log_p
        with np.errstate(divide="ignore", invalid="ignore"):
            upper = np.where(r >= W, np.log(np.maximum(r, 1e-300) / W), np.minimum(0.0, r / lam))
        u = upper if state["u"] is None else np.minimum(upper, np.maximum(state["u"], r / lam - 50.0))
        u = np.where(W * np.exp(np.minimum(u, 700.0)) + lam * u - r >= 0, u, upper)
        for _ in range(200):
            e = np.exp(np.minimum(u, 700.0))
            f = W * e + lam * u - r
            step = f / (W * e + lam)
            u = u - step
            if np.all(np.abs(step) <= 1e-13 * np.maximum(1.0, np.abs(u))):
                break
        state["u"] = u
        return np.exp(u)

    x, _, steps = _solve_rows(x_of_tau, cells, scale=float(np.max(W * (np.abs(mean) + 1.0))) + lam * 50.0,
                              slope=lambda x: -x / (W * x + lam))  # dx/dτ from W(x − m) + λ log(x/p) + τ = 0
    with np.errstate(divide="ignore"):
        gradient = W * (x - mean) + lam * (np.log(x) - log_p)
    # Every cell is inside its bounds (x > 0): the KKT check is stationarity with the rows' multipliers.
    free_cells = _Cells(cells.t, cells.s, np.full(x.size, -np.inf), np.full(x.size, np.inf), cells.group,
                        cells.targets)
    return x, _kkt(gradient, x, free_cells, "KKT residual", steps,
                   scale=float(np.max(W * np.abs(mean) + lam * np.abs(np.log(x) - log_p), initial=0.0)))


def _l1(cells: _Cells):
    order = np.argsort(cells.t, axis=0, kind="stable")
    t = np.take_along_axis(cells.t, order, axis=0)
    a = np.take_along_axis(1.0 / cells.s, order, axis=0)  # weights 1/s (0 where unobserved)
    A = a.sum(axis=0)
    # D[k] = slope on (t_k, t_{k+1}): Σ_{l<k} a_l − Σ_{l≥k} a_l, k = 0..K
    cum = np.vstack([np.zeros((1, t.shape[1])), np.cumsum(a, axis=0)])
    D = 2.0 * cum - A
    finite_t = np.where(a > 0, t, np.nan)
    cap = 2.0 * (np.abs(cells.targets).sum() + np.nanmax(np.abs(finite_t), axis=0, initial=0.0) + 1.0)
    K = t.shape[0]

    def x_of_tau(tau):
        count = np.sum(D + tau < 0, axis=0)  # slopes still negative: the minimiser is t_count
        inner = np.take_along_axis(t, np.clip(count - 1, 0, K - 1)[None, :], axis=0)[0]
        x = np.where(count == 0, -cap, np.where(count == K + 1, cap, inner))
        return np.clip(x, cells.lower, cells.upper)

    x, tau, steps = _solve_rows(x_of_tau, cells, scale=2.0 * float(A.max()) + 1.0, breakpoints=-D)
    # Weak duality: L(τ) = Σ_j min_x (f_j(x) + τ x) − Σ_g τ_g b_g ≤ optimum.
    g = cells.group
    tau_cell = np.where(g >= 0, tau[np.maximum(g, 0)], 0.0) if tau.size else np.zeros(x.size)
    x_dual = x_of_tau(tau_cell)

    def f(v):
        return float(np.nansum(np.where(a > 0, a * np.abs(v[None, :] - t), 0.0)))

    dual = f(x_dual) + float(tau_cell @ x_dual) - float(tau @ cells.targets)
    primal = f(x)
    gap = (primal - dual) / (1.0 + abs(primal))
    kkt = _kkt(np.zeros_like(x), x, cells, "", steps)  # row sums only (the gradient is not defined)
    return x, {"what": "relative duality gap", "residual": max(abs(gap), kkt["residual"]), "steps": steps,
               "lower_bound": dual}


def _linf(cells: _Cells):
    t, s = cells.t, cells.s
    g = cells.group
    rows = cells.targets.size
    in_row = g >= 0

    def intervals(beta):
        low = np.max(np.where(np.isfinite(s), t - beta * s, -np.inf), axis=0)
        high = np.min(np.where(np.isfinite(s), t + beta * s, np.inf), axis=0)
        return np.maximum(low, cells.lower), np.minimum(high, cells.upper)

    def feasible(beta):
        low, high = intervals(beta)
        if np.any(low > high):
            return False
        if rows:
            s_low = np.bincount(g[in_row], weights=low[in_row], minlength=rows)
            s_high = np.bincount(g[in_row], weights=high[in_row], minlength=rows)
            if np.any(s_low > cells.targets) or np.any(s_high < cells.targets):
                return False
        return True

    lo, hi = 0.0, 1.0
    while not feasible(hi):
        lo, hi = hi, 2.0 * hi
        if hi > 1e300:
            break
    steps = 0
    if feasible(0.0):
        hi = 0.0
    else:
        for steps in range(1, BISECTION_STEPS + 1):
            mid = 0.5 * (lo + hi)
            if mid <= lo or mid >= hi:
                break
            lo, hi = (lo, mid) if feasible(mid) else (mid, hi)
    low, high = intervals(hi)
    x = np.clip(cells.mean, low, high)  # cells in no row: the point of the interval nearest their mean
    if rows:
        s_low = np.bincount(g[in_row], weights=low[in_row], minlength=rows)
        s_high = np.bincount(g[in_row], weights=high[in_row], minlength=rows)
        width = s_high - s_low
        theta = np.clip(np.where(width > 0, (cells.targets - s_low) / np.where(width > 0, width, 1.0), 0.0), 0, 1)
        x = np.where(in_row, low + theta[np.maximum(g, 0)] * (high - low), x)
    achieved = float(np.max(np.where(np.isfinite(s), np.abs(x[None, :] - t) / s, 0.0)))
    gap = (achieved - lo) / max(achieved, 1e-300) if achieved > 0 else 0.0
    kkt = _kkt(np.zeros_like(x), x, cells, "", steps)
    return x, {"what": "relative gap to the last infeasible bound", "residual": max(gap, kkt["residual"]),
               "steps": steps, "lower_bound": lo}
