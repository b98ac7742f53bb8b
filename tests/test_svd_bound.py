"""The SVD lower bound: structured singular values against a dense SVD, closed forms on domains far
too large to hold, the constants, and the bound under every strategy's expected error."""

from __future__ import annotations

import math
from itertools import combinations

import numpy as np
import pytest

from dpopt.model.domain import Domain
from dpopt.model.queries import (
    AllRanges,
    HaarWavelet,
    Hierarchical,
    Identity,
    Kronecker,
    Marginal,
    MarginalWorkload,
    PIdentity,
    Prefix,
    SparseQuery,
    Stack,
    Total,
    Weighted,
    all_marginals,
    random_ranges,
)
from dpopt.privacy.accountant import PrivacyCost
from dpopt.privacy.mechanisms import calibrate
from dpopt.strategy import gram_of, trace_term
from dpopt.strategy.bound import classic_gaussian_constant, laplace_constant, nuclear_norm, svd_bound
from dpopt.strategy.gram import MarginalsGram
from dpopt.strategy.optimize import optimize_marginals, optimize_pidentity


def dense_bound(W) -> float:
    sv = np.linalg.svd(W.to_dense(), compute_uv=False)
    return float(sv.sum() ** 2 / W.domain.size)


def _small_workloads(rng):
    d = Domain(("a", "b", "c"), (6, 5, 3))
    one = Domain(("x",), (40,))
    return [
        AllRanges(one, "x"), Prefix(one, "x"), random_ranges(one, "x", 7, rng), random_ranges(one, "x", 200, rng),
        random_ranges(d, ("a", "b"), 30, rng), random_ranges(d, ("a", "b", "c"), 500, rng),
        Stack(all_marginals(d, 2)), MarginalWorkload(d, [("a",), ("b", "c"), ("a", "c")]), Total(d), Identity(d),
        Stack([Weighted(Marginal(d, ["a"]), 3.0), Marginal(d, ["b", "c"])]),
        Kronecker([Prefix(d.project(["a"]), "a"), AllRanges(d.project(["b"]), "b"), Identity(d.project(["c"]))], d),
        Stack([Prefix(d, "a"), Marginal(d, ["b"])]), SparseQuery(one, rng.normal(size=(9, 40))),
    ]


def test_structured_bound_equals_dense_svd(rng):
    for W in _small_workloads(rng):
        assert svd_bound(W) == pytest.approx(dense_bound(W), rel=1e-9), W.name


def test_single_marginal_over_a_billion_cells_has_its_closed_form():
    """``M_S`` has the singular value ``sqrt(N_{S^c})`` with multiplicity ``N_S``, so the bound is
    ``N_S² N_{S^c} / N = N_S`` (here over 1.6·10^11 cells)."""
    d = Domain(tuple(f"a{i}" for i in range(8)), (40, 30, 25, 20, 12, 10, 8, 7))
    assert d.size > 10**9
    attrs = ("a1", "a4", "a6")
    n_s = 30 * 12 * 8
    assert nuclear_norm(Marginal(d, attrs)) == pytest.approx(n_s * math.sqrt(d.size / n_s), rel=1e-12)
    assert svd_bound(Marginal(d, attrs)) == pytest.approx(n_s, rel=1e-12)
    assert svd_bound(Identity(d)) == pytest.approx(d.size, rel=1e-12)
    assert svd_bound(Total(d)) == pytest.approx(1.0, rel=1e-12)


def test_kronecker_bound_is_the_product_of_the_factors():
    d = Domain(("a", "b", "c"), (60, 40, 30))
    factors = [AllRanges(d.project(["a"]), "a"), Prefix(d.project(["b"]), "b"), HaarWavelet(d.project(["c"]), "c")]
    expected = np.prod([dense_bound(f) for f in factors])
    assert svd_bound(Kronecker(factors, d)) == pytest.approx(expected, rel=1e-9)


def test_marginal_workload_bound_on_a_huge_domain_matches_the_same_algebra_on_a_projection():
    """On marginals, the singular values depend on the sizes only through the algebra; check a
    domain of ~10^9 cells against the dense SVD of a small domain with the same formula's terms:
    the 1-way marginals have μ(∅) = sum_i N/n_i and μ({i}) = N/n_i (multiplicity n_i - 1)."""
    for sizes in [(3, 4, 2), (90, 80, 70, 60, 50)]:
        d = Domain(tuple(f"a{i}" for i in range(len(sizes))), sizes)
        n = float(d.size)
        closed = math.sqrt(sum(n / s for s in sizes)) + sum((s - 1) * math.sqrt(n / s) for s in sizes)
        W = Stack([Marginal(d, [a]) for a in d.attrs])
        assert nuclear_norm(W) == pytest.approx(closed, rel=1e-12)
        if d.size < 100:
            assert nuclear_norm(W) == pytest.approx(np.linalg.svd(W.to_dense(), compute_uv=False).sum(), rel=1e-10)


def test_constants():
    assert classic_gaussian_constant(1, 1e-5) == pytest.approx(2 * math.log(2e5))
    assert classic_gaussian_constant("1/2", "1/100") == pytest.approx(8 * math.log(200))
    assert laplace_constant(0.1) == pytest.approx(200.0)
    # The continuous laws dpopt's noise discretises have exactly these variances per unit sensitivity.
    law = calibrate(Identity(Domain(("a",), (3,))), PrivacyCost.pure(0.25), "laplace")
    assert 2 * law.scale**2 == pytest.approx(laplace_constant(0.25))
    law = calibrate(Identity(Domain(("a",), (3,))), PrivacyCost.zcdp(0.5), "gaussian")
    assert law.scale**2 == pytest.approx(1 / (2 * 0.5))
    with pytest.raises(ValueError, match="delta"):
        classic_gaussian_constant(1, 1.5)


def _strategy_zoo(d, rng):
    out = [Identity(d), PIdentity(d, rng.random((3, d.size))), PIdentity(d, rng.random((4, d.size)), norm="l2"),
           SparseQuery(d, rng.normal(size=(d.size + 3, d.size))), SparseQuery(d, rng.random((2 * d.size, d.size)))]
    if len(d) == 1:
        out += [Hierarchical(d, d.attrs[0], 2), Hierarchical(d, d.attrs[0], 3), HaarWavelet(d, d.attrs[0])]
    return out


@pytest.mark.parametrize("seed", range(6))
def test_bound_never_exceeds_any_strategys_error(seed):
    """``‖A‖²_{1→2} trace(W (AᵀA)⁺ Wᵀ) >= (Σσ)²/n`` for every supporting ``A`` (and so with
    ``‖A‖₁ >= ‖A‖_{1→2}`` too), on random workloads and strategies."""
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(3, 25))
    d = Domain(("x",), (n,))
    workloads = [SparseQuery(d, rng.normal(size=(int(rng.integers(1, 2 * n)), n))),
                 SparseQuery(d, (rng.random((n, n)) < 0.3).astype(float) + np.eye(n)),
                 random_ranges(d, "x", int(rng.integers(1, 3 * n)), rng), AllRanges(d, "x")]
    for W in workloads:
        bound = svd_bound(W)
        for A in _strategy_zoo(d, rng):
            Ad = A.to_dense()
            l2 = (Ad**2).sum(axis=0).max()
            l1 = np.abs(Ad).sum(axis=0).max() ** 2
            tr = trace_term(W, A)
            assert bound <= l2 * tr * (1 + 1e-9), (W.name, A.name)
            assert bound <= l1 * tr * (1 + 1e-9), (W.name, A.name)
        for norm in ("l1", "l2"):
            assert bound <= optimize_pidentity(W, norm=norm, max_iter=50).loss * (1 + 1e-9)


def test_bound_under_optimised_marginal_strategies():
    d = Domain(("a", "b", "c", "d"), (3, 4, 2, 5))
    W = Stack([Marginal(d, s) for s in combinations(d.attrs, 2)])
    G = gram_of(W)
    assert isinstance(G, MarginalsGram)
    bound = svd_bound(G)
    for norm in ("l1", "l2"):
        fit = optimize_marginals(G, norm)
        assert bound <= fit.loss * (1 + 1e-9)
    # Under Gaussian noise the optimised marginals come close to the bound on this workload.
    assert optimize_marginals(G, "l2").loss <= 1.2 * bound
