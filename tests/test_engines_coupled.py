"""The coupled L2 engine (issue 14): bounds, disjoint sum rows and any measurements beside an identity.

The problems are top-down parents in miniature: children × cells, each child measured by the
identity, a marginal and its total; the children add up to the parent cell by cell (one row per
cell over the children), cells are non-negative, some are structural zeros. References: the
closed form (a dense KKT system, when no bound is active) and Clarabel through cvxpy (an
interior-point method that stops at a relative duality gap of 1e-8; objectives are compared
at 1e-6 relative, the tolerance dpopt's certificates accept).
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import dpopt.estimate.engines.coupled as coupled
from dpopt.estimate import reconstruct
from dpopt.estimate.engines.coupled import coupled_applies, solve_coupled
from dpopt.estimate.problem import ConsistencyProblem
from dpopt.estimate.status import Status
from dpopt.model.constraints import ConstraintSet, Invariant, NonNegativity, StructuralZeros
from dpopt.model.domain import Domain
from dpopt.model.measurement import Measurement
from dpopt.model.queries.basic import Total
from dpopt.model.queries.kronecker import Kronecker
from dpopt.model.queries.marginal import Marginal


def parent_problem(children: int = 30, cells: tuple[int, int] = (8, 6), mean: float = 2.0, sigma: float = 1.5,
                   zeros: bool = True, identity: bool = True, seed: int = 0):
    """Measurements and constraints of one parent's children (test data and test noise, not privacy noise)."""
    gen = np.random.default_rng(seed)
    chars = Domain(("a", "b"), cells)
    dom = Domain(("child", "cell"), (children, chars.size))
    truth = gen.poisson(mean, (children, chars.size)).astype(float)
    eye = sp.identity(children, format="csr")
    per_child = [("margin a", sp.csr_matrix(Marginal(chars, ("a",)).to_sparse()), sigma * 2),
                 ("total", sp.csr_matrix(Total(chars).to_sparse()), sigma * 3)]
    if identity:
        per_child.insert(0, ("detailed", sp.identity(chars.size, format="csr"), sigma))
    measurements = []
    for label, matrix, s in per_child:
        query = Kronecker([(eye, "child"), (matrix, "cell")], domain=dom)
        exact = (matrix @ truth.T).T.ravel()
        measurements.append(Measurement(query, exact + gen.normal(0.0, s, exact.size), "gaussian", s, s * s,
                                        label=label))
    constraints = [NonNegativity(), Invariant(Marginal(dom, ("cell",)), truth.sum(axis=0), name="parent")]
    cells_of = np.flatnonzero(truth[0] == 0)[:3]
    if zeros and cells_of.size:
        constraints.append(StructuralZeros({"child": [0], "cell": [int(c) for c in cells_of]}, name="zeros"))
        truth[0, cells_of] = 0.0
    return measurements, ConstraintSet(dom, constraints), truth


def objective(measurements, x) -> float:
    return float(sum(np.sum(((m.query.matvec(x) - m.values) / m.stddev) ** 2) for m in measurements))


def test_the_default_l2_solve_of_a_parent_is_the_coupled_engine_and_matches_clarabel():
    measurements, cs, _ = parent_problem()
    assert coupled_applies(ConsistencyProblem(measurements, cs, "l2"))
    fit = reconstruct(measurements, cs, "l2", integer=False)
    reference = reconstruct(measurements, cs, "l2", backend="cvxpy", integer=False)
    assert fit.success and fit.status is Status.OPTIMAL and fit.backend == "coupled", fit.message
    assert reference.success, reference.message
    assert fit.info["certificate"]["residual"] <= 1e-6
    assert bool(fit.constraint_residuals["satisfied"].all())
    assert (fit.x >= 0).all() and (fit.x == 0).sum() > 0  # bounds are active, and met exactly
    f, f_ref = objective(measurements, fit.x), objective(measurements, reference.x)
    assert f <= f_ref * (1 + 1e-6)
    assert f_ref <= f * (1 + 1e-6)
    # Strongly convex (the identity): the optimum is unique, so the tables agree as well.
    assert np.abs(fit.x - reference.x).max() <= 1e-3 * (1 + np.abs(reference.x).max())


def test_without_active_bounds_the_coupled_engine_gives_the_closed_form():
    """Large counts keep every cell away from 0: the optimum is the equality-constrained least
    squares fit, the solution of its dense KKT system."""
    measurements, cs, _ = parent_problem(children=25, mean=400.0, zeros=False, seed=3)
    fit = reconstruct(measurements, cs, "l2", integer=False)
    assert fit.backend == "coupled" and fit.success, fit.message
    n = cs.domain.size
    M = sp.vstack([m.query.to_sparse() for m in measurements]).toarray()
    w = np.concatenate([np.full(m.values.size, 1.0 / m.stddev) for m in measurements])
    y = np.concatenate([m.values for m in measurements])
    parent = cs.invariants[0]
    E = parent.query.to_sparse().toarray()
    kkt = np.block([[2 * (M.T * w**2) @ M, E.T], [E, np.zeros((E.shape[0], E.shape[0]))]])
    rhs = np.concatenate([2 * (M.T * w**2) @ y, parent.values])
    exact = np.linalg.solve(kkt, rhs)[:n]
    assert (exact > 1).all()  # no bound active: the closed form is the optimum
    assert np.abs(fit.x - exact).max() <= 1e-6 * np.abs(exact).max()


def test_a_point_that_fails_its_certificate_is_not_released_and_the_general_engine_solves(monkeypatch):
    measurements, cs, _ = parent_problem(seed=5)
    monkeypatch.setattr(coupled, "MAX_ITERATIONS", 1)
    direct = solve_coupled(ConsistencyProblem(measurements, cs, "l2"))
    assert direct.status is Status.NUMERICAL_ERROR and not direct.success
    assert "above the tolerance" in direct.message
    fit = reconstruct(measurements, cs, "l2", integer=False, time_limit=120.0)  # the rest of it to the fallback
    assert fit.success and fit.backend != "coupled"
    assert "after the coupled engine" in fit.message


def test_without_an_identity_the_problem_is_left_to_the_general_engine():
    """Marginals and totals only: not strongly convex, so the accelerated projection's linear
    rate is not guaranteed; the general engine solves it."""
    measurements, cs, _ = parent_problem(identity=False, seed=7)
    direct = solve_coupled(ConsistencyProblem(measurements, cs, "l2"))
    assert direct.status is Status.NUMERICAL_ERROR and "condition number" in direct.message
    fit = reconstruct(measurements, cs, "l2", integer=False)
    assert fit.success and fit.backend != "coupled"


@pytest.mark.parametrize("seed", range(4))
def test_the_projection_is_the_nearest_feasible_point(seed):
    """Against the projection's variational inequality: (v − P(v))·(z − P(v)) ≤ 0 for feasible z;
    the padded layout (even seeds) and the flat lexsort (odd seeds) alike."""
    gen = np.random.default_rng(seed)
    n, k = 300, 12
    group = np.where(gen.random(n) < 0.1, -1, gen.integers(0, k, n))
    lower = np.where(gen.random(n) < 0.5, 0.0, gen.random(n))
    targets = np.bincount(group[group >= 0], weights=lower[group >= 0] + gen.random((group >= 0).sum()) * 3,
                          minlength=k)
    rows = coupled._Rows(lower, np.full(n, np.inf), group, targets)
    project = coupled._Projector(rows)
    project.padded = seed % 2 == 0
    v = gen.normal(0.0, 3.0, n)
    p = project(v)
    assert (p >= lower - 1e-12).all()
    assert np.allclose(np.bincount(group[group >= 0], weights=p[group >= 0], minlength=k), targets, atol=1e-10)
    for _ in range(50):
        z = project(gen.normal(0.0, 3.0, n))  # feasible points
        assert (v - p) @ (z - p) <= 1e-9


@pytest.mark.parametrize("seed", range(6))
def test_random_parents_reach_clarabels_optimum_or_better(seed):
    """Random shapes, means (sparse to large counts), noise levels and zero rules; a parent cell at
    0 (its row's target 0) in some. Objectives compared at 1e-6 relative (what both certify)."""
    gen = np.random.default_rng(100 + seed)
    children = int(gen.integers(8, 40))
    cells = (int(gen.integers(3, 9)), int(gen.integers(3, 9)))
    if children * cells[0] * cells[1] < 1_000:
        children = 1_000 // (cells[0] * cells[1]) + 1
    measurements, cs, truth = parent_problem(children, cells, mean=float(gen.choice([0.3, 2.0, 50.0])),
                                             sigma=float(gen.choice([0.5, 2.0, 10.0])), zeros=bool(seed % 2),
                                             seed=200 + seed)
    fit = reconstruct(measurements, cs, "l2", integer=False)
    reference = reconstruct(measurements, cs, "l2", backend="cvxpy", integer=False)
    assert fit.success and fit.backend == "coupled", fit.message
    assert reference.success, reference.message
    assert bool(fit.constraint_residuals["satisfied"].all()) and (fit.x >= 0).all()
    f, f_ref = objective(measurements, fit.x), objective(measurements, reference.x)
    assert f <= f_ref * (1 + 1e-6) + 1e-9
    assert f_ref <= f * (1 + 1e-6) + 1e-9
