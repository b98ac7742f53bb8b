"""Unbiased randomised rounding that keeps nested totals exactly: systematic sampling.

Put the free cells in an order where the cells of every invariant row are consecutive and
every row starts after whole rows only (a depth-first post-order of the laminar family of
rows: a total, state totals, county totals within states, ...), with a random order inside
the smallest rows. With one uniform ``u`` and the
running sum ``F_j`` of the fractions ``frac(x~)``, cell ``j`` goes up when an integer lies in
``(F_{j-1} + u, F_j + u]``:

    x_j = ⌊x~_j⌋ + ⌊F_j + u⌋ − ⌊F_{j−1} + u⌋.

Each cell gets its floor or ceiling and ``P(up) = frac_j``, so ``E[x] = x~`` exactly (the
sampling design of Madow 1949, "systematic sampling"); a row whose cells are consecutive and
whose fractions sum to an integer gets exactly that integer, for every ``u``. Fractions are
handled on an integer grid of ``2^-32`` so the running sums are exact.

Layering: ``dpopt.estimate`` never draws random numbers. The caller passes ``uniforms``, an
array of ``domain.size + 1`` independent uniforms on [0, 1) (``uniforms[0]`` is ``u``, the
rest order the cells inside the smallest rows), drawn for example with
``dpopt.privacy.randomness.make_random().random(domain.size + 1)`` or any generator: this
randomness is post-processing and costs no privacy, but a seeded generator makes the rounding
reproducible, which is the caller's choice to make and to record.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from dpopt.errors import QueryError
from dpopt.estimate.rounding.model import RoundingTable, disjoint_counting_rows
from dpopt.estimate.rounding.solve import IntegerSolve
from dpopt.estimate.status import Status

__all__ = ["round_randomized", "GRID_BITS"]

#: Fractions live on a grid of 2^-GRID_BITS (bias at most 2^-GRID_BITS per cell).
GRID_BITS = 32
_ONE = 1 << GRID_BITS
#: An invariant row whose fractions miss an integer by more than this is not met by x~.
_ROW_TOL = 1e-6


def round_randomized(table: RoundingTable, uniforms: np.ndarray) -> tuple[np.ndarray | None, IntegerSolve, dict]:
    """Systematic-sampling rounding of the free cells (see the module notes)."""
    cs = table.constraints
    if cs.inequalities:
        raise QueryError("randomized rounding keeps invariants but not inequalities "
                         f"({[c.name for c in cs.inequalities]}); use method='controlled' or 'cellwise'")
    u = np.asarray(uniforms, dtype=np.float64)
    if u.shape != (table.n + 1,) or not np.all((u >= 0) & (u < 1)):
        raise QueryError(f"uniforms must be {table.n + 1} values in [0, 1) (one offset and one order key per cell), "
                         f"got shape {u.shape}")
    sets = []  # (name, row, cells, target) for every invariant row
    for inv in cs.invariants:
        A = sp.csr_matrix(table.columns(inv.query))
        if not disjoint_counting_rows(A):
            raise QueryError(f"randomized rounding keeps invariants made of disjoint counting rows; {inv.name!r} is not "
                             "(use method='controlled')")
        for r in range(A.shape[0]):
            cells = A.indices[A.indptr[r]:A.indptr[r + 1]]
            if cells.size:
                sets.append((inv.name, r, cells, float(inv.values[r])))
    smallest, parent = _laminar_forest(table.k, sets)
    order, postorder = _depth_first_order(smallest, parent, u[1:][table.free])
    frac_int = np.round(table.frac * _ONE).astype(np.int64)
    _make_rows_exact(table, frac_int, sets, smallest, np.argsort(postorder))
    running = np.concatenate([[0], np.cumsum(frac_int[order])])
    offset = np.int64(np.floor(u[0] * _ONE))
    up_sorted = np.diff((running + offset) // _ONE)
    up = np.zeros(table.k, dtype=np.int64)
    up[order] = up_sorted
    message = "systematic sampling along a depth-first order of the invariant rows (unbiased)"
    return table.base + up, IntegerSolve(Status.OPTIMAL, None, None, None, message, backend="numpy",
                                         solver="numpy", step="systematic sampling"), {
        "method": "randomized: systematic sampling (E[x] = x~)", "invariant_rows_kept": len(sets)}


def _laminar_forest(k: int, sets) -> tuple[np.ndarray, np.ndarray]:
    """Smallest row containing each cell (-1: none) and each row's parent row (-1: a root)."""
    smallest = np.full(k, -1, dtype=np.int64)
    parent = np.full(len(sets), -1, dtype=np.int64)
    for s in sorted(range(len(sets)), key=lambda i: -sets[i][2].size):
        cells = sets[s][2]
        holders = np.unique(smallest[cells])
        if holders.size > 1:
            raise QueryError(
                f"randomized rounding needs nested invariant rows; {sets[s][0]!r} row {sets[s][1]} crosses other rows "
                "(use method='controlled')"
            )
        parent[s] = holders[0]
        if parent[s] >= 0 and sets[parent[s]][2].size == cells.size:
            # The same cells twice (e.g. a total and a one-row marginal): one must equal the other.
            if abs(sets[parent[s]][3] - sets[s][3]) > _ROW_TOL:
                raise QueryError(f"invariants {sets[parent[s]][0]!r} and {sets[s][0]!r} give the same cells different totals")
        smallest[cells] = s
    return smallest, parent


def _depth_first_order(smallest: np.ndarray, parent: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cells in an order where every row's cells are consecutive, and the rows' post-order ranks.

    A row's block is its sub-rows' blocks, then its own cells; cells in no row come last. So
    every block starts where the fractions before it sum to an integer (the blocks before it
    are whole rows), which is what keeps each row's total exact. Inside the smallest rows the
    cells follow the random ``keys``.
    """
    m = parent.size
    children = [[] for _ in range(m)]
    roots = []
    for s in range(m):
        (children[parent[s]] if parent[s] >= 0 else roots).append(s)
    postorder = np.zeros(m, dtype=np.int64)
    t = 0
    stack = [(s, False) for s in reversed(roots)]
    while stack:
        s, expanded = stack.pop()
        if expanded:
            postorder[s] = t
            t += 1
        else:
            stack.append((s, True))
            stack.extend((c, False) for c in reversed(children[s]))
    rank = np.where(smallest >= 0, postorder[np.maximum(smallest, 0)], m)
    return np.lexsort((keys, rank)), postorder


def _make_rows_exact(table: RoundingTable, frac_int: np.ndarray, sets, smallest, bottom_up) -> None:
    """Move the grid's rounding residue so that each row's fractions sum to exactly its integer need."""
    for s in bottom_up:  # post-order: every sub-row before the row that holds it
        name, r, cells, target = sets[s]
        need = target - float(table.base[cells].sum())
        if abs(need - round(need)) > _ROW_TOL * max(1.0, abs(need)) or abs(table.frac[cells].sum() - need) > _ROW_TOL * max(1.0, cells.size):
            raise QueryError(f"randomized rounding needs x~ to meet invariant {name!r} (row {r}) with an integer value; "
                             "round a table that satisfies the invariants, or use method='controlled'")
        residue = int(round(need)) * _ONE - int(frac_int[cells].sum())
        own = cells[smallest[cells] == s]  # cells directly in this row (sub-rows are already exact)
        if residue and own.size == 0:
            raise QueryError(f"invariant {name!r} row {r} is not the sum of the rows inside it")
        while residue:
            room = (_ONE - frac_int[own]) if residue > 0 else frac_int[own]
            i = own[int(np.argmax(room))]
            step = int(np.sign(residue)) * min(abs(residue), int(room.max()))
            if step == 0:
                raise QueryError(f"invariant {name!r} row {r} cannot be met by floors and ceilings")
            frac_int[i] += step
            residue -= step
