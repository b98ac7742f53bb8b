"""ADMM for the large projection: one expand and one adjoint per step (issue 27).

Problem (4) of :mod:`~dpopt.estimate.marginal_space.polytope.projection`, split as

    minimise F(r)   subject to   E r - z = 0,   z >= 0   (z = 0 on structural zeros),        (9)

is solved by the alternating direction method of multipliers with over-relaxation (Boyd, Parikh,
Chu, Peleato and Eckstein, "Distributed optimization and statistical learning via the
alternating direction method of multipliers", 2011, §3.1.1 scaled form and §3.4.3; the
quadratic-program form of OSQP, Stellato et al., Math. Prog. Comp. 2020, algorithm 1):

    r ← argmin F(r) + ρ/2 ||E r - z + u||²        = (W + ρ D)^-1 (W r^ + ρ E^T (z - u))    (10)
    x ← α E r + (1 - α) z
    z ← P(x + u),      u ← u + x - z

with ``P`` the projection onto the bounds and fixed residuals held. With ``s = z + u`` (so that
``z = P(s)`` and ``u = s - P(s)``) the three lines are one map of one vector,
``s <- s + α (E r - P(s))`` with ``r`` from (10) at ``z - u = 2 P(s) - s``: the relaxed
Douglas–Rachford iteration (Eckstein and Bertsekas, Math. Prog. 55, 1992), which the code runs.
``E^T E = D`` is *diagonal* (the residual parts are orthogonal: layout notes), so (10) is a
division: each step costs one :meth:`expand` and one :meth:`adjoint`, where the augmented
Lagrangian's semismooth Newton steps (:mod:`.augmented_lagrangian`) need tens of them per outer
step.

**Multipliers and certificate.** The scaled dual ``u`` gives the multipliers of (5) as
``κ = -ρ u`` (after the z-step ``u <= 0`` wherever ``z = 0``, and ``u = 0`` where ``z > 0``:
complementary with ``z`` by construction). Every ``check_every`` steps at first, then at the step
the gap's recent rate predicts for the goal (:func:`check_spacing`), ``κ`` is certified as
every other path's multipliers are (one more product for ``r(κ)``), paired with a feasible point
made from the step's ``r``, first by moving each clique's own top residual
(:mod:`.local_repair`: moves that keep every lower margin and every other clique) and then, for
what is still negative, by adding records (:mod:`.records`: its violation is first order in
ADMM's primal residual, cell by cell; the records are steered to cells where ``κ`` is small), and
with the feasible point of least ``F`` found so far. The local step cut the repair's cost from
54.7 to 5.4 at the 84-triple stand-in's step 1,000 (relative gap 4.0e-5 to 1.6e-5), and from
107,078 to 767 at step 300 on all 364 triples of adult (6.4e-3 to 8.8e-4).
Nothing is released that this certificate does not pass.

**Acceleration.** The map's residual falls sublinearly; type-II Anderson acceleration
(:mod:`.anderson`, equation (11)) extrapolates from the last ``M`` steps, safeguarded by the
residual of the point it makes, and keeps the cost of a step to an expand and an adjoint.
On adult's 9-attribute stand-in (84 triples, 2.34 M cells, zCDP ε 1) it cut the products to a
certified gap of 1e-6 from 7,237 to 3,132 (959 to 614 CPU-s: a step costs about 50 % more;
``examples/benchmarks/bench_admm_module.py --memory 0`` runs it plain).

**The penalty.** ``ρ`` is one number, ``ρ = rho_l / L`` with ``L = max_A D_A / W_A``. With the
certificate's first repair (uniform) 20 was the best of 1, 20 and 100 on adult's 9-attribute
stand-in (84 triples, 2.34 M cells, zCDP ε 1): after 800 steps the certified gap was 0.59
(ρL = 1), 0.018 (20) and 0.058 at 400 steps (100, whose dual value lagged). With the local
repair and the priced records the certified gap is mostly the primal point's (docs,
marginal-space §2), and a smaller penalty certifies sooner: at step 500 the gap was 3.9e-5
(ρL 5), 1.8e-5 (10), 1.3e-4 (20) and 5.5e-4 (40), and 10 certified the stand-in after 1,280
products and 234 CPU-s against 2,078 and 353 at 20 (``bench_admm_module.py --rho-l R
--stop-gap 1e-6``); at ε 0.1 it left 9.1e-6 after 1,210 products against 6.0e-5.
α = 1.6 (Boyd et al. §3.4.3: 1.5–1.8). OSQP's
residual-balancing update of ``ρ`` (``adapt=True``, :func:`_balance`) made the stand-in at ε 0.1
worse (gap 3.5e-3 against 6.5e-4 after 1,100 steps), so it is off by default. A penalty per
clique keeps ``E^T R E`` diagonal and a step's cost, but none of those tried helped: one Jacobi
sweep of ``E``'s row blocks against ``W`` certified the stand-in after 2,223 products against
2,122, and penalties by the cliques' cells or share of negative cells left gaps 4-7x larger after 800
(docs, marginal-space §2: with equal noise on every triple ``W`` is proportional to ``D``).

**Threads.** From :data:`~dpopt.estimate.marginal_space.layout.THREAD_CELLS` clique cells the
step's passes over its vectors (the bounds and ``2 P(s) - s``, the division (10), ``f`` and its
norm, ``s + f``) run in contiguous pieces at once on :func:`~dpopt.workers.worker_threads`
threads, as do the maps and Anderson's update; the checks are serial. On adult's stand-in 300
steps took 43.2 s on one thread and 33.6 s on two (2 cores, wall clock).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from dpopt.estimate.marginal_space.layout import THREAD_CELLS
from dpopt.estimate.marginal_space.polytope.anderson import Anderson, anderson_memory
from dpopt.estimate.marginal_space.polytope.local_repair import local_repair
from dpopt.estimate.marginal_space.polytope.records import record_repair
from dpopt.workers import in_threads, split_range, worker_threads

__all__ = ["ADAPT", "ALPHA", "CHECK_EVERY", "CHECK_SPACING", "RHO_L", "WORKING_EVERY", "admm"]

RHO_L = 10.0
ALPHA = 1.6
CHECK_EVERY = 100
#: The checks' spacing grows to at most this many ``check_every`` while the gap is far from the
#: goal (:func:`check_spacing`).
CHECK_SPACING = 3
#: Steps between two reports of the work done (``working``): a check can be 300 steps away, some
#: 9 minutes on every triple of adult (:mod:`dpopt.estimate.progress`).
WORKING_EVERY = 20
#: The penalty changes when OSQP's balance asks for a factor beyond this (either way).
ADAPT = 5.0


def admm(problem, *, max_products: int, deadline: float | None = None, stop_gap: float = 0.0,
         feasibility: float = 0.0, rho_l: float = RHO_L, alpha: float = ALPHA, check_every: int = CHECK_EVERY,
         adapt: bool = False, memory: int | None = None, log: Callable | None = None,
         working: Callable | None = None) -> tuple[tuple, int]:
    """Solve (4) by (9)–(10) from ``z = max(E r^, 0)``, ``u = 0`` (module notes).

    Stops at a certified point (gap within ``stop_gap``, violation within ``feasibility``), after
    ``max_products`` products (an ``expand`` and an ``adjoint`` make one; certificates included),
    or at ``deadline`` (``time.perf_counter()``). ``memory`` is the Anderson memory (default
    :func:`~dpopt.estimate.marginal_space.polytope.anderson.anderson_memory` of the cells; 0 for
    plain ADMM). ``log(step, products, point)`` is called with every certified point, and
    ``working(products, gap)`` every :data:`WORKING_EVERY` steps between them (``gap``: the best
    certified point's, None before the first). Returns the
    best certified point (the tuple of
    :func:`~dpopt.estimate.marginal_space.polytope.projection.certify_at`) and the products made.
    """
    from dpopt.estimate.marginal_space.polytope.projection import _better, certify_at, certify_with

    fam, index, target = problem.cliques, problem.index, problem.target
    free = problem.free_flat
    fixed = np.flatnonzero(~free)
    w = problem.w_flat
    zeros = problem.zero_cells
    rho = float(rho_l) / float(problem.lipschitz)
    denominator = w + rho * index.per_set(fam.diagonal())
    weighted_target = w * target
    cells = fam.size
    memory = anderson_memory(cells) if memory is None else int(memory)
    # The step's passes over the vectors run in pieces at once on large problems, as the maps do
    # (:func:`_in_pieces`): the pieces change the rounding of the sums, not the values.
    threads = worker_threads() if cells >= THREAD_CELLS else 1
    cell_pieces, residual_pieces = split_range(cells, threads), split_range(index.size, threads)
    accelerator = Anderson(cells, memory, threads=threads) if memory > 0 else None

    products = 1
    # The state is one vector s, with z = P(s) and u = s - z (module notes: (9)-(10) as the map
    # s -> s + f(s)). Work vectors are made once: on adult's triples a fresh whole vector is a
    # fresh mmap (the augmented Lagrangian's notes), so every step writes into these.
    s = np.empty(cells)
    _bound_into(fam.expand(target), s, problem.nonnegative, zeros)
    z, f, plain = np.empty(cells), np.empty(cells), np.empty(cells)
    following = np.empty(cells) if accelerator is not None else None
    r = target.copy()
    er, difference = np.empty(cells), np.empty(cells)
    best = feasible = None
    step, next_check = 0, check_every
    checks = []  # (step, certified gap) of every check, for the next check's step
    extrapolated, last_norm = False, np.inf
    while products < max_products:
        step += 1
        _in_pieces(cell_pieces, _bounded_difference, s, z, difference, zeros, nonnegative=problem.nonnegative)
        fam.adjoint(difference, out=r)
        _in_pieces(residual_pieces, _residual_step, r, weighted_target, denominator, rho=rho)
        r[fixed] = target[fixed]
        fam.expand(r, out=er)
        products += 1
        if working is not None and step % WORKING_EVERY == 0:  # alive between checks (progress notes)
            working(products, best[3] if best is not None and best[4] <= feasibility else None)
        # f = T(s) - s = alpha (E r - z): the step x = alpha E r + (1 - alpha) z, z <- P(x + u),
        # u <- u + x - z of (10) is s <- x + u = s + f
        norm = float(np.sqrt(sum(_in_pieces(cell_pieces, _scaled_residual, er, z, f, alpha=alpha))))
        if extrapolated and norm > last_norm:  # the safeguard: back to the plain step (anderson notes)
            accelerator.reset()
            s, plain = plain, s
            extrapolated, last_norm = False, np.inf
            continue
        _in_pieces(cell_pieces, np.add, s, f, plain)
        adapted = False
        if step >= next_check or products >= max_products - 1 or _late(deadline):
            kappa = _multipliers(problem, plain, z, rho)  # those of the plain step
            rk = problem.residuals(kappa)
            mk = fam.expand(rk)
            products += 1
            points = [certify_at(problem, kappa, rk, mk)]
            # copies: a certified point may hold its primal vectors (when nothing needed lifting), and
            # the work vectors change at the next step
            x, m = r.copy(), er.copy()
            local_repair(problem, x, m)  # each clique's own top residual first, in place (local_repair notes)
            points.append(certify_with(problem, kappa, rk, mk, *(record_repair(problem, x, m, price=kappa) or (x, m))))
            if feasible is not None:  # the best primal point so far against these multipliers
                points.append(certify_with(problem, kappa, rk, mk, feasible[0], feasible[1]))
            for point in points:
                if best is None or _better(point, best, feasibility):
                    best = point
                if point[4] <= feasibility and (feasible is None or point[5] < feasible[5]):
                    feasible = point
            if log is not None:
                log(step, products, best)
            if (best[4] <= feasibility and best[3] <= stop_gap) or _late(deadline):
                break
            checks.append((step, best[3] if best[4] <= feasibility else np.inf))
            # OSQP's penalty update happens at checks: keep its cadence
            next_check = step + (check_every if adapt else check_spacing(checks, stop_gap, check_every))
            if adapt:
                factor = _balance(problem, r, rk, er, z, kappa)
                if factor > ADAPT or factor < 1.0 / ADAPT:  # OSQP's rule: rescale u, re-form the diagonal
                    rho *= factor
                    plain -= z  # s = z + u / factor
                    plain /= factor
                    plain += z
                    denominator = w + rho * index.per_set(fam.diagonal())
                    adapted = True
        if accelerator is None or adapted:  # after a change of rho, a plain step and a fresh history
            if accelerator is not None:
                accelerator.reset()
                extrapolated, last_norm = False, np.inf
            s, plain = plain, s
            continue
        last_norm = norm
        extrapolated = accelerator.step(s, f, out=following)
        s, following = following, s
    if best is None:
        kappa = _multipliers(problem, s, z, rho)
        rk = problem.residuals(kappa)
        best = certify_at(problem, kappa, rk, fam.expand(rk))
        products += 1
    return best, products


def check_spacing(checks: list, stop_gap: float, every: int) -> int:
    """Steps to the next check, from the ``(step, gap)`` of the checks so far.

    A check is not cheap on wide data: on all 364 triples of adult the local repair and the priced
    records took about 30 % of the run (15 and 64 CPU-s per check, a check every 100 steps). And in
    its tail ADMM's certified gap falls about geometrically (0.72-0.84x per 100 steps on adult's
    stand-in, 0.83x on all 364 triples), so checking every ``every`` steps far from the goal is
    mostly wasted. The last two checks' rate predicts the steps to ``stop_gap``; the next check
    comes then, but never sooner than ``every`` steps nor later than :data:`CHECK_SPACING` times
    ``every``. The rate slows in the tail, so the prediction is early rather than late; and a check
    is made at the deadline and at the last product regardless. Without a goal, two checks or a
    falling gap: every ``every`` steps.
    """
    if stop_gap <= 0.0 or len(checks) < 2:
        return every
    (before, earlier), (last, gap) = checks[-2], checks[-1]
    if not (np.isfinite(earlier) and 0.0 < gap < earlier and gap > stop_gap):
        return every
    rate = np.log(earlier / gap) / (last - before)  # of the log gap, per step
    needed = np.log(gap / stop_gap) / rate
    return int(min(max(needed, every), CHECK_SPACING * every))


def _in_pieces(pieces: list, work: Callable, *arrays, **options) -> list:
    """``work(*slices, **options)`` on every piece ``(lo, hi)`` of the arrays (None stays None), at
    once (:func:`~dpopt.workers.in_threads`); the results in order. One piece: the whole arrays."""
    def piece(t: int):
        lo, hi = pieces[t]
        return work(*(None if a is None else a[lo:hi] for a in arrays), **options)

    return in_threads(piece, len(pieces))


def _bounded_difference(s, z, difference, zeros, *, nonnegative: bool) -> None:
    """``z = P(s)`` and ``difference = z - u = 2 P(s) - s`` (module notes)."""
    _bound_into(s, z, nonnegative, zeros)
    np.multiply(z, 2.0, out=difference)
    difference -= s


def _residual_step(r, weighted_target, denominator, *, rho: float) -> None:
    """(10) from ``r = E^T (z - u)``: ``r <- (W r^ + rho r) / (W + rho D)``, in place."""
    r *= rho
    r += weighted_target
    r /= denominator


def _scaled_residual(er, z, f, *, alpha: float) -> float:
    """``f = alpha (E r - z)``; returns ``||f||^2`` over the piece."""
    np.subtract(er, z, out=f)
    f *= alpha
    return float(f @ f)


def _bound_into(v: np.ndarray, out: np.ndarray, nonnegative: bool, zeros) -> None:
    """``P(v)`` into ``out``: the bounds of (9)."""
    if nonnegative:
        np.maximum(v, 0.0, out=out)
    else:
        out[...] = v
    if zeros is not None:
        out[zeros] = 0.0


def _multipliers(problem, s: np.ndarray, z: np.ndarray, rho: float) -> np.ndarray:
    """``κ = -ρ u = ρ (P(s) - s)`` within the dual's bounds (``z`` is work space for ``P(s)``)."""
    from dpopt.estimate.marginal_space.polytope.projection import bounded_multipliers

    _bound_into(s, z, problem.nonnegative, problem.zero_cells)
    return bounded_multipliers(problem, rho * (z - s))


def _balance(problem, r, rk, er, z, kappa) -> float:
    """OSQP's penalty update (Stellato et al. 2020, §5.2): the square root of the relative primal
    residual ``||E r - z|| / max(||E r||, ||z||)`` over the relative dual residual
    ``||W (r - r^) + E^T y|| / max(||W (r - r^)||, ||E^T y||)``, maxima over entries. With ``y = -kappa``
    and ``E^T kappa = W (r(kappa) - r^)`` the dual residual is ``W (r - r(kappa))``: no product."""
    free = problem.free_flat
    w = problem.w_flat[free]
    primal = float(np.abs(er - z).max()) / max(float(np.abs(er).max()), float(np.abs(z).max()), 1e-300)
    gradient = w * (r - problem.target)[free]
    pull = w * (rk - problem.target)[free]
    dual = float(np.abs(gradient - pull).max()) / max(float(np.abs(gradient).max()), float(np.abs(pull).max()),
                                                      1e-300)
    if primal == 0.0 or dual == 0.0:
        return 1.0
    return float(np.sqrt(primal / dual))


def _late(deadline: float | None) -> bool:
    return deadline is not None and time.perf_counter() > deadline
