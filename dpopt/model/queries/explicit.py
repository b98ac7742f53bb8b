"""A query given by an explicit (sparse) matrix over the cells of a domain."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import scipy.sparse as sp

from dpopt.errors import QueryError
from dpopt.model.domain import Domain
from dpopt.model.queries._common import (
    SupportArray,
    StructuredQuery,
    check_domain,
    explicit_norm_powers,
)


class SparseQuery(StructuredQuery):
    """``Q`` given explicitly, one column per cell of ``domain`` (C order).

    Parameters
    ----------
    domain : Domain
        Small enough to hold densely.
    matrix : scipy sparse matrix or 2-D array, shape (m, domain.size)
        Finite entries; integer entries keep an integer dtype.
    labels : sequence of str, optional
        One label per row (default ``"row i"``).
    """

    def __init__(self, domain: Domain, matrix: object, labels: Sequence[str] | None = None) -> None:
        self.domain = check_domain(domain, "SparseQuery")
        n = self.domain.require_dense("an explicit query matrix")
        if sp.issparse(matrix):
            mat = sp.csr_matrix(matrix)
        else:
            arr = np.asarray(matrix)
            if arr.ndim != 2:
                raise QueryError(f"SparseQuery: matrix must be 2-D, got shape {arr.shape}")
            mat = sp.csr_matrix(arr)
        if mat.dtype == bool:
            mat = sp.csr_matrix(mat, dtype=np.int64)
        if not np.issubdtype(mat.dtype, np.number) or np.issubdtype(mat.dtype, np.complexfloating):
            raise QueryError(f"SparseQuery: matrix entries must be real numbers, got dtype {mat.dtype}")
        if mat.shape[1] != n:
            raise QueryError(
                f"SparseQuery: matrix has {mat.shape[1]} columns but the domain has {n} cells"
            )
        if mat.shape[0] == 0:
            raise QueryError("SparseQuery: matrix has no rows")
        if not np.all(np.isfinite(mat.data)):
            raise QueryError("SparseQuery: matrix has non-finite entries")
        mat.sum_duplicates()
        self.is_integer = bool(np.all(mat.data == np.round(mat.data)))
        if not np.issubdtype(mat.dtype, np.integer):
            mat = sp.csr_matrix(mat, dtype=np.float64)
        self.matrix = mat
        if labels is not None:
            labels = [str(s) for s in labels]
            if len(labels) != mat.shape[0]:
                raise QueryError(
                    f"SparseQuery: {len(labels)} labels for {mat.shape[0]} rows"
                )
        self._labels = labels

    @property
    def num_rows(self) -> int:
        return self.matrix.shape[0]

    def _matvec(self, x: np.ndarray) -> np.ndarray:
        return self.matrix @ x

    def _rmatvec(self, y: np.ndarray) -> np.ndarray:
        return self.matrix.T @ y

    def to_sparse(self) -> sp.csr_matrix:
        return sp.csr_matrix(self.matrix, dtype=np.float64)

    def _abs_power_rmatvec(self, v: np.ndarray, p: float) -> SupportArray:
        powered = abs(self.to_sparse()).power(p)
        return self.domain.attrs, np.asarray(powered.T @ np.asarray(v, dtype=np.float64)).reshape(
            self.domain.shape
        )

    def _support_norm_powers(self, p: float) -> SupportArray:
        return explicit_norm_powers(self.matrix, self.domain, p)

    def row_labels(self) -> list[str]:
        if self._labels is not None:
            return list(self._labels)
        return [f"row {i}" for i in range(self.num_rows)]
