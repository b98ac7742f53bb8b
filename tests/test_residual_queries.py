"""Residual (contrast) queries against their explicit matrices, and their Gram in the marginals algebra."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pytest

from dpopt.errors import QueryError
from dpopt.model.domain import Domain
from dpopt.model.queries import Marginal, Residuals, contrast_basis
from dpopt.strategy.workload import gram_of

SHAPES = [(2, 2, 2, 2), (3, 2, 4), (2, 3)]


def every_set(domain):
    return [s for k in range(len(domain) + 1) for s in combinations(domain.attrs, k)]


@pytest.mark.parametrize("sizes", SHAPES)
def test_products_gram_and_norms_match_the_explicit_matrix(sizes):
    dom = Domain.from_dict({f"a{i}": s for i, s in enumerate(sizes)})
    gen = np.random.default_rng(0)  # test input
    sets = every_set(dom)
    q = Residuals(dom, sets, gen.random(len(sets)) + 0.5)
    A = q.to_sparse().toarray()
    x, y, v = gen.random(dom.size), gen.random(q.num_rows), gen.random(dom.size)
    assert np.allclose(q.matvec(x), A @ x, atol=1e-12)
    assert np.allclose(q.rmatvec(y), A.T @ y, atol=1e-12)
    assert q.fast_weighted_gram
    assert np.allclose(q.weighted_gram(v), (A * v) @ A.T, atol=1e-12)
    assert q.sensitivity(1) == pytest.approx(np.abs(A).sum(axis=0).max())
    assert q.sensitivity(2) == pytest.approx(np.sqrt((A**2).sum(axis=0).max()))
    # Dividing each row by w_a κ_a gives an orthonormal basis of the residual spaces, which tile the table.
    B = A / q.row_norm()[:, None]
    assert np.allclose(B @ B.T, np.eye(q.num_rows), atol=1e-12)
    assert q.num_rows == dom.size


@pytest.mark.parametrize("sizes", SHAPES)
def test_a_marginal_is_the_sum_of_the_residuals_below_it(sizes):
    dom = Domain.from_dict({f"a{i}": s for i, s in enumerate(sizes)})
    attrs = dom.attrs[:2]
    below = [s for k in range(3) for s in combinations(attrs, k)]
    q = Residuals(dom, below)
    B = q.to_sparse().toarray() / q.row_norm()[:, None]
    M = Marginal(dom, attrs).to_sparse().toarray()
    # The rows of M lie in the span of the residuals of its subsets: projecting loses nothing.
    assert np.allclose(M @ B.T @ B, M, atol=1e-12)


def test_binary_rows_are_integer_parities_and_the_gram_is_the_marginals_algebra():
    dom = Domain.from_dict({f"b{i}": 2 for i in range(5)})
    q = Residuals(dom, [(), ("b0",), ("b1", "b3")], [1, 2, 3])
    assert q.is_integer and q.sensitivity(1) == 6 and q.squared_l2_sensitivity() == 14
    A = q.to_sparse().toarray()
    assert np.array_equal(np.abs(A), np.repeat([[1.0], [2.0], [3.0]], dom.size, axis=1))
    assert np.allclose(gram_of(q).dense(), A.T @ A)


def test_helmert_contrasts_and_refusals():
    H = contrast_basis(5)
    assert np.allclose(H @ H.T, np.eye(4)) and np.allclose(H.sum(axis=1), 0)
    dom = Domain.from_dict({"a": 3, "b": 1})
    with pytest.raises(QueryError, match="single value"):
        Residuals(dom, [("b",)])
    with pytest.raises(QueryError, match="twice"):
        Residuals(dom, [("a",), ("a",)])
    with pytest.raises(QueryError, match="positive"):
        Residuals(dom, [("a",)], [0.0])
