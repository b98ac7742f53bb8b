"""The model pieces of the polynomial release: approximating polynomials, conjunction counts, evaluator.

Brute force throughout: polynomial bounds at every integer in exact rationals, counts against
direct record scans, sensitivities against every neighbouring dataset of a tiny domain, answers
against direct counts of every query.
"""

from __future__ import annotations

import math
from fractions import Fraction
from itertools import combinations

import numpy as np
import pytest

from dpopt.errors import ParameterError, QueryError
from dpopt.model.data import Dataset
from dpopt.model.domain import Domain
from dpopt.model.polynomial_queries import (
    ConjunctionTable,
    conjunction_counts,
    disjunction_counts,
    marginal_counts,
    symmetric_sums,
    threshold_counts,
)
from dpopt.model.polynomials import (
    chebyshev_disjunction,
    disjunction_polynomial,
    exact_polynomial,
    min_degree_polynomial,
    minimax_polynomial,
    threshold_polynomial,
)
from dpopt.model.queries.binary import binary_encoding
from dpopt.model.queries.conjunctions import (
    ConjunctionCounts,
    all_subsets,
    colex_rank,
    conjunction_moments,
    histogram_moments,
    pattern_counts,
    unused_code_patterns,
)


def _values_from_monomials(poly, j: int) -> Fraction:
    return sum((c * Fraction(j) ** i for i, c in enumerate(poly.monomial_coefficients())), Fraction(0))


def _check_bounds(poly, k: int, threshold: int = 1) -> Fraction:
    """Exact max error at 0..k recomputed from the monomial form (independent of the Newton form)."""
    worst = Fraction(0)
    for j in range(k + 1):
        value = _values_from_monomials(poly, j)
        worst = max(worst, abs(value - (1 if j >= threshold else 0)))
    if threshold == 1:
        assert _values_from_monomials(poly, 0) == 0
    return worst


# ---- polynomials ------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 2, 3, 5, 8, 13, 30])
def test_exact_polynomial_is_inclusion_exclusion(k):
    poly = exact_polynomial(k)
    assert poly.gamma == 0 and poly.degree == k
    assert poly.newton == tuple([Fraction(0)] + [Fraction((-1) ** (m + 1)) for m in range(1, k + 1)])
    assert _check_bounds(poly, k) == 0


@pytest.mark.parametrize("k", [2, 3, 4, 7, 10, 20, 40])
@pytest.mark.parametrize("gamma", ["1/3", "1/10", "1/100"])
def test_chebyshev_bounds_hold_exactly_at_every_integer(k, gamma):
    poly = chebyshev_disjunction(k, gamma)
    g = Fraction(gamma)
    assert poly.gamma <= g
    assert _check_bounds(poly, k) == poly.gamma
    if poly.construction == "chebyshev":
        # The least r with T_r(1 + 2/(k-1)) >= 1/gamma: r = ceil(arccosh(1/gamma) / arccosh(1 + 2/(k-1))).
        r = math.ceil(math.acosh(1 / float(g)) / math.acosh(1 + 2 / (k - 1)) - 1e-12)
        assert poly.degree == r
        assert poly.degree <= math.sqrt(k - 1) * math.log(2 / float(g)) + 1  # Fact 4.2: O(sqrt(k) log(1/gamma))
    else:
        assert poly.construction == "exact" and poly.degree <= k


def test_chebyshev_by_degree_reports_its_error():
    poly = chebyshev_disjunction(10, degree=4)
    assert poly.degree == 4 and 0 < poly.gamma < 1
    assert _check_bounds(poly, 10) == poly.gamma


@pytest.mark.parametrize("k, degree, expected", [(2, 1, Fraction(1, 3)), (3, 2, Fraction(1, 7)), (3, 1, Fraction(1, 2))])
def test_minimax_matches_known_optima(k, degree, expected):
    # k = 3, degree 2: equioscillation a+b = 1-g, 2a+4b = 1+g, 3a+9b = 1-g gives g = 1/7.
    poly = minimax_polynomial(k, degree)
    assert poly.gamma == expected  # the LP's optimal vertex, re-solved in rationals
    assert _check_bounds(poly, k) == poly.gamma


@pytest.mark.parametrize("k", [4, 9, 25])
@pytest.mark.parametrize("gamma", ["1/4", "1/20"])
def test_min_degree_is_minimal_and_not_above_chebyshev(k, gamma):
    assert min_degree_polynomial(3, "1/7").degree == 2  # gamma exactly at the degree-2 optimum
    g = Fraction(gamma)
    poly = min_degree_polynomial(k, g)
    assert poly.gamma <= g and _check_bounds(poly, k) == poly.gamma
    if poly.degree > 1 and poly.construction == "minimax":
        assert minimax_polynomial(k, poly.degree - 1).gamma > g
    assert poly.degree <= chebyshev_disjunction(k, g).degree


@pytest.mark.parametrize("k, h", [(4, 2), (6, 3), (10, 4), (12, 12)])
def test_threshold_polynomial_bounds(k, h):
    poly = threshold_polynomial(k, h, gamma="1/10")
    assert poly.threshold == h and poly.gamma <= Fraction(1, 10)
    assert _check_bounds(poly, k, h) == poly.gamma


def test_norms_lemma43_bounds_the_exact_record_norm():
    for poly in (chebyshev_disjunction(12, "1/10"), min_degree_polynomial(12, "1/10"), exact_polynomial(5)):
        for d in (12, 30, 60):
            assert poly.record_l1(d) <= poly.lemma43_norm(d)
            # record_l1 is the L1 norm of the multilinear coefficients of the all-ones record.
            brute = sum(abs(a) * math.comb(d, m) for m, a in enumerate(poly.newton))
            assert poly.record_l1(d) == brute


def test_polynomial_input_errors():
    with pytest.raises(ParameterError, match="k must be"):
        exact_polynomial(0)
    with pytest.raises(ParameterError, match="threshold must"):
        threshold_polynomial(3, 4, gamma="1/10")
    with pytest.raises(ParameterError, match="gamma must be in"):
        min_degree_polynomial(3, 1)
    with pytest.raises(ParameterError, match="exactly one of gamma or degree"):
        chebyshev_disjunction(5)
    with pytest.raises(ParameterError, match="thresholds above 1"):
        threshold_polynomial(5, 2, gamma="1/10", construction="chebyshev")
    with pytest.raises(ParameterError, match="not both"):
        disjunction_polynomial(5, gamma="1/10", degree=2)


# ---- conjunction counts ------------------------------------------------------------------------------
def _binary(d: int, n: int, rng, weights: bool = False) -> Dataset:
    codes = (rng.random((n, d)) < rng.uniform(0.2, 0.8, d)).astype(np.int64)
    w = rng.integers(0, 4, n) if weights else None
    return Dataset(codes, Domain(tuple(f"a{i}" for i in range(d)), (2,) * d), w)


def test_colex_order_and_rank():
    for d, m in ((6, 0), (6, 1), (6, 3), (9, 4)):
        subs = all_subsets(d, m)
        assert subs.shape == (math.comb(d, m), m)
        assert np.array_equal(colex_rank(subs, d), np.arange(subs.shape[0]))
        assert {tuple(r) for r in subs} == set(combinations(range(d), m))


@pytest.mark.parametrize("weights", [False, True])
def test_moments_equal_direct_counts(rng, weights):
    data = _binary(7, 300, rng, weights)
    w = np.ones(300) if data.weights is None else data.weights
    moments = conjunction_moments(data.codes, data.weights, 5)
    for m in range(6):
        for rank, subset in enumerate(all_subsets(7, m)):
            assert moments[m][rank] == (w * data.codes[:, subset].all(axis=1)).sum()
    dense = histogram_moments(data.histogram(), 7, 5)
    for a, b in zip(moments, dense):
        assert np.array_equal(a, b)


def test_moments_of_wide_records(rng):
    # More than 62 attributes: the distinct rows are found without packing into int64.
    codes = (rng.random((50, 70)) < 0.1).astype(np.int64)
    moments = conjunction_moments(codes, None, 2)
    pair = all_subsets(70, 2)
    expected = codes[:, pair[:, 0]] * codes[:, pair[:, 1]]
    assert np.array_equal(moments[2], expected.sum(axis=0))


@pytest.mark.parametrize("m", [1, 2, 3])
@pytest.mark.parametrize("literals", [True, False])
def test_conjunction_counts_against_marginals_and_operators(rng, m, literals):
    data = _binary(6, 200, rng)
    q = ConjunctionCounts(data.domain, m, literals)
    answers = q.answer(data)
    x = data.histogram()
    matrix = q.to_sparse()
    assert np.array_equal(matrix @ x, answers)
    assert np.array_equal(q.matvec(x), answers)
    y = rng.normal(size=q.num_rows)
    assert np.allclose(q.rmatvec(y), matrix.T @ y)  # float sums in two orders: 1e-9 relative
    for i, subset in enumerate(q.subsets):
        names = [data.domain.attrs[j] for j in subset]
        cells = data.marginal(names)
        if literals:
            assert np.array_equal(answers[i * 2**m:(i + 1) * 2**m], cells)
        else:
            assert answers[i] == cells[-1]
    cols = np.array([0, 7, 63])
    assert np.array_equal(q.columns(cols).toarray(), matrix[:, cols].toarray())


def _brute_sensitivity(query, domain: Domain, data: Dataset) -> tuple[float, float]:
    """max over every record x of |Q(D + x) - Q(D)| in L1 and squared L2: every add/remove neighbour."""
    base = query.answer(data)
    worst1 = worst2 = 0.0
    for cell in range(domain.size):
        record = domain.unravel(np.array([cell]))
        bigger = Dataset(np.vstack([data.codes, record]), domain)
        diff = query.answer(bigger) - base
        worst1, worst2 = max(worst1, np.abs(diff).sum()), max(worst2, (diff**2).sum())
    return worst1, worst2


@pytest.mark.parametrize("m", [1, 2, 3])
@pytest.mark.parametrize("literals", [True, False])
def test_sensitivity_equals_brute_force_over_neighbours(rng, m, literals):
    data = _binary(4, 30, rng)
    q = ConjunctionCounts(data.domain, m, literals)
    l1, l2sq = _brute_sensitivity(q, data.domain, data)
    assert q.sensitivity(1) == l1 == math.comb(4, m)
    assert q.squared_l2_sensitivity() == l2sq


def test_excluded_patterns_of_an_encoding(rng):
    source = Domain.from_dict({"a": 3, "b": 2, "c": 5})
    enc = binary_encoding(source)
    records = np.stack([rng.integers(0, s, 400) for s in source.sizes], axis=1)
    data = Dataset(enc.encode_codes(records), enc.domain)
    every = Dataset(enc.encode_codes(source.unravel(np.arange(source.size))), enc.domain)
    d = len(enc.domain)
    for m in (1, 2, 3):
        subs = all_subsets(d, m)
        excluded = unused_code_patterns(enc, subs)
        possible = pattern_counts(conjunction_moments(every.codes, None, m), subs, d) > 0
        if excluded is None:  # nothing to exclude (single bits: every value occurs)
            excluded = np.zeros_like(possible)
        assert np.array_equal(excluded, ~possible)  # excluded exactly when no valid record matches
        q = ConjunctionCounts(enc.domain, m, True, subs, excluded if excluded.any() else None)
        full = ConjunctionCounts(enc.domain, m, True, subs).answer(data).reshape(-1, 2**m)
        assert np.array_equal(q.answer(data), full[~excluded])
        assert np.all(full[excluded] == 0)
        # Sensitivity over valid records only: each matches one kept pattern per subset.
        valid = [np.abs(q.answer(Dataset(every.codes[[i]], enc.domain))).sum() for i in range(every.codes.shape[0])]
        assert q.sensitivity(1) == max(valid) == subs.shape[0]


def test_conjunction_count_errors(rng):
    dom = Domain(("a", "b", "c"), (2, 3, 2))
    with pytest.raises(QueryError, match="binary attributes"):
        ConjunctionCounts(dom, 1)
    dom = Domain(("a", "b", "c"), (2, 2, 2))
    with pytest.raises(QueryError, match="Total"):
        ConjunctionCounts(dom, 0)
    with pytest.raises(QueryError, match="increasing"):
        ConjunctionCounts(dom, 2, subsets=np.array([[1, 0]]))
    with pytest.raises(QueryError, match="twice"):
        ConjunctionCounts(dom, 2, subsets=np.array([[0, 1], [0, 1]]))
    with pytest.raises(QueryError, match="all-zeros"):
        ConjunctionCounts(dom, 1, excluded=np.array([[True, False]] * 3))
    with pytest.raises(QueryError, match="literal form"):
        ConjunctionCounts(dom, 1, literals=False, excluded=np.zeros((3, 1), dtype=bool))


# ---- the evaluator, noise-free ----------------------------------------------------------------------
def _truth(codes, subsets, signs, rule):
    x = codes[:, subsets] == signs[None, :]
    return int(rule(x).sum())


@pytest.mark.parametrize("k", [2, 3, 4])
@pytest.mark.parametrize("make", [lambda k: exact_polynomial(k), lambda k: min_degree_polynomial(k, "1/5"),
                                  lambda k: chebyshev_disjunction(k, "1/5")])
def test_noise_free_answers_within_gamma(rng, k, make):
    data = _binary(7, 250, rng)
    poly = make(k)
    n = data.total
    table = ConjunctionTable.exact(conjunction_moments(data.codes, None, poly.degree), 7, literals=True)
    subsets = all_subsets(7, k)
    signs = rng.integers(0, 2, subsets.shape)
    g = float(poly.gamma)
    # Monotone and non-monotone disjunctions: error at most gamma * (records satisfying them).
    for sg in (np.ones_like(signs), signs):
        got = disjunction_counts(table, poly, subsets, sg).values
        truth = np.array([_truth(data.codes, s, v, lambda x: x.any(axis=1)) for s, v in zip(subsets, sg)])
        assert np.all(np.abs(got - truth) <= g * truth + 1e-7)  # float sums of exact counts
        got = conjunction_counts(table, poly, subsets, sg).values
        truth = np.array([_truth(data.codes, s, v, lambda x: x.all(axis=1)) for s, v in zip(subsets, sg)])
        assert np.all(np.abs(got - truth) <= g * n + 1e-7)
    cells = marginal_counts(table, poly, subsets).values
    names = data.domain.attrs
    truth = np.stack([data.marginal([names[j] for j in s]) for s in subsets])
    assert np.all(np.abs(cells - truth) <= g * n + 1e-7)
    if poly.gamma == 0:
        assert np.allclose(cells, truth, atol=1e-7)


@pytest.mark.parametrize("k, h", [(4, 2), (5, 3), (6, 2)])
def test_noise_free_thresholds(rng, k, h):
    data = _binary(8, 200, rng)
    poly = threshold_polynomial(k, h, gamma="1/8")
    for literals in (True, False):
        table = ConjunctionTable.exact(conjunction_moments(data.codes, None, poly.degree), 8, literals=literals)
        subsets = all_subsets(8, k)
        got = threshold_counts(table, poly, subsets).values
        truth = (data.codes[:, subsets].sum(axis=2) >= h).sum(axis=0)
        assert np.all(np.abs(got - truth) <= float(poly.gamma) * data.total + 1e-7)
    # Non-monotone (Section 4.1): at least h of the literals x_i = s_i.
    table = ConjunctionTable.exact(conjunction_moments(data.codes, None, poly.degree), 8, literals=True)
    signs = np.random.default_rng(k).integers(0, 2, subsets.shape)
    got = threshold_counts(table, poly, subsets, signs).values
    truth = (data.codes[:, subsets] == signs[None]).sum(axis=2) >= h
    assert np.all(np.abs(got - truth.sum(axis=0)) <= float(poly.gamma) * data.total + 1e-7)


def test_monotone_table(rng):
    data = _binary(6, 150, rng)
    poly = exact_polynomial(3)
    table = ConjunctionTable.exact(conjunction_moments(data.codes, None, 3), 6, literals=False)
    subsets = all_subsets(6, 3)
    truth = np.stack([data.marginal([data.domain.attrs[j] for j in s]) for s in subsets])
    assert np.allclose(marginal_counts(table, poly, subsets).values, truth, atol=1e-9)
    assert np.allclose(conjunction_counts(table, poly, subsets).values, truth[:, -1], atol=1e-9)
    with pytest.raises(QueryError, match="negated literals"):
        disjunction_counts(table, poly, subsets, np.zeros_like(subsets))
    low = ConjunctionTable.exact(conjunction_moments(data.codes, None, 2), 6, literals=False)
    with pytest.raises(QueryError, match="degree >= 3"):
        marginal_counts(low, poly, subsets)


def test_variances_and_bounds_of_symmetric_sums():
    d = 5
    counts, noisy = [], []
    for m in range(3):
        shape = (1, 1) if m == 0 else (math.comb(d, m), 2**m)
        counts.append(np.zeros(shape))
        noisy.append(np.ones(shape, dtype=bool))
    noisy[2][0, 3] = False  # one exact entry (e.g. an impossible pattern)
    table = ConjunctionTable(d, True, tuple(counts), tuple(noisy), (2.0, 3.0, 5.0), (10.0, 20.0, 30.0))
    attrs = np.array([[0, 1, 2], [1, 3, 4]])
    signs = np.array([[1, 1, 1], [0, 1, 0]])
    w = [0.5, -2.0, 3.0]
    _, var, bound = symmetric_sums(table, attrs, signs, w)
    # Query 0 uses subset {0, 1} (rank 0) with pattern 11 = 3: the exact entry.
    assert var[0] == 0.25 * 2 + 4 * 3 * 3 + 9 * 5 * 2
    assert var[1] == 0.25 * 2 + 4 * 3 * 3 + 9 * 5 * 3
    assert bound[0] == 0.5 * 10 + 2 * 3 * 20 + 3 * 30 * 2
    with pytest.raises(QueryError, match="increasing"):
        symmetric_sums(table, np.array([[2, 1]]), None, w)
