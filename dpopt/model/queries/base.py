"""The linear-query interface every workload, measurement and constraint is written in.

A :class:`LinearQuery` is a matrix ``Q`` of shape ``(m, n)`` over the cells of a
:class:`~dpopt.model.domain.Domain` (``n = domain.size``), given matrix-free:
``matvec`` computes ``Q x``, ``rmatvec`` computes ``Q^T y``. Sensitivities are derived
from the operator's column norms under add/remove-one-record neighbours: one record
changes one cell of ``x`` by one, so the L_p sensitivity of ``x -> Q x`` is the largest
L_p norm of a column of ``Q``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import LinearOperator

from dpopt.errors import QueryError
from dpopt.model.domain import Domain

if TYPE_CHECKING:  # pragma: no cover
    from dpopt.model.data import Dataset


class LinearQuery(ABC):
    """A matrix-free linear map from histograms over ``domain`` to ``m`` answers.

    Subclasses implement :meth:`_matvec`, :meth:`_rmatvec`, :meth:`to_sparse`,
    :meth:`column_norm_powers` and :attr:`num_rows`. They may override :attr:`support`
    and :meth:`restrict` when the query reads only some attributes, which lets it be
    answered from a marginal of the data on domains too large to hold densely.
    """

    domain: Domain
    #: True when every entry is an integer, so answers on integer data are integers.
    is_integer: bool = False

    # ---- shape -------------------------------------------------------------------
    @property
    @abstractmethod
    def num_rows(self) -> int:
        """Number of answers ``m``."""

    @property
    def shape(self) -> tuple[int, int]:
        return (self.num_rows, self.domain.size)

    @property
    def support(self) -> tuple[str, ...]:
        """Attributes the query depends on, in domain order."""
        return self.domain.attrs

    def restrict(self) -> "LinearQuery":
        """The same query over ``domain.project(support)``: ``Q = Q_S M_S``."""
        if self.support == self.domain.attrs:
            return self
        raise NotImplementedError(f"{type(self).__name__} cannot be restricted to its support")

    # ---- products ----------------------------------------------------------------
    def matvec(self, x: np.ndarray) -> np.ndarray:
        """``Q x`` for a vector ``(n,)`` or a block of vectors ``(n, k)``."""
        x = np.asarray(x)
        n = self.domain.size
        if x.shape[0] != n or x.ndim not in (1, 2):
            raise QueryError(
                f"{self.name}: expected a vector of length {n} (the domain size), got shape {x.shape}"
            )
        if x.ndim == 2:
            return np.stack([self._matvec(x[:, j]) for j in range(x.shape[1])], axis=1)
        return self._matvec(x)

    def rmatvec(self, y: np.ndarray) -> np.ndarray:
        """``Q^T y`` for a vector ``(m,)`` or a block ``(m, k)``."""
        y = np.asarray(y)
        m = self.num_rows
        if y.shape[0] != m or y.ndim not in (1, 2):
            raise QueryError(f"{self.name}: expected {m} answers, got shape {y.shape}")
        if y.ndim == 2:
            return np.stack([self._rmatvec(y[:, j]) for j in range(y.shape[1])], axis=1)
        return self._rmatvec(y)

    @abstractmethod
    def _matvec(self, x: np.ndarray) -> np.ndarray: ...

    @abstractmethod
    def _rmatvec(self, y: np.ndarray) -> np.ndarray: ...

    @abstractmethod
    def to_sparse(self) -> sp.csr_matrix:
        """The explicit matrix (for small problems and tests)."""

    def columns(self, cells: np.ndarray) -> sp.csc_matrix:
        """The columns of ``Q`` at the given cells, without building all of ``Q``.

        A query that reads only some attributes takes them from its restriction, whose
        matrix is as small as the marginal over its support.
        """
        cells = np.asarray(cells, dtype=np.int64)
        if self.support != self.domain.attrs:
            restricted = self.restrict()
            codes = self.domain.unravel(cells)[:, list(self.domain.axes(restricted.domain.attrs))]
            projected = np.ravel_multi_index(tuple(codes.T), restricted.domain.sizes)
            return sp.csc_matrix(restricted.to_sparse())[:, projected]
        return sp.csc_matrix(self.to_sparse())[:, cells]

    def to_dense(self) -> np.ndarray:
        return self.to_sparse().toarray()

    #: Whether :meth:`weighted_gram` avoids the explicit matrix (Newton steps on large domains).
    fast_weighted_gram: bool = False

    def weighted_gram(self, v: np.ndarray) -> np.ndarray:
        """``Q diag(v) Q^T`` as a dense ``m x m`` array: the Hessian of entropy duals.

        Generic: from the explicit matrix. Structured queries override it.
        """
        v = np.asarray(v, dtype=np.float64)
        if v.shape != (self.domain.size,):
            raise QueryError(f"{self.name}: expected weights of length {self.domain.size}, got shape {v.shape}")
        return self._weighted_gram(v)

    def _weighted_gram(self, v: np.ndarray) -> np.ndarray:
        Q = self.to_sparse()
        return np.asarray((Q @ sp.diags(v) @ Q.T).todense())

    def as_linear_operator(self) -> LinearOperator:
        """A :class:`scipy.sparse.linalg.LinearOperator` view (for LSMR, CG, ...)."""
        return LinearOperator(
            self.shape,
            matvec=lambda v: self.matvec(np.ravel(v)),
            rmatvec=lambda v: self.rmatvec(np.ravel(v)),
            dtype=np.float64,
        )

    def __matmul__(self, x: np.ndarray) -> np.ndarray:
        return self.matvec(x)

    # ---- privacy -----------------------------------------------------------------
    @abstractmethod
    def column_norm_powers(self, p: int) -> float | np.ndarray:
        """``sum_i |Q_ij|^p`` for every column ``j`` (a scalar when all columns agree)."""

    def sensitivity(self, p: int = 1) -> float:
        """L_p sensitivity (p = 1 or 2) under add/remove-one-record neighbours.

        It is the largest L_p norm of a column: one record moves one cell by one.
        """
        if p not in (1, 2):
            raise QueryError(f"sensitivity is defined here for p = 1 or 2, got p={p!r}")
        powers = self.column_norm_powers(p)
        worst = float(np.max(powers)) if np.ndim(powers) else float(powers)
        return worst if p == 1 else float(np.sqrt(worst))

    def squared_l2_sensitivity(self) -> float:
        """The largest ``sum_i Q_ij^2``: exact for integer queries, used by Gaussian noise."""
        powers = self.column_norm_powers(2)
        return float(np.max(powers)) if np.ndim(powers) else float(powers)

    # ---- answering ---------------------------------------------------------------
    def answer(self, data: "Dataset") -> np.ndarray:
        """True answers on a dataset, from the smallest marginal that determines them."""
        if data.domain != self.domain:
            raise QueryError(f"{self.name}: the data's domain {data.domain} differs from {self.domain}")
        if self.support != self.domain.attrs:
            restricted = self.restrict()
            return restricted.matvec(data.marginal(restricted.domain.attrs))
        return self.matvec(data.histogram())

    # ---- description -------------------------------------------------------------
    @property
    def name(self) -> str:
        return type(self).__name__

    def row_labels(self) -> list[str]:
        """One human-readable label per answer (for reports)."""
        return [f"{self.name}[{i}]" for i in range(self.num_rows)]

    def __repr__(self) -> str:
        return f"{self.name}(shape={self.shape})"


def column_norms_of_matrix(matrix: sp.spmatrix, p: int) -> np.ndarray:
    """``sum_i |A_ij|^p`` per column of an explicit matrix."""
    a = sp.csc_matrix(matrix)
    return np.asarray(abs(a).power(p).sum(axis=0)).ravel()
