"""The marginal-space estimator (issue 27) against brute force on small domains.

Residual maps against dense marginals, residual GLS against explicit GLS, the non-negative
fit against the dense constrained least squares (equal where the local polytope is the
marginal polytope, a relaxation elsewhere), constraints, certificate failures, records.
"""

import functools
from itertools import combinations

import numpy as np
import pytest

from dpopt import workers
from dpopt.errors import DomainError, InconsistentConstraintsError, ParameterError, QueryError
from dpopt.estimate import reconstruct
from dpopt.estimate.marginal_space import estimate_marginals as _estimate_marginals
from dpopt.estimate.marginal_space import layout as layout_module
from dpopt.estimate.marginal_space.polytope.interior import interior_residuals
from dpopt.estimate.marginal_space.layout import ResidualIndex, SetFamily, contrast, is_decomposable, maximal_sets
from dpopt.estimate.marginal_space.polytope.projection import certify
from dpopt.estimate.marginal_space.sampling import controlled_counts, fit_network, synthetic_records
from dpopt.estimate.status import Status
from dpopt.model.constraints import ConstraintSet, Invariant, LinearInequality, NonNegativity, StructuralZeros
from dpopt.model.data import Dataset
from dpopt.model.domain import Domain
from dpopt.model.measurement import Measurement
from dpopt.model.queries import Marginal, Total
from dpopt.model.queries.basic import Identity
from dpopt.model.queries.ranges import Prefix

# These tests are of the least-squares estimate: objective 'l2' unless a test names another.
estimate_marginals = functools.partial(_estimate_marginals, objective="l2")

DOM = Domain(("a", "b", "c", "d", "e"), (2, 3, 2, 3, 2))
#: Estimate in marginal space even on these small domains (they would otherwise be solved as a table).
SPACE = {"exact_cells": 0}


def dense_marginal(x, domain, attrs):
    return Marginal(domain, attrs).matvec(x)


def residuals_of(index, x, domain):
    """Equation (2) on a dense table: ``Q_A marg_A(x)`` for every set of the index."""
    r = np.zeros(index.size)
    for p, axes in enumerate(index.set_axes):
        attrs = [domain.attrs[a] for a in axes]
        m = dense_marginal(x, domain, attrs).reshape([domain.sizes[a] for a in axes]) if attrs else np.array(x.sum())
        start = index.set_offsets[p]
        r[start:start + index.set_cells[p]] = contrast(m).ravel()
    return r


def noisy(domain, x, sets, sd, gen, noise="gaussian"):
    out = []
    for i, s in enumerate(sets):
        q = Marginal(domain, s)
        sigma = sd * (1 + i % 2)
        out.append(Measurement(q, q.matvec(x) + gen.normal(0, sigma, q.num_rows), noise, sigma, sigma**2,
                               label=", ".join(s)))
    return out


# ---- layout --------------------------------------------------------------------------------------
@pytest.mark.parametrize("dense_cells", [layout_module.DENSE_TRANSFORM_CELLS, 0])
def test_expand_gives_the_marginals_and_adjoint_is_its_transpose(dense_cells, monkeypatch, rng):
    monkeypatch.setattr(layout_module, "DENSE_TRANSFORM_CELLS", dense_cells)
    x = rng.random(DOM.size) * 10
    sets = [(0, 1), (1, 2, 4), (0, 3), (2,), (1, 3, 4)]
    index = ResidualIndex(DOM, sets)
    family = SetFamily(index, sets)
    assert all((g.dense is None) == (dense_cells == 0) for g in family.groups)
    r = residuals_of(index, x, DOM)
    mu = family.expand(r)
    for i, s in enumerate(sets):
        np.testing.assert_allclose(family.marginal(mu, i), dense_marginal(x, DOM, [DOM.attrs[a] for a in s]))
    v = rng.standard_normal(family.size)
    rc = rng.standard_normal(index.size)
    assert family.expand(rc) @ v == pytest.approx(rc @ family.adjoint(v), rel=1e-12)
    # adjoint(expand(.)) is diagonal, with the diagonal of `diagonal()`
    np.testing.assert_allclose(family.adjoint(family.expand(rc)), index.per_set(family.diagonal()) * rc, atol=1e-12)
    w = rng.random(len(sets))
    np.testing.assert_allclose(family.adjoint(v * family.per_set(w)), family.adjoint(v, w), atol=1e-12)


WIDE = Domain(tuple("abcdefg"), (2, 3, 2, 4, 2, 3, 5))


@pytest.mark.parametrize("dense_cells", [layout_module.DENSE_TRANSFORM_CELLS, 0])
@pytest.mark.parametrize("threads", [2, 3])
def test_the_maps_on_threads_equal_them_on_one(threads, dense_cells, monkeypatch, rng):
    """Every set of every shape split over threads (some with no piece of a one-set group) gives
    the maps of one thread: equal to the last bits along the cumulative sums, to rounding where a
    BLAS product may block fewer rows differently; ``transform`` is the maps' per-axis part and
    leaves its input as it was."""
    monkeypatch.setattr(layout_module, "DENSE_TRANSFORM_CELLS", dense_cells)
    monkeypatch.setattr(layout_module, "THREAD_CELLS", 0)
    sets = [tuple(c) for c in combinations(range(len(WIDE)), 3)] + [(0, 6), (5,)]
    family = SetFamily(ResidualIndex(WIDE, sets), sets)
    assert any(len(g.axes) < threads for g in family.groups) and any(len(g.axes) > threads for g in family.groups)
    r, v, w = rng.standard_normal(family.index.size), rng.standard_normal(family.size), rng.random(len(sets))
    monkeypatch.setenv(workers.THREADS_VARIABLE, "1")
    serial = family.expand(r), family.adjoint(v), family.adjoint(v, w), family.transform(v, True), \
        family.transform(v, False)
    monkeypatch.setenv(workers.THREADS_VARIABLE, str(threads))
    given = v.copy()
    threaded = family.expand(r), family.adjoint(v), family.adjoint(v, w, out=np.empty(family.index.size)), \
        family.transform(v, True), family.transform(v, False)
    assert len(family._plan()) == threads
    np.testing.assert_array_equal(v, given)
    for one, many in zip(serial, threaded):
        np.testing.assert_allclose(many, one, rtol=1e-13, atol=1e-13 * np.abs(one).max())
    np.testing.assert_allclose(family.transform(np.take(r, family._indices()), False), threaded[0], atol=1e-12)
    np.testing.assert_allclose(np.bincount(family._indices(), weights=threaded[3], minlength=family.index.size),
                               threaded[1], atol=1e-12)


def test_an_error_on_a_helper_thread_is_raised_to_the_caller(monkeypatch, rng):
    import threading

    real = layout_module._synthesize_into

    def fails_off_the_main_thread(*args):
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("a helper's piece failed")
        real(*args)

    monkeypatch.setattr(layout_module, "_synthesize_into", fails_off_the_main_thread)
    monkeypatch.setattr(layout_module, "DENSE_TRANSFORM_CELLS", 0)
    monkeypatch.setattr(layout_module, "THREAD_CELLS", 0)
    monkeypatch.setenv(workers.THREADS_VARIABLE, "2")
    sets = [tuple(c) for c in combinations(range(len(WIDE)), 3)]
    family = SetFamily(ResidualIndex(WIDE, sets), sets)
    with pytest.raises(RuntimeError, match="a helper's piece failed"):
        family.expand(rng.standard_normal(family.index.size))


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5"])
def test_the_threads_variable_must_be_a_positive_integer(value, monkeypatch):
    monkeypatch.setenv(workers.THREADS_VARIABLE, value)
    with pytest.raises(ParameterError, match=f"DPOPT_THREADS must be a positive integer, got '{value}'"):
        workers.worker_threads()
    monkeypatch.setenv(workers.THREADS_VARIABLE, "3")
    assert workers.worker_threads() == 3
    monkeypatch.delenv(workers.THREADS_VARIABLE)
    assert 1 <= workers.worker_threads() <= workers.MAX_THREADS


@pytest.mark.parametrize("n", [2, 3, 40, 100])
def test_helmert_transforms_are_orthonormal_and_transposed(n, monkeypatch, rng):
    """The per-axis transforms, by the dense product (2-D along the last axis) and by cumulative
    sums, equal the dense ``U_a`` and its transpose along every axis position, and the work-array
    versions equal them bit for bit; the contrasts are orthonormal and orthogonal to the constant."""
    u = layout_module._axis_matrix(n)
    q = u[:, 1:].T
    np.testing.assert_allclose(q @ q.T, np.eye(n - 1), atol=1e-12)
    np.testing.assert_allclose(q @ np.ones(n), 0.0, atol=1e-12)
    # n first, in the middle with 2 and with 5 entries after it, and last (where the 2-D product runs)
    for shape, axis in (((n, 4), 0), ((3, n, 2), 1), ((3, n, 5), 1), ((4, n), 1)):
        x = rng.standard_normal(shape)
        moved = np.moveaxis(x, axis, -1)
        for dense_axis, work in ((layout_module.DENSE_AXIS, layout_module.DENSE_AXIS_WORK), (0, 0)):
            monkeypatch.setattr(layout_module, "DENSE_AXIS", dense_axis)
            monkeypatch.setattr(layout_module, "DENSE_AXIS_WORK", work)
            synthesized = layout_module.synthesize_axis(x, axis)
            analysed = layout_module.analyse_axis(x, axis)
            np.testing.assert_allclose(synthesized, np.moveaxis(moved @ u.T, -1, axis), atol=1e-12)
            np.testing.assert_allclose(analysed, np.moveaxis(moved @ u, -1, axis), atol=1e-12)
            into = np.empty_like(x)
            layout_module._synthesize_into(x.copy(), axis, into)
            np.testing.assert_array_equal(into, synthesized)
            layout_module._analyse_into(x, axis, into, np.empty(x.size))
            np.testing.assert_array_equal(into, analysed)


def test_maximal_sets_keep_the_largest_only():
    assert maximal_sets([(0, 1), (1,), (0, 1, 2), (3,), (2, 3), (3,)]) == [(0, 1, 2), (2, 3)]
    assert maximal_sets([(), (4,)]) == [(4,)]


# ---- residual GLS ---------------------------------------------------------------------------------
def test_residual_gls_equals_explicit_gls(rng):
    """Without non-negativity the estimate is the generalised least squares fit: the measured
    marginals of the minimum-norm weighted least-squares table, solved densely."""
    x = rng.poisson(4, DOM.size).astype(float)
    sets = [("a", "b"), ("b", "c", "d"), ("a", "d", "e"), ("b",), ("c", "e")]
    ms = noisy(DOM, x, sets, 3.0, rng)
    ms.append(Measurement(Total(DOM), np.array([x.sum() + 5.0]), "gaussian", 10.0, 100.0, label="total"))
    est = estimate_marginals(ms, nonnegative=False, **SPACE)
    assert est.status is Status.OPTIMAL
    A = np.vstack([m.query.to_dense() / m.stddev for m in ms])
    y = np.concatenate([m.values / m.stddev for m in ms])
    x_gls = np.linalg.lstsq(A, y, rcond=None)[0]
    for s in sets + [("a",), ("d", "e")]:
        np.testing.assert_allclose(est.marginal(s), dense_marginal(x_gls, DOM, s), atol=1e-8)
    assert est.total == pytest.approx(x_gls.sum(), abs=1e-8)
    assert est.fun == pytest.approx(float(np.sum((A @ x_gls - y) ** 2)), rel=1e-9)


# ---- the non-negative fit against the dense constrained least squares ------------------------------
@pytest.mark.parametrize("sets", [
    [("a", "b"), ("b", "c"), ("c", "d"), ("d", "e"), ("b",)],      # a chain: a junction tree
    [("a", "b", "c"), ("b", "c", "d"), ("d", "e")],                # decomposable, overlapping pairs
    [("a", "b", "c", "d", "e")],                                   # one marginal on everything
])
def test_decomposable_sets_match_the_dense_constrained_least_squares(sets, rng):
    x = rng.poisson(0.4, DOM.size).astype(float)  # sparse: the noisy answers have many negatives
    ms = noisy(DOM, x, sets, 3.0, rng)
    est = estimate_marginals(ms, total="free", **SPACE)  # the same problem as the dense fit (no held total)
    assert est.status is Status.OPTIMAL, est.message
    assert est.info["polytope"] == "marginal"
    dense = reconstruct(ms, ConstraintSet(DOM, [NonNegativity()]), "l2")
    assert dense.success
    assert min(v.min() for v in est.marginals().values()) >= -est.info["certificate"]["feasibility_tol"]
    assert est.info["certificate"]["gap"] > 0 or est.fun == pytest.approx(dense.fun)
    for s in sets:
        np.testing.assert_allclose(est.marginal(s), dense_marginal(dense.x, DOM, s), atol=2e-3 * (1 + x.sum()) ** 0.5)
    assert est.fun == pytest.approx(dense.fun, rel=1e-5, abs=1e-6)


def test_cycles_are_a_relaxation_consistent_and_non_negative(rng):
    """On a cycle b-c-d the local polytope is larger than the marginal polytope: the fit is at
    least as good as the dense one, its marginals consistent and non-negative."""
    x = rng.poisson(0.4, DOM.size).astype(float)
    sets = [("a", "b", "c"), ("c", "d"), ("b", "d", "e")]
    ms = noisy(DOM, x, sets, 4.0, rng)
    est = estimate_marginals(ms, total="free", **SPACE)  # the same problem as the dense fit (no held total)
    dense = reconstruct(ms, ConstraintSet(DOM, [NonNegativity()]), "l2")
    assert est.status is Status.OPTIMAL and dense.success and est.info["polytope"] == "local"
    assert est.fun <= dense.fun * (1 + 1e-6) + 1e-6
    m = est.marginals()
    tol = est.info["certificate"]["feasibility_tol"]
    assert min(v.min() for v in m.values()) >= -tol
    # every pair of overlapping marginals agrees on the shared attributes
    for s, t in combinations(sets, 2):
        shared = [a for a in s if a in t]
        if shared:
            ms_ = Marginal(DOM.project(s), shared).matvec(m[tuple(s)])
            mt_ = Marginal(DOM.project(t), shared).matvec(m[tuple(t)])
            np.testing.assert_allclose(ms_, mt_, atol=1e-9)
    # the duality certificate is a true lower bound: the dense optimum is feasible for the relaxation
    cert = est.info["certificate"]
    assert cert["dual"] <= cert["primal"] + 1e-9


def test_small_domains_are_solved_as_a_table(rng):
    """Within ``exact_cells`` the full table is solved densely: the marginals are the dense fit's."""
    x = rng.poisson(0.4, DOM.size).astype(float)
    sets = [("a", "b", "c"), ("c", "d"), ("b", "d", "e")]
    ms = noisy(DOM, x, sets, 4.0, rng)
    est = estimate_marginals(ms, total="free")  # the same problem as the dense fit (no held total)
    dense = reconstruct(ms, ConstraintSet(DOM, [NonNegativity()]), "l2")
    assert est.status is Status.OPTIMAL and est.info["polytope"] == "table"
    for s in sets + [("a", "e")]:
        np.testing.assert_allclose(est.marginal(s), dense_marginal(dense.x, DOM, s), atol=1e-7)
    assert est.fun == pytest.approx(dense.fun, rel=1e-9)


def test_decomposability():
    assert is_decomposable([(0, 1), (1, 2), (2, 3)])
    assert is_decomposable([(0, 1, 2), (1, 2, 3), (3, 4)])
    assert not is_decomposable([(0, 1), (1, 2), (0, 2)])  # the triangle's clique is held by no set
    assert not is_decomposable([(0, 1), (1, 2), (2, 3), (3, 0)])  # a chordless cycle
    assert not is_decomposable([(a, b) for a in range(30) for b in range(a + 1, 30)])


def test_workload_above_the_measurements_and_subsets(rng):
    x = rng.poisson(2, DOM.size).astype(float)
    ms = noisy(DOM, x, [("a", "b"), ("b", "c"), ("a", "c")], 1.0, rng)
    est = estimate_marginals(ms, workload=[("a", "b", "c")], **SPACE)
    assert est.status is Status.OPTIMAL
    abc = est.marginal(("a", "b", "c")).reshape(2, 3, 2)
    assert abc.min() >= -1e-6
    np.testing.assert_allclose(abc.sum(axis=2).ravel(), est.marginal(("a", "b")), atol=1e-9)
    assert est.info["unmeasured_residual_sets"] == 3  # (a, b, c), and d and e held alone (uniform)
    np.testing.assert_allclose(est.marginal(("d",)), np.full(3, est.total / 3))
    with pytest.raises(QueryError, match="not inside any estimated marginal"):
        est.marginal(("a", "d"))



@pytest.mark.parametrize("measured, components", [
    ([("a",), ("b",), ("c",)], [("a",), ("b",), ("c",)]),           # no pair linked: full independence
    ([("a", "b"), ("c",)], [("a", "b"), ("c",)]),                    # (a, b) measured, c apart
    ([("a", "c"), ("b",), ("d",)], [("a", "c"), ("b",), ("d",)]),    # axes interleaved in the product
])
def test_independence_prior_is_the_product_over_unlinked_groups(measured, components, rng):
    """Unmeasured workload marginals are the product of the fitted marginals of the groups no
    measurement links (equation (5) of prior.py): compared with the dense product table."""
    x = rng.poisson(4, DOM.size).astype(float)
    ms = noisy(DOM, x, measured, 0.5, rng)
    work = tuple(sorted({a for c in components for a in c}, key=DOM.attrs.index))
    est = estimate_marginals(ms, workload=[work] + measured, nonnegative=False, **SPACE)
    assert est.status is Status.OPTIMAL, est.message
    total = est.total
    product = np.ones(())
    order = []
    for c in components:
        product = np.multiply.outer(product, est.marginal(c).reshape([DOM.sizes[DOM.attrs.index(a)] for a in c]))
        order += [work.index(a) for a in c]
    product = np.transpose(product, np.argsort(order)) / total ** (len(components) - 1)
    np.testing.assert_allclose(est.marginal(work), product.ravel(), rtol=1e-6, atol=1e-6 * total)


def test_linked_but_unmeasured_interactions_are_centred_at_zero(rng):
    """(a, b) and (b, c) measured, (a, b, c) asked: one component, its own residual centred at zero,
    so its marginal is the additive (minimum-norm) completion; (a, c) alone is unlinked: product."""
    from dpopt.estimate.marginal_space.layout import ResidualIndex
    from dpopt.estimate.marginal_space.prior import independence_prior

    index = ResidualIndex(DOM, [(0, 1, 2)])
    target = rng.normal(size=index.size)
    measured = np.ones(index.num_sets, dtype=bool)
    for axes in [(0, 2), (0, 1, 2)]:
        measured[index.position_of(axes)] = False
    target[index.set_offsets[index.position_of(())]] = 10.0
    out = independence_prior(index, target, measured)
    assert np.all(index.residual(out, (0, 1, 2)) == 0)
    np.testing.assert_allclose(index.residual(out, (0, 2)),
                               np.multiply.outer(index.residual(target, (0,)), index.residual(target, (2,))) / 10.0)
    kept = index.per_set(measured) > 0
    np.testing.assert_array_equal(out[kept], target[kept])
    target[index.set_offsets[index.position_of(())]] = -1.0  # a negative noisy total: no product, zeros
    assert np.all(independence_prior(index, target, measured)[~kept] == 0)

# ---- constraints -----------------------------------------------------------------------------------
def test_structural_zeros_and_invariants_against_the_dense_solve(rng):
    x = rng.poisson(1.0, DOM.size).astype(float)
    zeros = StructuralZeros("a == 1 and b == 2", name="no a1 b2")
    xa = x.reshape(DOM.shape)
    xa[1, 2] = 0.0
    x = xa.ravel()
    inv = Invariant(Marginal(DOM, ["c"]), dense_marginal(x, DOM, ["c"]), name="c totals")
    cs = ConstraintSet(DOM, [NonNegativity(), zeros, inv])
    sets = [("a", "b"), ("b", "c"), ("c", "d")]
    ms = noisy(DOM, x, sets, 2.0, rng)
    est = estimate_marginals(ms, constraints=cs, **SPACE)
    assert est.status is Status.OPTIMAL, est.message
    assert est.marginal(("a", "b")).reshape(2, 3)[1, 2] == pytest.approx(0.0, abs=1e-6)
    np.testing.assert_allclose(est.marginal(("c",)), inv.values, atol=1e-6)
    assert est.total == pytest.approx(x.sum(), abs=1e-6)
    assert est.info["interior_point"]
    dense = reconstruct(ms, cs, "l2")
    for s in sets:
        np.testing.assert_allclose(est.marginal(s), dense_marginal(dense.x, DOM, s), atol=1e-3)


def test_interior_point_is_the_residuals_of_the_product(rng):
    """The interior point's residuals equal those of the dense product table it stands for."""
    cs_axes = (0, 1)
    mask = np.zeros(6, dtype=bool)
    mask[5] = True
    exact_values = np.array([3.0, 5.0])
    index = ResidualIndex(DOM, [(0, 1, 2), (1, 3), (3, 4)])
    r = interior_residuals(index, [((4,), exact_values)], [(cs_axes, mask)], total=8.0)
    block = np.ones((2, 3))
    block.ravel()[5] = 0.0
    block /= block.sum()
    table = block[:, :, None, None, None] * (np.ones(2) / 2)[None, None, :, None, None] \
        * (np.ones(3) / 3)[None, None, None, :, None] * (exact_values / 8.0)[None, None, None, None, :] * 8.0
    np.testing.assert_allclose(r, residuals_of(index, table.ravel(), DOM), atol=1e-12)


def test_contradicting_exact_marginals_are_refused(rng):
    x = rng.poisson(2, DOM.size).astype(float)
    ms = noisy(DOM, x, [("a", "b")], 1.0, rng)
    ms.append(Measurement.exact(Marginal(DOM, ["a"]), np.array([3.0, 4.0]), "a exact"))
    ms.append(Measurement.exact(Marginal(DOM, ["a", "c"]), np.array([1.0, 1.0, 2.0, 2.0]), "a c exact"))
    with pytest.raises(InconsistentConstraintsError, match="disagree"):
        estimate_marginals(ms)


def test_bad_inputs_get_one_line_errors(rng):
    x = rng.poisson(2, DOM.size).astype(float)
    ms = noisy(DOM, x, [("a", "b")], 1.0, rng)
    prefix = Measurement(Prefix(DOM, "b"), np.zeros(3), "gaussian", 1.0, 1.0, label="ranges")
    with pytest.raises(QueryError, match="'ranges' measures"):
        estimate_marginals(ms + [prefix])
    ineq = ConstraintSet(DOM, [LinearInequality(Marginal(DOM, ["a"]), 0.0, 10.0, name="cap")])
    with pytest.raises(ParameterError, match="not inequalities"):
        estimate_marginals(ms, constraints=ineq)
    with pytest.raises(DomainError, match="max_cells"):
        estimate_marginals(ms, workload=[("a", "b", "c", "d", "e")], max_cells=10)
    with pytest.raises(QueryError, match="named twice"):
        estimate_marginals(ms, workload=[("a", "a")])
    with pytest.raises(QueryError, match="at least one measurement"):
        estimate_marginals([])
    ident = Measurement(Identity(DOM), x, "gaussian", 1.0, 1.0, label="all")
    assert estimate_marginals([ident], workload=[("a",)]).status is Status.OPTIMAL


# ---- certificate failures ------------------------------------------------------------------------------
def test_an_unfinished_solve_is_not_an_estimate(rng):
    x = rng.poisson(0.3, DOM.size).astype(float)
    ms = noisy(DOM, x, [("a", "b", "c"), ("c", "d", "e"), ("a", "e")], 5.0, rng)
    est = estimate_marginals(ms, max_iter=1, **SPACE)
    assert est.status is Status.NUMERICAL_ERROR and not est.success and est.incumbent
    assert "not certified" in est.message
    with pytest.raises(QueryError, match="not certified"):
        synthetic_records(est, 10, rng=np.random.default_rng(0))
    done = estimate_marginals(ms, **SPACE)
    assert done.success
    # the certificate separates good and bad multipliers: zero multipliers leave a gap (or negatives)
    problem_point = certify(_problem_of(done), np.zeros(done.family.size))
    assert problem_point[3] > 1e-3 or problem_point[4] > 1e-3


def _problem_of(est):
    from dpopt.estimate.marginal_space.gls import fit_residuals
    from dpopt.estimate.marginal_space.polytope.projection import ProjectionProblem

    sets = [tuple(sorted(est.domain.axes(m.query.attrs))) for m in est.measurements]
    fit = fit_residuals(est.index, sets, [m.values for m in est.measurements],
                        np.array([m.variance for m in est.measurements]), [m.label for m in est.measurements])
    weight = np.where(fit.weight > 0, fit.weight, 1.0)
    return ProjectionProblem(est.index, est.family, fit.target, weight, fit.fixed)


# ---- records --------------------------------------------------------------------------------------------
def test_controlled_counts_are_floor_or_ceiling_and_unbiased():
    expected = np.array([[0.4, 1.3, 2.3], [5.0, 0.0, 0.0], [0.5, 0.5, 1.0]])
    totals = np.array([4, 5, 2])
    grid = (np.arange(1000) + 0.5) / 1000
    draws = np.stack([controlled_counts(expected, totals, np.full(3, u)) for u in grid])
    assert (draws.sum(axis=2) == totals).all()
    assert (draws >= np.floor(expected)).all() and (draws <= np.ceil(expected)).all()
    np.testing.assert_allclose(draws.mean(axis=0), expected, atol=2e-3)


def test_records_follow_the_network_with_controlled_rounding(rng):
    """Family counts in the records are within one record of (parent counts) x P(child | parents);
    on a chain (a junction tree) the network reproduces the estimate, and so do the records."""
    x = rng.poisson(30, DOM.size).astype(float)
    sets = [("a", "b"), ("b", "c"), ("c", "d"), ("d", "e")]
    est = estimate_marginals(noisy(DOM, x, sets, 2.0, rng), **SPACE)
    model = fit_network(est)
    n = 5000
    records = synthetic_records(est, n, rng=np.random.default_rng(1), model=model)
    assert len(records) == n
    data = Dataset(records, DOM)
    for child in model.order:
        parents = model.parents[child]
        family = tuple(sorted((child,) + parents))
        counts = data.marginal([DOM.attrs[a] for a in family]).reshape([DOM.sizes[a] for a in family])
        counts = np.moveaxis(counts, family.index(child), -1).reshape(-1, DOM.sizes[child])
        parent_counts = counts.sum(axis=1, keepdims=True)
        assert np.abs(counts - parent_counts * model.conditionals[child]).max() < 1.0
    scale = n / est.total
    for s in sets:
        assert np.abs(data.marginal(s) - est.marginal(s) * scale).max() <= 4.0


def test_records_need_exactly_one_source_of_randomness(rng):
    x = rng.poisson(5, DOM.size).astype(float)
    est = estimate_marginals(noisy(DOM, x, [("a", "b")], 1.0, rng), **SPACE)
    with pytest.raises(ParameterError, match="exactly one"):
        synthetic_records(est, 10)
    with pytest.raises(ParameterError, match="needed"):
        synthetic_records(est, 10, uniforms=np.zeros(3))
    u = np.random.default_rng(0).random(1000)
    a = synthetic_records(est, 10, uniforms=u)
    b = synthetic_records(est, 10, uniforms=u)
    assert np.array_equal(a, b) and a.shape == (10, len(DOM))


def test_the_one_call_for_plans_on_a_wide_domain():
    """What a plan (``auto``) calls when the table does not fit: measurements of marginals drawn by
    dpopt's own mechanisms on 30 binary attributes (10^9 cells, never formed) in; certified,
    consistent, non-negative marginals (measured and unmeasured workload pairs) and records out."""
    from fractions import Fraction

    from dpopt.datasets.bayes_net import random_sparse_network
    from dpopt.privacy.budget import Budget
    from dpopt.privacy.mechanisms import calibrate, measure
    from dpopt.privacy.randomness import make_random

    data = random_sparse_network(30, seed=2).sample(4000, 3)
    names = data.domain.attrs
    chain = [(names[i], names[i + 1]) for i in range(29)]
    budget = Budget.zcdp(Fraction(1))
    accountant, source = budget.accountant(), make_random(5)
    ms = []
    for s in chain:
        q = Marginal(data.domain, s)
        law = calibrate(q, budget.share(Fraction(1, len(chain))))
        ms.append(measure(q, data, law, accountant, source, label=", ".join(s)))
    unmeasured = (names[0], names[29])
    est = estimate_marginals(ms, workload=chain + [unmeasured])
    assert est.success and est.info["polytope"] == "local", est.message  # the pair closes a cycle
    released = est.marginals()
    assert set(released) == set(chain) | {unmeasured}
    assert all(v.min() >= -1e-6 for v in released.values())
    np.testing.assert_allclose(released[unmeasured].reshape(2, 2).sum(axis=1), est.marginal((names[0],)), atol=1e-6)
    one, last = est.marginal((names[0],)), est.marginal((names[29],))
    np.testing.assert_allclose(released[unmeasured], np.outer(one, last).ravel() / est.total, rtol=1e-5)
    codes = est.records(2000, rng=make_random(6))
    assert codes.shape == (2000, 30)
    records = Dataset(codes, data.domain)
    for s in chain[:5]:
        assert np.abs(records.marginal(s) - est.marginal(s) * 2000 / est.total).max() <= 4.0


def test_shrinkage_is_the_posterior_mode_of_equation_6(rng):
    """``shrink=True``: each noisy pair residual moves to ``(W r^ + P c0) / (W + P)`` with ``c0`` the
    product of the fitted one-way residuals and ``P = 1/tau²`` from the moments (6), computed here
    by hand from the measurements; on independent data under heavy noise it beats least squares."""
    from dpopt.estimate.marginal_space.gls import fit_residuals

    dom = Domain(tuple("abcdefgh"), (2, 3, 2, 2, 3, 2, 2, 2))
    p = [rng.dirichlet(np.ones(n)) for n in dom.sizes]
    x = 2000.0 * outer_table(p)
    pairs = list(combinations(dom.attrs, 2))
    ms = noisy(dom, x, pairs, 6.0, rng)
    ls = estimate_marginals(ms, nonnegative=False, **SPACE)
    est = estimate_marginals(ms, nonnegative=False, shrink=True, **SPACE)
    assert est.success and ls.success
    index = est.index
    fit = fit_residuals(index, [tuple(sorted(dom.axes(s))) for s in pairs], [m.values for m in ms],
                        np.array([m.variance for m in ms]), [m.label for m in ms])
    total = fit.target[index.set_offsets[index.position_of(())]]
    two = [axes for axes in index.set_axes if len(axes) == 2]
    centre = {a: np.multiply.outer(index.residual(fit.target, a[:1]), index.residual(fit.target, a[1:])) / total
              for a in two}
    gaps = np.concatenate([(index.residual(fit.target, a) - centre[a]).ravel() for a in two])
    inverse_w = np.concatenate([np.full(centre[a].size, 1 / fit.weight[index.position_of(a)]) for a in two])
    tau2 = max(np.mean(gaps**2) - np.mean(inverse_w), 0.0)
    assert est.info["shrinkage"][2]["tau2"] == pytest.approx(tau2, rel=1e-9)
    for a in two:
        w = fit.weight[index.position_of(a)]
        prior = min(1 / tau2 if tau2 > 0 else np.inf, 1e3 * w)
        expected = (w * index.residual(fit.target, a) + prior * centre[a]) / (w + prior)
        np.testing.assert_allclose(index.residual(est.residuals, a), expected, rtol=1e-7, atol=1e-9)
    truth = {s: dense_marginal(x, dom, s) for s in pairs}
    error = {name: np.mean([np.abs(e.marginal(s) - truth[s]).sum() for s in pairs]) for name, e in
             (("ls", ls), ("shrink", est))}
    assert error["shrink"] < error["ls"]


def outer_table(parts):
    out = np.ones(())
    for q in parts:
        out = np.multiply.outer(out, q)
    return out.ravel()


def test_loose_attributes_are_uniform_and_leave_the_dual_alone(rng):
    """Attributes no measurement or workload holds are released uniform (``N / n_a``) and kept out
    of the projection: its curvature and its answer are those of the domain without them, and
    the held marginals equal the dense constrained least squares'."""
    x = rng.poisson(0.4, DOM.size).astype(float)
    sets = [("a", "b"), ("b", "c")]
    ms = noisy(DOM, x, sets, 3.0, rng)
    est = estimate_marginals(ms, **SPACE)
    assert est.status is Status.OPTIMAL, est.message
    assert est.info["loose_attributes"] == ["d", "e"]
    sub = DOM.project(("a", "b", "c"))
    ms_sub = [Measurement(Marginal(sub, m.query.attrs), m.values, m.noise, m.scale, m.variance, label=m.label)
              for m in ms]
    alone = estimate_marginals(ms_sub, **SPACE)
    assert est.info["curvature"] == pytest.approx(alone.info["curvature"], rel=1e-12)
    dense = reconstruct(ms, ConstraintSet(DOM, [NonNegativity()]), "l2")
    for s in sets:
        np.testing.assert_allclose(est.marginal(s), alone.marginal(s), atol=1e-9)
        np.testing.assert_allclose(est.marginal(s), dense_marginal(dense.x, DOM, s), atol=2e-3 * (1 + x.sum()) ** 0.5)
    np.testing.assert_allclose(est.marginal(("d",)), np.full(3, est.total / 3), rtol=1e-12)
    np.testing.assert_allclose(est.marginal(("e",)), np.full(2, est.total / 2), rtol=1e-12)
