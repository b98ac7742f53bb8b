"""The entropy engine: multiplicative weights (entropic mirror descent) over the scaled simplex.

Starting from the uniform table with the problem's total ``N``, every measurement in turn
updates the table multiplicatively,

    x  <-  x * exp( eta_i * Q_i^T (y_i - Q_i x) ),   renormalised to N,

which for a single counting query is exactly the MWEM update of Hardt, Ligett and
McSherry (NIPS 2012, Fig. 1, step 3: ``exp(q(x)(m - q(A))/(2N))``), with
``eta_i = 1/(2 N s_i)`` scaled by the measurement's precision relative to the most precise
one (``s_i``: the largest column L1 norm of ``Q_i``, 1 for a marginal). Repeated passes are
the paper's "iterate the update over all past measurements". Between passes the step grows
by half (up to 64 times the paper's) while the weighted squared residual keeps falling, and
a pass that raises it is undone with a smaller step: the same fixed points, reached in far
fewer passes near the boundary, where multiplicative updates converge only sublinearly. Mirror descent from the
uniform table converges to the minimum-KL (maximum-entropy) table among those that fit
the measurements best. Structural zeros are cells pinned at zero from the start (a
multiplicative update keeps them there); invariants of counting queries with disjoint
rows (totals, marginals) are imposed after every update by iterative proportional fitting,
the Bregman projection for the KL divergence.
"""

from __future__ import annotations

import time

import numpy as np

from dpopt.errors import SolverError
from dpopt.estimate.engines.max_entropy import exact_entropy_applies, simplex_gap, solve_max_entropy
from dpopt.estimate.problem import ConsistencyProblem
from dpopt.estimate.engines.proportional import BoostSchedule, counting_invariant, proportional_fit
from dpopt.estimate.result import Result, make_result
from dpopt.estimate.status import Status
from dpopt.estimate.certificates.verify import largest_eigenvalue, project_rows

ENTROPY_OPTIONS = ("max_passes", "tol", "ipf_sweeps", "initial", "simultaneous")
#: The entropy objective's solvers: the exact two-stage method (:mod:`dpopt.estimate.engines.max_entropy`)
#: and multiplicative weights (this module).
ENTROPY_BACKENDS = ("exact", "mw")
#: Largest multiple of the paper's step the adaptive schedule may reach.
MAX_BOOST = 64.0
#: A converged multiplicative-weights run is OPTIMAL only when its projected-gradient step is below
#: this share of the largest cell. Mirror descent converges sublinearly near the boundary, so this
#: is looser than the solvers' 1e-6 (CERTIFICATE_TOL); the figure is in info["natural_residual"].
MW_CERTIFICATE_TOL = 1e-3



def solve_entropy(
    problem: ConsistencyProblem,
    backend: str | None = None,
    time_limit: float | None = None,
    *,
    initial: np.ndarray | None = None,
    verbose: bool = False,
    **options,
) -> Result:
    """The entropy objective: the maximum-entropy table among the best fits with total ``N``.

    Backends: ``"exact"`` (the default where it applies: non-negative tables without
    inequalities) computes it in two convex stages, a least-squares fit and an
    exponential-cone program on the optimal face (:mod:`dpopt.estimate.engines.max_entropy`);
    ``"mw"`` runs multiplicative weights from the uniform table (this module's notes),
    which approaches the same point, only sublinearly near the boundary, and takes the
    options ``max_passes``, ``tol``, ``ipf_sweeps`` and ``simultaneous`` (passing one of
    them selects ``"mw"`` when no backend is named). ``initial`` is the prior of the KL for
    ``"exact"`` and the starting table for ``"mw"``.

    ``simultaneous`` makes each pass one update with the summed gradient of every
    measurement (one product with the stacked operator, which for a marginal workload is
    one Walsh–Hadamard transform) instead of one update per measurement in turn; the
    default chooses it for problems with more than 50 measurements over 10^4 cells.
    """
    if backend not in (None, *ENTROPY_BACKENDS):
        raise SolverError(f"the entropy objective is solved by one of the backends {list(ENTROPY_BACKENDS)}, not {backend!r}")
    unknown = sorted(set(options) - {"max_passes", "tol", "ipf_sweeps", "simultaneous", "face_tol"})
    if unknown:
        raise SolverError(f"unknown options {unknown} for the entropy objective; accepted: {list(ENTROPY_OPTIONS)} "
                          "(backend 'mw') and ['face_tol', 'initial'] (backend 'exact')")
    mw_options = {k: options.pop(k) for k in ("max_passes", "tol", "ipf_sweeps", "simultaneous") if k in options}
    start = time.perf_counter()
    total = problem.positive_total("entropy")
    if backend is None:
        backend = "exact" if exact_entropy_applies(problem) and not mw_options else "mw"
    if backend == "exact":
        if mw_options:
            raise SolverError(f"options {sorted(mw_options)} belong to the 'mw' backend, not 'exact'")
        if not exact_entropy_applies(problem):
            raise SolverError("the 'exact' entropy backend needs non-negativity, at least one noisy measurement "
                              "and no linear inequalities; use backend 'mw'")
        return solve_max_entropy(problem, total, time_limit, prior=initial, **options)
    if options:
        raise SolverError(f"option(s) {sorted(options)} belong to the 'exact' backend, not 'mw'")
    max_passes = int(mw_options.get("max_passes", 1000))
    tol = float(mw_options.get("tol", 1e-6))
    ipf_sweeps = int(mw_options.get("ipf_sweeps", 10))
    simultaneous = mw_options.get("simultaneous")
    free = problem.free_cells()
    x = np.zeros(problem.num_cells)
    if initial is None:
        x[free] = total / free.size
    else:
        x[free] = np.maximum(np.asarray(initial, dtype=np.float64)[free], 0) + 1e-12
        x *= total / x.sum()
    invariants = [counting_invariant(inv.query, inv.values, repr(inv.name)) for inv in problem.constraints.invariants]
    if problem.constraints.inequalities:
        raise SolverError("the 'mw' backend does not support linear inequalities; use objective 'l2' or 'l1'")
    min_var = min((m.variance for m in problem.noisy), default=1.0)
    steps = [
        (m, (min_var / m.variance) / (2.0 * total * _max_column_l1(m.query))) for m in problem.noisy
    ]
    if simultaneous is None:
        simultaneous = len(steps) > 50 and problem.num_cells > 10_000
    max_boost = MAX_BOOST
    if simultaneous:
        # One step along the summed gradient; the paper's step is shared among the measurements.
        op, targets = problem.stacked_operator(), problem.targets()
        row_eta = np.concatenate([np.full(m.query.num_rows, eta) for m, eta in steps]) / len(steps)
        max_boost = MAX_BOOST * len(steps)
        inv_var = 1.0 / problem.sigmas() ** 2
    x = proportional_fit(x, invariants, ipf_sweeps)
    schedule = BoostSchedule(max_boost, _loss(problem, x))
    answers = op.matvec(x) if simultaneous else None
    status, message, passes = Status.ITERATION_LIMIT, f"stopped after {max_passes} passes", max_passes
    for sweep in range(1, max_passes + 1):
        previous, previous_answers = x, answers
        if simultaneous:
            x = _multiply(x, schedule.boost * op.rmatvec(row_eta * (targets - answers)), rescaled=not invariants)
            if not invariants:
                x *= total / x.sum()
            x = proportional_fit(x, invariants, ipf_sweeps)
        for m, eta in steps if not simultaneous else ():
            residual = m.values - m.query.matvec(x)
            x = _multiply(x, schedule.boost * eta * m.query.rmatvec(residual), rescaled=not invariants)
            if not invariants:
                x *= total / x.sum()
            x = proportional_fit(x, invariants, ipf_sweeps)
        if simultaneous:
            answers = op.matvec(x)
            new_loss = float(np.sum((answers - targets) ** 2 * inv_var))
        else:
            new_loss = _loss(problem, x)
        if not schedule.accept(new_loss):
            # The enlarged step overshot: undo the pass and fall back towards the paper's step.
            x, answers = previous, previous_answers
            continue
        change = np.abs(x - previous).sum() / total
        if change < tol:
            status, message, passes = Status.OPTIMAL, f"converged after {sweep} passes (L1 change {change:.2e} of the total)", sweep
            break
        if time_limit is not None and time.perf_counter() - start > time_limit:
            status, message, passes = Status.TIME_LIMIT, f"time limit after {sweep} passes", sweep
            break
    if not np.isfinite(x).all():
        status, message = Status.NUMERICAL_ERROR, f"the multiplicative updates left non-finite cells after {passes} passes"
        return make_result(status, None, message=message, fun=None, objective="entropy", backend="mw",
                           solver="multiplicative weights", time=time.perf_counter() - start, nit=passes,
                           problem=problem, info={"total": total, "passes": passes})
    fun = _loss(problem, x)
    info = {"total": total, "passes": passes}
    gap = _frank_wolfe_gap(problem, x, free, invariants)
    if gap is not None:
        info["duality_gap"] = gap
    if status is Status.OPTIMAL:
        # A small last step is not a certificate: the projected-gradient step must vanish too.
        residual = _natural_residual(problem, x, free, invariants, total)
        info["natural_residual"] = residual
        if residual is None or residual > MW_CERTIFICATE_TOL:
            status = Status.ITERATION_LIMIT
            message += ("; not certified optimal: no projection onto these invariants" if residual is None else
                        f"; not certified optimal: projected-gradient step {residual:.2e} of the largest cell "
                        f"(tolerance {MW_CERTIFICATE_TOL:g})")
    return make_result(
        status, x, message=message, fun=fun, objective="entropy", backend="mw",
        solver="multiplicative weights", time=time.perf_counter() - start, nit=passes, problem=problem,
        info=info, incumbent=status is not Status.OPTIMAL,
    )


def _multiply(x: np.ndarray, exponent: np.ndarray, rescaled: bool) -> np.ndarray:
    """``x * exp(exponent)`` without overflow.

    When the caller renormalises to the total afterwards, a common shift of the exponent
    (its largest value over cells with mass) changes nothing and keeps ``exp`` finite;
    otherwise the exponent is capped where ``exp`` would overflow.
    """
    if rescaled:
        alive = x > 0
        if alive.any():
            exponent = exponent - exponent[alive].max()
    return x * np.exp(np.minimum(exponent, 700.0))


def _loss(problem: ConsistencyProblem, x: np.ndarray) -> float:
    """The weighted squared residual the updates descend: sum ((Q x - y) / sigma)^2."""
    if len(problem.noisy) > 50:
        residual = problem.stacked_operator().matvec(x) - problem.targets()
        return float(np.sum(residual**2 / problem.sigmas() ** 2))
    return float(sum((m.residuals(x) ** 2).sum() / m.variance for m in problem.noisy))


def _max_column_l1(query) -> float:
    powers = query.column_norm_powers(1)
    return float(np.max(powers)) if np.ndim(powers) else float(powers)


def _frank_wolfe_gap(problem: ConsistencyProblem, x: np.ndarray, free: np.ndarray, invariants) -> float | None:
    """The Frank–Wolfe gap ``<g, x> − min_{z feasible} <g, z>`` of the weighted squared loss,
    an upper bound on ``loss(x) − min loss`` (convexity), over the scaled simplex (no invariants)
    or, when the invariants' rows are disjoint and cover every free cell, over the product of the
    rows' scaled simplices; None otherwise."""
    if not problem.noisy:
        return 0.0  # no loss: every feasible table is a best fit
    if not invariants:
        return simplex_gap(problem, x, free)
    from dpopt.estimate.engines.separable import row_groups

    groups = row_groups(problem)
    if groups is None or (groups[0][free] < 0).any():
        return None
    group, targets = groups
    op = problem.stacked_operator()
    gradient = op.rmatvec(2.0 * (op.matvec(x) - problem.targets()) / problem.sigmas() ** 2)
    g, grad = group[free], gradient[free]
    order = np.lexsort((grad, g))
    first = np.concatenate([[True], np.diff(g[order]) != 0])
    lowest = np.zeros(targets.size)
    lowest[g[order][first]] = grad[order][first]
    return float(gradient @ x - lowest @ targets)


def _natural_residual(problem: ConsistencyProblem, x: np.ndarray, free: np.ndarray, invariants,
                      total: float) -> float | None:
    """``|x − P(x − ∇loss(x) / L)|`` over the largest cell, ``P`` the projection onto the feasible
    set (the scaled simplex, or the invariants' disjoint rows when they cover every free cell)
    and ``L`` the gradient's Lipschitz constant: 0 exactly at the best fits; None when the
    invariants overlap (no cheap projection)."""
    from dpopt.estimate.engines.separable import row_groups

    if not problem.noisy:
        return 0.0

    if invariants:
        groups = row_groups(problem)
        if groups is None or (groups[0][free] < 0).any():
            return None
        group, targets = groups[0][free], groups[1]
    else:
        group, targets = np.zeros(free.size, dtype=np.int64), np.array([total])
    op = problem.stacked_operator()
    w = 1.0 / problem.sigmas() ** 2
    gradient = op.rmatvec(2.0 * w * (op.matvec(x) - problem.targets()))[free]

    def gram(u):
        full = np.zeros(x.size)
        full[free] = u
        return op.rmatvec(2.0 * w * op.matvec(full))[free]

    lipschitz = largest_eigenvalue(gram, free.size)
    step = project_rows(x[free] - gradient / max(lipschitz, 1e-300), group, targets)
    return float(np.abs(x[free] - step).max(initial=0.0)) / max(float(x[free].max(initial=0.0)), 1e-300)
