"""The structured Gram matrix ``QᵀQ`` of any model query (workload or strategy alike).

:func:`gram_of` recognises the query kinds whose Gram has a fast form (marginals, identity,
total, ranges and trees of ranges, Kronecker products, p-Identity, stacks and scalar weights of
these) and falls back to the explicit matrix on small domains.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from dpopt.errors import QueryError
from dpopt.model.queries.base import LinearQuery
from dpopt.model.queries.basic import Identity, Total
from dpopt.model.queries.combine import Stack, Weighted
from dpopt.model.queries.fourier import FourierParity
from dpopt.model.queries.kronecker import Kronecker
from dpopt.model.queries.marginal import Marginal
from dpopt.model.queries.marginal_workload import MarginalWorkload
from dpopt.model.queries.pidentity import PIdentity
from dpopt.model.queries.ranges import RangeQueries
from dpopt.model.queries.residual import Residuals, residual_row_norm2
from dpopt.strategy.gram import (
    MAX_DENSE_GRAM,
    DenseGram,
    KronGram,
    MarginalsGram,
    OnesGram,
    PIdentityGram,
    RangeGram,
    SumGram,
    WorkloadGram,
    scaled,
)

__all__ = ["gram_of"]


def gram_of(query: LinearQuery) -> WorkloadGram:
    """``QᵀQ`` of ``query`` in the fastest form known for its kind.

    Raises
    ------
    QueryError
        When the query has no structured form and its domain is above
        :data:`~dpopt.strategy.gram.MAX_DENSE_GRAM` cells.
    """
    if not isinstance(query, LinearQuery):
        raise QueryError(f"gram_of: expected a LinearQuery, got {type(query).__name__}")
    dom = query.domain
    if isinstance(query, Identity):
        return MarginalsGram.of_sets(dom, [dom.attrs])
    if isinstance(query, Total):
        return MarginalsGram.of_sets(dom, [()])
    if isinstance(query, Marginal):
        return MarginalsGram.of_sets(dom, [query.attrs])
    if isinstance(query, MarginalWorkload):
        return MarginalsGram.of_sets(dom, [m.attrs for m in query.marginals])
    if isinstance(query, RangeQueries):
        return RangeGram.of_query(query)
    if isinstance(query, Residuals) and len(dom) <= MAX_ALGEBRA_ATTRIBUTES:
        return _residual_gram(query)
    if isinstance(query, PIdentity):
        return _pidentity_gram(query)
    if isinstance(query, FourierParity):
        return _fourier_gram(query)
    if isinstance(query, Weighted):
        if np.ndim(query.weights) == 0:
            return scaled(gram_of(query.query), float(query.weights) ** 2)
        if isinstance(query.query, RangeQueries):
            return RangeGram.of_query(query.query, weights=np.asarray(query.weights) ** 2)
    if isinstance(query, Stack):
        return _stack_gram(query)
    if isinstance(query, Kronecker) and all(f.attrs for f in query.factors):
        factors = [DenseGram.of_matrix(dom.project(f.attrs), f.matrix) for f in query.factors]
        return KronGram(dom, factors)
    return _explicit(query)


#: Largest number of attributes for which the marginals algebra's ``(2,) * d`` arrays are built.
MAX_ALGEBRA_ATTRIBUTES = 24


def _residual_gram(query: Residuals) -> MarginalsGram:
    """Residual rows of set ``a`` are ``w_a κ_a`` times an orthonormal basis of ``U_a``, so ``QᵀQ``
    has the eigenvalue ``(w_a κ_a)²`` on ``U_a`` and 0 on the residuals it does not measure."""
    dom = query.domain
    mu = np.zeros((2,) * len(dom))
    for attrs, w in zip(query.sets, query.weights):
        mu[tuple(1 if a in attrs else 0 for a in dom.attrs)] = float(w) ** 2 * residual_row_norm2(dom, attrs)
    return MarginalsGram.from_eigenvalues(dom, mu)


def _fourier_gram(query: FourierParity) -> MarginalsGram:
    """Parities of a binary domain: the rows ``±scale`` are orthogonal, each of squared norm
    ``N scale²``, and parity ``a`` spans ``U_a`` (one dimension on binary attributes)."""
    dom = query.domain
    mu = np.zeros((2,) * len(dom))
    for parity in query.subsets:
        mu[tuple(1 if a in parity else 0 for a in dom.attrs)] = float(dom.size) * query.scale**2
    return MarginalsGram.from_eigenvalues(dom, mu)


def _explicit(query: LinearQuery) -> DenseGram:
    n = query.domain.size
    if n > MAX_DENSE_GRAM:
        raise QueryError(f"{query.name}: no structured Gram is known for this query and its domain has {n:.3g} cells, "
                         f"above the {MAX_DENSE_GRAM} cells an explicit Gram may have")
    return DenseGram.of_matrix(query.domain, sp.csr_matrix(query.to_sparse()))


def _pidentity_gram(query: PIdentity) -> WorkloadGram:
    dom = query.domain
    inner = PIdentityGram(query.sub_domain, query.theta, query.scale)
    if query.attrs == dom.attrs:
        return inner
    # Over a marginal: the strategy is A_S M_S, whose Gram is the Kronecker product of
    # A_SᵀA_S with J on the other attributes, when S is a run of consecutive attributes.
    axes = [dom.axis(a) for a in query.attrs]
    if axes != list(range(axes[0], axes[0] + len(axes))):
        return _explicit(query)
    before, after = dom.attrs[: axes[0]], dom.attrs[axes[-1] + 1:]
    factors = ([OnesGram(dom.project([a])) for a in before] + [inner]
               + [OnesGram(dom.project([a])) for a in after])
    return KronGram(dom, factors)


def _stack_gram(query: Stack) -> WorkloadGram:
    parts = [gram_of(q) for q in query.parts]
    if all(isinstance(p, MarginalsGram) for p in parts):
        return MarginalsGram(query.domain, sum(p.weights for p in parts))
    if all(isinstance(p, RangeGram) for p in parts):
        return RangeGram(query.domain, np.concatenate([p.lows for p in parts]),
                         np.concatenate([p.highs for p in parts]), np.concatenate([p.weights for p in parts]))
    return SumGram(query.domain, parts)
