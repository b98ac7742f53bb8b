"""Conjunction counts over a binary domain: the coefficients of the polynomial release.

Thaler, Ullman and Vadhan (ICALP 2012, Theorem 3.1 with Lemma 4.3) release, for every set
``T`` of at most ``t`` attributes, the number of records with every attribute of ``T`` set
(the coefficient of the monomial ``y_T``, up to a public factor); in the extended universe of
their Section 4.1 (each attribute and its negation) the literal sets are *patterns*: for every
``T`` and every ``v in {0,1}^T``, the number of records with ``x_T = v`` -- the cells of the
marginal over ``T``.

:class:`ConjunctionCounts` is that query for all ``T`` of one size ``m``. It exists besides
:class:`~dpopt.model.queries.marginal.Marginal` and
:class:`~dpopt.model.queries.marginal_workload.MarginalWorkload` because the release needs it
on domains of ``2^60`` cells and more: the subsets are one integer array (``C(60, 3) = 34,220``
rows without 34,220 query objects), the sensitivity is exact without a dense vector, and the
answers come from the records (:func:`conjunction_moments`), never from a histogram. The
monotone form (the all-ones pattern only) cannot be written with the marginal queries at all.

Conventions
-----------
* Subsets are rows of attribute *positions* in increasing order, numbered in colexicographic
  order: ``rank(i_1 < ... < i_m) = sum_l C(i_l, l)`` (:func:`colex_rank`), so every array of
  counts by subset is indexed by rank without a lookup table.
* A pattern ``v`` of ``T`` is an integer whose bit ``m - 1 - l`` is the value of attribute
  ``T[l]``: the C order of the cells of ``Marginal(domain, T)``.

Sensitivity (add/remove one record): in the literal form a record matches exactly one pattern
of every subset, so every column has ``M`` ones for ``M`` subsets (L1 ``M``, squared L2 ``M``);
in the monotone form the all-ones record matches every row, again ``M``. Both are exact: the
all-zeros and the all-ones records attain them. Rows dropped because no record can match them
(``excluded``, e.g. unused codes of a binary encoding) do not change this: the all-zeros
record (code 0 of every attribute) still matches one kept row per subset.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import scipy.sparse as sp
from numpy.dtypes import StringDType

from dpopt.errors import DataError, QueryError
from dpopt.model.domain import Domain
from dpopt.model.queries._common import SupportArray, StructuredQuery, check_domain
from dpopt.model.queries.binary import BinaryEncoding

__all__ = [
    "ConjunctionCounts", "all_subsets", "colex_rank", "binomial_table", "conjunction_moments",
    "histogram_moments", "unique_rows", "unused_code_patterns", "gather_subsets", "pattern_counts", "superset_sums", "superset_mobius", "subset_positions",
]


# ---- subsets in colexicographic order --------------------------------------------------------------
@lru_cache(maxsize=32)
def binomial_table(n: int, m: int) -> np.ndarray:
    """``C(i, j)`` for ``0 <= i <= n``, ``0 <= j <= m`` as int64 (read-only)."""
    table = np.zeros((n + 1, m + 1), dtype=np.int64)
    for i in range(n + 1):
        for j in range(min(i, m) + 1):
            table[i, j] = math.comb(i, j)
    table.setflags(write=False)
    return table


def colex_rank(subsets: np.ndarray, d: int) -> np.ndarray:
    """Colexicographic rank of each row of increasing positions in ``0..d-1``: ``sum_l C(i_l, l + 1)``."""
    subsets = np.asarray(subsets, dtype=np.int64)
    m = subsets.shape[-1]
    if m == 0:
        return np.zeros(subsets.shape[:-1], dtype=np.int64)
    table = binomial_table(d, m)
    return table[subsets, np.arange(1, m + 1)].sum(axis=-1)


@lru_cache(maxsize=64)
def _all_subsets(d: int, m: int) -> np.ndarray:
    if m == 0:
        out = np.zeros((1, 0), dtype=np.int64)
    elif m == 1:
        out = np.arange(d, dtype=np.int64)[:, None]
    else:
        # Colex order: the (m-1)-subsets of 0..i-1 (a prefix of their colex order), then i.
        smaller = _all_subsets(d, m - 1)
        parts = [np.hstack([smaller[: math.comb(i, m - 1)], np.full((math.comb(i, m - 1), 1), i)])
                 for i in range(m - 1, d)]
        out = np.vstack(parts) if parts else np.zeros((0, m), dtype=np.int64)
    out.setflags(write=False)
    return out


def all_subsets(d: int, m: int) -> np.ndarray:
    """Every ``m``-subset of ``0..d-1`` as a row of increasing positions, in colex order."""
    if not 0 <= m <= d:
        raise QueryError(f"all_subsets: need 0 <= m <= d, got m={m}, d={d}")
    return _all_subsets(int(d), int(m))


@lru_cache(maxsize=32)
def subset_positions(m: int) -> tuple[np.ndarray, ...]:
    """For each pattern mask ``0..2^m-1``, the positions ``l`` whose bit ``m - 1 - l`` is set."""
    return tuple(np.array([l for l in range(m) if (mask >> (m - 1 - l)) & 1], dtype=np.int64)
                 for mask in range(2**m))


# ---- transforms over the bits of a pattern ------------------------------------------------------
def _butterfly(arr: np.ndarray, m: int, sign: float, into_zero: bool) -> np.ndarray:
    """One pass per bit over the last axis (``2^m``, bit ``m - 1 - l`` for pass ``l``).

    ``into_zero``: ``a[bit 0] += sign * a[bit 1]`` (superset sums, or their Möbius inverse
    with ``sign = -1``); otherwise ``a[bit 1] += sign * a[bit 0]`` (the transposes: subset sums).
    """
    out = np.array(arr, dtype=np.float64, copy=True)
    lead = out.shape[:-1]
    for l in range(m):
        view = out.reshape(lead + (2**l, 2, 2 ** (m - 1 - l)))
        if into_zero:
            view[..., 0, :] += sign * view[..., 1, :]
        else:
            view[..., 1, :] += sign * view[..., 0, :]
    return out


def superset_sums(values: np.ndarray, m: int) -> np.ndarray:
    """``z[T] = sum_{v ⊇ T} c[v]`` along the last axis (``2^m`` patterns)."""
    return _butterfly(values, m, 1.0, True)


def superset_mobius(moments: np.ndarray, m: int) -> np.ndarray:
    """Cells from superset sums along the last axis: ``c[v] = sum_{T ⊇ v} (-1)^{|T-v|} z[T]``.

    The inverse of :func:`superset_sums` (inclusion–exclusion over the attributes at 0).
    """
    return _butterfly(moments, m, -1.0, True)


# ---- counting from records -----------------------------------------------------------------------
def unique_rows(codes: np.ndarray, weights: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Distinct 0/1 rows and their total weights (duplicates cost nothing afterwards)."""
    n, d = codes.shape
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
    if n == 0:
        return np.zeros((0, d)), np.zeros(0)
    if d <= 62:
        keys = codes.astype(np.int64) @ (np.int64(1) << np.arange(d - 1, -1, -1, dtype=np.int64))
        uniq, inverse = np.unique(keys, return_inverse=True)
        rows = ((uniq[:, None] >> np.arange(d - 1, -1, -1, dtype=np.int64)) & 1).astype(np.float64)
    else:
        uniq_rows, inverse = np.unique(codes, axis=0, return_inverse=True)
        rows = uniq_rows.astype(np.float64)
    return rows, np.bincount(np.ravel(inverse), weights=w, minlength=rows.shape[0])


def conjunction_moments(codes: np.ndarray, weights: np.ndarray | None, t: int) -> list[np.ndarray]:
    """Monotone conjunction counts of every subset of at most ``t`` attributes, from 0/1 records.

    Returns ``moments`` with ``moments[m][colex_rank(T)] = sum_r w_r prod_{i in T} x_ri`` for
    every ``m``-subset ``T`` (``moments[0] = [total weight]``).

    The records are first reduced to distinct rows with summed weights. Pair counts are one
    weighted Gram matrix ``X^T W X``; the counts of ``P ∪ {j, l}`` for a prefix ``P`` are the
    Gram matrix of the rows that have all of ``P``, over the attributes after ``P``'s last
    (a depth-first walk over prefixes, skipping prefixes no record has). Exact for weights
    summing below ``2^53`` (float64 products of 0/1 entries).
    """
    codes = np.asarray(codes)
    if codes.ndim != 2:
        raise DataError(f"conjunction_moments: records must be a 2-d array, got shape {codes.shape}")
    if codes.size and (codes.min() < 0 or codes.max() > 1):
        raise DataError("conjunction_moments: records must hold 0/1 codes (a binary domain)")
    d = codes.shape[1]
    if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t <= d:
        raise QueryError(f"conjunction_moments: t must be an integer in 0..{d}, got {t!r}")
    t = int(t)
    X, w = unique_rows(codes, weights)
    out = [np.array([float(w.sum())])]
    if t >= 1:
        out.append(w @ X)
    for m in range(2, t + 1):
        out.append(np.zeros(math.comb(d, m)))
    if t < 2:
        return out
    table = binomial_table(d, t)

    def visit(prefix_len: int, last: int, rank: int, rows: np.ndarray) -> None:
        start = last + 1
        cols = np.arange(start, d)
        if cols.size < 2:
            return
        sub = X[rows][:, start:]
        gram = (sub * w[rows, None]).T @ sub
        jj, ll = np.triu_indices(cols.size, 1)
        s = prefix_len
        out[s + 2][rank + table[cols[jj], s + 1] + table[cols[ll], s + 2]] = gram[jj, ll]
        if s + 3 > t:
            return
        for j in np.flatnonzero(np.diag(gram) > 0):
            col = start + int(j)
            child = rows[X[rows, col] > 0]
            visit(s + 1, col, rank + int(table[col, s + 1]), child)

    visit(0, -1, 0, np.arange(X.shape[0]))
    return out


def histogram_moments(x: np.ndarray, d: int, t: int) -> list[np.ndarray]:
    """:func:`conjunction_moments` of a dense table over ``d`` binary attributes (superset sums)."""
    x = np.asarray(x, dtype=np.float64)
    if x.shape != (2**d,):
        raise QueryError(f"histogram_moments: expected a table of 2**{d} cells, got shape {x.shape}")
    z = superset_sums(x, d)
    return [z[_masks(all_subsets(d, m), d)] for m in range(t + 1)]


def _masks(subsets: np.ndarray, d: int) -> np.ndarray:
    """Cell number of the record with exactly the attributes of each subset set."""
    if subsets.shape[1] == 0:
        return np.zeros(subsets.shape[0], dtype=np.int64)
    return (np.int64(1) << (d - 1 - subsets)).sum(axis=1)


def gather_subsets(per_size: list[np.ndarray], subsets: np.ndarray, d: int) -> np.ndarray:
    """``per_size[|T|][colex_rank(T)]`` for every sub-subset ``T`` of each row, by pattern mask: ``(M, 2^m)``.

    Mask ``v`` selects the positions ``l`` of the row whose bit ``m - 1 - l`` is set; the empty
    sub-subset reads ``per_size[0][0]``.
    """
    subsets = np.asarray(subsets, dtype=np.int64)
    m = subsets.shape[1]
    table = binomial_table(d, max(m, 1))
    out = np.empty((subsets.shape[0], 2**m))
    for mask, pos in enumerate(subset_positions(m)):
        if pos.size == 0:
            out[:, mask] = per_size[0][0]
        else:
            out[:, mask] = per_size[pos.size][table[subsets[:, pos], np.arange(1, pos.size + 1)].sum(axis=1)]
    return out


def pattern_counts(moments: list[np.ndarray], subsets: np.ndarray, d: int) -> np.ndarray:
    """Counts of every pattern of every subset, ``(M, 2^m)``, from the monotone counts.

    ``moments[j]`` must hold every ``j``-subset for ``j <= m`` (colex order): the moments of
    the sub-subsets of each row (:func:`gather_subsets`) are turned into the cells of the
    marginal over the row by :func:`superset_mobius`.
    """
    subsets = np.asarray(subsets, dtype=np.int64)
    return superset_mobius(gather_subsets(moments, subsets, d), subsets.shape[1])


def unused_code_patterns(encoding: BinaryEncoding | None, subsets: np.ndarray) -> np.ndarray | None:
    """Patterns of bit subsets that spell no valid code of some attribute: ``(M, 2^m)`` booleans.

    For each attribute with unused codes, the bits of a subset that belong to it, with the
    pattern's values, must agree with some valid code (``0..size-1``); a table over the
    attribute's ``2^b x 2^b`` (selected bits, values) answers that for all rows at once.
    None when nothing is excluded.
    """
    if encoding is None:
        return None
    subsets = np.asarray(subsets, dtype=np.int64)
    rows, m = subsets.shape
    owner, shift = [], []
    for a in encoding.source.attrs:
        b = len(encoding.bits[a])
        owner += [a] * b
        shift += list(range(b - 1, -1, -1))  # bit j of the attribute is code bit b - 1 - j
    owner_arr = np.array(owner, dtype=object)
    shift_arr = np.array(shift, dtype=np.int64)
    patterns = (np.arange(2**m)[:, None] >> np.arange(m - 1, -1, -1)) & 1  # (2^m, m)
    excluded = np.zeros((rows, 2**m), dtype=bool)
    for a in encoding.source.attrs:
        if not encoding.unused_codes[a]:
            continue
        b = len(encoding.bits[a])
        size = encoding.source.size_of(a)
        codes = np.arange(size)
        select = np.arange(2**b)
        ok = np.zeros((2**b, 2**b), dtype=bool)  # ok[sel, val]: some valid code has those bits
        for sel in select:
            ok[sel, np.unique(codes & sel)] = True
        mine = owner_arr[subsets] == a  # (rows, m)
        if not mine.any():
            continue
        weight = np.where(mine, np.int64(1) << shift_arr[subsets], 0)  # (rows, m)
        sel = weight.sum(axis=1)
        val = weight @ patterns.T  # (rows, 2^m)
        excluded |= ~ok[sel[:, None], val]
    return excluded if excluded.any() else None


# ---- the query ---------------------------------------------------------------------------------------
class ConjunctionCounts(StructuredQuery):
    """Counts of conjunctions of ``size`` attributes of a binary domain (module notes).

    Parameters
    ----------
    domain : Domain
        Every attribute of size 2 (code 1 is "set").
    size : int
        ``m >= 1``: the number of attributes per conjunction (use
        :class:`~dpopt.model.queries.basic.Total` for ``m = 0``).
    literals : bool
        True: every pattern ``v`` of every subset (``2^m`` rows per subset, C order: the cells
        of the marginal over it; Section 4.1's extended universe). False: the all-ones
        pattern only (monotone conjunctions).
    subsets : array of int, shape (M, size), optional
        Attribute positions, increasing along each row, no row twice. Default: every
        ``size``-subset, in colex order (:func:`all_subsets`).
    excluded : bool array, shape (M, 2^size), optional
        Literal form only: patterns no record can match (public, e.g. unused codes of a binary
        encoding); their rows are left out. The all-zeros pattern must be kept.
    """

    is_integer = True

    def __init__(self, domain: Domain, size: int, literals: bool = True, subsets: np.ndarray | None = None,
                 excluded: np.ndarray | None = None) -> None:
        self.domain = check_domain(domain, "ConjunctionCounts")
        bad = [a for a, s in zip(self.domain.attrs, self.domain.sizes) if s != 2]
        if bad:
            raise QueryError(f"ConjunctionCounts needs binary attributes; {bad[:3]} are not: encode them with "
                             "binary_encoding(domain) first")
        d = len(self.domain)
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or not 1 <= size <= d:
            raise QueryError(f"ConjunctionCounts: size must be an integer in 1..{d}, got {size!r} "
                             "(use Total for the number of records)")
        self.size = m = int(size)
        self.literals = bool(literals)
        if subsets is None:
            subs = all_subsets(d, m)
        else:
            subs = np.asarray(subsets)
            if subs.ndim != 2 or subs.shape[1] != m or subs.shape[0] == 0:
                raise QueryError(f"ConjunctionCounts: subsets must have shape (M >= 1, {m}), got {subs.shape}")
            if not np.issubdtype(subs.dtype, np.integer) or subs.min() < 0 or subs.max() >= d:
                raise QueryError(f"ConjunctionCounts: subsets must hold attribute positions in 0..{d - 1}")
            subs = subs.astype(np.int64)
            if m > 1 and np.any(np.diff(subs, axis=1) <= 0):
                raise QueryError("ConjunctionCounts: every subset must list distinct positions in increasing order")
            ranks = colex_rank(subs, d)
            if np.unique(ranks).size != ranks.size:
                raise QueryError("ConjunctionCounts: a subset is listed twice")
        self.subsets = subs
        per = 2**m if self.literals else 1
        keep = np.ones((subs.shape[0], per), dtype=bool)
        if excluded is not None:
            if not self.literals:
                raise QueryError("ConjunctionCounts: excluded patterns apply to the literal form only")
            ex = np.asarray(excluded, dtype=bool)
            if ex.shape != keep.shape:
                raise QueryError(f"ConjunctionCounts: excluded must have shape {keep.shape}, got {ex.shape}")
            if ex[:, 0].any():
                raise QueryError("ConjunctionCounts: the all-zeros pattern cannot be excluded (code 0 is always valid)")
            keep = ~ex
        self.keep = keep
        self.keep.setflags(write=False)
        self._rows = np.flatnonzero(keep.ravel())

    # ---- shape and support ------------------------------------------------------------------------
    @property
    def name(self) -> str:
        kind = "literal" if self.literals else "monotone"
        return f"ConjunctionCounts({kind}, size {self.size}, {self.subsets.shape[0]} subsets)"

    @property
    def num_rows(self) -> int:
        return int(self._rows.size)

    @property
    def num_subsets(self) -> int:
        return int(self.subsets.shape[0])

    @property
    def depends_on(self) -> tuple[str, ...]:
        used = np.unique(self.subsets)
        return tuple(self.domain.attrs[i] for i in used)

    def _restrict_to(self, attrs: tuple[str, ...]) -> "ConjunctionCounts":
        position = {a: i for i, a in enumerate(attrs)}
        remap = np.array([position.get(a, -1) for a in self.domain.attrs], dtype=np.int64)
        excluded = ~self.keep if self.literals and not self.keep.all() else None
        return ConjunctionCounts(self.domain.project(attrs), self.size, self.literals, remap[self.subsets], excluded)

    # ---- answers -----------------------------------------------------------------------------------
    def rows_from_moments(self, moments: list[np.ndarray]) -> np.ndarray:
        """The answers from the monotone counts of :func:`conjunction_moments` (up to ``size``)."""
        d = len(self.domain)
        if len(moments) <= self.size:
            raise QueryError(f"{self.name}: moments up to size {self.size} are needed, got {len(moments) - 1}")
        if self.literals:
            return pattern_counts(moments, self.subsets, d).ravel()[self._rows]
        return np.asarray(moments[self.size])[colex_rank(self.subsets, d)]

    def answer(self, data) -> np.ndarray:
        """True answers from the records (no histogram: any number of attributes)."""
        if data.domain != self.domain:
            raise QueryError(f"{self.name}: the data's domain {data.domain} differs from {self.domain}")
        return self.rows_from_moments(conjunction_moments(data.codes, data.weights, self.size))

    def _matvec(self, x: np.ndarray) -> np.ndarray:
        return self.rows_from_moments(histogram_moments(x, len(self.domain), self.size))

    def _rmatvec(self, y: np.ndarray) -> np.ndarray:
        d = len(self.domain)
        self.domain.require_dense("the transpose of conjunction counts")
        full = np.zeros(self.keep.size)
        full[self._rows] = np.asarray(y, dtype=np.float64)
        g = np.zeros(2**d)
        if self.literals:
            # rows = Mobius(gathered moments); moments = superset sums of x at the sub-subset masks.
            back = _butterfly(full.reshape(self.keep.shape), self.size, -1.0, False)  # Mobius transposed
            for mask, pos in enumerate(subset_positions(self.size)):
                np.add.at(g, _masks(self.subsets[:, pos], d), back[:, mask])
        else:
            np.add.at(g, _masks(self.subsets, d), full)
        return _butterfly(g, d, 1.0, False)  # superset sums transposed

    def _entries(self, cells: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row, position in ``cells``) of every non-zero (all ones) in the columns at ``cells``."""
        d, m = len(self.domain), self.size
        bits = (cells[:, None] >> (d - 1 - self.subsets.ravel()[None, :])) & 1
        pattern = bits.reshape(cells.size, self.num_subsets, m) @ (np.int64(1) << np.arange(m - 1, -1, -1))
        position = np.full(self.keep.size, -1, dtype=np.int64)
        position[self._rows] = np.arange(self._rows.size)
        if self.literals:  # every cell has exactly one pattern on each subset
            rows = position[np.arange(self.num_subsets)[None, :] * 2**m + pattern]
        else:
            rows = np.where(pattern == 2**m - 1, position[np.arange(self.num_subsets)][None, :], -1)
        cols = np.broadcast_to(np.arange(cells.size)[:, None], rows.shape)
        hit = rows >= 0
        return rows[hit], cols[hit]

    def columns(self, cells: np.ndarray) -> sp.csc_matrix:
        """The columns at ``cells`` (e.g. for NNLS working sets), without the whole matrix."""
        cells = np.asarray(cells, dtype=np.int64).ravel()
        if cells.size and (cells.min() < 0 or cells.max() >= 2 ** len(self.domain)):
            raise QueryError(f"{self.name}.columns: cell numbers must lie in 0..2**{len(self.domain)} - 1")
        rows, cols = self._entries(cells)
        return sp.csc_matrix((np.ones(rows.size), (rows, cols)), shape=(self.num_rows, cells.size))

    def to_sparse(self) -> sp.csr_matrix:
        n = self.domain.require_dense("the conjunction-count matrix")
        return sp.csr_matrix(self.columns(np.arange(n, dtype=np.int64)))

    # ---- norms (module notes) -----------------------------------------------------------------------
    def _max_column_norm_power(self, p: float) -> float:
        return float(self.num_subsets)

    def _support_norm_powers(self, p: float) -> SupportArray:
        if self.literals and self.keep.all():
            return (), np.asarray(float(self.num_subsets))
        return self._abs_power_rmatvec(np.ones(self.num_rows), p)

    # ---- labels -------------------------------------------------------------------------------------
    def row_labels(self) -> list[str]:
        names = np.array(self.domain.attrs, dtype=StringDType())
        m, per = self.size, (2**self.size if self.literals else 1)
        labels = None
        for l in range(m):
            name = names[self.subsets[:, l]][:, None]
            if self.literals:
                bit = ((np.arange(per) >> (m - 1 - l)) & 1).astype(str).astype(StringDType())[None, :]
            else:
                bit = np.array(["1"], dtype=StringDType())[None, :]
            term = np.strings.add(np.strings.add(name, "="), bit)
            labels = term if labels is None else np.strings.add(np.strings.add(labels, ", "), term)
        return np.broadcast_to(labels, self.keep.shape).ravel()[self._rows].tolist()
