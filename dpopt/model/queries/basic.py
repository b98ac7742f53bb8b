"""The identity (every cell) and the total (one count) queries."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from dpopt.model.domain import Domain
from dpopt.model.queries._common import (
    SupportArray,
    StructuredQuery,
    cell_labels,
    check_domain,
)


class Identity(StructuredQuery):
    """Every cell count: ``Q = I_n``. Sensitivity 1 (each column is a unit vector).

    Parameters
    ----------
    domain : Domain
    """

    is_integer = True

    def __init__(self, domain: Domain) -> None:
        self.domain = check_domain(domain, "Identity")

    @property
    def num_rows(self) -> int:
        return self.domain.size

    def _matvec(self, x: np.ndarray) -> np.ndarray:
        return np.array(x, copy=True)

    def _rmatvec(self, y: np.ndarray) -> np.ndarray:
        return np.array(y, copy=True)

    def to_sparse(self) -> sp.csr_matrix:
        n = self.domain.require_dense("the identity matrix")
        return sp.identity(n, dtype=np.float64, format="csr")

    def _abs_power_rmatvec(self, v: np.ndarray, p: float) -> SupportArray:
        return self.domain.attrs, np.asarray(v, dtype=np.float64).reshape(self.domain.shape)

    def _support_norm_powers(self, p: float) -> SupportArray:
        return (), np.asarray(1.0)

    def row_labels(self) -> list[str]:
        self.domain.require_dense("one label per cell")
        return cell_labels(self.domain, self.domain.attrs)


class Total(StructuredQuery):
    """The number of records: one row of ones. Sensitivity 1.

    It depends on no attribute; its :attr:`support` is the smallest attribute, so that
    :meth:`~dpopt.model.queries.base.LinearQuery.answer` reads the cheapest marginal.

    Parameters
    ----------
    domain : Domain
    """

    is_integer = True

    def __init__(self, domain: Domain) -> None:
        self.domain = check_domain(domain, "Total")

    @property
    def num_rows(self) -> int:
        return 1

    @property
    def depends_on(self) -> tuple[str, ...]:
        return ()

    def _restrict_to(self, attrs: tuple[str, ...]) -> "Total":
        return Total(self.domain.project(attrs))

    def _matvec(self, x: np.ndarray) -> np.ndarray:
        return np.reshape(np.sum(x), (1,))

    def _rmatvec(self, y: np.ndarray) -> np.ndarray:
        return np.full(self.domain.size, y[0])

    def to_sparse(self) -> sp.csr_matrix:
        n = self.domain.require_dense("the total's row")
        return sp.csr_matrix(np.ones((1, n)))

    def _abs_power_rmatvec(self, v: np.ndarray, p: float) -> SupportArray:
        return (), np.asarray(float(v[0]))

    def row_labels(self) -> list[str]:
        return ["total"]
