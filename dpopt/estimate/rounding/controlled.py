"""Controlled rounding: integers that keep the marginals people read.

The 2020 Census TopDown algorithm rounds its least-squares solution with an L1 *controlled
rounder* (Abowd et al., "The 2020 Census Disclosure Avoidance System TopDown Algorithm",
Harvard Data Science Review, 2022): every cell goes to its floor or its ceiling, ``x = ⌊x~⌋ + b``
with ``b`` binary, the invariants and structural zeros hold exactly, and the objective is the
L1 distance on the *queries* (the tables that will be published), not on the cells. dpopt's
version:

    minimise    Σ_k w_k ‖Q_k x − Q_k x~‖₁  +  λ ‖x − x~‖₁
    subject to  x = base + b,  b ∈ {0, 1}^free          (base = ⌊x~⌋, 0 below 0 under x >= 0)
                ⌊Q_k x~⌋ <= Q_k x <= ⌈Q_k x~⌉           for every measured query Q_k
                invariants, inequalities, structural zeros (pinned cells have no b)

with ``λ`` a small per-cell tie-break (``cell_weight``). Because every measured answer is held
at the floor or the ceiling of its fractional value, ``|Q_k x − Q_k x~|`` is *linear* in ``b``
on that interval: ``f + (1 − 2f)(q(b) − lo)`` with ``f`` the fraction of the answer and ``lo``
its floor minus ``q(base)``. So the program is a 0/1 LP with one row per measured answer.
At ``b = frac(x~)`` every row holds, so the LP relaxation is always feasible when ``x~`` meets
the constraints; the integer program may not be (three or more crossing families of rows have
no floor/ceil rounding in general). The floor/ceil (hard) program is tried first, its MIPs
under a share of the time left after its LP (:data:`HARD_SHARE`) — unless there are more
measured answers than fractional cells, where it almost never has a solution; if it has none
(or none was found in that time) the measured rows go *soft*: an answer may leave its window, and the excursion columns make the
objective the answer's true L1 change, so the least total L1 change is found and every answer
left outside is reported as an exception. No infeasibility is ever explained by a conflict
(IIS) search (issue 24: rochdale's 56 three-way marginals sat for minutes in one).

Passes (coarse first, as the Census's multi-pass rounder): pass ``p`` rounds with the rows of its
own queries in the objective and holds the answers released by earlier passes as equalities;
the previous pass's table satisfies them, so every later pass has a point to start from.

Large tables (more than :data:`DIRECT_MAX` free cells) of a product domain whose row families
are all marginals (invariants too; no inequality) are rounded without a MIP over the cells: the
best consistent integer answers first (:mod:`~dpopt.estimate.rounding.answers`: a MIP over the
answers, whose optimum bounds every integer table's query error) and the fractions moved to have
them, then the support walk of :mod:`~dpopt.estimate.rounding.walk` (every row kept exactly, at
most ``rank(A)`` cells left fractional), largest remainder within the invariant rows for the last
fractions, then the local search of :mod:`~dpopt.estimate.rounding.local_search` (2 × 2 cycles,
one-attribute moves and swaps, which never change an invariant). Its ``gap`` is certified
against the answers' bound (plus the cells' largest-remainder bound) or the per-query bound of
:func:`row_bound`, whichever is larger; a point short of the requested gap is an incumbent with
status ITERATION_LIMIT. Other large programs go to a MIP over the cells the
walk left fractional and a neighbourhood chosen by reduced costs (column generation against the
LP duals until no cell prices in, which makes the neighbourhood's LP bound the whole program's,
else the Lagrangian bound at the last duals).

The MIPs are :func:`~dpopt.estimate.rounding.solve.solve_integer_program` (the LP vertex, a
MIP over its fractional part, then the full MIP), under the rounding's deadline; when it
expires the best point so far is kept with status TIME_LIMIT and its certified gap.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from dpopt.errors import QueryError
from dpopt.estimate.backends.base import Backend
from dpopt.estimate.form import ProgramForm
from dpopt.estimate.rounding.model import INTEGRAL_TOL, RoundingTable, looks_totally_unimodular
from dpopt.estimate.rounding.solve import Deadline, IntegerSolve, lp_only_certifies, solve_integer_program
from dpopt.estimate.rounding.walk import marginal_axes, reduce_support
from dpopt.estimate.status import Status

__all__ = ["MeasuredQuery", "round_controlled", "row_bound", "CONTROLLED_MIP_GAP", "CELL_WEIGHT", "MAX_PASS_ROWS",
           "DIRECT_MAX"]

#: Default relative gap to the lower bound at which a controlled rounding counts as optimal. On the
#: census example (10^4 measured answers) the objective is about 0.25 per answer, so 2 % is at
#: most 0.005 persons per published cell on average: invisible next to the noise (2.8 to 8.4
#: per cell there). The first MIP around the LP vertex reaches 0.5-1 % at its root node in
#: seconds; closing the gap to 0.5 % took 200 s and the last 0.2 % is out of reach.
CONTROLLED_MIP_GAP = 2e-2

#: Default weight of the per-cell L1 change, a tie-break among roundings of equal query error.
CELL_WEIGHT = 1e-3

#: A single pass holds at most this many measured answers; more are split coarse-first.
MAX_PASS_ROWS = 50_000

#: Up to this many free cells the program is solved whole (the census example's 7,300 in about a
#: second); above, the walk and the local search take product-domain tables of marginals.
DIRECT_MAX = 20_000

#: Programs outside the walk-and-search path are solved whole up to this many free cells.
WHOLE_MAX = 250_000

#: Cells of the neighbourhood MIP besides the ones left fractional by the walk ...
NEIGHBOURHOOD_CELLS = 2000
#: ... and at most this many rounds of column generation to price the others in.
PRICING_ROUNDS = 6

#: Answers within this relative distance of an integer are that integer.
_SNAP = 1e-9
#: A cell whose fraction is below this (or above 1 minus it) is integral: it gets no variable
#: (a fit's 1e-9 is a solver's zero).
_FRACTIONAL = INTEGRAL_TOL
#: After its LP, the floor/ceil (hard) program's MIPs get this share of the time left (and at
#: least a second) before the soft one is solved instead.
HARD_SHARE = 0.25


@dataclass(frozen=True)
class MeasuredQuery:
    """A query whose answers the rounding keeps, with its label and weight."""

    label: str
    query: object
    weight: float = 1.0


@dataclass
class _Rows:
    """One family of rows, relative to the floor table: the query and its window ``[lo, hi]``.

    ``kind`` is ``"measured"`` (soft window, objective), ``"released"`` (an earlier pass's
    answers, exact), ``"invariant"`` or ``"inequality"``; ``frac`` and ``target`` only for measured rows.
    """

    label: str
    query: object
    lo: np.ndarray
    hi: np.ndarray
    kind: str
    weight: float = 0.0
    target: np.ndarray | None = None
    frac: np.ndarray | None = None


def _measured_rows(table: RoundingTable, spec: MeasuredQuery) -> _Rows:
    if not spec.query.is_integer:
        raise QueryError(
            f"controlled rounding keeps integer-valued queries; {spec.label!r} has non-integer coefficients "
            "(use method='cellwise', or measure it on an integer scale)"
        )
    target = np.asarray(spec.query.matvec(table.target), dtype=np.float64)
    near = np.round(target)
    target = np.where(np.abs(target - near) <= _SNAP * np.maximum(1.0, np.abs(target)), near, target)
    floor = np.floor(target)
    shift = spec.query.matvec(table.table(table.base))
    return _Rows(spec.label, spec.query, floor - shift, np.ceil(target) - shift, "measured", spec.weight,
                 target, target - floor)


def _constraint_rows(table: RoundingTable) -> list[_Rows]:
    cs = table.constraints
    base = table.table(table.base)
    out = []
    for c in cs.invariants:
        shift = c.query.matvec(base)
        out.append(_Rows(c.name, c.query, c.values - shift, c.values - shift, "invariant"))
    for c in cs.inequalities:
        shift = c.query.matvec(base)
        out.append(_Rows(c.name, c.query, c.lower - shift, c.upper - shift, "inequality"))
    return out


def round_controlled(
    table: RoundingTable,
    measured: list[MeasuredQuery],
    engine: Backend,
    deadline: Deadline,
    *,
    mip_gap: float | None,
    cell_weight: float,
    passes,
    options: dict,
) -> tuple[np.ndarray | None, IntegerSolve, dict]:
    """Controlled rounding of the free cells (see the module notes).

    Returns ``(free values or None, outcome of the last solve, info)`` where info has
    ``method``, ``passes`` (one record per pass) and ``soft`` (whether any answer had to leave
    its floor/ceil window).
    """
    gap = CONTROLLED_MIP_GAP if mip_gap is None else mip_gap
    rows = [_measured_rows(table, m) for m in measured]
    groups = _pass_groups(rows, passes)
    constraint_rows = _constraint_rows(table)
    fixed: list[_Rows] = []
    b = None
    records = []
    solve = None
    for p, group in enumerate(groups):
        current = [rows[i] for i in group]
        b_new, solve, record = _one_pass(table, current, fixed + constraint_rows, engine, deadline, gap,
                                         cell_weight, options)
        record["pass"] = p + 1
        records.append(record)
        if b_new is None:
            break
        b = b_new
        x_now = table.table(table.base + b)
        base = table.table(table.base)
        for r in current:  # later passes hold these answers exactly (relative to base, like lo/hi)
            released = r.query.matvec(x_now) - r.query.matvec(base)
            fixed.append(_Rows(r.label, r.query, released, released, "released"))
    done = b is not None and len(records) == len(groups)
    if done and solve is not None and any(r["status"] != "OPTIMAL" for r in records):
        # Some pass was not certified (time limit, or a local search short of the gap): the whole
        # rounding is an incumbent, with that pass's status.
        worst = next(r["status"] for r in records if r["status"] != "OPTIMAL")
        solve.status, solve.incumbent = Status[worst], True
    info = {
        "method": "controlled" + (f" ({len(groups)} passes)" if len(groups) > 1 else ""),
        "passes": records,
        "soft": any(r["mode"] == "soft" for r in records),
        "lower_bound": solve.bound if solve is not None and len(groups) == 1 else None,
        "gap": solve.gap if solve is not None and len(groups) == 1 else None,
    }
    if not done:
        return None, solve, info
    return table.base + b, solve, info


def _pass_groups(rows: list[_Rows], passes) -> list[list[int]]:
    """Indices of the measured queries in each pass."""
    if passes is None or passes == "auto":
        if sum(r.lo.size for r in rows) <= MAX_PASS_ROWS:
            return [list(range(len(rows)))]
        order = sorted(range(len(rows)), key=lambda i: rows[i].lo.size)  # coarse first
        groups, size = [[]], 0
        for i in order:
            m = rows[i].lo.size
            if groups[-1] and size + m > MAX_PASS_ROWS:
                groups.append([])
                size = 0
            groups[-1].append(i)
            size += m
        return groups
    if passes == "single":
        return [list(range(len(rows)))]
    groups = [list(g) for g in passes]
    flat = sorted(i for g in groups for i in g)
    if flat != list(range(len(rows))) or any(not g for g in groups):
        raise QueryError(f"passes must split the {len(rows)} measured queries (indices 0..{len(rows) - 1}) "
                         f"into non-empty groups, each index once; got {passes!r}")
    return groups


class _Pass:
    """The 0/1 program of one pass over the fractional cells (see the module notes).

    Variables ``b_j`` for every free cell (``x = floor + b``); ``fractional`` lists those whose
    ``x~`` is not an integer. Rows: the measured windows of this pass (soft when asked), then
    ``others`` (earlier passes' answers, invariants, inequalities: exact).
    """

    def __init__(self, table: RoundingTable, current: list[_Rows], others: list[_Rows], cell_weight: float):
        self.table = table
        self.current = current
        self.others = others
        self.families = current + others
        frac = table.frac
        self.movable = np.arange(table.k)  # every free cell: x = floor + b, b in {0, 1}
        self.fractional = np.flatnonzero((frac > _FRACTIONAL) & (frac < 1.0 - _FRACTIONAL))
        self.cell_weight = cell_weight
        # Objective over the free cells: the cell tie-break plus each measured row's chord.
        cost = cell_weight * (1.0 - 2.0 * frac)
        c0 = cell_weight * (float(frac.sum()) + table.negative_mass)
        for r in current:
            cost = cost + r.weight * table.table_values(r.query.rmatvec(1.0 - 2.0 * r.frac))
            c0 += r.weight * float(np.sum(r.frac - (1.0 - 2.0 * r.frac) * r.lo))
        self.cost, self.c0 = cost, c0
        # The soft rows' excursion columns: their costs make the objective the true L1 change
        # of an answer outside its window (the chord's slope is corrected beyond the window).
        self.m = sum(r.lo.size for r in current)
        f = np.concatenate([r.frac for r in current]) if current else np.zeros(0)
        w = np.concatenate([np.full(r.lo.size, r.weight) for r in current]) if current else np.zeros(0)
        self.cost_above = w * 2.0 * f           # the answer above its ceiling (column -1)
        self.cost_below = w * (2.0 - 2.0 * f)   # below its floor (column +1)
        self.lo = np.concatenate([r.lo for r in self.families]) if self.families else np.zeros(0)
        self.hi = np.concatenate([r.hi for r in self.families]) if self.families else np.zeros(0)
        self.names = [f"{'measured' if r.kind == 'measured' else r.kind}:{r.label}[{i}]"
                      for r in self.families for i in range(r.lo.size)]

    def looks_totally_unimodular(self) -> bool:
        cols = self.table.free[self.movable]
        return looks_totally_unimodular([sp.csr_matrix(r.query.columns(cols)) for r in self.families])

    def walk_families(self) -> list[tuple[int, ...]] | None:
        axes = [marginal_axes(r.query, self.table.constraints.domain) for r in self.families]
        return None if any(a is None for a in axes) else axes

    def row_values(self, b: np.ndarray) -> np.ndarray:
        """``A b`` for a vector over the free cells (matrix-free)."""
        x = self.table.table(b)
        return np.concatenate([r.query.matvec(x) for r in self.families]) if self.families else np.zeros(0)

    def form(self, cols: np.ndarray, b: np.ndarray, *, soft: bool) -> ProgramForm:
        """The program over the free cells ``cols`` (a subset of the movable ones), every other at ``b``."""
        cells = self.table.free[cols]
        A = sp.vstack([sp.csr_matrix(r.query.columns(cells)) for r in self.families]).tocsr() if self.families \
            else sp.csr_matrix((0, cols.size))
        rest = b.copy()
        rest[cols] = 0.0
        shift = self.row_values(rest)
        c0 = self.c0 + float(self.cost @ rest)
        lower, upper = self.lo - shift, self.hi - shift
        k = cols.size
        if not soft:
            return ProgramForm(c=self.cost[cols], A=A, row_lower=lower, row_upper=upper, row_names=self.names,
                               lower=np.zeros(k), upper=np.ones(k), integrality=np.ones(k, bool), c0=c0)
        m, rows = self.m, A.shape[0]
        E = sp.vstack([sp.identity(m, format="csr"), sp.csr_matrix((rows - m, m))]).tocsr()
        return ProgramForm(
            c=np.concatenate([self.cost[cols], self.cost_above, self.cost_below]), A=sp.hstack([A, -E, E]).tocsr(),
            row_lower=lower, row_upper=upper, row_names=self.names, lower=np.zeros(k + 2 * m),
            upper=np.concatenate([np.ones(k), np.full(2 * m, np.inf)]),
            integrality=np.concatenate([np.ones(k, bool), np.zeros(2 * m, bool)]), c0=c0)

    def reduced_costs(self, duals: np.ndarray) -> np.ndarray:
        """``c - Aᵀ y`` over the free cells (matrix-free)."""
        out = self.cost.copy()
        start = 0
        for r in self.families:
            y = duals[start:start + r.lo.size]
            start += r.lo.size
            if np.any(y):
                out -= self.table.table_values(r.query.rmatvec(y))
        return out

    def lagrangian_bound(self, duals: np.ndarray) -> float:
        """A lower bound on the whole pass program (soft rows, every movable cell in [0, 1]) from any row duals.

        ``cᵀb >= Σ_j min(0, (c - Aᵀy)_j) + Σ_r (y_r lo_r if y_r > 0 else y_r hi_r)`` for ``lo <= A b <= hi``
        and ``0 <= b <= 1``; the duals of the soft rows are clipped to the excursions' costs
        (else their columns would price in without limit) and those of one-sided rows to the
        sign their finite bound allows, which keeps the bound valid for any ``y``.
        """
        y = np.array(duals, dtype=np.float64)
        m = self.m
        y[:m] = np.clip(y[:m], -self.cost_above, self.cost_below)
        y = np.where(np.isfinite(self.lo) | (y <= 0), y, 0.0)
        y = np.where(np.isfinite(self.hi) | (y >= 0), y, 0.0)
        reduced = self.reduced_costs(y)[self.movable]
        rows = np.where(y > 0, y * np.where(np.isfinite(self.lo), self.lo, 0.0),
                        y * np.where(np.isfinite(self.hi), self.hi, 0.0))
        return self.c0 + float(np.minimum(reduced, 0.0).sum()) + float(rows.sum())

    def exceptions(self, b: np.ndarray) -> int:
        """How many measured answers of this pass are outside their floor/ceil window at ``b``."""
        if not self.m:
            return 0
        values = self.row_values(b)[:self.m]
        return int(np.sum((values < self.lo[:self.m] - 1e-6) | (values > self.hi[:self.m] + 1e-6)))


def row_bound(table: RoundingTable, current: list[_Rows], cell_weight: float) -> float:
    """A lower bound on a pass's objective from each measured query alone (largest remainder).

    For a query whose rows partition the free cells, ``Σ_r q_r`` is the table's total ``N``;
    the least ``Σ_r |q_r − t_r|`` over integers with that sum puts the ``N − Σ⌊t⌋`` units on the
    largest fractions (each unit past them costs 1). Summed over the queries, plus
    ``cell_weight`` times the same bound for the cells, and minimised over ``N`` when no
    invariant fixes the total, this bounds every integer table (floor/ceil or not). Queries that
    are not partitions contribute ``Σ_r min(f, 1 − f)``.
    """
    totals = [c for c in table.constraints.invariants if marginal_axes(c.query, table.constraints.domain) == ()]
    fixed_total = float(totals[0].values[0]) if totals else None
    curves = []  # (floor sum, costs of successive units upward from it)
    constant = 0.0
    for r in current:
        axes = marginal_axes(r.query, table.constraints.domain)
        if axes is None:
            constant += r.weight * float(np.minimum(r.frac, 1.0 - r.frac).sum())
            continue
        curves.append((r.weight, float(np.floor(r.target).sum()), float(r.frac.sum()), np.sort(r.frac)[::-1]))
    values = table.values
    fr = values - np.floor(values)
    curves.append((cell_weight, float(np.floor(values).sum()), float(fr.sum()), np.sort(fr)[::-1]))
    lows = [c[1] for c in curves]
    highs = [c[1] + c[3].size for c in curves]
    if fixed_total is not None:
        grid = np.array([fixed_total])
    else:
        grid = np.arange(np.floor(min(lows)) - 1, np.ceil(max(highs)) + 2)
    total = np.zeros(grid.size)
    for w, base, fsum, fdesc in curves:
        steps = np.concatenate([[0.0], np.cumsum(1.0 - 2.0 * fdesc)])
        j = grid - base
        inside = np.clip(j, 0, fdesc.size).astype(np.int64)
        cost = fsum + steps[inside] + np.maximum(j - fdesc.size, 0) + np.maximum(-j, 0)
        total += w * cost
    return constant + float(total.min())


def _one_pass(table, current, others, engine, deadline, gap, cell_weight, options):
    """One pass: the walk (large tables), then the MIP over the cells left to decide."""
    prog = _Pass(table, current, others, cell_weight)
    record = {"queries": [r.label for r in current], "fractional_cells": int(prog.fractional.size)}
    b = np.zeros(table.k)
    b[prog.fractional] = table.frac[prog.fractional]
    searched = None if table.k <= DIRECT_MAX else _walk_and_search(prog, b, deadline, record, engine, gap, options)
    # Programs the walk and search do not cover (structural zeros, inequalities, other queries)
    # are solved whole up to WHOLE_MAX cells (the census example's 73,000 free cells: the LP
    # vertex and one MIP around it), beyond that by the neighbourhood MIP.
    whole = searched is None and table.k <= WHOLE_MAX
    tu = whole and prog.looks_totally_unimodular()
    record["totally_unimodular_rows"] = tu
    if searched is None and not whole and prog.fractional.size > NEIGHBOURHOOD_CELLS:
        axes = prog.walk_families()
        if axes is not None:
            cells = table.free[prog.fractional]
            y, stats = reduce_support(b[prog.fractional], prog.cost[prog.fractional],
                                      table.constraints.domain.unravel(cells), table.constraints.domain.shape,
                                      axes, deadline)
            b[prog.fractional] = y
            record["walk"] = stats.as_dict()
    if searched is not None:
        b, solve, b_walk, answer_bound = searched
        solve.bound = row_bound(table, current, cell_weight)
        which = "the per-query bound"
        if answer_bound is not None:
            # The consistent-answers bound on the query error, plus the cells' own largest-remainder bound.
            joint = answer_bound + row_bound(table, [], cell_weight)
            if joint > solve.bound:
                solve.bound, which = joint, "the consistent-answers bound"
        # With the answers' MIP solved the LP's bound adds little (nltcs l2 fit: 143.776 against
        # 143.733) at most of the rounding's time (42 of 58 s): it is priced only without it.
        answers_solved = record.get("answers", {}).get("status") == "OPTIMAL"
        if solve.gap > gap and not deadline.expired() and not answers_solved:
            # The per-query bound is loose where the queries cross: the LP bound (Lagrangian at the
            # duals of an LP around the walk's point, priced until it certifies the point).
            target = solve.objective
            _, pricing, lp_bound = _neighbourhood(prog, b_walk, engine, deadline, False, options,
                                                  enough=lambda lb: (target - lb) / max(abs(target), 1.0) <= gap)
            record["pricing"] = pricing
            if lp_bound > solve.bound:
                solve.bound, which = lp_bound, "the LP bound"
        certified = solve.gap is not None and solve.gap <= gap
        solve.status = Status.OPTIMAL if certified else (Status.TIME_LIMIT if deadline.expired()
                                                         else Status.ITERATION_LIMIT)
        solve.incumbent = not certified
        solve.message += f"; certified gap {solve.gap:.3g} against {which} (requested {gap:g})"
        exceptions = prog.exceptions(b)
        record.update(mode="soft" if exceptions else "hard", exceptions=exceptions, status=solve.status.name,
                      step=solve.step, gap=solve.gap, objective=solve.objective, lower_bound=solve.bound, stages=[])
        return b, solve, record
    cols, pricing, bound = _neighbourhood(prog, b, engine, deadline, whole, options)
    record["pricing"] = pricing
    if not whole:
        bound = max(bound, row_bound(table, current, cell_weight))
    while True:
        record["mip_cells"] = int(cols.size)
        solve, mode = _solve_windows(prog, cols, b, tu, engine, deadline, gap, options)
        record["program"] = mode
        if solve.x is None or cols.size == prog.movable.size:
            break
        # The neighbourhood's own LP bound holds for the neighbourhood only: certify against the whole program.
        solve.bound = bound
        certified = solve.gap is not None and solve.gap <= gap
        solve.status, solve.incumbent = (Status.OPTIMAL, False) if certified else (Status.TIME_LIMIT, True)
        solve.message = (f"{solve.step} over {cols.size} of {prog.movable.size} cells; certified gap "
                         f"{solve.gap:.3g} against a bound on the whole program")
        if certified or deadline.expired():
            break
        # Not certified yet: a neighbourhood twice as large (cheapest cells to flip first), from this point.
        b = b.copy()
        b[cols] = np.round(solve.x[:cols.size])
        outside = np.setdiff1d(prog.movable, cols)
        cols = np.union1d(cols, outside[np.argsort(np.abs(prog.cost[outside]), kind="stable")[:max(cols.size, 1)]])
    if solve.x is None:
        record.update(mode="soft", status=solve.status.name, step=solve.step, gap=None, objective=None,
                      lower_bound=solve.bound, stages=solve.stages)
        return None, solve, record
    b = b.copy()
    b[cols] = np.round(solve.x[:cols.size])
    exceptions = prog.exceptions(b)
    record.update(mode="soft" if exceptions else "hard", exceptions=exceptions, status=solve.status.name,
                  step=solve.step, gap=solve.gap, objective=solve.objective, lower_bound=solve.bound,
                  stages=solve.stages)
    return b, solve, record


def _walk_and_search(prog: "_Pass", b: np.ndarray, deadline: Deadline, record: dict, engine, gap: float,
                     options: dict):
    """Large product-domain tables: best integer answers, walk, round the last fractions, then local search.

    Applies when every row family is a marginal, the invariants are marginals (their attributes
    never move) and there is no inequality and no earlier pass (else None). Returns ``(b,
    IntegerSolve, the walk's point, the consistent-answers lower bound on the query error or None)``.
    """
    from dpopt.estimate.rounding.local_search import neighbour_search

    table = prog.table
    domain = table.constraints.domain
    if table.k != domain.size or any(r.kind not in ("measured", "invariant") for r in prog.families):
        return None
    axes = prog.walk_families()
    if axes is None:
        return None
    fixed_axes = {a for r, ax in zip(prog.families, axes) if r.kind == "invariant" for a in ax}
    b = b.copy()
    coords = domain.unravel(table.free)
    answer_bound, moved = None, None
    if prog.fractional.size and prog.lo.size <= ANSWERS_MAX:
        # First the best consistent integer answers (a MIP over the answers, not the cells), then
        # the fractions moved to have them: the walk keeps them while it makes cells integral.
        moved, answer_bound = _answers_first(prog, b, axes, engine, deadline, gap, options, record)
        if moved is not None:
            b = moved
    if prog.fractional.size > NEIGHBOURHOOD_CELLS or moved is not None:
        # The walk runs to its end even past the deadline: its work is bounded (about 25 µs of
        # CPU per cell on nltcs), and a point it left with thousands of fractional cells would
        # round into answers hundreds of persons off (2^20 cells cut short under a load of 18:
        # 30 times the fit's error). The search and the certificate keep to the deadline.
        y, stats = reduce_support(b[prog.fractional], prog.cost[prog.fractional], coords[prog.fractional],
                                  domain.shape, axes, None)
        b[prog.fractional] = y
        record["walk"] = stats.as_dict()
    # The last fractions: largest remainder within each invariant row (the cells that agree on
    # the invariants' attributes), which keeps every invariant.
    b_walk = b.copy()
    fixed = sorted(fixed_axes)
    group = np.ravel_multi_index(coords[:, fixed].T, np.asarray(domain.shape)[fixed]) if fixed \
        else np.zeros(table.k, np.int64)
    frac_idx = np.flatnonzero((b > _FRACTIONAL) & (b < 1.0 - _FRACTIONAL))
    order = frac_idx[np.lexsort((-b[frac_idx], group[frac_idx]))]
    sums = np.bincount(group[frac_idx], weights=b[frac_idx], minlength=int(group.max()) + 1)
    if fixed and np.any(np.abs(sums - np.round(sums)) > 1e-6):
        return None
    need = np.round(sums).astype(np.int64)
    counts = np.bincount(group[order], minlength=sums.size)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank = np.arange(order.size) - starts[group[order]]
    b[frac_idx] = 0.0
    b[order[rank < need[group[order]]]] = 1.0
    measured = [r for r in prog.families if r.kind == "measured"]
    x = table.table(table.base + b)
    shift = [r.query.matvec(table.table(table.base)) for r in measured]
    values = [r.query.matvec(x) - sh for r, sh in zip(measured, shift)]
    targets = [r.target - sh for r, sh in zip(measured, shift)]
    b, info = neighbour_search(b, prog.cell_weight * (1.0 - 2.0 * table.frac), coords, domain.shape,
                               [marginal_axes(r.query, domain) for r in measured], values, targets,
                               [r.weight for r in measured], fixed_axes, deadline,
                               keep_total=any(r.kind == "invariant" for r in prog.families))
    record["search"] = info
    objective = prog.c0 + float(prog.cost @ b) + _excursion_cost(prog, b)
    solve = IntegerSolve(Status.OPTIMAL, b, objective, None, f"support walk, then {info['moves']} local moves "
                         f"in {info['sweeps']} sweeps", backend="numpy", solver="numpy", step="walk and local search")
    return b, solve, b_walk, answer_bound


#: The answers' MIP gets at most this share of the rounding's time left ...
ANSWERS_SHARE = 0.25
#: ... and is built only for at most this many rows (answers and invariant values): an identity
#: query among the measured ones would make it as large as the table.
ANSWERS_MAX = 20_000
#: The fractions are moved to the answers only with at least this many fractional cells per row.
MOVE_MIN_PER_ROW = 4


def _answers_first(prog: "_Pass", b: np.ndarray, axes, engine, deadline: Deadline, gap: float, options: dict,
                   record: dict):
    """The least-L1 consistent integer answers, and ``b`` moved to have them (see
    :mod:`~dpopt.estimate.rounding.answers`). Returns ``(moved b or None, lower bound on the
    weighted query error or None)``."""
    from dpopt.estimate.rounding.answers import AnswerFamily, integer_answers, move_to_answers

    table = prog.table
    sizes = np.asarray(table.constraints.domain.shape, dtype=np.int64)
    n = float(table.k)
    families = [AnswerFamily(ax, r.lo + r.frac if r.kind == "measured" else None, r.weight,
                             r.lo if r.kind != "measured" else None,
                             n / float(np.prod(sizes[list(ax)], dtype=np.float64)) if ax else n)
                for r, ax in zip(prog.families, axes)]
    left = deadline.left()
    sub = deadline if left is None else deadline.capped(ANSWERS_SHARE * left)
    z, solve = integer_answers(families, sizes, engine, sub, gap / 4, options)
    info = {"status": solve.status.name, "objective": solve.objective, "bound": solve.bound,
            "step": solve.step}
    record["answers"] = info
    bound = solve.bound if solve.bound is not None and np.isfinite(solve.bound) else None
    if z is None:
        return None, bound
    if prog.fractional.size < MOVE_MIN_PER_ROW * prog.lo.size:
        # Too few fractional cells to carry the answers' change (a least-squares fit is fractional
        # on about rank(A) cells): only the bound is used.
        info["reached"] = False
        return None, bound
    free = table.free

    def columns(cells):
        return sp.vstack([sp.csr_matrix(r.query.columns(free[cells])) for r in prog.families]).tocsr()

    moved = move_to_answers(b, prog.row_values, columns, np.concatenate(z), deadline=deadline)
    info["reached"] = moved is not None
    return moved, bound


def _excursion_cost(prog: "_Pass", b: np.ndarray) -> float:
    """What the chord objective misses for answers outside their windows (their true L1 excess)."""
    if not prog.m:
        return 0.0
    values = prog.row_values(b)[:prog.m]
    above = np.maximum(values - prog.hi[:prog.m], 0.0)
    below = np.maximum(prog.lo[:prog.m] - values, 0.0)
    return float(prog.cost_above @ above + prog.cost_below @ below)


def _solve_windows(prog: "_Pass", cols, b, tu: bool, engine, deadline: Deadline, gap: float, options: dict):
    """The MIP over ``cols``: floor/ceil windows (hard) first, under part of the time left; if they
    admit no table (or none was found in that time), the soft program, whose objective is the
    true L1 change. Returns ``(IntegerSolve, "hard" or "soft")``.

    The soft program relaxes the hard one, so its LP bound is valid for both; when both gave a
    point the one with the smaller objective is kept (certified against the soft bound).
    """
    if not tu and prog.m > prog.fractional.size:
        # More measured answers than fractional cells (rochdale: 448 and 82): the windows almost
        # never admit a table, and HiGHS can spend its whole share without deciding. The soft
        # program's optimum is the least true L1 change, windows met or not.
        soft = solve_integer_program(prog.form(cols, b, soft=True), engine, deadline=deadline, mip_gap=gap,
                                     options=options)
        soft.message = f"{prog.m} measured answers and {prog.fractional.size} fractional cells: least true L1: " \
                       f"{soft.message}"
        return soft, "soft"
    hard_form = prog.form(cols, b, soft=False)
    # The LP gets the whole time left; the MIPs after it a share (totally unimodular rows: the LP
    # vertex is integral, so the LP alone decides the windows). Where the LP only certifies, HiGHS
    # solves it by interior point (see solve_integer_program's lp_method); a TU program keeps the
    # default method, whose vertex is the released point.
    fast_lp = not tu and engine.name == "highs" and lp_only_certifies(hard_form)
    hard = solve_integer_program(hard_form, engine, deadline=deadline, mip_gap=gap, options=options,
                                 mip_share=None if tu else HARD_SHARE, lp_method="ipm" if fast_lp else None)
    if hard.success or deadline.expired():
        return hard, "hard"
    soft = solve_integer_program(prog.form(cols, b, soft=True), engine, deadline=deadline, mip_gap=gap,
                                 options=options)
    if hard.x is not None and (soft.x is None or hard.objective <= soft.objective):
        hard.bound = soft.bound if soft.bound is not None else hard.bound
        if hard.gap is not None and hard.gap <= gap:
            hard.status, hard.incumbent = Status.OPTIMAL, False
        hard.stages = hard.stages + soft.stages
        return hard, "hard"
    soft.stages = hard.stages + soft.stages
    soft.message = f"no floor/ceil rounding ({hard.status.name}: {hard.message}); least true L1: {soft.message}"
    return soft, "soft"


def _neighbourhood(prog: _Pass, b: np.ndarray, engine, deadline, whole: bool, options, enough=None):
    """The cells of the MIP and a lower bound on the whole pass program.

    Whole programs: every movable cell (the MIP's own LP bound is then global; returned bound
    -inf). ``enough(bound)`` ends the pricing early (the caller's point is certified). Otherwise the cells the walk left fractional, the cheapest others to flip, and then
    every cell whose reduced cost at the neighbourhood LP's duals says it should move (column
    generation), until none does: the neighbourhood LP's optimum is then the whole LP's.
    """
    movable = prog.movable
    if whole:
        return movable, [], -np.inf
    fractional = movable[(b[movable] > _FRACTIONAL) & (b[movable] < 1.0 - _FRACTIONAL)]
    others = np.setdiff1d(movable, fractional)
    # Cheapest to flip first: |c_j| is what moving cell j alone costs.
    extra = others[np.argsort(np.abs(prog.cost[others]), kind="stable")[:NEIGHBOURHOOD_CELLS]]
    cols = np.union1d(fractional, extra)
    pricing = []
    bound = -np.inf
    lp_options = {k: v for k, v in options.items() if k != "mip_gap"}
    lp_options["conflicts"] = False
    for _ in range(PRICING_ROUNDS):
        if deadline.expired():
            break
        form = prog.form(cols, b, soft=True)
        from dataclasses import replace

        lp = engine.solve(replace(form, integrality=None), time_limit=deadline.left(), **lp_options)
        if lp.status is not Status.OPTIMAL or lp.row_duals is None:
            pricing.append({"cells": int(cols.size), "status": lp.status.name})
            break
        bound = max(bound, prog.lagrangian_bound(lp.row_duals))
        if enough is not None and enough(bound):
            pricing.append({"cells": int(cols.size), "lp_objective": float(lp.objective), "bound": bound})
            break
        reduced = prog.reduced_costs(lp.row_duals)
        outside = np.setdiff1d(movable, cols)
        tol = 1e-9 * max(1.0, float(np.abs(prog.cost).max(initial=0.0)))
        wants = outside[((b[outside] < 0.5) & (reduced[outside] < -tol)) | ((b[outside] > 0.5) & (reduced[outside] > tol))]
        pricing.append({"cells": int(cols.size), "lp_objective": float(lp.objective), "bound": bound,
                        "priced_in": int(wants.size)})
        if wants.size == 0:
            bound = max(bound, float(lp.objective))  # no column prices in: the LP optimum is global
            break
        order = np.argsort(-np.abs(reduced[wants]), kind="stable")
        cols = np.union1d(cols, wants[order[:NEIGHBOURHOOD_CELLS]])
    return cols, pricing, bound
