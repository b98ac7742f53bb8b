"""Machinery shared by the structured linear queries.

Every query of this package is a :class:`StructuredQuery`: a :class:`LinearQuery` that knows
which attributes it depends on (``depends_on``), can be re-expressed over any projected
domain that contains them (``restrict_to``), and reports its column norms compactly as a
function of the cells of a small marginal (a *support array*, below). The compact form is
what lets :class:`~dpopt.model.queries.combine.Stack` compute an exact sensitivity (the
column norms of the parts add up cell by cell) on domains far too large to hold densely.

A support array is a pair ``(attrs, values)``: ``attrs`` a tuple of attribute names in
domain order and ``values`` an array of shape ``domain.project(attrs).shape`` (a 0-d array
when ``attrs`` is empty, i.e. the same value for every column).
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
import scipy.sparse as sp
from numpy.dtypes import StringDType

from dpopt.errors import QueryError
from dpopt.model.domain import Domain
from dpopt.model.queries.base import LinearQuery, column_norms_of_matrix

SupportArray = tuple[tuple[str, ...], np.ndarray]


# ---- dense helpers over a domain ---------------------------------------------------------
def check_domain(domain: object, who: str) -> Domain:
    """``domain`` itself, or a :class:`QueryError` naming the caller."""
    if not isinstance(domain, Domain):
        raise QueryError(f"{who}: expected a Domain, got {type(domain).__name__}")
    return domain


def lift_shape(domain: Domain, attrs: Iterable[str]) -> tuple[int, ...]:
    """The shape of a marginal over ``attrs`` broadcast against ``domain.shape`` (1 elsewhere)."""
    keep = set(attrs)
    return tuple(s if a in keep else 1 for a, s in zip(domain.attrs, domain.sizes))


def marginalize(x: np.ndarray, domain: Domain, attrs: Sequence[str]) -> np.ndarray:
    """Counts of a dense vector over ``attrs`` (given in domain order), flat in C order."""
    keep = set(domain.axes(attrs))
    # Merge runs of neighbouring axes that are all kept or all summed: fewer, longer axes
    # make the reduction much faster (e.g. a 3-way marginal of 16 binary attributes).
    shape: list[int] = []
    kept: list[bool] = []
    for i, s in enumerate(domain.sizes):
        if kept and kept[-1] == (i in keep):
            shape[-1] *= s
        else:
            shape.append(s)
            kept.append(i in keep)
    t = np.asarray(x).reshape(shape)
    if all(kept):
        return np.reshape(t, -1).copy()
    if len(shape) <= 52:  # einsum's limit on subscripts; it reduces strided axes faster than sum
        return np.einsum(t, list(range(len(shape))), [i for i, k in enumerate(kept) if k]).reshape(-1)
    return t.sum(axis=tuple(i for i, k in enumerate(kept) if not k)).reshape(-1)


def expand(values: np.ndarray, domain: Domain, attrs: Sequence[str]) -> np.ndarray:
    """The transpose of :func:`marginalize`: copy each marginal cell to the cells it sums."""
    shaped = np.asarray(values).reshape(lift_shape(domain, attrs))
    return np.broadcast_to(shaped, domain.shape).reshape(-1).copy()


def projection_matrix(domain: Domain, attrs: Sequence[str]) -> sp.csr_matrix:
    """The 0/1 matrix ``M_S`` (``|S| cells x n``) with ``M_S x`` the marginal over ``attrs``."""
    n = domain.require_dense("the projection matrix of a marginal")
    sub_size = 1
    for a in attrs:
        sub_size *= domain.size_of(a)
    # The projected cell of every cell: an arange over the marginal broadcast over the rest.
    rows = np.broadcast_to(
        np.arange(sub_size, dtype=np.int64).reshape(lift_shape(domain, attrs)), domain.shape
    ).reshape(-1)
    return sp.csr_matrix(
        (np.ones(n, dtype=np.float64), (rows, np.arange(n, dtype=np.int64))), shape=(sub_size, n)
    )


def smallest_attr(domain: Domain) -> str:
    """The attribute with the fewest values (the first such): the cheapest marginal to read."""
    return domain.attrs[int(np.argmin(domain.sizes))]


# ---- labels -------------------------------------------------------------------------------
def product_labels(parts: Sequence[Sequence[str]], sep: str) -> list[str]:
    """Labels of the C-ordered product of label lists, joined by ``sep`` (vectorised)."""
    if not parts:
        return [""]
    out = None
    d = len(parts)
    for i, labels in enumerate(parts):
        shape = [1] * d
        shape[i] = len(labels)
        arr = np.array(list(labels), dtype=StringDType()).reshape(shape)
        out = arr if out is None else np.strings.add(np.strings.add(out, sep), arr)
    return np.broadcast_to(out, [len(p) for p in parts]).reshape(-1).tolist()


def cell_labels(domain: Domain, attrs: Sequence[str]) -> list[str]:
    """``"sex=F, age=2"`` for every cell of ``domain.project(attrs)``, in C order."""
    return product_labels(
        [[f"{a}={v}" for v in domain.labels_of(a)] for a in attrs], ", "
    )


# ---- support arrays -----------------------------------------------------------------------
def check_power(p: object) -> float:
    """A positive real exponent ``p`` for column norm powers."""
    if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)) or not p > 0:
        raise QueryError(f"column norm power p must be a positive number, got p={p!r}")
    return float(p)


def broadcast_support(domain: Domain, arr: SupportArray, target: Sequence[str]) -> np.ndarray:
    """Reshape a support array so that it broadcasts over the marginal on ``target``."""
    attrs, values = arr
    keep = set(attrs)
    shape = tuple(domain.size_of(a) if a in keep else 1 for a in target)
    return np.asarray(values, dtype=np.float64).reshape(shape)


def sum_support_arrays(domain: Domain, arrays: Sequence[SupportArray]) -> SupportArray:
    """The cell-by-cell sum of support arrays, over the union of their attributes."""
    union = domain.canonical({a for attrs, _ in arrays for a in attrs})
    total = np.zeros(tuple(domain.size_of(a) for a in union))
    for arr in arrays:
        total = total + broadcast_support(domain, arr, union)
    return union, total


def full_column_vector(domain: Domain, arr: SupportArray) -> float | np.ndarray:
    """A support array as the per-column vector over the whole domain (a float if constant)."""
    attrs, values = arr
    if not attrs:
        return float(values)
    domain.require_dense("per-column norms over the whole domain")
    return np.broadcast_to(broadcast_support(domain, arr, domain.attrs), domain.shape).reshape(-1).copy()


def depends_on(query: LinearQuery) -> tuple[str, ...]:
    """Attributes a query depends on (its ``support`` for queries from elsewhere)."""
    if isinstance(query, StructuredQuery):
        return query.depends_on
    return tuple(query.support)


def support_norm_powers(query: LinearQuery, p: float) -> SupportArray:
    """``sum_i |Q_ij|^p`` of any query as a support array."""
    if isinstance(query, StructuredQuery):
        return query._support_norm_powers(p)
    powers = query.column_norm_powers(p)
    if np.ndim(powers) == 0:
        return (), np.asarray(float(powers))
    return query.domain.attrs, np.asarray(powers, dtype=np.float64).reshape(query.domain.shape)


def abs_power_rmatvec(query: LinearQuery, v: np.ndarray, p: float) -> SupportArray:
    """``(|Q|^p)^T v`` (entrywise power) of any query as a support array."""
    if isinstance(query, StructuredQuery):
        return query._abs_power_rmatvec(v, p)
    mat = abs(sp.csr_matrix(query.to_sparse(), dtype=np.float64)).power(p)
    return query.domain.attrs, np.asarray(mat.T @ v).reshape(query.domain.shape)


def max_column_norm_power(query: LinearQuery, p: float) -> float:
    """``max_j sum_i |Q_ij|^p`` of any query."""
    if isinstance(query, StructuredQuery):
        return query._max_column_norm_power(p)
    return float(np.max(query.column_norm_powers(p)))


def restrict_query(query: LinearQuery, attrs: Iterable[str]) -> LinearQuery:
    """Any query re-expressed over ``query.domain.project(attrs)`` (attrs must cover its support)."""
    attrs = query.domain.canonical(attrs)
    if attrs == query.domain.attrs:
        return query
    if isinstance(query, StructuredQuery):
        return query.restrict_to(attrs)
    from dpopt.model.queries.lifted import Lifted

    restricted = query.restrict()
    if restricted.domain.attrs == attrs:
        return restricted
    if set(restricted.domain.attrs) <= set(attrs):
        return Lifted(restricted, query.domain.project(attrs))
    raise QueryError(
        f"{query.name} depends on {list(restricted.domain.attrs)}, not all within {list(attrs)}"
    )


class StructuredQuery(LinearQuery):
    """A :class:`LinearQuery` with a known dependency set and compact column norms.

    Subclasses implement, besides the :class:`LinearQuery` methods, :attr:`depends_on` (when
    not every attribute), :meth:`_restrict_to` (when :attr:`depends_on` is not every
    attribute) and :meth:`_abs_power_rmatvec`; they override :meth:`_support_norm_powers`
    and :meth:`_max_column_norm_power` when a closed form is cheaper.
    """

    # ---- support ---------------------------------------------------------------------
    @property
    def depends_on(self) -> tuple[str, ...]:
        """Attributes whose values change some answer (domain order; may be empty)."""
        return self.domain.attrs

    @property
    def support(self) -> tuple[str, ...]:
        """:attr:`depends_on`, or the smallest attribute when the query depends on none.

        A query that depends on no attribute (a total) is still answered from a marginal:
        the cheapest one.
        """
        attrs = self.depends_on
        return attrs if attrs else (smallest_attr(self.domain),)

    def restrict(self) -> LinearQuery:
        """The same query over ``domain.project(support)``: ``Q = Q_S M_S``."""
        return self.restrict_to(self.support)

    def restrict_to(self, attrs: Iterable[str]) -> LinearQuery:
        """The same query over ``domain.project(attrs)`` for any ``attrs`` covering :attr:`depends_on`."""
        attrs = self.domain.canonical(attrs)
        missing = [a for a in self.depends_on if a not in attrs]
        if missing:
            raise QueryError(f"{self.name} depends on {missing}, which are not among {list(attrs)}")
        if not attrs:
            raise QueryError(f"{self.name}: cannot restrict a query to no attributes")
        if attrs == self.domain.attrs:
            return self
        return self._restrict_to(attrs)

    def _restrict_to(self, attrs: tuple[str, ...]) -> LinearQuery:
        raise QueryError(f"{self.name} cannot be restricted to {list(attrs)}")  # pragma: no cover

    # ---- column norms ----------------------------------------------------------------
    def _abs_power_rmatvec(self, v: np.ndarray, p: float) -> SupportArray:
        """``(|Q|^p)^T v`` with ``|Q|^p`` the entrywise power, as a support array.

        The generic form goes through the explicit matrix of the restricted query.
        """
        restricted = self.restrict()
        mat = abs(sp.csr_matrix(restricted.to_sparse(), dtype=np.float64)).power(p)
        out = np.asarray(mat.T @ np.asarray(v, dtype=np.float64))
        return restricted.domain.attrs, out.reshape(restricted.domain.shape)

    def _support_norm_powers(self, p: float) -> SupportArray:
        """``sum_i |Q_ij|^p`` per column, as a support array."""
        return self._abs_power_rmatvec(np.ones(self.num_rows), p)

    def _max_column_norm_power(self, p: float) -> float:
        return float(np.max(self._support_norm_powers(p)[1]))

    def column_norm_powers(self, p: float) -> float | np.ndarray:
        """``sum_i |Q_ij|^p`` for every column ``j`` (a float when all columns agree)."""
        return full_column_vector(self.domain, self._support_norm_powers(check_power(p)))

    def sensitivity(self, p: int = 1) -> float:
        """L_p sensitivity (p = 1 or 2): the largest L_p column norm, without a dense vector."""
        if p not in (1, 2):
            raise QueryError(f"sensitivity is defined here for p = 1 or 2, got p={p!r}")
        worst = self._max_column_norm_power(float(p))
        return worst if p == 1 else float(np.sqrt(worst))

    def squared_l2_sensitivity(self) -> float:
        """The largest ``sum_i Q_ij^2``, without a dense vector."""
        return self._max_column_norm_power(2.0)


def explicit_norm_powers(matrix: sp.spmatrix, domain: Domain, p: float) -> SupportArray:
    """Column norm powers of an explicit matrix over ``domain`` as a support array."""
    return domain.attrs, column_norms_of_matrix(sp.csr_matrix(matrix, dtype=np.float64), p).reshape(
        domain.shape
    )
