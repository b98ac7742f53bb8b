"""Workloads through their Gram matrix ``G = WᵀW``: all the matrix mechanism needs of them.

The expected error of a strategy ``A`` for a workload ``W`` depends on ``W`` only through
``G = WᵀW`` (``trace(W (AᵀA)⁺ Wᵀ) = trace(G (AᵀA)⁺)``, Li et al., PODS 2010, Prop. 4), and so
does the SVD bound (the singular values of ``W`` are the square roots of ``G``'s eigenvalues).
Each class here keeps ``G`` in a form that makes these computations fast:

* :class:`RangeGram` — boxes over ordered attributes, ``W = D C`` with ``C`` the zero-padded
  prefix-sum operator and ``D`` the ``2^d`` signed corners of each box: ``G = Cᵀ (DᵀD) C`` is
  applied in ``O(n + m)`` per vector without forming ``W``;
* :class:`MarginalsGram` — weighted marginals over any domain size: the algebra spanned by
  ``G_S = ⊗_{i∈S} I ⊗_{i∉S} J`` is diagonal in one fixed basis (below), so traces, inverses
  and singular values are sums over the ``2^d`` attribute subsets, never over cells;
* :class:`KronGram` / :class:`SumGram` — Kronecker products of per-attribute Grams, and sums
  of them (the per-factor structure HDMM's OPT_⊗ works with);
* :class:`DenseGram` — anything else, explicitly, on small domains.

The marginals basis: split each ``R^{n_i} = span(1) ⊕ 1^⊥``. For a set ``a`` of attributes let
``U_a = ⊗_{i∈a} 1^⊥ ⊗_{i∉a} span(1)`` (dimension ``prod_{i∈a}(n_i - 1)``). ``I`` acts as 1 on
both parts and ``J = 11ᵀ`` as ``n_i`` on ``span(1)`` and 0 on ``1^⊥``, so ``G_S`` acts on
``U_a`` as the scalar ``[a ⊆ S] prod_{i∉S} n_i``. Hence ``Σ_S c_S G_S`` has the eigenvalue
``μ(a) = Σ_{S ⊇ a} c_S prod_{i∉S} n_i`` on ``U_a`` (HDMM, VLDB 2018, §6.2 uses the same
algebra).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from functools import reduce
from typing import Sequence

import numpy as np
import scipy.linalg as la
import scipy.sparse as sp

from dpopt.errors import QueryError
from dpopt.model import binary_marginals
from dpopt.model.domain import Domain

__all__ = [
    "WorkloadGram", "DenseGram", "IdentityGram", "OnesGram", "RangeGram", "KronGram", "SumGram",
    "MarginalsGram", "superset_sums", "subset_sums", "MAX_DENSE_GRAM",
]

#: Largest ``n`` for which an explicit ``n x n`` Gram matrix is built.
MAX_DENSE_GRAM = 12_000


def _as_block(V: np.ndarray, n: int, who: str) -> tuple[np.ndarray, bool]:
    V = np.asarray(V, dtype=np.float64)
    if V.shape[0] != n or V.ndim not in (1, 2):
        raise QueryError(f"{who}: expected {n} rows, got shape {V.shape}")
    return (V[:, None], True) if V.ndim == 1 else (V, False)


def _eigenvalues(matrix: np.ndarray) -> np.ndarray:
    """The eigenvalues of a symmetric PSD matrix, clipped at zero."""
    return np.clip(la.eigvalsh(np.asarray(matrix, dtype=np.float64), check_finite=False), 0.0, None)


#: Eigenvalues below this fraction of the largest count as zero (for :meth:`WorkloadGram.rank`).
RANK_TOLERANCE = 1e-10


class WorkloadGram(ABC):
    """``G = WᵀW`` of a workload over the cells of :attr:`domain` (C order)."""

    domain: Domain

    @property
    def size(self) -> int:
        return self.domain.size

    @abstractmethod
    def trace(self) -> float:
        """``trace(G)``: the workload's squared Frobenius norm."""

    @abstractmethod
    def diagonal(self) -> np.ndarray:
        """``diag(G)``: the squared column norms of ``W``."""

    @abstractmethod
    def _apply(self, V: np.ndarray) -> np.ndarray: ...

    def apply(self, V: np.ndarray) -> np.ndarray:
        """``G V`` for a vector ``(n,)`` or a block ``(n, k)``."""
        block, vector = _as_block(V, self.size, type(self).__name__)
        out = self._apply(block)
        return out[:, 0] if vector else out

    def apply_rows(self, R: np.ndarray) -> np.ndarray:
        """``R G`` for a block of row vectors ``(k, n)`` (``G`` is symmetric): the layout the
        strategy optimisers use, cheaper than :meth:`apply` for the structured forms."""
        R = np.asarray(R, dtype=np.float64)
        if R.ndim != 2 or R.shape[1] != self.size:
            raise QueryError(f"{type(self).__name__}: expected rows of length {self.size}, got shape {R.shape}")
        return self._apply_rows(R)

    def _apply_rows(self, R: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(self._apply(np.ascontiguousarray(R.T)).T)

    def dense(self) -> np.ndarray:
        """``G`` explicitly (``n <=`` :data:`MAX_DENSE_GRAM`)."""
        n = self.size
        if n > MAX_DENSE_GRAM:
            raise QueryError(f"{type(self).__name__}: an explicit {n} x {n} Gram matrix is above the limit "
                             f"of {MAX_DENSE_GRAM} cells")
        out = np.empty((n, n))
        step = max(1, 4_000_000 // n)
        for start in range(0, n, step):
            stop = min(n, start + step)
            block = np.zeros((n, stop - start))
            block[np.arange(start, stop), np.arange(stop - start)] = 1.0
            out[:, start:stop] = self._apply(block)
        return out

    def spectrum(self) -> np.ndarray:
        """The non-zero eigenvalues of ``G`` (possibly with zeros; computed once and kept).

        Generic: the explicit ``G``; structured forms use a smaller matrix with the same
        non-zero eigenvalues.
        """
        cached = getattr(self, "_spectrum", None)
        if cached is None:
            cached = self._compute_spectrum()
            self._spectrum = cached
        return cached

    def _compute_spectrum(self) -> np.ndarray:
        return _eigenvalues(self.dense())

    def nuclear_norm(self) -> float:
        """``sum_i σ_i(W) = trace(G^{1/2})``, the sum of the workload's singular values (eigenvalues
        below :data:`RANK_TOLERANCE` of the largest are rounding noise of zeros and left out)."""
        eig = self.spectrum()
        return float(np.sqrt(eig[eig > RANK_TOLERANCE * max(float(eig.max(initial=0.0)), 1e-300)]).sum())

    def rank(self) -> int:
        """``rank(W)``; also ``trace(W (WᵀW)⁺ Wᵀ)``, the error of measuring the workload itself."""
        eig = self.spectrum()
        return int(np.sum(eig > RANK_TOLERANCE * max(float(eig.max(initial=0.0)), 1e-300)))


class DenseGram(WorkloadGram):
    """An explicit symmetric PSD ``G``."""

    def __init__(self, domain: Domain, matrix: np.ndarray) -> None:
        n = domain.size
        G = np.asarray(matrix.toarray() if sp.issparse(matrix) else matrix, dtype=np.float64)
        if G.shape != (n, n):
            raise QueryError(f"DenseGram: expected a {n} x {n} matrix, got shape {G.shape}")
        self.domain, self.matrix = domain, G

    @classmethod
    def of_matrix(cls, domain: Domain, W) -> "DenseGram":
        """``WᵀW`` of an explicit workload matrix."""
        W = sp.csr_matrix(W, dtype=np.float64)
        return cls(domain, (W.T @ W).toarray())

    def trace(self) -> float:
        return float(np.trace(self.matrix))

    def diagonal(self) -> np.ndarray:
        return np.diag(self.matrix).copy()

    def _apply(self, V):
        return self.matrix @ V

    def dense(self) -> np.ndarray:
        return self.matrix


class _UnitDiagonalGram(WorkloadGram):
    """A Gram with ones on the diagonal, known by its domain alone."""

    def __init__(self, domain: Domain) -> None:
        self.domain = domain

    def trace(self) -> float:
        return float(self.size)

    def diagonal(self) -> np.ndarray:
        return np.ones(self.size)


class IdentityGram(_UnitDiagonalGram):
    """``G = I`` (the identity workload, a marginal on every attribute)."""

    def _apply(self, V):
        return V.copy()

    def nuclear_norm(self) -> float:
        return float(self.size)

    def rank(self) -> int:
        return self.size


class OnesGram(_UnitDiagonalGram):
    """``G = 11ᵀ`` (the total)."""

    def _apply(self, V):
        return np.broadcast_to(V.sum(axis=0), V.shape).copy()

    def nuclear_norm(self) -> float:
        return float(np.sqrt(float(self.size)))

    def rank(self) -> int:
        return 1


# ---- ranges --------------------------------------------------------------------------------
class RangeGram(WorkloadGram):
    """``Wᵀ diag(w) W`` for a batch of boxes over every attribute of ``domain``.

    Parameters
    ----------
    domain : Domain
        Small enough to hold densely; every attribute is ordered by its codes.
    lows, highs : ndarray of int, shape (m, len(domain))
        Inclusive bounds of each box (a full range on attributes a box does not restrict).
    weights : ndarray, shape (m,), optional
        Non-negative row weights ``w`` (default 1).
    """

    def __init__(self, domain: Domain, lows, highs, weights=None) -> None:
        self.domain = domain
        domain.require_dense("a range workload's Gram operator")
        self.lows = np.asarray(lows, dtype=np.int64).reshape(-1, len(domain))
        self.highs = np.asarray(highs, dtype=np.int64).reshape(-1, len(domain))
        m = self.lows.shape[0]
        self.weights = np.ones(m) if weights is None else np.asarray(weights, dtype=np.float64).reshape(m)
        if (self.weights < 0).any() or not np.isfinite(self.weights).all():
            raise QueryError("RangeGram: row weights must be finite and non-negative")
        self.padded = tuple(s + 1 for s in domain.sizes)
        # D: the signed corners of every box on the padded prefix grid (2^d entries per row).
        d = len(domain)
        rows, cols, signs = [], [], []
        for corner in range(1 << d):
            bits = [(corner >> (d - 1 - j)) & 1 for j in range(d)]
            idx = tuple(self.highs[:, j] + 1 if b else self.lows[:, j] for j, b in enumerate(bits))
            rows.append(np.arange(m))
            cols.append(np.ravel_multi_index(idx, self.padded))
            signs.append(np.full(m, (-1.0) ** (d - sum(bits))))
        self.corners = sp.csr_matrix((np.concatenate(signs), (np.concatenate(rows), np.concatenate(cols))),
                                     shape=(m, int(np.prod(self.padded))))
        self._inner = sp.csr_matrix(self.corners.T @ sp.diags(self.weights) @ self.corners)

    @classmethod
    def of_query(cls, query, weights=None) -> "RangeGram":
        """The Gram of a :class:`~dpopt.model.queries.ranges.RangeQueries` (full ranges on the
        attributes it does not restrict)."""
        dom = query.domain
        lows = np.zeros((query.num_rows, len(dom)), dtype=np.int64)
        highs = np.broadcast_to(np.array(dom.sizes) - 1, lows.shape).copy()
        for j, a in enumerate(query.attrs):
            lows[:, dom.axis(a)] = query.lows[:, j]
            highs[:, dom.axis(a)] = query.highs[:, j]
        return cls(dom, lows, highs, weights)

    @property
    def num_rows(self) -> int:
        return self.lows.shape[0]

    # Prefix sums C (n -> padded grid) and their transpose, on blocks of rows (k, n): the
    # cumulative sums then run along contiguous memory.
    def _prefix_rows(self, R: np.ndarray) -> np.ndarray:
        k, d = R.shape[0], len(self.domain)
        inner = R.reshape((k,) + self.domain.sizes)
        for ax in range(1, d + 1):
            inner = np.cumsum(inner, axis=ax)
        out = np.zeros((k,) + self.padded)
        out[(slice(None),) + (slice(1, None),) * d] = inner
        return out.reshape(k, -1)

    def _prefix_t_rows(self, Z: np.ndarray) -> np.ndarray:
        k, d = Z.shape[0], len(self.domain)
        t = Z.reshape((k,) + self.padded)
        for ax in range(1, d + 1):
            # (Cᵀ z)_j = sum_{t > j} z_t = total - (z_0 + ... + z_j)
            t = t.sum(axis=ax, keepdims=True) - np.cumsum(t, axis=ax)
            t = t[(slice(None),) * ax + (slice(0, -1),)]
        return np.ascontiguousarray(t).reshape(k, -1)

    def _prefix(self, V: np.ndarray) -> np.ndarray:
        """``C V`` for a block of columns ``(n, k)``."""
        return self._prefix_rows(np.ascontiguousarray(np.asarray(V, dtype=np.float64).T)).T

    def _apply_rows(self, R):
        inner = np.ascontiguousarray(np.asarray(self._inner @ self._prefix_rows(R).T).T)
        return self._prefix_t_rows(inner)

    def _apply(self, V):
        return self._apply_rows(np.ascontiguousarray(V.T)).T

    def diagonal(self) -> np.ndarray:
        return self._prefix_t_rows((self.corners.T @ self.weights)[None, :])[0]

    def trace(self) -> float:
        volumes = np.prod(self.highs - self.lows + 1, axis=1).astype(np.float64)
        return float(self.weights @ volumes)

    def compressed(self) -> tuple["RangeGram", np.ndarray]:
        """The same boxes over blocks of values no box separates, and the block sizes.

        ``W = W_c E`` with ``E`` summing the values of each block, so ``G``'s non-zero
        eigenvalues are those of ``B^{1/2} G_c B^{1/2}`` with ``B`` the block sizes.
        """
        sizes, lows, highs, blocks = [], [], [], []
        for j, n in enumerate(self.domain.sizes):
            cuts = np.unique(np.concatenate([[0, n], self.lows[:, j], self.highs[:, j] + 1]))
            sizes.append(cuts.size - 1)
            lows.append(np.searchsorted(cuts, self.lows[:, j]))
            highs.append(np.searchsorted(cuts, self.highs[:, j] + 1) - 1)
            blocks.append(np.diff(cuts).astype(np.float64))
        dom = Domain(tuple(self.domain.attrs), tuple(sizes))
        weight = reduce(np.multiply.outer, blocks).reshape(-1)
        return RangeGram(dom, np.stack(lows, axis=1), np.stack(highs, axis=1), self.weights), weight

    def _compute_spectrum(self) -> np.ndarray:
        """From the smaller of the compressed Gram and the box-overlap matrix (same non-zero
        eigenvalues as ``G``)."""
        small, block = self.compressed()
        m = self.num_rows
        if m < small.size:
            # W diag(w) Wᵀ: weighted volumes of pairwise intersections, m x m.
            overlap = np.ones((m, m))
            for j in range(len(self.domain)):
                lo = np.maximum.outer(self.lows[:, j], self.lows[:, j])
                hi = np.minimum.outer(self.highs[:, j], self.highs[:, j])
                overlap *= np.clip(hi - lo + 1, 0, None)
            root = np.sqrt(self.weights)
            return _eigenvalues(root[:, None] * overlap * root[None, :])
        root = np.sqrt(block)
        return _eigenvalues(root[:, None] * small.dense() * root[None, :])


# ---- Kronecker products and sums ---------------------------------------------------------------
class KronGram(WorkloadGram):
    """``weight · G_1 ⊗ ... ⊗ G_F`` over consecutive attribute groups.

    Parameters
    ----------
    domain : Domain
    factors : sequence of WorkloadGram
        Each over ``domain.project(group)``; the groups, concatenated, are the domain's
        attributes in order.
    weight : float
    """

    def __init__(self, domain: Domain, factors: Sequence[WorkloadGram], weight: float = 1.0) -> None:
        covered = tuple(a for f in factors for a in f.domain.attrs)
        if covered != domain.attrs:
            raise QueryError(f"KronGram: the factors cover {list(covered)}, not the domain's {list(domain.attrs)}")
        self.domain, self.factors, self.weight = domain, tuple(factors), float(weight)

    @property
    def groups(self) -> tuple[tuple[str, ...], ...]:
        return tuple(f.domain.attrs for f in self.factors)

    def trace(self) -> float:
        return self.weight * float(np.prod([f.trace() for f in self.factors]))

    def diagonal(self) -> np.ndarray:
        return self.weight * reduce(np.multiply.outer, [f.diagonal() for f in self.factors]).reshape(-1)

    def _apply(self, V):
        k = V.shape[1]
        widths = [f.size for f in self.factors]
        t = V.reshape(widths + [k])
        for axis, f in enumerate(self.factors):
            moved = np.moveaxis(t, axis, 0)
            rest = moved.shape[1:]
            t = np.moveaxis(f.apply(moved.reshape(widths[axis], -1)).reshape((widths[axis],) + rest), 0, axis)
        return self.weight * t.reshape(-1, k)

    def dense(self) -> np.ndarray:
        if self.size > MAX_DENSE_GRAM:
            return super().dense()  # raises naming the limit
        return self.weight * reduce(np.kron, [f.dense() for f in self.factors])

    def nuclear_norm(self) -> float:
        # Singular values of a Kronecker product are the products of the factors' ones.
        return float(np.sqrt(self.weight) * np.prod([f.nuclear_norm() for f in self.factors]))

    def rank(self) -> int:
        return int(np.prod([f.rank() for f in self.factors])) if self.weight > 0 else 0


class SumGram(WorkloadGram):
    """``G = sum_t G_t`` (a stacked workload), every term over the same domain."""

    def __init__(self, domain: Domain, terms: Sequence[WorkloadGram]) -> None:
        terms = tuple(terms)
        if not terms:
            raise QueryError("SumGram: no terms")
        for t in terms:
            if t.domain != domain:
                raise QueryError(f"SumGram: a term is over {t.domain}, not {domain}")
        self.domain, self.terms = domain, terms

    def trace(self) -> float:
        return float(sum(t.trace() for t in self.terms))

    def diagonal(self) -> np.ndarray:
        return sum(t.diagonal() for t in self.terms)

    def _apply(self, V):
        return sum(t.apply(V) for t in self.terms)


# ---- the marginals algebra -------------------------------------------------------------------
def _axis_slices(ndim: int, axis: int) -> tuple[tuple, tuple]:
    lo, hi = [slice(None)] * ndim, [slice(None)] * ndim
    lo[axis], hi[axis] = 0, 1
    return tuple(lo), tuple(hi)


def superset_sums(values: np.ndarray) -> np.ndarray:
    """``out[a] = sum_{S ⊇ a} values[S]`` over subsets indexed by ``(2,) * d`` arrays
    (the model's transform, :func:`dpopt.model.binary_marginals.superset_sums`, kept in shape)."""
    return binary_marginals.superset_sums(values).reshape(np.shape(values))


def subset_sums(values: np.ndarray) -> np.ndarray:
    """``out[S] = sum_{a ⊆ S} values[a]`` (:func:`dpopt.model.binary_marginals.subset_sums`, kept in shape)."""
    return binary_marginals.subset_sums(values).reshape(np.shape(values))


def subset_outer(domain: Domain, inside, outside) -> np.ndarray:
    """``prod_i (inside(n_i) if i ∈ S else outside(n_i))`` for every subset ``S``, as ``(2,) * d``."""
    per_attr = [np.array([float(outside(n)), float(inside(n))]) for n in domain.sizes]
    return reduce(np.multiply.outer, per_attr)


class MarginalsGram(WorkloadGram):
    """``G = sum_S c_S G_S`` over every subset ``S`` of the attributes (module notes).

    Parameters
    ----------
    domain : Domain
        Any size: nothing here is per cell except :meth:`apply` and :meth:`diagonal`.
    weights : ndarray, shape (2,) * len(domain)
        ``c_S`` with axis ``i`` at 1 when attribute ``i`` is in ``S``.
    """

    def __init__(self, domain: Domain, weights: np.ndarray) -> None:
        c = np.asarray(weights, dtype=np.float64)
        if c.shape != (2,) * len(domain):
            raise QueryError(f"MarginalsGram: weights must have shape {(2,) * len(domain)}, got {c.shape}")
        if not np.isfinite(c).all():
            raise QueryError("MarginalsGram: weights must be finite")
        self.domain, self.weights = domain, c
        mu = self.eigenvalues()
        if (mu < -1e-9 * max(float(np.abs(mu).max()), 1e-300)).any():
            raise QueryError("MarginalsGram: the weights do not give a positive semidefinite matrix")

    @classmethod
    def from_eigenvalues(cls, domain: Domain, mu: np.ndarray) -> "MarginalsGram":
        """The member of the algebra with eigenvalue ``mu[a]`` on ``U_a`` (Möbius inversion of
        :meth:`eigenvalues`; the weights may then be negative)."""
        t = np.array(mu, dtype=np.float64, copy=True)
        for axis in range(t.ndim):
            lo, hi = _axis_slices(t.ndim, axis)
            t[lo] -= t[hi]
        return cls(domain, t / subset_outer(domain, lambda n: 1, lambda n: n))

    @classmethod
    def of_sets(cls, domain: Domain, sets: Sequence[Sequence[str]], weights=None) -> "MarginalsGram":
        """``sum_k w_k G_{S_k}`` for attribute sets ``S_k`` (weights default to 1)."""
        c = np.zeros((2,) * len(domain))
        w = np.ones(len(sets)) if weights is None else np.asarray(weights, dtype=np.float64)
        for attrs, wk in zip(sets, w):
            index = tuple(1 if a in set(attrs) else 0 for a in domain.attrs)
            domain.check_attrs(attrs)
            c[index] += wk
        return cls(domain, c)

    def outside_sizes(self) -> np.ndarray:
        """``prod_{i∉S} n_i`` for every ``S``."""
        return subset_outer(self.domain, lambda n: 1, lambda n: n)

    def dimensions(self) -> np.ndarray:
        """``dim U_a = prod_{i∈a} (n_i - 1)`` for every ``a``."""
        return subset_outer(self.domain, lambda n: n - 1, lambda n: 1)

    def eigenvalues(self) -> np.ndarray:
        """``μ(a)``, the eigenvalue of ``G`` on ``U_a``, for every ``a``."""
        return superset_sums(self.weights * self.outside_sizes())

    def pinv_weights(self) -> np.ndarray:
        """``κ`` with ``G⁺ = sum_T κ_T G_T``: the pseudo-inverse in the same algebra.

        ``G⁺ = sum_{a: μ(a) > 0} μ(a)^{-1} P_a`` and ``P_a = sum_{T ⊆ a} (-1)^{|a∖T|} G_T / N_{T^c}``
        (``P_a`` the projection on ``U_a``), so ``κ_T = N_{T^c}^{-1} sum_{a ⊇ T} (-1)^{|a∖T|} / μ(a)``
        over the ``a`` with ``μ(a)`` above :data:`RANK_TOLERANCE` of the largest.
        """
        mu = self.eigenvalues()
        live = mu > RANK_TOLERANCE * max(float(mu.max()), 1e-300)
        kappa = np.where(live, 1.0 / np.where(live, mu, 1.0), 0.0)
        for axis in range(kappa.ndim):  # superset Möbius transform, sign (-1)^{|a∖T|}
            lo, hi = _axis_slices(kappa.ndim, axis)
            kappa[lo] -= kappa[hi]
        return kappa / self.outside_sizes()

    def trace(self) -> float:
        return float(self.weights.sum() * float(self.size))

    def diagonal(self) -> np.ndarray:
        n = self.domain.require_dense("the diagonal of a marginal workload's Gram")
        return np.full(n, float(self.weights.sum()))

    def sets(self) -> list[tuple[tuple[str, ...], float]]:
        """``(S, c_S)`` for every set with a non-zero weight (negative weights only for members
        built by :meth:`from_eigenvalues`, e.g. Fourier strategies)."""
        out = []
        for index in zip(*np.nonzero(self.weights)):
            attrs = tuple(a for a, bit in zip(self.domain.attrs, index) if bit)
            out.append((attrs, float(self.weights[index])))
        return out

    def _apply(self, V):
        self.domain.require_dense("a marginal workload's Gram operator")
        k = V.shape[1]
        t = V.reshape(self.domain.sizes + (k,))
        out = np.zeros_like(t)
        for attrs, c in self.sets():
            summed = tuple(i for i, a in enumerate(self.domain.attrs) if a not in attrs)
            out += c * t.sum(axis=summed, keepdims=True) if summed else c * t
        return out.reshape(-1, k)

    def nuclear_norm(self) -> float:
        mu = self.eigenvalues()
        return float((self.dimensions() * np.sqrt(np.clip(mu, 0.0, None))).sum())

    def rank(self) -> int:
        return int(round(float(self.dimensions()[self.eigenvalues() > 0].sum())))

    def as_kron_terms(self) -> list[KronGram]:
        """``G`` as a sum of Kronecker products of per-attribute ``I`` and ``J``."""
        out = []
        for attrs, c in self.sets():
            factors = [IdentityGram(self.domain.project([a])) if a in attrs else OnesGram(self.domain.project([a]))
                       for a in self.domain.attrs]
            out.append(KronGram(self.domain, factors, c))
        return out


# ---- scaling ------------------------------------------------------------------------------------
def scaled(gram: WorkloadGram, factor: float) -> WorkloadGram:
    """``factor · G`` in the same structured form."""
    factor = float(factor)
    if isinstance(gram, MarginalsGram):
        return MarginalsGram(gram.domain, gram.weights * factor)
    if isinstance(gram, RangeGram):
        return RangeGram(gram.domain, gram.lows, gram.highs, gram.weights * factor)
    if isinstance(gram, KronGram):
        return KronGram(gram.domain, gram.factors, gram.weight * factor)
    if isinstance(gram, SumGram):
        return SumGram(gram.domain, [scaled(t, factor) for t in gram.terms])
    if isinstance(gram, (IdentityGram, OnesGram)):
        return KronGram(gram.domain, [gram], factor)
    return DenseGram(gram.domain, gram.dense() * factor)


# ---- the p-Identity strategy's Gram --------------------------------------------------------------
class PIdentityGram(WorkloadGram):
    """``AᵀA = D (I + ΘᵀΘ) D`` of a p-Identity strategy (``D = diag(1 / s)``), with its
    inverse by the Woodbury identity: ``S (I - Θᵀ K Θ) S``, ``K = (I_p + ΘΘᵀ)^{-1}``.

    Parameters
    ----------
    domain : Domain
        The cells ``Θ``'s columns index.
    theta : ndarray, shape (p, n)
    scale : ndarray, shape (n,)
        ``s`` (see :mod:`dpopt.model.queries.pidentity`).
    """

    def __init__(self, domain: Domain, theta: np.ndarray, scale: np.ndarray) -> None:
        self.domain = domain
        self.theta = np.asarray(theta, dtype=np.float64)
        self.scale = np.asarray(scale, dtype=np.float64)
        if self.theta.shape[1] != domain.size or self.scale.shape != (domain.size,):
            raise QueryError(f"PIdentityGram: theta must have {domain.size} columns and scale {domain.size} entries")
        self.kernel = la.inv(np.eye(self.theta.shape[0]) + self.theta @ self.theta.T)

    def trace(self) -> float:
        return float(self.diagonal().sum())

    def diagonal(self) -> np.ndarray:
        return (1.0 + (self.theta * self.theta).sum(axis=0)) / self.scale**2

    def _apply(self, V):
        u = V / self.scale[:, None]
        return (u + self.theta.T @ (self.theta @ u)) / self.scale[:, None]

    def inverse_apply(self, V: np.ndarray) -> np.ndarray:
        """``(AᵀA)^{-1} V``."""
        u = np.asarray(V, dtype=np.float64) * (self.scale if np.ndim(V) == 1 else self.scale[:, None])
        u = u - self.theta.T @ (self.kernel @ (self.theta @ u))
        return u * (self.scale if np.ndim(V) == 1 else self.scale[:, None])

    def inverse_dense(self) -> np.ndarray:
        st = self.theta * self.scale[None, :]
        return np.diag(self.scale**2) - st.T @ (self.kernel @ st)

    def trace_with(self, gram: WorkloadGram) -> float:
        """``trace(G (AᵀA)^{-1}) = trace(X) - trace(K Θ X Θᵀ)`` with ``X = S G S``."""
        st = self.theta * self.scale[None, :]          # Θ S, p x n
        gy = gram.apply_rows(st)                         # Θ S G, p x n
        first = float(gram.diagonal() @ self.scale**2)   # trace(S G S)
        return first - float(np.sum(self.kernel * (gy @ st.T)))
