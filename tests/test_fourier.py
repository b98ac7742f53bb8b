"""Walsh--Hadamard transform, parity queries, Barak et al. reconstruction and binary encoding."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.linalg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpopt.errors import DataError, DomainError, QueryError, confidential_values_shown
from dpopt.model.domain import Domain
from dpopt.model.queries import (
    FourierParity,
    Marginal,
    binary_encoding,
    downward_closure,
    fast_walsh_hadamard,
    marginal_from_fourier,
)
from tests.test_queries import all_cells, check_operator

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def binary_domain(k: int) -> Domain:
    return Domain(tuple(f"b{i}" for i in range(k)), (2,) * k)


def brute_parity_matrix(domain: Domain, subsets) -> np.ndarray:
    """Row alpha, column beta: (-1)^(number of attributes of alpha set in beta), by enumeration."""
    cells = all_cells(domain)
    rows = []
    for alpha in subsets:
        rows.append([(-1) ** sum(int(c[domain.axis(a)]) for a in alpha) for c in cells])
    return np.array(rows, dtype=float)


# ---- the transform -------------------------------------------------------------------------
@pytest.mark.parametrize("k", range(0, 7))
def test_wht_equals_the_dense_hadamard_matrix(k):
    rng = np.random.default_rng(k)
    n = 2**k
    H = scipy.linalg.hadamard(n)
    x = rng.integers(-50, 50, n)
    before = x.copy()
    out = fast_walsh_hadamard(x)
    assert np.array_equal(out, H @ x) and out.dtype.kind == "i"  # exact on integers
    assert np.array_equal(x, before)  # input untouched
    X = rng.standard_normal((n, 3))
    np.testing.assert_allclose(fast_walsh_hadamard(X), H @ X, atol=1e-10)
    np.testing.assert_allclose(fast_walsh_hadamard(fast_walsh_hadamard(X)) / n, X, atol=1e-10)


def test_wht_bad_inputs():
    with pytest.raises(QueryError, match="length 6 of x is not a power of two"):
        fast_walsh_hadamard(np.ones(6))
    with pytest.raises(QueryError, match="1 or 2 dimensions"):
        fast_walsh_hadamard(np.ones((2, 2, 2)))


# ---- parity queries ---------------------------------------------------------------------------
@st.composite
def binary_domain_and_parities(draw):
    k = draw(st.integers(1, 5))
    dom = binary_domain(k)
    subsets = draw(
        st.lists(st.lists(st.sampled_from(dom.attrs), unique=True, max_size=k), min_size=1, max_size=12)
    )
    unique = list(dict.fromkeys(tuple(dom.canonical(s)) for s in subsets))
    return dom, unique


@SETTINGS
@given(binary_domain_and_parities(), st.booleans(), st.integers(0, 2**31))
def test_parities_equal_dense(dp, normalized, seed):
    dom, subsets = dp
    # give the subsets in a shuffled attribute order: they are stored in domain order
    q = FourierParity(dom, [tuple(reversed(s)) for s in subsets], normalized=normalized)
    assert q.subsets == tuple(subsets)
    scale = 2.0 ** (-len(dom) / 2) if normalized else 1.0
    check_operator(q, scale * brute_parity_matrix(dom, subsets), np.random.default_rng(seed))
    assert q.is_integer is (not normalized)
    assert q.sensitivity(1) == pytest.approx(len(subsets) * scale)


def test_both_evaluation_routes_agree_with_dense():
    dom = binary_domain(6)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 9, dom.size)
    few = FourierParity(dom, [("b1", "b4")])  # one marginal per parity is cheaper
    many = FourierParity(dom, downward_closure([("b0", "b2", "b5"), ("b1", "b4")], dom))  # one transform
    for q, subsets in ((few, few.subsets), (many, many.subsets)):
        assert np.array_equal(q.matvec(x), brute_parity_matrix(dom, subsets).astype(int) @ x)
    assert few.support == ("b1", "b4") and many.support == ("b0", "b1", "b2", "b4", "b5")


def test_bit_masks_follow_the_cell_numbering():
    dom = binary_domain(4)
    q = FourierParity(dom, [0, 1, 8, 6, 15])
    assert q.subsets == ((), ("b3",), ("b0",), ("b1", "b2"), ("b0", "b1", "b2", "b3"))
    H = scipy.linalg.hadamard(16)
    np.testing.assert_array_equal(q.to_dense(), H[[0, 1, 8, 6, 15]])
    assert q.row_labels() == ["parity {}", "parity {b3}", "parity {b0}", "parity {b1,b2}", "parity {b0,b1,b2,b3}"]


def test_normalized_basis_is_orthonormal():
    dom = binary_domain(5)
    F = FourierParity(dom, range(32), normalized=True).to_dense()
    np.testing.assert_allclose(F @ F.T, np.eye(32), atol=1e-12)
    np.testing.assert_allclose(F.T @ F, np.eye(32), atol=1e-12)


def test_normalized_restriction_keeps_the_full_domain_scale():
    dom = binary_domain(5)
    q = FourierParity(dom, [("b1",), ("b1", "b3")], normalized=True)
    r = q.restrict()
    assert r.domain.attrs == ("b1", "b3")
    x = np.random.default_rng(1).integers(0, 5, dom.size)
    marg = Marginal(dom, ["b1", "b3"]).matvec(x)
    np.testing.assert_allclose(r.matvec(marg), q.matvec(x))
    assert r.sensitivity(1) == pytest.approx(q.sensitivity(1)) == pytest.approx(2 / 2**2.5)


# ---- downward closure and reconstruction --------------------------------------------------
def test_downward_closure_is_every_subset():
    got = downward_closure([("a", "b", "c"), ("c", "d")])
    want = {frozenset(s) for r in range(4) for s in itertools.combinations("abc", r)} | {
        frozenset(), frozenset("c"), frozenset("d"), frozenset("cd")
    }
    assert {frozenset(s) for s in got} == want and len(got) == len(want)
    assert got[0] == () and [len(s) for s in got] == sorted(len(s) for s in got)
    dom = binary_domain(4)
    with_dom = downward_closure([("b3", "b1"), 0b0001], dom)
    assert with_dom == [(), ("b1",), ("b3",), ("b1", "b3")]
    assert downward_closure([]) == [()]


@pytest.mark.parametrize("normalized", [False, True])
def test_marginals_from_low_order_coefficients(normalized):
    """Barak et al. Theorem 3 / Eq. 5: C^beta x from the coefficients alpha ⪯ beta only."""
    dom = binary_domain(6)
    x = np.random.default_rng(2).integers(0, 20, dom.size)
    for order in (1, 2, 3):
        for beta in itertools.combinations(dom.attrs, order):
            closure = downward_closure([beta], dom)
            assert len(closure) == 2**order
            coeffs = FourierParity(dom, closure, normalized=normalized)
            cmap = coeffs.coefficient_map(coeffs.matvec(x))
            got = marginal_from_fourier(dom, beta, cmap, normalized=normalized)
            np.testing.assert_allclose(got, Marginal(dom, beta).matvec(x), atol=1e-9)


def test_reconstruction_accepts_masks_and_any_name_order():
    dom = binary_domain(3)
    x = np.arange(8)
    H = scipy.linalg.hadamard(8)
    full = H @ x  # coefficient of mask alpha at index alpha
    cmap = {0: full[0], ("b2",): full[1], ("b2", "b0"): full[5], "b0": full[4]}
    np.testing.assert_allclose(marginal_from_fourier(dom, ["b2", "b0"], cmap), Marginal(dom, ["b0", "b2"]).matvec(x))


def test_reconstruction_and_parity_errors():
    dom = binary_domain(3)
    with pytest.raises(QueryError, match=r"coefficient of parity \{b0,b1\} is missing"):
        marginal_from_fourier(dom, ["b0", "b1"], {(): 1.0, ("b0",): 0.0, ("b1",): 0.0})
    with pytest.raises(QueryError, match="coefficients must be a mapping"):
        marginal_from_fourier(dom, ["b0"], [1.0, 2.0])
    with pytest.raises(QueryError, match=r"needs binary attributes \(size 2\); \['c'\]"):
        FourierParity(Domain(("b", "c"), (2, 3)), [("b",)])
    with pytest.raises(QueryError, match=r"parity \{b0\} is listed twice \(#0 and #1\)"):
        FourierParity(dom, [("b0",), 4])
    with pytest.raises(QueryError, match=r"bit mask 8 outside 0..2\*\*3-1"):
        FourierParity(dom, [8])
    with pytest.raises(DomainError, match="unknown attribute 'zz'"):
        FourierParity(dom, [("zz",)])
    with pytest.raises(DomainError, match="attribute 'b0' named twice"):
        FourierParity(dom, [("b0", "b0")])
    with pytest.raises(QueryError, match="subsets is empty"):
        FourierParity(dom, [])
    with pytest.raises(QueryError, match="expected 2 values"):
        FourierParity(dom, [(), ("b0",)]).coefficient_map(np.ones(3))
    with pytest.raises(QueryError, match="subset #0 is a bit mask"):
        downward_closure([3])


# ---- binary encoding ------------------------------------------------------------------------
def test_binary_encoding_round_trips():
    src = Domain.from_dict({"age": 5, "sex": ["F", "M"], "edu": 3, "one": 1})
    enc = binary_encoding(src)
    assert enc.domain.attrs == ("age#0", "age#1", "age#2", "sex#0", "edu#0", "edu#1", "one#0")
    assert enc.domain.sizes == (2,) * 7
    assert enc.bits["age"] == ("age#0", "age#1", "age#2")
    assert enc.unused_codes == {"age": (5, 6, 7), "sex": (), "edu": (3,), "one": (1,)}
    rng = np.random.default_rng(3)
    codes = np.stack([rng.integers(0, s, 300) for s in src.sizes], axis=1)
    x = np.bincount(src.ravel(codes), minlength=src.size)
    bits = enc.encode_codes(codes)
    assert bits.shape == (300, 7) and set(np.unique(bits)) <= {0, 1}
    # codes are written MSB first: age 5 -> 1 0 1
    row = int(np.argmax(codes[:, 0] == 4))
    assert list(bits[row, :3]) == [1, 0, 0]
    z = enc.encode_histogram(x)
    assert np.array_equal(z, np.bincount(enc.domain.ravel(bits), minlength=enc.domain.size))
    assert np.array_equal(enc.decode_histogram(z, check=True), x)
    assert np.array_equal(enc.decode_codes(bits), codes)
    assert np.array_equal(z[enc.cell_map()], x)
    # the unused cells are exactly the cells that decode to an out-of-range code
    binary_cells = all_cells(enc.domain)
    decoded = np.stack(
        [binary_cells[:, [enc.domain.axis(b) for b in enc.bits[a]]] @ (2 ** np.arange(len(enc.bits[a]))[::-1]) for a in src.attrs],
        axis=1,
    )
    assert np.array_equal(enc.structural_zero_mask(), np.any(decoded >= np.array(src.sizes), axis=1))
    assert not z[enc.structural_zero_mask()].any()
    X = np.stack([x, 2 * x], axis=1)
    assert np.array_equal(enc.decode_histogram(enc.encode_histogram(X)), X)


def test_fourier_marginals_of_an_encoded_domain():
    src = Domain.from_dict({"a": 3, "b": 2, "c": 5})
    enc = binary_encoding(src)
    x = np.random.default_rng(4).integers(0, 7, src.size)
    z = enc.encode_histogram(x)
    bits = enc.bits["a"] + enc.bits["c"]
    closure = downward_closure([bits], enc.domain)
    q = FourierParity(enc.domain, closure)
    marg = marginal_from_fourier(enc.domain, bits, q.coefficient_map(q.matvec(z)))
    padded = marg.reshape(4, 8)
    assert np.allclose(padded[:3, :5].ravel(), Marginal(src, ["a", "c"]).matvec(x))
    assert np.allclose(padded[3:, :], 0) and np.allclose(padded[:, 5:], 0)


def test_binary_encoding_errors():
    enc = binary_encoding(Domain(("a",), (3,)))
    with pytest.raises(DomainError, match="collide with attribute names"):
        binary_encoding(Domain(("a", "a#0"), (2, 2)))
    with pytest.raises(DataError, match="expected 3 source counts"):
        enc.encode_histogram(np.ones(4))
    with pytest.raises(DataError, match="non-zero counts on unused codes"):
        enc.decode_histogram(np.array([0, 0, 0, 1]), check=True)
    # The data's codes are quoted only when the user asks for them (issue #24 item 6).
    with pytest.raises(DataError, match=r"records hold unused codes of attribute 'a' \(the values are confidential"):
        enc.decode_codes(np.array([[1, 1]]))
    with pytest.raises(DataError, match=r"column 'a' holds codes outside 0..2 \(the values are confidential"):
        enc.encode_codes(np.array([[3]]))
    with confidential_values_shown():
        with pytest.raises(DataError, match="unused codes of attribute 'a': '3'"):
            enc.decode_codes(np.array([[1, 1]]))
        with pytest.raises(DataError, match="column 'a' holds codes outside 0..2: '3'"):
            enc.encode_codes(np.array([[3]]))
