"""Answers first: the best consistent integer marginals, then a table that has them.

The objective of controlled rounding on a product-domain table whose measured queries are all
marginals depends on the table only through its marginals. A table's marginals are *consistent*
(any two agree on the marginal over their common attributes), and integer when the table is; so

    minimise    Σ_k w_k ‖z_k − t_k‖₁
    subject to  z_k integer,  0 <= z_k <= cells per row          (answers relative to the floor table)
                M_{F→F∩G} z_F = M_{G→F∩G} z_G                   for every two families F, G
                z_F = invariant values                          for the invariant families

is a relaxation of the rounding program with one variable per *answer* (480 on all 2-way
marginals of 16 binary attributes, against 65,536 cells). Its optimum is a lower bound on every
integer table's query error, and it is small enough for an exact MIP (HiGHS solves nltcs's to
optimality; its bound came within 0.03 % of the LP relaxation over all 65,536 cells). Consistent
marginals are those of some real (signed) table: the counts of the value combinations that avoid
a reference level of each attribute, over every subset of a family's attributes (the Möbius or
"corner" parameters, ``rank(A)`` of them), determine every answer and may take any values; so
the answers ``z`` are reached by moving the fractional
part ``y = frac(x~)``: :func:`move_to_answers` solves ``A_S D A_Sᵀ λ = z − A y`` over a sample
``S`` of interior cells with ``D = diag(y(1 − y))`` (a weighted least-norm step that stays in
``[0, 1]`` when ``|A_Sᵀ λ| <= 1``), after which the support walk keeps ``A y = z`` exactly while
it makes cells integral. What is left is a few hundred fractional cells whose rounding moves
some answers by a unit or two, which the local search repairs.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from dpopt.estimate.form import ProgramForm
from dpopt.estimate.rounding.solve import Deadline, IntegerSolve, solve_integer_program

__all__ = ["AnswerFamily", "integer_answers", "move_to_answers"]

#: Cells of the sample over which each correction step of :func:`move_to_answers` is solved, per
#: answer (at least :data:`SAMPLE_MIN`); the sample's columns must span the rows' range.
SAMPLE_PER_ANSWER = 8
SAMPLE_MIN = 4000
#: Correction steps before :func:`move_to_answers` gives up (a step is cut short at a cell bound).
CORRECTION_STEPS = 8
#: Row residual at which a correction counts as exact (the walk then keeps the rows to ~1e-12).
ROW_TOL = 1e-7


@dataclass(frozen=True)
class AnswerFamily:
    """One family of rows of the rounding program, relative to the floor table.

    ``axes``: the marginal's domain axes (sorted; ``()`` for the total). ``target``: the
    fractional answers to approach (measured families) or None; ``fixed``: the values an
    invariant family must take, or None. ``cap``: free cells per row.
    """

    axes: tuple[int, ...]
    target: np.ndarray | None
    weight: float
    fixed: np.ndarray | None
    cap: float


def _to_subset(axes: tuple[int, ...], sub: tuple[int, ...], sizes: np.ndarray) -> sp.csr_matrix:
    """The 0/1 matrix that sums a marginal over ``axes`` (C order) into its marginal over ``sub``."""
    shape = tuple(int(sizes[a]) for a in axes)
    n = int(np.prod(shape, dtype=np.int64))
    codes = np.unravel_index(np.arange(n), shape) if axes else ()
    pos = [axes.index(a) for a in sub]
    rows = np.ravel_multi_index([codes[p] for p in pos], [shape[p] for p in pos]) if sub else np.zeros(n, np.int64)
    m = int(np.prod([shape[p] for p in pos], dtype=np.int64))
    return sp.csr_matrix((np.ones(n), (rows, np.arange(n))), shape=(m, n))


def answer_program(families: list[AnswerFamily], sizes) -> tuple[ProgramForm, list[slice]]:
    """The MIP of the module notes and, per family, the slice of its answer variables.

    Variables: every family's answers ``z`` (integer), then one excursion ``e >= |z − t|`` per
    measured answer (continuous). Rows: the two sides of each excursion, then the consistency
    equalities, chained over the families that contain each pairwise intersection.
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    slices, start = [], 0
    for f in families:
        n = int(np.prod(sizes[list(f.axes)], dtype=np.int64)) if f.axes else 1
        slices.append(slice(start, start + n))
        start += n
    nz = start
    measured = [i for i, f in enumerate(families) if f.target is not None]
    e_slices, e_start = {}, nz
    for i in measured:
        n = slices[i].stop - slices[i].start
        e_slices[i] = slice(e_start, e_start + n)
        e_start += n
    nv = e_start
    blocks, lower, upper = [], [], []

    def row_block(parts: list[tuple[slice, sp.spmatrix]], lo, hi):
        m = parts[0][1].shape[0]
        coo = [sp.coo_matrix(mat) for _, mat in parts]
        rows = np.concatenate([c.row for c in coo])
        cols = np.concatenate([c.col + sl.start for (sl, _), c in zip(parts, coo)])
        blocks.append(sp.csr_matrix((np.concatenate([c.data for c in coo]), (rows, cols)), shape=(m, nv)))
        lower.append(np.broadcast_to(lo, m).astype(float))
        upper.append(np.broadcast_to(hi, m).astype(float))

    for i in measured:
        f, n = families[i], slices[i].stop - slices[i].start
        eye = sp.identity(n, format="csr")
        row_block([(e_slices[i], eye), (slices[i], -eye)], -f.target, np.inf)  # e − z >= −t
        row_block([(e_slices[i], eye), (slices[i], eye)], f.target, np.inf)    # e + z >= t
    subsets = sorted({tuple(a for a in f.axes if a in g.axes)
                      for f, g in itertools.combinations(families, 2)}, key=lambda u: (len(u), u))
    cache: dict = {}

    def to_subset(axes, sub):
        if (axes, sub) not in cache:
            cache[axes, sub] = _to_subset(axes, sub, sizes)
        return cache[axes, sub]

    for sub in subsets:
        holders = [i for i, f in enumerate(families) if set(sub) <= set(f.axes)]
        for i, j in zip(holders, holders[1:]):
            row_block([(slices[i], to_subset(families[i].axes, sub)), (slices[j], -to_subset(families[j].axes, sub))],
                      0.0, 0.0)
    A = sp.vstack(blocks).tocsr() if blocks else sp.csr_matrix((0, nv))
    lo_var, hi_var = np.zeros(nv), np.full(nv, np.inf)
    c = np.zeros(nv)
    for i, f in enumerate(families):
        if f.fixed is not None:
            lo_var[slices[i]] = hi_var[slices[i]] = f.fixed
        else:
            hi_var[slices[i]] = f.cap
    for i in measured:
        c[e_slices[i]] = families[i].weight
    integrality = np.zeros(nv, bool)
    integrality[:nz] = True
    form = ProgramForm(c=c, A=A, row_lower=np.concatenate(lower) if lower else np.zeros(0),
                       row_upper=np.concatenate(upper) if upper else np.zeros(0),
                       row_names=[f"answers[{i}]" for i in range(A.shape[0])], lower=lo_var, upper=hi_var,
                       integrality=integrality, c0=0.0)
    return form, slices


def integer_answers(families: list[AnswerFamily], sizes, engine, deadline: Deadline, mip_gap: float,
                    options: dict) -> tuple[list[np.ndarray] | None, IntegerSolve]:
    """The least-L1 consistent integer answers (see the module notes) and the solve that found them.

    Returns ``(answers per family, or None when no point was found; the solve)``; the solve's
    ``bound`` bounds every integer table's weighted query error from below.
    """
    form, slices = answer_program(families, sizes)
    solve = solve_integer_program(form, engine, deadline=deadline, mip_gap=mip_gap, options=options)
    if solve.x is None:
        return None, solve
    z = np.round(solve.x)
    return [z[s] for s in slices], solve


def move_to_answers(y: np.ndarray, row_values, columns, goal: np.ndarray, *, deadline: Deadline | None = None,
                    sample: int | None = None) -> np.ndarray | None:
    """Move ``y`` (in [0, 1]) to a point with ``A y = goal``, or None if the steps do not get there.

    Each step solves ``(A_S D A_Sᵀ) λ = goal − A y`` over a sample ``S`` of the cells farthest
    from their bounds, ``D = diag(y_S (1 − y_S))``, and moves ``y_S`` by ``D A_Sᵀ λ`` (cut short
    where a cell would leave [0, 1]).

    Parameters
    ----------
    y : ndarray
        The starting point.
    row_values : callable
        ``row_values(v) -> A v`` for a vector over every cell.
    columns : callable
        ``columns(cells) -> A[:, cells]`` (sparse).
    goal : ndarray
        The row values to reach (in the range of ``A``).
    """
    y = np.array(y, dtype=np.float64)
    m = goal.size
    size = max(SAMPLE_MIN, SAMPLE_PER_ANSWER * m) if sample is None else sample
    last = np.inf
    res = goal - row_values(y)
    for _ in range(CORRECTION_STEPS):
        worst = float(np.abs(res).max(initial=0.0))
        if worst <= ROW_TOL:
            break
        if worst > 0.9 * last or (deadline is not None and deadline.expired()):
            return None  # no room to move (cells at their bounds): the steps no longer get closer
        last = worst
        room = np.minimum(y, 1.0 - y)
        cells = np.flatnonzero(room > 1e-6)
        if cells.size > size:
            cells = cells[np.argpartition(-room[cells], size - 1)[:size]]
        if cells.size == 0:
            return None
        A_S = sp.csr_matrix(columns(cells))
        D = y[cells] * (1.0 - y[cells])
        G = (A_S @ sp.diags(D) @ A_S.T).toarray()
        lam = np.linalg.lstsq(G, res, rcond=1e-10)[0]
        d = D * (A_S.T @ lam)
        with np.errstate(divide="ignore", invalid="ignore"):
            limit = np.where(d > 0, (1.0 - y[cells]) / d, np.where(d < 0, -y[cells] / d, np.inf))
        t = min(1.0, float(limit.min(initial=np.inf)))
        if t < 1.0:
            t *= 0.95  # stay inside, so that the next step still has room on every sampled cell
        new = np.clip(y[cells] + t * d, 0.0, 1.0)
        res = res - A_S @ (new - y[cells])  # only the sampled cells moved
        y[cells] = new
    # The exact check (the updates above accumulate rounding error).
    res = goal - row_values(y)
    return y if np.abs(res).max(initial=0.0) <= ROW_TOL else None
