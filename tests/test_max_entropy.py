"""The exact entropy objective: closed forms, agreement with multiplicative weights, and
the total-constrained NNLS working set it stands on."""

from __future__ import annotations

import numpy as np
import pytest

from dpopt.errors import SolverError
from dpopt.estimate import Status, reconstruct
from dpopt.estimate.engines.least_squares import solve_l2
from dpopt.estimate.problem import ConsistencyProblem
from dpopt.model.constraints import ConstraintSet, Invariant, LinearInequality, NonNegativity, StructuralZeros
from dpopt.model.data import Dataset
from dpopt.model.domain import Domain
from dpopt.model.measurement import Measurement
from dpopt.model.queries import Marginal, Total, all_marginals


def measured(query, values, sigma=1.0):
    return Measurement(query, np.asarray(values, dtype=float), "gaussian", sigma, sigma**2, label=query.name)


@pytest.fixture
def table(rng):
    dom = Domain(("a", "b", "c"), (2, 3, 4))
    counts = rng.integers(1, 30, dom.size)
    return Dataset.from_histogram(counts, dom)


def test_one_way_marginals_give_the_independent_table(table):
    """Consistent one-way marginals fit exactly by many tables; the maximum-entropy one is
    the product of the marginals divided by N^(k-1) (closed form)."""
    dom = table.domain
    ms = [measured(Marginal(dom, [a]), Marginal(dom, [a]).answer(table)) for a in dom.attrs]
    res = reconstruct(ms, ConstraintSet(dom, [NonNegativity()]), "entropy")
    assert res.success and res.status is Status.OPTIMAL and res.backend == "exact", res.message
    n = table.total
    margins = [m.values / n for m in ms]
    expected = n * np.einsum("i,j,k->ijk", *margins).ravel()
    np.testing.assert_allclose(res.x, expected, rtol=1e-6, atol=1e-6 * n)
    assert res.info["face_cells"] == dom.size
    assert abs(res.info["duality_gap"]) <= 1e-6 * n


def test_prior_is_the_reference_of_the_divergence(table, rng):
    """With a prior, the best fit closest in KL to it: for one-way marginals of two
    attributes it is the prior raked to both margins (iterative proportional fitting)."""
    dom = Domain(("a", "b"), (3, 4))
    data = Dataset.from_histogram(rng.integers(1, 30, dom.size), dom)
    ms = [measured(Marginal(dom, [a]), Marginal(dom, [a]).answer(data)) for a in dom.attrs]
    prior = rng.uniform(0.5, 2.0, dom.size)
    res = reconstruct(ms, ConstraintSet(dom, [NonNegativity()]), "entropy", initial=prior)
    assert res.success, res.message
    raked = prior.reshape(3, 4).copy()
    for _ in range(2000):  # plain IPF: converges linearly on this interior problem
        raked *= (ms[0].values / raked.sum(1))[:, None]
        raked *= (ms[1].values / raked.sum(0))[None, :]
    np.testing.assert_allclose(res.x, raked.ravel(), rtol=1e-5, atol=1e-5 * data.total)


def test_exact_and_multiplicative_weights_reach_the_same_table(table, rng):
    """On a noisy problem with an interior optimum both backends converge to one point."""
    dom = table.domain
    ms = [measured(q, q.answer(table) + rng.normal(0, 2.0, q.num_rows), 2.0) for q in all_marginals(dom, 1)]
    ms.append(measured(Marginal(dom, ["a", "b"]), Marginal(dom, ["a", "b"]).answer(table) + rng.normal(0, 2.0, 6), 2.0))
    cs = ConstraintSet(dom, [NonNegativity()])
    exact = reconstruct(ms, cs, "entropy", backend="exact")
    mw = reconstruct(ms, cs, "entropy", backend="mw", max_passes=20000, tol=1e-11)
    assert exact.success and mw.success, (exact.message, mw.message)
    np.testing.assert_allclose(exact.x, mw.x, rtol=1e-4, atol=1e-4 * table.total)
    assert exact.fun <= mw.fun * (1 + 1e-9)


def test_zeros_invariants_and_a_boundary_optimum(table, rng):
    """Noisy measurements pushing cells negative: the fit sits on the boundary; zeros and
    invariants hold exactly; the reported gap certifies the fit."""
    dom = table.domain
    cs = ConstraintSet(dom, [NonNegativity(), StructuralZeros("a == 0 and b == 2", name="rule")])
    cs.add(Invariant(Marginal(dom, ["a"]), Marginal(dom, ["a"]).answer(table), name="a_totals"))
    ms = [measured(q, q.answer(table) + rng.normal(0, 15.0, q.num_rows), 15.0) for q in all_marginals(dom, 2)]
    res = reconstruct(ms, cs, "entropy")
    assert res.success, res.message
    assert np.all(res.x[cs.zero_mask()] == 0) and res.x.min() >= 0
    np.testing.assert_allclose(Marginal(dom, ["a"]).matvec(res.x), Marginal(dom, ["a"]).answer(table), atol=1e-6)
    # the fit equals the L2 optimum with the same equalities (the first stage is exact)
    l2 = reconstruct(ms, cs, "l2")
    assert res.fun == pytest.approx(l2.fun, rel=1e-6)


def test_total_constrained_working_set_matches_the_qp(rng):
    """The NNLS working set with the total as an exact equality equals the general QP."""
    dom = Domain(tuple("abcdef"), (2,) * 6)
    data = Dataset.from_histogram(rng.integers(0, 5, dom.size), dom)
    ms = [measured(q, q.answer(data) + rng.normal(0, 3.0, q.num_rows), 3.0) for q in all_marginals(dom, 2)]
    cs = ConstraintSet(dom, [NonNegativity(), Invariant(Total(dom), [data.total + 7.0], name="total")])
    problem = ConsistencyProblem(ms, cs, "l2")
    working = solve_l2(problem, None, working_set=True)
    qp = solve_l2(problem, "cvxpy")
    assert working.success and qp.success, (working.message, qp.message)
    assert "working set" in working.info["form"]
    assert working.x.sum() == pytest.approx(data.total + 7.0, rel=1e-12)
    assert working.fun == pytest.approx(qp.fun, rel=1e-6)
    np.testing.assert_allclose(Marginal(dom, ["a", "b"]).matvec(working.x), Marginal(dom, ["a", "b"]).matvec(qp.x), atol=1e-4)


def test_backend_and_option_errors(table):
    dom = table.domain
    ms = [measured(Marginal(dom, ["a"]), Marginal(dom, ["a"]).answer(table))]
    cs = ConstraintSet(dom, [NonNegativity()])
    with pytest.raises(SolverError, match="belong to the 'mw' backend"):
        reconstruct(ms, cs, "entropy", backend="exact", max_passes=5)
    with pytest.raises(SolverError, match="belong to the 'exact' backend"):
        reconstruct(ms, cs, "entropy", backend="mw", face_tol=1e-6)
    with pytest.raises(SolverError, match="unknown options"):
        reconstruct(ms, cs, "entropy", bogus=1)
    ineq = ConstraintSet(dom, [NonNegativity(), LinearInequality(Total(dom), [0.0], [1e6], name="cap")])
    with pytest.raises(SolverError, match="'mw'|inequalit"):
        reconstruct(ms, ineq, "entropy", backend="exact")


def test_large_face_newton_path_gives_the_independent_table(rng):
    """Thirteen binary attributes, one-way marginals only: the face is the whole domain
    (8192 cells, above the cone program's size), solved by Newton's method on the dual;
    the answer is the product of the margins (closed form)."""
    dom = Domain(tuple(f"b{i}" for i in range(13)), (2,) * 13)
    data = Dataset.from_histogram(rng.integers(0, 4, dom.size), dom)
    ms = [measured(Marginal(dom, [a]), Marginal(dom, [a]).answer(data)) for a in dom.attrs]
    res = reconstruct(ms, ConstraintSet(dom, [NonNegativity()]), "entropy")
    assert res.success and "Newton" in res.message, res.message
    n = data.total
    expected = np.full(1, float(n))
    for m in ms:
        expected = np.multiply.outer(expected, m.values / n).ravel()
    np.testing.assert_allclose(res.x, expected, rtol=1e-8, atol=1e-8 * n)
