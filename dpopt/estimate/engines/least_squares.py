"""The L2 engine: generalised least squares under the problem's constraints.

    minimise  sum_i ((Q x - y)_i / sigma_i)^2   subject to  constraints

The maximum-likelihood estimate under Gaussian noise and the best linear unbiased one
under any noise with these variances (Gauss–Markov; Li et al. 2015 use it to answer
workloads from a strategy's noisy answers). With only bounds (non-negativity, structural
zeros) it is a bounded least-squares problem, solved matrix-free when large; with
invariants or inequalities it is lifted to a sparse QP with one residual variable per
measured row, so that ``Q^T Q`` is never formed.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import LinearOperator, lsqr

from dpopt.errors import SolverError
from dpopt.estimate.backends import get_backend
from dpopt.estimate.engines.exact_fit import exact_fit_result
from dpopt.estimate.form import LeastSquaresForm, ProgramForm
from dpopt.estimate.policy import choose_backend
from dpopt.estimate.problem import ConsistencyProblem
from dpopt.estimate.result import Result, from_outcome, make_result
from dpopt.estimate.status import Status

#: Above this many stacked non-zeros the bounded least-squares path goes matrix-free.
MATRIX_FREE_NNZ = 3_000_000
#: Cells that join the NNLS working set per round, as a share of the measured rows.
BATCH_FRACTION = 0.05


def solve_l2(problem: ConsistencyProblem, backend: str | None, time_limit=None, *,
             working_set: bool | None = None, matrix_free: bool | None = None, verbose: bool = False,
             **options) -> Result:
    """Solve the L2 problem; ``working_set`` forces (True) or forbids (False) the NNLS
    working-set method, which by default runs for large non-negative bounds-only problems.
    ``matrix_free=True`` never forms the measurements' matrix (bounds only: the NNLS working
    set unless ``working_set=False``, else scipy's L-BFGS-B on the operator, ``O(cells + rows)``
    memory); None decides by size (:data:`MATRIX_FREE_NNZ`). The release
    plan asks for it when the explicit solve would not fit the memory limit
    (:mod:`dpopt.release.resources`).

    The weights ``1/σ`` are divided by their largest value before any form is built (the
    minimiser does not change; the solvers see weights of at most 1); the result's ``fun``
    is the objective in the problem's own weights."""
    start = time.perf_counter()
    cs = problem.constraints
    free = problem.free_cells()
    lower, upper = problem.cell_bounds()
    sigma = normalised_sigmas(problem)
    y = problem.targets()
    general = bool(cs.invariants or cs.inequalities)
    totals = _total_rows(problem, free)
    large = problem.nnz_estimate() > MATRIX_FREE_NNZ if matrix_free is None else bool(matrix_free)
    if matrix_free and (general or backend not in (None, "scipy") or options):
        raise SolverError("matrix_free=True solves problems with bounds only (non-negativity, structural zeros; "
                          "no invariant or inequality) with the scipy backend and no other option")
    if totals is not None and (working_set or (working_set is None and large)) and backend in (None, "scipy") \
            and not options and cs.nonnegative:
        # Large and non-negative with only the table's total fixed: the working set keeps
        # the total as an exact equality.
        return nnls_by_column_generation(problem, free, sigma, y, time_limit, start, equalities=totals)
    if not general:
        # Explicit matrices go to an interior-point QP (cvxpy/Clarabel: fast and accurate);
        # problems too large to hold explicitly are solved as NNLS over a working set of cells
        # when every free cell is non-negative, else matrix-free by scipy.
        matrix_free = large
        if working_set is None:
            working_set = matrix_free and backend in (None, "scipy") and cs.nonnegative and not options
        if working_set:
            if not cs.nonnegative or options or backend not in (None, "scipy"):
                raise SolverError("the NNLS working-set method needs non-negativity, the scipy backend and no options")
            # A table that reproduces every measurement has objective 0: on Fourier
            # coefficients over a large domain one is usually found far faster than NNLS runs.
            shortcut = exact_fit_result(problem, start, time_limit=time_limit)
            if shortcut is not None:
                return shortcut
            return nnls_by_column_generation(problem, free, sigma, y, time_limit, start)
        if matrix_free:
            M = _gathered_operator(problem.stacked_operator(), free)
        else:
            M = problem.stacked_sparse()[:, free]
        form = LeastSquaresForm(M, y, weights=1.0 / sigma, lower=lower[free], upper=upper[free])
        if not matrix_free and (backend is None or "QP" in get_backend(backend).kinds):
            # An explicit matrix: the lifted QP (one residual variable per row, no QᵀQ), which the
            # policy sends to an interior-point QP solver (fast and accurate at this size).
            form = form.to_program()
    else:
        form = lifted_qp(problem, free, lower, upper, sigma, y)
    engine = choose_backend(form, backend)
    info = {"variables": int(free.size), "rows": int(sigma.size), "form": type(form).__name__}
    # A solver's "optimal" is to its own tolerances in the scaled problem, whose objective count
    # scaling can make tiny: the point is also checked in noise units (noise_unit_kkt) and, when it
    # fails, solved once more at the tightest tolerance.
    for tolerance in (None, TIGHT_TOLERANCE):
        if tolerance is not None and "tolerance" in options:
            break
        extra = {} if tolerance is None else {"tolerance": tolerance}
        outcome = engine.solve(form, time_limit=time_limit, verbose=verbose, **options, **extra)
        x = None
        if outcome.x is not None:
            x = np.zeros(problem.num_cells)
            x[free] = outcome.x[: free.size]
        if not outcome.success or matrix_free_form(form):
            break
        polished = crossover(problem, x, free, sigma, y)
        if polished is not None:
            bound = int(np.count_nonzero((polished == 0.0) & (x != 0.0)))
            x, info["crossover"] = polished, ("support solved exactly (active-set polish of the interior point; "
                                              f"{bound} cells put exactly on their bound)")
        if problem.constraints.inequalities:
            break
        worst = noise_unit_kkt(problem, x, free)
        info["kkt_noise_units"] = worst
        if worst <= NOISE_UNIT_TOL:
            if tolerance is not None:
                info["tightened"] = f"solved again at tolerance {tolerance:g}: the first point failed the noise-unit check"
            break
        outcome = dataclasses.replace(
            outcome, status=Status.NUMERICAL_ERROR, incumbent=True,
            message=f"{outcome.message}; the solver called its point optimal but it is {worst:.2g} noise "
                    f"standard deviations from stationarity in some cell (tolerance {NOISE_UNIT_TOL:g})")
    return from_outcome(outcome, x, objective="l2", problem=problem, time=time.perf_counter() - start, info=info)


#: Largest stationarity residual, in a cell's noise standard deviations, of a released L2 point.
NOISE_UNIT_TOL = 1.0
#: The solver tolerance of the second solve when the first point fails :func:`noise_unit_kkt`.
TIGHT_TOLERANCE = 1e-10


def noise_unit_kkt(problem: ConsistencyProblem, x: np.ndarray, free: np.ndarray) -> float:
    """How far ``x`` is from stationarity, in noise standard deviations, whatever the count scale.

    The duality-gap certificate is relative to the objective's size, which count scaling can make
    10⁻⁸ (counts of 10⁸ beside noise of 30): a point 20 standard deviations from the optimum then
    passed it. Here, from the point alone, with the gradient ``g = Qᵀ Σ⁻¹ (Q x − y)`` and each
    cell's noise unit ``u_j = 1/√H_jj`` (``H_jj = Σ_i Q_ij²/σ_i²``): the multipliers ``λ`` of the
    invariants and ``μ ≥ 0`` of the cells at (or within 10⁻³ noise units of) their lower bound
    that make the stationarity residual ``r = g − Aᵀλ − μ`` smallest in ``Σ_j (u_j r_j)²`` (a
    bounded least-squares problem), and then the largest ``|u_j r_j|``: the projected-Newton
    step of cell ``j`` in its own noise units. Zero exactly at a KKT point.
    """
    from scipy.optimize import lsq_linear

    Q = problem.stacked_sparse()[:, free]
    sigma = problem.sigmas()
    v = x[free]
    g = Q.T @ ((Q @ v - problem.targets()) / sigma**2)
    h = cell_curvature(Q, 1.0 / sigma)
    measured = h > 0
    if not measured.any():
        return 0.0
    unit = 1.0 / np.sqrt(np.where(measured, h, h[measured].min()))
    lower = problem.cell_bounds()[0][free]
    at_bound = np.flatnonzero(v - lower <= 1e-3 * unit)
    A = sp.csr_matrix(problem.constraints.equality_rows()[0])[:, free]
    columns = [A.T] if A.shape[0] else []
    if at_bound.size:
        columns.append(sp.csr_matrix((np.ones(at_bound.size), (at_bound, np.arange(at_bound.size))),
                                     shape=(v.size, at_bound.size)))
    if not columns:
        return float(np.abs(g * unit).max(initial=0.0))
    M = sp.csr_matrix(sp.diags(unit) @ sp.hstack(columns))
    lo = np.concatenate([np.full(A.shape[0], -np.inf), np.zeros(at_bound.size)])
    fit = lsq_linear(M, g * unit, bounds=(lo, np.full(lo.size, np.inf)), lsmr_tol="auto", tol=1e-12, max_iter=200)
    return float(np.abs(M @ fit.x - g * unit).max(initial=0.0))


def cell_curvature(Q, w: np.ndarray) -> np.ndarray:
    """``H_jj = Σ_i Q_ij² w_i²`` per column of the sparse ``Q``: the weighted loss's curvature in
    each cell, the gradient one count there makes."""
    return np.asarray(Q.multiply(Q).T @ (w * w)).ravel()


def matrix_free_form(form) -> bool:
    return isinstance(form, LeastSquaresForm) and form.is_matrix_free


#: Largest support (plus equality rows) the active-set polish solves with a dense KKT system.
CROSSOVER_MAX = 3000
#: Work bound of the polish: cells² × (rows of the squared system + equalities). Lawson–Hanson
#: costs about that many flops; above it (a top-down parent of 2,000 cells under 9,000 rows took
#: 78 s) the interior point, already certified, is released without the polish.
CROSSOVER_FLOPS = 2e9


def crossover(problem: ConsistencyProblem, x: np.ndarray, free: np.ndarray, sigma: np.ndarray, y: np.ndarray,
              tol: float = 1e-9) -> np.ndarray | None:
    """The interior-point solution ``x`` moved exactly onto the optimal face, or None.

    An interior-point method stops near the optimal face, leaving e.g. 0.02 persons on cells
    that belong at 0 next to a count of 500. The face is ``{x ≥ 0 : Q x = b*, A x = b}`` with
    ``b* = Q x*`` the optimal answers, which are unique (the loss is strictly convex in
    ``Q x``). ``b*`` comes from an exact vertex optimum: Lawson and Hanson's active-set NNLS
    with the equalities (:func:`_working_set_solve`) on the candidate cells (every free cell
    when there are at most :data:`CROSSOVER_MAX`, else those above 1e-7 of the largest),
    checked against the KKT conditions of the full problem (a reduced gradient ``g + Aᵀ μ``
    that vanishes on its positive cells and is non-negative on every other free cell, to
    ``tol`` relative). The cells whose reduced gradient exceeds ``tol`` there are 0 in every
    optimal table (strict complementarity: ``μ·x`` is constant, 0, on ``{Q x = b*, A x = b}``), so
    ``x`` puts them on their bound, exactly 0, and takes the smallest change of its other positive
    cells that meets ``Q x = b*`` and ``A x = b`` (LSQR); where that turns a cell negative (an exact
    fit has no positive multiplier, so no cell is put on its bound), the point furthest from the
    vertex towards it with no cell negative, optimal too since every table meeting those equations
    is. It is kept when the equations hold to 1e-10 and the KKT test passes again at it.
    The vertex itself is not returned: when the optimum is not unique it is the sparsest
    optimal table, while the interior point is a central one (on czech with all 2-way
    marginals the vertex's 3-way errors were twice the central point's).
    Non-negative problems without inequalities only.
    """
    cs = problem.constraints
    if x is None or cs.inequalities or not cs.nonnegative or not problem.noisy:
        return None
    A_eq, b_eq, _ = cs.equality_rows()
    A_eq = sp.csr_matrix(A_eq)
    k = A_eq.shape[0]
    top = float(x[free].max(initial=0.0))
    work = free if free.size <= CROSSOVER_MAX else free[x[free] > 1e-7 * top]
    if work.size == 0 or work.size + k > CROSSOVER_MAX:
        return None
    Q = problem.stacked_sparse().tocsr()
    if float(work.size) ** 2 * (min(Q.shape[0], work.size) + k) > CROSSOVER_FLOPS:
        return None
    w = 1.0 / sigma
    block, target = _square_system(sp.diags(w) @ Q[:, work], w * y)
    values, failure = _working_set_solve(block, target, (A_eq, b_eq) if k else None, work)
    if failure is not None:
        return None
    vertex = np.zeros_like(x)
    vertex[work] = values
    if k and np.abs(A_eq @ vertex - b_eq).max() > tol * max(1.0, float(np.abs(b_eq).max())):
        return None
    # The gradient's scale: that of the measurements, or of one count in a cell (H_jj = Σ_i Q_ij² w_i²)
    # when the measurements are all 0 (then the optimum is x = 0 with zero multipliers, and a
    # scale of 0 failed the rounding-level residues of the face's solve: the interior point's
    # 1.7e-5 per cell was released instead).
    per_count = float(cell_curvature(Q[:, free], w).max(initial=0.0))
    scale = max(float(np.abs(Q.T @ (w * w * y)).max(initial=0.0)), per_count, 1e-300)
    gradient, zero = _kkt_at(vertex, Q, w, y, (A_eq, b_eq) if k else None, free, tol * scale)
    if gradient is None:
        return None
    # Onto the face. On the affine set {Q x = b*, A x = b} the bound multipliers' total
    # mu·x = g·x + nu·b is constant, and it is 0 at the vertex: a table there with x >= 0 has
    # x_j = 0 wherever mu_j > 0. Those cells (strictly complementary: mu_j above the tolerance the
    # check above certifies) are put on their bound; the least change of x's other positive cells
    # then meets Q x = b* and A x = b. Moving every positive cell instead spread the interior
    # point's residue on the bound cells (up to 3e-3 of a count) over the others, turned some bound
    # cells negative, and the polish was dropped (bench_l2_crossover.py: in 56 of 60 reproducer fits).
    bound = zero & (gradient > tol * scale)
    start = x.copy()
    start[bound] = 0.0
    rows = sp.vstack([Q, A_eq]).tocsr() if k else Q
    target = np.concatenate([Q @ vertex, b_eq]) if k else Q @ vertex
    support = free[(start[free] > 0) | (vertex[free] > 0)]  # the vertex's cells always move: Q x = b* is met
    delta = lsqr(rows[:, support], target - rows @ start, atol=1e-15, btol=1e-15, iter_lim=20 * support.size + 100)[0]
    moved = start
    moved[support] += delta
    floor = 1e-12 * max(top, 1.0)
    if (moved[support] < -floor).any():
        # Every table on the affine set {Q x = b*, A x = b} has the optimal answers; the vertex is one
        # and is >= 0, so the point of the segment from it towards ``moved`` that is furthest from it
        # with no cell negative is optimal too, and as central as that segment allows. Needed where
        # no multiplier is positive (an exact fit: measurements that agree, e.g. all 0): then no cell
        # is put on its bound above, and the least change leaves the interior point's residue in the
        # null space of Q, below 0 in some cells.
        low = moved[support] < 0.0
        step = vertex[support][low] / (vertex[support][low] - moved[support][low])
        moved[support] = vertex[support] + float(step.min()) * (moved[support] - vertex[support])
    moved[support] = np.maximum(moved[support], 0.0)
    answers_scale = max(1.0, float(np.abs(target).max(initial=0.0)))
    if np.abs(rows @ moved - target).max() > 1e-10 * answers_scale:
        return None
    # Certified again at the released point itself, in its exact zeros: the same KKT test as the vertex's.
    if _kkt_at(moved, Q, w, y, (A_eq, b_eq) if k else None, free, tol * scale)[0] is None:
        return None
    return moved


def _kkt_at(point, Q, w, y, equalities, free, tol):
    """``(reduced gradient, free cells at 0)`` when ``point`` meets the KKT conditions of
    ``min ‖diag(w)(Q x − y)‖²`` over ``x ≥ 0`` (and the equalities) to ``tol``: a reduced gradient
    ``g + Aᵀν`` (``ν`` fitted on the positive cells) within ``tol`` of 0 on ``point``'s positive cells
    and above ``−tol`` on its other free cells; ``(None, None)`` otherwise."""
    gradient = Q.T @ (w * w * (Q @ point - y))
    if equalities is not None:
        gradient = _reduced_gradient(gradient, equalities, point)
    positive = point > 0
    zero = np.zeros(point.size, dtype=bool)
    zero[free] = True
    zero &= ~positive
    if np.abs(gradient[positive]).max(initial=0.0) > tol or gradient[zero].min(initial=0.0) < -tol:
        return None, None
    return gradient, zero


def nnls_by_column_generation(problem, free, sigma, y, time_limit, start, *, equalities=None, tol=1e-9,
                               max_rounds=500) -> Result:
    """Non-negative least squares over a growing working set of cells (Lawson–Hanson inside).

    A minimiser with at most as many positive cells as measured rows exists (the optimal
    answers ``Q x`` are unique and ``{x >= 0 : Q x = Q x*}`` is a polytope whose vertices
    have such a support), so the problem is solved on a working set ``J`` of cells with
    ``scipy.optimize.nnls`` on the dense columns ``Q[:, J]``; every other cell is priced by
    the gradient ``Q^T W (Q x - y)``, one adjoint product, and the most negative ones join
    ``J``. It stops when no cell has a gradient below ``-tol`` times the gradient's scale:
    the KKT conditions of the full problem, which the result reports.

    ``equalities = (A, b)`` adds exact rows ``A x = b`` (e.g. the table's total). The
    working-set problem then appends them with a large weight to find the active set and
    finishes with the exact equality-constrained solve on it; cells are priced by the
    reduced gradient ``g + A^T mu``, the multipliers ``mu`` fitted on the positive cells
    (where the reduced gradient vanishes at the optimum).
    """
    w = 1.0 / sigma
    op = problem.stacked_operator()
    n = problem.num_cells
    is_free = np.zeros(n, dtype=bool)
    is_free[free] = True
    scale = float(np.abs(op.rmatvec(w * w * y)).max()) or 1.0
    gradient = -op.rmatvec(w * w * y)
    batch = max(50, int(y.size * BATCH_FRACTION))
    work = np.zeros(0, dtype=np.int64)
    x = np.zeros(n)
    status, message = Status.ITERATION_LIMIT, f"stopped after {max_rounds} working-set rounds"
    for rounds in range(1, max_rounds + 1):
        candidates = np.flatnonzero(is_free & (gradient < -tol * scale))
        candidates = candidates[x[candidates] <= 0]
        if candidates.size == 0:
            status, message = Status.OPTIMAL, (
                f"KKT conditions hold to {tol:g} relative after {rounds - 1} rounds "
                f"({work.size} cells in the working set, {int((x > 0).sum())} positive)")
            break
        # The batch grows with the support found so far: supports range from a few percent
        # of the rows (noisy marginals) to nearly all of them (Fourier coefficients).
        size = max(batch, int((x > 0).sum()) // 2)
        enter = candidates[np.argsort(gradient[candidates], kind="stable")[:size]]
        work = np.union1d(work[x[work] > 0], enter)  # drop cells that stayed at zero
        block, target = _square_system(sp.diags(w) @ _columns(problem, work), w * y)
        solution, failure = _working_set_solve(block, target, equalities, work)
        if failure is not None:
            status, message = failure
            break
        x = np.zeros(n)
        x[work] = solution
        gradient = op.rmatvec(w * w * (op.matvec(x) - y))
        if equalities is not None:
            gradient = _reduced_gradient(gradient, equalities, x)
        if time_limit is not None and time.perf_counter() - start > time_limit:
            status, message = Status.TIME_LIMIT, f"time limit after {rounds} working-set rounds"
            break
    fun = float(np.sum((w * (op.matvec(x) - y)) ** 2))
    info = {"variables": int(free.size), "rows": int(y.size), "form": "NNLS working set",
            "working_set": int(work.size), "rounds": rounds}
    return make_result(status, x, message=message, fun=fun, objective="l2", backend="scipy",
                       solver="scipy.optimize.nnls (working-set column generation)",
                       time=time.perf_counter() - start, nit=rounds, problem=problem, info=info,
                       incumbent=status is not Status.OPTIMAL)


def normalised_sigmas(problem: ConsistencyProblem) -> np.ndarray:
    """The noise standard deviations divided by their smallest value (weights ``1/σ`` at most 1)."""
    sigma = problem.sigmas()
    return sigma / sigma.min() if sigma.size else sigma


def _total_rows(problem, free):
    """``(A, b)`` when every invariant fixes the table's total (one row of ones over the
    free cells), else None: the equalities the NNLS working set handles exactly."""
    cs = problem.constraints
    if not cs.invariants or cs.inequalities:
        return None
    A, b, _ = cs.equality_rows()
    ones = np.zeros(problem.num_cells)
    ones[free] = 1.0
    A = sp.csr_matrix(A)
    if not all(np.allclose(A[i].toarray().ravel()[free], 1.0) for i in range(A.shape[0])):
        return None
    if not np.allclose(b, b[0]):
        return None  # conflicting totals: the general path reports the conflict
    return sp.csr_matrix(ones[None, :]), b[:1].astype(np.float64)


def _working_set_solve(block, target, equalities, work):
    """``min ||block v - target||^2`` over ``v >= 0`` (and ``A[:, work] v = b``): (v, None)
    or (None, (status, message)) when the equalities cannot be met on the working set."""
    from scipy.optimize import nnls

    maxiter = 50 * max(1, work.size)
    if equalities is None:
        return nnls(block, target, maxiter=maxiter)[0], None
    A, b = equalities
    A = A[:, work].toarray()
    # Lawson–Hanson on the equalities appended with a large weight finds the active set;
    # the exact equality-constrained solve on it (with Lawson–Hanson's step-back) finishes.
    weight = 1e4 * max(1.0, _spectral_norm(block)) / max(1.0, float(np.abs(A).max()))
    v = nnls(np.vstack([block, weight * A]), np.concatenate([target, weight * b]), maxiter=maxiter)[0]
    v = _equality_step_back(block, target, A, b, v)
    if v is None or not np.allclose(A @ v, b, rtol=1e-9, atol=1e-9):
        return None, (Status.NUMERICAL_ERROR, f"the exact equalities could not be met on the {work.size}-cell working set")
    return v, None


def _spectral_norm(M: np.ndarray, iterations: int = 30) -> float:
    """``||M||_2`` to a few percent by power iteration on ``MᵀM`` (a weight's scale needs no more;
    the exact norm is a full SVD, which cost more than the whole solve on large working sets)."""
    v = np.ones(M.shape[1]) / np.sqrt(max(M.shape[1], 1))
    norm = 0.0
    for _ in range(iterations):
        u = M.T @ (M @ v)
        size = float(np.linalg.norm(u))
        if size == 0.0:
            return 0.0
        v, norm = u / size, size
    return float(np.sqrt(norm))


def _equality_step_back(R, t, A, b, v):
    """From ``v >= 0``, the minimiser of ``||R v - t||`` with ``A v = b`` on ``v``'s support,
    stepping back (Lawson & Hanson 1974, Alg. NNLS steps 7-11) whenever a cell would turn
    negative and dropping it; None if the support empties."""
    passive = v > 0
    for _ in range(v.size + 1):
        idx = np.flatnonzero(passive)
        if idx.size == 0:
            return None
        Rp, Ap = R[:, idx], A[:, idx]
        k = Ap.shape[0]
        kkt = np.block([[Rp.T @ Rp, Ap.T], [Ap, np.zeros((k, k))]])
        s = np.linalg.lstsq(kkt, np.concatenate([Rp.T @ t, b]), rcond=None)[0][: idx.size]
        if np.all(s > 0):
            out = np.zeros_like(v)
            out[idx] = s
            return out
        falling = s <= 0
        alpha = np.min(v[idx][falling] / (v[idx][falling] - s[falling]))
        v = v.copy()
        v[idx] = v[idx] + alpha * (s - v[idx])
        passive &= v > 1e-14 * max(1.0, float(v.max()))
        v[~passive] = 0.0
    return None


def _reduced_gradient(gradient: np.ndarray, equalities, x: np.ndarray) -> np.ndarray:
    """``g + A^T mu`` with ``mu`` the least-squares multipliers on the positive cells."""
    A, _ = equalities
    positive = np.flatnonzero(x > 0)
    if positive.size == 0:
        return gradient
    mu = np.linalg.lstsq(A[:, positive].toarray().T, -gradient[positive], rcond=None)[0]
    return gradient + A.T @ mu


def _square_system(A: sp.csc_matrix, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(R, t)`` with ``||A v - b||^2 = ||R v - t||^2 + const`` and ``R`` no taller than wide.

    From the eigen-decomposition of the (sparse, cheap) Gram matrix ``A^T A = V L V^T``:
    ``R = L^(1/2) V^T`` and ``t = L^(-1/2) V^T A^T b`` on the non-zero eigenvalues
    (``A^T b`` lies in the range of ``A^T A``), so rank-deficient working sets are fine.
    """
    if sp.issparse(A) and A.nnz > 0.05 * A.shape[0] * A.shape[1]:
        A = A.toarray()  # dense columns (Fourier parities): BLAS beats sparse products
    if A.shape[0] <= A.shape[1]:  # already no taller than wide: nothing to gain
        A = A.toarray() if sp.issparse(A) else np.asarray(A)
        return A, np.asarray(b, dtype=np.float64)
    gram = A.T @ A
    gram = gram.toarray() if sp.issparse(gram) else np.asarray(gram)
    eigval, eigvec = np.linalg.eigh(gram)
    keep = eigval > 1e-12 * max(float(eigval.max()), 1e-300)
    root = np.sqrt(eigval[keep])
    R = root[:, None] * eigvec[:, keep].T
    t = (eigvec[:, keep].T @ (A.T @ b)) / root
    return R, t


def _columns(problem, cells) -> sp.csc_matrix:
    workload = problem.marginal_workload()
    if workload is not None:
        return workload.columns(cells)
    return sp.vstack([m.query.columns(cells) for m in problem.noisy]).tocsc()


def lifted_qp(problem, free, lower, upper, sigma, y) -> ProgramForm:
    """``min sum r_i^2 / sigma_i^2`` s.t. ``Q x - r = y``, invariants, inequalities, bounds."""
    cs = problem.constraints
    n, k = free.size, sigma.size
    Q = problem.stacked_sparse()[:, free]
    blocks = [sp.hstack([Q, -sp.identity(k, format="csr")])]
    lo, hi, names = [y], [y], problem.row_names()
    A_eq, b_eq, eq_names = cs.equality_rows()
    if A_eq.shape[0]:
        blocks.append(sp.hstack([A_eq[:, free], sp.csr_matrix((A_eq.shape[0], k))]))
        lo.append(b_eq), hi.append(b_eq), names.extend(f"invariant:{nm}" for nm in eq_names)
    A_in, l_in, u_in, in_names = cs.inequality_rows()
    if A_in.shape[0]:
        blocks.append(sp.hstack([A_in[:, free], sp.csr_matrix((A_in.shape[0], k))]))
        lo.append(l_in), hi.append(u_in), names.extend(f"inequality:{nm}" for nm in in_names)
    P = sp.diags(np.concatenate([np.zeros(n), 2.0 / sigma**2])).tocsc()
    return ProgramForm(
        c=np.zeros(n + k),
        A=sp.vstack(blocks).tocsr(),
        row_lower=np.concatenate(lo),
        row_upper=np.concatenate(hi),
        row_names=names,
        lower=np.concatenate([lower[free], np.full(k, -np.inf)]),
        upper=np.concatenate([upper[free], np.full(k, np.inf)]),
        P=P,
    )


def _gathered_operator(op: LinearOperator, free: np.ndarray) -> LinearOperator:
    """``op`` restricted to the columns ``free`` (pinned cells are dropped), matrix-free."""
    n = op.shape[1]
    if free.size == n:
        return op

    def matvec(v):
        full = np.zeros(n)
        full[free] = np.ravel(v)
        return op.matvec(full)

    return LinearOperator(
        (op.shape[0], free.size), matvec=matvec, rmatvec=lambda u: op.rmatvec(np.ravel(u))[free], dtype=np.float64
    )
