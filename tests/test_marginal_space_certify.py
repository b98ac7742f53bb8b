"""The projection's certificate where L-BFGS-B alone stalls (issue 27): the polish by conjugate
gradients on the active face must certify to far below the tolerance, every figure checked
independently of the solver (feasibility, consistency, and the duality gap recomputed from
the primal and dual values)."""

from itertools import combinations

import numpy as np
import pytest

from dpopt.datasets.bayes_net import random_sparse_network
from dpopt.estimate.marginal_space import estimate_marginals
from dpopt.estimate.marginal_space.projection import ProjectionProblem, certify, dual_value, objective, polish, project
from dpopt.estimate.status import Status
from dpopt.model.measurement import Measurement
from dpopt.model.queries import Marginal


def _laplace_triples(d: int, measured: int, scale: float, seed: int):
    """A sparse network's data (n = 50,000), its first ``measured`` triples spanning at most 3
    places measured with Laplace noise of ``scale`` (pure eps = 1 shared by 73 marginals: scale 73)."""
    data = random_sparse_network(d, seed=1).sample(50_000, 2)
    names = data.domain.attrs
    triples = list(combinations(names, 3))
    local = [t for t in triples if names.index(t[2]) - names.index(t[0]) <= 3][:measured]
    gen = np.random.default_rng(seed)
    out = []
    for t in local:
        q = Marginal(data.domain, t)
        y = np.asarray(data.marginal(t), dtype=float) + gen.laplace(0.0, scale, q.num_rows)
        out.append(Measurement(q, y, "laplace", scale, 2 * scale**2, label=", ".join(t)))
    return data, out, triples


def test_pure_eps_local_triples_released_as_all_triples_certify():
    # d = 27, 73 local triples measured under pure eps = 1, all 2,925 triples released: L-BFGS-B
    # alone ended ABNORMAL_TERMINATION_IN_LNSRCH at a relative gap of 4e-6 (tolerance 1e-6).
    data, ms, triples = _laplace_triples(27, 73, 73.0, 0)
    est = estimate_marginals(ms, triples)
    cert = est.info["certificate"]
    assert est.status is Status.OPTIMAL, est.message
    assert cert["gap"] <= 1e-9 and cert["violation"] == 0.0
    # the figures are those of the released point: primal minus dual over the objective's scale
    assert abs((cert["primal"] - cert["dual"]) / (1 + abs(cert["primal"]) + abs(cert["dual"])) - cert["gap"]) < 1e-12
    mu = est.family.expand(est.residuals)
    assert mu.min() >= 0.0
    # consistency: every released triple sums to the same total
    totals = np.array([np.sum(m) for m in est.marginals(triples[:50]).values()])
    assert np.allclose(totals, est.total, rtol=1e-12, atol=1e-9)


def _random_problem(seed: int):
    """A small local-polytope problem with many negative cells (few records, much noise)."""
    data, ms, _ = _laplace_triples(8, 12, 40.0, seed)
    est = estimate_marginals(ms, exact_cells=0)
    assert est.success
    from dpopt.estimate.marginal_space.gls import fit_residuals

    index, family = est.index, est.family
    sets = [tuple(sorted(data.domain.axes(m.query.attrs))) for m in ms]
    fit = fit_residuals(index, sets, [m.values for m in ms], np.array([m.variance for m in ms]),
                        [m.label for m in ms])
    weight = np.where(fit.weight > 0, fit.weight, 1.0)
    return ProjectionProblem(index, family, fit.target, weight, fit.fixed), est


def test_polish_reaches_the_kkt_point_from_a_rough_dual():
    problem, _ = _random_problem(3)
    fam = problem.cliques
    b = fam.expand(problem.target)
    rough = np.maximum(-b, 0.0) / problem.lipschitz  # the dual of clipping every clique alone
    point, products = polish(problem, rough, max_iter=400, rounds=10)
    kappa = point[2]
    assert products > 0 and kappa.min() >= 0
    mu = fam.expand(problem.residuals(kappa))
    scale = np.abs(b).max()
    # KKT of (5): mu >= 0, kappa >= 0, kappa . mu = 0 (to rounding)
    assert mu.min() >= -1e-9 * scale
    assert abs(float(kappa @ mu)) <= 1e-8 * (1 + abs(dual_value(problem, kappa)))
    assert point[3] <= 1e-10 and point[4] == 0.0
    assert certify(problem, kappa)[3] == point[3]
    # weak duality against the solver's own answer: no point has a smaller objective than the dual bound
    solved = project(problem, tol=1e-8)
    assert solved.converged
    assert objective(problem, solved.r) >= dual_value(problem, kappa) - 1e-9 * abs(solved.fun)
    assert abs(solved.fun - point[5]) <= 1e-8 * (1 + abs(solved.fun))


def test_the_polish_counts_against_the_iteration_budget():
    problem, _ = _random_problem(4)
    short = project(problem, max_iter=3, check_every=1, polish_gap=1.0)
    assert short.iterations <= 3 + 1
    assert not short.converged or short.gap <= 1e-6


@pytest.mark.parametrize("sets", [
    [("a", "b", "c"), ("b", "c", "d"), ("d", "e")],   # decomposable: the dense optimum itself
    [("a", "b", "c"), ("c", "d"), ("b", "d", "e")],   # a cycle: the local relaxation
])
@pytest.mark.parametrize("threshold, path", [("NEWTON_CELLS", "projected Newton"),
                                             ("ALM_CELLS", "augmented Lagrangian")])
def test_large_problem_paths_alone_certify_the_dense_optimum(sets, threshold, path, monkeypatch):
    """The paths for large cliques (projected Newton, or the augmented Lagrangian method, from
    kappa = 0, no L-BFGS-B), forced on a small domain: certified alone, and equal to the dense
    constrained least squares where the marginals are decomposable (never worse than it on a cycle)."""
    from dpopt.estimate import reconstruct
    from dpopt.estimate.marginal_space import projection as projection_module
    from dpopt.model.constraints import ConstraintSet, NonNegativity
    from dpopt.model.domain import Domain

    monkeypatch.setattr(projection_module, threshold, 0)
    dom = Domain(("a", "b", "c", "d", "e"), (2, 3, 2, 3, 2))
    gen = np.random.default_rng(11)
    x = gen.poisson(0.4, dom.size).astype(float)  # sparse: many negative noisy cells
    ms = []
    for i, s in enumerate(sets):
        q = Marginal(dom, s)
        sd = 3.0 * (1 + i % 2)
        ms.append(Measurement(q, q.matvec(x) + gen.normal(0, sd, q.num_rows), "gaussian", sd, sd**2, label=str(s)))
    est = estimate_marginals(ms, exact_cells=0)
    assert est.status is Status.OPTIMAL, est.message
    assert est.info["stopped"] == f"certified ({path})"
    cert = est.info["certificate"]
    assert cert["gap"] <= 1e-7 and cert["violation"] <= cert["feasibility_tol"]
    dense = reconstruct(ms, ConstraintSet(dom, [NonNegativity()]), "l2")
    assert dense.success
    if est.info["polytope"] == "marginal":
        for s in sets:
            np.testing.assert_allclose(est.marginal(s), Marginal(dom, s).matvec(dense.x), atol=1e-4)
        assert est.fun == pytest.approx(dense.fun, rel=1e-6)
    else:
        assert est.fun <= dense.fun * (1 + 1e-6) + 1e-6


def test_augmented_lagrangian_line_search_is_the_exact_minimiser():
    """The inner line search bisects phi's derivative without products: its step must be the
    minimiser of phi(r + t x) over [0, 1], checked against phi evaluated on a fine grid."""
    from dpopt.estimate.marginal_space.augmented_lagrangian import _line_search

    gen = np.random.default_rng(5)
    n_res, n_cells, rho = 40, 90, 0.7
    e = gen.normal(size=(n_cells, n_res))  # a dense stand-in for E
    w = gen.uniform(0.5, 2.0, n_res)
    free = np.ones(n_res, dtype=bool)
    free[:3] = False  # fixed residuals do not enter F
    target, r, step = gen.normal(size=n_res), gen.normal(size=n_res), gen.normal(size=n_res)
    kappa = np.maximum(gen.normal(size=n_cells), 0.0)

    def phi(x):
        return 0.5 * np.sum((w * (x - target) ** 2)[free]) + np.sum(np.maximum(kappa - rho * (e @ x), 0) ** 2) / (2 * rho)

    grid = np.linspace(0.0, 1.0, 20001)
    for factor in (1.0, -1.0, 0.05):  # interior minimiser, ascent direction, minimiser at t = 1
        x = factor * step
        t = _line_search(r, x, e @ x, kappa - rho * (e @ r), rho, w, free, target,
                         lambda v, out: np.greater(v, 0, out=out))
        values = np.array([phi(r + g * x) for g in grid])
        assert 0.0 <= t <= 1.0
        assert phi(r + t * x) <= values.min() + 1e-9 * (1 + abs(values.min()))
