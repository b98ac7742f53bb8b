"""The L1 and L-infinity engines: linear programs, by column generation over cells when large.

L1:    minimise  sum_i |(Q x - y)_i| / sigma_i       (Laplace maximum likelihood)
L-inf: minimise  max_i |(Q x - y)_i| / sigma_i       (Barak et al., PODS 2007, Sec. 4:
                                                       "minimise b s.t. |phi - F w| <= b, w >= 0")

Both are LPs whose constraint rows are the measured rows plus the invariants and
inequalities, and whose cell columns are the domain's cells. A basic optimum has at most
as many non-zero cells as rows, so on large domains the LP is solved over a growing set
of cells (column generation, Gilmore–Gomory): solve the restricted master, price every
cell at once with one ``Q^T`` product of the master's duals, add the cells with negative
reduced cost, repeat until none is left. With HiGHS the master stays loaded between rounds
and each round's simplex starts from the previous optimal basis. The first master holds the
support of the non-negative least-squares fit, which the optima largely share (an exact fit
is itself optimal, objective 0). Elastic slacks with a large cost keep the
restricted masters feasible; if any is still positive at the end the constraints are
infeasible and the problem is re-solved in full to name the conflicting constraints.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from dpopt.errors import SolverError
from dpopt.estimate.form import ProgramForm
from dpopt.estimate.engines.exact_fit import certified_exact_fit, exact_fit_result
from dpopt.estimate.engines.interior_point import l1_interior_columns
from dpopt.estimate.engines.least_squares import nnls_by_column_generation, normalised_sigmas
from dpopt.estimate.policy import choose_backend
from dpopt.estimate.problem import ConsistencyProblem
from dpopt.estimate.result import Result, from_outcome, make_result
from dpopt.estimate.status import Status
from dpopt.model.constraints import ConstraintSet, Hierarchy, NonNegativity, StructuralZeros

#: Above this many stacked non-zeros (or cells) the LP is solved by column generation.
FULL_LP_NNZ = 2_000_000
FULL_LP_CELLS = 20_000
#: How the first column-generation master is seeded (see :func:`solve_linear`).
INITIAL_COLUMNS = ("auto", "nnls", "score", "interior")
#: Exact-fit shortcuts: a vertex, the maximum-entropy interior point, or none (None).
EXACT_FITS = ("basic", "interior", None)
#: Reduced costs above -PRICING_TOL (relative to the largest weight) count as non-negative.
PRICING_TOL = 1e-9


@dataclass
class _RowBlock:
    """Rows ``lower <= scale * (Q x) + (extra vars) <= upper``; one block per query use."""

    query: object
    scale: np.ndarray  # per-row multiplier of Q
    name: str


def solve_linear(
    problem: ConsistencyProblem,
    backend: str | None,
    time_limit=None,
    *,
    column_generation: bool | None = None,
    max_rounds: int = 500,
    warm_start: bool = True,
    batch_fraction: float = 0.05,
    initial: str = "auto",
    nnls_rounds: int = 50,
    first_method: str | None = None,
    exact_fit: str | None = "basic",
    verbose: bool = False,
    **options,
) -> Result:
    """Solve the L1 or L-infinity problem; see the module notes.

    ``column_generation`` forces or forbids it (default: on large problems); ``warm_start``
    keeps the master loaded in HiGHS between rounds; ``batch_fraction`` of the row count is
    how many cells start the master and how many the most negative reduced costs add per round.
    ``initial="nnls"`` adds to the first master the support of (at most ``nnls_rounds``
    working-set rounds of) the non-negative least-squares fit, and when that fit reproduces
    every measurement exactly it is returned at once: zero is the objective's lower bound.
    ``"score"`` starts from the cells most supported by the measurements only.
    ``"interior"`` (L1 on Fourier coefficients) starts from the optimal face as a matrix-free
    interior-point method sees it (:mod:`dpopt.estimate.engines.interior_point`), which usually
    leaves one simplex round. ``"auto"`` (default) is ``"interior"`` where it applies, else
    ``"nnls"``. ``first_method`` is HiGHS's method for the first master (default ``"ipm"``,
    ``"simplex"`` after the interior start). ``exact_fit`` first looks for a
    table that reproduces every measurement (:mod:`dpopt.estimate.engines.exact_fit`; Fourier
    coefficients on large domains), which is optimal at once: ``"basic"`` a vertex (at most
    one positive cell per row, as a simplex method returns), ``"interior"`` the
    maximum-entropy exact fit (every free cell positive), None not at all.
    """
    start = time.perf_counter()
    engine = choose_backend("LP", backend)
    free = problem.free_cells()
    lower, upper = problem.cell_bounds()
    big = problem.num_cells > FULL_LP_CELLS or problem.nnz_estimate() > FULL_LP_NNZ
    # With a diagonal measurement (the identity) every cell has a measured row of its own and a
    # basic optimum uses most cells: pricing them in by batches costs far more than one LP.
    use_cg = (big and not problem.observes_every_cell()) if column_generation is None else bool(column_generation)
    lp = _LinearProgram(problem)
    if not use_cg:
        form = lp.form(free, lower[free], upper[free], elastic=False)
        outcome = engine.solve(form, time_limit=time_limit, verbose=verbose, **options)
        x = lp.cells(outcome.x, free) if outcome.x is not None else None
        return from_outcome(outcome, x, objective=problem.objective, problem=problem,
                            time=time.perf_counter() - start, info=lp.info(free.size, rounds=1))

    if initial not in INITIAL_COLUMNS:
        raise SolverError(f"initial={initial!r}: choose one of {list(INITIAL_COLUMNS)}")
    cols = lp.initial_columns(free, max(50, int(lp.num_rows * batch_fraction)))
    if exact_fit not in EXACT_FITS:
        raise SolverError(f"exact_fit={exact_fit!r}: choose one of {list(EXACT_FITS)}")
    shortcut = exact_fit_result(problem, start, exact_fit, time_limit) if exact_fit is not None else None
    if shortcut is not None:
        shortcut.info = {**lp.info(shortcut.info["cell_columns"], rounds=0), "exact_fit": True}
        return shortcut
    if initial in ("auto", "interior"):
        chosen = l1_interior_columns(problem, limit=lp.num_rows) if problem.objective == "l1" else None
        if chosen is None:
            initial = "nnls"
        else:
            initial = "interior"
            cols = np.union1d(cols, chosen)
            # As many cells as rows, the largest on the optimal face: a basis's worth. More
            # (the face can be large when the L1 optimum is not unique) make the first master
            # slower than the pricing rounds they save. The simplex then beats HiGHS's IPM.
            first_method = first_method or "simplex"
    if initial == "nnls":
        fit = _least_squares_fit(problem, free, nnls_rounds)
        if fit is not None and fit.status is Status.OPTIMAL:
            # Zero residual is the objective's lower bound: the fit is an optimum (certified).
            exact = certified_exact_fit(problem, fit.x, start, solver=f"{fit.solver} (exact fit: no LP needed)",
                                        nit=fit.nit, what="the non-negative least-squares fit")
            if exact is not None:
                exact.info = {**lp.info(exact.info["cell_columns"], rounds=0), "exact_fit": True}
                return exact
        if fit is not None:
            cols = np.union1d(cols, np.flatnonzero(fit.x > 0))
    is_free_cell = np.zeros(problem.num_cells, dtype=bool)
    is_free_cell[free] = True
    session = None
    if warm_start and engine.incremental and not options:
        # The master stays loaded in the solver; each round continues from the last basis.
        # HiGHS's dual tolerance is absolute (1e-7); costs here are weights 1/sigma, often
        # far below 1, so it is set relative to the largest weight, as the pricing is.
        session = engine.incremental_lp(lp.form(cols, lower[cols], upper[cols], elastic=True),
                                        first_method=first_method or "ipm",
                                        dual_tolerance=min(1e-7, max(1e-10, 1e-7 * lp.cost_scale)), verbose=verbose)
    positions = np.arange(cols.size)  # where each cell column sits among the session's variables
    total_iterations = 0
    stalled = None  # the largest relative pricing violation when the pricing stalls
    for rounds in range(1, max_rounds + 1):
        remaining = None if time_limit is None else max(1e-3, time_limit - (time.perf_counter() - start))
        if session is None:
            outcome = engine.solve(lp.form(cols, lower[cols], upper[cols], elastic=True), time_limit=remaining,
                                   verbose=verbose, **options)
            values = outcome.x
        else:
            outcome = session.solve(remaining)
            values = None if outcome.x is None else lp.reorder(outcome.x, positions)
        solved = cols  # the columns of the master just solved (cols grows below)
        total_iterations += outcome.iterations or 0
        if session is not None and rounds > 1 and outcome.success and outcome.iterations == 0:
            # No pivot: HiGHS found every added column non-improving within its dual
            # tolerance. They were the most improving by the pricing, so every other column
            # is too: the master is optimal for the full problem at HiGHS's tolerance.
            reduced = lp.reduced_costs(outcome.row_duals)
            stalled = float(-reduced[is_free_cell].min() / lp.cost_scale)
            break
        if not outcome.success:
            x = lp.cells(values, cols) if values is not None else None
            return from_outcome(outcome, x, objective=problem.objective, problem=problem,
                                time=time.perf_counter() - start, nit=total_iterations,
                                info=lp.info(cols.size, rounds=rounds))
        if outcome.row_duals is None:
            raise RuntimeError(f"backend {engine.name!r} returned no duals; column generation needs them")
        reduced = lp.reduced_costs(outcome.row_duals)
        reduced[cols] = 0.0
        reduced[~is_free_cell] = 0.0
        enter = _entering(reduced, lower, upper, lp.cost_scale)
        if enter.size == 0:
            break
        enter = np.sort(enter[: max(50, int(lp.num_rows * batch_fraction))])
        if session is not None:
            session.add_columns(np.zeros(enter.size), lower[enter], upper[enter], lp.cell_matrix(enter))
            positions = np.concatenate([positions, session.num_vars - enter.size + np.arange(enter.size)])
            merged = np.concatenate([cols, enter])
            order = np.argsort(merged, kind="stable")
            cols, positions = merged[order], positions[order]
        else:
            cols = np.union1d(cols, enter)
    else:
        x = lp.cells(values, solved)
        return make_result(Status.ITERATION_LIMIT, x, message=f"column generation stopped after {max_rounds} rounds",
                           fun=outcome.objective, objective=problem.objective, backend=outcome.backend,
                           solver=outcome.solver, time=time.perf_counter() - start, nit=total_iterations,
                           problem=problem, info=lp.info(solved.size, rounds=max_rounds), incumbent=True)
    outcome = dataclasses.replace(outcome, x=values)
    slack = lp.elastic_total(outcome.x, cols.size)
    if slack > 1e-7 * max(1.0, lp.rhs_scale):
        # The constraints themselves cannot hold: solve in full to have the conflicts named.
        form = lp.form(free, lower[free], upper[free], elastic=False)
        full = engine.solve(form, time_limit=time_limit, verbose=verbose, **options)
        x = lp.cells(full.x, free) if full.x is not None else None
        return from_outcome(full, x, objective=problem.objective, problem=problem,
                            time=time.perf_counter() - start, info=lp.info(free.size, rounds=rounds))
    x = lp.cells(outcome.x, cols)
    info = {**lp.info(cols.size, rounds=rounds), "initial": initial}
    if stalled is not None:
        info["pricing_stalled_at"] = stalled
    return from_outcome(outcome, x, objective=problem.objective, problem=problem,
                        time=time.perf_counter() - start, nit=total_iterations, info=info)


def _least_squares_fit(problem: ConsistencyProblem, free: np.ndarray, rounds: int):
    """A (possibly unconverged) non-negative least-squares fit of the measurements: a warm
    start, or None when the problem allows negative cells.

    L1, L-infinity and L2 optima of the same measurements are all sparse and largely share
    their support, and working-set rounds of NNLS cost far less than the simplex pivots that
    would discover those cells one pricing round at a time. Invariants and inequalities are
    left out here (the LP's pricing takes care of them).
    """
    if not problem.constraints.nonnegative or not problem.noisy:
        return None
    cs = ConstraintSet(problem.domain, [c for c in problem.constraints.constraints
                                        if isinstance(c, (NonNegativity, StructuralZeros, Hierarchy))])
    fit_problem = ConsistencyProblem(problem.noisy, cs, "l2")
    return nnls_by_column_generation(fit_problem, free, fit_problem.sigmas(), fit_problem.targets(), None,
                                     time.perf_counter(), max_rounds=rounds)


def _entering(reduced, lower, upper, scale) -> np.ndarray:
    """Cells whose reduced cost improves the master, most improving first."""
    tol = PRICING_TOL * scale
    can_rise = (reduced < -tol) & (upper > 0)
    can_fall = (reduced > tol) & (lower < 0)
    idx = np.flatnonzero(can_rise | can_fall)
    return idx[np.argsort(-np.abs(reduced[idx]), kind="stable")]


class _LinearProgram:
    """The LP of an L1 / L-infinity problem with cell columns chosen by the caller."""

    def __init__(self, problem: ConsistencyProblem):
        self.problem = problem
        self.objective = problem.objective
        cs = problem.constraints
        self.weights = 1.0 / normalised_sigmas(problem)  # at most 1: same minimiser, well-scaled costs
        self.y = problem.targets()
        self.k = self.y.size
        # Row blocks in order: measurement rows (twice for L-inf), invariants, inequalities.
        self.blocks: list[_RowBlock] = []
        offset = 0
        stacked = problem.marginal_workload()
        if stacked is not None:  # one operator for all measured marginals: one transform per product
            w = self.weights
            self.blocks.append(_RowBlock(stacked, w if self.objective == "linf" else np.ones_like(w), "measurements"))
        for m in problem.noisy if stacked is None else ():
            w = self.weights[offset : offset + m.query.num_rows]
            offset += m.query.num_rows
            self.blocks.append(_RowBlock(m.query, w if self.objective == "linf" else np.ones_like(w), f"measurement:{m.label}"))
        if self.objective == "linf":
            self.blocks += [_RowBlock(b.query, b.scale, b.name + ":lower") for b in list(self.blocks)]
        for inv in cs.invariants:
            self.blocks.append(_RowBlock(inv.query, np.ones(inv.query.num_rows), f"invariant:{inv.name}"))
        for ineq in cs.inequalities:
            self.blocks.append(_RowBlock(ineq.query, np.ones(ineq.query.num_rows), f"inequality:{ineq.name}"))
        self.num_rows = sum(b.query.num_rows for b in self.blocks)
        self.num_measurement_rows = self.k * (2 if self.objective == "linf" else 1)
        self.cost_scale = float(self.weights.max()) if self.k else 1.0
        self.rhs_scale = float(np.abs(self.y).max()) if self.k else 1.0
        self.elastic_cost = 1e4 * (float(self.weights.sum()) if self.k else 1.0)

    def _row_bounds(self):
        lo, hi, names = [], [], []
        wy = self.weights * self.y
        if self.objective == "l1":
            lo.append(self.y), hi.append(self.y)
            names += self.problem.row_names()
        elif self.k:
            lo.append(np.full(self.k, -np.inf)), hi.append(wy)  # w(Qx - y) - b <= 0
            names += [f"{n}:upper" for n in self.problem.row_names()]
            lo.append(wy), hi.append(np.full(self.k, np.inf))  # w(Qx - y) + b >= 0
            names += [f"{n}:lower" for n in self.problem.row_names()]
        cs = self.problem.constraints
        for inv in cs.invariants:
            lo.append(inv.values), hi.append(inv.values)
            names += [f"invariant:{inv.name}[{i}]" for i in range(inv.values.size)]
        for ineq in cs.inequalities:
            lo.append(ineq.lower), hi.append(ineq.upper)
            names += [f"inequality:{ineq.name}[{i}]" for i in range(ineq.lower.size)]
        return np.concatenate(lo) if lo else np.zeros(0), np.concatenate(hi) if hi else np.zeros(0), names

    def _extra_columns(self):
        """Columns of the non-cell variables: residual pairs (L1) or the bound b (L-inf)."""
        m, k = self.num_rows, self.k
        if self.objective == "l1":
            eye = sp.identity(k, format="csc")
            top = sp.hstack([-eye, eye])
            A = sp.vstack([top, sp.csc_matrix((m - k, 2 * k))])
            cost = np.concatenate([self.weights, self.weights])
            lower, upper = np.zeros(2 * k), np.full(2 * k, np.inf)
        else:
            col = np.zeros(m)
            col[:k], col[k : 2 * k] = -1.0, 1.0
            A = sp.csc_matrix(col.reshape(-1, 1))
            cost, lower, upper = np.ones(1), np.zeros(1), np.full(1, np.inf)
        return A, cost, lower, upper

    def _elastic_columns(self):
        """A +/- slack on each invariant and inequality row (restricted masters only)."""
        first = self.num_measurement_rows
        count = self.num_rows - first
        if count == 0:
            return sp.csc_matrix((self.num_rows, 0)), np.zeros(0)
        eye = sp.identity(count, format="csc")
        pad = sp.csc_matrix((first, 2 * count))
        A = sp.vstack([pad, sp.hstack([eye, -eye])])
        return A, np.full(2 * count, self.elastic_cost)

    def cell_matrix(self, cols: np.ndarray) -> sp.csc_matrix:
        parts = []
        for b in self.blocks:
            sub = b.query.columns(cols)
            parts.append(sp.diags(b.scale) @ sub)
        return sp.vstack(parts).tocsc()

    def form(self, cols, lower, upper, *, elastic: bool) -> ProgramForm:
        A_x = self.cell_matrix(cols)
        A_e, c_e, lo_e, hi_e = self._extra_columns()
        mats, costs, los, his = [A_x, A_e], [np.zeros(cols.size), c_e], [lower, lo_e], [upper, hi_e]
        if elastic:
            A_s, c_s = self._elastic_columns()
            mats.append(A_s), costs.append(c_s), los.append(np.zeros(c_s.size)), his.append(np.full(c_s.size, np.inf))
        row_lo, row_hi, names = self._row_bounds()
        return ProgramForm(
            c=np.concatenate(costs),
            A=sp.hstack(mats).tocsr(),
            row_lower=row_lo,
            row_upper=row_hi,
            row_names=names,
            lower=np.concatenate(los),
            upper=np.concatenate(his),
        )

    def reorder(self, v: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """A session's variables (cells in arrival order among the extras) in form order."""
        is_cell = np.zeros(v.size, dtype=bool)
        is_cell[positions] = True
        return np.concatenate([v[positions], v[~is_cell]])

    def cells(self, v: np.ndarray, cols: np.ndarray) -> np.ndarray:
        x = np.zeros(self.problem.num_cells)
        x[cols] = v[: cols.size]
        return x

    def elastic_total(self, v: np.ndarray, ncols: int) -> float:
        A_e, *_ = self._extra_columns()
        return float(np.abs(v[ncols + A_e.shape[1] :]).sum())

    def reduced_costs(self, duals: np.ndarray) -> np.ndarray:
        """``0 - A_cells^T duals`` for every cell, one ``Q^T`` product per block."""
        out = np.zeros(self.problem.num_cells)
        offset = 0
        for b in self.blocks:
            m = b.query.num_rows
            out -= b.query.rmatvec(b.scale * duals[offset : offset + m])
            offset += m
        return out

    def initial_columns(self, free: np.ndarray, count: int) -> np.ndarray:
        """The ``count`` cells most supported by the measurements (largest ``Q^T (w y)``)."""
        score = np.zeros(self.problem.num_cells)
        offset = 0
        for m in self.problem.noisy:
            rows = m.query.num_rows
            score += m.query.rmatvec(self.weights[offset : offset + rows] * np.maximum(self.y[offset : offset + rows], 0))
            offset += rows
        count = min(free.size, count)
        order = free[np.argsort(-score[free], kind="stable")]
        return np.sort(order[:count])

    def info(self, columns: int, rounds: int) -> dict:
        return {"rows": self.num_rows, "cell_columns": int(columns), "rounds": int(rounds),
                "column_generation": rounds > 1 or columns < self.problem.num_cells}
