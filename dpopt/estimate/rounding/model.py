"""What every rounding method shares: the free cells, the floor of the table, the constraint rows.

A rounding keeps the structural zeros by never giving their cells a variable (they are
*pinned* at 0) and writes every other cell as ``x = base + (a change)``, where ``base`` is
the floor of the fractional table (0 where non-negativity forbids a negative floor). The
invariants and inequalities become rows over the free cells with their right-hand sides
shifted by ``A @ base``. Columns are taken with :meth:`LinearQuery.columns`, so no row
ever spans the pinned cells of a large domain (a census domain of 9·10^6 cells has 7·10^4
free ones).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from dpopt.errors import QueryError
from dpopt.model.constraints import ConstraintSet

__all__ = ["RoundingTable", "ConstraintRows", "INTEGRAL_TOL", "integral", "disjoint_counting_rows",
           "looks_totally_unimodular"]

#: A value within this distance of an integer counts as that integer (solver tolerances).
INTEGRAL_TOL = 1e-6


def integral(v: np.ndarray) -> bool:
    """True when every entry of ``v`` is an integer up to :data:`INTEGRAL_TOL`."""
    return bool(np.all(np.abs(v - np.round(v)) <= INTEGRAL_TOL))


@dataclass
class ConstraintRows:
    """Invariant and inequality rows restricted to the free cells, right-hand sides shifted."""

    A: sp.csr_matrix
    lower: np.ndarray
    upper: np.ndarray
    names: list[str]
    num_equalities: int


@dataclass
class RoundingTable:
    """A fractional table split into pinned cells, free cells, their floor and fraction.

    Parameters
    ----------
    x : ndarray, shape (domain.size,)
        The fractional table ``x~``.
    constraints : ConstraintSet
    """

    x: np.ndarray
    constraints: ConstraintSet

    def __post_init__(self) -> None:
        cs = self.constraints
        if not isinstance(cs, ConstraintSet):
            raise QueryError(f"constraints must be a ConstraintSet, got {type(cs).__name__}")
        n = cs.domain.require_dense("integer rounding over the full domain")
        target = np.asarray(self.x, dtype=np.float64)
        if target.shape != (n,) or not np.isfinite(target).all():
            raise QueryError(f"the table to round must be {n} finite values, got shape {target.shape}")
        self.n = n
        self.pinned = cs.zero_mask() if cs.zero_rules else np.zeros(n, dtype=bool)
        self.free = np.flatnonzero(~self.pinned)
        # The integer table can hold nothing on a pinned cell; its targets are read without it.
        self.target = np.where(self.pinned, 0.0, target)
        values = self.target[self.free]
        base = np.floor(values)
        frac = values - base
        self.negative_mass = 0.0
        if cs.nonnegative:
            negative = base < 0
            self.negative_mass = float(-values[negative].sum())
            base[negative], frac[negative] = 0.0, 0.0
        self.base = base
        self.frac = frac
        self.values = values

    @property
    def k(self) -> int:
        """Number of free cells."""
        return int(self.free.size)

    def table(self, free_values: np.ndarray) -> np.ndarray:
        """The full table with ``free_values`` on the free cells and 0 on the pinned ones."""
        out = np.zeros(self.n)
        out[self.free] = free_values
        return out

    def table_values(self, full: np.ndarray) -> np.ndarray:
        """The free cells' entries of a vector over the whole domain."""
        return np.asarray(full, dtype=np.float64)[self.free]

    def columns(self, query) -> sp.csr_matrix:
        """The query's rows over the free cells only."""
        return sp.csr_matrix(query.columns(self.free))

    def rows(self, constraints: ConstraintSet | None = None) -> ConstraintRows:
        """Invariants (equal bounds) then inequalities, over the free cells, shifted by ``A @ base``."""
        cs = self.constraints if constraints is None else constraints
        blocks, lower, upper, names = [], [], [], []
        for c in cs.invariants:
            blocks.append(self.columns(c.query))
            lower.append(c.values)
            upper.append(c.values)
            names += [f"invariant:{c.name}[{i}]" for i in range(c.query.num_rows)]
        num_eq = len(names)
        for c in cs.inequalities:
            blocks.append(self.columns(c.query))
            lower.append(c.lower)
            upper.append(c.upper)
            names += [f"inequality:{c.name}[{i}]" for i in range(c.query.num_rows)]
        if not blocks:
            return ConstraintRows(sp.csr_matrix((0, self.k)), np.zeros(0), np.zeros(0), [], 0)
        A = sp.vstack(blocks).tocsr()
        shift = A @ self.base
        return ConstraintRows(A, np.concatenate(lower) - shift, np.concatenate(upper) - shift, names, num_eq)


def disjoint_counting_rows(A: sp.spmatrix) -> bool:
    """True when ``A`` is a 0/1 matrix whose rows have disjoint supports (a partition of some cells)."""
    A = sp.csc_matrix(A)
    if A.nnz == 0:
        return True
    if not np.all(A.data == 1.0):
        return False
    return bool(np.diff(A.indptr).max() <= 1)


def _laminar_pair(P: sp.csc_matrix, Q: sp.csc_matrix) -> bool:
    """Two partitions (0/1, disjoint rows) whose sets are pairwise nested or disjoint."""
    rp, rq = _row_of_cell(P), _row_of_cell(Q)
    both = (rp >= 0) & (rq >= 0)
    if not both.any():
        return True
    size_p = np.bincount(rp[rp >= 0], minlength=P.shape[0])
    size_q = np.bincount(rq[rq >= 0], minlength=Q.shape[0])
    pairs, counts = np.unique(np.stack([rp[both], rq[both]]), axis=1, return_counts=True)
    return bool(np.all((counts == size_p[pairs[0]]) | (counts == size_q[pairs[1]])))


def _row_of_cell(A: sp.csc_matrix) -> np.ndarray:
    """For a matrix with at most one non-zero per column: the row of each column (-1 if none)."""
    out = np.full(A.shape[1], -1, dtype=np.int64)
    has = np.diff(A.indptr) > 0
    out[has] = A.indices[A.indptr[:-1][has]]
    return out


def looks_totally_unimodular(families: list[sp.spmatrix]) -> bool:
    """Sufficient test for total unimodularity: the rows split into two laminar families.

    Each family is one query's rows and must be a partition of some cells (0/1 entries,
    disjoint rows). Families whose sets are pairwise nested or disjoint (a total, state
    totals, county totals within states) merge into one laminar family. The incidence matrix
    of the union of two laminar families is totally unimodular (Edmonds; see A. Schrijver,
    *Combinatorial Optimization*, 2003), and so is the matrix with identity columns or
    ``[A, A, -A]`` copies appended; an LP over such rows with integer bounds has integral
    vertices. Two plain partitions are the bipartite special case.
    """
    families = [sp.csc_matrix(f) for f in families if f.shape[0]]
    if not all(disjoint_counting_rows(f) for f in families):
        return False
    f = len(families)
    if f <= 2:
        return True
    if f > 16:
        return False
    clash = [[not _laminar_pair(families[i], families[j]) for j in range(f)] for i in range(f)]
    # Two groups with no clash inside either: the clash graph must be bipartite.
    colour = [-1] * f
    for s in range(f):
        if colour[s] >= 0:
            continue
        colour[s], stack = 0, [s]
        while stack:
            i = stack.pop()
            for j in range(f):
                if clash[i][j]:
                    if colour[j] < 0:
                        colour[j] = 1 - colour[i]
                        stack.append(j)
                    elif colour[j] == colour[i]:
                        return False
    return True
