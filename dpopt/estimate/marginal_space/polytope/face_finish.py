"""A feasible point on the dual's active face, for the certificate of a large projection (issue 27).

The certificate of :mod:`~dpopt.estimate.marginal_space.polytope.projection` pairs multipliers ``kappa``
with a feasible primal point. For *any* feasible ``r'`` the absolute gap against ``kappa`` is,
exactly (``F`` is quadratic and its gradient at ``r = r(kappa)`` is ``E^T kappa``),

    F(r') - g(kappa) = <kappa, E r'> + 1/2 ||r' - r(kappa)||²_W .                          (7)

The repair (:func:`~dpopt.estimate.marginal_space.polytope.projection.repair`) takes ``r'`` on the
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

**The face only grows, and a ratio test from the best feasible point** (issue 27, stream s27q).
The face of a round is the previous round's face plus the cells it left negative (before, each
round took ``{kappa > 0} ∪ {m < 0}`` afresh, so a cell that one round put on the face left it
again once that round's point held it at zero: from the outer point below, four rounds of that
rule gave 1.7e-3, four of the growing face 5.2e-6). Each round's point is also reached
from the best feasible point so far (the incumbent, the augmented Lagrangian's or an earlier
round's) by :func:`ratio_step`: the longest step towards it that keeps every cell non-negative,
so no repair is needed (Moré and Toraldo 1991; the ratio test of active-set methods). The
better certified of that and the repaired point is kept. On the 6-attribute slice from the
outer point after 977 products (gap 0.019), the repaired points' gaps over the rounds were
0.876, 0.266, 2.9e-3, 5.2e-6, 5.07e-6 (flat after: the primal point is the face optimum, most
negative cell -1e-12, and what is left is ``kappa``'s own ``F - g``); the ratio step from the
incumbent was the better one only while the faces were wrong (from the outer point after 565
products, gap 0.094: 0.076 and 0.037 at rounds 2 and 3, where the repair gave 0.93 and 0.96),
and that start ended at 4.3e-5 with ``F`` 3e-5 above the optimum (the face only grows, so a
cell wrongly in it stays). The augmented Lagrangian then pairs this primal point with each later
outer step's multipliers (its module notes). From ``kappa = 0`` (``FINISH_GAP`` 1e-2) the
growing face alone certifies: the first finish, from the point after 1,470 products (gap
3.3e-3), reached 4.19e-7 in 903 products, where the old rule's three rounds reached 8.8e-5;
with the pairing off the path reached the aim (9.6e-8) after 3,706 products, with it after
3,104 (6.2e-8). The ratio step never gave the kept point on that path.

**Not enough on the 9-attribute stand-in** (84 triples, 2.34 M cells; not certified). From the
outer point after 3,025 products (gap 0.164, ``g`` = 1,024,110.5) the face's own optimum is near
the dual: ``F`` of the rounds' points 1,024,160 and 1,024,212 (300 LSQR steps) or 1,024,208 and
1,024,557 (1,200 steps), 2.4e-5 to 2.2e-4 above ``g`` relative to ``2F``. But the face holds
2.11 M of the 2.34 M cells, LSQR leaves its cells 1.3e-3 (300 steps) or 3.9e-4 (1,200 steps) off
zero, and the move pushes cells off the face to -1.6 to -4.0 (1.1 M cells negative in all,
round after round, while the face grows by 35-42 k cells). The repaired points' gaps were 0.97,
the ratio step from the incumbent went t = 6e-8 to 0.014 (gap 0.164 -> 0.157), and eight rounds
of 300 steps from the next outer point (gap 0.147) left its gap unchanged. The limit there is
the face: both the cells wrongly on it (``kappa > 0`` where the optimum is positive: the face
only grows) and the conditioning of ``E_A`` on a face of nearly every cell.

On the 6-attribute slice (zCDP eps 1, 20 triples; ``bench_alm_overhead.py --attrs age
education-num marital-status occupation race capital-loss --products 4000``), from the augmented
Lagrangian's point after 1,470 products (repair-only gap 3.3e-3) the finish reached 8.8e-5 in
903 products (three faces, cells still negative); from its point after 2,202 products (gap
6.2e-4) it certified, gap 9.6e-8, in 602.

**Tried and dropped: certifying against the face multipliers** (issue 27, stream s27c2; same
slice, products 4000, under load). CGNE (CG on ``B B^T lam = b``, Craig's method) in place of
LSQR returns ``lam`` with ``y = B^T lam``, so ``x = r(kappa + lam)``; the idea was to certify
against ``nu = kappa + lam`` and take the dual's suboptimality out of (7). It does not help:
(a) the unrepaired part of (7), ``F(x) - g(kappa)``, was already 2.6e-7 to 4.2e-7 (relative)
from the point at 3.3e-3; the finish's gap is the repair of the cells *off* the face that the
move pushes negative (most negative -0.053, -1.8e-3, -7.4e-5 over three rounds); (b) ``nu`` is
negative on 523 to 2,149 face cells (kappa > 0 where the optimum's multiplier is 0), and
``max(nu, 0)`` paired with ``x`` gave 7.3e-7 against kappa's 4.2e-7. CGNE's own iterates
certified as LSQR's do (3,712 products, gap 2.7e-8, against 3,707 and 9.6e-8). Dropping the
face cells where ``nu < 0`` (a primal-dual active-set step, Hintermüller, Ito and Kunisch 2003,
with the face ``{nu > 0} ∪ {mu < 0}`` or their ``{nu - mu / L > 0}``) diverged: gaps 0.38, 0.28,
0.016, and 0.72, 0.10, 0.091, 0.38. More rounds of this finish (8 instead of 3) from the point
at 3.3e-3: 6.6e-4, 8.8e-5, 2.3e-5, 1.2e-6, 4.5e-7, then 4.19e-7 flat (kappa's own floor), so
within 1e-6 after 3,276 products in all but never at the benchmark's 1e-7.
"""

from __future__ import annotations

import time

import numpy as np
from scipy.sparse.linalg import LinearOperator, lsqr

__all__ = ["face_finish", "ratio_step", "FINISH_STEPS", "FINISH_ROUNDS"]

#: LSQR steps per round, and rounds (faces) at most.
FINISH_STEPS = 300
FINISH_ROUNDS = 8


class _Late(Exception):
    pass


def ratio_step(problem, y: np.ndarray, my: np.ndarray, x: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The feasible point ``y + t (x - y)`` with the largest ``t`` in ``[0, 1]`` (the ratio test).

    ``y`` is feasible (``my = E y >= 0`` off the structural zeros), ``x`` a candidate with
    ``m = E x``; the step stops at the first cell that reaches zero (Moré and Toraldo 1991, the
    ratio test of active-set methods). Linear in the residuals: consistency, the fixed residuals
    and the structural zeros of both points are kept.
    """
    blocking = (m < 0) & (my > m)
    if problem.zero_cells is not None:
        blocking &= ~problem.zero_cells
    if not blocking.any():
        return x, m
    # a cell of y within the feasibility tolerance below zero blocks at once (t = 0, never t < 0)
    t = min(1.0, max(0.0, float(np.min(my[blocking] / (my[blocking] - m[blocking])))))
    return y + t * (x - y), my + t * (m - my)


def face_finish(problem, kappa: np.ndarray, r: np.ndarray, mu: np.ndarray, *, steps: int = FINISH_STEPS,
                rounds: int = FINISH_ROUNDS, deadline: float | None = None, stop_gap: float = 0.0,
                feasibility: float = 0.0, incumbent: tuple | None = None) -> tuple[tuple | None, int]:
    """Primal points on the active face of ``kappa`` (module notes), each certified against ``kappa``.

    ``r = r(kappa)`` and ``mu = E r``. ``incumbent`` is an optional certified point whose primal
    point (its first two entries) is feasible: each round's point is also reached from it by
    :func:`ratio_step`, and the better of that and the repaired point is kept (and becomes the
    incumbent). Returns the best certified point (the tuple of
    :func:`~dpopt.estimate.marginal_space.polytope.projection.certify_at`), or None when no round
    completed, and the number of products made (an ``expand`` and an ``adjoint`` make one).
    The face only grows: the cells of ``kappa > 0`` and every cell some round left negative.
    Stops after ``rounds`` faces, at a certified point (gap within ``stop_gap``, violation
    within ``feasibility``), when a round leaves no cell negative, or at ``deadline``
    (``time.perf_counter()``; a round then in progress is dropped).
    """
    from dpopt.estimate.marginal_space.polytope.projection import _better, certify_with

    fam = problem.cliques
    zeros = problem.zero_cells
    scale = np.sqrt(problem.inv_w_flat)  # W^-1/2, 0 on fixed residuals
    products = 0
    x, m = r, mu
    best = None
    feasible = incumbent if incumbent is not None and incumbent[4] <= feasibility else None
    full = np.zeros(fam.size)
    face = kappa > 0 if problem.nonnegative else np.zeros(fam.size, dtype=bool)
    if zeros is not None:
        face |= zeros
    for _ in range(rounds):
        if problem.nonnegative:
            face |= m < 0
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

        operator = LinearOperator((rows.size, scale.size), matvec=matvec, rmatvec=rmatvec, dtype=np.float64)
        try:
            z = lsqr(operator, -m[rows], atol=0.0, btol=1e-14, iter_lim=steps)[0]
        except _Late:
            break
        x = x + scale * z
        m = fam.expand(x)
        products += 1
        point = certify_with(problem, kappa, r, mu, x, m)
        if feasible is not None:
            stepped = certify_with(problem, kappa, r, mu, *ratio_step(problem, feasible[0], feasible[1], x, m))
            if _better(stepped, point, feasibility):
                point = stepped
        if best is None or _better(point, best, feasibility):
            best = point
        if point[4] <= feasibility and (feasible is None or point[5] < feasible[5]):
            feasible = point
        if (point[4] <= feasibility and point[3] <= stop_gap) or not problem.nonnegative or \
                m.min(initial=0.0) >= -feasibility:
            break
    return best, products
