"""Per-query variances ``diag(W (AᵀA)⁺ Wᵀ)`` of Kronecker workloads computed factor by factor
(never the workload's matrix), against the explicit computation on small domains; the plan of
that computation (method, memory, work) and its refusals."""

from __future__ import annotations

import numpy as np
import pytest

from dpopt.errors import QueryError
from dpopt.model.domain import Domain
from dpopt.model.queries import (
    AllRanges,
    HaarWavelet,
    Hierarchical,
    Identity,
    Kronecker,
    Marginal,
    PIdentity,
    Prefix,
    SparseQuery,
    Stack,
    Total,
    Weighted,
)
from dpopt.spec.queries import Product
from dpopt.strategy import error as error_module
from dpopt.strategy import gram_of, per_query_variance, trace_term
from dpopt.strategy.error import variance_plan
from dpopt.strategy.optimize import optimize_kronecker

DOM = Domain(("a", "b", "c"), (5, 4, 3))


def explicit_variances(W, A) -> np.ndarray:
    """``diag(W (AᵀA)⁺ Wᵀ)`` from dense matrices: the squared row norms of ``W A⁺`` (numpy's pseudo-inverse)."""
    X = W.to_dense() @ np.linalg.pinv(A.to_dense())
    return np.einsum("ij,ij->i", X, X)


def _per_attr(make):
    return Kronecker([make(DOM.project([a]), a) for a in DOM.attrs], DOM)


def _strategies():
    rng = np.random.default_rng(11)
    return {
        "identity": Identity(DOM),
        "marginals": Stack([Identity(DOM), Weighted(Marginal(DOM, ["a", "c"]), 0.7), Total(DOM)]),
        "hierarchical": _per_attr(lambda d, a: Hierarchical(d, a, 2)),
        "haar": _per_attr(HaarWavelet),
        "p-identity per attribute": _per_attr(lambda d, a: PIdentity(d, rng.random((2, d.size)))),
        "grouped": Kronecker([PIdentity(DOM.project(["a", "b"]), rng.random((3, 20))),
                              Hierarchical(DOM.project(["c"]), "c", 2)], DOM),
        "p-identity": PIdentity(DOM, rng.random((4, DOM.size))),
        "p-identity l2": PIdentity(DOM, rng.random((3, DOM.size)), norm="l2"),
        "dense": SparseQuery(DOM, rng.normal(size=(DOM.size + 3, DOM.size))),
    }


#: The method each strategy takes: factor by factor, or low rank (a small dense strategy is
#: cheaper explicitly on this small domain; see the test of the eigenvector route below).
METHODS = {"identity": "marginals algebra", "marginals": "marginals algebra", "hierarchical": "Kronecker strategy",
           "haar": "Kronecker strategy", "p-identity per attribute": "Kronecker strategy",
           "grouped": "Kronecker strategy", "p-identity": "low rank", "p-identity l2": "low rank",
           "dense": "explicit rows"}

WORKLOADS = {
    "ranges x ranges x total": Product({"a": "all_ranges", "b": "all_ranges"}),
    "prefix x identity x ranges": Product({"a": "prefix", "b": "identity", "c": "all_ranges"}),
    "identity x total x prefix": Product({"a": "identity", "c": "prefix"}),
}


@pytest.mark.parametrize("workload", list(WORKLOADS))
@pytest.mark.parametrize("strategy", list(METHODS))
def test_kronecker_variances_equal_the_explicit_computation(workload, strategy):
    W = WORKLOADS[workload].build(DOM)
    A = _strategies()[strategy]
    plan = variance_plan(W, A)
    assert METHODS[strategy] in plan.method and plan.feasible, plan.method
    got = plan.run()
    np.testing.assert_allclose(got, explicit_variances(W, A), rtol=1e-7, atol=1e-9)
    assert got.sum() == pytest.approx(trace_term(W, A), rel=1e-8)


def test_a_kronecker_workload_of_grouped_factors_and_stacks_of_products():
    rng = np.random.default_rng(3)
    grouped = Kronecker([(rng.random((4, 20)), ["a", "b"]), Prefix(DOM.project(["c"]), "c")], DOM)
    stacked = Stack([Product({"a": "all_ranges"}).build(DOM), Weighted(Product({"b": "prefix", "c": "identity"})
                                                                       .build(DOM), 2.0)])
    for W in (grouped, stacked):
        for name, A in _strategies().items():
            np.testing.assert_allclose(per_query_variance(W, A), explicit_variances(W, A), rtol=1e-7, atol=1e-9,
                                       err_msg=name)


def test_a_dense_strategy_goes_through_the_eigenvectors_of_its_pseudo_inverse():
    """The same strategy as a Kronecker product (factor by factor) and as an explicit matrix (the
    eigenvector route, chosen where it costs less than the workload's rows)."""
    dom = Domain(("x", "y"), (20, 20))
    W = Product({"x": "all_ranges", "y": "all_ranges"}).build(dom)
    A = Kronecker([Hierarchical(dom.project([a]), a, 2) for a in dom.attrs], dom)
    explicit = SparseQuery(dom, A.to_sparse())
    plan = variance_plan(W, explicit)
    assert "eigenvectors" in plan.method
    np.testing.assert_allclose(plan.run(), per_query_variance(W, A), rtol=1e-8)
    with pytest.raises(QueryError, match="does not support"):
        per_query_variance(W, SparseQuery(dom, A.to_sparse()[:300]))  # rank 300 < 400 cells


def test_the_workload_matrix_is_never_formed(monkeypatch):
    """Every box of a 75 x 50 grid (3.6 million queries): the variances of the strategies the plan
    compares, without the 1.6e9 non-zeros of the workload's matrix."""
    def refuse(self):
        raise AssertionError("the workload's matrix was formed")

    monkeypatch.setattr(Kronecker, "to_sparse", refuse)
    dom = Domain(("x", "y"), (75, 50))
    W = Product({"x": "all_ranges", "y": "all_ranges"}).build(dom)
    assert W.num_rows == 2850 * 1275
    fit = optimize_kronecker(gram_of(W), "l1")
    for A in (Identity(dom), fit.query, Kronecker([Hierarchical(dom.project([a]), a, 2) for a in dom.attrs], dom)):
        plan = variance_plan(W, A)
        assert "factor by factor" in plan.method and plan.bytes < 2**28
        v = plan.run()
        assert v.shape == (W.num_rows,) and v.sum() == pytest.approx(trace_term(W, A), rel=1e-9)
    # A box's variance under the identity is its volume: [0, 74] x [0, 49] (ranges ordered by their
    # low end, then their high end) is the whole grid.
    assert per_query_variance(W, Identity(dom))[74 * 1275 + 49] == pytest.approx(dom.size)


@pytest.mark.parametrize("strategy", [
    Kronecker([Identity(DOM.project(["a"])), Hierarchical(DOM.project(["b"]), "b"), Total(DOM.project(["c"]))], DOM),
    Stack([Marginal(DOM, ["a", "b"]), Marginal(DOM, ["c"])]),
    PIdentity(DOM, np.ones((2, 20)), attrs=["a", "b"]),
    SparseQuery(DOM, np.random.default_rng(1).normal(size=(DOM.size - 5, DOM.size))),
], ids=["kronecker", "marginals", "p-identity on a marginal", "dense"])
def test_unsupported_workloads_are_refused_on_every_path(strategy):
    W = WORKLOADS["prefix x identity x ranges"].build(DOM)  # needs c: no strategy above supports it
    with pytest.raises(QueryError, match="does not support"):
        per_query_variance(W, strategy)


def test_too_much_work_is_refused_before_any_of_it_in_one_line(monkeypatch):
    monkeypatch.setattr(error_module, "MAX_VARIANCE_FLOPS", 10.0)
    W = WORKLOADS["ranges x ranges x total"].build(DOM)
    plan = variance_plan(W, Identity(DOM))
    assert not plan.feasible and "operations" in plan.reason and "\n" not in plan.reason
    with pytest.raises(QueryError, match="above the"):
        plan.run()
