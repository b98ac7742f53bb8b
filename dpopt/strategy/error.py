"""Error before data: the expected squared error of a strategy for a workload.

Measure a strategy ``A`` with independent noise of variance ``v`` per answer, ``y = A x + z``,
reconstruct ``x^ = A⁺ y`` and answer ``W x^``. When ``A`` supports ``W`` (every workload query
is a linear combination of strategy queries, ``W (AᵀA)⁺ AᵀA = W``), ``W x^ = W x + W A⁺ z`` and

    E ‖W x^ - W x‖² = v · trace(W (AᵀA)⁺ Wᵀ) = v · trace(G (AᵀA)⁺),     G = WᵀW

(Li, Hay, Rastogi, Miklau, McGregor, PODS 2010, Prop. 4; VLDB J. 2015, Prop. 7). With Laplace
noise calibrated to ``A``'s L1 sensitivity ``‖A‖₁`` at ε, ``v = 2 ‖A‖₁² / ε²``; with Gaussian
noise ``v = c ‖A‖²_{1→2}`` for the mechanism's constant ``c`` (see :mod:`dpopt.strategy.bound`).
This module computes the trace term (noise-free, data-free), each query's share of it
(``diag(W (AᵀA)⁺ Wᵀ)``), and refuses a strategy that does not support the workload.

The variance ``v`` comes from the noise law: :func:`dpopt.privacy.mechanisms.calibrate` gives
the exact variance of dpopt's discrete samplers, which is what :func:`expected_error` takes.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg as la
import scipy.sparse as sp
from scipy.linalg.lapack import dpotrf, dpotri

from dpopt.errors import QueryError
from dpopt.model.queries.base import LinearQuery
from dpopt.model.queries.combine import Stack
from dpopt.model.queries.marginal import Marginal
from dpopt.model.queries.marginal_workload import MarginalWorkload
from dpopt.model.queries.ranges import RangeQueries
from dpopt.strategy.gram import (
    DenseGram,
    IdentityGram,
    KronGram,
    MarginalsGram,
    OnesGram,
    PIdentityGram,
    RangeGram,
    SumGram,
    WorkloadGram,
)
from dpopt.strategy.workload import gram_of

__all__ = ["trace_term", "expected_error", "per_query_variance", "dense_pinv", "UNSUPPORTED"]

#: Eigenvalues below this fraction of the largest count as zero.
RANK_TOLERANCE = 1e-10
#: Relative workload energy outside the strategy's row space that still counts as supported.
SUPPORT_TOLERANCE = 1e-8

UNSUPPORTED = ("the strategy does not support the workload: some workload query is not a linear "
               "combination of strategy queries, so its error would be unbounded")


# ---- pseudo-inverses ------------------------------------------------------------------------------
def dense_pinv(H: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(H⁺, N)`` of a symmetric PSD ``H``: Cholesky inverse when ``H`` is positive definite,
    else from its eigen-decomposition; ``N`` is an orthonormal basis of ``null(H)`` (empty
    when ``H`` is invertible)."""
    H = np.asarray(H, dtype=np.float64)
    n = H.shape[0]
    factor, info = dpotrf(H, lower=False, clean=True, overwrite_a=False)
    if info == 0 and np.min(np.abs(np.diag(factor))) > np.sqrt(RANK_TOLERANCE * np.max(np.diag(H))):
        inv, info = dpotri(factor, lower=False)
        if info == 0:
            upper = np.triu(inv)
            return upper + np.triu(inv, 1).T, np.zeros((n, 0))
    eigval, eigvec = la.eigh(H)
    keep = eigval > RANK_TOLERANCE * max(float(eigval.max()), 1e-300)
    pinv = (eigvec[:, keep] / eigval[keep]) @ eigvec[:, keep].T
    return pinv, eigvec[:, ~keep]


def strategy_pinv(strategy: WorkloadGram) -> tuple[np.ndarray, np.ndarray]:
    """:func:`dense_pinv` of a strategy's Gram, computed once and kept on the Gram object (so a
    strategy evaluated against many workloads is inverted once)."""
    cached = getattr(strategy, "_pinv", None)
    if cached is None:
        cached = dense_pinv(strategy.dense())
        strategy._pinv = cached
    return cached


def _check_support(gram: WorkloadGram, null: np.ndarray) -> None:
    """Raise unless ``W`` vanishes on ``null(AᵀA)`` (relative to ``‖W‖_F²``)."""
    if null.shape[1] == 0:
        return
    leak = float(np.sum(null * gram.apply(null)))
    if leak > SUPPORT_TOLERANCE * max(gram.trace(), 1e-300):
        raise QueryError(UNSUPPORTED)


# ---- the trace term ----------------------------------------------------------------------------
def trace_term(workload: WorkloadGram | LinearQuery, strategy: WorkloadGram | LinearQuery) -> float:
    """``trace(G (AᵀA)⁺)`` for a workload's Gram ``G`` and a strategy (or its Gram ``AᵀA``).

    Closed forms: the marginals algebra (marginal workloads under weighted-marginal strategies,
    any domain size), Kronecker strategies (a product over factors for Kronecker workloads and
    sums of them, marginal workloads included; a product of per-attribute interval forms for
    boxes), p-Identity strategies (Woodbury, one product of ``G`` with ``p`` vectors);
    otherwise explicit matrices on small domains.

    Raises
    ------
    QueryError
        When the strategy does not support the workload, or no form fits the sizes.
    """
    GW = workload if isinstance(workload, WorkloadGram) else gram_of(workload)
    GA = strategy if isinstance(strategy, WorkloadGram) else gram_of(strategy)
    if GW.domain != GA.domain:
        raise QueryError(f"the workload is over {GW.domain} but the strategy over {GA.domain}")
    if GA is GW:  # measuring the workload itself: trace(W (WᵀW)⁺ Wᵀ) = rank(W)
        return float(GW.rank())
    if isinstance(GA, MarginalsGram):
        mu = GA.eigenvalues()
        if isinstance(GW, MarginalsGram):
            return _algebra_trace(GW, mu)
        if mu.min() > 0 and np.allclose(mu, mu.flat[0], rtol=1e-12):  # a multiple of the identity
            return GW.trace() / float(mu.flat[0])
    if isinstance(GA, PIdentityGram):
        return GA.trace_with(GW)
    if isinstance(GA, KronGram):
        terms = kron_terms(GW, GA.groups)
        if terms is not None:
            # Marginal workloads repeat the factors I and J many times: compute each once.
            memo: dict = {}

            def factor(f, i):
                key = (i, type(f).__name__) if isinstance(f, (IdentityGram, OnesGram)) else (i, id(f))
                if key not in memo:
                    memo[key] = trace_term(f, GA.factors[i])
                return memo[key]

            total = 0.0
            for t in terms:
                total += t.weight * float(np.prod([factor(f, i) for i, f in enumerate(t.factors)]))
            return total / GA.weight
        if isinstance(GW, RangeGram) and all(len(g) == 1 for g in GA.groups):
            forms = [interval_forms(GA.factors[j], GW.lows[:, j], GW.highs[:, j]) for j in range(len(GA.groups))]
            return float(GW.weights @ np.prod(forms, axis=0)) / GA.weight
    pinv, null = strategy_pinv(GA)
    _check_support(GW, null)
    return float(np.sum(GW.dense() * pinv))


def _algebra_trace(GW: MarginalsGram, mu_a: np.ndarray) -> float:
    dims = GW.dimensions()
    mu_w = GW.eigenvalues()
    live = (mu_w > 0) & (dims > 0)
    if (mu_a[live] <= 0).any():
        raise QueryError(UNSUPPORTED)
    return float(np.sum(dims[live] * mu_w[live] / mu_a[live]))


def kron_terms(gram: WorkloadGram, groups: tuple[tuple[str, ...], ...]) -> list[KronGram] | None:
    """``gram`` as a sum of Kronecker products over exactly ``groups``, or None."""
    if isinstance(gram, SumGram):
        out = []
        for t in gram.terms:
            part = kron_terms(t, groups)
            if part is None:
                return None
            out.extend(part)
        return out
    if isinstance(gram, MarginalsGram):
        parts = [_regroup(t, groups) for t in gram.as_kron_terms()]
        return None if any(p is None for p in parts) else parts
    if isinstance(gram, KronGram):
        term = _regroup(gram, groups)
        return None if term is None else [term]
    if len(groups) == 1:
        return [KronGram(gram.domain, [gram])]
    return None


def _regroup(term: KronGram, groups) -> KronGram | None:
    """The same Kronecker product with its factors merged to match ``groups`` (None if a
    factor straddles two groups)."""
    factors, i = [], 0
    for group in groups:
        parts, covered = [], ()
        while i < len(term.factors) and len(covered) < len(group):
            parts.append(term.factors[i])
            covered += term.factors[i].domain.attrs
            i += 1
        if covered != tuple(group):
            return None
        sub = term.domain.project(group)
        factors.append(parts[0] if len(parts) == 1 else KronGram(sub, parts))
    return KronGram(term.domain, factors, term.weight)


# ---- per-query terms -------------------------------------------------------------------------------
def interval_forms(strategy: WorkloadGram, lows: np.ndarray, highs: np.ndarray) -> np.ndarray:
    """``g_rᵀ (AᵀA)⁺ g_r`` for the indicator ``g_r`` of each interval ``[low_r, high_r]`` of
    a one-attribute strategy (2-D prefix sums of the pseudo-inverse)."""
    lows, highs = np.asarray(lows), np.asarray(highs)
    if isinstance(strategy, PIdentityGram):
        return _pidentity_box_forms(strategy, _box_sums_1d(lows, highs))
    pinv, null = strategy_pinv(strategy)
    if null.shape[1]:
        leak = _box_sums_1d(lows, highs)(null)
        if np.sum(leak * leak) > SUPPORT_TOLERANCE * max(float(np.sum(highs - lows + 1)), 1.0):
            raise QueryError(UNSUPPORTED)
    n = pinv.shape[0]
    P = np.zeros((n + 1, n + 1))
    P[1:, 1:] = pinv.cumsum(axis=0).cumsum(axis=1)
    h = highs + 1
    return P[h, h] - P[lows, h] - P[h, lows] + P[lows, lows]


def _box_sums_1d(lows, highs):
    def sums(V):
        prefix = np.vstack([np.zeros((1, V.shape[1])), np.cumsum(V, axis=0)])
        return prefix[highs + 1] - prefix[lows]
    return sums


def _pidentity_box_forms(GA: PIdentityGram, box_sums) -> np.ndarray:
    """``wᵀ S (I - Θᵀ K Θ) S w`` for box indicators ``w`` (``box_sums(V)`` sums V's rows in each box)."""
    first = box_sums((GA.scale**2)[:, None])[:, 0]
    st = box_sums((GA.theta * GA.scale[None, :]).T)     # m x p: Θ S w per box
    return first - np.einsum("ip,pq,iq->i", st, GA.kernel, st)


def per_query_variance(workload: LinearQuery, strategy: LinearQuery | WorkloadGram) -> np.ndarray:
    """``diag(W (AᵀA)⁺ Wᵀ)``: each workload answer's error variance per unit noise variance.

    Structured for marginals under weighted-marginal strategies (all cells of a marginal share
    one value), for boxes under p-Identity, per-attribute Kronecker or small explicit
    strategies; explicit otherwise.
    """
    GA = strategy if isinstance(strategy, WorkloadGram) else gram_of(strategy)
    marginal_sets = _marginal_sets(workload)
    if marginal_sets is not None and isinstance(GA, MarginalsGram):
        return _algebra_per_query(workload, marginal_sets, GA)
    boxes = gram_of(workload) if isinstance(workload, (RangeQueries, Stack)) else None
    if isinstance(boxes, RangeGram) and np.all(boxes.weights == 1.0):
        return _box_variances(boxes, GA)
    W = sp.csr_matrix(workload.to_sparse(), dtype=np.float64)
    pinv, null = strategy_pinv(GA)
    _check_support(DenseGram.of_matrix(workload.domain, W), null)
    return np.asarray((W @ pinv) * W.toarray()).sum(axis=1) if W.shape[0] * W.shape[1] <= 5e7 else \
        np.asarray(W.multiply(W @ pinv).sum(axis=1)).ravel()


def _marginal_sets(workload: LinearQuery) -> list[tuple[str, ...]] | None:
    if isinstance(workload, Marginal):
        return [workload.attrs]
    if isinstance(workload, MarginalWorkload):
        return [m.attrs for m in workload.marginals]
    if isinstance(workload, Stack) and all(isinstance(q, Marginal) for q in workload.parts):
        return [q.attrs for q in workload.parts]
    return None


def _algebra_per_query(workload, sets, GA: MarginalsGram) -> np.ndarray:
    dom = workload.domain
    mu_a = GA.eigenvalues()
    out = []
    for attrs in sets:
        GS = MarginalsGram.of_sets(dom, [attrs])
        cells = int(np.prod([dom.size_of(a) for a in attrs]))
        out.append(np.full(cells, _algebra_trace(GS, mu_a) / cells))
    return np.concatenate(out)


def _box_variances(boxes: RangeGram, GA: WorkloadGram) -> np.ndarray:
    def box_sums(V):
        return np.asarray(boxes.corners @ boxes._prefix(np.asarray(V, dtype=np.float64)))

    if isinstance(GA, PIdentityGram):
        return _pidentity_box_forms(GA, box_sums)
    if isinstance(GA, KronGram) and all(len(g) == 1 for g in GA.groups):
        forms = [interval_forms(GA.factors[j], boxes.lows[:, j], boxes.highs[:, j]) for j in range(len(GA.groups))]
        return np.prod(forms, axis=0) / GA.weight
    if isinstance(GA, MarginalsGram):
        mu = GA.eigenvalues()
        if mu.min() > 0 and np.allclose(mu, mu.flat[0], rtol=1e-12):
            volumes = np.prod(boxes.highs - boxes.lows + 1, axis=1).astype(np.float64)
            return volumes / float(mu.flat[0])
    if len(boxes.domain) == 1:
        return interval_forms(GA, boxes.lows[:, 0], boxes.highs[:, 0])
    pinv, null = strategy_pinv(GA)
    _check_support(boxes, null)
    prefixed = boxes._prefix(pinv)                      # C H⁺, padded x n
    out = np.empty(boxes.num_rows)
    step = max(1, 2_000_000 // boxes.size)
    for start in range(0, boxes.num_rows, step):
        corners = boxes.corners[start:start + step]
        rows_h = np.asarray(corners @ prefixed)          # (W H⁺) for these rows
        out[start:start + step] = np.asarray(corners.multiply(boxes._prefix(rows_h.T).T).sum(axis=1)).ravel()
    return out


# ---- the expected error ------------------------------------------------------------------------------
def expected_error(workload, strategy, variance: float) -> float:
    """Expected total squared error ``v · trace(W (AᵀA)⁺ Wᵀ)`` of the workload's answers when the
    strategy is measured with noise of variance ``variance`` per answer (module notes)."""
    variance = float(variance)
    if not (np.isfinite(variance) and variance >= 0):
        raise QueryError(f"expected_error: the noise variance must be finite and >= 0, got {variance!r}")
    return variance * trace_term(workload, strategy)
