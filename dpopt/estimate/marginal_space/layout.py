"""Marginals and their residuals, held set by set: never the full table.

The residual decomposition (Xiao, Wang, Ding, Kifer, "An Optimal and Scalable Matrix Mechanism
for Noisy Marginals under Convex Loss Functions", NeurIPS 2023, §4) splits the marginal of any
attribute set ``T`` into orthogonal parts, one per subset ``A ⊆ T``::

    mu_T  =  sum_{A ⊆ T}  r_A ⊗ 1_{T∖A} / n_{T∖A}                                   (1)
    r_A   =  C_A marg_A(x),     C_A = ⊗_{a ∈ A} (I - J/n_a)                          (2)

``marg_A`` sums the table onto ``A``, ``C_A`` centres the result along every axis of ``A``
(``r_∅`` is the total), ``n_B`` is the number of cells of ``B``'s marginal. The residual
``r_A`` depends on the table only, not on the marginal ``T`` it is read from: a family of
marginals written as (1) from one set of residuals is consistent by construction, and any
consistent family has exactly one such set. The parts of (1) are orthogonal in ``R^{n_T}``
with ``||r_A ⊗ 1/n_{T∖A}||² = ||r_A||² / n_{T∖A}``.

:class:`ResidualIndex` stores one centred residual per set of a downward-closed family (every
subset of the marginals considered), in one flat vector. :class:`SetFamily` holds a list of
attribute sets (the released marginals, or the measured ones) in one flat cell vector and
applies

- :meth:`SetFamily.expand`: residuals → the marginals of the family, equation (1);
- :meth:`SetFamily.adjoint`: its transpose, ``v_T ↦ C_A marg_A(v_T) / n_{T∖A}`` summed over
  the sets ``T ⊇ A`` (optionally weighted per set);
- :meth:`SetFamily.diagonal`: ``sum_{T ⊇ A} weight_T / n_{T∖A}``, the diagonal of
  ``adjointᵀ·expand`` (the parts of (1) being orthogonal, that product *is* diagonal).

Sets of the same shape (attribute sizes) are processed together: a batch array per shape, a
gather per subset pattern for :meth:`expand` and one sparse product per subset pattern for
:meth:`adjoint` — no loop over cells, sets or records.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations
from typing import Iterable, Sequence

import numpy as np
import scipy.sparse as sp

from dpopt.errors import DomainError, QueryError
from dpopt.model.domain import Domain

__all__ = ["ResidualIndex", "SetFamily", "downward_closure", "maximal_sets"]


def maximal_sets(sets: Iterable[Sequence[int]]) -> list[tuple[int, ...]]:
    """The sets not contained in another one (sorted tuples, first-seen order, no repeats)."""
    unique = list(dict.fromkeys(tuple(sorted(s)) for s in sets))
    by_size = sorted(unique, key=len, reverse=True)
    kept: list[tuple[int, ...]] = []
    kept_sets: list[frozenset] = []
    # Index the kept sets by attribute so a candidate is only compared with sets sharing its first attribute.
    holders: dict[int, list[int]] = {}
    for s in by_size:
        fs = frozenset(s)
        if s and any(fs <= kept_sets[i] for i in holders.get(s[0], ())):
            continue
        if not s and kept:
            continue
        holders_index = len(kept)
        kept.append(s)
        kept_sets.append(fs)
        for a in s:
            holders.setdefault(a, []).append(holders_index)
    order = {s: i for i, s in enumerate(unique)}
    return sorted(kept, key=order.__getitem__)


def downward_closure(sets: Sequence[Sequence[int]]) -> dict[int, np.ndarray]:
    """Every subset of every set, by size: ``{size: sorted unique rows of axes}`` (size 0 included)."""
    by_size: dict[int, list[np.ndarray]] = {0: [np.zeros((1, 0), dtype=np.int64)]}
    by_arity: dict[int, list[tuple[int, ...]]] = {}
    for s in sets:
        by_arity.setdefault(len(s), []).append(tuple(s))
    for k, rows in by_arity.items():
        arr = np.asarray(rows, dtype=np.int64).reshape(len(rows), k)
        for j in range(1, k + 1):
            for pos in combinations(range(k), j):
                by_size.setdefault(j, []).append(arr[:, list(pos)])
    return {j: np.unique(np.concatenate(parts), axis=0) for j, parts in by_size.items()}


@dataclass
class _ResidualGroup:
    """The residual sets of one shape: ``axes`` (R, j), stored from ``offset`` as (R, *sizes)."""

    sizes: tuple[int, ...]
    axes: np.ndarray
    offset: int
    keys: np.ndarray | None  # sorted integer codes of the rows (None: looked up by tuple)
    lookup: dict | None

    @property
    def cells(self) -> int:
        return math.prod(self.sizes)

    @property
    def length(self) -> int:
        return len(self.axes) * self.cells


class ResidualIndex:
    """One centred residual ``r_A`` per set of the downward closure of ``sets``, in one flat vector.

    Parameters
    ----------
    domain : Domain
    sets : sequence of tuples of int
        Attribute sets as sorted domain axes; the index holds every subset of every set.

    Attributes
    ----------
    size : int
        Length of the flat vector (``sum_A n_A``).
    num_sets : int
        Number of residual sets; each has a position ``0..num_sets-1`` (:meth:`positions`).
    set_offsets, set_cells : ndarray
        Where each residual set starts in the flat vector and how many cells it has.
    """

    def __init__(self, domain: Domain, sets: Sequence[Sequence[int]]) -> None:
        self.domain = domain
        self.sizes = np.asarray(domain.sizes, dtype=np.int64)
        closure = downward_closure(sets)
        groups: dict[tuple[int, ...], list[np.ndarray]] = {}
        for j, rows in closure.items():
            if j == 0:
                groups[()] = [rows]
                continue
            sig = self.sizes[rows]
            sigs, inverse = np.unique(sig, axis=0, return_inverse=True)
            for g, s in enumerate(sigs):
                groups.setdefault(tuple(int(v) for v in s), []).append(rows[inverse.ravel() == g])
        self.groups: dict[tuple[int, ...], _ResidualGroup] = {}
        offset = 0
        set_offsets, set_cells = [], []
        self._first_position: dict[tuple[int, ...], int] = {}
        position = 0
        d = len(domain)
        for sig in sorted(groups, key=lambda s: (len(s), s)):
            axes = np.concatenate(groups[sig]) if len(groups[sig]) > 1 else groups[sig][0]
            keys, lookup = _row_keys(axes, d)
            if keys is not None:
                order = np.argsort(keys, kind="stable")
                axes, keys = axes[order], keys[order]
            group = _ResidualGroup(sig, axes, offset, keys, lookup)
            self.groups[sig] = group
            cells = group.cells
            set_offsets.append(offset + cells * np.arange(len(axes), dtype=np.int64))
            set_cells.append(np.full(len(axes), cells, dtype=np.int64))
            self._first_position[sig] = position
            position += len(axes)
            offset += group.length
        self.size = offset
        self.num_sets = position
        self.set_offsets = np.concatenate(set_offsets)
        self.set_cells = np.concatenate(set_cells)
        self.set_order = np.concatenate([np.full(len(g.axes), len(sig)) for sig, g in self.groups.items()])

    # ---- lookups -----------------------------------------------------------------------
    def rows(self, sig: tuple[int, ...], axes: np.ndarray) -> np.ndarray:
        """Row numbers within group ``sig`` of the sets ``axes`` (each row sorted axes of that shape)."""
        group = self.groups.get(sig)
        if group is None:
            raise QueryError(f"no residual sets of shape {sig} in the index")
        axes = np.asarray(axes, dtype=np.int64)
        if not sig:
            return np.zeros(len(axes), dtype=np.int64)
        axes = axes.reshape(-1, len(sig))
        if group.keys is not None:
            keys, _ = _row_keys(axes, len(self.domain), force=True)
            rows = np.searchsorted(group.keys, keys)
            rows = np.minimum(rows, len(group.keys) - 1)
            if not np.array_equal(group.keys[rows], keys):
                raise QueryError("an attribute set is missing from the residual index")
            return rows
        try:
            return np.array([group.lookup[tuple(r)] for r in axes.tolist()], dtype=np.int64)
        except KeyError:
            raise QueryError("an attribute set is missing from the residual index") from None

    def positions(self, sig: tuple[int, ...], rows: np.ndarray) -> np.ndarray:
        """Global set positions (``0..num_sets-1``) of rows of group ``sig``."""
        return self._first_position[sig] + np.asarray(rows, dtype=np.int64)

    def position_of(self, axes: Sequence[int]) -> int:
        axes = tuple(sorted(int(a) for a in axes))
        sig = tuple(int(self.sizes[a]) for a in axes)
        return int(self.positions(sig, self.rows(sig, np.asarray([axes])))[0])

    def view(self, flat: np.ndarray, sig: tuple[int, ...]) -> np.ndarray:
        """The residuals of group ``sig`` in ``flat`` as an array ``(R, *sizes)`` (a view)."""
        g = self.groups[sig]
        return flat[g.offset:g.offset + g.length].reshape((len(g.axes),) + g.sizes)

    def residual(self, flat: np.ndarray, axes: Sequence[int]) -> np.ndarray:
        """The residual ``r_A`` of one set (sorted axes) as an array over ``A``'s cells."""
        axes = tuple(sorted(int(a) for a in axes))
        sig = tuple(int(self.sizes[a]) for a in axes)
        row = int(self.rows(sig, np.asarray([axes]))[0])
        return self.view(flat, sig)[row]

    def per_set(self, values: np.ndarray) -> np.ndarray:
        """A per-set scalar (length :attr:`num_sets`) repeated over each set's cells (flat layout)."""
        return np.repeat(np.asarray(values, dtype=np.float64), self.set_cells)

    def set_sums(self, flat: np.ndarray) -> np.ndarray:
        """``sum`` of ``flat`` over each set's cells (length :attr:`num_sets`)."""
        return np.add.reduceat(flat, self.set_offsets) if self.size else np.zeros(0)

    def center(self, flat: np.ndarray) -> np.ndarray:
        """``C_A`` applied to every residual (subtract the mean along each axis), as a copy."""
        out = np.array(flat, dtype=np.float64)
        for sig, g in self.groups.items():
            view = self.view(out, sig)
            for axis in range(1, view.ndim):
                view -= view.mean(axis=axis, keepdims=True)
        return out


def _row_keys(axes: np.ndarray, d: int, force: bool = False):
    """Integer codes of rows of axes (mixed radix ``d``) when they fit in int64, else a dict."""
    j = axes.shape[1]
    if j == 0:
        return np.zeros(len(axes), dtype=np.int64), None
    if j * math.log2(max(d, 2)) < 62:
        weights = np.asarray([d ** (j - 1 - i) for i in range(j)], dtype=np.int64)
        return axes @ weights, None
    if force:
        raise AssertionError("unreachable: force is used only with a group that has integer keys")
    return None, {tuple(r): i for i, r in enumerate(axes.tolist())}


# ---- a family of attribute sets held in one flat vector --------------------------------------------
@dataclass
class _Pattern:
    """One subset pattern of a shape group: the positions kept and the residual rows they map to."""

    keep: tuple[int, ...]  # positions (0..k-1) of the subset A within the set
    sig: tuple[int, ...]  # A's sizes (the residual group)
    rows: np.ndarray  # (M,) row of each set's A within the residual group
    scatter: sp.csr_matrix  # (R_sig, M) incidence: adjoint contributions summed per residual row
    rest: float  # n_{T∖A}


@dataclass
class _ShapeGroup:
    sizes: tuple[int, ...]
    axes: np.ndarray  # (M, k)
    members: np.ndarray  # positions of these sets in the family's order
    offset: int
    patterns: list[_Pattern]
    # Small shapes: every pattern's map ``v -> C_A marg_A(v) / n_{T∖A}`` as the columns of one
    # dense matrix (cells x sum of the patterns' cells), so that the adjoint is one product and
    # expand its transpose (None for large shapes: reductions along the axes instead).
    matrix: np.ndarray | None = None
    columns: list[slice] | None = None

    @property
    def cells(self) -> int:
        return math.prod(self.sizes)

    @property
    def length(self) -> int:
        return len(self.axes) * self.cells


class SetFamily:
    """A list of attribute sets (marginals) held in one flat cell vector, with their residual maps.

    Parameters
    ----------
    index : ResidualIndex
        Must hold every subset of every set.
    sets : sequence of tuples of int
        Sorted domain axes of each marginal; repeats are allowed (two measurements of one
        marginal). The flat layout groups sets by shape; :meth:`marginal` and :meth:`pack`
        translate from and to the given order.
    """

    def __init__(self, index: ResidualIndex, sets: Sequence[Sequence[int]]) -> None:
        self.index = index
        self.sets = [tuple(int(a) for a in s) for s in sets]
        sizes = index.sizes
        by_sig: dict[tuple[int, ...], list[int]] = {}
        for i, s in enumerate(self.sets):
            by_sig.setdefault(tuple(int(sizes[a]) for a in s), []).append(i)
        self.groups: list[_ShapeGroup] = []
        self.offsets = np.zeros(len(self.sets), dtype=np.int64)
        self.cells = np.zeros(len(self.sets), dtype=np.int64)
        offset = 0
        for sig in sorted(by_sig, key=lambda s: (len(s), s)):
            members = np.asarray(by_sig[sig], dtype=np.int64)
            k = len(sig)
            axes = np.asarray([self.sets[i] for i in members], dtype=np.int64).reshape(len(members), k)
            patterns = []
            for j in range(k + 1):
                for keep in combinations(range(k), j):
                    psig = tuple(sig[p] for p in keep)
                    rows = index.rows(psig, axes[:, list(keep)])
                    scatter = sp.csr_matrix((np.ones(len(members)), (rows, np.arange(len(members)))),
                                            shape=(len(index.groups[psig].axes), len(members)))
                    rest = float(math.prod(sig[p] for p in range(k) if p not in keep))
                    patterns.append(_Pattern(keep, psig, rows, scatter, rest))
            group = _ShapeGroup(sig, axes, members, offset, patterns)
            _attach_matrix(group)
            self.groups.append(group)
            self.offsets[members] = offset + group.cells * np.arange(len(members), dtype=np.int64)
            self.cells[members] = group.cells
            offset += group.length
        self.size = offset

    # ---- layout ------------------------------------------------------------------------
    def view(self, flat: np.ndarray, group: _ShapeGroup) -> np.ndarray:
        return flat[group.offset:group.offset + group.length].reshape((len(group.axes),) + group.sizes)

    def marginal(self, flat: np.ndarray, i: int) -> np.ndarray:
        """The cells of set ``i`` (given order), flat in C order over its axes."""
        return flat[self.offsets[i]:self.offsets[i] + self.cells[i]]

    def pack(self, values: Sequence[np.ndarray]) -> np.ndarray:
        """One array of cells per set (given order) into the flat layout."""
        out = np.empty(self.size)
        for i, v in enumerate(values):
            v = np.asarray(v, dtype=np.float64).ravel()
            if v.size != self.cells[i]:
                raise QueryError(f"set {i}: {v.size} values for {self.cells[i]} cells")
            out[self.offsets[i]:self.offsets[i] + v.size] = v
        return out

    def per_set(self, values: np.ndarray) -> np.ndarray:
        """A scalar per set (given order) repeated over the set's cells (flat layout)."""
        out = np.empty(self.size)
        values = np.asarray(values, dtype=np.float64)
        for g in self.groups:
            self.view(out, g)[...] = values[g.members].reshape((-1,) + (1,) * len(g.sizes))
        return out

    def set_min(self, flat: np.ndarray) -> np.ndarray:
        """The smallest cell of each set (given order)."""
        out = np.empty(len(self.sets))
        for g in self.groups:
            out[g.members] = self.view(flat, g).reshape(len(g.axes), -1).min(axis=1)
        return out

    # ---- the residual maps ---------------------------------------------------------------
    def expand(self, residuals: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Equation (1): the marginal of every set from the residuals (flat layout)."""
        out = np.zeros(self.size) if out is None else out
        index = self.index
        for g in self.groups:
            target = self.view(out, g)
            if g.matrix is not None:
                gathered = np.concatenate([index.view(residuals, p.sig)[p.rows].reshape(len(g.axes), -1)
                                           for p in g.patterns], axis=1)
                np.matmul(gathered, g.matrix.T, out=target.reshape(len(g.axes), -1))
                continue
            target[...] = 0.0
            k = len(g.sizes)
            for p in g.patterns:
                block = index.view(residuals, p.sig)[p.rows]  # (M, *sizes of A)
                shape = [len(g.axes)] + [g.sizes[q] if q in p.keep else 1 for q in range(k)]
                target += block.reshape(shape) * (1.0 / p.rest)
        return out

    def adjoint(self, cells: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
        """The transpose of :meth:`expand`: ``sum_T w_T C_A marg_A(v_T) / n_{T∖A}`` for every ``A``."""
        index = self.index
        out = np.zeros(index.size)
        for g in self.groups:
            v = self.view(cells, g)
            if weights is not None:
                v = v * np.asarray(weights, dtype=np.float64)[g.members].reshape((-1,) + (1,) * len(g.sizes))
            k = len(g.sizes)
            if g.matrix is not None:
                projected = v.reshape(len(g.axes), -1) @ g.matrix
                for p, cols in zip(g.patterns, g.columns):
                    target = index.view(out, p.sig)
                    target += (p.scatter @ projected[:, cols]).reshape(target.shape)
                continue
            margins = _all_margins(v, k)
            for p in g.patterns:
                m = margins[p.keep]
                for axis in range(1, m.ndim):
                    m = m - m.mean(axis=axis, keepdims=True)
                contribution = p.scatter @ m.reshape(len(g.axes), -1)
                target = index.view(out, p.sig)
                target += (contribution / p.rest).reshape(target.shape)
        return out

    def diagonal(self, weights: np.ndarray | None = None) -> np.ndarray:
        """``sum_{T ⊇ A} w_T / n_{T∖A}`` for every residual set (length ``index.num_sets``)."""
        index = self.index
        out = np.zeros(index.num_sets)
        for g in self.groups:
            w = np.ones(len(g.axes)) if weights is None else np.asarray(weights, dtype=np.float64)[g.members]
            for p in g.patterns:
                pos = index.positions(p.sig, p.rows)
                out += np.bincount(pos, weights=w / p.rest, minlength=index.num_sets)
        return out


#: Shapes whose dense pattern matrix (cells x pattern cells) has at most this many entries use it.
MATRIX_ENTRIES = 2**16


def _attach_matrix(group: _ShapeGroup) -> None:
    """The dense matrix of every pattern's ``C_A marg_A(.) / n_{T∖A}`` for a small shape."""
    cells = group.cells
    widths = [math.prod(group.sizes[q] for q in p.keep) for p in group.patterns]
    if cells * sum(widths) > MATRIX_ENTRIES:
        return
    eye = np.eye(cells).reshape((cells,) + group.sizes)
    margins = _all_margins(eye, len(group.sizes))
    blocks, columns, start = [], [], 0
    for p, width in zip(group.patterns, widths):
        m = margins[p.keep]
        for axis in range(1, m.ndim):
            m = m - m.mean(axis=axis, keepdims=True)
        blocks.append(m.reshape(cells, width) / p.rest)
        columns.append(slice(start, start + width))
        start += width
    group.matrix = np.ascontiguousarray(np.concatenate(blocks, axis=1))
    group.columns = columns


def _all_margins(v: np.ndarray, k: int) -> dict[tuple[int, ...], np.ndarray]:
    """Every marginal of a batch ``(M, n_1, ..., n_k)`` onto subsets of its ``k`` axes, keyed by
    the kept positions, each from its smallest already computed superset (one sum per subset)."""
    full = tuple(range(k))
    out = {full: v}
    for j in range(k - 1, -1, -1):
        for keep in combinations(range(k), j):
            # The superset that adds the first missing position.
            missing = next(q for q in range(k) if q not in keep)
            parent = tuple(sorted(keep + (missing,)))
            out[keep] = out[parent].sum(axis=1 + parent.index(missing))
    return out


def check_sets(domain: Domain, sets: Iterable[Sequence[str]], what: str) -> list[tuple[int, ...]]:
    """Attribute-name sets as sorted axes; a clear error for an unknown attribute or an empty set."""
    out = []
    for i, s in enumerate(sets):
        if isinstance(s, str):
            s = (s,)
        s = tuple(s)
        if not s:
            raise QueryError(f"{what}[{i}] is empty: give at least one attribute")
        try:
            axes = domain.axes(domain.check_attrs(s))
        except DomainError as exc:
            raise QueryError(f"{what}[{i}]: {exc}") from None
        if len(set(axes)) != len(axes):
            raise QueryError(f"{what}[{i}] names an attribute twice: {list(s)}")
        out.append(tuple(sorted(axes)))
    return out
