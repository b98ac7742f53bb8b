"""A matrix-free interior-point method for the L1 fit, used to choose columns for the simplex.

The L1 problem ``min sum_i w_i |(Q x - y)_i|`` over ``x >= 0`` is the LP

    min w.(p + q)   s.t.   Q x - p + q = y,   x, p, q >= 0.

Mehrotra's predictor-corrector method (Wright, *Primal-Dual Interior-Point Methods*, 1997,
ch. 10) solves it with normal equations ``Q diag(d) Q^T + diag(d_p + d_q)``. For Fourier
parities that ``m x m`` matrix comes from one Walsh–Hadamard transform
(:meth:`~dpopt.model.queries.base.LinearQuery.weighted_gram`), so an iteration over 2^16
cells and 697 coefficients costs a few transforms and one Cholesky factorisation. HiGHS
instead works on the dense ``697 x 65,536`` matrix and needs thousands of simplex pivots.

The interior point does not stand as the answer. It converges to the analytic centre of
the optimal face, where the face's cells hold values far above the others (which shrink
like ``mu / s_j``). Those cells become column generation's first master, and HiGHS then
solves the LP and certifies it by pricing every cell (:func:`dpopt.estimate.engines.linear.solve_linear`,
``initial="interior"``).
"""

from __future__ import annotations

import numpy as np
import scipy.linalg as la

from dpopt.estimate.engines.exact_fit import exact_fit_applies
from dpopt.estimate.problem import ConsistencyProblem


def l1_interior_columns(problem: ConsistencyProblem, limit: int, max_iter: int = 80,
                        tol: float = 1e-7) -> np.ndarray | None:
    """Up to ``limit`` free cells most likely in an L1-optimal basis, or None when the method
    does not apply (see :func:`dpopt.estimate.engines.exact_fit.exact_fit_applies`) or does not converge."""
    if not exact_fit_applies(problem):
        return None
    m = problem.noisy[0]
    query, y = m.query, np.asarray(m.values, dtype=np.float64)
    w = 1.0 / np.full(y.size, m.stddev)
    free = problem.free_cells()
    n = problem.num_cells

    def Qx(x):
        full = np.zeros(n)
        full[free] = x
        return query.matvec(full)

    def QTu(u):
        return query.rmatvec(u)[free]

    def gram(d):
        full = np.zeros(n)
        full[free] = d
        return query.weighted_gram(full)

    scale = max(1.0, float(np.abs(y).max()))
    x = np.full(free.size, scale / free.size)
    r0 = y - Qx(x)
    p, q = np.maximum(-r0, 0.0) + 1.0, np.maximum(r0, 0.0) + 1.0  # Q x - p + q = y
    u = np.zeros(y.size)
    sx = np.full(free.size, float(w.mean()))
    sp_, sq = w.copy(), w.copy()
    total = 2 * y.size + free.size
    for _ in range(max_iter):
        rb = y - (Qx(x) - p + q)
        rx, rp, rq = -QTu(u) - sx, w + u - sp_, w - u - sq
        gap = float(x @ sx + p @ sp_ + q @ sq)
        primal, dual = float(w @ (p + q)), float(y @ u)
        if (np.linalg.norm(rb) <= tol * (1 + np.linalg.norm(y))
                and max(np.abs(rx).max(), np.abs(rp).max(), np.abs(rq).max()) <= tol * (1 + w.max())
                and abs(primal - dual) <= tol * (1 + abs(primal))):
            # The analytic centre of the optimal face: its cells carry x well above the
            # complementary ones (x_j ~ mu / s_j there).
            keep = np.flatnonzero(x >= 1e-4 * x.max())
            keep = keep[np.argsort(-x[keep], kind="stable")][:limit]
            return np.sort(free[keep])
        mu = gap / total
        dx_, dp_, dq_ = x / sx, p / sp_, q / sq
        try:
            factor = la.cho_factor(gram(dx_) + np.diag(dp_ + dq_))
        except la.LinAlgError:
            return None

        def direction(cx, cp, cq):
            # Normal equations for A dz = rb, A^T du + ds = rc, S dz + Z ds = c (Wright, ch. 10)
            rhs = rb - (Qx(cx / sx) - cp / sp_ + cq / sq) + (Qx(dx_ * rx) - dp_ * rp + dq_ * rq)
            du = la.cho_solve(factor, rhs)
            dsx, dsp, dsq = rx - QTu(du), rp + du, rq - du
            return (cx - x * dsx) / sx, (cp - p * dsp) / sp_, (cq - q * dsq) / sq, du, dsx, dsp, dsq

        aff = direction(-x * sx, -p * sp_, -q * sq)
        a_p = _step_to_boundary((x, p, q), aff[:3])
        a_d = _step_to_boundary((sx, sp_, sq), aff[4:])
        gap_aff = float((x + a_p * aff[0]) @ (sx + a_d * aff[4]) + (p + a_p * aff[1]) @ (sp_ + a_d * aff[5])
                        + (q + a_p * aff[2]) @ (sq + a_d * aff[6]))
        sigma = (gap_aff / gap) ** 3
        step = direction(-x * sx - aff[0] * aff[4] + sigma * mu, -p * sp_ - aff[1] * aff[5] + sigma * mu,
                         -q * sq - aff[2] * aff[6] + sigma * mu)
        a_p = min(1.0, 0.99 * _step_to_boundary((x, p, q), step[:3]))
        a_d = min(1.0, 0.99 * _step_to_boundary((sx, sp_, sq), step[4:]))
        x, p, q = x + a_p * step[0], p + a_p * step[1], q + a_p * step[2]
        u = u + a_d * step[3]
        sx, sp_, sq = sx + a_d * step[4], sp_ + a_d * step[5], sq + a_d * step[6]
    return None


def _step_to_boundary(values, steps) -> float:
    """The largest ``a <= 1`` keeping every ``v + a dv`` non-negative (the step to the boundary)."""
    a = 1.0
    for v, dv in zip(values, steps):
        neg = dv < 0
        if neg.any():
            a = min(a, float(np.min(-v[neg] / dv[neg])))
    return a


__all__ = ["l1_interior_columns"]
