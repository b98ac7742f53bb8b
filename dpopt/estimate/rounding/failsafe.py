"""The failsafe: when no integer table meets the invariants, relax them as little as possible.

TopDown's failsafe (Abowd et al. 2022) relaxes "parent = sum of children" with the smallest
L1 slack when a level is infeasible. Here: the invariant rows named in ``relax`` (all by
default) get slack variables ``s = s⁺ − s⁻``,

    minimise  Σ_r w_r |s_r|    subject to   A x + s = b (relaxable rows),  every other row exact,
                                            x integer, structural zeros, non-negativity

(stage 1), then, among the tables with that least slack, the one closest to ``x~`` in L1
per cell (stage 2). The relaxed values ``A x`` replace the invariants' values and the
requested rounding runs on them. Every relaxed row is reported with its declared value, its
released value and the slack; nothing is relaxed silently.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np
import pandas as pd
import scipy.sparse as sp

from dpopt.errors import QueryError
from dpopt.estimate.backends.base import Backend
from dpopt.estimate.form import ProgramForm
from dpopt.estimate.rounding.model import RoundingTable
from dpopt.estimate.rounding.solve import Deadline, IntegerSolve, solve_integer_program
from dpopt.model.constraints import ConstraintSet, Invariant

__all__ = ["relax_invariants", "fractional_invariant_rows"]


def fractional_invariant_rows(constraints: ConstraintSet) -> list[str]:
    """Invariant rows of integer queries whose declared value is not an integer (no integer table)."""
    out = []
    for c in constraints.invariants:
        if c.query.is_integer:
            bad = np.flatnonzero(np.abs(c.values - np.round(c.values)) > 1e-9 * np.maximum(1.0, np.abs(c.values)))
            out += [f"{c.name}[{i}]" for i in bad[:5]]
    return out


def relax_invariants(
    table: RoundingTable,
    engine: Backend,
    deadline: Deadline,
    *,
    relax: Iterable[str] | None,
    slack_weights: Mapping[str, float] | None,
    options: dict,
) -> tuple[ConstraintSet | None, pd.DataFrame, IntegerSolve]:
    """The constraint set with the least-slack relaxed invariant values (see the module notes).

    Returns ``(relaxed constraints or None, one row per relaxed invariant row, last solve)``.
    """
    cs = table.constraints
    names = [c.name for c in cs.invariants]
    relaxable = set(names if relax is None else relax)
    unknown = relaxable - set(names)
    if unknown:
        raise QueryError(f"failsafe: no invariant named {sorted(unknown)}; invariants: {names}")
    weights = dict(slack_weights or {})
    for name, w in weights.items():
        if name not in names or not (np.isfinite(w) and w > 0):
            raise QueryError(f"failsafe: slack weight {name!r}={w!r} must name an invariant and be positive")
    k = table.k
    blocks, lower, upper, slack_rows, slack_cost = [], [], [], [], []
    for c in cs.invariants + cs.inequalities:
        Q = table.columns(c.query)
        shift = Q @ table.base
        blocks.append(Q)
        is_invariant = isinstance(c, Invariant)
        lower.append((c.values if is_invariant else c.lower) - shift)
        upper.append((c.values if is_invariant else c.upper) - shift)
        relaxed_here = is_invariant and c.name in relaxable
        slack_rows.append(np.full(Q.shape[0], relaxed_here))
        if relaxed_here:
            slack_cost.append(np.full(Q.shape[0], float(weights.get(c.name, 1.0))))
    A = sp.vstack(blocks).tocsr()
    S = sp.identity(A.shape[0], format="csc")[:, np.flatnonzero(np.concatenate(slack_rows))]
    m_s = S.shape[1]
    w_s = np.concatenate(slack_cost) if slack_cost else np.zeros(0)
    c_upper = table.base.copy() if table.constraints.nonnegative else np.full(k, np.inf)
    lift = sp.hstack([A, A, -A, S, -S]).tocsr()
    row_lower, row_upper = np.concatenate(lower), np.concatenate(upper)
    bounds_hi = np.concatenate([np.ones(k), np.full(k, np.inf), c_upper, np.full(2 * m_s, np.inf)])
    integrality = np.concatenate([np.ones(3 * k, bool), np.zeros(2 * m_s, bool)])
    row_names = [f"row[{i}]" for i in range(A.shape[0])]
    cell_cost = np.concatenate([1.0 - 2.0 * table.frac, np.ones(k), np.ones(k)])
    # Stage 1: the least weighted slack.
    form1 = ProgramForm(c=np.concatenate([np.zeros(3 * k), w_s, w_s]), A=lift, row_lower=row_lower,
                        row_upper=row_upper, row_names=row_names, lower=np.zeros(3 * k + 2 * m_s),
                        upper=bounds_hi, integrality=integrality)
    first = solve_integer_program(form1, engine, deadline=deadline, mip_gap=1e-9, options=options)
    if first.x is None or not first.success:
        return None, pd.DataFrame(), first
    least = float(first.objective)
    # Stage 2: closest to x~ per cell among the least-slack tables.
    budget_row = sp.csr_matrix(np.concatenate([np.zeros(3 * k), w_s, w_s])[None, :])
    form2 = ProgramForm(c=np.concatenate([cell_cost, np.zeros(2 * m_s)]), A=sp.vstack([lift, budget_row]).tocsr(),
                        row_lower=np.concatenate([row_lower, [-np.inf]]),
                        row_upper=np.concatenate([row_upper, [least + 1e-7 * max(1.0, least)]]),
                        row_names=row_names + ["least slack"], lower=np.zeros(3 * k + 2 * m_s), upper=bounds_hi,
                        integrality=integrality, c0=float(table.frac.sum()) + table.negative_mass)
    second = solve_integer_program(form2, engine, deadline=deadline, mip_gap=1e-9, options=options)
    solve = second if second.x is not None else first
    v = solve.x
    x_free = table.base + v[:k] + v[k:2 * k] - v[2 * k:3 * k]
    x = table.table(x_free)
    relaxed = ConstraintSet(cs.domain)
    records = []
    for c in cs.constraints:
        if isinstance(c, Invariant) and c.name in relaxable:
            released = np.round(c.query.matvec(x))
            moved = np.flatnonzero(np.abs(released - c.values) > 1e-9)
            records += [{"constraint": f"invariant:{c.name}", "row": int(i), "declared": float(c.values[i]),
                         "released": float(released[i]), "slack": float(released[i] - c.values[i]),
                         "weight": float(weights.get(c.name, 1.0))} for i in moved]
            c = Invariant(c.query, released, name=c.name, from_data=c.from_data)
        relaxed.add(c)
    return relaxed, pd.DataFrame(records, columns=["constraint", "row", "declared", "released", "slack", "weight"]), solve
