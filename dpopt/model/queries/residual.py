"""Residual (contrast) queries: the orthogonal pieces every marginal is made of.

Split each attribute's space ``R^{n_i} = span(1) ⊕ 1^⊥``. For a set ``a`` of attributes the
*residual space* ``U_a = ⊗_{i∈a} 1^⊥ ⊗_{i∉a} span(1)`` has dimension ``prod_{i∈a} (n_i − 1)``;
the spaces of all ``2^d`` sets are mutually orthogonal and sum to the whole table, and the
marginal on ``S`` sees exactly the spaces ``U_a`` with ``a ⊆ S`` (the marginals algebra of
:mod:`dpopt.strategy.gram`; HDMM §6.2). Xiao, Ding, Ding, Hu and Wang ("An optimal and scalable
matrix mechanism for noisy marginals under convex loss functions", NeurIPS 2023, the
ResidualPlanner; He et al. 2024 for ResidualPlanner+) measure each ``U_a`` that a marginal
workload needs, with its own noise variance, and show that this is the optimal matrix mechanism
for marginals under Gaussian noise.

This module gives the measurement a query of its own. The rows of set ``a`` are

    w_a · (⊗_{i∈a} H_i) M_a          (M_a the marginal on a, H_i a contrast basis of attribute i)

with ``H_i = [1, −1]`` on a binary attribute (so the rows are the parities of Barak et al.,
integers, and all of them come from one Walsh–Hadamard transform) and the orthonormal Helmert
contrasts (rows orthogonal to ``1`` and to each other) on any other attribute. Every row of a set
has the same squared norm ``κ_a² = prod_{i∈a} h_i · prod_{i∉a} n_i`` (``h_i = 2`` for the binary
contrast, 1 for Helmert), so the rows of ``a`` divided by ``w_a κ_a`` are an orthonormal basis
of ``U_a`` (:meth:`Residuals.row_norm`): measuring them with independent noise of variance ``v``
gives every orthonormal coordinate of ``U_a`` the variance ``v / (w_a κ_a)²``. This is the
measurement the ResidualPlanner makes with correlated noise on its ``Sub`` matrices, written as
an orthonormal basis with independent noise (the two have the same covariance on ``U_a``).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterable, Sequence

import numpy as np
import scipy.sparse as sp

from dpopt.errors import QueryError
from dpopt.model.domain import Domain
from dpopt.model.queries._common import (
    StructuredQuery,
    SupportArray,
    check_domain,
    expand,
    marginalize,
    sum_support_arrays,
)
from dpopt.model.queries.fourier import fast_walsh_hadamard

__all__ = ["Residuals", "contrast_basis", "residual_dimension", "residual_row_norm2"]


@lru_cache(maxsize=64)
def _contrasts(n: int) -> np.ndarray:
    if n == 2:
        return np.array([[1.0, -1.0]])
    out = np.zeros((n - 1, n))
    for j in range(1, n):  # Helmert: the first j values against the next, normalised
        out[j - 1, :j] = 1.0
        out[j - 1, j] = -float(j)
        out[j - 1] /= np.sqrt(j * (j + 1.0))
    out.setflags(write=False)
    return out


def contrast_basis(n: int) -> np.ndarray:
    """The ``(n − 1) × n`` contrast basis of one attribute: ``[1, −1]`` for ``n = 2`` (the parity,
    squared norm 2), else the orthonormal Helmert contrasts (rows orthogonal to ``1``)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 2:
        raise QueryError(f"contrast_basis: an attribute needs at least 2 values to have a contrast, got {n!r}")
    return _contrasts(int(n))


def _h(n: int) -> float:
    """Squared norm of one row of :func:`contrast_basis`."""
    return 2.0 if n == 2 else 1.0


def residual_dimension(domain: Domain, attrs: Sequence[str]) -> int:
    """``dim U_a = prod_{i∈a} (n_i − 1)``."""
    return int(np.prod([domain.size_of(a) - 1 for a in attrs], dtype=np.int64)) if attrs else 1


def residual_row_norm2(domain: Domain, attrs: Sequence[str]) -> float:
    """``κ_a²``: the squared norm of every unweighted row of set ``a`` (module notes)."""
    inside = set(attrs)
    return float(np.prod([_h(n) if a in inside else float(n) for a, n in zip(domain.attrs, domain.sizes)]))


class Residuals(StructuredQuery):
    """The residual rows of several attribute sets, each set with its own weight (module notes).

    Parameters
    ----------
    domain : Domain
    sets : iterable of iterables of str
        Distinct attribute sets (``()`` is the total); each attribute needs at least 2 values.
    weights : float or array_like, optional
        ``w_a`` for each set (default 1); positive and finite.

    Notes
    -----
    On a binary domain the rows are weighted parities ``w_a (−1)^{<a, x>}``: answers, the
    transpose and the weighted Gram ``Q diag(v) Qᵀ`` (entry ``w_a w_b v̂(a ⊕ b)``) all come from
    one Walsh–Hadamard transform over the attributes the sets use. Every column of a binary
    residual query has the same norms, so its L1 sensitivity is ``Σ_a w_a`` and its squared L2
    sensitivity ``Σ_a w_a²``.
    """

    def __init__(self, domain: Domain, sets: Iterable[Iterable[str]], weights: object = 1.0) -> None:
        self.domain = check_domain(domain, "Residuals")
        if isinstance(sets, str):
            raise QueryError("Residuals: sets must be a list of attribute sets, got a string")
        canon: list[tuple[str, ...]] = []
        seen: set[tuple[str, ...]] = set()
        for i, s in enumerate(sets):
            names = (s,) if isinstance(s, str) else tuple(s)
            if len(set(names)) != len(names):
                raise QueryError(f"Residuals: set #{i} {list(names)} names an attribute twice")
            a = self.domain.canonical(names)
            small = [x for x in a if self.domain.size_of(x) < 2]
            if small:
                raise QueryError(f"Residuals: attribute {small[0]!r} has a single value, so set #{i} {list(a)} "
                                 "has no residual")
            if a in seen:
                raise QueryError(f"Residuals: set {list(a)} is listed twice")
            seen.add(a)
            canon.append(a)
        if not canon:
            raise QueryError("Residuals: sets is empty")
        self.sets: tuple[tuple[str, ...], ...] = tuple(canon)
        w = np.broadcast_to(np.asarray(weights, dtype=np.float64), (len(canon),)).copy() \
            if np.ndim(weights) == 0 else np.asarray(weights, dtype=np.float64)
        if w.shape != (len(canon),) or not np.all(np.isfinite(w)) or np.any(w <= 0):
            raise QueryError(f"Residuals: weights must be positive and finite, one per set ({len(canon)}), "
                             f"got shape {w.shape}")
        w.setflags(write=False)
        self.weights = w
        self.dims = np.array([residual_dimension(self.domain, a) for a in canon], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.dims)])
        used = {x for a in canon for x in a}
        self._union: tuple[str, ...] = tuple(x for x in self.domain.attrs if x in used)
        self.binary = all(self.domain.size_of(x) == 2 for x in self._union)
        self.is_integer = bool(self.binary and np.all(w == np.round(w)))
        if self.binary:
            u = len(self._union)
            self._masks = np.array([sum(1 << (u - 1 - self._union.index(x)) for x in a) for a in canon],
                                   dtype=np.int64)

    # ---- shape and structure ---------------------------------------------------------
    @property
    def num_rows(self) -> int:
        return int(self.offsets[-1])

    @property
    def name(self) -> str:
        return f"Residuals({len(self.sets)} sets)"

    @property
    def depends_on(self) -> tuple[str, ...]:
        return self._union

    def _restrict_to(self, attrs: tuple[str, ...]) -> "Residuals":
        return Residuals(self.domain.project(attrs), self.sets, self.weights)

    def rows_of(self, index: int) -> slice:
        """The rows of the ``index``-th set."""
        return slice(int(self.offsets[index]), int(self.offsets[index + 1]))

    def row_norm(self) -> np.ndarray:
        """``w_a κ_a`` for every row: dividing a row by it gives an orthonormal basis vector of ``U_a``."""
        per_set = self.weights * np.sqrt([residual_row_norm2(self.domain, a) for a in self.sets])
        return np.repeat(per_set, self.dims)

    def set_index(self) -> np.ndarray:
        """The position (in :attr:`sets`) of every row's set."""
        return np.repeat(np.arange(len(self.sets)), self.dims)

    # ---- products ---------------------------------------------------------------------
    def _matvec(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        if self.binary:
            margin = marginalize(x, self.domain, self._union) if self._union else np.array([x.sum()])
            coeffs = fast_walsh_hadamard(margin) if self._union else margin
            return self.weights * coeffs[self._masks]
        out = np.empty(self.num_rows)
        for i, a in enumerate(self.sets):
            out[self.rows_of(i)] = self.weights[i] * self._contrast(marginalize(x, self.domain, a) if a
                                                                    else np.array([x.sum()]), a)
        return out

    def _rmatvec(self, y: np.ndarray) -> np.ndarray:
        y = np.asarray(y, dtype=np.float64)
        self.domain.require_dense("the transpose of a residual query")
        if self.binary:
            if not self._union:
                return np.full(self.domain.size, float(self.weights @ y))
            coeffs = np.zeros(2 ** len(self._union))
            np.add.at(coeffs, self._masks, self.weights * y)
            return expand(fast_walsh_hadamard(coeffs), self.domain, self._union)
        union_shape = tuple(self.domain.size_of(x) for x in self._union)
        acc = np.zeros(union_shape)
        for i, a in enumerate(self.sets):
            part = self._contrast_t(self.weights[i] * y[self.rows_of(i)], a)  # over the marginal on a
            shape = tuple(self.domain.size_of(x) if x in a else 1 for x in self._union)
            acc = acc + part.reshape(shape)
        if not self._union:
            return np.full(self.domain.size, float(acc))
        return expand(acc.reshape(-1), self.domain, self._union)

    def _contrast(self, margin: np.ndarray, attrs: tuple[str, ...]) -> np.ndarray:
        """``(⊗_{i∈a} H_i)`` applied to a marginal over ``attrs``."""
        if not attrs:
            return np.asarray(margin, dtype=np.float64).reshape(1)
        t = np.asarray(margin, dtype=np.float64).reshape([self.domain.size_of(x) for x in attrs])
        for axis, x in enumerate(attrs):
            t = np.moveaxis(np.tensordot(contrast_basis(self.domain.size_of(x)), t, axes=([1], [axis])), 0, axis)
        return t.reshape(-1)

    def _contrast_t(self, rows: np.ndarray, attrs: tuple[str, ...]) -> np.ndarray:
        """The transpose of :meth:`_contrast`: a marginal over ``attrs`` (shaped)."""
        if not attrs:
            return np.asarray(rows, dtype=np.float64).reshape(())
        t = np.asarray(rows, dtype=np.float64).reshape([self.domain.size_of(x) - 1 for x in attrs])
        for axis, x in enumerate(attrs):
            t = np.moveaxis(np.tensordot(contrast_basis(self.domain.size_of(x)).T, t, axes=([1], [axis])), 0, axis)
        return t

    def to_sparse(self) -> sp.csr_matrix:
        n = self.domain.require_dense("the residual matrix")
        codes = self.domain.unravel(np.arange(n))
        blocks = []
        for i, a in enumerate(self.sets):
            small = np.ones((1, 1))
            for x in a:  # the contrast over the marginal on a (a small dense Kronecker product)
                small = np.kron(small, contrast_basis(self.domain.size_of(x)))
            if a:
                index = np.ravel_multi_index(tuple(codes[:, list(self.domain.axes(a))].T),
                                             [self.domain.size_of(x) for x in a])
                blocks.append(self.weights[i] * small[:, index])
            else:
                blocks.append(np.full((1, n), self.weights[i]))
        return sp.csr_matrix(np.vstack(blocks))

    # ---- the weighted Gram ------------------------------------------------------------
    #: Above this many rows the weighted Gram is not offered as a fast product.
    GRAM_ROWS = 4000

    @property
    def fast_weighted_gram(self) -> bool:  # type: ignore[override]
        if self.binary:
            return len(self._union) < 63
        return self.num_rows <= self.GRAM_ROWS

    def _weighted_gram(self, v: np.ndarray) -> np.ndarray:
        v = np.asarray(v, dtype=np.float64)
        if self.binary and len(self._union) < 63:
            # sum_j v_j chi_a(j) chi_b(j) = sum_j v_j chi_{a xor b}(j): one transform of v's marginal.
            margin = marginalize(v, self.domain, self._union) if self._union else np.array([np.sum(v)])
            coeffs = fast_walsh_hadamard(margin) if self._union else margin
            gram = coeffs[self._masks[:, None] ^ self._masks[None, :]]
            return gram * np.outer(self.weights, self.weights)
        # Block (a, b) = w_a w_b H_a C_ab H_bᵀ with H_a = ⊗_{i∈a} H_i and C_ab = M_a diag(v) M_bᵀ, the
        # joint marginal of v on a ∪ b laid out as (cells of a) x (cells of b): zero unless the two
        # cells agree on a ∩ b. Every union's marginal comes from v's marginal on the sets' union.
        dom = self.domain
        union = self._union
        sub = dom.project(union) if union else None
        top = marginalize(v, dom, union) if union else np.array([float(np.sum(v))])
        margins: dict[tuple[str, ...], np.ndarray] = {}
        gram = np.empty((self.num_rows, self.num_rows))
        for i, a in enumerate(self.sets):
            for j in range(i, len(self.sets)):
                b = self.sets[j]
                u = dom.canonical(set(a) | set(b))
                if u not in margins:
                    margins[u] = (marginalize(top, sub, u) if u else np.array([float(np.sum(top))])).reshape(
                        [dom.size_of(x) for x in u])
                block = self._kron(a) @ self._joint(margins[u], u, a, b) @ self._kron(b).T
                block *= self.weights[i] * self.weights[j]
                gram[self.rows_of(i), self.rows_of(j)] = block
                gram[self.rows_of(j), self.rows_of(i)] = block.T
        return gram

    def _kron(self, attrs: tuple[str, ...]) -> np.ndarray:
        """``⊗_{i∈a} H_i``: ``dim U_a x (cells of the marginal on a)``, cached per set."""
        cache = self.__dict__.setdefault("_kron_cache", {})
        if attrs not in cache:
            out = np.ones((1, 1))
            for x in attrs:
                out = np.kron(out, contrast_basis(self.domain.size_of(x)))
            cache[attrs] = out
        return cache[attrs]

    def _joint(self, margin: np.ndarray, u: tuple[str, ...], a: tuple[str, ...], b: tuple[str, ...]) -> np.ndarray:
        """``C_ab``: the marginal over ``u = a ∪ b`` (shaped) placed at (cell of a, cell of b)."""
        sizes = [self.domain.size_of(x) for x in u]
        ranges = {x: np.arange(n).reshape([n if y == x else 1 for y in u]) for x, n in zip(u, sizes)}
        out = np.zeros([self.domain.size_of(x) for x in a] + [self.domain.size_of(x) for x in b])
        out[tuple(ranges[x] for x in a) + tuple(ranges[x] for x in b)] = margin
        n_a = int(np.prod([self.domain.size_of(x) for x in a])) if a else 1
        return out.reshape(n_a, -1)

    # ---- norms ------------------------------------------------------------------------
    def _abs_power_rmatvec(self, v: np.ndarray, p: float) -> SupportArray:
        v = np.asarray(v, dtype=np.float64)
        parts = []
        for i, a in enumerate(self.sets):
            if not a:
                parts.append(((), np.asarray(self.weights[i] ** p * float(np.sum(v[self.rows_of(i)])))))
                continue
            t = v[self.rows_of(i)].reshape([self.domain.size_of(x) - 1 for x in a])
            for axis, x in enumerate(a):
                powered = np.abs(contrast_basis(self.domain.size_of(x))) ** p
                t = np.moveaxis(np.tensordot(powered.T, t, axes=([1], [axis])), 0, axis)
            parts.append((a, self.weights[i] ** p * t))
        return sum_support_arrays(self.domain, parts)

    def _support_norm_powers(self, p: float) -> SupportArray:
        parts = []
        for i, a in enumerate(self.sets):
            values = np.asarray(self.weights[i] ** p)
            for x in a:
                col = np.sum(np.abs(contrast_basis(self.domain.size_of(x))) ** p, axis=0)
                values = np.multiply.outer(values, col)
            parts.append((a, values))
        return sum_support_arrays(self.domain, parts)

    def _max_column_norm_power(self, p: float) -> float:
        if self.binary:  # every column of a parity row has |entry| 1
            return float(np.sum(self.weights ** p))
        return float(np.max(self._support_norm_powers(p)[1]))

    # ---- description ------------------------------------------------------------------
    def row_labels(self) -> list[str]:
        out: list[str] = []
        for a, dim in zip(self.sets, self.dims):
            name = "residual{" + ",".join(a) + "}"
            out.extend([name] if dim == 1 else [f"{name}[{j}]" for j in range(int(dim))])
        return out

    def coordinates(self, values: np.ndarray) -> np.ndarray:
        """Answers of this query as orthonormal coordinates of the ``U_a`` (divided by :meth:`row_norm`)."""
        values = np.asarray(values, dtype=np.float64)
        if values.shape != (self.num_rows,):
            raise QueryError(f"Residuals.coordinates: expected {self.num_rows} values, got shape {values.shape}")
        return values / self.row_norm()
