"""Range queries: counts in axis-aligned boxes of ordered attributes.

A box over ``d`` attributes counts the cells with ``low_j <= code_j <= high_j`` for every
``j``. All boxes are answered from one marginal: with the zero-padded prefix-sum tensor
``P`` of the marginal (cumulative sums along each axis), a box is the inclusion--exclusion
sum over its ``2^d`` corners, ``sum_c (-1)^{d - |c|} P[corner_c]``. The transpose scatters
each answer with the same signs into a difference array and undoes it with reverse
cumulative sums.
"""

from __future__ import annotations

from itertools import product
from typing import Iterable

import numpy as np
import scipy.sparse as sp
from numpy.dtypes import StringDType

from dpopt.errors import QueryError
from dpopt.model.domain import Domain
from dpopt.model.queries._common import (
    SupportArray,
    StructuredQuery,
    check_domain,
    expand,
    marginalize,
    projection_matrix,
)

#: AllRanges refuses attributes with more ranges than this (use Prefix or random_ranges).
MAX_ALL_RANGES = 10**7


def _as_bounds(values: object, count_dims: int, name: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim == 1 and count_dims == 1:
        arr = arr.reshape(-1, 1)
    if arr.ndim != 2 or arr.shape[1] != count_dims:
        raise QueryError(
            f"RangeQueries: {name} must have shape (count, {count_dims}), got {arr.shape}"
        )
    if arr.dtype == bool or not (
        np.issubdtype(arr.dtype, np.integer)
        or (np.issubdtype(arr.dtype, np.floating) and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)))
    ):
        raise QueryError(f"RangeQueries: {name} must be integer codes, got dtype {arr.dtype}")
    return arr.astype(np.int64)


class RangeQueries(StructuredQuery):
    """A batch of axis-aligned boxes over some attributes; one count per box.

    Parameters
    ----------
    domain : Domain
    attrs : str or iterable of str
        The ranged attributes (ordered by their codes).
    lows, highs : array_like of int, shape (count, len(attrs)) or (count,) for one attribute
        Inclusive bounds per box and attribute, as codes, columns in the order of ``attrs``.

    Notes
    -----
    ``attrs`` and the bound columns are stored in domain order. Entries are 0/1, so the
    sensitivity (L1 and squared L2) is the largest number of boxes covering one cell.
    """

    is_integer = True

    def __init__(self, domain: Domain, attrs: str | Iterable[str], lows: object, highs: object) -> None:
        self.domain = check_domain(domain, "RangeQueries")
        if isinstance(attrs, str):
            attrs = (attrs,)
        given = self.domain.check_attrs(attrs)
        if not given:
            raise QueryError("RangeQueries: attrs is empty")
        lo = _as_bounds(lows, len(given), "lows")
        hi = _as_bounds(highs, len(given), "highs")
        if lo.shape != hi.shape:
            raise QueryError(f"RangeQueries: lows has shape {lo.shape} but highs {hi.shape}")
        if lo.shape[0] == 0:
            raise QueryError("RangeQueries: no boxes given (lows is empty)")
        for j, a in enumerate(given):
            size = self.domain.size_of(a)
            for name, bad in (
                ("low > high", lo[:, j] > hi[:, j]),
                ("low < 0", lo[:, j] < 0),
                (f"high > {size - 1} (the last code)", hi[:, j] > size - 1),
            ):
                if bad.any():
                    i = int(np.argmax(bad))
                    raise QueryError(
                        f"RangeQueries: box {i} on attribute {a!r} has {name}: "
                        f"[{int(lo[i, j])}, {int(hi[i, j])}]"
                    )
        self.attrs: tuple[str, ...] = self.domain.canonical(given)
        perm = [given.index(a) for a in self.attrs]
        self.lows = lo[:, perm]
        self.highs = hi[:, perm]
        self.lows.setflags(write=False)
        self.highs.setflags(write=False)
        self.range_domain = self.domain.project(self.attrs)

    @property
    def num_rows(self) -> int:
        return self.lows.shape[0]

    @property
    def depends_on(self) -> tuple[str, ...]:
        return self.attrs

    def _restrict_to(self, attrs: tuple[str, ...]) -> "RangeQueries":
        return RangeQueries(self.domain.project(attrs), self.attrs, self.lows, self.highs)

    # ---- products over the marginal ---------------------------------------------------
    def _corners(self):
        """``(sign, index)`` for each of the ``2^d`` corners, vectorised over the boxes."""
        d = len(self.attrs)
        for corner in product((0, 1), repeat=d):
            idx = tuple(
                self.highs[:, j] + 1 if c else self.lows[:, j] for j, c in enumerate(corner)
            )
            yield (-1) ** (d - sum(corner)), idx

    def answer_marginal(self, marginal: np.ndarray) -> np.ndarray:
        """Box counts from the marginal over :attr:`attrs` (flat, C order)."""
        t = np.asarray(marginal).reshape(self.range_domain.shape)
        prefix = np.zeros(tuple(s + 1 for s in t.shape), dtype=np.result_type(t.dtype, np.int64))
        inner = t
        for ax in range(t.ndim):
            inner = np.cumsum(inner, axis=ax)
        prefix[(slice(1, None),) * t.ndim] = inner
        out = np.zeros(self.num_rows, dtype=prefix.dtype)
        for sign, idx in self._corners():
            out += sign * prefix[idx]
        return out

    def transpose_marginal(self, y: np.ndarray) -> np.ndarray:
        """``Q_S^T y`` over the marginal's cells (flat, C order)."""
        y = np.asarray(y)
        shape = self.range_domain.shape
        diff = np.zeros(tuple(s + 1 for s in shape), dtype=np.result_type(y.dtype, np.int64))
        for sign, idx in self._corners():
            np.add.at(diff, idx, sign * y)
        for ax in range(len(shape)):
            diff = np.flip(np.cumsum(np.flip(diff, axis=ax), axis=ax), axis=ax)
        return diff[(slice(1, None),) * len(shape)].reshape(-1)

    def _matvec(self, x: np.ndarray) -> np.ndarray:
        return self.answer_marginal(marginalize(x, self.domain, self.attrs))

    def _rmatvec(self, y: np.ndarray) -> np.ndarray:
        return expand(self.transpose_marginal(y), self.domain, self.attrs)

    def to_sparse(self) -> sp.csr_matrix:
        shape = self.range_domain.shape
        d = len(shape)
        inside = np.ones((self.num_rows,) + (1,) * d, dtype=bool)
        for j, s in enumerate(shape):
            codes = np.arange(s).reshape((1,) + tuple(s if i == j else 1 for i in range(d)))
            lo = self.lows[:, j].reshape((-1,) + (1,) * d)
            hi = self.highs[:, j].reshape((-1,) + (1,) * d)
            inside = inside & (codes >= lo) & (codes <= hi)
        on_marginal = sp.csr_matrix(
            np.broadcast_to(inside, (self.num_rows,) + shape).reshape(self.num_rows, -1),
            dtype=np.float64,
        )
        return sp.csr_matrix(on_marginal @ projection_matrix(self.domain, self.attrs))

    def _abs_power_rmatvec(self, v: np.ndarray, p: float) -> SupportArray:
        # Entries are 0/1, so |Q|^p = Q.
        out = self.transpose_marginal(np.asarray(v, dtype=np.float64))
        return self.attrs, out.reshape(self.range_domain.shape)

    # ---- description ------------------------------------------------------------------
    def row_labels(self) -> list[str]:
        parts = None
        for j, a in enumerate(self.attrs):
            labels = np.array([str(v) for v in self.domain.labels_of(a)], dtype=StringDType())
            text = np.strings.add(
                np.strings.add(np.strings.add(f"{a} in [", labels[self.lows[:, j]]), ", "),
                np.strings.add(labels[self.highs[:, j]], "]"),
            )
            parts = text if parts is None else np.strings.add(np.strings.add(parts, ", "), text)
        return np.strings.add("range ", parts).tolist()


class Prefix(RangeQueries):
    """Every prefix ``[0, h]`` of one attribute, ``h = 0 .. size - 1`` (a CDF workload)."""

    def __init__(self, domain: Domain, attr: str) -> None:
        check_domain(domain, "Prefix")
        if not isinstance(attr, str):
            raise QueryError(f"Prefix: attr must be one attribute name, got {attr!r}")
        size = domain.size_of(attr)
        super().__init__(domain, attr, np.zeros(size, dtype=np.int64), np.arange(size))


class AllRanges(RangeQueries):
    """Every range ``[l, h]``, ``l <= h``, of one attribute, ordered by ``l`` then ``h``.

    ``size (size + 1) / 2`` rows: meant for small attributes (at most
    :data:`MAX_ALL_RANGES` rows).
    """

    def __init__(self, domain: Domain, attr: str) -> None:
        check_domain(domain, "AllRanges")
        if not isinstance(attr, str):
            raise QueryError(f"AllRanges: attr must be one attribute name, got {attr!r}")
        size = domain.size_of(attr)
        rows = size * (size + 1) // 2
        if rows > MAX_ALL_RANGES:
            raise QueryError(
                f"AllRanges: attribute {attr!r} with {size} values has {rows} ranges, above "
                f"{MAX_ALL_RANGES}; use Prefix or random_ranges"
            )
        lo, hi = np.triu_indices(size)
        super().__init__(domain, attr, lo, hi)


def random_ranges(
    domain: Domain, attrs: str | Iterable[str], count: int, rng: np.random.Generator
) -> RangeQueries:
    """``count`` random boxes: per attribute, the two ends drawn uniformly and sorted.

    Workload generation is public (it does not touch the data), so an ordinary
    :class:`numpy.random.Generator` is the right source; pass a seeded one for
    reproducible workloads.
    """
    check_domain(domain, "random_ranges")
    if not isinstance(rng, np.random.Generator):
        raise QueryError(f"random_ranges: rng must be a numpy.random.Generator, got {type(rng).__name__}")
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 1:
        raise QueryError(f"random_ranges: count must be an integer >= 1, got {count!r}")
    if isinstance(attrs, str):
        attrs = (attrs,)
    attrs = domain.check_attrs(attrs)
    if not attrs:
        raise QueryError("random_ranges: attrs is empty")
    ends = [rng.integers(0, domain.size_of(a), size=(2, int(count))) for a in attrs]
    lows = np.stack([e.min(axis=0) for e in ends], axis=1)
    highs = np.stack([e.max(axis=0) for e in ends], axis=1)
    return RangeQueries(domain, attrs, lows, highs)
