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
no floor/ceil rounding in general). Then the measured rows go *soft*: an answer may leave its
floor/ceil interval at a price ``P`` per unit (plus its true L1 cost), with ``P`` larger than
the whole L1 objective can vary over floor/ceil roundings, so an excursion is made only when
the equalities leave no floor/ceil rounding; every answer left outside is reported as an
exception.

Passes (coarse first, as the Census's multi-pass rounder): pass ``p`` rounds with the rows of its
own queries in the objective and holds the answers released by earlier passes as equalities;
the previous pass's table satisfies them, so every later pass has a point to start from.

The solve is :func:`~dpopt.estimate.rounding.solve.solve_integer_program`: the LP vertex, a MIP
over its fractional part, then the full MIP; the result states the certified gap to the LP
bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from dpopt.errors import QueryError
from dpopt.estimate.backends.base import Backend
from dpopt.estimate.form import ProgramForm
from dpopt.estimate.rounding.model import RoundingTable, looks_totally_unimodular
from dpopt.estimate.rounding.solve import Deadline, IntegerSolve, solve_integer_program
from dpopt.estimate.status import Status

__all__ = ["MeasuredQuery", "round_controlled", "CONTROLLED_MIP_GAP", "CELL_WEIGHT", "MAX_PASS_ROWS"]

#: Default relative gap to the LP bound at which a controlled rounding counts as optimal. On the
#: census example (10^4 measured answers) the objective is about 0.25 per answer, so 2 % is at
#: most 0.005 persons per published cell on average: invisible next to the noise (2.8 to 8.4
#: per cell there). The first MIP around the LP vertex reaches 0.5-1 % at its root node in
#: seconds; closing the gap to 0.5 % took 200 s and the last 0.2 % is out of reach.
CONTROLLED_MIP_GAP = 2e-2

#: Default weight of the per-cell L1 change, a tie-break among roundings of equal query error.
CELL_WEIGHT = 1e-3

#: A single pass holds at most this many measured answers; more are split coarse-first.
MAX_PASS_ROWS = 50_000

#: Answers within this relative distance of an integer are that integer.
_SNAP = 1e-9


@dataclass(frozen=True)
class MeasuredQuery:
    """A query whose answers the rounding keeps, with its label and weight."""

    label: str
    query: object
    weight: float = 1.0


@dataclass
class _Rows:
    """One measured query over the free cells: matrix, fractional answers, floor/ceil window."""

    spec: MeasuredQuery
    Q: sp.csr_matrix
    target: np.ndarray
    frac: np.ndarray
    lo: np.ndarray  # floor(target) - Q base
    hi: np.ndarray  # ceil(target) - Q base


def _measured_rows(table: RoundingTable, spec: MeasuredQuery) -> _Rows:
    if not spec.query.is_integer:
        raise QueryError(
            f"controlled rounding keeps integer-valued queries; {spec.label!r} has non-integer coefficients "
            "(use method='cellwise', or measure it on an integer scale)"
        )
    Q = table.columns(spec.query)
    target = Q @ table.values
    near = np.round(target)
    target = np.where(np.abs(target - near) <= _SNAP * np.maximum(1.0, np.abs(target)), near, target)
    floor = np.floor(target)
    frac = target - floor
    shift = Q @ table.base
    return _Rows(spec, Q, target, frac, floor - shift, np.ceil(target) - shift)


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
    ``method``, ``passes`` (one record per pass) and ``soft`` (whether any pass needed soft rows).
    """
    gap = CONTROLLED_MIP_GAP if mip_gap is None else mip_gap
    rows = [_measured_rows(table, m) for m in measured]
    groups = _pass_groups(rows, passes)
    fixed: list[_Rows] = []
    b = None
    records = []
    solve = None
    for p, group in enumerate(groups):
        current = [rows[i] for i in group]
        b_new, solve, record = _one_pass(table, current, fixed, engine, deadline, gap, cell_weight, options)
        record["pass"] = p + 1
        records.append(record)
        if b_new is None:
            break
        b = b_new
        for r in current:  # later passes hold these answers exactly (relative to base, like lo/hi)
            released = r.Q @ b
            fixed.append(_Rows(r.spec, r.Q, r.target, np.zeros_like(released), released, released))
    done = b is not None and len(records) == len(groups)
    if done and solve is not None and any(r["status"] != "OPTIMAL" for r in records):
        # An earlier pass stopped on its time limit: the whole rounding is an incumbent.
        solve.status, solve.incumbent = Status.TIME_LIMIT, True
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
        if sum(r.Q.shape[0] for r in rows) <= MAX_PASS_ROWS:
            return [list(range(len(rows)))]
        order = sorted(range(len(rows)), key=lambda i: rows[i].Q.shape[0])  # coarse first
        groups, size = [[]], 0
        for i in order:
            m = rows[i].Q.shape[0]
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


def _one_pass(table, current, fixed, engine, deadline, gap, cell_weight, options):
    """Hard floor/ceil rows first; if the integer program is infeasible, soft rows."""
    tu = not fixed and looks_totally_unimodular(
        [r.Q for r in current] + [table.columns(c.query) for c in table.constraints.invariants]
        + [table.columns(c.query) for c in table.constraints.inequalities])
    record = {"queries": [r.spec.label for r in current], "totally_unimodular_rows": tu}
    attempts = []
    for mode in ("hard", "soft"):
        form, size = _form(table, current, fixed, cell_weight, soft=mode == "soft")
        solve = solve_integer_program(form, engine, deadline=deadline, mip_gap=gap, options=options)
        attempts.append({"mode": mode, "status": solve.status.name, "step": solve.step, "stages": solve.stages})
        if solve.x is not None:
            record.update(mode=mode, status=solve.status.name, step=solve.step, gap=solve.gap,
                          objective=solve.objective, lower_bound=solve.bound, attempts=attempts)
            return np.round(solve.x[:table.k]), solve, record
        if solve.status is not Status.INFEASIBLE:
            break  # out of time or a solver failure: soft rows would not help
    record.update(mode=attempts[-1]["mode"], status=solve.status.name, step=solve.step, gap=None,
                  objective=None, lower_bound=solve.bound, attempts=attempts)
    return None, solve, record


def _form(table: RoundingTable, current: list[_Rows], fixed: list[_Rows], cell_weight: float, *, soft: bool):
    """The 0/1 program of one pass (see the module notes); returns ``(form, measured rows)``."""
    k = table.k
    cons = table.rows()
    cost = cell_weight * (1.0 - 2.0 * table.frac)
    c0 = cell_weight * (float(table.frac.sum()) + table.negative_mass)
    for r in current:
        w = r.spec.weight
        cost = cost + w * (r.Q.T @ (1.0 - 2.0 * r.frac))
        c0 += w * float(np.sum(r.frac - (1.0 - 2.0 * r.frac) * r.lo))
    Qm = sp.vstack([r.Q for r in current]).tocsr()
    lo = np.concatenate([r.lo for r in current])
    hi = np.concatenate([r.hi for r in current])
    m = Qm.shape[0]
    names = [f"measured:{r.spec.label}[{i}]" for r in current for i in range(r.Q.shape[0])]
    blocks = [Qm, cons.A]
    lower, upper = [lo, cons.lower], [hi, cons.upper]
    for r in fixed:
        blocks.append(r.Q)
        lower.append(r.lo)
        upper.append(r.hi)
        names += [f"released:{r.spec.label}[{i}]" for i in range(r.Q.shape[0])]
    names = names[:m] + cons.names + names[m:]
    A = sp.vstack(blocks).tocsr()
    row_lower, row_upper = np.concatenate(lower), np.concatenate(upper)
    upper_b = np.ones(k)
    if not soft:
        return ProgramForm(c=cost, A=A, row_lower=row_lower, row_upper=row_upper, row_names=names,
                           lower=np.zeros(k), upper=upper_b, integrality=np.ones(k, bool), c0=c0), m
    # Soft rows: Q b - e+ + e- in [lo, hi]; an excursion costs its true L1 change plus P.
    f = np.concatenate([r.frac for r in current])
    w = np.concatenate([np.full(r.Q.shape[0], r.spec.weight) for r in current])
    penalty = 1.0 + float(np.sum(w * np.abs(1.0 - 2.0 * f))) + cell_weight * float(np.abs(1.0 - 2.0 * table.frac).sum())
    rest = A.shape[0] - m
    E = sp.vstack([sp.identity(m, format="csr"), sp.csr_matrix((rest, m))]).tocsr()
    A_soft = sp.hstack([A, -E, E]).tocsr()
    return ProgramForm(
        c=np.concatenate([cost, w * 2.0 * f + penalty, w * (2.0 - 2.0 * f) + penalty]), A=A_soft,
        row_lower=row_lower, row_upper=row_upper, row_names=names, lower=np.zeros(k + 2 * m),
        upper=np.concatenate([upper_b, np.full(2 * m, np.inf)]),
        integrality=np.concatenate([np.ones(k, bool), np.zeros(2 * m, bool)]), c0=c0,
    ), m
