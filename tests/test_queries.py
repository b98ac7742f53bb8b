"""Linear-query operators against explicit dense matrices built independently in the tests."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpopt.errors import DomainError, QueryError
from dpopt.model.domain import Domain
from dpopt.model.queries import (
    AllRanges,
    Identity,
    Kronecker,
    LinearQuery,
    Lifted,
    Marginal,
    PredicateCount,
    Prefix,
    RangeQueries,
    SparseQuery,
    Stack,
    Total,
    Weighted,
    all_marginals,
    column_norms_of_matrix,
    random_ranges,
)

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---- brute-force references --------------------------------------------------------------
def all_cells(domain: Domain) -> np.ndarray:
    """Codes of every cell, C order, by explicit enumeration (the reference)."""
    return np.array(list(itertools.product(*[range(s) for s in domain.sizes])), dtype=np.int64).reshape(
        -1, len(domain)
    )


def brute_marginal_matrix(domain: Domain, attrs) -> np.ndarray:
    attrs = [a for a in domain.attrs if a in set(attrs)]
    sub = domain.project(attrs)
    cells = all_cells(domain)
    mat = np.zeros((sub.size, domain.size))
    for j, codes in enumerate(cells):
        i = 0
        for a in attrs:
            i = i * domain.size_of(a) + codes[domain.axis(a)]
        mat[i, j] = 1
    return mat


def brute_box_matrix(domain: Domain, attrs, lows, highs) -> np.ndarray:
    cells = all_cells(domain)
    mat = np.zeros((len(lows), domain.size))
    for r, (lo, hi) in enumerate(zip(lows, highs)):
        for j, codes in enumerate(cells):
            mat[r, j] = all(lo[t] <= codes[domain.axis(a)] <= hi[t] for t, a in enumerate(attrs))
    return mat


def check_operator(q: LinearQuery, dense: np.ndarray, rng: np.random.Generator) -> None:
    """Every product, norm and view of ``q`` equals the explicit matrix ``dense``."""
    m, n = dense.shape
    assert q.shape == (m, n)
    np.testing.assert_allclose(q.to_dense(), dense, atol=1e-12)
    assert sp.issparse(q.to_sparse())
    x_int = rng.integers(0, 20, n)
    x = rng.standard_normal(n)
    y = rng.standard_normal(m)
    np.testing.assert_allclose(q.matvec(x), dense @ x, atol=1e-9)
    np.testing.assert_allclose(q.matvec(x_int), dense @ x_int, atol=1e-9)
    np.testing.assert_allclose(q @ x, dense @ x, atol=1e-9)
    np.testing.assert_allclose(q.rmatvec(y), dense.T @ y, atol=1e-9)
    X = rng.standard_normal((n, 3))
    Y = rng.standard_normal((m, 2))
    np.testing.assert_allclose(q.matvec(X), dense @ X, atol=1e-9)
    np.testing.assert_allclose(q.rmatvec(Y), dense.T @ Y, atol=1e-9)
    op = q.as_linear_operator()
    np.testing.assert_allclose(op.matvec(x), dense @ x, atol=1e-9)
    np.testing.assert_allclose(op.rmatvec(y), dense.T @ y, atol=1e-9)
    for p in (1, 2):
        want = (np.abs(dense) ** p).sum(axis=0)
        got = q.column_norm_powers(p)
        np.testing.assert_allclose(np.broadcast_to(got, (n,)), want, atol=1e-9)
    assert q.sensitivity(1) == pytest.approx(np.abs(dense).sum(axis=0).max())
    assert q.sensitivity(2) == pytest.approx(np.sqrt((dense**2).sum(axis=0).max()))
    assert q.squared_l2_sensitivity() == pytest.approx((dense**2).sum(axis=0).max())
    if q.is_integer:
        assert np.array_equal(dense, np.round(dense))
        assert np.array_equal(q.matvec(x_int), dense.astype(np.int64) @ x_int)
    labels = q.row_labels()
    assert len(labels) == m and all(isinstance(s, str) and s for s in labels)
    # restrict(): Q = Q_S M_S and Q_S answers from the marginal over the support.
    support = q.support
    assert support == q.domain.canonical(support) and len(support) >= 1
    r = q.restrict()
    assert r.domain == q.domain.project(support)
    proj = brute_marginal_matrix(q.domain, support)
    np.testing.assert_allclose(r.matvec(proj @ x_int), dense @ x_int, atol=1e-9)
    np.testing.assert_allclose(r.to_dense() @ proj, dense, atol=1e-12)
    assert r.sensitivity(1) == pytest.approx(q.sensitivity(1))
    cells = rng.choice(n, size=min(n, 3), replace=False)
    np.testing.assert_allclose(q.columns(cells).toarray(), dense[:, cells], atol=1e-12)


# ---- strategies -----------------------------------------------------------------------------
@st.composite
def domains(draw, max_attrs: int = 4, max_size: int = 4) -> Domain:
    k = draw(st.integers(1, max_attrs))
    sizes = draw(st.lists(st.integers(1, max_size), min_size=k, max_size=k))
    return Domain(tuple(f"a{i}" for i in range(k)), tuple(sizes))


@st.composite
def domain_and_subset(draw, min_attrs: int = 1):
    dom = draw(domains())
    attrs = draw(st.lists(st.sampled_from(dom.attrs), unique=True, min_size=min_attrs, max_size=len(dom)))
    return dom, attrs


LABELLED = Domain.from_dict({"sex": ["F", "M"], "age": [0, 10, 20, 30], "rel": ["head", "spouse", "child"]})


# ---- identity, total, marginals -------------------------------------------------------------
@SETTINGS
@given(domains(), st.integers(0, 2**31))
def test_identity_and_total_equal_dense(dom, seed):
    rng = np.random.default_rng(seed)
    check_operator(Identity(dom), np.eye(dom.size), rng)
    check_operator(Total(dom), np.ones((1, dom.size)), rng)


def test_total_support_is_the_smallest_attribute_and_needs_no_dense_norms():
    dom = Domain(("a", "b", "c"), (5, 2, 3))
    assert Total(dom).support == ("b",) and Total(dom).depends_on == ()
    assert Total(dom).restrict().domain.attrs == ("b",)
    assert Total(dom).column_norm_powers(2) == 1.0
    assert Identity(dom).column_norm_powers(1) == 1.0
    assert Identity(LABELLED).row_labels()[:2] == ["sex=F, age=0, rel=head", "sex=F, age=0, rel=spouse"]


@SETTINGS
@given(domain_and_subset(), st.integers(0, 2**31))
def test_marginal_equals_dense(ds, seed):
    dom, attrs = ds
    q = Marginal(dom, attrs)
    assert q.attrs == dom.canonical(attrs)
    check_operator(q, brute_marginal_matrix(dom, attrs), np.random.default_rng(seed))
    assert isinstance(q.restrict(), Identity) and q.restrict().domain == dom.project(q.attrs)


def test_marginal_equals_pandas_groupby():
    rng = np.random.default_rng(7)
    dom = Domain(("a", "b", "c", "d"), (3, 4, 2, 5))
    codes = np.stack([rng.integers(0, s, 500) for s in dom.sizes], axis=1)
    x = np.bincount(dom.ravel(codes), minlength=dom.size)
    frame = pd.DataFrame(codes, columns=list(dom.attrs))
    for attrs in (["a"], ["d", "b"], ["a", "c", "d"], list(dom.attrs)):
        q = Marginal(dom, attrs)
        full = pd.MultiIndex.from_product([range(dom.size_of(a)) for a in q.attrs], names=list(q.attrs))
        counts = frame.groupby(list(q.attrs)).size().reindex(full, fill_value=0).to_numpy()
        assert np.array_equal(q.matvec(x), counts)
        assert q.matvec(x).dtype.kind == "i"


def test_marginal_labels_and_all_marginals():
    q = Marginal(LABELLED, ["rel", "sex"])
    assert q.attrs == ("sex", "rel")
    assert q.row_labels()[:4] == ["sex=F, rel=head", "sex=F, rel=spouse", "sex=F, rel=child", "sex=M, rel=head"]
    ms = all_marginals(LABELLED, 2)
    assert [m.attrs for m in ms] == [("sex", "age"), ("sex", "rel"), ("age", "rel")]
    dom = Domain(tuple(f"b{i}" for i in range(16)), (2,) * 16)
    assert len(all_marginals(dom, 3)) == 560


def test_queries_on_a_domain_too_large_to_hold():
    dom = Domain(tuple(f"v{i}" for i in range(40)), (10,) * 40)  # 10**40 cells
    q = Marginal(dom, ["v3", "v1"])
    assert q.shape == (100, 10**40)
    assert q.sensitivity(1) == 1.0 and q.sensitivity(2) == 1.0
    assert q.restrict().domain.attrs == ("v1", "v3")
    ranges = RangeQueries(dom, "v5", [0, 3], [4, 9])
    stack = Stack([q, Marginal(dom, ["v1"]), ranges, Total(dom)])
    assert stack.sensitivity(1) == 5.0  # 1 + 1 + 2 overlapping ranges + 1
    assert stack.squared_l2_sensitivity() == 5.0
    assert stack.support == ("v1", "v3", "v5")
    assert stack.restrict().domain.attrs == ("v1", "v3", "v5")
    with pytest.raises(DomainError, match="above the limit"):
        ranges.column_norm_powers(1)  # not constant: would need a dense vector
    assert Weighted(q, 3.0).sensitivity(1) == 3.0


# ---- ranges ------------------------------------------------------------------------------------
@SETTINGS
@given(domain_and_subset(), st.integers(1, 6), st.integers(0, 2**31))
def test_range_queries_equal_dense(ds, count, seed):
    dom, attrs = ds
    rng = np.random.default_rng(seed)
    q = random_ranges(dom, attrs, count, rng)
    # The stored bounds are in domain order; the reference uses them with q.attrs.
    dense = brute_box_matrix(dom, q.attrs, q.lows, q.highs)
    check_operator(q, dense, rng)


def test_range_bounds_follow_the_given_attribute_order():
    dom = Domain(("a", "b"), (4, 3))
    q = RangeQueries(dom, ["b", "a"], [[0, 1], [2, 0]], [[1, 3], [2, 2]])
    assert q.attrs == ("a", "b")
    dense = brute_box_matrix(dom, ["b", "a"], [[0, 1], [2, 0]], [[1, 3], [2, 2]])
    check_operator(q, dense, np.random.default_rng(0))
    assert q.row_labels() == ["range a in [1, 3], b in [0, 1]", "range a in [0, 2], b in [2, 2]"]


def test_prefix_and_all_ranges():
    dom = Domain.from_dict({"g": 2, "age": [5, 15, 25, 35, 45]})
    pre = Prefix(dom, "age")
    dense = np.kron(np.ones((1, 2)), np.tril(np.ones((5, 5))))
    check_operator(pre, dense, np.random.default_rng(1))
    assert pre.sensitivity(1) == 5  # the first value is in every prefix
    assert pre.row_labels()[1] == "range age in [5, 15]"
    allr = AllRanges(dom, "age")
    assert allr.num_rows == 15
    pairs = [(lo, hi) for lo in range(5) for hi in range(lo, 5)]
    inner = np.array([[lo <= v <= hi for v in range(5)] for lo, hi in pairs], dtype=float)
    check_operator(allr, np.kron(np.ones((1, 2)), inner), np.random.default_rng(2))
    # the middle value lies in (lo + 1) * (5 - hi) ranges, at most 3 * 3
    assert allr.sensitivity(1) == 9


def test_random_ranges_is_reproducible_and_valid():
    dom = Domain(("a", "b"), (10, 7))
    q1 = random_ranges(dom, ["a", "b"], 50, np.random.default_rng(3))
    q2 = random_ranges(dom, ["a", "b"], 50, np.random.default_rng(3))
    assert np.array_equal(q1.lows, q2.lows) and np.array_equal(q1.highs, q2.highs)
    assert np.all(q1.lows <= q1.highs) and np.all(q1.highs < np.array(dom.sizes))


# ---- Kronecker -------------------------------------------------------------------------------
def test_kronecker_equals_numpy_kron():
    dom = Domain(("a", "b", "c", "d"), (3, 2, 4, 2))
    rng = np.random.default_rng(4)
    explicit = rng.integers(-2, 3, size=(3, 4)).astype(float)
    group = dom.project(["a", "b"])
    factors = [Marginal(group, ["a"]), (explicit, "c"), Prefix(dom.project(["d"]), "d")]
    q = Kronecker(factors, dom)
    a_dense = brute_marginal_matrix(group, ["a"])
    dense = np.kron(np.kron(a_dense, explicit), np.tril(np.ones((2, 2))))
    check_operator(q, dense, rng)
    assert q.is_integer
    # the sensitivity is the product of the factors' largest column norms
    assert q.sensitivity(1) == pytest.approx(1 * np.abs(explicit).sum(0).max() * 2)
    assert len(q.row_labels()) == q.num_rows and " & " in q.row_labels()[0]


def test_kronecker_without_domain_and_constant_factors():
    a, b, c = (Domain(("a",), (3,)), Domain(("b",), (2,)), Domain(("c",), (4,)))
    q = Kronecker([Identity(a), Total(b), (np.array([[1.0, 1, 1, 1], [2, 2, 2, 2]]), "c")])
    assert q.domain == Domain(("a", "b", "c"), (3, 2, 4))
    assert q.depends_on == ("a",)
    dense = np.kron(np.kron(np.eye(3), np.ones((1, 2))), np.array([[1.0, 1, 1, 1], [2, 2, 2, 2]]))
    check_operator(q, dense, np.random.default_rng(5))
    assert q.restrict().domain.attrs == ("a",)
    # all factors constant: the support falls back to the smallest attribute
    t = Kronecker([Total(a), Total(b)])
    assert t.depends_on == () and t.support == ("b",)
    check_operator(t, np.ones((1, 6)), np.random.default_rng(6))


@SETTINGS
@given(domains(max_attrs=3, max_size=3), st.integers(0, 2**31))
def test_kronecker_of_random_explicit_factors(dom, seed):
    rng = np.random.default_rng(seed)
    mats = [rng.integers(-1, 2, size=(rng.integers(1, 3), s)).astype(float) for s in dom.sizes]
    q = Kronecker([(m, a) for m, a in zip(mats, dom.attrs)], dom)
    dense = mats[0]
    for m in mats[1:]:
        dense = np.kron(dense, m)
    check_operator(q, dense, rng)


# ---- stack, weighted, lifted, sparse, predicate ------------------------------------------------
@SETTINGS
@given(domain_and_subset(), st.integers(0, 2**31))
def test_stack_equals_vstack(ds, seed):
    dom, attrs = ds
    rng = np.random.default_rng(seed)
    parts = [Marginal(dom, attrs), Total(dom), random_ranges(dom, attrs[:1], 3, rng), Identity(dom)]
    dense = np.vstack([p.to_dense() for p in parts])
    q = Stack(parts)
    check_operator(q, dense, rng)


def test_stack_sensitivity_is_exact_not_the_sum():
    dom = Domain(("a", "b"), (6, 2))
    low, high = RangeQueries(dom, "a", [0], [2]), RangeQueries(dom, "a", [3], [5])
    q = Stack([low, high])
    assert q.sensitivity(1) == 1.0  # disjoint ranges: one record changes one answer
    assert low.sensitivity(1) + high.sensitivity(1) == 2.0
    two = Stack([Marginal(dom, ["a"]), Marginal(dom, ["b"])])
    assert two.sensitivity(1) == 2.0 and two.sensitivity(2) == pytest.approx(np.sqrt(2))
    assert Stack([Total(dom), Marginal(dom, ["a"])]).support == ("a",)


@SETTINGS
@given(domain_and_subset(), st.integers(0, 2**31))
def test_weighted_equals_scaled_rows(ds, seed):
    dom, attrs = ds
    rng = np.random.default_rng(seed)
    inner = Stack([Marginal(dom, attrs), random_ranges(dom, attrs, 2, rng)])
    w = rng.standard_normal(inner.num_rows)
    check_operator(Weighted(inner, w), np.diag(w) @ inner.to_dense(), rng)
    check_operator(Weighted(inner, -2.5), -2.5 * inner.to_dense(), rng)
    assert Weighted(inner, 3).is_integer and not Weighted(inner, 0.5).is_integer


def test_weighted_per_row_sensitivity_uses_the_weights_per_column():
    dom = Domain(("a",), (3,))
    q = Weighted(Stack([Marginal(dom, ["a"]), Total(dom)]), [5.0, 1.0, 1.0, 2.0])
    # column 0 has |5| + |2| = 7; the others 1 + 2 = 3
    assert q.sensitivity(1) == 7.0
    assert q.row_labels()[0] == "5 * a=0"


def test_lifted_and_sparse_query():
    dom = Domain(("a", "b", "c"), (2, 3, 2))
    rng = np.random.default_rng(8)
    inner_matrix = rng.integers(-3, 4, size=(5, 6))
    inner = SparseQuery(dom.project(["a", "b"]), sp.csr_matrix(inner_matrix))
    assert inner.is_integer
    check_operator(inner, inner_matrix.astype(float), rng)
    lifted = Lifted(inner, dom)
    check_operator(lifted, inner_matrix @ brute_marginal_matrix(dom, ["a", "b"]), rng)
    assert lifted.restrict() is inner
    full = rng.standard_normal((4, dom.size))
    q = SparseQuery(dom, full, labels=["w", "x", "y", "z"])
    check_operator(q, full, rng)
    assert not q.is_integer and q.row_labels() == ["w", "x", "y", "z"]


def test_predicate_count_equals_brute_force():
    rng = np.random.default_rng(9)
    cells = all_cells(LABELLED)
    ages = np.array(LABELLED.labels["age"])
    text = "age >= 10 and (sex == 'F' or rel != 'child')"
    q = PredicateCount(LABELLED, text)
    row = [
        (ages[c[1]] >= 10) and (LABELLED.labels["sex"][c[0]] == "F" or LABELLED.labels["rel"][c[2]] != "child")
        for c in cells
    ]
    check_operator(q, np.array([row], dtype=float), rng)
    assert q.row_labels() == [f"count where {text}"]
    q2 = PredicateCount(LABELLED, {"rel": ["spouse", "child"]})
    assert q2.support == ("rel",)
    row2 = [LABELLED.labels["rel"][c[2]] in ("spouse", "child") for c in cells]
    check_operator(q2, np.array([row2], dtype=float), rng)


def test_restrict_of_combinations_onto_a_common_support():
    dom = Domain(("a", "b", "c", "d"), (2, 3, 2, 3))
    rng = np.random.default_rng(10)
    q = Stack(
        [
            Marginal(dom, ["b"]),
            Weighted(RangeQueries(dom, "d", [0, 1], [1, 2]), [2.0, -1.0]),
            Total(dom),
            PredicateCount(dom, "a == 1"),
            Kronecker([Total(dom.project(["a"])), Identity(dom.project(["b"])), Total(dom.project(["c", "d"]))]),
        ]
    )
    assert q.support == ("a", "b", "d")
    dense = np.vstack([p.to_dense() for p in q.parts])
    check_operator(q, dense, rng)  # restrict() is checked inside against the dense matrix
    assert q.restrict().domain.attrs == ("a", "b", "d")


class OutsideQuery(LinearQuery):
    """A query written against the bare base interface (as another module might), over the
    marginal on ``attrs``: exercises the generic paths of Stack, Weighted and Lifted."""

    def __init__(self, domain: Domain, attrs, matrix) -> None:
        self.domain = domain
        self.attrs = domain.canonical(attrs)
        self.matrix = np.asarray(matrix, dtype=float)
        self.full = self.matrix @ brute_marginal_matrix(domain, self.attrs)

    @property
    def num_rows(self) -> int:
        return self.matrix.shape[0]

    @property
    def support(self):
        return self.attrs

    def restrict(self):
        sub = self.domain.project(self.attrs)
        return OutsideQuery(sub, sub.attrs, self.matrix)

    def _matvec(self, x):
        return self.full @ x

    def _rmatvec(self, y):
        return self.full.T @ y

    def to_sparse(self):
        return sp.csr_matrix(self.full)

    def column_norm_powers(self, p):
        return column_norms_of_matrix(sp.csr_matrix(self.full), p)


def test_queries_from_outside_the_package_combine_exactly():
    dom = Domain(("a", "b", "c"), (3, 2, 2))
    rng = np.random.default_rng(11)
    outside = OutsideQuery(dom, ["c", "a"], rng.integers(-2, 3, size=(4, 6)))
    parts = [outside, Marginal(dom, ["b"]), Total(dom)]
    q = Stack(parts)
    assert q.support == ("a", "b", "c")
    check_operator(q, np.vstack([outside.full, brute_marginal_matrix(dom, ["b"]), np.ones((1, 12))]), rng)
    w = rng.standard_normal(4)
    check_operator(Weighted(outside, w), np.diag(w) @ outside.full, rng)
    narrow = Stack([outside, Marginal(dom, ["a"])])
    assert narrow.support == ("a", "c")
    check_operator(narrow, np.vstack([outside.full, brute_marginal_matrix(dom, ["a"])]), rng)
    lifted = Lifted(outside.restrict(), dom)
    check_operator(lifted, outside.full, rng)


# ---- validation --------------------------------------------------------------------------------
DOM = Domain(("a", "b"), (4, 3))


@pytest.mark.parametrize(
    "build, error, match",
    [
        (lambda: Identity("not a domain"), QueryError, "Identity: expected a Domain"),
        (lambda: Marginal(DOM, ["a", "zz"]), DomainError, "unknown attribute 'zz'"),
        (lambda: Marginal(DOM, ["a", "a"]), DomainError, "attribute 'a' named twice"),
        (lambda: Marginal(DOM, []), QueryError, "attrs is empty"),
        (lambda: all_marginals(DOM, 3), QueryError, "k must be an integer in 1..2"),
        (lambda: RangeQueries(DOM, "a", [3], [1]), QueryError, "box 0 on attribute 'a' has low > high"),
        (lambda: RangeQueries(DOM, "a", [-1], [1]), QueryError, "low < 0"),
        (lambda: RangeQueries(DOM, "b", [0, 0], [1, 3]), QueryError, r"box 1 on attribute 'b' has high > 2"),
        (lambda: RangeQueries(DOM, ["a", "b"], [0, 1], [1, 2]), QueryError, r"lows must have shape \(count, 2\)"),
        (lambda: RangeQueries(DOM, "a", [0.5], [1]), QueryError, "lows must be integer codes"),
        (lambda: RangeQueries(DOM, "a", [], []), QueryError, "no boxes"),
        (lambda: RangeQueries(DOM, "q", [0], [1]), DomainError, "unknown attribute 'q'"),
        (lambda: random_ranges(DOM, "a", 3, 42), QueryError, "rng must be a numpy.random.Generator"),
        (lambda: random_ranges(DOM, "a", 0, np.random.default_rng()), QueryError, "count must be"),
        (lambda: SparseQuery(DOM, np.ones((2, 11))), QueryError, "11 columns but the domain has 12 cells"),
        (lambda: SparseQuery(DOM, np.full((1, 12), np.nan)), QueryError, "non-finite"),
        (lambda: SparseQuery(DOM, np.ones((2, 12)), labels=["x"]), QueryError, "1 labels for 2 rows"),
        (lambda: Weighted(Marginal(DOM, ["a"]), [1.0, 2.0]), QueryError, r"one entry per row \(4\)"),
        (lambda: Weighted(Marginal(DOM, ["a"]), np.inf), QueryError, "weights must be finite"),
        (lambda: Weighted(Marginal(DOM, ["a"]), "x"), QueryError, "weights must be real numbers"),
        (lambda: Stack([]), QueryError, "queries is empty"),
        (lambda: Stack([Total(DOM), Total(Domain(("a",), (4,)))]), QueryError, "query #1"),
        (lambda: Stack([Total(DOM), "x"]), QueryError, "query #1 is a str"),
        (
            lambda: Kronecker([Identity(Domain(("a",), (4,)))], DOM),
            QueryError,
            r"cover \['a'\] but the domain's attributes are \['a', 'b'\]",
        ),
        (
            lambda: Kronecker([Identity(Domain(("b",), (3,))), Identity(Domain(("a",), (4,)))], DOM),
            QueryError,
            "all of them, in order",
        ),
        (lambda: Kronecker([(np.ones((2, 5)), "a"), (np.eye(3), "b")], DOM), QueryError, "factor #0: the matrix has 5 columns"),
        (lambda: Kronecker([(np.ones((2, 12)), ["a", "b"])]), QueryError, "needs the domain"),
        (lambda: Kronecker([Identity(Domain(("a",), (3,))), (np.eye(3), "b")], DOM), QueryError, "factor #0 is over"),
        (lambda: Kronecker([(np.eye(4), "a"), (np.eye(4), "a")]), DomainError, "duplicate attribute name 'a'"),
        (lambda: Kronecker([]), QueryError, "factors is empty"),
        (lambda: Lifted(Identity(Domain(("b", "a"), (3, 4))), DOM), QueryError, "in domain order"),
        (lambda: Lifted(Identity(Domain(("a",), (5,))), DOM), QueryError, "differs from the projection"),
        (lambda: PredicateCount(DOM, "zz == 1"), DomainError, "unknown attribute 'zz'"),
        (lambda: PredicateCount(DOM, "a == 9"), DomainError, "value 9 is not in the domain of attribute 'a'"),
        (lambda: Marginal(DOM, ["a"]).column_norm_powers(0), QueryError, "p must be a positive number"),
        (lambda: Marginal(DOM, ["a"]).sensitivity(3), QueryError, "p = 1 or 2"),
        (lambda: Marginal(DOM, ["a"]).matvec(np.ones(5)), QueryError, "expected a vector of length 12"),
        (lambda: Marginal(DOM, ["a"]).rmatvec(np.ones(5)), QueryError, "expected 4 answers"),
        (lambda: Marginal(DOM, ["a"]).restrict_to(["b"]), QueryError, r"depends on \['a'\]"),
    ],
)
def test_bad_inputs_raise_naming_the_problem(build, error, match):
    with pytest.raises(error, match=match):
        build()
