"""The projection by the augmented Lagrangian method with semismooth Newton inner solves (issue 27).

Problem (4) of :mod:`~dpopt.estimate.marginal_space.polytope.projection`: minimise
``F(r) = 1/2 sum W (r - r^)^2`` over the free residuals subject to ``mu = E r >= 0`` (``= 0``
on structural zeros). Its dual's active-set rounds
(:func:`~dpopt.estimate.marginal_space.polytope.projection.polish`) solve ``H_AA kappa_A = -b_A`` on
faces ``A`` that, on adult's triples, hold nearly every cell (most cells of a large sparse
marginal are zero at the optimum), where ``H_AA`` is nearly singular: conjugate gradients stall,
the faces change by 10^5 cells a round and the rounds do not converge.

The augmented Lagrangian method (Hestenes 1969, Powell 1969, Rockafellar 1976: the proximal
point method on the dual) bounds that conditioning by its penalty ``rho``. With multipliers
``kappa >= 0`` it minimises over ``r``

    phi(r) = F(r) + 1/(2 rho) ||P(kappa - rho E r)||^2                                    (6)

(``P`` the projection onto the multipliers' bounds: ``max(0, .)``, identity on structural
zeros), then sets ``kappa <- P(kappa - rho E r)``. ``phi`` is convex with a semismooth gradient
``W (r - r^) - E^T P(kappa - rho E r)``; a generalised Hessian is ``W + rho E^T I_A E`` with ``A``
the cells where ``kappa - rho mu`` is inside the bounds. Scaled by ``D = E^T E`` (diagonal:
layout notes) its eigenvalues lie in ``[min W/D, max W/D + rho]``, so conjugate gradients with
the diagonal preconditioner ``W + rho D`` need ``O(sqrt(1 + rho L))`` steps whatever the face
(``L = max D / W``). Each inner step is a semismooth Newton step (the SSNAL of Zhao, Sun and
Toh 2010; Li, Sun and Toh 2018) with an exact line search: ``phi`` along a direction ``dr`` is
``F`` (a quadratic) plus a sum of one-dimensional piecewise quadratics in ``E dr``, so its
derivative is bisected with no further product. ``rho`` doubles each outer step, up to
:data:`MAX_RHO_L` ``/ L``.

At an exact inner minimiser ``W (r - r^) = E^T kappa_new``, so ``r`` is the dual's own primal
point ``r(kappa_new)``: every outer step is certified by the projection's
:func:`~dpopt.estimate.marginal_space.polytope.projection.certify_at` at ``kappa_new`` (one product),
with the same tolerances as every other path.

Once an outer point's certified gap is within :data:`FINISH_GAP`, its active face is finished
(:mod:`~dpopt.estimate.marginal_space.polytope.face_finish`): the certificate's repair towards a uniform
point, not the complementarity, is what keeps the gap large (on adult's 6-attribute slice,
<kappa, mu> = -194 against a repair costing 42,930 at one outer point), and the face's own
optimum is reached by LSQR in a few hundred products once the face is found. On that slice the
path certified (gap 9.6e-8) after 3,707 products where the outer steps alone, at their rate of
about 5x in gap for 1.5x in products (gap 6.2e-4 after 2,202), would need about 10,000 to reach
the tolerance 1e-6 (extrapolated, not run). Tried and dropped on it and on the
9-attribute stand-in: Nesterov or constant (0.5) extrapolation of the multipliers, with or
without a fixed ``rho`` (the most negative cell ended 2-4x worse for the same products); inner
solves 1000x more exact (the same outer points at 3x the products); the dual's face system by
conjugate gradients from an outer point, plain or preconditioned by the pseudo-inverse
``E D^-1 W D^-1 E^T`` (its residual did not fall: the gap went 0.92 -> 0.98); mixing towards the
product of the iterate's one-way marginals instead of the uniform point (the repair step rose
to 1: those products are near zero on the cells that are negative).

**Pairing the multipliers with the best primal point.** Weak duality holds for *any* feasible
point and *any* multipliers, so each outer step's ``kappa`` is also certified (by
:func:`~dpopt.estimate.marginal_space.polytope.projection.certify_with`, equation (7) of the face finish's
notes) against the feasible point of least ``F`` found so far, and the better certificate is
kept. On adult's slices the finish finds the primal optimum's face long before the outer steps'
``g(kappa)`` is within the tolerance: on the 6-attribute slice, from the outer point after 977
products the finish's point had ``F`` = 205,488.66, within 2e-6 of the optimum, but its
certificate against that ``kappa`` stayed at 5e-6 (``F - g``); paired with the next outer step's
multipliers it certified, gap 9.7e-7, 1,242 products after that start, and 1.4e-8 after 3,319.
From ``kappa = 0`` the path certified (4.2e-7, by the finish's growing face) after 2,373
products and stopped at 6.2e-8 after 3,104; with the pairing off it stopped at 9.6e-8 after
3,706, and before both at 9.6e-8 after 3,707 (``FINISH_GAP`` unchanged; raised to 0.1 the finish
ran first from the point at 0.094, whose face holds cells that the optimum does not, and the
path took 5,985 products to certify).

The inner steps work in vectors made once per solve (and the family's maps in arrays made once
per family): on adult's triples fresh whole-vector temporaries (about 160 MB each, fresh ``mmap``
pages) on every step made 515 of 1,138 CPU-s system time. Each in-place line computes the
expression in its comment, in the same order, so the iterates are the bits of the allocating
code (tested against it).
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from dpopt.estimate.marginal_space.polytope.face_finish import face_finish

__all__ = ["augmented_lagrangian"]

#: ``rho L`` of the first outer step.
START_RHO_L = 10.0
#: Growth of ``rho`` per outer step, and its cap (``rho L``): the inner conditioning is ``1 + rho L``.
RHO_GROWTH = 2.0
MAX_RHO_L = 1e6
#: After an outer step whose inner solve did not reach :data:`INNER_REDUCTION` within
#: :data:`NEWTON_STEPS`, ``rho`` goes back to the previous value and never exceeds it again. On
#: adult's 9-attribute stand-in the inner solves stop converging from ``rho L = 1280``: doubling
#: on took the certified gap from 0.71 (outer step 7, 1,133 products) back to 0.95 and then 1
#: at every later step (5,013 products), and holding ``rho L`` at 1280 did the same; capped at
#: 640 it fell 0.71 -> 0.48 -> 0.39 -> 0.29 -> 0.20 -> 0.17 over the next 1,905 products. With
#: this rule ``rho L`` went 1280 -> 640 -> 320 (two failed steps, gaps 0.95 and 0.70), then the gap
#: fell 0.22 -> 0.14 -> 0.088 -> 0.057 -> 0.042 -> 0.026 by 7,052 products (670 CPU-s under
#: load), about 0.9x per outer step of 210 products: still short of the face finish's 1e-2.
CAP_RHO = True
#: Semismooth Newton steps per outer step at most, and the inner stop: the preconditioned gradient
#: norm fallen by this factor from its value at the outer step's start.
NEWTON_STEPS = 12
INNER_REDUCTION = 1e-3
#: Conjugate-gradient steps per Newton direction at most, and their relative residual.
CG_STEPS = 80
CG_TOL = 1e-2
#: Once an outer point's certified gap is within this, its active face is finished by
#: :func:`~dpopt.estimate.marginal_space.polytope.face_finish.face_finish` (tried again each time the gap
#: has fallen :data:`FINISH_AGAIN`-fold). A choice from one case, adult's 6-attribute slice: the
#: finish certified from the outer point at gap 6.2e-4, not from those at 3.3e-3 and 1.9e-2.
FINISH_GAP = 1e-2
FINISH_AGAIN = 4.0
#: Pair every outer step's multipliers with the feasible primal point of least ``F`` found so far
#: (a finish's, or an earlier outer step's repaired point), not only with its own repaired point.
PAIR_PRIMAL = True


def augmented_lagrangian(problem, kappa: np.ndarray, certify_at: Callable, better: Callable, *,
                         max_products: int, deadline: float | None = None, stop_gap: float = 0.0,
                         feasibility: float = 0.0, log: Callable | None = None) -> tuple[tuple, int]:
    """Solve (4) by the augmented Lagrangian method from multipliers ``kappa`` (module notes).

    ``certify_at(problem, kappa, r, mu)`` is the projection's certificate and ``better`` its
    ordering of certified points. Stops at a certified point (gap within ``stop_gap``, violation
    within ``feasibility``), after ``max_products`` products (an ``expand`` and an ``adjoint``
    make one), or at ``deadline`` (``time.perf_counter()``). Returns the best certified point and
    the number of products made.
    """
    from dpopt.estimate.marginal_space.polytope.projection import certify_with  # projection imports this module

    fam, target = problem.cliques, problem.target
    free = problem.free_flat
    w = problem.w_flat
    zeros = np.zeros(fam.size, dtype=bool) if problem.zero_cells is None else problem.zero_cells
    scale = float(problem.lipschitz)
    d = problem.index.per_set(fam.diagonal())
    products = 0.0

    cells = fam.size
    plain = problem.nonnegative and not zeros.any()  # P is max(0, .): the line search's fast path
    fixed = np.flatnonzero(~free)  # positions: an indexed write is several times faster than a masked one
    # Work vectors made once (module notes). Every in-place line computes what the expression in its
    # comment computes, in the same order: the iterates are the same bits.
    rw, gradient, step, spare = (np.empty(free.size) for _ in range(4))
    mu_w, z, e_step, shifted = (np.empty(cells) for _ in range(4))
    lam = e_step  # dead once the gradient is made, before the step is expanded
    active, outside = np.empty(cells, dtype=bool), np.empty(cells, dtype=bool)
    # CG's work is dead before the line search's, and the gradient once CG has negated it
    cg = _CGWork(free.size, residual=gradient, expanded=shifted, scaled=spare)

    def expand(x, out=None):
        nonlocal products
        products += 0.5
        return fam.expand(x, out=out)

    def adjoint(v, out=None):
        nonlocal products
        products += 0.5
        return fam.adjoint(v, out=out)

    def bound(z):
        """``P``: the multipliers' bounds (free on structural zeros; 0 off them without non-negativity)."""
        if problem.nonnegative:
            return np.where(zeros, z, np.maximum(z, 0.0))
        return np.where(zeros, z, 0.0)

    def inside(z, out):
        """``zeros | (z > 0)`` (just ``zeros`` without non-negativity) into ``out``."""
        if problem.nonnegative:
            np.greater(z, 0, out=out)
            return np.logical_or(zeros, out, out=out)
        out[...] = zeros
        return out

    kappa = bound(np.asarray(kappa, dtype=np.float64))
    r = problem.residuals(kappa)
    mu = fam.expand(r)
    products += 1
    best = certify_at(problem, kappa, r, mu)
    primal = best if best[4] <= feasibility else None  # the feasible point of least F yet (module notes)
    rho = START_RHO_L / scale
    outer = 0
    finish_at = FINISH_GAP
    ceiling = MAX_RHO_L / scale
    while not _done(best, stop_gap, feasibility) and products < max_products and not _late(deadline):
        first = None
        solved = False  # the inner solve reached its reduction within NEWTON_STEPS
        # r and mu may be held by the certified points: the inner steps update copies in place.
        rw[...] = r
        mu_w[...] = mu
        precondition = np.where(free, w + rho * d, 1.0)
        for _ in range(NEWTON_STEPS):
            np.subtract(kappa, np.multiply(mu_w, rho, out=z), out=z)  # z = kappa - rho * mu
            inside(z, active)
            np.copyto(lam, 0.0)
            np.copyto(lam, z, where=active)  # lam = where(active, z, 0)
            # grad = where(free, w * (r - target) - adjoint(lam), 0)
            np.multiply(w, np.subtract(rw, target, out=gradient), out=gradient)
            np.subtract(gradient, adjoint(lam, out=cg.back), out=gradient)
            gradient[fixed] = 0.0
            size = float(np.sqrt(gradient @ np.divide(gradient, precondition, out=spare)))
            if first is None:
                first = size
            elif size <= INNER_REDUCTION * first:
                solved = True
                break
            if size == 0.0:
                solved = True
                break
            np.logical_not(active, out=outside)
            _newton_direction(gradient, precondition, fixed, w, rho, np.flatnonzero(outside), expand, adjoint,
                              deadline, cg, step)
            expand(step, out=e_step)
            t = _line_search(rw, step, e_step, z, rho, w, free, target, inside, work=(spare, shifted, active),
                             plain=plain)
            np.add(rw, np.multiply(step, t, out=spare), out=rw)  # r = r + t * step
            np.add(mu_w, np.multiply(e_step, t, out=shifted), out=mu_w)  # mu = mu + t * e_step
            if products >= max_products or _late(deadline):
                break
        outer += 1
        kappa = bound(kappa - rho * fam.expand(rw, out=shifted))
        r = problem.residuals(kappa)  # the dual's primal point, afresh: no drift from the updates
        mu = fam.expand(r)
        products += 1.5
        point = certify_at(problem, kappa, r, mu)
        if primal is not None and PAIR_PRIMAL:  # this dual against the best primal point yet: weak duality
            paired = certify_with(problem, kappa, r, mu, primal[0], primal[1])
            if better(paired, point, feasibility):
                point = paired
        if point[4] <= feasibility and (primal is None or point[5] < primal[5]):
            primal = point
        if better(point, best, feasibility):
            best = point
        if log is not None:
            log(outer, products, rho * scale, point, mu)
        if not _done(best, stop_gap, feasibility) and point[3] <= finish_at and not _late(deadline):
            finish_at = point[3] / FINISH_AGAIN
            finished, made = face_finish(problem, kappa, r, mu, deadline=deadline, stop_gap=stop_gap,
                                         feasibility=feasibility, incumbent=primal if PAIR_PRIMAL else None)
            products += made
            if finished is not None:
                if finished[4] <= feasibility and (primal is None or finished[5] < primal[5]):
                    primal = finished
                if better(finished, best, feasibility):
                    best = finished
                if log is not None:
                    log(outer, products, rho * scale, finished, finished[1])
        if not solved and CAP_RHO and outer > 1:
            ceiling = rho = rho / RHO_GROWTH
        else:
            rho = min(rho * RHO_GROWTH, ceiling)
    return best, int(np.ceil(products))


class _CGWork:
    """The conjugate-gradient loop's vectors, made once per solve."""

    def __init__(self, residuals: int, residual: np.ndarray, expanded: np.ndarray, scaled: np.ndarray) -> None:
        self.z, self.direction, self.product, self.back = (np.empty(residuals) for _ in range(4))
        self.residual, self.expanded, self.scaled = residual, expanded, scaled


def _newton_direction(grad, precondition, fixed, w, rho, outside, expand, adjoint, deadline, work, x):
    """Preconditioned CG on ``(W + rho E^T I_A E) x = -grad`` over the free residuals, into ``x``
    (``fixed``, ``outside``: the positions of the fixed residuals and of the cells off ``A``).
    ``grad`` may be ``work.residual`` itself (then it is overwritten)."""
    residual, z, direction, product, scaled = work.residual, work.z, work.direction, work.product, work.scaled
    x[...] = 0.0
    np.negative(grad, out=residual)
    np.divide(residual, precondition, out=z)
    direction[...] = z
    rz = float(residual @ z)
    start = np.sqrt(rz)
    for _ in range(CG_STEPS):
        # product = where(free, w * direction + rho * adjoint(where(active, expand(direction), 0)), 0)
        expanded = expand(direction, out=work.expanded)
        expanded[outside] = 0.0
        back = adjoint(expanded, out=work.back)
        np.multiply(back, rho, out=back)
        np.add(np.multiply(w, direction, out=product), back, out=product)
        product[fixed] = 0.0
        curvature = float(direction @ product)
        if not curvature > 0:
            break
        alpha = rz / curvature
        x += np.multiply(direction, alpha, out=scaled)  # x += alpha * direction
        residual -= np.multiply(product, alpha, out=scaled)  # residual -= alpha * product
        np.divide(residual, precondition, out=z)
        rz_next = float(residual @ z)
        if np.sqrt(rz_next) <= CG_TOL * start or _late(deadline):
            break
        # direction = z + (rz_next / rz) * direction
        np.add(z, np.multiply(direction, rz_next / rz, out=direction), out=direction)
        rz = rz_next
    return x


def _line_search(r, step, e_step, z, rho, w, free, target, inside, work=None, plain=False) -> float:
    """The exact minimiser over ``t`` in ``[0, 1]`` of ``phi(r + t step)``: bisection on its
    derivative ``a + t b - e.P(z - t rho e)`` restricted to the bounds' inside (no product).

    ``inside(v, out)`` writes the bounds' inside of ``v`` into the boolean ``out``; ``work`` is
    (a residual-sized, a cell-sized float and a cell-sized boolean array) or None (made here).
    ``plain``: the inside is just ``v > 0`` (non-negativity, no structural zero), and ``P`` is
    taken as ``maximum(v, 0)``, one pass where the masked write takes four and is 4x slower. It
    differs from ``where(v > 0, v, 0)`` only by the sign of a zero (or on a NaN), which leaves
    every non-zero sum of the dot product unchanged and a zero slope's sign irrelevant to the
    bisection's tests: the same ``t``, bit for bit, on any NaN-free input."""
    spare, shifted, mask = work if work is not None else (
        np.empty_like(r), np.empty_like(z), np.empty(z.shape, dtype=bool))
    # a = sum((w * step * (r - target))[free]), b = sum((w * step * step)[free])
    np.multiply(np.multiply(w, step, out=spare), np.subtract(r, target, out=np.empty_like(r)), out=spare)
    a = float(np.sum(spare[free]))
    np.multiply(np.multiply(w, step, out=spare), step, out=spare)
    b = float(np.sum(spare[free]))

    def slope(t):
        # shifted = z - t * rho * e_step; e_step . where(inside(shifted), shifted, 0)
        np.subtract(z, np.multiply(e_step, t * rho, out=shifted), out=shifted)
        if plain:
            return a + t * b - float(e_step @ np.maximum(shifted, 0.0, out=shifted))
        inside(shifted, mask)
        np.logical_not(mask, out=mask)
        np.copyto(shifted, 0.0, where=mask)
        return a + t * b - float(e_step @ shifted)
    if slope(1.0) <= 0.0:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        if slope(mid) > 0.0:
            hi = mid
        else:
            lo = mid
    return lo if lo > 0 else 0.5 * hi


def _done(point, stop_gap, feasibility) -> bool:
    return point[4] <= feasibility and point[3] <= stop_gap


def _late(deadline) -> bool:
    return deadline is not None and time.perf_counter() > deadline
