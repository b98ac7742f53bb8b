"""Combinations of queries: rows stacked, rows weighted."""

from __future__ import annotations

from typing import Iterable

import numpy as np
import scipy.sparse as sp
from numpy.dtypes import StringDType

from dpopt.errors import QueryError
from dpopt.model.queries._common import (
    SupportArray,
    StructuredQuery,
    abs_power_rmatvec,
    depends_on,
    max_column_norm_power,
    restrict_query,
    sum_support_arrays,
    support_norm_powers,
)
from dpopt.model.queries.base import LinearQuery


class Stack(StructuredQuery):
    """The rows of several queries over one domain, one after the other.

    The column norm powers add up cell by cell, so the sensitivity is exact: for two
    marginals it is sqrt(2) in L2 and 2 in L1, but for two disjoint ranges on one attribute
    it is 1, not the sum of the parts' sensitivities.

    Parameters
    ----------
    queries : iterable of LinearQuery
        Non-empty, all over the same domain.
    """

    def __init__(self, queries: Iterable[LinearQuery]) -> None:
        if isinstance(queries, LinearQuery):
            raise QueryError("Stack: queries must be a list of queries, got a single query")
        parts = list(queries)
        if not parts:
            raise QueryError("Stack: queries is empty")
        for i, q in enumerate(parts):
            if not isinstance(q, LinearQuery):
                raise QueryError(f"Stack: query #{i} is a {type(q).__name__}, not a LinearQuery")
            if q.domain != parts[0].domain:
                raise QueryError(
                    f"Stack: query #{i} ({q.name}) is over {q.domain}, query #0 over {parts[0].domain}"
                )
        self.domain = parts[0].domain
        self.parts: tuple[LinearQuery, ...] = tuple(parts)
        self.is_integer = all(q.is_integer for q in parts)
        self._offsets = np.cumsum([0] + [q.num_rows for q in parts])

    @property
    def num_rows(self) -> int:
        return int(self._offsets[-1])

    @property
    def depends_on(self) -> tuple[str, ...]:
        return self.domain.canonical({a for q in self.parts for a in depends_on(q)})

    def _restrict_to(self, attrs: tuple[str, ...]) -> "Stack":
        return Stack([restrict_query(q, attrs) for q in self.parts])

    def _split(self, y: np.ndarray) -> list[np.ndarray]:
        return [y[a:b] for a, b in zip(self._offsets[:-1], self._offsets[1:])]

    def _matvec(self, x: np.ndarray) -> np.ndarray:
        return np.concatenate([q.matvec(x) for q in self.parts])

    def _rmatvec(self, y: np.ndarray) -> np.ndarray:
        out = None
        for q, part in zip(self.parts, self._split(np.asarray(y))):
            r = q.rmatvec(part)
            out = r if out is None else out + r
        return out

    def to_sparse(self) -> sp.csr_matrix:
        return sp.csr_matrix(sp.vstack([q.to_sparse() for q in self.parts], format="csr"))

    def _abs_power_rmatvec(self, v: np.ndarray, p: float) -> SupportArray:
        return sum_support_arrays(
            self.domain,
            [abs_power_rmatvec(q, part, p) for q, part in zip(self.parts, self._split(np.asarray(v)))],
        )

    def _support_norm_powers(self, p: float) -> SupportArray:
        return sum_support_arrays(self.domain, [support_norm_powers(q, p) for q in self.parts])

    def row_labels(self) -> list[str]:
        out: list[str] = []
        for q in self.parts:
            out.extend(q.row_labels())
        return out

    @property
    def name(self) -> str:
        return f"Stack({len(self.parts)} queries)"


class Weighted(StructuredQuery):
    """A query with its rows scaled: ``diag(w) Q`` (or ``w Q`` for a scalar ``w``).

    Parameters
    ----------
    query : LinearQuery
    weights : float or array_like of shape (query.num_rows,)
        Finite.
    """

    def __init__(self, query: LinearQuery, weights: object) -> None:
        if not isinstance(query, LinearQuery):
            raise QueryError(f"Weighted: query must be a LinearQuery, got {type(query).__name__}")
        w = np.asarray(weights)
        if w.dtype == bool or not np.issubdtype(w.dtype, np.number) or np.iscomplexobj(w):
            raise QueryError(f"Weighted: weights must be real numbers, got dtype {w.dtype}")
        if w.ndim > 1 or (w.ndim == 1 and w.shape[0] != query.num_rows):
            raise QueryError(
                f"Weighted: weights must be a scalar or have one entry per row ({query.num_rows}), "
                f"got shape {w.shape}"
            )
        w = w.astype(np.float64)
        if not np.all(np.isfinite(w)):
            raise QueryError("Weighted: weights must be finite")
        self.query = query
        self.domain = query.domain
        self.weights: float | np.ndarray = float(w) if w.ndim == 0 else w
        self.is_integer = bool(query.is_integer and np.all(w == np.round(w)))

    @property
    def num_rows(self) -> int:
        return self.query.num_rows

    @property
    def depends_on(self) -> tuple[str, ...]:
        return depends_on(self.query)

    def _restrict_to(self, attrs: tuple[str, ...]) -> "Weighted":
        return Weighted(restrict_query(self.query, attrs), self.weights)

    def _matvec(self, x: np.ndarray) -> np.ndarray:
        return self.weights * self.query.matvec(x)

    def _rmatvec(self, y: np.ndarray) -> np.ndarray:
        return self.query.rmatvec(self.weights * np.asarray(y))

    def to_sparse(self) -> sp.csr_matrix:
        inner = sp.csr_matrix(self.query.to_sparse(), dtype=np.float64)
        if np.ndim(self.weights) == 0:
            return inner * self.weights
        return sp.csr_matrix(sp.diags(self.weights) @ inner)

    def _abs_power_rmatvec(self, v: np.ndarray, p: float) -> SupportArray:
        return abs_power_rmatvec(self.query, np.abs(self.weights) ** p * np.asarray(v, dtype=np.float64), p)

    def _support_norm_powers(self, p: float) -> SupportArray:
        if np.ndim(self.weights) == 0:
            attrs, values = support_norm_powers(self.query, p)
            return attrs, abs(self.weights) ** p * values
        return self._abs_power_rmatvec(np.ones(self.num_rows), p)

    def _max_column_norm_power(self, p: float) -> float:
        if np.ndim(self.weights) == 0:
            return abs(self.weights) ** p * max_column_norm_power(self.query, p)
        return float(np.max(self._support_norm_powers(p)[1]))

    def row_labels(self) -> list[str]:
        labels = np.array(self.query.row_labels(), dtype=StringDType())
        prefix = np.strings.mod("%g * ", np.asarray(self.weights)).astype(StringDType())
        return np.strings.add(prefix, labels).tolist()

    @property
    def name(self) -> str:
        return f"Weighted({self.query.name})"
