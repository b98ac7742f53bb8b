"""Marginals and their residuals, held set by set: never the full table.

The residual decomposition (Xiao, He, Zhang, Kifer, "An Optimal and Scalable Matrix Mechanism
for Noisy Marginals under Convex Loss Functions", NeurIPS 2023) splits the marginal of any
attribute set ``T`` into orthogonal parts, one per subset ``A ⊆ T``::

    mu_T  =  sum_{A ⊆ T}  (Q_A^T c_A) ⊗ 1_{T∖A} / n_{T∖A}                               (1)
    c_A   =  Q_A marg_A(x),          Q_A = ⊗_{a ∈ A} Q_a                                  (2)

``marg_A`` sums the table onto ``A`` (``c_∅`` is the total), ``n_B`` is the number of cells of
``B``'s marginal and ``Q_a`` is the ``(n_a - 1) x n_a`` orthonormal Helmert contrast matrix
(row ``i``: ``(1, ..., 1, -i, 0, ..., 0) / sqrt(i (i + 1))`` with ``i`` ones), orthogonal to the
constant vector. The *residual* ``c_A`` (``prod_{a ∈ A} (n_a - 1)`` numbers) depends on the
table only, not on the marginal ``T`` it is read from: a family of marginals written as (1)
from one set of residuals is consistent by construction, and any consistent family has exactly
one such set. The parts of (1) are orthogonal, with ``||(Q_A^T c) ⊗ 1/n_{T∖A}||² = ||c||² /
n_{T∖A}``.

Per marginal, (1) is one tensor transform: put every ``c_A`` (``A ⊆ T``) into a tensor ``G`` of
the marginal's shape (``c_A`` at the indices that are ``>= 1`` exactly on the axes of ``A``) and
apply ``U_a = [1/n_a, Q_a^T]`` along every axis; each ``U_a`` costs ``O(n_a)`` per fibre through
cumulative sums (Helmert's structure).

:class:`ResidualIndex` stores the residuals of a downward-closed family of sets (every subset of
the marginals considered) in one flat vector. :class:`SetFamily` holds a list of attribute sets
in one flat cell vector, with the index map of every marginal's tensor ``G`` into the residual
vector, and applies

- :meth:`SetFamily.expand`: residuals → the marginals of the family, equation (1): a gather and
  the transforms;
- :meth:`SetFamily.adjoint`: its transpose, ``v_T ↦ Q_A marg_A(v_T) / n_{T∖A}`` summed over the
  sets ``T ⊇ A`` (optionally weighted per set): the transposed transforms and a ``bincount``;
- :meth:`SetFamily.diagonal`: ``sum_{T ⊇ A} weight_T / n_{T∖A}``, the diagonal of
  ``adjoint·expand`` (which *is* diagonal: the parts of (1) are orthogonal).

Sets of one shape are processed as one batch; small shapes use the dense Kronecker product of
their ``U_a`` (one matrix product). No loop over cells, sets or records.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from itertools import combinations
from typing import Iterable, Sequence

import numpy as np
from scipy import sparse

from dpopt.errors import DomainError, QueryError
from dpopt.model.domain import Domain
from dpopt.workers import in_threads, split_range, worker_threads

__all__ = ["ResidualIndex", "SetFamily", "downward_closure", "maximal_sets", "is_decomposable", "contrast",
           "check_sets"]

#: Shapes with at most this many cells transform through a dense Kronecker matrix.
DENSE_TRANSFORM_CELLS = 256
#: Families of at least this many cells split :meth:`SetFamily.expand` and :meth:`SetFamily.adjoint`
#: over :func:`~dpopt.workers.worker_threads` threads (``DPOPT_THREADS``; numpy releases the GIL in
#: their gathers, products and sums); below it a thread's start (tens of microseconds) is a visible
#: share of a product.
THREAD_CELLS = 2**18


# ---- the per-axis transforms ---------------------------------------------------------------------
def _scales(n: int) -> np.ndarray:
    i = np.arange(1, n, dtype=np.float64)
    return 1.0 / np.sqrt(i * (i + 1.0))


#: Axes up to this size are transformed by a dense ``n x n`` product, and larger ones too while the
#: product costs at most :data:`DENSE_AXIS_WORK` multiply-adds, or while ``n < 2 DENSE_AXIS`` and the
#: product is efficient (:func:`_dense_axis`); otherwise through cumulative sums (``O(n)`` per fibre,
#: but several passes over the array). Measured per entry (a synthesis and an analysis, one core,
#: ns): n = 64: dense 32 against 49 with 2 entries after the axis, 9 against 21 with 32; n = 100:
#: 54 against 49 with 2 after, 27 against 32 with 4, 11 against 14 along the last axis; n = 200:
#: cumulative sums win from 16 after. On all 364 triples of adult one product fell from 1.07 to
#: 0.73 CPU-s with the 2-D product below (the cumulative sums had been 0.78 of it).
DENSE_AXIS = 64
DENSE_AXIS_WORK = 2**24


def _dense_axis(f: np.ndarray) -> bool:
    """Whether the fibres ``f`` (``before, n, after``) take the dense product (:data:`DENSE_AXIS`)."""
    n, after = f.shape[1], f.shape[2]
    return n <= DENSE_AXIS or f.size * n <= DENSE_AXIS_WORK or (n < 2 * DENSE_AXIS and (after == 1 or 32 * after >= n))


@functools.lru_cache(maxsize=None)
def _axis_matrix(n: int) -> np.ndarray:
    """``U_a`` (n x n): column 0 is ``1/n``, column ``i`` the ``i``-th Helmert contrast."""
    u = np.zeros((n, n))
    u[:, 0] = 1.0 / n
    s = _scales(n)
    for i in range(1, n):
        u[:i, i] = s[i - 1]
        u[i, i] = -i * s[i - 1]
    return u


def _axis_product(matrix: np.ndarray, f: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``matrix @ f`` for fibres ``f`` of shape ``(before, n, after)``. Along the last axis
    (``after == 1``) it is one 2-D product ``f (before x n) @ matrix^T``: numpy's batched product
    would make ``before`` matrix-vector products, about twice as slow for the 99- and 100-value
    axes of adult's triples."""
    if f.shape[2] != 1:
        return np.matmul(matrix, f, out=out)
    out = np.empty(f.shape) if out is None else out
    target = out.view()
    target.shape = out.shape[:2]  # raises rather than write into a copy
    np.matmul(f.reshape(f.shape[:2]), matrix.T, out=target)
    return out


def _fibres(x: np.ndarray, axis: int) -> np.ndarray:
    """``x`` as ``(before, n, after)`` around ``axis`` (a view when ``x`` is contiguous)."""
    shape = x.shape
    return np.ascontiguousarray(x).reshape(math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:]))


def synthesize_axis(g: np.ndarray, axis: int) -> np.ndarray:
    """``U_a`` along ``axis``: entry 0 is the constant part (times ``1/n``), entries ``1..n-1`` the
    Helmert coefficients. ``v_j = g_0 / n + sum_{i > j} s_i g_i - j s_j g_j``."""
    f = _fibres(g, axis)
    n = f.shape[1]
    if _dense_axis(f):
        return _axis_product(_axis_matrix(n), f).reshape(g.shape)
    e = np.zeros_like(f)
    e[:, 1:, :] = f[:, 1:, :] * _scales(n)[None, :, None]
    tail = np.flip(np.cumsum(np.flip(e, 1), axis=1), 1)  # sum_{i >= j} e_i
    out = f[:, :1, :] / n + tail - (1.0 + np.arange(n))[None, :, None] * e
    return out.reshape(g.shape)


def analyse_axis(v: np.ndarray, axis: int) -> np.ndarray:
    """``U_a^T`` along ``axis``: entry 0 is ``sum / n``, entry ``i >= 1`` is
    ``s_i (sum_{j < i} v_j - i v_i)`` (the Helmert contrasts)."""
    f = _fibres(v, axis)
    n = f.shape[1]
    if _dense_axis(f):
        return _axis_product(_axis_matrix(n).T, f).reshape(v.shape)
    out = np.empty_like(f)
    out[:, 0, :] = f.sum(axis=1) / n
    head = np.cumsum(f, axis=1)[:, :-1, :]  # sum_{j < i} v_j for i = 1..n-1
    out[:, 1:, :] = (head - np.arange(1, n)[None, :, None] * f[:, 1:, :]) * _scales(n)[None, :, None]
    return out.reshape(v.shape)


def _synthesize_into(g: np.ndarray, axis: int, out: np.ndarray) -> None:
    """:func:`synthesize_axis` of the contiguous ``g`` into the contiguous ``out`` (same shape),
    bit for bit: the same operations in the same order, on preallocated memory. ``g`` is
    overwritten (it holds the cumulative-sum path's temporary)."""
    f, o = _fibres(g, axis), _fibres(out, axis)
    n = f.shape[1]
    if _dense_axis(f):
        _axis_product(_axis_matrix(n), f, out=o)
        return
    head = f[:, :1, :] / n
    np.multiply(f[:, 1:, :], _scales(n)[None, :, None], out=f[:, 1:, :])  # f is now e
    f[:, 0, :] = 0.0
    np.cumsum(f[:, ::-1, :], axis=1, out=o[:, ::-1, :])  # the tail sums, written reversed
    np.add(head, o, out=o)
    np.multiply((1.0 + np.arange(n))[None, :, None], f, out=f)
    np.subtract(o, f, out=o)


def _analyse_into(v: np.ndarray, axis: int, out: np.ndarray, scratch: np.ndarray) -> None:
    """:func:`analyse_axis` of the contiguous ``v`` into the contiguous ``out`` (same shape), bit
    for bit, with ``scratch`` (at least ``v.size`` entries) for its one temporary; ``v`` is kept."""
    f, o = _fibres(v, axis), _fibres(out, axis)
    n = f.shape[1]
    if _dense_axis(f):
        _axis_product(_axis_matrix(n).T, f, out=o)
        return
    o[:, 0, :] = f.sum(axis=1) / n
    np.cumsum(f[:, :-1, :], axis=1, out=o[:, 1:, :])  # sum_{j < i} v_j for i = 1..n-1
    t = scratch[:f.shape[0] * (n - 1) * f.shape[2]].reshape(f.shape[0], n - 1, f.shape[2])
    np.multiply(np.arange(1, n)[None, :, None], f[:, 1:, :], out=t)
    np.subtract(o[:, 1:, :], t, out=o[:, 1:, :])
    np.multiply(o[:, 1:, :], _scales(n)[None, :, None], out=o[:, 1:, :])


def contrast(array: np.ndarray) -> np.ndarray:
    """``Q_A`` applied to an array over ``A``'s cells: the residual coefficients (equation (2))."""
    out = np.asarray(array, dtype=np.float64)
    for axis in range(out.ndim):
        out = analyse_axis(out, axis)[(slice(None),) * axis + (slice(1, None),)]
    return out


def _dense_transform(sizes: tuple[int, ...]) -> np.ndarray:
    """The Kronecker product of the ``U_a`` (cells x cells): ``v = U g`` for flat C-order ``g``."""
    out = np.ones((1, 1))
    for n in sizes:
        out = np.kron(out, synthesize_axis(np.eye(n), 0))
    return out


# ---- families of sets ----------------------------------------------------------------------------
#: Pairs (set, larger set) whose overlaps :func:`maximal_sets` forms at once.
_OVERLAP_PAIRS = 1 << 22


def maximal_sets(sets: Iterable[Sequence[int]]) -> list[tuple[int, ...]]:
    """The sets not contained in another one (sorted tuples, first-seen order, no repeats).

    A set is dropped when a strictly larger one holds it (distinct sets of one size cannot hold
    each other), tested for all pairs at once: ``s ⊆ t`` iff ``|s ∩ t| = |s|``, the overlaps
    being one sparse product of the sets' incidence matrix (attributes as columns).
    """
    unique = list(dict.fromkeys(tuple(sorted(s)) for s in sets))
    if len(unique) <= 1:
        return unique
    sizes = np.fromiter(map(len, unique), dtype=np.int64, count=len(unique))
    columns = {a: j for j, a in enumerate(dict.fromkeys(a for s in unique for a in s))}
    members = np.fromiter((columns[a] for s in unique for a in s), dtype=np.int64, count=int(sizes.sum()))
    incidence = sparse.csr_matrix((np.ones(members.size, dtype=np.int32), members,
                                   np.concatenate([[0], np.cumsum(sizes)])), shape=(len(unique), len(columns)))
    held = np.zeros(len(unique), dtype=bool)
    for k in np.unique(sizes):
        smaller, larger = np.flatnonzero(sizes == k), np.flatnonzero(sizes > k)
        if larger.size == 0:
            continue
        if k == 0:  # the empty set: inside any other
            held[smaller] = True
            continue
        supersets = incidence[larger].T.tocsc()
        step = max(1, _OVERLAP_PAIRS // larger.size)  # bounds the product's memory
        for start in range(0, smaller.size, step):
            rows = smaller[start:start + step]
            held[rows] = (incidence[rows] @ supersets).max(axis=1).toarray().ravel() >= k
    return [s for s, inside in zip(unique, held) if not inside]


def held_cliques(num_attrs: int, axes: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
    """The maximal sets among ``axes``, and alone every attribute none of them holds (uniform, as
    nothing is known of it), so that marginals can be read over the whole domain."""
    held = {a for s in axes for a in s}
    return maximal_sets(list(axes) + [(a,) for a in range(num_attrs) if a not in held])


def clique_cells(domain: Domain, sets: Iterable[Sequence[str]]) -> int:
    """Cells of :func:`held_cliques` for ``sets`` (attribute names): the size of the local
    relaxation that holds them; public sizes only."""
    cliques = held_cliques(len(domain), [tuple(sorted(domain.axes(s))) for s in sets if s])
    return int(sum(math.prod(domain.sizes[a] for a in c) for c in cliques))


def is_decomposable(sets: Sequence[Sequence[int]]) -> bool:
    """Whether the (maximal) sets are the cliques of a chordal graph: then pairwise consistency over
    them is global consistency and their local polytope is the marginal polytope (Wainwright and
    Jordan 2008, §4.1: the junction-tree property).

    Eliminates simplicial attributes (whose remaining neighbours are all adjacent) one at a time
    (Rose, Tarjan, Lueker 1976): the graph is chordal iff this eliminates every attribute; its
    maximal cliques are then the elimination cliques, which must be the sets themselves.
    """
    sets = maximal_sets(sets)
    neighbours: dict[int, set[int]] = {}
    for s in sets:
        for a in s:
            neighbours.setdefault(int(a), set()).update(int(b) for b in s if b != a)
    holders: dict[int, list[frozenset]] = {}
    for s in sets:
        for a in s:
            holders.setdefault(int(a), []).append(frozenset(s))
    remaining = set(neighbours)
    while remaining:
        simplicial = next((v for v in sorted(remaining)
                           if all(w in neighbours[u] for u, w in combinations(sorted(neighbours[v] & remaining), 2))),
                          None)
        if simplicial is None:
            return False  # not chordal
        clique = (neighbours[simplicial] & remaining) | {simplicial}
        if not any(clique <= s for s in holders[simplicial]):
            return False  # a clique of the graph that no set holds (e.g. the triangle of three pairs)
        remaining.discard(simplicial)
    return True


def downward_closure(sets: Sequence[Sequence[int]]) -> dict[int, np.ndarray]:
    """Every subset of every set, by size: ``{size: sorted unique rows of axes}`` (size 0 included)."""
    by_size: dict[int, list[np.ndarray]] = {0: [np.zeros((1, 0), dtype=np.int64)]}
    by_arity: dict[int, list[tuple[int, ...]]] = {}
    for s in sets:
        by_arity.setdefault(len(s), []).append(tuple(s))
    for k, rows in by_arity.items():
        arr = np.asarray(rows, dtype=np.int64).reshape(len(rows), k)
        for j in range(1, k + 1):
            picks = np.asarray(list(combinations(range(k), j)), dtype=np.int64)
            parts = arr[:, picks].reshape(-1, j)
            by_size.setdefault(j, []).append(np.unique(parts, axis=0))
    return {j: np.unique(np.concatenate(parts), axis=0) for j, parts in by_size.items()}


class _Keys:
    """Integer codes of attribute sets (rows of sorted axes) for vectorised lookups.

    With at most 62 attributes a set's code is its bit mask (any size); otherwise a mixed-radix
    code of its axes plus one, which fits in int64 while ``size * log2(d + 1) < 62``.
    """

    def __init__(self, d: int) -> None:
        self.d = d

    def codes(self, axes: np.ndarray) -> np.ndarray | None:
        axes = np.asarray(axes, dtype=np.int64)
        j = axes.shape[-1]
        if self.d <= 62:
            return np.left_shift(np.int64(1), axes).sum(axis=-1) if j else np.zeros(axes.shape[:-1], np.int64)
        if j * math.log2(self.d + 1) >= 62:
            return None
        weights = (self.d + 1) ** np.arange(j - 1, -1, -1, dtype=np.int64)
        return (axes + 1) @ weights


class ResidualIndex:
    """The residuals ``c_A`` of every set of the downward closure of ``sets``, in one flat vector.

    Parameters
    ----------
    domain : Domain
    sets : sequence of tuples of int
        Attribute sets as sorted domain axes; the index holds every subset of every set.

    Attributes
    ----------
    size : int
        Length of the flat vector (``sum_A prod_{a in A} (n_a - 1)``).
    num_sets : int
        Number of residual sets, each with a position ``0..num_sets-1``.
    set_axes : list of tuples
        The axes of each set, by position.
    set_offsets, set_cells, set_order : ndarray
        Where each set starts in the flat vector, its length, its number of attributes.
    """

    def __init__(self, domain: Domain, sets: Sequence[Sequence[int]]) -> None:
        self.domain = domain
        self.sizes = np.asarray(domain.sizes, dtype=np.int64)
        self._keys = _Keys(len(domain))
        closure = downward_closure(sets)
        rows = [closure[j] for j in sorted(closure)]
        axes_rows = [tuple(int(a) for a in r) for block in rows for r in block]
        self.set_axes = axes_rows
        self.num_sets = len(axes_rows)
        cells = np.array([math.prod(int(self.sizes[a]) - 1 for a in r) for r in axes_rows], dtype=np.int64)
        self.set_cells = cells
        self.set_offsets = np.concatenate([[0], np.cumsum(cells)[:-1]]).astype(np.int64)
        self.set_order = np.array([len(r) for r in axes_rows], dtype=np.int64)
        self.size = int(cells.sum())
        # Lookup: integer codes, sorted for one searchsorted; a dict for sets too large to code.
        codes, coded, self._dict = [], [], {}
        start = 0
        for block in rows:
            c = self._keys.codes(block)
            if c is None:
                self._dict.update({tuple(int(a) for a in r): start + i for i, r in enumerate(block)})
            else:
                codes.append(c)
                coded.append(np.arange(start, start + len(block), dtype=np.int64))
            start += len(block)
        codes = np.concatenate(codes) if codes else np.zeros(0, dtype=np.int64)
        coded = np.concatenate(coded) if coded else np.zeros(0, dtype=np.int64)
        order = np.argsort(codes, kind="stable")
        self._codes, self._code_positions = codes[order], coded[order]

    def positions(self, axes: np.ndarray) -> np.ndarray:
        """Set positions of the rows of ``axes`` (shape (M, j), sorted axes); QueryError for a set not held."""
        axes = np.asarray(axes, dtype=np.int64)
        if axes.ndim != 2:
            raise QueryError(f"positions: axes must be a 2-d array of rows, got shape {axes.shape}")
        codes = self._keys.codes(axes)
        if codes is None:
            try:
                return np.array([self._dict[tuple(r)] for r in axes.tolist()], dtype=np.int64)
            except KeyError:
                raise QueryError("an attribute set is missing from the residual index") from None
        at = np.minimum(np.searchsorted(self._codes, codes), len(self._codes) - 1)
        if len(self._codes) == 0 or not np.array_equal(self._codes[at], codes):
            raise QueryError("an attribute set is missing from the residual index")
        return self._code_positions[at]

    def position_of(self, axes: Sequence[int]) -> int:
        axes = sorted(int(a) for a in axes)
        return int(self.positions(np.asarray([axes], dtype=np.int64).reshape(1, len(axes)))[0])

    def residual(self, flat: np.ndarray, axes: Sequence[int]) -> np.ndarray:
        """The coefficients ``c_A`` of one set (sorted axes), shaped ``(n_a - 1 for a in A)``."""
        axes = tuple(sorted(int(a) for a in axes))
        p = self.position_of(axes)
        shape = tuple(int(self.sizes[a]) - 1 for a in axes)
        return flat[self.set_offsets[p]:self.set_offsets[p] + self.set_cells[p]].reshape(shape)

    def per_set(self, values: np.ndarray) -> np.ndarray:
        """A per-set scalar (length :attr:`num_sets`) repeated over each set's coefficients."""
        return np.repeat(np.asarray(values, dtype=np.float64), self.set_cells)

    def set_sums(self, flat: np.ndarray) -> np.ndarray:
        """``sum`` of ``flat`` over each set's coefficients (length :attr:`num_sets`; 0 for empty sets)."""
        out = np.zeros(self.num_sets)
        nonempty = self.set_cells > 0
        out[nonempty] = np.add.reduceat(flat, self.set_offsets[nonempty])
        return out


# ---- a family of attribute sets held in one flat vector --------------------------------------------
@dataclass
class _ShapeGroup:
    """The sets of one shape: ``axes`` (M, k); ``source`` (M, cells) the residual entry of every
    tensor entry; ``positions`` (M, 2^k) the residual set of every subset (bit j: position j)."""

    sizes: tuple[int, ...]
    axes: np.ndarray
    members: np.ndarray  # positions of these sets in the family's order
    offset: int
    source: np.ndarray
    positions: np.ndarray
    rest: np.ndarray  # (2^k,) n_{T∖A} of every subset mask
    dense: np.ndarray | None  # the Kronecker transform (cells x cells) for small shapes

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
        dtype = np.int32 if index.size < 2**31 else np.int64
        offset = 0
        for sig in sorted(by_sig, key=lambda s: (len(s), s)):
            members = np.asarray(by_sig[sig], dtype=np.int64)
            k = len(sig)
            axes = np.asarray([self.sets[i] for i in members], dtype=np.int64).reshape(len(members), k)
            positions = np.empty((len(members), 2**k), dtype=np.int64)
            for j in range(k + 1):  # every subset of j positions at once
                combos = list(combinations(range(k), j))
                picks = np.asarray(combos, dtype=np.int64).reshape(len(combos), j)
                masks = np.left_shift(1, picks).sum(axis=1)
                found = index.positions(axes[:, picks].reshape(len(members) * len(combos), j))
                positions[:, masks] = found.reshape(len(members), len(picks))
            grid = np.indices(sig).reshape(k, -1).T if k else np.zeros((1, 0), dtype=np.int64)  # (cells, k)
            on = grid >= 1
            mask_of = (on * (1 << np.arange(k))).sum(axis=1) if k else np.zeros(1, dtype=np.int64)
            # Within a residual's block: the C-order index over (i_a - 1) of the axes it holds.
            within = np.zeros(len(grid), dtype=np.int64)
            for p in range(k):
                stride = np.ones(len(grid), dtype=np.int64)
                for q in range(p + 1, k):
                    stride *= np.where(on[:, q], sig[q] - 1, 1)
                within += np.where(on[:, p], (grid[:, p] - 1) * stride, 0)
            source = (index.set_offsets[positions][:, mask_of] + within[None, :]).astype(dtype)
            rest = np.array([math.prod(sig[p] for p in range(k) if not (m >> p) & 1) for m in range(2**k)],
                            dtype=np.float64)
            cells = math.prod(sig)
            dense = _dense_transform(sig) if cells <= DENSE_TRANSFORM_CELLS else None
            group = _ShapeGroup(sig, axes, members, offset, source, positions, rest, dense)
            self.groups.append(group)
            self.offsets[members] = offset + cells * np.arange(len(members), dtype=np.int64)
            self.cells[members] = cells
            offset += group.length
        self.size = offset
        # Every tensor entry's residual entry, in the flat cell order: one bincount for the adjoint.
        self._source = np.concatenate([g.source.ravel() for g in self.groups]) if self.groups else \
            np.zeros(0, dtype=np.int64)

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

    # ---- the residual maps ---------------------------------------------------------------
    def _plan(self) -> list[list[tuple[_ShapeGroup, int, int]]]:
        """Each thread's share of the maps: pieces ``(group, lo, hi)``, the group's members
        ``lo:hi``. A group of at least as many sets as threads is cut into that many runs of
        members; the pieces, largest first, each go to the least loaded share (Graham's rule), so
        that the shares are balanced when most shapes hold one set (adult's attributes all differ in
        size). One share (every group whole) below :data:`THREAD_CELLS` or with one thread. Made
        once per family and thread count."""
        threads = worker_threads() if self.size >= THREAD_CELLS else 1
        plan = getattr(self, "_shares", None)
        if plan is not None and len(plan) == threads:
            return plan
        pieces = []
        for g in self.groups:
            pieces += [(g, lo, hi) for lo, hi in split_range(len(g.axes), threads)]
        plan, loads = [[] for _ in range(threads)], [0] * threads
        for piece in sorted(pieces, key=lambda q: -(q[2] - q[1]) * q[0].cells):  # stable: ties keep their order
            least = loads.index(min(loads))
            plan[least].append(piece)
            loads[least] += (piece[2] - piece[1]) * piece[0].cells
        self._shares, self._work = plan, None
        return plan

    def _buffers(self, share: int) -> list[np.ndarray]:
        """Three work arrays for one thread's share, as long as its largest piece, made once and
        reused by :meth:`expand` and :meth:`adjoint` (fresh whole-vector temporaries on every
        product cost page faults: system time). The maps are therefore not re-entrant on one
        family from several callers' threads."""
        work = getattr(self, "_work", None)
        if work is None:
            work = self._work = [None] * len(self._plan())
        if work[share] is None:
            longest = max(((hi - lo) * g.cells for g, lo, hi in self._shares[share]), default=0)
            work[share] = [np.empty(longest) for _ in range(3)]
        return work[share]

    def release_work(self) -> None:
        """Drop the work arrays of :meth:`expand` and :meth:`adjoint` (made again when next needed):
        about two cell vectors and three of the largest group's, worth freeing after a solve."""
        self._work = self._transformed = self._source_intp = None

    def _indices(self) -> np.ndarray:
        """The residual entry of every cell (``_source``) as ``intp``, made once: ``take`` and
        ``bincount`` convert narrower indices to ``intp`` on every call (a whole-vector temporary)."""
        indices = getattr(self, "_source_intp", None)
        if indices is None:
            indices = self._source_intp = self._source.astype(np.intp)
        return indices

    def _in_threads(self, work) -> None:
        """``work(share, pieces)`` for every thread's share of :meth:`_plan`, at once
        (:func:`~dpopt.workers.in_threads`); the shares write disjoint slices."""
        plan = self._plan()
        in_threads(lambda t: work(t, plan[t]), len(plan))

    def _transform(self, group: _ShapeGroup, count: int, tensor: np.ndarray, target: np.ndarray,
                   analyse: bool, work: list[np.ndarray]) -> None:
        """The per-axis transforms of ``count`` of a group's sets, ``tensor`` (count, cells), into
        ``target`` (count, cells), ping-ponging between the share's work arrays; the last axis
        writes ``target`` itself."""
        length = count * group.cells
        shape = (count,) + group.sizes
        k = len(group.sizes)
        current = tensor.reshape(shape)
        spare = work[:2] if analyse else work[1::-1]  # expand's tensor is held in work[0]
        for axis in range(k):
            if axis == k - 1:
                dest = target.reshape(shape)
            else:
                dest = spare[axis % 2][:length].reshape(shape)
            if analyse:
                _analyse_into(current, axis + 1, dest, work[2])
            else:
                _synthesize_into(current, axis + 1, dest)
            current = dest

    def transform(self, cells: np.ndarray, analyse: bool, out: np.ndarray | None = None) -> np.ndarray:
        """``U_T`` (synthesis) or ``U_T^T`` (``analyse``) on every set's cells of a flat vector:
        the per-axis transforms of :meth:`expand` and :meth:`adjoint` alone."""
        out = np.empty(self.size) if out is None else out

        def pieces(share: int, plan) -> None:
            work = self._buffers(share)
            for g, lo, hi in plan:
                start, stop = g.offset + lo * g.cells, g.offset + hi * g.cells
                target = out[start:stop].reshape(hi - lo, -1)
                tensor = cells[start:stop].reshape(target.shape)
                if g.dense is not None:
                    np.matmul(tensor, g.dense if analyse else g.dense.T, out=target)
                    continue
                if not analyse:  # synthesis overwrites its input (a temporary): work on a copy in work[0]
                    held = work[0][:stop - start].reshape(target.shape)
                    held[...] = tensor
                    tensor = held
                self._transform(g, hi - lo, np.ascontiguousarray(tensor), target, analyse, work)

        self._in_threads(pieces)
        return out

    def expand(self, residuals: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Equation (1): the marginal of every set from the residuals (flat layout)."""
        out = np.empty(self.size) if out is None else out
        indices = self._indices()

        def pieces(share: int, plan) -> None:
            work = self._buffers(share)
            for g, lo, hi in plan:
                start, stop = g.offset + lo * g.cells, g.offset + hi * g.cells
                target = out[start:stop].reshape(hi - lo, -1)
                tensor = work[0][:stop - start].reshape(target.shape)
                # valid indices (g.source as intp); mode "raise" would buffer
                np.take(residuals, indices[start:stop].reshape(target.shape), out=tensor, mode="clip")
                if g.dense is not None:
                    np.matmul(tensor, g.dense.T, out=target)
                else:
                    self._transform(g, hi - lo, tensor, target, False, work)

        self._in_threads(pieces)
        return out

    def adjoint(self, cells: np.ndarray, weights: np.ndarray | None = None,
                out: np.ndarray | None = None) -> np.ndarray:
        """The transpose of :meth:`expand`: ``sum_T w_T Q_A marg_A(v_T) / n_{T∖A}`` for every ``A``.

        With ``out`` (length ``index.size``) the sums are made there, in the order ``bincount``
        makes them (the same bits), with no new vector."""
        index = self.index
        transformed = getattr(self, "_transformed", None)
        if transformed is None:
            transformed = self._transformed = np.empty(self.size)
        per_set = None if weights is None else np.asarray(weights, dtype=np.float64)

        def pieces(share: int, plan) -> None:
            work = self._buffers(share)
            for g, lo, hi in plan:
                start, stop = g.offset + lo * g.cells, g.offset + hi * g.cells
                v = cells[start:stop].reshape(hi - lo, -1)
                if per_set is not None:
                    v = v * per_set[g.members[lo:hi]][:, None]
                target = transformed[start:stop].reshape(v.shape)
                if g.dense is not None:
                    np.matmul(v, g.dense, out=target)
                else:
                    self._transform(g, hi - lo, np.ascontiguousarray(v), target, True, work)

        self._in_threads(pieces)
        if out is None:
            return np.bincount(self._indices(), weights=transformed, minlength=index.size)
        out[...] = 0.0
        np.add.at(out, self._indices(), transformed)  # sequential in cell order, as bincount
        return out

    def diagonal(self, weights: np.ndarray | None = None) -> np.ndarray:
        """``sum_{T ⊇ A} w_T / n_{T∖A}`` for every residual set (length ``index.num_sets``)."""
        index = self.index
        out = np.zeros(index.num_sets)
        for g in self.groups:
            w = np.ones(len(g.axes)) if weights is None else np.asarray(weights, dtype=np.float64)[g.members]
            out += np.bincount(g.positions.ravel(), weights=(w[:, None] / g.rest[None, :]).ravel(),
                               minlength=index.num_sets)
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
        out.append(tuple(sorted(axes)))
    return out


def measured_and_workload_axes(domain: Domain, sets: Sequence[Sequence[str]],
                               workload: Iterable[Sequence[str]] | None, who: str
                               ) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """The measured sets as sorted axes (``()`` for a total) and the workload's, without repeats:
    the measured marginals themselves when ``workload`` is None. ``who`` names the caller in the
    one-line errors (measurements that are all totals, an empty workload)."""
    axes = [tuple(sorted(domain.axes(s))) if s else () for s in sets]
    if workload is None:
        work = list(dict.fromkeys(a for a in axes if a))
        if not work:
            raise QueryError(f"{who}: the measurements are all totals; give a workload of marginals")
    else:
        work = list(dict.fromkeys(check_sets(domain, list(workload), "workload")))
        if not work:
            raise QueryError(f"{who}: the workload is empty")
    return axes, work
