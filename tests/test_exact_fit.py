"""Exact fits: the Fourier weighted Gram, Newton on the entropy dual, vertices, the LP shortcut."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pytest
from scipy.optimize import linprog

from dpopt.estimate import reconstruct
from dpopt.estimate.engines.exact_fit import basic_exact_fit, exact_fit_applies, positive_exact_fit
from dpopt.estimate.problem import ConsistencyProblem
from dpopt.model.constraints import ConstraintSet, Invariant, NonNegativity, StructuralZeros
from dpopt.model.domain import Domain
from dpopt.model.measurement import Measurement
from dpopt.model.queries import Total
from dpopt.model.queries.fourier import FourierParity, downward_closure


def binary_domain(k: int) -> Domain:
    return Domain(tuple(f"a{i}" for i in range(k)), (2,) * k)


def parities(domain: Domain, order: int, attrs=None) -> FourierParity:
    attrs = domain.attrs if attrs is None else attrs
    return FourierParity(domain, downward_closure(list(combinations(attrs, order)), domain))


def measured(query, values, sigma=10.0) -> Measurement:
    return Measurement(query, np.asarray(values, dtype=float), "gaussian", sigma, sigma**2, label="coeffs")


def problem(m: Measurement, extra=()) -> ConsistencyProblem:
    return ConsistencyProblem([m], ConstraintSet(m.query.domain, [NonNegativity(), *extra]), "linf")


@pytest.mark.parametrize("normalized", [False, True])
@pytest.mark.parametrize("attrs", [None, ("a0", "a2", "a3")])
def test_fourier_weighted_gram_equals_the_explicit_product(normalized, attrs, rng):
    dom = binary_domain(5)
    subsets = downward_closure(list(combinations(attrs or dom.attrs, 2)), dom)
    q = FourierParity(dom, subsets, normalized=normalized)
    v = rng.random(dom.size)
    explicit = q.to_dense() @ np.diag(v) @ q.to_dense().T
    assert q.fast_weighted_gram
    np.testing.assert_allclose(q.weighted_gram(v), explicit, rtol=1e-12, atol=1e-12)


def test_one_way_parities_give_the_independent_table(rng):
    """Closed form: the maximum-entropy table with given one-way margins is their product."""
    dom = binary_domain(6)
    x0 = rng.random(dom.size) * 10 + 0.1
    q = parities(dom, 1)
    fit = positive_exact_fit(problem(measured(q, q.matvec(x0))))
    assert fit is not None and fit.max_residual <= 1e-8
    n = x0.sum()
    table = x0.reshape((2,) * 6)
    independent = n * np.ones((2,) * 6)
    for axis in range(6):
        share = table.sum(axis=tuple(a for a in range(6) if a != axis)) / n
        shape = [1] * 6
        shape[axis] = 2
        independent = independent * share.reshape(shape)
    np.testing.assert_allclose(fit.x, independent.ravel(), rtol=1e-9)


def test_two_way_fit_meets_the_maximum_entropy_conditions(rng):
    """KKT: Q x = y, x > 0 and log x in the row space of Q (x = exp(Q^T lam - 1))."""
    dom = binary_domain(7)
    q = parities(dom, 2)
    x0 = rng.gamma(0.5, 4.0, dom.size)
    fit = positive_exact_fit(problem(measured(q, q.matvec(x0))))
    assert fit is not None and (fit.x > 0).all()
    np.testing.assert_allclose(q.matvec(fit.x), q.matvec(x0), rtol=0, atol=1e-8 * x0.sum())
    Qd = q.to_dense()
    lam = np.linalg.lstsq(Qd.T, np.log(fit.x), rcond=None)[0]
    np.testing.assert_allclose(Qd.T @ lam, np.log(fit.x), atol=1e-7)


def test_no_fit_when_no_non_negative_table_reproduces_the_coefficients(rng):
    dom = binary_domain(6)
    q = parities(dom, 2)
    x0 = np.zeros(dom.size)
    x0[:3] = 50.0
    y = q.matvec(x0) + rng.normal(0, 15, q.num_rows)  # noise no sparse table can absorb
    # The feasibility LP {x >= 0 : Q x = y} confirms it
    lp = linprog(np.zeros(dom.size), A_eq=q.to_dense(), b_eq=y, bounds=(0, None), method="highs")
    assert lp.status == 2
    assert positive_exact_fit(problem(measured(q, y))) is None
    negative_total = q.matvec(x0)
    negative_total[q.subsets.index(())] = -5.0
    assert positive_exact_fit(problem(measured(q, negative_total))) is None


def test_basic_fit_is_a_vertex(rng):
    dom = binary_domain(8)
    q = parities(dom, 2)
    x0 = rng.random(dom.size) * 3
    y = q.matvec(x0)
    p = problem(measured(q, y))
    interior = positive_exact_fit(p)
    vertex = basic_exact_fit(p, interior)
    support = np.flatnonzero(vertex.x > 0)
    assert (vertex.x >= 0).all() and support.size <= q.num_rows
    assert np.linalg.matrix_rank(q.to_dense()[:, support]) == support.size  # independent columns
    np.testing.assert_allclose(q.matvec(vertex.x), y, atol=1e-8 * np.abs(y).max())


def test_structural_zeros_stay_zero(rng):
    dom = binary_domain(6)
    q = parities(dom, 2)
    zeros = StructuralZeros({"a0": 1, "a1": 1})
    forbidden = ConstraintSet(dom, [zeros]).zero_mask().ravel()
    assert forbidden.sum() == dom.size // 4
    x0 = rng.random(dom.size) + 0.5
    x0[forbidden] = 0.0
    fit = positive_exact_fit(problem(measured(q, q.matvec(x0)), [zeros]))
    assert fit is not None
    assert (fit.x[forbidden] == 0).all() and (fit.x[~forbidden] > 0).all()
    np.testing.assert_allclose(q.matvec(fit.x), q.matvec(x0), atol=1e-8 * x0.sum())


def test_applies_only_to_one_fast_measurement_without_equality_rows(rng):
    dom = binary_domain(5)
    q = parities(dom, 2)
    m = measured(q, q.matvec(rng.random(dom.size)))
    assert exact_fit_applies(problem(m))
    assert not exact_fit_applies(ConsistencyProblem([m, measured(Total(dom), [3.0])],
                                                    ConstraintSet(dom, [NonNegativity()]), "linf"))
    with_invariant = ConstraintSet(dom, [NonNegativity(), Invariant(Total(dom), [3.0])])
    assert not exact_fit_applies(ConsistencyProblem([m], with_invariant, "linf"))
    assert not exact_fit_applies(ConsistencyProblem([m], ConstraintSet(dom, []), "linf"))


@pytest.mark.parametrize("objective", ["linf", "l1"])
def test_lp_returns_the_exact_fit_as_its_certified_optimum(objective, rng):
    """Coefficients some positive table reproduces: the shortcut's vertex has objective 0,
    which is what the simplex reaches with the shortcut off."""
    dom = binary_domain(12)
    q = parities(dom, 2)
    y = q.matvec(rng.poisson(2.0, dom.size).astype(float)) + rng.integers(-3, 4, q.num_rows)
    m = measured(q, y)
    cs = ConstraintSet(dom, [NonNegativity()])
    fast = reconstruct([m], cs, objective, column_generation=True)
    assert fast.success and fast.info["exact_fit"] and "Newton" in fast.solver and fast.fun <= 1e-6
    assert (fast.x >= 0).all() and (fast.x > 0).sum() <= q.num_rows
    np.testing.assert_allclose(q.matvec(fast.x), y, atol=1e-6)
    slow = reconstruct([m], cs, objective, column_generation=True, exact_fit=None, initial="score")
    assert slow.success and "exact_fit" not in slow.info and slow.fun == pytest.approx(0.0, abs=1e-6)
    interior = reconstruct([m], cs, objective, column_generation=True, exact_fit="interior")
    assert interior.success and (interior.x > 0).all() and interior.fun <= 1e-6
    with pytest.raises(Exception, match="exact_fit"):
        reconstruct([m], cs, objective, column_generation=True, exact_fit="yes")


# ---- the interior-point column choice for L1 ----------------------------------------------------
def l1_dense_optimum(Qd: np.ndarray, y: np.ndarray, w: float, cells=None) -> float:
    """min w * sum |Q x - y| over x >= 0 (on ``cells``), by scipy's HiGHS on the dense LP."""
    A = Qd if cells is None else Qd[:, cells]
    m, n = A.shape
    res = linprog(np.concatenate([np.zeros(n), np.full(2 * m, w)]),
                  A_eq=np.hstack([A, -np.eye(m), np.eye(m)]), b_eq=y, bounds=(0, None), method="highs")
    assert res.status == 0
    return float(res.fun)


def noisy_sparse_coefficients(k: int, rng, noise: float = 15.0):
    dom = binary_domain(k)
    q = parities(dom, 2)
    x0 = np.zeros(dom.size)
    x0[rng.choice(dom.size, 8, replace=False)] = rng.integers(20, 60, 8)
    return q, q.matvec(x0) + rng.normal(0, noise, q.num_rows)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_interior_columns_hold_an_l1_optimum(seed):
    """Brute force: the LP over the chosen cells has the optimum of the LP over all cells."""
    from dpopt.estimate.engines.interior_point import l1_interior_columns

    rng = np.random.default_rng(seed)
    q, y = noisy_sparse_coefficients(8, rng)
    sigma = 10.0
    p = ConsistencyProblem([measured(q, y, sigma)], ConstraintSet(q.domain, [NonNegativity()]), "l1")
    cells = l1_interior_columns(p, limit=4 * q.num_rows)
    assert cells is not None and 0 < cells.size <= 4 * q.num_rows
    Qd = q.to_dense()
    full = l1_dense_optimum(Qd, y, 1 / sigma)
    assert full > 0.1  # no exact fit: a genuine L1 problem
    assert l1_dense_optimum(Qd, y, 1 / sigma, cells) == pytest.approx(full, rel=1e-7)


def test_l1_interior_start_reaches_the_dense_optimum():
    rng = np.random.default_rng(5)
    q, y = noisy_sparse_coefficients(11, rng)
    m = measured(q, y, 10.0)
    cs = ConstraintSet(q.domain, [NonNegativity()])
    full = l1_dense_optimum(q.to_dense(), y, 0.1)
    fast = reconstruct([m], cs, "l1", column_generation=True)  # initial="auto": interior
    assert fast.success and fast.info["initial"] == "interior" and fast.fun == pytest.approx(full, rel=1e-7)
    nnls = reconstruct([m], cs, "l1", column_generation=True, initial="nnls")
    assert nnls.success and nnls.info["initial"] == "nnls" and nnls.fun == pytest.approx(full, rel=1e-7)
    # with an invariant the interior start does not apply; "auto" falls back to the NNLS start
    with_total = ConstraintSet(q.domain, [NonNegativity(), Invariant(Total(q.domain), [200.0])])
    fallback = reconstruct([m], with_total, "l1", column_generation=True)
    Qd = q.to_dense()
    n, k = q.domain.size, q.num_rows
    A_eq = np.vstack([np.hstack([Qd, -np.eye(k), np.eye(k)]), np.concatenate([np.ones(n), np.zeros(2 * k)])])
    dense = linprog(np.concatenate([np.zeros(n), np.full(2 * k, 0.1)]), A_eq=A_eq, b_eq=np.append(y, 200.0),
                    bounds=(0, None), method="highs")
    assert fallback.success and abs(fallback.x.sum() - 200.0) <= 1e-6
    assert fallback.fun == pytest.approx(dense.fun, rel=1e-7)


def test_l2_returns_the_exact_fit_where_nnls_reaches_the_same_objective(rng):
    dom = binary_domain(12)
    q = parities(dom, 2)
    y = q.matvec(rng.poisson(2.0, dom.size).astype(float)) + rng.integers(-3, 4, q.num_rows)
    m = measured(q, y)
    cs = ConstraintSet(dom, [NonNegativity()])
    fast = reconstruct([m], cs, "l2", working_set=True)
    assert fast.success and fast.info["exact_fit"] and fast.fun <= 1e-12
    assert (fast.x >= 0).all() and (fast.x > 0).sum() <= q.num_rows
    from dpopt.estimate.engines.least_squares import nnls_by_column_generation

    p = ConsistencyProblem([m], cs, "l2")
    slow = nnls_by_column_generation(p, p.free_cells(), p.sigmas(), p.targets(), None, 0.0)
    assert slow.success and slow.fun == pytest.approx(0.0, abs=1e-9)


def test_entropy_on_exactly_fittable_coefficients_is_the_exponential_cone_optimum(rng):
    """The entropy objective's shortcut against cvxpy's exponential-cone program on the same
    problem: minimise sum x log(x / prior) subject to Q x = y and sum x = N."""
    cp = pytest.importorskip("cvxpy")
    from dpopt.estimate.engines.max_entropy import solve_max_entropy

    dom = binary_domain(6)
    q = FourierParity(dom, [s for s in downward_closure(list(combinations(dom.attrs, 2)), dom) if s != ()])
    x0 = rng.gamma(1.0, 5.0, dom.size)
    n = float(x0.sum())
    prior = rng.random(dom.size) + 0.5
    p = ConsistencyProblem([measured(q, q.matvec(x0))], ConstraintSet(dom, [NonNegativity()]), "entropy")
    result = solve_max_entropy(p, n, prior=prior)
    assert result.success and "Newton" in result.solver and result.info["face_cells"] == dom.size
    x = cp.Variable(dom.size)
    program = cp.Problem(cp.Minimize(cp.sum(cp.rel_entr(x, prior))), [q.to_dense() @ x == q.matvec(x0), cp.sum(x) == n])
    program.solve(solver=cp.CLARABEL)
    assert program.status == "optimal"
    # Feasible, no worse than the cone solver's objective, and optimal by KKT: log(x / prior)
    # lies in the row space of [Q; 1] (a certificate for this convex problem)
    A = np.vstack([q.to_dense(), np.ones(dom.size)])
    np.testing.assert_allclose(A @ result.x, np.append(q.matvec(x0), n), rtol=0, atol=1e-9 * n)
    ours = float(np.sum(result.x * np.log(result.x / prior)))
    assert ours <= program.value + 1e-7 * abs(program.value)
    log_ratio = np.log(result.x / prior)
    lam = np.linalg.lstsq(A.T, log_ratio, rcond=None)[0]
    np.testing.assert_allclose(A.T @ lam, log_ratio, rtol=0, atol=1e-8)
    # a measured total other than N cannot be fitted exactly: the two-stage method answers
    with_total = FourierParity(dom, [(), *q.subsets])
    off = ConsistencyProblem([measured(with_total, with_total.matvec(x0) + np.eye(with_total.num_rows)[0])],
                             ConstraintSet(dom, [NonNegativity()]), "entropy")
    two_stage = solve_max_entropy(off, n)
    assert two_stage.success and "Newton's method on the entropy dual (exact fit)" not in two_stage.solver


def test_column_generation_stops_when_highs_finds_no_improving_column(monkeypatch):
    """A pricing tolerance far below HiGHS's dual tolerance makes the pricing offer columns
    that HiGHS will not pivot on; column generation must stop there (it once added 22,000
    such columns 50 at a time) with the dense LP's optimum."""
    import dpopt.estimate.engines.linear as linear

    rng = np.random.default_rng(5)
    q, y = noisy_sparse_coefficients(11, rng)
    m = measured(q, y, 10.0)
    cs = ConstraintSet(q.domain, [NonNegativity()])
    monkeypatch.setattr(linear, "PRICING_TOL", 1e-16)
    result = reconstruct([m], cs, "l1", column_generation=True, initial="nnls")
    assert result.success and result.fun == pytest.approx(l1_dense_optimum(q.to_dense(), y, 0.1), rel=1e-7)
    assert result.info["rounds"] < 40
    # it stopped on the stall, and the violation HiGHS tolerated is within its tolerance
    assert 0 <= result.info["pricing_stalled_at"] <= 1e-7
