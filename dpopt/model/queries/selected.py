"""A few rows of a query: what MWEM measures when it selects single counting queries."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import scipy.sparse as sp

from dpopt.errors import QueryError
from dpopt.model.queries._common import (
    StructuredQuery,
    SupportArray,
    abs_power_rmatvec,
    depends_on,
    restrict_query,
)
from dpopt.model.queries.base import LinearQuery

__all__ = ["SelectedRows"]


class SelectedRows(StructuredQuery):
    """Rows ``rows`` of ``parent``: a query of its own (MWEM measures these when it selects single queries).

    Column norms (hence sensitivities) are those of the selected rows only, computed from
    the parent's operator.
    """

    def __init__(self, parent: LinearQuery, rows: Sequence[int]) -> None:
        self.parent = parent
        self.domain = parent.domain
        self.rows = np.asarray(rows, dtype=np.int64).ravel()
        if self.rows.size == 0 or self.rows.min() < 0 or self.rows.max() >= parent.num_rows:
            raise QueryError(f"SelectedRows: rows must lie in 0..{parent.num_rows - 1}, got {self.rows[:5]}")
        self.is_integer = parent.is_integer

    @property
    def name(self) -> str:
        rows = ",".join(str(int(r)) for r in self.rows[:4]) + (",..." if self.rows.size > 4 else "")
        return f"{self.parent.name}[{rows}]"

    @property
    def num_rows(self) -> int:
        return int(self.rows.size)

    @property
    def depends_on(self) -> tuple[str, ...]:
        return depends_on(self.parent)

    def _restrict_to(self, attrs: tuple[str, ...]) -> "SelectedRows":
        return SelectedRows(restrict_query(self.parent, attrs), self.rows)

    def _scatter(self, y: np.ndarray) -> np.ndarray:
        full = np.zeros(self.parent.num_rows)
        np.add.at(full, self.rows, np.asarray(y, dtype=np.float64))
        return full

    def _matvec(self, x: np.ndarray) -> np.ndarray:
        return self.parent.matvec(x)[self.rows]

    def _rmatvec(self, y: np.ndarray) -> np.ndarray:
        return self.parent.rmatvec(self._scatter(y))

    def to_sparse(self) -> sp.csr_matrix:
        return sp.csr_matrix(self.parent.to_sparse())[self.rows]

    def _abs_power_rmatvec(self, v: np.ndarray, p: float) -> SupportArray:
        return abs_power_rmatvec(self.parent, self._scatter(v), p)

    def row_labels(self) -> list[str]:
        labels = self.parent.row_labels()
        return [labels[int(r)] for r in self.rows]


