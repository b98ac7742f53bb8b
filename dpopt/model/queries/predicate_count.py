"""The count of records whose values satisfy a predicate."""

from __future__ import annotations

from typing import Mapping

import numpy as np
import scipy.sparse as sp

from dpopt.model.domain import Domain
from dpopt.model.predicates import Predicate, as_predicate
from dpopt.model.queries._common import (
    SupportArray,
    StructuredQuery,
    check_domain,
    expand,
    marginalize,
    projection_matrix,
)


class PredicateCount(StructuredQuery):
    """One row: the number of records for which ``predicate`` holds. Sensitivity 1.

    Parameters
    ----------
    domain : Domain
    predicate : Predicate, str or dict
        See :mod:`dpopt.model.predicates`; validated against ``domain`` here.
    """

    is_integer = True

    def __init__(self, domain: Domain, predicate: Predicate | str | Mapping) -> None:
        self.domain = check_domain(domain, "PredicateCount")
        self.predicate = as_predicate(predicate, self.domain)
        self.attrs: tuple[str, ...] = self.predicate.attrs
        # The rows's entries over the marginal of the predicate's attributes.
        self.mask = self.predicate.mask(self.domain)
        self.mask.setflags(write=False)

    @property
    def num_rows(self) -> int:
        return 1

    @property
    def depends_on(self) -> tuple[str, ...]:
        return self.attrs

    def _restrict_to(self, attrs: tuple[str, ...]) -> "PredicateCount":
        return PredicateCount(self.domain.project(attrs), self.predicate)

    def _matvec(self, x: np.ndarray) -> np.ndarray:
        marginal = marginalize(x, self.domain, self.attrs)
        return np.reshape(np.sum(marginal[self.mask]), (1,))

    def _rmatvec(self, y: np.ndarray) -> np.ndarray:
        row = np.where(self.mask, np.asarray(y)[0], np.zeros((), dtype=np.asarray(y).dtype))
        return expand(row, self.domain, self.attrs)

    def to_sparse(self) -> sp.csr_matrix:
        row = sp.csr_matrix(self.mask.astype(np.float64).reshape(1, -1))
        return sp.csr_matrix(row @ projection_matrix(self.domain, self.attrs))

    def _abs_power_rmatvec(self, v: np.ndarray, p: float) -> SupportArray:
        values = np.where(self.mask, float(v[0]), 0.0)
        return self.attrs, values.reshape(self.domain.project(self.attrs).shape)

    def row_labels(self) -> list[str]:
        return [f"count where {self.predicate}"]
