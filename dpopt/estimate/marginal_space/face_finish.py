"""A feasible point on the dual's active face, for the certificate of a large projection (issue 27).

The certificate of :mod:`~dpopt.estimate.marginal_space.projection` pairs multipliers ``kappa``
with a feasible primal point. For *any* feasible ``r'`` the absolute gap against ``kappa`` is,
exactly (``F`` is quadratic and its gradient at ``r = r(kappa)`` is ``E^T kappa``),

    F(r') - g(kappa) = <kappa, E r'> + 1/2 ||r' - r(kappa)||²_W .                          (7)

The repair (:func:`~dpopt.estimate.marginal_space.projection.repair`) takes ``r'`` on the
segment towards a uniform interior point; on adult's large sparse triples that segment is far
from the data, and its cost dominates (7) by orders of magnitude: on a 6-attribute slice (489 k
cells) the augmented Lagrangian's point had ``<kappa, mu> = -194`` but a repair costing 42,930,
21 % of ``F``, because the most negative cell (-0.012) sits in a marginal whose uniform cells
hold 0.06 each. A point with ``E r' = 0`` wherever ``kappa > 0`` makes the first term of (7)
vanish, and the second is *second order* in the distance from ``r(kappa)`` to the face.

:func:`face_finish` finds one: with ``A`` the cells where ``kappa > 0`` or the marginal is
negative (and the structural zeros), it solves the least-norm problem
``E_A W^-1/2 y = -mu_A`` by LSQR (Paige and Saunders 1982; scipy's implementation) and moves
``r' = r + W^-1/2 y``: the projection of ``r(kappa)`` in the objective's own metric onto the
face's affine set ``{E_A r' = 0}``. Since ``r(kappa) = r^ + W^-1 E^T kappa``, that projection
is ``r^ + W^-1 E_A^T nu`` with ``E_A r' = 0``: the minimiser of (4) on the face itself (the
equality-constrained problem), whatever the accuracy of ``kappa``. Its conditioning is that of
``E_A W^-1/2``; ``E^T E = D`` is diagonal (layout notes), so before the row restriction its
singular values are ``sqrt(D / W)`` (one value when every marginal has the same noise, as under
zCDP with an even split). Each LSQR step is one :meth:`expand` and one :meth:`adjoint`. Cells
outside ``A`` that the move pushes below zero join ``A`` and the solve is repeated from the new
point (a finite active-set step); fixed residuals never move. The point then goes through the
repair for what is left (at most the feasibility tolerance's order) and the gap is computed by
the projection's own formula, (7): nothing is certified that the certificate would not.

On the 6-attribute slice (zCDP eps 1, 20 triples; ``bench_alm_overhead.py --attrs age
education-num marital-status occupation race capital-loss --products 4000``), from the augmented
Lagrangian's point after 1,470 products (repair-only gap 3.3e-3) the finish reached 8.8e-5 in
903 products (three faces, cells still negative); from its point after 2,202 products (gap
6.2e-4) it certified, gap 9.6e-8, in 602.
"""

from __future__ import annotations

import os
import time

import numpy as np
from scipy.sparse.linalg import LinearOperator, lsqr

__all__ = ["face_finish", "FINISH_STEPS", "FINISH_ROUNDS"]

#: LSQR steps per round, and rounds (faces) at most.
FINISH_STEPS = 300
FINISH_ROUNDS = 3


#: "lsqr" (least-norm step only) or "craig" (CG on the normal equations of the second kind, which
#: also gives the face multipliers ``lam``, y = B^T lam; the point is then certified against
#: ``nu = kappa + lam`` as well). Experiment of issue 27 (stream s27c2).
FINISH_SOLVER = os.environ.get("DPOPT_FINISH_SOLVER", "lsqr")
FINISH_TRACE = bool(os.environ.get("DPOPT_FINISH_TRACE"))


class _Late(Exception):
    pass


def _craig(matvec, rmatvec, b, steps):
    """CG on ``B B^T lam = b`` (Craig's method, CGNE; Hestenes and Stiefel 1952, Craig 1955):
    returns ``y = B^T lam``, the least-norm solution of ``B y = b`` in exact arithmetic, and ``lam``.
    One ``matvec`` and one ``rmatvec`` per step; stops at ``|b - B y| <= 1e-14 |b|``."""
    lam = np.zeros_like(b)
    res = b.copy()
    p = res.copy()
    y = None
    rr = float(res @ res)
    stop = (1e-14 * np.sqrt(rr)) ** 2
    for _ in range(steps):
        if rr <= stop:
            break
        q = rmatvec(p)
        qq = float(q @ q)
        if qq == 0.0:
            break
        alpha = rr / qq
        lam += alpha * p
        y = alpha * q if y is None else y + alpha * q
        res -= alpha * matvec(q)
        rr, old = float(res @ res), rr
        p = res + (rr / old) * p
    if y is None:
        y = rmatvec(np.zeros_like(b))
    return y, lam


def face_finish(problem, kappa: np.ndarray, r: np.ndarray, mu: np.ndarray, *, steps: int = FINISH_STEPS,
                rounds: int = FINISH_ROUNDS, deadline: float | None = None, stop_gap: float = 0.0,
                feasibility: float = 0.0) -> tuple[tuple | None, int]:
    """Primal points on the active face of ``kappa`` (module notes), each certified against ``kappa``.

    ``r = r(kappa)`` and ``mu = E r``. Returns the best certified point (the tuple of
    :func:`~dpopt.estimate.marginal_space.projection.certify_at`), or None when no round
    completed, and the number of products made (an ``expand`` and an ``adjoint`` make one).
    Stops after ``rounds`` faces, at a certified point (gap within ``stop_gap``, violation
    within ``feasibility``), when a round leaves no cell negative, or at ``deadline``
    (``time.perf_counter()``; a round then in progress is dropped).
    """
    from dpopt.estimate.marginal_space.projection import _better, certify_at, certify_with

    rounds = int(os.environ.get("DPOPT_FINISH_ROUNDS", rounds))
    if FINISH_SOLVER == "pdas":
        return pdas_finish(problem, kappa, r, mu, steps=steps, rounds=rounds,
                           deadline=deadline, stop_gap=stop_gap, feasibility=feasibility)
    fam = problem.cliques
    zeros = problem.zero_cells
    scale = np.sqrt(problem.inv_w_flat)  # W^-1/2, 0 on fixed residuals
    products = 0
    x, m = r, mu
    best = None
    full = np.zeros(fam.size)
    total = np.zeros(fam.size)
    for _ in range(rounds):
        face = (kappa > 0) | (m < 0) if problem.nonnegative else np.zeros(fam.size, dtype=bool)
        if zeros is not None:
            face |= zeros
        rows = np.flatnonzero(face)
        if rows.size == 0:
            break

        def matvec(z):
            nonlocal products
            if deadline is not None and time.perf_counter() > deadline:
                raise _Late
            products += 1
            return fam.expand(scale * np.ravel(z))[rows]

        def rmatvec(v):
            full[...] = 0.0
            full[rows] = np.ravel(v)
            return scale * fam.adjoint(full)

        multipliers = None
        try:
            if FINISH_SOLVER == "craig":
                z, multipliers = _craig(matvec, rmatvec, -m[rows], steps)
            else:
                operator = LinearOperator((rows.size, scale.size), matvec=matvec, rmatvec=rmatvec,
                                          dtype=np.float64)
                z = lsqr(operator, -m[rows], atol=0.0, btol=1e-14, iter_lim=steps)[0]
        except _Late:
            break
        x = x + scale * z
        m = fam.expand(x)
        products += 1
        point = certify_with(problem, kappa, r, mu, x, m)
        if best is None or _better(point, best, feasibility):
            best = point
        if FINISH_TRACE and multipliers is None:
            print(f"    lsqr round: rows {rows.size}, gap {point[3]:.3g}, min Ex {float(m.min()):.3g}, "
                  f"products {products}", flush=True)
        if multipliers is not None:
            # x = r_ref + W^-1 E^T (kappa + lam) on the face: pair it with nu = kappa + lam, whose
            # own primal point it is (up to the recurrence), within the dual's bounds.
            total[rows] += multipliers  # x = r(kappa + total): every round's multipliers add up
            nu = kappa + total
            if zeros is not None:
                np.maximum(nu, 0.0, out=nu, where=~zeros)
            else:
                np.maximum(nu, 0.0, out=nu)
            r_nu = problem.residuals(nu)
            mu_nu = fam.expand(r_nu)
            products += 1
            paired = certify_with(problem, nu, r_nu, mu_nu, x, m)
            own = certify_at(problem, nu, r_nu, mu_nu)
            for candidate in (paired, own):
                if _better(candidate, best, feasibility):
                    best = candidate
            if FINISH_TRACE:
                raw = kappa[rows] + multipliers
                from dpopt.estimate.marginal_space.projection import dual_value, objective
                unrepaired = objective(problem, x) - dual_value(problem, kappa)
                unrepaired_nu = objective(problem, x) - dual_value(problem, nu)
                denominator = 1.0 + abs(point[5]) + abs(point[6])
                print(f"    unrepaired (7) gap of x: vs kappa {unrepaired / denominator:.3g}, vs nu+ "
                      f"{unrepaired_nu / denominator:.3g}; repaired {point[3]:.3g}", flush=True)
                print(f"    finish round: rows {rows.size}, kappa-gap {point[3]:.3g}, nu with x {paired[3]:.3g}, "
                      f"nu alone {own[3]:.3g}; nu<0 on {int(np.count_nonzero(raw < 0))} rows (sum "
                      f"{float(raw[raw < 0].sum()):.3g}), |x-r(nu)|max {float(np.abs(x - r_nu).max()):.3g}, "
                      f"|Ex on face|max {float(np.abs(m[rows]).max()):.3g}, min Ex {float(m.min()):.3g}, "
                      f"products {products}", flush=True)
            point = best
        if (point[4] <= feasibility and point[3] <= stop_gap) or not problem.nonnegative or \
                m.min(initial=0.0) >= 0.0:
            break
    if FINISH_SOLVER == "craig" and os.environ.get("DPOPT_FINISH_HYBRID") and best is not None and \
            (deadline is None or time.perf_counter() <= deadline) and \
            not (best[4] <= feasibility and best[3] <= stop_gap):
        # the primal side has settled: now drop the face cells whose multiplier is negative (PDAS)
        more, made = pdas_finish(problem, kappa, r, mu, steps=steps, rounds=int(os.environ["DPOPT_FINISH_HYBRID"]),
                                 deadline=deadline, stop_gap=stop_gap, feasibility=feasibility,
                                 start=(kappa + total, m))
        products += made
        if more is not None and _better(more, best, feasibility):
            best = more
    return best, products


def pdas_finish(problem, kappa: np.ndarray, r: np.ndarray, mu: np.ndarray, *, steps: int = FINISH_STEPS,
                rounds: int = FINISH_ROUNDS, deadline: float | None = None, stop_gap: float = 0.0,
                feasibility: float = 0.0, start: tuple | None = None) -> tuple[tuple | None, int]:
    """:func:`face_finish` with the face multipliers kept (experiment, issue 27, stream s27c2).

    Each round solves the face's equality problem, ``x = r_ref + W^-1 E_A^T nu_A`` with
    ``E_A x = 0``, by CGNE (:func:`_craig`), which returns ``nu_A`` with ``x`` (warm: the
    previous round's ``nu`` restricted to the new face). The next face is ``{nu > 0} ∪ {E x < 0}``
    (plus the structural zeros): a primal-dual active-set step (Hintermüller, Ito and Kunisch
    2003, SIAM J. Optim. 13(3), the semismooth Newton method for bound constraints). Each point
    is certified, by the unchanged certificate, against ``kappa`` (equation (7)) and against
    ``nu+ = max(nu, 0)`` (off the structural zeros); when the face is right ``nu >= 0``,
    ``x = r(nu)`` and the gap against ``nu`` is ``<nu, E x>`` plus the repair of what is left.
    """
    from dpopt.estimate.marginal_space.projection import _better, certify_at, certify_with

    fam = problem.cliques
    zeros = problem.zero_cells
    scale = np.sqrt(problem.inv_w_flat)
    products = 0
    best = None
    full = np.zeros(fam.size)
    nu, m = (kappa.copy(), mu) if start is None else (start[0].copy(), start[1])
    c = 1.0 / problem.lipschitz  # HIK's constant: mu moves by about L nu
    for _ in range(rounds):
        face = (nu - c * m > 0) if problem.nonnegative else np.zeros(fam.size, dtype=bool)
        if zeros is not None:
            face |= zeros
        rows = np.flatnonzero(face)
        if rows.size == 0:
            break
        nu[~face] = 0.0
        x = problem.residuals(nu)
        m = fam.expand(x)
        products += 1

        def matvec(z):
            nonlocal products
            if deadline is not None and time.perf_counter() > deadline:
                raise _Late
            products += 1
            return fam.expand(scale * np.ravel(z))[rows]

        def rmatvec(v):
            full[...] = 0.0
            full[rows] = np.ravel(v)
            return scale * fam.adjoint(full)

        try:
            z, lam = _craig(matvec, rmatvec, -m[rows], steps)
        except _Late:
            break
        x = x + scale * z
        nu[rows] += lam
        m = fam.expand(x)
        products += 1
        point = certify_with(problem, kappa, r, mu, x, m)
        if best is None or _better(point, best, feasibility):
            best = point
        plus = np.maximum(nu, 0.0) if zeros is None else np.where(zeros, nu, np.maximum(nu, 0.0))
        r_plus = problem.residuals(plus)
        mu_plus = fam.expand(r_plus)
        products += 1
        paired = certify_with(problem, plus, r_plus, mu_plus, x, m)
        own = certify_at(problem, plus, r_plus, mu_plus)
        for candidate in (paired, own):
            if _better(candidate, best, feasibility):
                best = candidate
        if FINISH_TRACE:
            negative = nu < 0 if zeros is None else (nu < 0) & ~zeros
            print(f"    pdas round: rows {rows.size}, kappa-gap {point[3]:.3g}, nu+ with x {paired[3]:.3g}, "
                  f"nu+ alone {own[3]:.3g}; nu<0 on {int(np.count_nonzero(negative))} (sum "
                  f"{float(nu[negative].sum()):.3g}), |E_A x|max {float(np.abs(m[rows]).max()):.3g}, "
                  f"min Ex {float(m.min()):.3g}, Ex<0 on {int(np.count_nonzero(m < 0))}, products {products}",
                  flush=True)
        if best[4] <= feasibility and best[3] <= stop_gap or not problem.nonnegative:
            break
    return best, products
