"""Kronecker products of per-attribute (or per-attribute-group) queries.

``Q = A_1 ⊗ A_2 ⊗ ... ⊗ A_F`` where ``A_f`` acts on the cells of the ``f``-th group of
attributes and the groups cover the domain in order. ``Q x`` reshapes ``x`` into a tensor
with one axis per group and applies each ``A_f`` along its axis, never forming ``Q``. The
entrywise power of a Kronecker product is the product of the powers, so the column norm
powers are the outer product of the factors' column norm powers and the sensitivity is the
product of the factors' largest column norms (exact: all terms are non-negative).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce
from typing import Callable, Iterable, Sequence

import numpy as np
import scipy.sparse as sp

from dpopt.errors import QueryError
from dpopt.model.domain import Domain
from dpopt.model.queries._common import SupportArray, StructuredQuery, product_labels
from dpopt.model.queries.base import LinearQuery, column_norms_of_matrix


@dataclass(frozen=True)
class KroneckerFactor:
    """One factor: a matrix over the cells of an attribute group (C order over ``attrs``).

    A factor with no attributes is a single column (a constant factor folded away by
    :meth:`Kronecker.restrict`).
    """

    attrs: tuple[str, ...]
    matrix: sp.csr_matrix
    labels: Callable[[], list[str]]
    integer: bool


def _columns_equal(matrix: sp.csr_matrix) -> bool:
    """True when every column of ``matrix`` is the same vector."""
    if matrix.shape[1] <= 1:
        return True
    hi = matrix.max(axis=1).toarray().ravel()
    lo = matrix.min(axis=1).toarray().ravel()
    return bool(np.array_equal(hi, lo))


def apply_along(matrix: sp.spmatrix, tensor: np.ndarray, axis: int) -> np.ndarray:
    """Multiply ``matrix`` into ``tensor`` along ``axis`` (the mode-``axis`` product)."""
    moved = np.moveaxis(tensor, axis, 0)
    rest = moved.shape[1:]
    out = np.asarray(matrix @ moved.reshape(moved.shape[0], -1))
    return np.moveaxis(out.reshape((matrix.shape[0],) + rest), 0, axis)


def _explicit_matrix(matrix: object, who: str) -> tuple[sp.csr_matrix, bool]:
    if sp.issparse(matrix):
        mat = sp.csr_matrix(matrix)
    else:
        arr = np.asarray(matrix)
        if arr.ndim != 2 or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
            raise QueryError(f"{who}: expected a 2-D numeric matrix, got shape {arr.shape} dtype {arr.dtype}")
        mat = sp.csr_matrix(arr)
    if not np.issubdtype(mat.dtype, np.number) and mat.dtype != bool:
        raise QueryError(f"{who}: the matrix is not numeric (dtype {mat.dtype})")
    mat = sp.csr_matrix(mat, dtype=np.float64)
    if not np.all(np.isfinite(mat.data)):
        raise QueryError(f"{who}: the matrix has non-finite entries")
    if mat.shape[0] == 0:
        raise QueryError(f"{who}: the matrix has no rows")
    return mat, bool(np.all(mat.data == np.round(mat.data)))


class Kronecker(StructuredQuery):
    """The Kronecker product of queries over consecutive attribute groups.

    Parameters
    ----------
    factors : sequence
        Each a :class:`LinearQuery` over a sub-domain (one attribute or a group of
        consecutive attributes), or a pair ``(matrix, attrs)`` with an explicit small
        matrix (dense or scipy sparse) whose columns are the cells of ``attrs`` in C order.
        The groups, concatenated, must be the domain's attributes in order.
    domain : Domain, optional
        The domain of the product. Without it the domain is the product of the factors'
        domains, and an explicit matrix may name a single attribute (its size is the
        number of columns).

    Notes
    -----
    Rows follow C order over the factors' rows (the row order of ``numpy.kron``).
    """

    def __init__(self, factors: Sequence, domain: Domain | None = None) -> None:
        if isinstance(factors, LinearQuery) or not isinstance(factors, Iterable):
            raise QueryError("Kronecker: factors must be a list of queries or (matrix, attrs) pairs")
        factors = list(factors)
        if not factors:
            raise QueryError("Kronecker: factors is empty")
        if domain is not None and not isinstance(domain, Domain):
            raise QueryError(f"Kronecker: domain must be a Domain, got {type(domain).__name__}")
        parsed: list[KroneckerFactor] = []
        sizes: list[int] = []
        labels: dict = {}
        for i, item in enumerate(factors):
            who = f"Kronecker: factor #{i}"
            if isinstance(item, LinearQuery):
                attrs = item.domain.attrs
                if domain is not None:
                    domain.check_attrs(attrs)
                    if domain.project(attrs) != item.domain:
                        raise QueryError(
                            f"{who} is over {item.domain}, not the sub-domain {domain.project(attrs)}"
                        )
                sizes.extend(item.domain.sizes)
                labels.update(item.domain.labels)
                parsed.append(
                    KroneckerFactor(
                        attrs,
                        sp.csr_matrix(item.to_sparse(), dtype=np.float64),
                        item.row_labels,
                        bool(item.is_integer),
                    )
                )
                continue
            if not (isinstance(item, tuple) and len(item) == 2):
                raise QueryError(
                    f"{who}: expected a LinearQuery or a (matrix, attrs) pair, got {type(item).__name__}"
                )
            matrix, attrs = item
            attrs = (attrs,) if isinstance(attrs, str) else tuple(attrs)
            mat, integer = _explicit_matrix(matrix, who)
            if domain is not None:
                domain.check_attrs(attrs)
                group = [domain.size_of(a) for a in attrs]
            elif len(attrs) == 1:
                group = [mat.shape[1]]
            elif not attrs:
                group = []
            else:
                raise QueryError(
                    f"{who}: an explicit matrix over several attributes {list(attrs)} needs the domain"
                )
            width = int(np.prod(group)) if group else 1
            if mat.shape[1] != width:
                raise QueryError(
                    f"{who}: the matrix has {mat.shape[1]} columns but {list(attrs)} have {width} cells"
                )
            sizes.extend(group)
            name = ",".join(attrs)
            parsed.append(
                KroneckerFactor(
                    attrs, mat, (lambda m=mat.shape[0], name=name: [f"{name} row {r}" for r in range(m)]), integer
                )
            )
        covered = tuple(a for f in parsed for a in f.attrs)
        if domain is None:
            domain = Domain(covered, tuple(sizes), labels)
        elif covered != domain.attrs:
            raise QueryError(
                f"Kronecker: the factors cover {list(covered)} but the domain's attributes are "
                f"{list(domain.attrs)} (all of them, in order)"
            )
        self._setup(domain, parsed)

    @classmethod
    def _from_factors(cls, domain: Domain, factors: list[KroneckerFactor]) -> "Kronecker":
        obj = cls.__new__(cls)
        obj._setup(domain, factors)
        return obj

    def _setup(self, domain: Domain, factors: list[KroneckerFactor]) -> None:
        self.domain = domain
        self.factors: tuple[KroneckerFactor, ...] = tuple(factors)
        self.is_integer = all(f.integer for f in factors)
        self._widths = tuple(f.matrix.shape[1] for f in factors)
        self._heights = tuple(f.matrix.shape[0] for f in factors)
        self._constant = tuple(_columns_equal(f.matrix) for f in factors)

    @property
    def name(self) -> str:
        return "Kronecker(" + " ⊗ ".join(",".join(f.attrs) or "·" for f in self.factors) + ")"

    @property
    def num_rows(self) -> int:
        return int(np.prod(self._heights, dtype=object))

    @property
    def depends_on(self) -> tuple[str, ...]:
        return tuple(a for f, c in zip(self.factors, self._constant) if not c for a in f.attrs)

    def _restrict_to(self, attrs: tuple[str, ...]) -> "Kronecker":
        keep = set(attrs)
        new = []
        for f in self.factors:
            kept = tuple(a for a in f.attrs if a in keep)
            if kept == f.attrs:
                new.append(f)
                continue
            # A constant factor (its columns all equal c): c times a row of ones over what is kept.
            width = int(np.prod([self.domain.size_of(a) for a in kept])) if kept else 1
            column = f.matrix[:, :1].toarray()
            new.append(
                KroneckerFactor(kept, sp.csr_matrix(column @ np.ones((1, width))), f.labels, f.integer)
            )
        return Kronecker._from_factors(self.domain.project(attrs), new)

    # ---- products ---------------------------------------------------------------------
    def _matvec(self, x: np.ndarray) -> np.ndarray:
        t = np.asarray(x).reshape(self._widths)
        for axis, f in enumerate(self.factors):
            t = apply_along(f.matrix, t, axis)
        return t.reshape(-1)

    def _rmatvec(self, y: np.ndarray) -> np.ndarray:
        t = np.asarray(y).reshape(self._heights)
        for axis, f in enumerate(self.factors):
            t = apply_along(f.matrix.T, t, axis)
        return t.reshape(-1)

    def to_sparse(self) -> sp.csr_matrix:
        self.domain.require_dense("the Kronecker matrix")
        return sp.csr_matrix(reduce(lambda a, b: sp.kron(a, b, format="csr"), [f.matrix for f in self.factors]))

    # ---- norms ------------------------------------------------------------------------
    def _factor_norms(self, p: float) -> list[np.ndarray]:
        return [column_norms_of_matrix(f.matrix, p) for f in self.factors]

    def _support_norm_powers(self, p: float) -> SupportArray:
        scalar = 1.0
        attrs: list[str] = []
        arrays = []
        for f, col in zip(self.factors, self._factor_norms(p)):
            if np.all(col == col[0]):
                scalar *= float(col[0])
            else:
                attrs.extend(f.attrs)
                arrays.append(col.reshape([self.domain.size_of(a) for a in f.attrs]))
        if not arrays:
            return (), np.asarray(scalar)
        return tuple(attrs), scalar * reduce(np.multiply.outer, arrays)

    def _max_column_norm_power(self, p: float) -> float:
        return float(np.prod([col.max() for col in self._factor_norms(p)]))

    def _abs_power_rmatvec(self, v: np.ndarray, p: float) -> SupportArray:
        t = np.asarray(v, dtype=np.float64).reshape(self._heights)
        attrs: list[str] = []
        for axis, f in enumerate(self.factors):
            powered = abs(f.matrix).power(p)
            if _columns_equal(powered):
                powered = powered[:, :1]  # the result is the same for every column: keep one
            else:
                attrs.extend(f.attrs)
            t = apply_along(powered.T, t, axis)
        return tuple(attrs), t.reshape([self.domain.size_of(a) for a in attrs])

    # ---- description ------------------------------------------------------------------
    def row_labels(self) -> list[str]:
        # A one-row constant factor (the total over attributes the product sums out) adds nothing
        # to a row's label beside the others.
        kept = [f for f, c, h in zip(self.factors, self._constant, self._heights) if not (c and h == 1)]
        return product_labels([f.labels() for f in kept or self.factors[:1]], " & ")
