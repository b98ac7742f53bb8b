"""A query over a projected domain, read through the marginal: ``Q = Q_S M_S``."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from dpopt.errors import QueryError
from dpopt.model.domain import Domain
from dpopt.model.queries._common import (
    SupportArray,
    StructuredQuery,
    abs_power_rmatvec,
    check_domain,
    depends_on,
    expand,
    marginalize,
    max_column_norm_power,
    projection_matrix,
    restrict_query,
    support_norm_powers,
)
from dpopt.model.queries.base import LinearQuery


class Lifted(StructuredQuery):
    """A query ``inner`` over ``domain.project(S)`` used on the larger ``domain``.

    The answers are ``inner`` applied to the marginal of the data over ``S``. This is what
    :meth:`~dpopt.model.queries.base.LinearQuery.restrict` undoes, and how parts with
    different supports are put over one common domain.

    Parameters
    ----------
    inner : LinearQuery
        A query whose domain is ``domain.project(S)`` with ``S`` in domain order.
    domain : Domain
    """

    def __init__(self, inner: LinearQuery, domain: Domain) -> None:
        self.domain = check_domain(domain, "Lifted")
        if not isinstance(inner, LinearQuery):
            raise QueryError(f"Lifted: inner must be a LinearQuery, got {type(inner).__name__}")
        attrs = inner.domain.attrs
        if any(a not in self.domain for a in attrs) or self.domain.canonical(attrs) != attrs:
            raise QueryError(
                f"Lifted: the inner query's attributes {list(attrs)} are not a subset of "
                f"{list(self.domain.attrs)} in domain order"
            )
        if self.domain.project(attrs) != inner.domain:
            raise QueryError(
                f"Lifted: the inner query's domain {inner.domain} differs from the projection "
                f"{self.domain.project(attrs)}"
            )
        self.inner = inner
        self.attrs: tuple[str, ...] = attrs
        self.is_integer = inner.is_integer

    @property
    def name(self) -> str:
        return f"Lifted({self.inner.name})"

    @property
    def num_rows(self) -> int:
        return self.inner.num_rows

    @property
    def depends_on(self) -> tuple[str, ...]:
        return self.domain.canonical(depends_on(self.inner))

    def _restrict_to(self, attrs: tuple[str, ...]) -> LinearQuery:
        keep = [a for a in attrs if a in self.attrs]
        inner = restrict_query(self.inner, keep)  # the inner query itself when keep is all of it
        if len(keep) == len(attrs):
            return inner
        return Lifted(inner, self.domain.project(attrs))

    def _matvec(self, x: np.ndarray) -> np.ndarray:
        return self.inner.matvec(marginalize(x, self.domain, self.attrs))

    def _rmatvec(self, y: np.ndarray) -> np.ndarray:
        return expand(self.inner.rmatvec(y), self.domain, self.attrs)

    def to_sparse(self) -> sp.csr_matrix:
        return sp.csr_matrix(self.inner.to_sparse() @ projection_matrix(self.domain, self.attrs))

    def _abs_power_rmatvec(self, v: np.ndarray, p: float) -> SupportArray:
        return abs_power_rmatvec(self.inner, v, p)

    def _support_norm_powers(self, p: float) -> SupportArray:
        return support_norm_powers(self.inner, p)

    def _max_column_norm_power(self, p: float) -> float:
        return max_column_norm_power(self.inner, p)

    def row_labels(self) -> list[str]:
        return self.inner.row_labels()
