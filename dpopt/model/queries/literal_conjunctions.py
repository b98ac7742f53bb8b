"""Conjunctions of ``attribute = value`` literals, and their negations: k-way marginal cells as rows.

A row of :class:`Conjunctions` counts the records that satisfy every literal of a conjunction
(one cell of a marginal when it has one literal per attribute of the marginal) or, for a
*negated* row, the records that fail at least one of them (``n`` minus the cell). These are
the counting queries of DualQuery (Gaboardi et al., ICML 2014): per record their value is 0
or 1, so normalised by ``n`` every answer lies in ``[0, 1]``.

The workload is held as two small integer arrays, ``positions`` (attribute positions in domain
order, ``-1`` for an unused slot) and ``values`` (codes), so workloads of millions of rows on
domains of 10^40 cells cost a few bytes per row. Answers on records are computed per
attribute set (one ``bincount`` over the distinct records per set), never over the domain;
on a dense histogram the operator is matrix-free (one marginal per attribute set).
"""

from __future__ import annotations

from itertools import combinations
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

import numpy as np
import scipy.sparse as sp

from dpopt.errors import QueryError
from dpopt.model.domain import MAX_DENSE_CELLS, Domain
from dpopt.model.queries._common import SupportArray, StructuredQuery, check_domain, expand, marginalize

if TYPE_CHECKING:  # pragma: no cover
    from dpopt.model.data import Dataset

__all__ = ["Conjunctions", "distinct_records"]


class Conjunctions(StructuredQuery):
    """Counting queries ``q(x) = [x_a1 = v1 and ... and x_ak = vk]`` and their negations ``1 - q``.

    Parameters
    ----------
    domain : Domain
    positions : int array, shape (m, k)
        Attribute positions (``domain.attrs`` order) of each row's literals; ``-1`` pads rows
        with fewer than ``k`` literals. A row names an attribute at most once.
    values : int array, shape (m, k)
        The code each literal requires (ignored where the position is ``-1``).
    negated : bool array, shape (m,), optional
        True where the row counts the records that do NOT satisfy its conjunction.

    Rows are stored with their literals sorted by position. Use :meth:`marginal_cells`,
    :meth:`random`, :meth:`from_literals` and :meth:`with_negations` to build workloads.

    Examples
    --------
    >>> dom = Domain.from_dict({"a": 2, "b": 3})
    >>> q = Conjunctions.from_literals(dom, [{"a": 1}, {"a": 0, "b": 2}]).with_negations()
    >>> q.count_records(np.array([[1, 2], [0, 2], [1, 0]]))
    array([2, 1, 1, 2])
    """

    is_integer = True

    def __init__(self, domain: Domain, positions, values, negated=None) -> None:
        self.domain = check_domain(domain, "Conjunctions")
        pos = np.asarray(positions, dtype=np.int64)
        val = np.asarray(values, dtype=np.int64)
        if pos.ndim != 2 or val.shape != pos.shape:
            raise QueryError(f"Conjunctions: positions and values must be (m, k) arrays of one shape, got "
                             f"{pos.shape} and {val.shape}")
        if pos.shape[0] == 0:
            raise QueryError("Conjunctions: the workload has no rows")
        d = len(self.domain)
        if ((pos < -1) | (pos >= d)).any():
            raise QueryError(f"Conjunctions: attribute positions must lie in -1..{d - 1}")
        # Sort each row's literals by position (padding last) so equal conjunctions look equal.
        key = np.where(pos < 0, d, pos)
        order = np.argsort(key, axis=1, kind="stable")
        pos = np.take_along_axis(pos, order, axis=1)
        val = np.take_along_axis(val, order, axis=1)
        used = pos >= 0
        if (~used).all(axis=1).any():
            raise QueryError(f"Conjunctions: row {int(np.argmax((~used).all(axis=1)))} has no literal")
        if (used[:, 1:] & (pos[:, 1:] == pos[:, :-1])).any():
            row = int(np.argmax((used[:, 1:] & (pos[:, 1:] == pos[:, :-1])).any(axis=1)))
            raise QueryError(f"Conjunctions: row {row} names attribute {self.domain.attrs[pos[row, 0]]!r} twice")
        sizes = np.asarray(self.domain.sizes, dtype=np.int64)
        bad = used & ((val < 0) | (val >= sizes[np.where(used, pos, 0)]))
        if bad.any():
            row, col = np.argwhere(bad)[0]
            attr = self.domain.attrs[pos[row, col]]
            raise QueryError(f"Conjunctions: row {int(row)} asks {attr} = code {int(val[row, col])}, outside "
                             f"0..{self.domain.size_of(attr) - 1}")
        val = np.where(used, val, 0)
        neg = np.zeros(pos.shape[0], dtype=bool) if negated is None else np.asarray(negated, dtype=bool).copy()
        if neg.shape != (pos.shape[0],):
            raise QueryError(f"Conjunctions: negated must have one entry per row ({pos.shape[0]}), got {neg.shape}")
        for arr in (pos, val, neg):
            arr.setflags(write=False)
        self.positions, self.values, self.negated = pos, val, neg
        self._groups_cache = None
        self._cell_cache = None
        self._position_cache = None

    # ---- construction ----------------------------------------------------------------------
    @classmethod
    def from_literals(cls, domain: Domain, rows: Sequence[Mapping], negated=None) -> "Conjunctions":
        """Rows given as ``{attribute: value}`` dicts (labels or codes)."""
        rows = list(rows)
        if not rows:
            raise QueryError("Conjunctions.from_literals: no rows")
        k = max(len(r) for r in rows)
        pos = np.full((len(rows), max(k, 1)), -1, dtype=np.int64)
        val = np.zeros_like(pos)
        for i, row in enumerate(rows):  # user-sized input: one dict per row
            for j, (attr, value) in enumerate(row.items()):
                pos[i, j] = domain.axis(attr)
                val[i, j] = domain.code_of(attr, value)
        return cls(domain, pos, val, negated)

    @classmethod
    def marginal_cells(cls, domain: Domain, marginals: int | Iterable[Iterable[str]]) -> "Conjunctions":
        """Every cell of every marginal: all ``k``-way marginals (``marginals = k``) or the given ones."""
        check_domain(domain, "Conjunctions.marginal_cells")
        if isinstance(marginals, (int, np.integer)) and not isinstance(marginals, bool):
            k = int(marginals)
            if not 1 <= k <= len(domain):
                raise QueryError(f"Conjunctions.marginal_cells: k must be in 1..{len(domain)}, got {k}")
            sets = [tuple(c) for c in combinations(range(len(domain)), k)]
        else:
            sets = [tuple(sorted(domain.axes(domain.check_attrs(m)))) for m in marginals]
            if not sets or any(len(s) == 0 for s in sets):
                raise QueryError("Conjunctions.marginal_cells: give k >= 1 or non-empty attribute lists")
        k = max(len(s) for s in sets)
        sizes = np.asarray(domain.sizes, dtype=np.int64)
        total = sum(int(np.prod(sizes[list(s)])) for s in sets)
        if total > MAX_DENSE_CELLS:
            raise QueryError(f"Conjunctions.marginal_cells: {total:.3g} cells, above {MAX_DENSE_CELLS:.0e}")
        pos_parts, val_parts = [], []
        for s in sets:  # one block per marginal, vectorised over its cells
            shape = tuple(int(sizes[a]) for a in s)
            cells = np.stack(np.unravel_index(np.arange(int(np.prod(shape))), shape), axis=1)
            pos = np.full((cells.shape[0], k), -1, dtype=np.int64)
            val = np.zeros_like(pos)
            pos[:, : len(s)] = s
            val[:, : len(s)] = cells
            pos_parts.append(pos)
            val_parts.append(val)
        return cls(domain, np.concatenate(pos_parts), np.concatenate(val_parts))

    @classmethod
    def random(cls, domain: Domain, order: int, count: int, seed: int = 0,
               attributes: Sequence[str] | None = None) -> "Conjunctions":
        """``count`` random ``order``-way conjunctions: uniform attribute sets, uniform values.

        The workload of the DualQuery paper's experiments ("random 3-way marginal queries").
        It is public and data-independent; ``seed`` makes it reproducible (numpy's PCG64: a
        workload is no secret, so no secure source is needed). Rows may repeat.
        """
        check_domain(domain, "Conjunctions.random")
        pool = np.asarray(domain.axes(domain.check_attrs(attributes)) if attributes is not None
                          else range(len(domain)), dtype=np.int64)
        if isinstance(order, bool) or not isinstance(order, (int, np.integer)) or not 1 <= order <= pool.size:
            raise QueryError(f"Conjunctions.random: order must be an integer in 1..{pool.size}, got {order!r}")
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 1:
            raise QueryError(f"Conjunctions.random: count must be a positive integer, got {count!r}")
        gen = np.random.default_rng(seed)
        # A uniform k-subset per row: the k smallest of a uniform random key per attribute.
        keys = gen.random((int(count), pool.size))
        pos = pool[np.argpartition(keys, int(order) - 1, axis=1)[:, : int(order)]]
        sizes = np.asarray(domain.sizes, dtype=np.int64)
        val = np.floor(gen.random(pos.shape) * sizes[pos]).astype(np.int64)
        return cls(domain, pos, val)

    def with_negations(self) -> "Conjunctions":
        """The rows followed by their negations (rows already negated are kept and flipped too)."""
        return Conjunctions(self.domain, np.concatenate([self.positions, self.positions]),
                            np.concatenate([self.values, self.values]),
                            np.concatenate([self.negated, ~self.negated]))

    def rows(self, index) -> "Conjunctions":
        """A workload of the selected rows."""
        index = np.asarray(index, dtype=np.int64).ravel()
        return Conjunctions(self.domain, self.positions[index], self.values[index], self.negated[index])

    # ---- shape ----------------------------------------------------------------------------
    @property
    def num_rows(self) -> int:
        return int(self.positions.shape[0])

    @property
    def arity(self) -> np.ndarray:
        """Number of literals of each row."""
        return (self.positions >= 0).sum(axis=1)

    @property
    def name(self) -> str:
        k = int(self.arity.max())
        neg = int(self.negated.sum())
        return f"Conjunctions({self.num_rows} rows, up to {k} literals" + (f", {neg} negated)" if neg else ")")

    @property
    def depends_on(self) -> tuple[str, ...]:
        used = np.unique(self.positions[self.positions >= 0])
        return tuple(self.domain.attrs[i] for i in used)

    def _restrict_to(self, attrs: tuple[str, ...]) -> "Conjunctions":
        sub = self.domain.project(attrs)
        remap = np.full(len(self.domain) + 1, -1, dtype=np.int64)
        remap[list(self.domain.axes(attrs))] = np.arange(len(attrs))
        return Conjunctions(sub, remap[self.positions], self.values, self.negated)

    # ---- groups of rows over one attribute set ---------------------------------------------
    def groups(self) -> list[tuple[tuple[int, ...], np.ndarray, np.ndarray]]:
        """``(positions, rows, cells)`` per attribute set: the rows over it and their marginal cells."""
        if self._groups_cache is None:
            uniq, inverse = self._position_sets()
            order = np.argsort(inverse, kind="stable")
            starts = np.searchsorted(inverse[order], np.arange(len(uniq) + 1))
            sizes = np.asarray(self.domain.sizes, dtype=np.int64)
            out = []
            for g, key in enumerate(uniq):  # one entry per attribute set, not per row
                pos = tuple(int(p) for p in key if p >= 0)
                rows = order[starts[g]:starts[g + 1]]
                shape = tuple(int(sizes[p]) for p in pos)
                cells = np.ravel_multi_index(tuple(self.values[rows, : len(pos)].T), shape).astype(np.int64)
                out.append((pos, rows, cells))
            self._groups_cache = out
        return self._groups_cache

    def _position_sets(self) -> tuple[np.ndarray, np.ndarray]:
        """``np.unique(positions, axis=0, return_inverse=True)``, the same arrays: rows read as one
        integer each (positions + 1 in base ``len(domain) + 1`` keep the rows' order), sorted once
        in one dimension. 1,000,000 rows of KDD99's conjunctions: 0.1 CPU-s where the row-wise
        unique took 2.3 s. Made once: :meth:`groups` and :meth:`satisfied` both need it."""
        if self._position_cache is None:
            self._position_cache = self._unique_position_sets()
        return self._position_cache

    def _unique_position_sets(self) -> tuple[np.ndarray, np.ndarray]:
        pos = self.positions
        base = len(self.domain) + 1
        if pos.shape[1] * np.log2(base) >= 62:  # the key would overflow int64
            uniq, inverse = np.unique(pos, axis=0, return_inverse=True)
            return uniq, inverse.ravel()
        weights = base ** np.arange(pos.shape[1] - 1, -1, -1, dtype=np.int64)
        _, first, inverse = np.unique((pos + 1) @ weights, return_index=True, return_inverse=True)
        return pos[first], inverse.ravel()

    def _cell_index(self):
        """``(sets, multipliers, set of each row, cell of each row)``: each row's conjunction as
        one cell of the marginal on its attribute set (row-major, as :meth:`groups`), or None when
        a marginal has 2^62 cells or more. For :meth:`satisfied`."""
        if self._cell_cache is None:
            uniq, inverse = self._position_sets()
            sizes = np.asarray(self.domain.sizes, dtype=np.int64)
            width = np.where(uniq >= 0, sizes[np.maximum(uniq, 0)], 1)  # padding: one value
            if np.max(np.sum(np.log2(width), axis=1)) >= 62:
                self._cell_cache = (None,)
            else:
                after = np.cumprod(width[:, ::-1], axis=1)[:, ::-1]  # product of the sizes from j on
                multipliers = np.concatenate([after[:, 1:], np.ones((len(uniq), 1), dtype=np.int64)], axis=1)
                cells = np.sum(self.values * multipliers[inverse], axis=1)
                self._cell_cache = (uniq, multipliers, inverse, cells)
        return None if self._cell_cache[0] is None else self._cell_cache

    # ---- answers on records ----------------------------------------------------------------
    def count_records(self, codes: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
        """How many records (rows of ``codes``, with optional integer weights) satisfy each row.

        One ``bincount`` per attribute set over the distinct records; the domain is never
        materialised.
        """
        codes = np.asarray(codes, dtype=np.int64)
        if codes.ndim != 2 or codes.shape[1] != len(self.domain):
            raise QueryError(f"{self.name}: records must have shape (rows, {len(self.domain)}), got {codes.shape}")
        codes, weights = distinct_records(codes, self.domain, weights)
        total = int(weights.sum())
        sizes = np.asarray(self.domain.sizes, dtype=np.int64)
        out = np.zeros(self.num_rows, dtype=np.int64)
        for pos, rows, cells in self.groups():
            shape = tuple(int(sizes[p]) for p in pos)
            cells_of_records = np.ravel_multi_index(tuple(codes[:, list(pos)].T), shape)
            if int(np.prod(shape)) <= 4 * len(codes) + 1024:
                marginal = np.bincount(cells_of_records, weights=weights, minlength=int(np.prod(shape)))
                out[rows] = marginal[cells].astype(np.int64)
            else:  # a marginal far larger than the records: look the cells up instead
                present, where = np.unique(cells_of_records, return_inverse=True)
                sums = np.bincount(where.ravel(), weights=weights)
                idx = np.searchsorted(present, cells)
                hit = (idx < present.size) & (present[np.minimum(idx, present.size - 1)] == cells)
                out[rows] = np.where(hit, sums[np.minimum(idx, present.size - 1)], 0).astype(np.int64)
        return np.where(self.negated, total - out, out)

    def answer(self, data: "Dataset") -> np.ndarray:
        """True answers (counts) on a dataset, from its records; no marginal of the whole support."""
        if data.domain != self.domain:
            raise QueryError(f"{self.name}: the data's domain {data.domain} differs from {self.domain}")
        return self.count_records(data.codes, data.weights).astype(np.float64)

    def satisfied(self, record: np.ndarray) -> np.ndarray:
        """Whether one record (codes in domain order) satisfies each row (0/1 per row, as bool)."""
        record = np.asarray(record, dtype=np.int64).ravel()
        if record.shape != (len(self.domain),):
            raise QueryError(f"{self.name}: a record has {len(self.domain)} codes, got {record.shape}")
        index = self._cell_index()
        if index is None:
            lit = (self.positions < 0) | (record[np.maximum(self.positions, 0)] == self.values)
            return lit.all(axis=1) != self.negated
        # The record's cell in each attribute set's marginal, compared with each row's cell: one
        # gather per row instead of one per literal (DualQuery asks this every round: 1,000,000
        # rows of 3 literals, 35 ms a call before).
        sets, multipliers, set_of_row, cell_of_row = index
        record_cells = np.sum(np.where(sets >= 0, record[np.maximum(sets, 0)], 0) * multipliers, axis=1)
        return (cell_of_row == record_cells[set_of_row]) != self.negated

    # ---- the linear operator on dense histograms -------------------------------------------
    def _marginal_attrs(self, pos: tuple[int, ...]) -> tuple[str, ...]:
        return tuple(self.domain.attrs[p] for p in pos)

    def _matvec(self, x: np.ndarray) -> np.ndarray:
        out = np.empty(self.num_rows, dtype=np.result_type(x.dtype, np.int64))
        for pos, rows, cells in self.groups():
            out[rows] = marginalize(x, self.domain, self._marginal_attrs(pos))[cells]
        return np.where(self.negated, np.sum(x) - out, out)

    def _rmatvec(self, y: np.ndarray) -> np.ndarray:
        y = np.asarray(y, dtype=np.float64)
        signed = np.where(self.negated, -y, y)
        out = np.full(self.domain.size, float(y[self.negated].sum()))
        sizes = np.asarray(self.domain.sizes, dtype=np.int64)
        for pos, rows, cells in self.groups():
            shape = int(np.prod([sizes[p] for p in pos]))
            marginal = np.bincount(cells, weights=signed[rows], minlength=shape)
            out += expand(marginal, self.domain, self._marginal_attrs(pos))
        return out

    def to_sparse(self) -> sp.csr_matrix:
        """The 0/1 matrix (dense domains only; negated rows are mostly ones)."""
        n = self.domain.require_dense("the matrix of a conjunction workload")
        codes = self.domain.unravel(np.arange(n))
        sizes = np.asarray(self.domain.sizes, dtype=np.int64)
        row_parts, col_parts = [], []
        for pos, rows, cells in self.groups():
            shape = tuple(int(sizes[p]) for p in pos)
            cell_of = np.ravel_multi_index(tuple(codes[:, list(pos)].T), shape)
            order = np.argsort(cell_of, kind="stable")
            bounds = np.searchsorted(cell_of[order], np.stack([cells, cells + 1]))
            lengths = bounds[1] - bounds[0]
            starts = np.repeat(bounds[0] - np.cumsum(lengths) + lengths, lengths)
            row_parts.append(np.repeat(rows, lengths))
            col_parts.append(order[np.arange(lengths.sum()) + starts])
        r = np.concatenate(row_parts)
        c = np.concatenate(col_parts)
        pos_matrix = sp.csr_matrix((np.ones(r.size), (r, c)), shape=(self.num_rows, n))
        if not self.negated.any():
            return pos_matrix
        ones = sp.csr_matrix(np.outer(self.negated.astype(np.float64), np.ones(n)))
        flip = sp.diags(np.where(self.negated, -1.0, 1.0))
        return sp.csr_matrix(ones + flip @ pos_matrix)

    def _abs_power_rmatvec(self, v: np.ndarray, p: float) -> SupportArray:
        # Entries are 0 or 1, so |Q|^p = Q.
        restricted = self.restrict()
        return restricted.domain.attrs, restricted.rmatvec(np.asarray(v, dtype=np.float64)).reshape(
            restricted.domain.shape)

    def row_labels(self) -> list[str]:
        labels = []
        for i in range(self.num_rows):  # report-sized use only
            lits = [f"{self.domain.attrs[p]}={self.domain.labels_of(self.domain.attrs[p])[v]}"
                    for p, v in zip(self.positions[i], self.values[i]) if p >= 0]
            text = " and ".join(lits)
            labels.append(f"not ({text})" if self.negated[i] else text)
        return labels


def distinct_records(codes: np.ndarray, domain: Domain, weights: np.ndarray | None = None
                     ) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of ``codes`` with their total weights (a group-by on all attributes).

    Rows are keyed by mixed-radix integers over runs of attributes whose product stays below
    2^62, so any domain size works; one ``lexsort`` of the keys finds the groups.
    """
    codes = np.asarray(codes, dtype=np.int64)
    w = np.ones(len(codes), dtype=np.int64) if weights is None else np.asarray(weights, dtype=np.int64)
    if len(codes) == 0:
        return codes, w
    keys, cur, cap = [], np.zeros(len(codes), dtype=np.int64), 1
    for j, size in enumerate(domain.sizes):
        if cap * size >= 2**62:
            keys.append(cur)
            cur, cap = np.zeros(len(codes), dtype=np.int64), 1
        cur = cur * size + codes[:, j]
        cap *= size
    keys.append(cur)
    key = np.stack(keys, axis=1)
    order = np.lexsort(key.T[::-1])
    sorted_keys = key[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = (sorted_keys[1:] != sorted_keys[:-1]).any(axis=1)
    group = np.cumsum(first) - 1
    sums = np.bincount(group, weights=w[order]).astype(np.int64)
    keep = sums > 0
    return codes[order[first]][keep], sums[keep]
