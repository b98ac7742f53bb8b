"""Integer rounding of a consistent table: dpopt's one rounding home.

:func:`round_to_integers` turns a fractional estimate ``x~`` into whole persons while keeping
every invariant, inequality, structural zero and the hierarchy exactly. Three questions can be
asked of it (``method``):

- ``"cellwise"`` — the integer table closest to ``x~`` in L1 *per cell*
  (:mod:`~dpopt.estimate.rounding.cellwise`: nearest integer, largest remainder, LP vertex or
  MIP, whichever is exact for the constraints at hand);
- ``"controlled"`` — every cell at its floor or ceiling and every *measured* answer at the
  floor or ceiling of its fractional value, with the least L1 change on those answers
  (:mod:`~dpopt.estimate.rounding.controlled`, the 2020 Census's controlled rounding);
- ``"randomized"`` — unbiased (``E[x] = x~``) systematic sampling keeping nested totals, from
  uniforms the caller draws (:mod:`~dpopt.estimate.rounding.randomized`).

``method="auto"`` is ``"controlled"`` when ``measured`` is given, else ``"cellwise"``. With
``failsafe=True`` invariants that admit no integer table are relaxed with the least weighted L1
slack first (:mod:`~dpopt.estimate.rounding.failsafe`) and the relaxation is reported.

Every result states which method and which step produced it, how far each measured query moved
(``info["measured_change"]``), which answers left their floor/ceil interval
(``info["exceptions"]``) and, for a MIP, the certified gap to the LP bound.
"""

from __future__ import annotations

import time
import warnings
from typing import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from dpopt.errors import QueryError
from dpopt.estimate.backends import get_backend
from dpopt.estimate.rounding.controlled import CELL_WEIGHT, MeasuredQuery, round_controlled
from dpopt.estimate.result import Result, make_result
from dpopt.estimate.rounding.cellwise import round_cellwise
from dpopt.estimate.rounding.failsafe import fractional_invariant_rows, relax_invariants
from dpopt.estimate.rounding.model import RoundingTable
from dpopt.estimate.rounding.randomized import round_randomized
from dpopt.estimate.rounding.solve import Deadline
from dpopt.estimate.status import Status
from dpopt.model.constraints import ConstraintSet
from dpopt.model.measurement import Measurement
from dpopt.model.queries.base import LinearQuery

__all__ = ["round_to_integers", "METHODS", "measured_change", "rounding_budget"]

METHODS = ("auto", "cellwise", "controlled", "randomized")

#: Largest violation of a constraint, or of an answer's floor/ceil interval, accepted as met.
CHECK_TOL = 1e-6

#: The default time budget of a rounding: this many seconds ...
BUDGET_SECONDS = 20.0
#: ... plus this many per free cell and per measured answer (2^16 cells and 480 answers: 30 s;
#: 2^20 cells: 73 s; the census example's 73,000 cells and 10^4 answers: 124 s).
BUDGET_PER_CELL = 5e-5
BUDGET_PER_ANSWER = 1e-2


def rounding_budget(cells: int, answers: int) -> float:
    """Seconds a rounding may take by default: :data:`BUDGET_SECONDS` plus a share per free cell
    and per measured answer. Past it the best certified point so far is returned (status
    TIME_LIMIT, with its gap); ``time_limit`` replaces it."""
    return BUDGET_SECONDS + BUDGET_PER_CELL * cells + BUDGET_PER_ANSWER * answers


def round_to_integers(
    x: np.ndarray,
    constraints: ConstraintSet,
    *,
    measured: Sequence[LinearQuery | Measurement] | None = None,
    method: str = "auto",
    failsafe: bool = False,
    backend: str | None = None,
    time_limit: float | None = None,
    uniforms: np.ndarray | None = None,
    weights: Sequence[float] | None = None,
    cell_weight: float = CELL_WEIGHT,
    passes: str | Sequence[Sequence[int]] = "auto",
    mip_gap: float | None = None,
    relax: Iterable[str] | None = None,
    slack_weights: Mapping[str, float] | None = None,
    **options,
) -> Result:
    """Round a table to integers, keeping every constraint exactly (see the module notes).

    Parameters
    ----------
    x : ndarray, shape (domain.size,)
        The fractional estimate ``x~`` (e.g. ``reconstruct(..., integer=False).x``); it should
        meet the constraints (the cells of structural zeros are read as 0).
    constraints : ConstraintSet
        Invariant values must be integers on integer queries, else no integer table exists
        (``failsafe=True`` relaxes them).
    measured : sequence of LinearQuery or Measurement, optional
        Queries whose answers the rounding should keep: the measured marginals and any
        declared query to publish. Controlled rounding holds each answer at the floor or
        ceiling of its value on ``x~`` and minimises their L1 change; every method reports
        their change in ``info["measured_change"]``. Integer-valued queries only.
    method : {"auto", "cellwise", "controlled", "randomized"}
        ``"auto"``: ``"controlled"`` when ``measured`` is given, else ``"cellwise"``.
    failsafe : bool
        When the invariants admit no integer table (a non-integer value, or a contradiction
        the solver proves), relax the invariant rows named in ``relax`` with the least
        weighted L1 slack, round under the relaxed values, and report every relaxed row in
        ``info["relaxed"]`` (also a ``UserWarning``). Default False: such a problem ends with
        status INFEASIBLE.
    backend : str, optional
        Any installed backend with LP and MILP; default ``"highs"``.
    time_limit : float, optional
        Seconds for the whole rounding (default: :func:`rounding_budget` of the problem's size,
        20 s plus 50 µs per free cell and 10 ms per measured answer). When it runs out the best
        point found so far is returned, checked like any other, with status TIME_LIMIT
        (``success`` False, ``incumbent`` True), its certified ``gap`` and the reason in the
        message; a rounding that found no point by then fails with TIME_LIMIT. The support walk
        of large tables (bounded work, about 25 µs of CPU per cell) always runs to its end.
    uniforms : ndarray, shape (domain.size + 1,), optional
        Required by ``"randomized"`` and used by nothing else: independent uniforms on [0, 1)
        drawn by the caller (``dpopt.estimate`` never draws random numbers).
    weights : sequence of float, optional
        Weight of each measured query's L1 change in the controlled objective (default 1).
    cell_weight : float
        Weight of the per-cell L1 change in the controlled objective (a tie-break).
    passes : "auto", "single" or list of lists of int
        Controlled rounding in passes: each list holds indices into ``measured``; pass ``p``
        keeps the answers of earlier passes exactly. ``"auto"``: one pass up to
        :data:`~dpopt.estimate.rounding.controlled.MAX_PASS_ROWS` measured answers, else
        coarse (fewest rows) first.
    mip_gap : float, optional
        Relative gap to the LP bound at which a MIP point counts as optimal (cell-wise:
        1e-9, the exact optimum; controlled: 2e-2, see
        :data:`~dpopt.estimate.rounding.controlled.CONTROLLED_MIP_GAP`).
    relax : iterable of str, optional
        Names of the invariants the failsafe may relax (default: all of them).
    slack_weights : mapping of str to float, optional
        Weight of each invariant's slack in the failsafe (default 1).
    **options
        Passed to the backend (e.g. ``presolve``, ``method`` for HiGHS).

    Returns
    -------
    Result
        ``objective="round"``; ``x`` integer-valued; ``fun`` the minimised objective (cell-wise
        and randomized: ``Σ|x − x~|``; controlled: ``Σ_k w_k ‖Q_k x − Q_k x~‖₁ + cell_weight·Σ|x − x~|``).
        ``info`` holds ``method``, ``measured_change`` (DataFrame: per measured query its L1,
        largest and mean change and how many answers left their floor/ceil interval),
        ``exceptions`` (those answers), ``cell_l1_change``, ``gap`` and ``lower_bound`` for a
        MIP, ``fallback`` when controlled rounding fell back to cell-wise, ``relaxed`` when the
        failsafe relaxed invariants, and ``stages`` (every solver call).
    """
    start = time.perf_counter()
    if method not in METHODS:
        raise QueryError(f"unknown rounding method {method!r}; choose one of {list(METHODS)}")
    table = RoundingTable(x, constraints)
    specs = _measured_specs(measured, weights, constraints)
    if method == "auto":
        method = "controlled" if specs else "cellwise"
    if method == "controlled" and not specs:
        raise QueryError("method 'controlled' needs the measured queries (measured=[...]) whose answers it keeps")
    if uniforms is not None and method != "randomized":
        raise QueryError(f"uniforms are used by method 'randomized' only, not {method!r}")
    if method == "randomized" and uniforms is None:
        raise QueryError("method 'randomized' needs uniforms: an array of domain.size + 1 uniforms on [0, 1) drawn by "
                         "the caller (dpopt.estimate draws no random numbers)")
    if method == "randomized" and failsafe:
        raise QueryError("failsafe relaxes invariants for methods 'cellwise' and 'controlled', not 'randomized'")
    if not (np.isfinite(cell_weight) and cell_weight >= 0):
        raise QueryError(f"cell_weight must be a finite number >= 0, got {cell_weight!r}")
    if mip_gap is not None and not (np.isfinite(mip_gap) and 0 <= mip_gap < 1):
        raise QueryError(f"mip_gap must be in [0, 1), got {mip_gap!r}")
    engine = get_backend(backend or "highs")
    if time_limit is not None and not (isinstance(time_limit, (int, float)) and np.isfinite(time_limit)
                                       and time_limit > 0):
        raise QueryError(f"time_limit must be a positive number of seconds, got {time_limit!r}")
    budget = rounding_budget(table.k, sum(s.query.num_rows for s in specs)) if time_limit is None else float(time_limit)
    deadline = Deadline(budget)
    info: dict = {}

    def run(tab: RoundingTable):
        if method == "randomized":
            return round_randomized(tab, uniforms)
        if method == "cellwise":
            return round_cellwise(tab, engine, deadline, mip_gap, options)
        values, solve, inf = round_controlled(tab, specs, engine, deadline, mip_gap=mip_gap,
                                              cell_weight=cell_weight, passes=passes, options=options)
        if values is None and not (solve.status in (Status.TIME_LIMIT, Status.ITERATION_LIMIT) and solve.x is not None):
            # Last fallback: the per-cell optimum, reported.
            fallback = {"from": "controlled", "status": solve.status.name, "reason": solve.message,
                        "passes": inf["passes"]}
            values, solve, inf = round_cellwise(tab, engine, deadline, None, options)
            inf["fallback"] = fallback
        return values, solve, inf

    bad_rows = fractional_invariant_rows(constraints)
    if bad_rows and not failsafe:
        return _failed(Status.INFEASIBLE, f"no integer table meets the invariants: rows {bad_rows} have non-integer "
                       "values (failsafe=True relaxes them)", start, {"method": method})
    rounding_table = table
    if bad_rows:
        values, solve = None, None
    else:
        values, solve, info = run(table)
    if values is None and failsafe and (solve is None or solve.status is Status.INFEASIBLE):
        relaxed_cs, relaxed, relax_solve = relax_invariants(table, engine, deadline, relax=relax,
                                                            slack_weights=slack_weights, options=options)
        if relaxed_cs is None:
            return _failed(relax_solve.status, f"failsafe: no integer table even with the invariants "
                           f"{sorted(relax) if relax is not None else 'all'} relaxed: {relax_solve.message}",
                           start, {"method": method, "stages": relax_solve.stages})
        rounding_table = RoundingTable(x, relaxed_cs)
        values, solve, info = run(rounding_table)
        info["relaxed"] = relaxed
        warnings.warn(f"integer rounding relaxed {len(relaxed)} invariant row(s) "
                      f"(total |slack| {relaxed['slack'].abs().sum():g}); see info['relaxed']", UserWarning,
                      stacklevel=2)
    if values is None:
        return _failed(solve.status, f"{info.get('method', method)}: {solve.message}", start, info,
                       backend=solve.backend, solver=solve.solver)
    return _finish(values, solve, info, table, rounding_table, specs, measured, cell_weight, method, start)


def _measured_specs(measured, weights, constraints: ConstraintSet) -> list[MeasuredQuery]:
    if measured is None:
        if weights is not None:
            raise QueryError("weights are given but measured is not")
        return []
    if isinstance(measured, (LinearQuery, Measurement)):
        measured = [measured]
    items = list(measured)
    if weights is None:
        weights = [1.0] * len(items)
    weights = list(weights)
    if len(weights) != len(items):
        raise QueryError(f"weights has {len(weights)} values for {len(items)} measured queries")
    specs = []
    for i, (item, w) in enumerate(zip(items, weights)):
        if isinstance(item, Measurement):
            query, label = item.query, item.label
        elif isinstance(item, LinearQuery):
            query, label = item, item.name
        else:
            raise QueryError(f"measured[{i}] must be a LinearQuery or a Measurement, got {type(item).__name__}")
        if query.domain != constraints.domain:
            raise QueryError(f"measured[{i}] ({label!r}) is over {query.domain}, not {constraints.domain}")
        if not (np.isfinite(w) and w > 0):
            raise QueryError(f"weights[{i}] must be a positive number, got {w!r}")
        specs.append(MeasuredQuery(label, query, float(w)))
    return specs


def measured_change(x_rounded: np.ndarray, x_fractional: np.ndarray, measured: Sequence[MeasuredQuery]
                    ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """How far each measured query moved, and the answers outside their floor/ceil interval.

    Returns ``(summary, exceptions)``: one summary row per query (``query``, ``rows``,
    ``l1_change``, ``max_change``, ``mean_change``, ``outside_floor_ceil``) and one exception
    row per answer outside ``[floor, ceil]`` of its fractional value (``query``, ``row``,
    ``fractional``, ``released``, ``outside_by``).
    """
    summary, exceptions = [], []
    for spec in measured:
        before = spec.query.matvec(x_fractional)
        after = spec.query.matvec(x_rounded)
        change = np.abs(after - before)
        outside_by = np.maximum(np.floor(before + 1e-9) - after, 0) + np.maximum(after - np.ceil(before - 1e-9), 0)
        bad = np.flatnonzero(outside_by > CHECK_TOL)
        summary.append({"query": spec.label, "rows": int(before.size), "l1_change": float(change.sum()),
                        "max_change": float(change.max(initial=0.0)),
                        "mean_change": float(change.mean()) if change.size else 0.0,
                        "outside_floor_ceil": int(bad.size)})
        exceptions += [{"query": spec.label, "row": int(r), "fractional": float(before[r]),
                        "released": float(after[r]), "outside_by": float(outside_by[r])} for r in bad]
    return (pd.DataFrame(summary, columns=["query", "rows", "l1_change", "max_change", "mean_change",
                                           "outside_floor_ceil"]),
            pd.DataFrame(exceptions, columns=["query", "row", "fractional", "released", "outside_by"]))


class _Holder:
    """Just enough of a problem for the residual tables of a rounding result."""

    def __init__(self, constraints, measured):
        self.constraints = constraints
        items = [measured] if isinstance(measured, Measurement) else list(measured or [])
        self.measurements = [m for m in items if isinstance(m, Measurement)]


def _finish(values, solve, info, table, rounding_table, specs, measured, cell_weight, method, start) -> Result:
    """Check the point ourselves, then build the result with every report."""
    x = rounding_table.table(np.round(values))
    original = np.asarray(table.x, dtype=np.float64)
    summary, exceptions = measured_change(x, table.target, specs)
    cell_l1 = float(np.abs(x - original).sum())
    fun = cell_l1
    if method == "controlled" and "fallback" not in info:
        fun = sum(s.weight * row for s, row in zip(specs, summary["l1_change"])) + cell_weight * cell_l1
    info.update(measured_change=summary, exceptions=exceptions, cell_l1_change=cell_l1,
                stages=getattr(solve, "stages", []))
    if solve.bound is not None and "gap" not in info:
        info["lower_bound"], info["gap"] = solve.bound, solve.gap
    violations = [r for r in rounding_table.constraints.residuals(x, tol=CHECK_TOL) if not r["satisfied"]]
    status, message = solve.status, solve.message
    if violations:
        status = Status.NUMERICAL_ERROR
        message = (f"{solve.solver} returned a table that violates {[v['constraint'] for v in violations]} "
                   f"(largest {max(v['max_violation'] for v in violations):.3g}); not released as optimal")
    elif "fallback" in info:
        message = (f"controlled rounding failed ({info['fallback']['status']}: {info['fallback']['reason']}); "
                   f"fell back to the per-cell L1 optimum: {message}")
    result = make_result(status, x, message=f"{info.get('method', method)}: {message}", fun=fun, objective="round",
                         backend=solve.backend, solver=solve.solver, time=time.perf_counter() - start,
                         nit=solve.iterations or None, problem=_Holder(table.constraints, measured),
                         info=info, incumbent=bool(solve.incumbent))
    return result


def _failed(status: Status, message: str, start: float, info: dict, backend: str = "none", solver: str = "none"):
    return make_result(status, None, message=message, fun=None, objective="round", backend=backend, solver=solver,
                       time=time.perf_counter() - start, nit=None, info=info)

