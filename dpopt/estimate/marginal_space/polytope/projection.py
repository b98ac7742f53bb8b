"""Non-negative, consistent marginals: the least-squares fit over the local marginal polytope.

Given the residual fit ``(r^, W)`` of :mod:`~dpopt.estimate.marginal_space.gls` and a family
of marginals (the *cliques*) written from the residuals by ``mu = E r``
(:meth:`~dpopt.estimate.marginal_space.layout.SetFamily.expand`), solve

    minimise    F(r) = 1/2 sum_{A free} W_A ||r_A - r^_A||²                              (4)
    subject to  (E r)_c >= 0 for every clique cell c,  (E r)_c = 0 on structural zeros,
                r_A = r^_A where exact measurements fix it.

By equation (3) this is the weighted least-squares fit of the measurements over every family
of marginals that is consistent (each ``r_A`` shared by all the marginals holding ``A``) and
non-negative: the local relaxation of the marginal polytope (Wainwright and Jordan 2008, §4.1;
the "local non-negativity" of Mullins et al., NeurIPS 2024). Where the cliques are
decomposable (they have a junction tree) the local polytope *is* the marginal polytope and (4)
gives the marginals of the dense constrained least-squares table; otherwise (4) is its
relaxation.

**Method: the dual.** With multipliers ``kappa >= 0`` on the cells (free on structural zeros)
the Lagrangian is minimised in closed form by ``r(kappa) = r_ref + W^-1 E^T kappa`` (``r_ref`` is
``r^`` on free sets and the fixed values elsewhere; ``W^-1`` is 0 on fixed sets), and the dual
problem is the bound-constrained quadratic

    minimise over kappa >= 0:   1/2 ||E^T kappa||²_{W^-1} + <E^T kappa, r_ref>            (5)

whose gradient is the marginals ``mu(kappa) = E r(kappa)`` themselves: a multiplier grows
exactly where its cell is negative. (5) is solved by L-BFGS-B (Byrd, Lu, Nocedal, Zhu 1995;
scipy's implementation) after scaling ``kappa`` by ``1/sqrt(L)``, ``L = max_A D_A / W_A`` the
largest eigenvalue of ``E W^-1 E^T`` (``D = E^T E`` is diagonal: layout notes). Every
function evaluation is one :meth:`adjoint` and one :meth:`expand`; memory is a few vectors over
the clique cells.

**Certificate.** Weak duality: for any ``kappa`` feasible in (5) and any ``r`` feasible in (4),
``F(r) + (5)(kappa) >= 0`` with equality at the optimum, so

    gap = (F(r) - g(kappa)) / (1 + |F(r)| + |g(kappa)|),       g = -(5)

bounds the suboptimality of ``r``. The primal point is ``r(kappa)`` moved towards an interior
point ``r_int`` (positive marginals that keep every fixed residual and structural zero) just
enough that no cell is negative (:func:`repair`): ``(1 - t) r + t r_int`` stays consistent and
keeps the fixed residuals since the map is linear. A point is certified only when its
remaining violation is within the feasibility tolerance and its gap within tolerance.

**Polish: Newton on the active face.** The repair costs about ``t <kappa, mu_int>``, first order
in the dual's remaining violation, and L-BFGS-B does not push that violation low enough: near
the optimum the dual's decrease falls under the rounding error of its value (``|g| x 1e-16``
summed over millions of cells) and the line search fails (ABNORMAL_TERMINATION_IN_LNSRCH) with
cells still about ``1e-6`` negative. That left the relative gap at 4-6e-6 (tolerance 1e-6)
on adult's chain and on a 27-attribute pure-eps case, whatever the iterations.
:func:`polish` therefore takes the face that L-BFGS-B identified,
``A = {kappa > 0} ∪ {mu < 0}`` (plus the structural zeros), and solves the dual on it without
bounds, ``(E W^-1 E^T)_AA kappa_A = -b_A``, by conjugate gradients (Hestenes and Stiefel
1952): an iteration that drives the *gradient* ``mu_A`` to zero and never compares function
values, so it reaches ``|mu_A| ~ 1e-12 |b|``. Multipliers that come out negative are set to
zero and the face is taken again (a projected Newton step: Bertsekas 1982, "Projected Newton
methods for optimization problems with simple constraints"). When the face is right, the
point is the optimum to rounding and the repair barely moves it: the certified gaps are then
1e-8 (adult's chain) to 1e-13 (the tests) instead of 4-6e-6. Every polished point goes
through the same :func:`certify` as any other; the polish can only replace the incumbent by a
point with a smaller certified gap.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from dpopt.estimate.marginal_space.polytope.admm import admm as run_admm
from dpopt.estimate.marginal_space.polytope.augmented_lagrangian import augmented_lagrangian
from dpopt.estimate.marginal_space.layout import ResidualIndex, SetFamily
from dpopt.estimate.progress import report_progress, report_work

__all__ = ["ProjectionProblem", "Projection", "project", "polish", "dual_value", "objective", "repair", "certify",
           "bounded_multipliers", "NEWTON_STALL",
           "certify_at", "certify_with", "gap_parts", "repair_step"]

#: Conjugate-gradient steps on one face before the face is taken again (the adult chain's faces,
#: 1.5 million cells, need 100-150 for a gap of 1e-7).
POLISH_STEPS = 150
#: From this many clique cells on, :func:`project` starts with projected Newton from ``kappa = 0``
#: (a few vectors) before any L-BFGS-B (``2 memory + 5`` vectors, and hundreds of products to
#: identify the face), and runs ADMM when those rounds stall: on adult's 5-attribute slice (2.84 M
#: cells) the rounds certified (gap 2e-9) in 28 products, 6 CPU-s, against 18.5 CPU-s by L-BFGS-B
#: and the polish. Every triple of adult slices, zCDP eps 1, least squares, CPU-s, L-BFGS-B and the
#: polish against the rounds then ADMM (issue 27; ``bench_admm_module.py --estimate``, with and
#: without ``--newton-cells 0``): 7 attributes (323 k cells) 26 against 12; 8 attributes (554 k) 64
#: against 28, (929 k) 138 against 41, (1.77 M) not certified after 452 (gap 9.8e-4) against 141;
#: the same errors where both certified. On generated binary networks (20-23 k cells, eps 0.1 and
#: 1; ``bench_newton_cells.py --bn 27:3 100:2``) both certify in under 0.5 CPU-s. Below the smallest
#: adult slice run, the tests' small problems keep L-BFGS-B and its polish.
NEWTON_CELLS = 2**18
#: From this many clique cells on, :func:`project` starts with the augmented Lagrangian method
#: (:mod:`~dpopt.estimate.marginal_space.polytope.augmented_lagrangian`) instead: on adult's 364 triples
#: (20.9 M cells) the projected-Newton rounds did not converge (675 products, gap 0.84). Below it
#: the rounds certified adult's 5- and 6-attribute slices (2.8 M cells in 28-36 products, 5.3 M
#: in 104) where the augmented Lagrangian was slower (6 attributes: gap 0.11 after 112 products).
#: The threshold is a choice between the cases seen, not a rule: on a 9-attribute slice (2.34 M
#: cells, 84 triples) the rounds stall too (most negative cell -28 after 625 products, against
#: -0.34 after 132 for the augmented Lagrangian), and neither certified it. No longer a default
#: path (never reached): ADMM (:data:`ADMM_CELLS`) went further on every case; ``alm=True`` or a
#: lower value still runs it.
ALM_CELLS = 2**62
#: From this many clique cells on, :func:`project` starts with ADMM
#: (:mod:`~dpopt.estimate.marginal_space.polytope.admm`), certified with records added
#: (:mod:`~dpopt.estimate.marginal_space.polytope.records`), in place of the augmented Lagrangian,
#: which never certified there: on adult's 364 triples (20.9 M cells, zCDP eps 1) ADMM's gap was
#: 0.077 after 203 products where the augmented Lagrangian's was 0.75 after 495. Between
#: :data:`NEWTON_CELLS` and this, ADMM follows projected-Newton rounds that do not certify (they
#: certify adult's 5- and 6-attribute slices in 28-104 products, and stall on 84 triples: there
#: ADMM certified, gap 9.3e-7 after 7,237 products, where the augmented Lagrangian was at 0.026
#: after 7,052).
ADMM_CELLS = 2**24
#: Faces taken by that first projected-Newton pass before L-BFGS-B takes over.
NEWTON_ROUNDS = 60
#: That pass stops early once this many faces in a row have not halved the least negative mass
#: seen at a face's start (``stall`` of :func:`polish`). A pass that needs more faces than this per
#: halving cannot bring a mass of 1e5-1e6 down to the feasibility tolerance (some 35-40 halvings)
#: within :data:`NEWTON_ROUNDS` faces, and ADMM, which follows, starts afresh: the faces are wasted.
#: Where the rounds certify the mass halves about every face (adult's 6-attribute slice of 0.5 M
#: cells, zCDP eps 1: 2.1e5 to 1e-3 in 25 faces, never 3 faces without halving). On the 84-triple
#: stand-in (2.34 M cells) it stayed between 6.0e5 and 1.1e6 from the 2nd face to the 25th; the 60
#: faces took about 2,500 products, a third of the estimate's, before ADMM. On a 6-attribute slice
#: of 5.3 M cells (age, education-num, occupation, capital-gain, capital-loss, hours-per-week) it
#: fell 15-30 % a face (1.9e3 after 24 faces, ~35 CPU-s each): the rule stops it at the 13th.
NEWTON_STALL = 5
#: That pass solves each face's Newton system inexactly: conjugate gradients stop once the largest
#: face residual has fallen by this factor (inexact Newton, Dembo, Eisenstat and Steihaug 1982),
#: and the face is taken again. On adult's slice, 2 CG steps per face took the gap from 0.92 to
#: 2e-8 in 9 faces (36 products); solving every face to rounding took 52, and on all of adult's
#: triples the first face alone took 135 CG steps to reach rounding.
NEWTON_FORCING = 1e-2


@dataclass
class ProjectionProblem:
    """Problem (4): residual targets and weights, the cliques, fixed residuals and zero cells.

    ``interior`` is an optional pair ``(r_int, mu_int)``: residuals keeping every fixed value
    and structural zero whose clique marginals are positive wherever a feasible point can be,
    with the total of ``r_int`` equal to 1 when the total is free (it is rescaled to the
    current total) — see :func:`repair`.
    """

    index: ResidualIndex
    cliques: SetFamily
    target: np.ndarray  # r^ (flat), fixed residuals at their values
    weight: np.ndarray  # W_A per set, > 0 on every free set
    fixed: np.ndarray  # bool per set
    zero_cells: np.ndarray | None = None  # bool over clique cells (flat), structural zeros
    interior: tuple | None = None
    nonnegative: bool = True  # False: only the structural zeros constrain the cells

    def __post_init__(self) -> None:
        index = self.index
        free_sets = ~np.asarray(self.fixed, dtype=bool)
        if np.any(self.weight[free_sets] <= 0):
            raise ValueError("every free residual needs a positive weight")
        self.free_flat = index.per_set(free_sets) > 0
        self.w_flat = index.per_set(np.where(free_sets, self.weight, 0.0))
        self.inv_w_flat = np.zeros_like(self.w_flat)
        self.inv_w_flat[self.free_flat] = 1.0 / self.w_flat[self.free_flat]
        diagonal = self.cliques.diagonal()
        ratio = diagonal[free_sets] / self.weight[free_sets]
        self.lipschitz = float(ratio.max()) if ratio.size else 0.0
        self.total_free = not bool(self.fixed[index.position_of(())])

    def residuals(self, kappa: np.ndarray) -> np.ndarray:
        """``r(kappa)`` of the Lagrangian's minimiser."""
        return self.target + self.inv_w_flat * self.cliques.adjoint(kappa)


def objective(problem: ProjectionProblem, r: np.ndarray) -> float:
    """``F(r)`` of (4)."""
    free = problem.free_flat
    diff = (r - problem.target)[free]
    return 0.5 * float(np.sum(problem.w_flat[free] * diff * diff))


def dual_value(problem: ProjectionProblem, kappa: np.ndarray, h: np.ndarray | None = None) -> float:
    """``g(kappa)``: minus (5). Pass ``h = E^T kappa`` when it is at hand."""
    h = problem.cliques.adjoint(kappa) if h is None else h
    free = problem.free_flat
    return -0.5 * float(np.sum(h[free] ** 2 * problem.inv_w_flat[free])) - float(h @ problem.target)


def repair(problem: ProjectionProblem, r: np.ndarray, mu: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Move ``r`` towards the interior point just enough that no cell is negative.

    ``(1 - t) r + t r_int`` keeps every fixed residual and consistency (the map is linear);
    ``t`` is the smallest value that lifts every negative cell where the interior point is
    positive. Cells the interior point leaves at zero cannot be lifted (their violation stays).
    Structural zeros are equalities, not bounds: they are never lifted (the interior point holds
    them at zero up to rounding, so the mix keeps their deviation within the current one's order),
    and without non-negativity no cell is.
    """
    step = repair_step(problem, r, mu)
    if step is None:
        return r, mu
    t, r_int, mu_int = step
    return (1.0 - t) * r + t * r_int, (1.0 - t) * mu + t * mu_int


def repair_step(problem: ProjectionProblem, r: np.ndarray, mu: np.ndarray) -> tuple | None:
    """``(t, r_int, mu_int)`` of :func:`repair` (the interior point at the current total), or None
    when it leaves ``r`` as it is (no negative cell outside the structural zeros, no interior
    point, none it can lift, or no non-negativity to restore)."""
    if not problem.nonnegative:  # only the structural zeros constrain the cells: nothing to lift
        return None
    neg = mu < 0
    if problem.zero_cells is not None:  # a zero cell's rounding-level sign is no violation of a bound
        neg &= ~problem.zero_cells
    if problem.interior is None or not neg.any():
        return None
    r_int, mu_int = problem.interior
    if problem.total_free:  # the interior point has total 1: give it the current total
        total = float(r[problem.index.set_offsets[problem.index.position_of(())]])
        if not total > 0:
            return None
        r_int, mu_int = r_int * total, mu_int * total
    lift = neg & (mu_int > 0)
    if not lift.any():
        return None
    t = float(np.max(-mu[lift] / (mu_int[lift] - mu[lift])))
    return min(1.0, t * (1.0 + 1e-9) + 1e-15), r_int, mu_int


def violation(problem: ProjectionProblem, mu: np.ndarray) -> float:
    """The largest negative cell, or the largest deviation on a structural zero (counts)."""
    worst = float(max(0.0, -mu.min(initial=0.0))) if problem.nonnegative else 0.0
    zeros = problem.zero_cells
    if zeros is not None and zeros.any():
        worst = max(worst, float(np.abs(mu[zeros]).max()))
    return worst


@dataclass
class Projection:
    """The outcome of :func:`project`: the best point found and its certificate."""

    r: np.ndarray
    mu: np.ndarray
    kappa: np.ndarray
    fun: float  # F(r)
    dual: float  # g(kappa)
    gap: float  # relative duality gap
    violation: float  # counts
    iterations: int
    evaluations: int
    converged: bool
    stopped: str  # why the solve ended
    time: float
    history: list = field(default_factory=list)
    methods: tuple = ()  # the methods that ran, in order (for the release's message)


def bounded_multipliers(problem: ProjectionProblem, kappa_in: np.ndarray) -> np.ndarray:
    """``kappa`` within the dual's bounds: ``>= 0`` (0 without non-negativity), free on structural zeros."""
    kappa = np.maximum(np.array(kappa_in, dtype=np.float64), 0.0) if problem.nonnegative else \
        np.zeros(problem.cliques.size)
    if problem.zero_cells is not None:
        kappa[problem.zero_cells] = np.asarray(kappa_in, dtype=np.float64)[problem.zero_cells]
    return kappa


def certify(problem: ProjectionProblem, kappa_in: np.ndarray) -> tuple:
    """``(r, mu, kappa, gap, violation, F, g)`` at multipliers ``kappa`` (projected onto the bounds).

    The absolute gap is computed without cancellation: at ``r(kappa)`` it is ``F - g = kappa . mu``
    (complementarity), and the repair adds ``F(r_repaired) - F(r(kappa))``, a difference of
    quadratics taken as ``1/2 W (r' - r)(r' + r - 2 r^)``.
    """
    kappa = bounded_multipliers(problem, kappa_in)
    r = problem.residuals(kappa)
    return certify_at(problem, kappa, r, problem.cliques.expand(r))


def certify_at(problem: ProjectionProblem, kappa: np.ndarray, r: np.ndarray, mu: np.ndarray) -> tuple:
    """:func:`certify` at multipliers already within their bounds, given ``r = r(kappa)`` and
    ``mu = E r`` (the dual's gradient, which a solver holds anyway): no product is made."""
    return _certificate(problem, kappa, *_gap_terms(problem, kappa, r, mu))


def certify_with(problem: ProjectionProblem, kappa: np.ndarray, r: np.ndarray, mu: np.ndarray, x: np.ndarray,
                 m: np.ndarray) -> tuple:
    """:func:`certify_at` with the primal candidate ``x`` (``m = E x``) repaired in place of
    ``r = r(kappa)``: the gap is ``<kappa, mu>`` plus ``F(repair(x)) - F(r)``, equation (7) of
    :mod:`~dpopt.estimate.marginal_space.polytope.face_finish`. No product is made."""
    return _certificate(problem, kappa, *_gap_terms(problem, kappa, r, mu, x, m))


def _certificate(problem, kappa, complementarity, repaired, mu_repaired, cost) -> tuple:
    gap = complementarity + cost
    fun = objective(problem, repaired)
    dual = fun - gap
    relative = max(gap, 0.0) / (1.0 + abs(fun) + abs(dual))
    return repaired, mu_repaired, kappa, relative, violation(problem, mu_repaired), fun, dual


def _gap_terms(problem: ProjectionProblem, kappa: np.ndarray, r: np.ndarray, mu: np.ndarray,
               x: np.ndarray | None = None, m: np.ndarray | None = None) -> tuple:
    """``(<kappa, mu>, r', mu', F(r') - F(r))`` with ``r'`` the repaired point (of ``x`` when given,
    else of ``r``): the absolute gap is the first plus the last, the change of (4) taken as
    ``1/2 W (r' - r)(r' + r - 2 r^)``."""
    complementarity = float(kappa @ mu)
    repaired, mu_repaired = repair(problem, r, mu) if x is None else repair(problem, x, m)
    cost = 0.0
    if repaired is not r:
        free = problem.free_flat
        step = (repaired - r)[free]
        cost = 0.5 * float(np.sum(problem.w_flat[free] * step * (repaired + r - 2.0 * problem.target)[free]))
    return complementarity, repaired, mu_repaired, cost


def gap_parts(problem: ProjectionProblem, kappa: np.ndarray, r: np.ndarray, mu: np.ndarray) -> dict:
    """Where the certified gap at ``kappa`` comes from, for diagnosis (``r = r(kappa)``, ``mu = E r``).

    The absolute gap of :func:`certify_at` is ``complementarity + repair_cost``:
    ``complementarity = <kappa, mu>`` is the gap at the dual's own primal point ``r(kappa)``
    (``objective`` is ``F(r(kappa))``, ``dual`` is ``g(kappa)``), and ``repair_cost`` is what
    moving it a fraction ``repair_step`` of the way to the interior point adds to (4).
    ``worst`` is the most negative cell of ``mu`` (0 when none is), ``negative`` and ``active``
    count the negative cells and the positive multipliers, all over the cells that may be
    positive; a structural zero's cell is held at 0 by an equality, so its multiplier has no sign
    and its departure from 0 is ``zero_violation`` (the largest ``|mu|`` there).
    """
    complementarity, repaired, _, cost = _gap_terms(problem, kappa, r, mu)
    zeros = problem.zero_cells
    open_mu, open_kappa = (mu, kappa) if zeros is None else (mu[~zeros], kappa[~zeros])
    zero_violation = 0.0 if zeros is None else float(np.abs(mu[zeros]).max(initial=0.0))
    step = repair_step(problem, r, mu)
    fun = objective(problem, r)
    repaired_fun = objective(problem, repaired)
    gap = complementarity + cost
    return {"complementarity": complementarity, "repair_step": 0.0 if step is None else step[0],
            "repair_cost": cost, "objective": fun, "dual": fun - complementarity,
            "gap": max(gap, 0.0) / (1.0 + abs(repaired_fun) + abs(repaired_fun - gap)),
            "worst": float(max(0.0, -open_mu.min(initial=0.0))), "negative": int(np.count_nonzero(open_mu < 0)),
            "active": int(np.count_nonzero(open_kappa > 0)), "zero_violation": zero_violation}


def polish(problem: ProjectionProblem, kappa: np.ndarray, *, max_iter: int = 900, rounds: int = 6,
           deadline: float | None = None, stop_gap: float = 0.0, feasibility: float = 0.0,
           forcing: float = 0.0, stall: int = 0) -> tuple[tuple, int]:
    """Projected Newton on the dual (5): conjugate gradients on the active face of ``kappa``.

    The face is ``A = {kappa > 0} ∪ {mu(kappa) < 0}`` (structural zeros always in it, their
    multipliers free). On ``A`` the dual without bounds is ``H_AA kappa_A = -b_A`` (``H = E W^-1
    E^T``, ``b = E r_ref``), whose residual is minus the marginals ``mu_A``; CG stops when
    ``max |mu_A|`` is within ``1e-13`` of the largest ``|b|`` (rounding) or within ``forcing``
    times its value at the face's start (an inexact Newton step; 0: solve to rounding), after
    :data:`POLISH_STEPS` steps (``max_iter`` in all rounds), when a direction shows no
    curvature (a singular face), or at ``deadline`` (``time.perf_counter()``). Negative
    multipliers are then zeroed (not for structural zeros), the point certified, and the face
    taken again, ``rounds`` times at most or until the
    certified gap is within ``stop_gap`` (with the violation within ``feasibility``), or (``stall``
    > 0, with non-negativity) once ``stall`` faces in a row have not halved the smallest negative
    mass ``sum max(-mu, 0)`` seen at a face's start (structural zeros aside): the active set is not
    settling, and the caller's next method does better with the products (:data:`NEWTON_STALL`).

    Returns the best certified point (:func:`certify`'s tuple) among the rounds and the number
    of products with ``H`` or ``E`` made (CG steps and one per round).
    """
    fam, inv_w, target = problem.cliques, problem.inv_w_flat, problem.target
    free = np.zeros(fam.size, dtype=bool) if problem.zero_cells is None else problem.zero_cells
    base = fam.expand(target)
    floor = 1e-13 * max(float(np.abs(base).max(initial=0.0)), 1.0)
    kappa = np.array(kappa, dtype=np.float64)
    products = 0

    def hess(p):
        nonlocal products
        products += 1
        return fam.expand(inv_w * fam.adjoint(p))  # E W^-1 E^T p

    best = None
    budget = max_iter
    least_mass, since = np.inf, 0
    for _ in range(rounds):
        mu = fam.expand(target + inv_w * fam.adjoint(kappa))
        products += 1
        if stall and problem.nonnegative:
            mass = -float(np.minimum(mu, 0.0).sum(where=~free))
            if mass <= 0.5 * least_mass:
                least_mass, since = mass, 0
            else:
                since += 1
                if since >= stall:
                    break
        face = free | (kappa > 0) | ((mu < 0) if problem.nonnegative else False)
        residual = np.where(face, -mu, 0.0)
        if np.abs(residual).max(initial=0.0) <= floor or budget <= 0:
            break
        direction = residual.copy()
        rr = float(residual @ residual)
        enough = max(floor, forcing * float(np.abs(residual).max()))
        for _ in range(min(POLISH_STEPS, budget)):
            budget -= 1
            hd = np.where(face, hess(direction), 0.0)
            curvature = float(direction @ hd)
            if not curvature > 0:
                break
            alpha = rr / curvature
            kappa += alpha * direction
            residual -= alpha * hd
            if np.abs(residual).max() <= enough or (deadline is not None and time.perf_counter() > deadline):
                break
            rr_next = float(residual @ residual)
            direction = residual + (rr_next / rr) * direction
            rr = rr_next
        if problem.nonnegative:
            kappa = np.where(free, kappa, np.maximum(kappa, 0.0))
        else:
            kappa = np.where(free, kappa, 0.0)
        point = certify(problem, kappa)
        products += 1
        if best is None or _better(point, best, feasibility):
            best = point
        if (point[4] <= feasibility and point[3] <= stop_gap) or \
                (deadline is not None and time.perf_counter() > deadline):
            break
    return (best if best is not None else certify(problem, kappa)), products


def project(problem: ProjectionProblem, *, tol: float = 1e-6, feasibility: float = 1e-6,
            max_iter: int = 20000, time_limit: float | None = None, check_every: int = 10,
            memory: int = 10, restarts: int = 5, target: float | None = None,
            polish_gap: float = 1e-3, newton: bool | None = None, alm: bool | None = None,
            admm: bool | None = None) -> Projection:
    """Solve (4) through its dual (5) by L-BFGS-B and :func:`polish`; stop when the certificate
    holds or at a limit.

    ``tol`` is the relative duality gap a point must reach to be certified, ``target`` (default
    ``tol / 10``) the gap at which the solver stops early (ADMM and the augmented Lagrangian stop at
    ``tol`` itself: their tails are slow), ``feasibility`` the largest violation
    allowed (counts).
    A run of L-BFGS-B is interrupted once its certified gap is within ``polish_gap`` (the face
    is then nearly identified) and its point polished; a run that ends otherwise (a line search
    that can make no more progress in floating point) is polished too. A polished point that
    is not certified restarts L-BFGS-B with a fresh memory, up to ``restarts`` times.
    ``max_iter`` counts L-BFGS-B iterations and the polish's conjugate-gradient steps together.
    ``newton`` (default: when the cliques hold :data:`NEWTON_CELLS` cells or more) first runs
    :func:`polish` from ``kappa = 0``, :data:`NEWTON_ROUNDS` faces at most: the first face is
    the negative cells of the unconstrained fit, and each later one is read off the previous
    Newton point (the primal-dual active-set rule of Hintermüller, Ito and Kunisch 2002, with
    Newton systems solved by conjugate gradients). L-BFGS-B starts from its best point only if
    that pass does not certify. ``admm`` (default: from :data:`ADMM_CELLS` clique cells, and after
    projected-Newton rounds that do not certify) runs ADMM
    (:func:`~dpopt.estimate.marginal_space.polytope.admm.admm`) from ``z = max(E r^, 0)``, certified
    with records added (:mod:`~dpopt.estimate.marginal_space.polytope.records`). ``alm`` (default:
    from :data:`ALM_CELLS` clique cells, no longer reached) runs the
    augmented Lagrangian method (:func:`~dpopt.estimate.marginal_space.polytope.augmented_lagrangian.
    augmented_lagrangian`) from ``kappa = 0`` in place of that pass; it finishes the active face
    of its outer points once their gap is small (:mod:`~dpopt.estimate.marginal_space.polytope.face_finish`,
    certified by :func:`certify_with`). All end in the same certificate, with the same tolerances.
    ``converged`` is True only when both figures hold at the returned point.
    """
    from scipy.optimize import minimize

    start = time.perf_counter()
    accept, tol = tol, tol / 10 if target is None else target
    fam = problem.cliques
    cells = fam.size
    if problem.lipschitz <= 0:  # nothing free: the fixed residuals are the answer
        point = certify(problem, np.zeros(cells))
        return _outcome(point, 0, 0, point[4] <= feasibility, "nothing to fit", start, [])
    s = 1.0 / np.sqrt(problem.lipschitz)
    lower = np.zeros(cells)
    upper = np.full(cells, np.inf) if problem.nonnegative else np.zeros(cells)
    if problem.zero_cells is not None:
        lower[problem.zero_cells] = -np.inf
        upper[problem.zero_cells] = np.inf
    bounds = np.column_stack([lower, upper])
    inv_w, target = problem.inv_w_flat, problem.target
    counter = {"f": 0, "it": 0}
    history: list = []
    best = certify(problem, np.zeros(cells))
    history.append((0, 0, best[3], best[4]))
    if best[4] <= feasibility and best[3] <= tol:
        return _outcome(best, 0, 0, True, "the unconstrained fit is feasible", start, history)

    unconstrained = fam.expand(target)  # b = E r_ref, the dual's linear term

    def fun_grad(scaled):
        # (5) = 1/2 k.(H k) + b.k = 1/2 k.(mu + b), with mu = H k + b its gradient: no cancellation.
        counter["f"] += 1
        kappa = s * scaled
        mu = fam.expand(target + inv_w * fam.adjoint(kappa))
        return 0.5 * float(kappa @ (mu + unconstrained)), s * mu

    class _Done(Exception):
        pass

    state = {"best": best, "stopped": "", "methods": []}

    def callback(scaled):
        counter["it"] += 1
        if counter["it"] % check_every:
            return
        point = certify(problem, s * scaled)
        noted((counter["it"], counter["f"], point[3], point[4]))
        if _better(point, state["best"], feasibility):
            state["best"] = point
        if point[4] <= feasibility and point[3] <= tol:
            state["stopped"] = "certified"
            raise StopIteration
        if time_limit is not None and time.perf_counter() - start > time_limit:
            state["stopped"] = "time limit"
            raise StopIteration
        if point[4] <= feasibility and point[3] <= state["polish_at"]:
            state["polish_at"] = point[3] / 100  # next interruption only after real progress
            raise StopIteration

    deadline = None if time_limit is None else start + time_limit
    state["polish_at"] = polish_gap

    def noted(entry) -> None:
        """A certified point for the history, and for the progress line (:mod:`dpopt.estimate.progress`)."""
        history.append(entry)
        report_progress(state["methods"][-1], entry[1], entry[2])

    def polished(point, products, aim: float = tol) -> bool:
        """Count a polish's products, keep its point if better; True when it is certified (gap
        within ``aim``)."""
        counter["f"] += products
        counter["it"] += products
        noted((counter["it"], counter["f"], point[3], point[4]))
        if _better(point, state["best"], feasibility):
            state["best"] = point
        return point[4] <= feasibility and point[3] <= aim

    x = np.zeros(cells)

    def run_path(solve, label: str) -> np.ndarray:
        """A whole-problem solver from the start; its certified points enter the history. Returns
        the scaled multipliers of its best point, for the paths after it. These first-order
        solvers stop at the release's tolerance ``accept``, not at ``tol``: their tails are slow
        (ADMM's gap fell about 10 % per 200 steps on adult's stand-in), where a Newton polish
        overshoots to ``tol`` for a few more products."""
        done = counter["it"]
        state["methods"].append(label)

        def logged(products, point):  # each certified point, for the record
            noted((done + int(products), done + int(products), point[3], point[4]))

        point, products = solve(done, logged)
        if polished(point, products, accept):
            state["stopped"] = f"certified ({label})"
        elif deadline is not None and time.perf_counter() > deadline:
            state["stopped"] = "time limit"
        return point[2] / s

    def admm_path():
        return run_path(lambda done, logged: run_admm(
            problem, max_products=max(max_iter - done, 1), deadline=deadline, stop_gap=accept, feasibility=feasibility,
            log=lambda step, products, point: logged(products, point),
            working=lambda products, gap: report_work("ADMM", done + products, gap)), "ADMM")

    admm_after_rounds = admm is None and alm is None and cells >= NEWTON_CELLS
    if admm if admm is not None else alm is None and cells >= ADMM_CELLS:
        x = admm_path()
        alm = newton = admm_after_rounds = False
    if alm if alm is not None else cells >= ALM_CELLS:
        start_kappa = x
        x = run_path(lambda done, logged: augmented_lagrangian(
            problem, start_kappa, certify_at, _better, max_products=max_iter, deadline=deadline, stop_gap=accept,
            feasibility=feasibility, log=lambda outer, products, rho_l, point, mu: logged(products, point)),
            "augmented Lagrangian")
        newton = False
    if newton if newton is not None else cells >= NEWTON_CELLS:
        state["methods"].append("projected Newton")
        point, products = polish(problem, x, max_iter=max_iter, rounds=NEWTON_ROUNDS, deadline=deadline,
                                 stop_gap=tol, feasibility=feasibility, forcing=NEWTON_FORCING, stall=NEWTON_STALL)
        if polished(point, products):
            state["stopped"] = "certified (projected Newton)"
        elif deadline is not None and time.perf_counter() > deadline:
            state["stopped"] = "time limit"
        x = point[2] / s
        if admm_after_rounds and not state["stopped"]:  # the rounds stalled: ADMM from the start
            x = admm_path()
    failed = ""  # why the last polish did not certify: not a stop (the next attempt polishes again)
    for attempt in range(restarts + 1 if not state["stopped"] else 0):
        remaining = max_iter - counter["it"]
        if remaining <= 0:
            state["stopped"] = "iteration limit"
            break
        if attempt == 0:
            state["methods"].append("L-BFGS-B and the CG polish")
        result = minimize(fun_grad, x, jac=True, method="L-BFGS-B", bounds=bounds, callback=callback,
                          options={"maxiter": remaining, "maxcor": memory, "ftol": 0.0, "gtol": 0.0,
                                   "maxfun": 10 * remaining})
        x = result.x
        point = certify(problem, s * x)
        if _better(point, state["best"], feasibility):
            state["best"] = point
        if state["stopped"]:
            break
        if point[4] <= feasibility and point[3] <= tol:
            state["stopped"] = "certified"
            break
        lbfgsb = "L-BFGS-B interrupted to polish" if result.status == 99 or "callback" in str(result.message) \
            else f"L-BFGS-B: {result.message}"
        remaining = max_iter - counter["it"]
        if remaining <= 0:  # the iteration budget covers the polish's CG steps too
            state["stopped"] = "iteration limit"
            break
        point, products = polish(problem, s * x, max_iter=remaining, deadline=deadline, stop_gap=tol,
                                 feasibility=feasibility)
        kappa = point[2]
        if polished(point, products):
            state["stopped"] = "certified (polished)"
            break
        if deadline is not None and time.perf_counter() > deadline:
            state["stopped"] = "time limit"
            break
        failed = f"{lbfgsb}; the polish did not certify"
        x = kappa / s
    state["stopped"] = state["stopped"] or failed
    best = state["best"]
    ok = best[4] <= feasibility and best[3] <= accept
    problem.cliques.release_work()  # the estimate keeps the family: not its solve-time work vectors
    return _outcome(best, counter["it"], counter["f"], ok, state["stopped"], start, history, state["methods"])


def _outcome(point, iterations, evaluations, ok, stopped, start, history, methods=()) -> Projection:
    r, mu, kappa, gap, viol, fun, dual = point
    return Projection(r, mu, kappa, fun, dual, gap, viol, iterations, evaluations, bool(ok), stopped,
                      time.perf_counter() - start, history, tuple(methods))


def _better(a, b, feasibility) -> bool:
    """Prefer points within the feasibility tolerance, then the smaller gap (else the smaller violation)."""
    fa, fb = a[4] <= feasibility, b[4] <= feasibility
    if fa != fb:
        return fa
    if not fa:
        return a[4] < b[4]
    return a[3] < b[3]
