"""One parent's problem: its children's tables solved jointly through the engines.

A :class:`ParentTask` holds everything public about one parent (its released table, its
children's noisy answers on the cells the parent may hold, the children's invariants and
zeros); :func:`solve_parent` turns it into the children's integer tables. It is the unit of
parallel work: a task is a plain picklable object and the function is importable on any
worker, so a process pool or a Spark cluster runs the same code (Abowd et al. 2022, §6: each
parent's children are an independent problem).

For children ``c`` of a parent with released table ``p`` (design notes §2)::

    minimise   Σ_q Σ_c (1/σ_q²) ‖Q_q x_c − y_{q,c}‖²                          (reconstruct, L2)
    subject to Σ_c x_c = p  cell by cell,  A x_c = a_c (invariants),  zeros,  x >= 0
    then       x_c integer, the same constraints exactly                         (round_to_integers)

Cells where the parent is zero are zero for every child (``Σ_c x_c = 0`` and ``x >= 0``), so
the problem is built over the parent's non-zero cells only. When it has no solution (e.g. an
invariant of one child needs more than its parent holds) and the failsafe is on, the parent
constraint is relaxed by the smallest L1 slack (:func:`relax_parent`), the problem is solved
against the relaxed parent, and the event is reported: which parent, which cells, by how
much. Every result is checked here, in exact integer arithmetic, before it is returned.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from dpopt.errors import InconsistentConstraintsError
from dpopt.estimate.status import Status
from dpopt.model.constraints import (
    ConstraintSet,
    Integrality,
    Invariant,
    LinearInequality,
    NonNegativity,
    StructuralZeros,
)
from dpopt.model.domain import Domain
from dpopt.model.measurement import Measurement
from dpopt.model.queries.basic import Identity
from dpopt.model.queries.kronecker import Kronecker
from dpopt.model.queries.marginal import Marginal
from dpopt.workers import blas_pools

__all__ = ["TaskQuery", "TaskInvariant", "SolveOptions", "ParentTask", "ParentSolution", "solve_parent",
           "relax_parent", "PARENT_CONSTRAINT"]

#: The name of the "children add up to the parent" invariant in every parent's problem.
PARENT_CONSTRAINT = "parent = sum of children"
#: L2 backends tried in turn when none is named (None: the engine's default).
FALLBACK_BACKENDS = (None, "highs")
#: The L2 problem is scaled so that its largest count is about this (see :func:`problem_scale`).
SCALE_TARGET = 1024.0
#: Above this ratio of the largest count to the smallest noise scale the problem is centred
#: on the noisy detailed table (see :func:`problem_origin`).
CENTRE_RATIO = 1e6
#: In a centred problem the bound ``x >= 0`` of a large cell is tightened to a move of at most this
#: many times the problem's largest centred number (see :func:`centre_bound`).
CENTRE_MARGIN = 64.0
#: Parents' problems up to this many variables are rounded keeping every measured marginal at the floor
#: or ceiling of its fitted value (controlled rounding, a MIP); larger ones cell by cell (an LP: a parent
#: of 680 tracts took minutes as a MIP).
CONTROLLED_MAX_VARIABLES = 20_000


@dataclass(frozen=True)
class TaskQuery:
    """One measured query of the children: its matrix over the task's cells and the noisy answers.

    ``values[i]`` are child ``i``'s noisy answers (one per row of ``matrix``); ``variance`` (and
    ``scale``) is one number for all children, or one per child when their answers combine
    different amounts of measurement (:mod:`~dpopt.algorithms.topdown.upward`).
    """

    label: str
    matrix: sp.csr_matrix
    values: np.ndarray
    noise: str
    scale: float | np.ndarray
    variance: float | np.ndarray


@dataclass(frozen=True)
class TaskInvariant:
    """Rows ``matrix @ x_c = values[j]`` for the children at positions ``children[j]``."""

    name: str
    matrix: sp.csr_matrix
    children: np.ndarray
    values: np.ndarray


@dataclass(frozen=True)
class SolveOptions:
    """Engine settings of every parent's solve."""

    backend: str | None = None
    time_limit: float | None = None
    failsafe: bool = True
    keep_fractional: bool = False
    controlled: bool = True  # up to CONTROLLED_MAX_VARIABLES variables


@dataclass(frozen=True, eq=False)
class ParentTask:
    """Everything public about one parent's children (see the module notes).

    Attributes
    ----------
    level : int
        The children's level (0: the root solves its own table, without a parent).
    parent : int
        The parent's position in its level (-1 at the root).
    parent_id : str
    children : ndarray of int
        The children's positions in their level.
    cells : ndarray of int
        The characteristics cells the children may hold (not structurally zero for all of them).
    parent_table : ndarray of int64 or None
        The parent's released counts on ``cells`` (None at the root).
    queries, invariants
        Measured queries and invariants, restricted to ``cells``.
    zeros : ndarray of bool or None
        ``zeros[i, j]``: cell ``cells[j]`` is structurally zero for child ``i`` only.
    options : SolveOptions
    """

    level: int
    parent: int
    parent_id: str
    children: np.ndarray
    cells: np.ndarray
    parent_table: np.ndarray | None
    queries: tuple[TaskQuery, ...]
    invariants: tuple[TaskInvariant, ...] = ()
    zeros: np.ndarray | None = None
    options: SolveOptions = field(default_factory=SolveOptions)

    @property
    def nbytes(self) -> int:
        """Bytes of the task's arrays (what shipping it to a worker moves, roughly)."""
        total = sum(np.asarray(q.values).nbytes + q.matrix.data.nbytes * 3 for q in self.queries)
        total += sum(np.asarray(inv.values).nbytes + inv.matrix.data.nbytes * 3 for inv in self.invariants)
        total += 0 if self.zeros is None else np.asarray(self.zeros).nbytes
        return int(total + self.cells.nbytes + self.children.nbytes
                   + (0 if self.parent_table is None else np.asarray(self.parent_table).nbytes))

    @property
    def size(self) -> int:
        """Variables before dropping the parent's zero cells (for scheduling largest first)."""
        active = self.cells.size if self.parent_table is None else int(np.count_nonzero(self.parent_table))
        return int(self.children.size) * active


@dataclass(eq=False)
class ParentSolution:
    """The children's released tables on the task's cells, with what it took to get them."""

    level: int
    parent: int
    parent_id: str
    table: np.ndarray | None
    status: Status
    message: str
    times: dict
    variables: int
    failsafe: dict | None = None
    l2_objective: float | None = None
    rounding_change: float | None = None
    fallback: str = ""
    fractional: np.ndarray | None = None


def solve_parent(task: ParentTask) -> ParentSolution:
    """Solve one parent's children (see the module notes); never raises for an infeasible problem.

    BLAS runs on one thread here: the executors parallelise across parents, and a thread count that
    differs between the driver and Spark's Python workers (which set ``OMP_NUM_THREADS=1``) changes
    the floating-point sums enough to move a rounding tie, so every executor would release a
    slightly different table.
    """
    with blas_pools().limit(limits=1, user_api="blas"):  # the library scan is made once (workers notes)
        return _solve_parent(task)


def _solve_parent(task: ParentTask) -> ParentSolution:
    start = time.perf_counter()
    times: dict[str, float] = {}
    nc = int(task.children.size)
    if task.parent_table is None:
        active = np.ones(task.cells.size, dtype=bool)
    else:
        active = np.asarray(task.parent_table) > 0
    outcome = _solve(task, active, None if task.parent_table is None else task.parent_table[active], times)
    event = None
    if outcome.status in (Status.INFEASIBLE,) and task.parent_table is not None and task.options.failsafe:
        everywhere = np.ones(task.cells.size, dtype=bool)
        relaxed, event = relax_parent(task, times)
        if relaxed is not None:
            outcome = _solve(task, everywhere, relaxed, times)
            active = everywhere
    table = fractional = None
    if outcome.table is not None:
        table = np.zeros((nc, task.cells.size), dtype=np.int64)
        table[:, active] = outcome.table
        if outcome.fractional is not None:
            fractional = np.zeros((nc, task.cells.size))
            fractional[:, active] = outcome.fractional
        problem = _verify(task, table, event)
        if problem is not None:
            outcome = _Outcome(None, Status.NUMERICAL_ERROR, problem, outcome.variables)
            table = None
    times["total"] = time.perf_counter() - start
    return ParentSolution(task.level, task.parent, task.parent_id, table, outcome.status, outcome.message, times,
                          outcome.variables, event, outcome.l2_objective, outcome.rounding_change, outcome.fallback,
                          fractional)


@dataclass
class _Outcome:
    table: np.ndarray | None
    status: Status
    message: str
    variables: int
    l2_objective: float | None = None
    rounding_change: float | None = None
    fallback: str = ""
    fractional: np.ndarray | None = None


def _problem(task: ParentTask, active: np.ndarray, parent_values: np.ndarray | None, scale: float = 1.0,
             origin: np.ndarray | None = None):
    """The domain, measurements and constraints of the task over its ``active`` cells.

    With ``origin`` (children × active cells) and ``scale``, the unknowns are
    ``d = (x - origin) / scale``: every count (noisy answers, invariant and parent values) is
    moved by what ``origin`` gives it and divided by ``scale`` (a power of two, so exactly), the
    noise's standard deviations are divided by ``scale`` and ``x >= 0`` becomes
    ``d >= -origin / scale``. The L2 minimiser in ``d`` maps back to the original one.
    """
    nc, na = int(task.children.size), int(active.sum())
    domain = Domain(("child", "cell"), (nc, na))
    eye = sp.identity(nc, dtype=np.float64, format="csr")
    measurements = []
    for q in task.queries:
        matrix = q.matrix[:, active]
        rows = np.flatnonzero(matrix.getnnz(axis=1))  # rows touching no active cell are constants
        if rows.size == 0:
            continue
        values = np.asarray(q.values, dtype=np.float64)[:, rows]
        if origin is not None:
            values = values - (matrix[rows] @ origin.T).T
        variance, sd, children = q.variance, q.scale, eye
        if np.ndim(variance):  # one variance per child: rows weighted by sqrt(smallest / own), one law
            variance = float(np.min(q.variance))
            weights = np.sqrt(variance / np.asarray(q.variance, dtype=np.float64))
            children, values, sd = sp.diags(weights, format="csr"), values * weights[:, None], np.sqrt(variance)
        query = Kronecker([(children, "child"), (matrix[rows], "cell")], domain=domain)
        measurements.append(Measurement(query, (values / scale).ravel(), q.noise, sd / scale,
                                        variance / scale**2, label=q.label))
    if origin is None:
        constraints = [NonNegativity()]
    else:
        constraints = [LinearInequality(Identity(domain), -origin.ravel() / scale, np.inf, name="x >= 0")]
    if task.zeros is not None:
        zeros = np.asarray(task.zeros)[:, active]
        for i, cells in _zero_groups(zeros):
            constraints.append(StructuralZeros({"child": list(i), "cell": list(cells)},
                                               name=f"zeros of {len(i)} children ({len(constraints)})"))
    for inv in task.invariants:
        select = sp.csr_matrix((np.ones(inv.children.size), (np.arange(inv.children.size), inv.children)),
                               shape=(inv.children.size, nc))
        matrix = inv.matrix[:, active]
        query = Kronecker([(select, "child"), (matrix, "cell")], domain=domain)
        values = np.asarray(inv.values, dtype=np.float64)
        if origin is not None:
            values = values - (matrix @ origin[inv.children].T).T
        constraints.append(Invariant(query, values.ravel() / scale, name=inv.name))
    if parent_values is not None:
        values = np.asarray(parent_values, dtype=np.float64)
        if origin is not None:
            values = values - origin.sum(axis=0)
        constraints.append(Invariant(Marginal(domain, ("cell",)), values / scale, name=PARENT_CONSTRAINT))
    return domain, measurements, constraints


def centre_bound(measurements, constraints) -> float:
    """A power of two :data:`CENTRE_MARGIN` times the largest number of a centred problem (its
    noisy answers, their standard deviations, its invariants' values), the bound ``x >= 0`` aside."""
    largest = max([1.0] + [float(np.abs(m.values).max(initial=0.0)) for m in measurements]
                  + [float(m.stddev) for m in measurements]
                  + [float(np.abs(c.values).max(initial=0.0)) for c in constraints if isinstance(c, Invariant)])
    return float(2.0 ** np.ceil(np.log2(CENTRE_MARGIN * largest)))


def tightened(constraints: list, bound: float) -> list:
    """The centred problem's constraints with ``d >= -origin`` (the first) tightened to ``d >= -bound``
    on the cells whose origin exceeds ``bound``.

    A bound of -10^8 would set the count scale (:mod:`dpopt.estimate.scaling`) at 10^8 and the
    solver's resolution with it, far coarser than the noise (the nation's fit was 55 persons per
    cell from its noisy answers, with noise of 3). The tightened problem has the same minimiser
    whenever no tightened bound is active at its solution, which :func:`_solve` checks (and
    solves untightened when one is).
    """
    first = constraints[0]
    return [LinearInequality(first.query, np.maximum(first.lower, -bound), np.inf, name=first.name),
            *constraints[1:]]


def problem_origin(task: ParentTask, active: np.ndarray) -> np.ndarray | None:
    """Where to centre the problem when its counts dwarf its noise (None: no need, or no detailed query).

    A nation's cells hold up to 10^8 persons measured with noise of standard deviation near 1:
    an interior-point solver cannot resolve the residuals at that ratio (it reports
    "optimal_inaccurate" or fails). Solving for the move away from the noisy detailed table
    (its non-negative integers; exact in floating point) keeps every number near the noise.
    """
    largest = max(float(np.abs(q.values).max(initial=0.0)) for q in task.queries)
    smallest = min(float(np.min(q.scale)) for q in task.queries)
    if largest <= CENTRE_RATIO * max(smallest, 1e-300):
        return None
    for q in task.queries:
        n = task.cells.size
        if q.matrix.shape == (n, n) and (q.matrix != sp.identity(n, format="csr")).nnz == 0:
            origin = np.maximum(np.rint(np.asarray(q.values, dtype=np.float64)[:, active]), 0.0)
            if task.zeros is not None:
                origin[np.asarray(task.zeros)[:, active]] = 0.0
            return origin
    return None


def problem_scale(task: ParentTask, parent_values: np.ndarray | None) -> float:
    """A power of two near the problem's largest count over :data:`SCALE_TARGET` (1 for small counts).

    The L2 backends meet counts in the millions badly (an interior-point solver declared such a
    feasible problem infeasible); dividing every count by an exact power of two keeps the
    problem the same and its numbers near 1.
    """
    largest = max([float(np.abs(q.values).max(initial=0.0)) for q in task.queries]
                  + [float(np.abs(inv.values).max(initial=0.0)) for inv in task.invariants]
                  + [float(np.abs(parent_values).max(initial=0.0)) if parent_values is not None else 0.0])
    return float(2.0 ** max(0, int(np.floor(np.log2(max(largest, 1.0) / SCALE_TARGET)))))


def _zero_groups(zeros: np.ndarray):
    """Children with the same forbidden cells, grouped: ``(children, cells)`` per pattern."""
    patterns, inverse = np.unique(zeros, axis=0, return_inverse=True)
    for k, pattern in enumerate(patterns):
        cells = np.flatnonzero(pattern)
        if cells.size:
            yield np.flatnonzero(inverse.ravel() == k), cells


def _solve(task: ParentTask, active: np.ndarray, parent_values, times: dict) -> _Outcome:
    """L2 through ``reconstruct``, then exact rounding through ``round_to_integers``."""
    from dpopt.estimate import reconstruct, round_to_integers

    nc, na = int(task.children.size), int(active.sum())
    if na == 0:  # the parent holds nobody: neither do its children
        return _Outcome(np.zeros((nc, 0), dtype=np.int64), Status.OPTIMAL, "the parent is empty", 0)
    origin = problem_origin(task, active)
    scale = problem_scale(task, parent_values) if origin is None else 1.0
    variables = nc * na
    opts = task.options
    tick = time.perf_counter()
    domain, measurements, plain = _problem(task, active, parent_values, scale, origin)
    constraints = _problem(task, active, parent_values)[2] if scale != 1.0 or origin is not None else plain
    if not measurements:
        return _Outcome(None, Status.NOT_SOLVED, "no measured query touches the parent's non-zero cells", variables)
    bound = None if origin is None else centre_bound(measurements, plain)  # origin implies scale 1
    for tighten in (True, False) if origin is not None else (False,):
        scaled = tightened(plain, bound) if tighten else plain
        problem = ConstraintSet(domain, scaled)
        fit, failures = None, []
        # The engines' feasibility pre-check (an LP) certifies that the constraints can hold: a
        # backend that then reports "infeasible" has failed numerically, and the next one is tried.
        for backend in ((opts.backend,) if opts.backend else FALLBACK_BACKENDS):
            try:
                fit = reconstruct(measurements, problem, "l2", backend=backend, time_limit=opts.time_limit,
                                  integer=False)
            except InconsistentConstraintsError as exc:
                if tighten:  # the tightened bounds, not the problem, may be what cannot hold
                    break
                times["l2"] = times.get("l2", 0.0) + time.perf_counter() - tick
                return _Outcome(None, Status.INFEASIBLE, str(exc), variables)
            if fit.success or fit.status is Status.TIME_LIMIT:
                break
            failures.append(f"{fit.backend}: {fit.status.name} ({fit.message})")
        if tighten and (fit is None or not fit.success or fit.x is None):
            continue  # solved again as it is, without the tightened bounds
        if not tighten:
            break
        large = origin.ravel() > bound
        if not (fit.x[large] <= -bound * (1.0 - 1e-6)).any():
            break  # no tightened bound is active: the minimiser of the original problem
    times["l2"] = times.get("l2", 0.0) + time.perf_counter() - tick
    if not fit.success or fit.x is None:
        status = fit.status if fit.status is not Status.INFEASIBLE else Status.NUMERICAL_ERROR
        return _Outcome(None, status, "L2 solve failed although the constraints are feasible: " + "; ".join(failures),
                        variables)
    note = ("; ".join(failures) + f"; solved by {fit.backend}") if failures else ""
    x = fit.x * scale if origin is None else origin.ravel() + fit.x * scale
    tick = time.perf_counter()
    integral = ConstraintSet(domain, constraints + [Integrality()])
    try:
        controlled = opts.controlled and variables <= CONTROLLED_MAX_VARIABLES
        rounded = round_to_integers(x, integral, time_limit=opts.time_limit,
                                    measured=_kept_answers(task, active, domain) if controlled else None)
    except InconsistentConstraintsError as exc:
        times["round"] = times.get("round", 0.0) + time.perf_counter() - tick
        return _Outcome(None, Status.INFEASIBLE, f"rounding: {exc}", variables, fit.fun)
    times["round"] = times.get("round", 0.0) + time.perf_counter() - tick
    if rounded.x is not None and rounded.incumbent and rounded.max_violation == 0.0:
        # Stopped short of its certified gap (time limit): every constraint holds exactly (checked again in
        # integer arithmetic by _verify), so the table is released, and the report says so.
        note = "; ".join(filter(None, [note, f"rounding stopped at {rounded.status.name} with an incumbent: "
                                             f"{rounded.message}"]))
    elif not rounded.success or rounded.x is None:
        return _Outcome(None, rounded.status, f"rounding ({rounded.backend}): {rounded.message}", variables, fit.fun)
    table = np.rint(rounded.x).astype(np.int64).reshape(nc, na)
    fractional = x.reshape(nc, na) if opts.keep_fractional else None
    return _Outcome(table, Status.OPTIMAL, fit.message, variables, float(fit.fun), float(rounded.fun), note,
                    fractional)


def _kept_answers(task: ParentTask, active: np.ndarray, domain: Domain) -> list | None:
    """The children's measured queries other than their detailed table, over the active cells: the
    controlled rounding keeps each answer at the floor or ceiling of its fitted value (a marginal of
    thirty cells would otherwise drift by the sum of thirty cell roundings, at every level)."""
    nc = int(task.children.size)
    eye = sp.identity(nc, dtype=np.float64, format="csr")
    out = []
    for q in task.queries:
        matrix = q.matrix[:, active]
        rows = np.flatnonzero(matrix.getnnz(axis=1))
        if rows.size == 0 or (matrix[rows].getnnz(axis=1) <= 1).all():
            continue  # no row, or every row reads one cell: the cell-wise rounding keeps it already
        out.append(Kronecker([(eye, "child"), (matrix[rows], "cell")], domain=domain))
    return out or None


def relax_parent(task: ParentTask, times: dict) -> tuple[np.ndarray | None, dict]:
    """The parent table moved by the smallest L1 slack that lets the children's constraints hold.

    ``minimise Σ_cells |Σ_c x_c − p|`` subject to the children's invariants, zeros and
    ``x >= 0`` (an L1 fit of the children's sum to the parent through ``reconstruct``, the
    parent constraint's rows being the only "measurement", each with weight 1), then the
    integer table nearest to it under the same constraints (``round_to_integers``). Returns
    the relaxed parent table on the task's cells (None when even that has no solution) and the
    event to report: which parent, which constraint, which cells moved and by how much.
    """
    from dpopt.estimate import reconstruct, round_to_integers

    tick = time.perf_counter()
    everywhere = np.ones(task.cells.size, dtype=bool)
    domain, _, constraints = _problem(task, everywhere, None)
    total = Marginal(domain, ("cell",))
    target = np.asarray(task.parent_table, dtype=np.float64)
    slack_fit = Measurement(total, target, "none", 1.0, 1.0, label="failsafe: children's sum against the parent")
    event = {"level": task.level, "parent": task.parent_id, "constraint": PARENT_CONSTRAINT}
    relaxed = None
    try:
        fit = reconstruct([slack_fit], ConstraintSet(domain, constraints), "l1", backend="highs", integer=False)
        if fit.success and fit.x is not None:
            rounded = round_to_integers(fit.x, ConstraintSet(domain, constraints + [Integrality()]))
            if rounded.x is not None and (rounded.success or (rounded.incumbent and rounded.max_violation == 0.0)):
                relaxed = np.rint(total.matvec(rounded.x)).astype(np.int64)
        message = "" if relaxed is not None else f"the relaxed problem has no solution either ({fit.message})"
    except InconsistentConstraintsError as exc:
        message = f"the children's own constraints contradict each other: {exc}"
    times["failsafe"] = time.perf_counter() - tick
    if relaxed is None:
        event.update(relaxed=False, message=message)
        return None, event
    slack = relaxed - np.asarray(task.parent_table, dtype=np.int64)
    moved = np.flatnonzero(slack)
    event.update(relaxed=True, cells_moved=int(moved.size), l1_slack=int(np.abs(slack).sum()),
                 max_slack=int(np.abs(slack).max(initial=0)),
                 cells=[int(c) for c in task.cells[moved]], slack=[int(s) for s in slack[moved]])
    return relaxed, event


def _verify(task: ParentTask, table: np.ndarray, event: dict | None) -> str | None:
    """Every constraint checked in integer arithmetic; a message naming the first that fails, else None."""
    if (table < 0).any():
        return "a child has a negative count"
    if task.zeros is not None and table[np.asarray(task.zeros)].any():
        return "a child has persons in a cell its structural zeros forbid"
    if task.parent_table is not None:
        parent = np.asarray(task.parent_table, dtype=np.int64)
        if event is not None and event.get("relaxed"):
            parent = parent.copy()
            parent[np.searchsorted(task.cells, event["cells"])] += np.asarray(event["slack"], dtype=np.int64)
        if not np.array_equal(table.sum(axis=0), parent):
            return f"the children do not add up to the parent in {int((table.sum(axis=0) != parent).sum())} cells"
    for inv in task.invariants:
        got = np.asarray((inv.matrix @ table[inv.children].T).T, dtype=np.float64)
        if np.abs(got - inv.values).max(initial=0.0) > 1e-9:
            return f"invariant {inv.name!r} is off by {float(np.abs(got - inv.values).max()):g}"
    return None
