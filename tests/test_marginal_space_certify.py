"""The projection's certificate where L-BFGS-B alone stalls (issue 27): the polish by conjugate
gradients on the active face must certify to far below the tolerance, every figure checked
independently of the solver (feasibility, consistency, and the duality gap recomputed from
the primal and dual values)."""

import functools
from itertools import combinations

import numpy as np
import pytest

from dpopt.datasets.bayes_net import random_sparse_network
from dpopt.estimate.marginal_space import estimate_marginals as _estimate_marginals
from dpopt.estimate.marginal_space.polytope.projection import ProjectionProblem, certify, dual_value, objective, polish, project
from dpopt.estimate.status import Status
from dpopt.model.measurement import Measurement
from dpopt.model.queries import Marginal

# These tests are of the least-squares estimate: objective 'l2' unless a test names another.
estimate_marginals = functools.partial(_estimate_marginals, objective="l2")


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
    assert solved.converged and solved.methods in ((), ("L-BFGS-B and the CG polish",))
    assert objective(problem, solved.r) >= dual_value(problem, kappa) - 1e-9 * abs(solved.fun)
    assert abs(solved.fun - point[5]) <= 1e-8 * (1 + abs(solved.fun))


def test_the_polish_counts_against_the_iteration_budget():
    problem, _ = _random_problem(4)
    short = project(problem, max_iter=3, check_every=1, polish_gap=1.0)
    assert short.iterations <= 3 + 1
    assert not short.converged or short.gap <= 1e-6


def test_gap_parts_add_up_to_the_certified_gap():
    """The certificate's absolute gap splits into complementarity at r(kappa) and the repair's
    cost; each part is recomputed here from its definition, and the repair step checked by hand."""
    from dpopt.estimate.marginal_space.polytope.interior import interior_residuals
    from dpopt.estimate.marginal_space.polytope.projection import certify_at, gap_parts

    from dpopt.estimate.marginal_space.gls import fit_residuals

    dom, ms = _small_measurements([("a", "b", "c"), ("b", "c", "d"), ("d", "e")])
    est = estimate_marginals(ms, exact_cells=0)
    sets = [tuple(sorted(dom.axes(m.query.attrs))) for m in ms]
    fit = fit_residuals(est.index, sets, [m.values for m in ms], np.array([m.variance for m in ms]),
                        [m.label for m in ms])
    problem = ProjectionProblem(est.index, est.family, fit.target, np.where(fit.weight > 0, fit.weight, 1.0),
                                fit.fixed)
    fam = problem.cliques
    assert problem.total_free
    r_int = interior_residuals(problem.index, [], [], None)  # uniform, total 1 (the total is free)
    problem.interior = (r_int, fam.expand(r_int))
    kappa = 0.3 * np.maximum(-fam.expand(problem.target), 0.0) / problem.lipschitz  # too small: cells stay negative
    r = problem.residuals(kappa)
    mu = fam.expand(r)
    parts = gap_parts(problem, kappa, r, mu)
    point = certify_at(problem, kappa, r, mu)
    assert parts["negative"] == np.count_nonzero(mu < 0) > 0 and parts["worst"] == -mu.min()
    assert parts["active"] == np.count_nonzero(kappa > 0)
    # the parts: F(r(kappa)) and g(kappa) from their own formulas, and their sum the certificate's gap
    assert parts["objective"] == pytest.approx(objective(problem, r), rel=1e-12)
    assert parts["dual"] == pytest.approx(dual_value(problem, kappa), rel=1e-9)
    assert parts["complementarity"] == pytest.approx(parts["objective"] - dual_value(problem, kappa), rel=1e-9)
    assert parts["complementarity"] + parts["repair_cost"] == pytest.approx(point[5] - point[6], rel=1e-12)
    assert parts["gap"] == pytest.approx(point[3], rel=1e-12)
    # the repair by hand: the smallest mixing with the interior point (at the current total) that
    # leaves no cell negative, and its cost the change of (4)
    total = r[problem.index.set_offsets[problem.index.position_of(())]]
    t = parts["repair_step"]
    assert 0 < t < 1
    assert ((1 - t) * mu + t * total * problem.interior[1]).min() >= 0.0
    assert ((1 - 0.999 * t) * mu + 0.999 * t * total * problem.interior[1]).min() < 0.0
    repaired = (1 - t) * r + t * total * r_int
    assert parts["repair_cost"] == pytest.approx(objective(problem, repaired) - objective(problem, r), rel=1e-9)
    # structural zeros are held by equalities: their cells leave the sign counts and are reported
    # by their own departure from 0
    zeros = np.zeros(fam.size, dtype=bool)
    zeros[np.flatnonzero(mu < 0)[:3]] = True
    zeros[np.flatnonzero(mu > 0)[:2]] = True
    problem.zero_cells = zeros
    held = gap_parts(problem, kappa, r, mu)
    assert held["negative"] == parts["negative"] - 3 == np.count_nonzero(mu[~zeros] < 0)
    assert held["worst"] == max(0.0, -mu[~zeros].min())
    assert held["active"] == np.count_nonzero(kappa[~zeros] > 0)
    assert held["zero_violation"] == np.abs(mu[zeros]).max() > 0 and parts["zero_violation"] == 0.0


@pytest.mark.parametrize("sets", [
    [("a", "b", "c"), ("b", "c", "d"), ("d", "e")],   # decomposable: the dense optimum itself
    [("a", "b", "c"), ("c", "d"), ("b", "d", "e")],   # a cycle: the local relaxation
])
@pytest.mark.parametrize("threshold, path", [("NEWTON_CELLS", "projected Newton"),
                                             ("ALM_CELLS", "augmented Lagrangian"),
                                             ("ADMM_CELLS", "ADMM")])
def test_large_problem_paths_alone_certify_the_dense_optimum(sets, threshold, path, monkeypatch):
    """The paths for large cliques (projected Newton, the augmented Lagrangian method or ADMM, from
    kappa = 0, no L-BFGS-B), forced on a small domain: certified alone, and equal to the dense
    constrained least squares where the marginals are decomposable (never worse than it on a cycle)."""
    from dpopt.estimate import reconstruct
    from dpopt.estimate.marginal_space.polytope import projection as projection_module
    from dpopt.model.constraints import ConstraintSet, NonNegativity

    monkeypatch.setattr(projection_module, threshold, 0)
    dom, ms = _small_measurements(sets, sizes=(2, 3, 2, 3, 2))
    est = estimate_marginals(ms, exact_cells=0)
    assert est.status is Status.OPTIMAL, est.message
    assert est.info["stopped"] == f"certified ({path})"
    assert path in est.message and path in est.solver and "L-BFGS-B" not in est.message  # the method that ran
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


@pytest.mark.parametrize("sets", [
    [("a", "b", "c"), ("b", "c", "d"), ("d", "e")],   # decomposable: the dense optimum itself
    [("a", "b", "c"), ("c", "d"), ("b", "d", "e")],   # a cycle: the local relaxation
])
def test_face_finish_alone_certifies_the_optimum_from_a_rough_dual(sets, monkeypatch):
    """From the multipliers of augmented Lagrangian steps that have found the face but are not
    certified (gap above 1e-6), the face finish by itself reaches a gap 100 times smaller and
    within the solver's aim (1e-7); equation (7) holds for its point by independent
    recomputation, and the point is the dense constrained least squares where the marginals are
    decomposable (the face's own optimum: never worse than the estimate on a cycle)."""
    from dpopt.estimate import reconstruct
    from dpopt.estimate.marginal_space.polytope import augmented_lagrangian as alm_module
    from dpopt.estimate.marginal_space.polytope import projection as projection_module
    from dpopt.estimate.marginal_space.polytope.face_finish import face_finish
    from dpopt.model.constraints import ConstraintSet, NonNegativity

    dom, ms = _small_measurements(sets, sizes=(2, 3, 2, 3, 2))
    captured = []
    real_project = projection_module.project
    monkeypatch.setattr("dpopt.estimate.marginal_space.estimator.project",
                        lambda problem, **kw: captured.append(problem) or real_project(problem, **kw))
    est = estimate_marginals(ms, exact_cells=0)
    problem = captured[0]
    fam = problem.cliques
    starts = []
    monkeypatch.setattr(alm_module, "FINISH_GAP", -1.0)  # the solver alone, for a rough start
    alm_module.augmented_lagrangian(problem, np.zeros(fam.size), projection_module.certify_at,
                                    projection_module._better, max_products=200,
                                    log=lambda outer, products, rho_l, point, mu: starts.append(point))
    start = next(p for p in starts if p[3] <= 1e-4)
    kappa = start[2]
    r = problem.residuals(kappa)
    mu = fam.expand(r)
    assert start[3] > 1e-6 and mu.min() < 0  # not certified, cells negative
    point, products = face_finish(problem, kappa, r, mu, stop_gap=1e-7, feasibility=1e-9)
    assert 0 < products <= 3 * 301
    x, m, _, gap, worst, fun, dual = point
    assert gap <= min(1e-7, start[3] / 100) and worst <= 1e-9 and m.min() >= -1e-9
    assert np.allclose(m, fam.expand(x), rtol=0, atol=1e-9 * np.abs(m).max())
    # (7): F(x) - g(kappa) = <kappa, E x> + 1/2 ||x - r(kappa)||_W^2, every term recomputed
    free = problem.free_flat
    step = (x - r)[free]
    assert objective(problem, x) == pytest.approx(fun, rel=1e-12)
    assert dual == pytest.approx(dual_value(problem, kappa), rel=1e-9, abs=1e-9)
    assert fun - dual == pytest.approx(float(kappa @ m) + 0.5 * float(np.sum(problem.w_flat[free] * step * step)),
                                       rel=1e-6, abs=1e-9)
    dense = reconstruct(ms, ConstraintSet(dom, [NonNegativity()]), "l2")
    assert dense.success
    if est.info["polytope"] == "marginal":
        for i, s in enumerate(fam.sets):
            names = tuple(dom.attrs[a] for a in s)
            np.testing.assert_allclose(fam.marginal(m, i).ravel(), Marginal(dom, names).matvec(dense.x), atol=1e-6)
    assert np.allclose(m, fam.expand(est.residuals), atol=1e-6) or est.info["polytope"] != "marginal"
    assert fun <= objective(problem, est.residuals) * (1 + 1e-6) + 1e-6


def test_augmented_lagrangian_line_search_is_the_exact_minimiser():
    """The inner line search bisects phi's derivative without products: its step must be the
    minimiser of phi(r + t x) over [0, 1], checked against phi evaluated on a fine grid."""
    from dpopt.estimate.marginal_space.polytope.augmented_lagrangian import _line_search

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
        # the fast path for plain non-negativity: the same step, bit for bit
        assert _line_search(r, x, e @ x, kappa - rho * (e @ r), rho, w, free, target, None, plain=True) == t
        values = np.array([phi(r + g * x) for g in grid])
        assert 0.0 <= t <= 1.0
        assert phi(r + t * x) <= values.min() + 1e-9 * (1 + abs(values.min()))


# ---- the work-array versions against the allocating ones they replaced, bit for bit ---------------
def _reference_expand(fam, residuals, out=None):
    """SetFamily.expand as it was: a fresh gather and fresh transforms per group and axis."""
    from dpopt.estimate.marginal_space.layout import synthesize_axis

    out = np.empty(fam.size) if out is None else out
    for g in fam.groups:
        tensor = residuals[g.source]
        target = fam.view(out, g).reshape(len(g.axes), -1)
        if g.dense is not None:
            np.matmul(tensor, g.dense.T, out=target)
            continue
        t = tensor.reshape((len(g.axes),) + g.sizes)
        for axis in range(len(g.sizes)):
            t = synthesize_axis(t, axis + 1)
        target[...] = t.reshape(len(g.axes), -1)
    return out


def _reference_adjoint(fam, cells, weights=None, out=None):
    """SetFamily.adjoint as it was (``out`` ignored: a fresh bincount)."""
    from dpopt.estimate.marginal_space.layout import analyse_axis

    transformed = np.empty(fam.size)
    for g in fam.groups:
        v = fam.view(cells, g).reshape(len(g.axes), -1)
        if weights is not None:
            v = v * np.asarray(weights, dtype=np.float64)[g.members][:, None]
        target = fam.view(transformed, g).reshape(len(g.axes), -1)
        if g.dense is not None:
            np.matmul(v, g.dense, out=target)
        else:
            t = v.reshape((len(g.axes),) + g.sizes)
            for axis in range(len(g.sizes)):
                t = analyse_axis(t, axis + 1)
            target[...] = t.reshape(len(g.axes), -1)
    return np.bincount(fam._source, weights=transformed, minlength=fam.index.size)


def _reference_alm(problem, kappa, certify_at, better, *, max_products, deadline=None, stop_gap=0.0,
                   feasibility=0.0, log=None):
    """augmented_lagrangian as it was: every step's vectors made afresh (same constants)."""
    from dpopt.estimate.marginal_space.polytope import augmented_lagrangian as alm

    fam, target, free, w = problem.cliques, problem.target, problem.free_flat, problem.w_flat
    zeros = np.zeros(fam.size, dtype=bool) if problem.zero_cells is None else problem.zero_cells
    scale = float(problem.lipschitz)
    d = problem.index.per_set(fam.diagonal())
    count = [0.0]

    def expand(x):
        count[0] += 0.5
        return fam.expand(x)

    def adjoint(v):
        count[0] += 0.5
        return fam.adjoint(v)

    def bound(z):
        return np.where(zeros, z, np.maximum(z, 0.0)) if problem.nonnegative else np.where(zeros, z, 0.0)

    def inside(z):
        return zeros | ((z > 0) if problem.nonnegative else False)

    def direction_of(grad, precondition, active):
        x, residual = np.zeros_like(grad), -grad
        z = residual / precondition
        direction, rz = z.copy(), float(residual @ z)
        start = np.sqrt(rz)
        for _ in range(alm.CG_STEPS):
            product = np.where(free, w * direction + rho * adjoint(np.where(active, expand(direction), 0.0)), 0.0)
            curvature = float(direction @ product)
            if not curvature > 0:
                break
            alpha = rz / curvature
            x += alpha * direction
            residual -= alpha * product
            z = residual / precondition
            rz_next = float(residual @ z)
            if np.sqrt(rz_next) <= alm.CG_TOL * start:
                break
            direction = z + (rz_next / rz) * direction
            rz = rz_next
        return x

    def line_search(r, step, e_step, z):
        a = float(np.sum((w * step * (r - target))[free]))
        b = float(np.sum((w * step * step)[free]))

        def slope(t):
            shifted = z - t * rho * e_step
            return a + t * b - float(e_step @ np.where(inside(shifted), shifted, 0.0))

        if slope(1.0) <= 0.0:
            return 1.0
        lo, hi = 0.0, 1.0
        for _ in range(40):
            mid = 0.5 * (lo + hi)
            lo, hi = (lo, mid) if slope(mid) > 0.0 else (mid, hi)
        return lo if lo > 0 else 0.5 * hi

    kappa = bound(np.asarray(kappa, dtype=np.float64))
    r = problem.residuals(kappa)
    mu = fam.expand(r)
    count[0] += 1
    best = certify_at(problem, kappa, r, mu)
    rho, outer = alm.START_RHO_L / scale, 0
    while not alm._done(best, stop_gap, feasibility) and count[0] < max_products:
        first = None
        for _ in range(alm.NEWTON_STEPS):
            z = kappa - rho * mu
            active = inside(z)
            grad = np.where(free, w * (r - target) - adjoint(np.where(active, z, 0.0)), 0.0)
            precondition = np.where(free, w + rho * d, 1.0)
            size = float(np.sqrt(grad @ (grad / precondition)))
            if first is None:
                first = size
            elif size <= alm.INNER_REDUCTION * first:
                break
            if size == 0.0:
                break
            step = direction_of(grad, precondition, active)
            e_step = expand(step)
            t = line_search(r, step, e_step, z)
            r = r + t * step
            mu = mu + t * e_step
            if count[0] >= max_products:
                break
        outer += 1
        kappa = bound(kappa - rho * fam.expand(r))
        r = problem.residuals(kappa)
        mu = fam.expand(r)
        count[0] += 1.5
        point = certify_at(problem, kappa, r, mu)
        if better(point, best, feasibility):
            best = point
        if log is not None:
            log(outer, count[0], rho * scale, point, mu)
        rho = min(rho * alm.RHO_GROWTH, alm.MAX_RHO_L / scale)
    return best, int(np.ceil(count[0]))


# the three transform paths of a shape: its dense Kronecker matrix; per axis, a dense product or
# cumulative sums (forced on a small domain by the thresholds)
_TRANSFORMS = {"kronecker": {}, "axis products": {"DENSE_TRANSFORM_CELLS": 0},
               "cumulative sums": {"DENSE_TRANSFORM_CELLS": 0, "DENSE_AXIS": 1, "DENSE_AXIS_WORK": 0}}


def _small_measurements(sets, sizes=(2, 3, 2, 4, 2)):
    """Gaussian measurements of ``sets`` on sparse data over five small attributes a..e."""
    from dpopt.model.domain import Domain

    dom = Domain(("a", "b", "c", "d", "e"), sizes)
    gen = np.random.default_rng(11)
    x = gen.poisson(0.4, dom.size).astype(float)  # sparse: many negative noisy cells
    ms = []
    for i, s in enumerate(sets):
        q = Marginal(dom, s)
        sd = 3.0 * (1 + i % 2)
        ms.append(Measurement(q, q.matvec(x) + gen.normal(0, sd, q.num_rows), "gaussian", sd, sd**2, label=str(s)))
    return dom, ms


@pytest.mark.parametrize("transform", sorted(_TRANSFORMS))
def test_expand_and_adjoint_work_arrays_give_the_same_bits(transform, monkeypatch):
    from dpopt.estimate.marginal_space import layout

    for name, value in _TRANSFORMS[transform].items():
        monkeypatch.setattr(layout, name, value)
    dom = _small_measurements([])[0]
    sets = [(0, 1, 3), (1, 2, 3), (0, 3, 4), (1, 3), (3,), (0, 1, 2)]
    fam = layout.SetFamily(layout.ResidualIndex(dom, sets), sets)
    assert (transform == "kronecker") == all(g.dense is not None for g in fam.groups)
    gen = np.random.default_rng(2)
    for _ in range(3):  # again: the work arrays are reused
        x, v, weights = gen.normal(size=fam.index.size), gen.normal(size=fam.size), gen.uniform(0.5, 2, len(sets))
        assert np.array_equal(fam.expand(x), _reference_expand(fam, x))
        out = np.full(fam.size, np.nan)
        assert fam.expand(x, out=out) is out and np.array_equal(out, _reference_expand(fam, x))
        reference = _reference_adjoint(fam, v)
        assert np.array_equal(fam.adjoint(v), reference)
        out = np.full(fam.index.size, np.nan)
        assert fam.adjoint(v, out=out) is out and np.array_equal(out, reference)
        assert np.array_equal(fam.adjoint(v, weights), _reference_adjoint(fam, v, weights))
        fam.release_work()  # dropped after a solve: made again, with the same results


@pytest.mark.parametrize("transform", ["kronecker", "cumulative sums"])
@pytest.mark.parametrize("threshold", ["NEWTON_CELLS", "ALM_CELLS"])
def test_large_problem_paths_give_the_same_bits_as_the_allocating_code(threshold, transform, monkeypatch):
    """Both large-problem paths, forced on a small cyclic case: the released residuals, marginals
    and certificate are bit for bit those of the code with fresh vectors on every step, and the
    augmented Lagrangian's every certified outer point too."""
    from dpopt.estimate.marginal_space import layout
    from dpopt.estimate.marginal_space.polytope import projection as projection_module
    from dpopt.estimate.marginal_space.polytope.augmented_lagrangian import augmented_lagrangian

    from dpopt.estimate.marginal_space.polytope import augmented_lagrangian as alm_module

    monkeypatch.setattr(projection_module, threshold, 0)
    # the reference predates the face finish: the steps they share are compared without it (the
    # finish has its own tests)
    monkeypatch.setattr(alm_module, "FINISH_GAP", -1.0)
    for name, value in _TRANSFORMS[transform].items():
        monkeypatch.setattr(layout, name, value)
    sets = [("a", "b", "d"), ("d", "c"), ("b", "c", "e"), ("a", "e")]
    _, ms = _small_measurements(sets)
    new = estimate_marginals(ms, exact_cells=0)
    trace_new, trace_old = [], []

    def recorder(trace):
        return lambda outer, products, rho_l, point, mu: trace.append((products, rho_l, point, mu.copy()))

    with monkeypatch.context() as m:
        m.setattr(layout.SetFamily, "expand", _reference_expand)
        m.setattr(layout.SetFamily, "adjoint", _reference_adjoint)
        m.setattr(projection_module, "augmented_lagrangian", _reference_alm)
        old = estimate_marginals(ms, exact_cells=0)
    assert new.status is Status.OPTIMAL and old.status is Status.OPTIMAL
    assert new.info["stopped"] == old.info["stopped"]
    assert np.array_equal(new.residuals, old.residuals)
    for s in sets:
        assert np.array_equal(new.marginal(s), old.marginal(s))
    assert new.info["certificate"] == old.info["certificate"]
    if threshold == "ALM_CELLS":  # every outer step of the solver itself, on the captured problem
        captured = []
        real_project = projection_module.project

        def capture(problem, **kw):
            captured.append(problem)
            return real_project(problem, **kw)

        monkeypatch.setattr("dpopt.estimate.marginal_space.estimator.project", capture)
        estimate_marginals(ms, exact_cells=0)
        problem = captured[0]
        x = np.zeros(problem.cliques.size)
        args = (projection_module.certify_at, projection_module._better)
        kw = dict(max_products=60, stop_gap=1e-12)
        point_new, n_new = augmented_lagrangian(problem, x, *args, log=recorder(trace_new), **kw)
        with monkeypatch.context() as m:
            m.setattr(layout.SetFamily, "expand", _reference_expand)
            m.setattr(layout.SetFamily, "adjoint", _reference_adjoint)
            point_old, n_old = _reference_alm(problem, x, *args, log=recorder(trace_old), **kw)
        assert n_new == n_old and len(trace_new) == len(trace_old) >= 2
        trace_new.append((n_new, 0, point_new, point_new[1]))
        trace_old.append((n_old, 0, point_old, point_old[1]))
        for a, b in zip(trace_new, trace_old):
            assert a[:2] == b[:2] and np.array_equal(a[3], b[3])
            assert all(np.array_equal(p, q) for p, q in zip(a[2][:3], b[2][:3])) and a[2][3:] == b[2][3:]


@pytest.mark.parametrize("pattern", [(0, 1, "== 0", "== 0"),   # one clique holds the pair
                                     (2, 3, "== 1", "== 0")])  # two cliques hold it (a separator's cells)
@pytest.mark.parametrize("nonnegative", [True, False])
def test_structural_zeros_certify_the_dense_optimum(pattern, nonnegative):
    """Structural zeros are equalities: the repair must not try to lift a zero cell whose
    marginal is -3e-14 by rounding (it did, towards an interior point that is 4e-17 there, a
    step of 0.25 that left the relative gap at 6.7e-2 and the estimate NUMERICAL_ERROR). A chain
    of triples is decomposable, so the certified fit equals the dense constrained least squares
    with the same zeros (the table route and :func:`dpopt.estimate.reconstruct`)."""
    from dpopt.estimate import reconstruct
    from dpopt.model.constraints import ConstraintSet, NonNegativity, StructuralZeros

    data = random_sparse_network(12, seed=3).sample(3000, 4)
    dom, names = data.domain, data.domain.attrs
    sets = [tuple(names[i:i + 3]) for i in range(10)]
    gen = np.random.default_rng(1)  # test noise, not privacy noise
    ms = []
    for t in sets:
        q = Marginal(dom, list(t))
        y = np.asarray(data.marginal(list(t)), float) + gen.normal(0.0, 6.0, q.num_rows)
        ms.append(Measurement(q, y, "gaussian", 6.0, 36.0, label=", ".join(t)))
    i, j, vi, vj = pattern
    zeros = StructuralZeros(f"{names[i]} {vi} and {names[j]} {vj}")
    cs = ConstraintSet(dom, ([NonNegativity()] if nonnegative else []) + [zeros])
    est = estimate_marginals(ms, exact_cells=0, constraints=cs, nonnegative=nonnegative)
    assert est.status is Status.OPTIMAL, est.message
    assert est.info["polytope"] == "marginal"
    cert = est.info["certificate"]
    assert cert["ok"] and cert["gap"] <= cert["tol"] and cert["violation"] <= cert["feasibility_tol"]
    table = estimate_marginals(ms, exact_cells=10**6, constraints=cs, nonnegative=nonnegative)
    assert table.status is Status.OPTIMAL and table.info["polytope"] == "table"
    dense = reconstruct(ms, cs, "l2")
    assert dense.success
    assert est.fun == pytest.approx(table.fun, rel=cert["tol"])
    assert est.fun == pytest.approx(dense.fun, rel=cert["tol"])
    for s in sets:
        np.testing.assert_allclose(est.marginal(s), Marginal(dom, s).matvec(dense.x), atol=1e-4)
    pair = est.marginal((names[i], names[j])).reshape(2, 2)
    assert abs(pair[int(vi[-1]), int(vj[-1])]) <= cert["feasibility_tol"]


def _captured_problem(sets, monkeypatch):
    from dpopt.estimate.marginal_space.polytope import projection as projection_module

    dom, ms = _small_measurements(sets, sizes=(2, 3, 2, 3, 2))
    captured = []
    real_project = projection_module.project
    monkeypatch.setattr("dpopt.estimate.marginal_space.estimator.project",
                        lambda problem, **kw: captured.append(problem) or real_project(problem, **kw))
    estimate_marginals(ms, exact_cells=0)
    return dom, ms, captured[0]


@pytest.mark.parametrize("sets", [
    [("a", "b", "c"), ("b", "c", "d"), ("d", "e")],
    [("a", "b", "c"), ("c", "d"), ("b", "d", "e")],
])
def test_projected_newton_rounds_stop_only_when_the_negative_mass_stalls(sets, monkeypatch):
    """``stall``: where the rounds converge (the negative mass halves face after face) the rule
    changes nothing, bit for bit; where each face takes one CG step (forcing 0.9) the mass falls
    by less than half a face and the rule ends the pass after ``stall`` such faces, with a point
    certified like any other."""
    from dpopt.estimate.marginal_space.polytope.projection import NEWTON_FORCING, NEWTON_STALL

    _, _, problem = _captured_problem(sets, monkeypatch)
    start = np.zeros(problem.cliques.size)
    assert problem.cliques.expand(problem.target).min() < -1.0  # the unconstrained fit has negative cells
    plain, plain_products = polish(problem, start, max_iter=5000, rounds=60, forcing=NEWTON_FORCING, stop_gap=1e-9)
    ruled, ruled_products = polish(problem, start, max_iter=5000, rounds=60, forcing=NEWTON_FORCING, stop_gap=1e-9,
                                   stall=NEWTON_STALL)
    assert plain[3] <= 1e-9 and ruled_products == plain_products
    assert np.array_equal(ruled[2], plain[2])

    def faces(rounds):  # each face of the unruled pass, one at a time: its starting negative mass, its products
        out, kappa = [], start
        for _ in range(rounds):
            point, products = polish(problem, kappa, max_iter=5000, rounds=1, forcing=0.9)
            mu = problem.cliques.expand(problem.residuals(kappa))
            out.append((-float(np.minimum(mu, 0.0).sum()), products))
            kappa = point[2]
        return out

    _, slow_products = polish(problem, start, max_iter=5000, rounds=40, forcing=0.9, stop_gap=1e-9)
    stalled, stalled_products = polish(problem, start, max_iter=5000, rounds=40, forcing=0.9, stop_gap=1e-9, stall=3)
    assert stalled_products < slow_products
    # the pass ended at the first face that was the 3rd in a row not to halve the least mass so far
    seen = faces(40)
    least, since, ended = np.inf, 0, None
    for face, (mass, _) in enumerate(seen):
        if mass <= 0.5 * least:
            least, since = mass, 0
        else:
            since += 1
            if since >= 3:
                ended = face
                break
    assert ended is not None and ended < 40
    assert stalled_products == sum(products for _, products in seen[:ended]) + 1  # and the last face's start
    point = certify(problem, stalled[2])
    assert point[3] == stalled[3] and point[4] == stalled[4]


def test_ratio_step_is_the_longest_feasible_step(monkeypatch):
    """From a feasible point towards the unconstrained fit (cells negative), the step stops at the
    first cell that reaches zero: feasible, one cell at zero, and no longer feasible step exists
    (brute force over a grid of t)."""
    from dpopt.estimate.marginal_space.polytope.face_finish import ratio_step

    _, _, problem = _captured_problem([("a", "b", "c"), ("c", "d"), ("b", "d", "e")], monkeypatch)
    fam = problem.cliques
    x = problem.target.copy()  # the unconstrained fit r(0)
    m = fam.expand(x)
    assert m.min() < 0
    y = certify(problem, np.zeros(fam.size))[0]  # repaired towards the interior point: feasible
    my = fam.expand(y)
    assert my.min() >= 0
    z, mz = ratio_step(problem, y, my, x, m)
    np.testing.assert_allclose(mz, fam.expand(z), atol=1e-9 * np.abs(m).max())
    scale = np.abs(m).max()
    assert mz.min() >= -1e-12 * scale and abs(mz.min()) <= 1e-12 * scale  # feasible, a cell at zero
    steps = np.linspace(0.0, 1.0, 20001)
    feasible = [t for t in steps if (my + t * (m - my)).min() >= 0]
    t = float(np.linalg.norm(z - y) / np.linalg.norm(x - y))
    assert max(feasible) <= t + 1e-12 and t < max(feasible) + 1e-4
    assert ratio_step(problem, y, my, y, my)[0] is y  # a feasible target is reached whole


@pytest.mark.parametrize("sets", [
    [("a", "b", "c"), ("b", "c", "d"), ("d", "e")],
    [("a", "b", "c"), ("c", "d"), ("b", "d", "e")],
])
def test_alm_pairs_later_multipliers_with_the_best_primal_point(sets, monkeypatch):
    """Every outer step's multipliers are certified against the feasible point of least F found so
    far when that is better (weak duality: any feasible point with any multipliers). The path's
    points must include one certified better than by its own repaired point, every figure
    recomputed independently (F of the point, g of the multipliers), and the path must end at the
    dense optimum where the marginals are decomposable."""
    from dpopt.estimate import reconstruct
    from dpopt.estimate.marginal_space.polytope import augmented_lagrangian as alm_module
    from dpopt.estimate.marginal_space.polytope import projection as projection_module
    from dpopt.model.constraints import ConstraintSet, NonNegativity

    dom, ms, problem = _captured_problem(sets, monkeypatch)
    fam = problem.cliques
    monkeypatch.setattr(alm_module, "FINISH_GAP", 1.0)  # a finish from the first outer step on
    logged = []
    point, _ = alm_module.augmented_lagrangian(problem, np.zeros(fam.size), projection_module.certify_at,
                                               projection_module._better, max_products=3000, stop_gap=1e-9,
                                               feasibility=1e-9, log=lambda *a: logged.append(a))
    paired = 0
    outer = {}  # each outer step's own point (a finish's point is logged after it, under the same step)
    for a in logged:
        outer.setdefault(a[0], a[3])
    for p in outer.values():
        x, m, kappa, gap, worst, fun, dual = p
        assert worst <= 1e-9 and m.min() >= -1e-9
        assert fun == pytest.approx(objective(problem, x), rel=1e-12)
        assert dual == pytest.approx(dual_value(problem, kappa), rel=1e-9, abs=1e-9)
        own = certify(problem, kappa)
        paired += own[3] > 10 * gap
    assert paired > 0
    x, m, kappa, gap, worst, fun, dual = point
    assert gap <= 1e-9 and worst <= 1e-9
    assert fun - dual <= 1e-9 * (1 + abs(fun) + abs(dual))
    assert (fun - dual_value(problem, kappa)) / (1 + abs(fun) + abs(dual)) <= 1e-9 * (1 + 1e-6)
    dense = reconstruct(ms, ConstraintSet(dom, [NonNegativity()]), "l2")
    assert dense.success
    if len(sets) == 3 and sets[2] == ("d", "e"):
        for i, s in enumerate(fam.sets):
            names = tuple(dom.attrs[a] for a in s)
            np.testing.assert_allclose(fam.marginal(m, i).ravel(), Marginal(dom, names).matvec(dense.x), atol=1e-5)


def _check_records(dom, problem, x, m, price=None, candidates=8):
    """Equation (8) checked on the full table: the lift is the clique marginals of a table holding
    the weighted records, and the repaired point is feasible, consistent (its marginals are
    ``E x'``) and keeps a held total."""
    from dpopt.estimate.marginal_space.polytope.records import lifting_records, record_repair

    fam, index = problem.cliques, problem.index
    records, mass, lift = lifting_records(problem, m, price, candidates)
    assert np.all(mass > 0) and records.shape == (mass.size, len(dom.attrs))
    table = np.zeros(dom.shape)
    np.add.at(table, tuple(records.T), mass)
    for i, axes in enumerate(fam.sets):
        names = tuple(dom.attrs[a] for a in axes)
        np.testing.assert_allclose(fam.marginal(lift, i), Marginal(dom, names).matvec(table.ravel()),
                                   rtol=0, atol=1e-12 * mass.sum())
    x2, m2 = record_repair(problem, x, m, price, candidates)
    scale = np.abs(m).max()
    assert m2.min() >= -1e-12 * scale
    np.testing.assert_allclose(fam.expand(x2), m2, rtol=0, atol=1e-11 * scale)
    total_at = index.set_offsets[index.position_of(())]
    assert problem.total_free or x2[total_at] == pytest.approx(x[total_at], rel=1e-12)


@pytest.mark.parametrize("sets", [
    [("a", "b", "c"), ("b", "c", "d"), ("d", "e")],   # decomposable
    [("a", "b", "c"), ("c", "d"), ("b", "d", "e")],   # a cycle
])
def test_records_lift_every_negative_cell_consistently(sets, monkeypatch):
    """Equation (8) of polytope.records, checked on the full table: the lift is the clique
    marginals of a table holding the weighted records, the repaired point is feasible, consistent
    (its marginals are E x'), keeps a held total, and pairs with the multipliers into a certificate
    at least as good as the mix towards the interior point wherever it is used."""
    from dpopt.estimate.marginal_space.polytope.projection import certify_with, repair
    from dpopt.estimate.marginal_space.polytope.records import record_repair

    dom, ms, problem = _captured_problem(sets, monkeypatch)
    fam = problem.cliques
    x = problem.target.copy()  # the unconstrained fit: many negative cells
    m = fam.expand(x)
    assert (m < -1e-9).sum() > 5
    _check_records(dom, problem, x, m)
    # a certificate: the records' point against the multipliers of a few ADMM steps, and the mix's
    from dpopt.estimate.marginal_space.polytope.admm import admm

    point, _ = admm(problem, max_products=60, check_every=50, stop_gap=0.0)
    kappa = point[2]
    r = problem.residuals(kappa)
    mu = fam.expand(r)
    lifted = certify_with(problem, kappa, r, mu, *record_repair(problem, r, mu))
    mixed = certify_with(problem, kappa, r, mu, *repair(problem, r, mu))
    assert lifted[4] <= 1e-9 and lifted[3] <= mixed[3] + 1e-12


def test_anderson_solves_a_linear_fixed_point_in_dimension_plus_one_steps():
    """On an affine map ``s -> A s + b`` type-II Anderson acceleration with memory ``n`` is GMRES
    (Walker and Ni 2011, §2): the residual vanishes within ``n + 1`` steps, where the plain
    iteration (contraction 0.99) has barely moved, and the point is the solution of ``(I - A) s = b``."""
    from dpopt.estimate.marginal_space.polytope.anderson import Anderson

    n = 8
    gen = np.random.default_rng(4)
    q, _ = np.linalg.qr(gen.normal(size=(n, n)))
    a = q @ np.diag(np.linspace(0.0, 0.99, n)) @ q.T
    b = gen.normal(size=n)
    exact = np.linalg.solve(np.eye(n) - a, b)
    accelerator = Anderson(n, n, regularization=0.0)
    s, plain = np.zeros(n), np.zeros(n)
    first = np.linalg.norm(b)
    following = np.empty(n)
    for _ in range(n + 1):
        accelerator.step(s, a @ s + b - s, out=following)
        s = following.copy()
        plain = a @ plain + b
    assert np.linalg.norm(a @ s + b - s) <= 1e-8 * first
    np.testing.assert_allclose(s, exact, rtol=0, atol=1e-7 * np.abs(exact).max())
    assert np.linalg.norm(a @ plain + b - plain) >= 1e-2 * first


@pytest.mark.parametrize("threads", [2, 3])
def test_anderson_in_pieces_takes_the_steps_of_one_piece(threads):
    """The step (11) made in pieces at once (their dot products summed) gives the iterates of the
    whole vectors, to rounding, on a contracting affine map over a run long enough to fill and
    cycle the history."""
    from dpopt.estimate.marginal_space.polytope.anderson import Anderson

    n, memory = 50, 5
    gen = np.random.default_rng(6)
    q, _ = np.linalg.qr(gen.normal(size=(n, n)))
    a = q @ np.diag(np.linspace(0.0, 0.95, n)) @ q.T
    b = gen.normal(size=n)
    runs = []
    for pieces in (1, threads):
        accelerator = Anderson(n, memory, threads=pieces)
        assert len(accelerator.pieces) == pieces
        s, following, iterates = np.zeros(n), np.empty(n), []
        for _ in range(12):
            accelerator.step(s, a @ s + b - s, out=following)
            s = following.copy()
            iterates.append(s)
        runs.append(np.array(iterates))
    np.testing.assert_allclose(runs[1], runs[0], rtol=0, atol=1e-10 * np.abs(runs[0]).max())


@pytest.mark.parametrize("sets", [
    [("a", "b", "c"), ("b", "c", "d"), ("d", "e")],   # decomposable
    [("a", "b", "c"), ("c", "d"), ("b", "d", "e")],   # a cycle
])
def test_admm_with_and_without_acceleration_certify_the_same_optimum(sets, monkeypatch):
    """ADMM plain (memory 0) and Anderson-accelerated (the default memory) both certify a gap of
    1e-9 at the same objective; the accelerated run needs fewer products (checked every 5 steps:
    every 10, both certify the decomposable family at the same check). And an accelerator that
    returns nonsense is caught by the safeguard: every bad point is rejected for the plain step,
    and the run still certifies (at most about twice the plain run's products)."""
    from dpopt.estimate.marginal_space.polytope import admm as admm_module
    from dpopt.estimate.marginal_space.polytope.anderson import Anderson

    _, _, problem = _captured_problem(sets, monkeypatch)
    runs = {}
    for memory in (0, None):
        point, products = admm_module.admm(problem, max_products=5000, check_every=5, stop_gap=1e-9,
                                           feasibility=1e-9, memory=memory)
        assert point[3] <= 1e-9 and point[4] <= 1e-9
        assert point[5] == pytest.approx(objective(problem, point[0]), rel=1e-12)
        runs[memory] = (point, products)
    assert runs[None][1] < runs[0][1]
    assert runs[None][0][5] == pytest.approx(runs[0][0][5], rel=1e-8)

    real_step = Anderson.step

    def nonsense(self, s, f, out):
        real_step(self, s, f, out)  # the history is kept as usual
        out += 1e3 * np.abs(f).max(initial=1.0)
        return True

    monkeypatch.setattr(Anderson, "step", nonsense)
    point, products = admm_module.admm(problem, max_products=5000, check_every=10, stop_gap=1e-9,
                                       feasibility=1e-9)
    assert point[3] <= 1e-9 and point[4] <= 1e-9
    assert point[5] == pytest.approx(runs[0][0][5], rel=1e-8)
    assert products <= 2 * runs[0][1] + 20


@pytest.mark.parametrize("threads", ["2", "3"])
def test_admm_on_threads_certifies_the_optimum_of_one_thread(threads, monkeypatch):
    """ADMM with its passes over the vectors, the maps and the history's update in pieces on
    threads (DPOPT_THREADS; the size threshold lowered to this small cyclic family) certifies the
    optimum that one thread certifies, within the gaps both certify."""
    from dpopt import workers
    from dpopt.estimate.marginal_space import layout
    from dpopt.estimate.marginal_space.polytope import admm as admm_module

    _, _, problem = _captured_problem([("a", "b", "c"), ("c", "d"), ("b", "d", "e")], monkeypatch)
    runs = {}
    for count in ("1", threads):
        monkeypatch.setenv(workers.THREADS_VARIABLE, count)
        monkeypatch.setattr(admm_module, "THREAD_CELLS", 0)
        monkeypatch.setattr(layout, "THREAD_CELLS", 0)
        point, products = admm_module.admm(problem, max_products=5000, check_every=5, stop_gap=1e-9,
                                           feasibility=1e-9)
        assert point[3] <= 1e-9 and point[4] <= 1e-9
        runs[count] = point, products
    assert len(problem.cliques._plan()) == int(threads)
    assert runs[threads][0][5] == pytest.approx(runs["1"][0][5], rel=1e-8)
    assert abs(runs[threads][1] - runs["1"][1]) <= 10  # the same run, but for the sums' rounding


def test_check_spacing_aims_at_the_step_the_gap_rate_predicts():
    """admm.check_spacing by hand: gaps 1e-3 then 5e-4 a hundred steps apart halve per 100 steps,
    so 1e-6 is log2(500) = 896.6 steps away: capped at CHECK_SPACING x 100; 8e-7 of a goal 5e-7 is
    67.8 steps away: raised to 100. Fewer than two checks, no goal, a gap that did not fall, an
    infeasible check: every 100."""
    from dpopt.estimate.marginal_space.polytope.admm import CHECK_SPACING, check_spacing

    halving = [(100, 1e-3), (200, 5e-4)]
    assert check_spacing(halving, 1e-6, 100) == CHECK_SPACING * 100
    assert check_spacing(halving, 1e-6, 1000) == 1000
    assert check_spacing(halving, 1.25e-4, 100) == 200  # two halvings: exactly the prediction
    assert check_spacing([(0, 3.2e-6), (100, 1.6e-6), (200, 8e-7)], 5e-7, 100) == 100
    assert check_spacing(halving[:1], 1e-6, 100) == 100
    assert check_spacing(halving, 0.0, 100) == 100
    assert check_spacing([(100, 5e-4), (200, 5e-4)], 1e-6, 100) == 100
    assert check_spacing([(100, np.inf), (200, 5e-4)], 1e-6, 100) == 100


def test_admm_spaces_its_checks_by_the_gap_and_certifies_the_same_optimum(monkeypatch):
    """With a goal, ADMM's checks after the second are spaced by check_spacing (between every and
    CHECK_SPACING x every steps apart), and the run certifies the same optimum as checking every
    ``every`` steps (CHECK_SPACING 1), within the gaps both certify, in no more products."""
    from dpopt.estimate.marginal_space.polytope import admm as admm_module

    _, _, problem = _captured_problem([("a", "b", "c"), ("c", "d"), ("b", "d", "e")], monkeypatch)
    runs = {}
    for spacing in (1, admm_module.CHECK_SPACING):
        monkeypatch.setattr(admm_module, "CHECK_SPACING", spacing)
        steps = []
        point, products = admm_module.admm(problem, max_products=5000, check_every=5, stop_gap=1e-12,
                                           feasibility=1e-9, memory=0,
                                           log=lambda step, *_, seen=steps: seen.append(step))
        assert point[3] <= 1e-12 and point[4] <= 1e-9
        runs[spacing] = (point, products, np.diff(steps))
    fixed, spaced = runs[1], runs[admm_module.CHECK_SPACING]
    assert np.all(fixed[2] == 5)
    assert np.all((spaced[2] >= 5) & (spaced[2] <= 5 * admm_module.CHECK_SPACING)) and spaced[2].max() > 5
    assert len(spaced[2]) < len(fixed[2]) and spaced[1] <= fixed[1] + 5 * admm_module.CHECK_SPACING
    assert spaced[0][5] == pytest.approx(fixed[0][5], rel=1e-11)


def _priced_cycle(monkeypatch, seed: int):
    """A cyclic family's problem with a random price (zero on half the cells) and its price plan
    (2 candidates): ``(domain, problem, generator, price, marginals, shapes, plan)``."""
    from dpopt.estimate.marginal_space.polytope import records as records_module

    dom, _, problem = _captured_problem([("a", "b", "c"), ("c", "d"), ("b", "d", "e")], monkeypatch)
    fam, sizes = problem.cliques, problem.index.sizes
    gen = np.random.default_rng(seed)
    price = gen.uniform(0, 1, fam.size) * (gen.uniform(size=fam.size) < 0.5)
    m = fam.expand(problem.target)
    shapes = [tuple(int(sizes[a]) for a in axes) for axes in fam.sets]
    plan = records_module._price_plan(fam, records_module._one_way(fam, m, sizes), shapes, price, None, 2)
    return dom, problem, gen, price, m, shapes, plan


def test_priced_records_move_only_to_cheaper_cells_and_stay_consistent(monkeypatch):
    """Records steered by a price (polytope.records, one sweep of iterated conditional modes):
    checked by brute force on a cyclic family with a random price (zero on half the cells). Each
    record's summed price never rises, the clique attributes stay, its cells are its values'
    cells, no candidate value of the last attribute swept is cheaper; and the lift is the
    marginals of the records' full table, the repaired point feasible, consistent and with its
    total, exactly as with the modes."""
    from dpopt.estimate.marginal_space.polytope import records as records_module

    dom, problem, gen, price, m, shapes, plan = _priced_cycle(monkeypatch, 5)
    fam, sizes = problem.cliques, problem.index.sizes
    fixed = fam.sets[0]
    records = gen.integers(0, sizes, size=(200, len(sizes)))

    def cells_of(recs):
        return [fam.offsets[j] + np.ravel_multi_index(tuple(recs[:, a] for a in axes), shapes[j])
                for j, axes in enumerate(fam.sets)]

    def cost_of(recs):
        return sum(price[c] for c in cells_of(recs))

    before = records.copy()
    cells = cells_of(records)
    records_module._cheaper_completions(records, cells, fixed, plan)
    assert np.all(cost_of(records) <= cost_of(before) + 1e-12)
    assert cost_of(records).sum() < cost_of(before).sum()
    assert np.array_equal(records[:, list(fixed)], before[:, list(fixed)])
    for c, expected in zip(cells, cells_of(records)):
        assert np.array_equal(c, expected)
    last = max(a for a in plan["holding"] if a not in fixed)
    for v in plan["values"][last]:
        trial = records.copy()
        trial[:, last] = v
        assert np.all(cost_of(records) <= cost_of(trial) + 1e-12)
    _check_records(dom, problem, problem.target.copy(), m, price, 2)


@pytest.mark.parametrize("threads", ["2", "3"])
def test_priced_completions_on_threads_are_those_of_one_call(threads, monkeypatch):
    """The priced completions of records split into pieces on threads (the record threshold
    lowered to these 200) move every record exactly as one call does: each record's sweep is its
    own, so records and cells are equal, not merely close."""
    from dpopt import workers
    from dpopt.estimate.marginal_space.polytope import records as records_module

    _, problem, gen, price, m, shapes, plan = _priced_cycle(monkeypatch, 7)
    fam, sizes = problem.cliques, problem.index.sizes
    records = gen.integers(0, sizes, size=(200, len(sizes)))
    cells = [fam.offsets[j] + np.ravel_multi_index(tuple(records[:, a] for a in axes), shapes[j])
             for j, axes in enumerate(fam.sets)]
    before = records.copy()
    one = records.copy(), [c.copy() for c in cells]
    records_module._cheaper_completions(one[0], one[1], fam.sets[0], plan)
    assert not np.array_equal(one[0], before)  # the sweep moved records: the comparison means something
    monkeypatch.setenv(workers.THREADS_VARIABLE, threads)
    monkeypatch.setattr(records_module, "THREAD_RECORDS", 1)
    records_module._cheaper_completions_in_pieces(records, cells, fam.sets[0], plan)
    assert np.array_equal(records, one[0])
    assert all(np.array_equal(c, expected) for c, expected in zip(cells, one[1]))


@pytest.mark.parametrize("priced", [False, True])
def test_records_made_in_batches_are_the_records_made_at_once(priced, monkeypatch):
    """polytope.records makes a clique's records in batches of ``BATCH_CELLS`` cell indices (their
    cell in every clique): batches of one record give the same records and masses, in the same
    order, and the same lift to rounding (only the order of its sums changes), priced or not."""
    from dpopt.estimate.marginal_space.polytope import records as records_module

    dom, _, problem = _captured_problem([("a", "b", "c"), ("c", "d"), ("b", "d", "e")], monkeypatch)
    fam = problem.cliques
    m = fam.expand(problem.target)
    gen = np.random.default_rng(6)
    price = gen.uniform(0, 1, fam.size) * (gen.uniform(size=fam.size) < 0.5) if priced else None
    whole = records_module.lifting_records(problem, m, price, 2)
    monkeypatch.setattr(records_module, "BATCH_CELLS", 1)  # one record per batch
    one_by_one = records_module.lifting_records(problem, m, price, 2)
    assert whole[0].shape[0] > len(fam.sets)  # some clique has several records: batches matter
    assert np.array_equal(one_by_one[0], whole[0]) and np.array_equal(one_by_one[1], whole[1])
    np.testing.assert_allclose(one_by_one[2], whole[2], rtol=1e-14, atol=1e-14 * whole[1].sum())


def test_records_are_not_used_where_they_would_break_a_constraint(monkeypatch):
    """A fixed residual other than the total (an exact marginal) or a record landing on a
    structural zero: record_repair says None, and the caller keeps the mix."""
    from dpopt.estimate.marginal_space.polytope.records import lifting_records, record_repair

    dom, ms, problem = _captured_problem([("a", "b", "c"), ("c", "d"), ("b", "d", "e")], monkeypatch)
    fam = problem.cliques
    x = problem.target.copy()
    m = fam.expand(x)
    _, _, lift = lifting_records(problem, m)
    zeros = np.zeros(fam.size, dtype=bool)
    zeros[np.flatnonzero(lift > 0)[0]] = True
    problem.zero_cells = zeros
    assert record_repair(problem, x, m) is None
    problem.zero_cells = None
    fixed = problem.fixed.copy()
    fixed[problem.index.position_of((0,))] = True
    problem.fixed = fixed
    assert record_repair(problem, x, m) is None


def test_long_solves_report_each_certified_point_to_the_release_progress_bar(monkeypatch):
    """Within :func:`dpopt.release.pipeline.solver_progress` every certified point of the projection
    after the start reaches the bar as one line (method, gap, products), the same points as the
    estimate's history, and between them ADMM says every WORKING_EVERY steps how many products it
    has made and the last certified gap; outside it nothing is reported."""
    from dpopt.estimate.marginal_space.polytope import projection as projection_module
    from dpopt.estimate.progress import SOLVER_PROGRESS
    from dpopt.release.pipeline import solver_progress

    class Bar:
        def __init__(self):
            self.lines = []

        def set_postfix_str(self, s="", refresh=True):
            self.lines.append(s)

    monkeypatch.setattr(projection_module, "ADMM_CELLS", 0)
    _, ms = _small_measurements([("a", "b", "c"), ("c", "d"), ("b", "d", "e")], sizes=(2, 3, 2, 3, 2))
    bar = Bar()
    with solver_progress(bar):
        est = estimate_marginals(ms, exact_cells=0)
    assert SOLVER_PROGRESS.get() is None
    assert est.status is Status.OPTIMAL and est.info["stopped"] == "certified (ADMM)"
    history = est.info["history"][1:]
    certified = [line for line in bar.lines if " gap " in line and "last certified" not in line]
    assert len(certified) == len(history) >= 2
    for line, (_, products, gap, _) in zip(certified, history):
        assert line == f"ADMM: gap {gap:.1e} after {products:,} products"
    # the work between them: products rising, each line naming the last certified gap before it
    working, last_gap, seen = [], None, 0
    for line in bar.lines:
        if line in certified:
            last_gap = float(line.split(" gap ")[1].split(" after")[0])
            continue
        products = int(line.split(": ")[1].split(" products")[0].replace(",", ""))
        assert products > seen and line.endswith("no certified point yet" if last_gap is None
                                                 else f"last certified gap {last_gap:.1e}")
        seen = products
        working.append(products)
    assert len(working) >= 2 and np.all(np.diff(working) > 0)
    silent = estimate_marginals(ms, exact_cells=0)  # no bar: the same solve, nothing sent anywhere
    assert silent.info["history"] == est.info["history"] and len(bar.lines) == len(certified) + len(working)


def _dense_expand(problem) -> np.ndarray:
    """``E`` as a dense matrix (clique cells x residuals), column by column: brute force."""
    fam, size = problem.cliques, problem.index.size
    return np.column_stack([fam.expand(np.eye(size)[j]) for j in range(size)])


def _lower_margins(table: np.ndarray) -> list:
    return [table.sum(axis=k) for k in range(table.ndim)]


@pytest.mark.parametrize("sets", [
    [("a", "b", "c"), ("b", "c", "d"), ("d", "e")],   # decomposable
    [("a", "b", "c"), ("c", "d"), ("b", "d", "e")],   # a cycle
])
def test_local_repair_moves_only_each_cliques_top_residual(sets, monkeypatch):
    """polytope.local_repair at the unconstrained fit (many negative cells): the point stays
    consistent (its cells are E x' of its residuals, by the dense E), only the top residuals of
    cliques with negative cells change, every other clique's cells are unchanged bit for bit, the
    changed cliques keep all their lower margins, and the negative mass falls."""
    from dpopt.estimate.marginal_space.polytope.local_repair import local_repair, top_cliques

    _, _, problem = _captured_problem(sets, monkeypatch)
    fam, index = problem.cliques, problem.index
    x = problem.target.copy()
    m = fam.expand(x)
    x2, m2 = x.copy(), m.copy()
    changed = local_repair(problem, x2, m2)
    assert changed >= 1
    scale = np.abs(m).max()
    np.testing.assert_allclose(_dense_expand(problem) @ x2, m2, rtol=0, atol=1e-12 * scale)
    movable = top_cliques(problem)
    # the maximal cliques (no other clique contains them): cd lies in bcd, de in no triple
    assert movable == [i for i, s in enumerate(fam.sets) if not any(set(s) < set(t) for t in fam.sets)]
    top_blocks = np.zeros(index.size, dtype=bool)
    for i in movable:
        p = index.position_of(fam.sets[i])
        top_blocks[index.set_offsets[p]:index.set_offsets[p] + index.set_cells[p]] = True
    assert np.array_equal(x2[~top_blocks], x[~top_blocks])
    sizes = index.sizes
    for i, axes in enumerate(fam.sets):
        before, after = fam.marginal(m, i), fam.marginal(m2, i)
        if i not in movable or not (before < 0).any():
            assert np.array_equal(before, after)
            continue
        shape = tuple(int(sizes[a]) for a in axes)
        for low, low2 in zip(_lower_margins(before.reshape(shape)), _lower_margins(after.reshape(shape))):
            np.testing.assert_allclose(low2, low, rtol=0, atol=1e-12 * scale)
    assert -m2[m2 < 0].sum() < -m[m < 0].sum()


def test_local_repair_is_the_projection_onto_the_cliques_nonnegative_tables(monkeypatch):
    """Where the local problem (12) is feasible (a non-negative table plus a top-interaction
    perturbation that makes cells negative), the repaired clique is non-negative and is the
    Euclidean projection of the perturbed table onto the non-negative tables with its lower
    margins, as a dense QP (cvxpy) finds it."""
    cp = pytest.importorskip("cvxpy")
    from dpopt.estimate.marginal_space.layout import contrast
    from dpopt.estimate.marginal_space.polytope.local_repair import local_repair

    dom, _, problem = _captured_problem([("a", "b", "c"), ("c", "d"), ("b", "d", "e")], monkeypatch)
    fam, index, sizes = problem.cliques, problem.index, problem.index.sizes
    gen = np.random.default_rng(8)
    table = gen.poisson(0.3, dom.shape).astype(float)  # a consistent, non-negative family
    x = np.zeros(index.size)
    for p, axes in enumerate(index.set_axes):
        names = tuple(dom.attrs[a] for a in axes)
        margin = Marginal(dom, names).matvec(table.ravel()).reshape(tuple(int(sizes[a]) for a in axes)) if axes \
            else np.array(table.sum())
        x[index.set_offsets[p]:index.set_offsets[p] + index.set_cells[p]] = contrast(margin).ravel()
    m = fam.expand(x)
    assert m.min() >= -1e-9
    p = index.position_of(fam.sets[0])
    block = slice(index.set_offsets[p], index.set_offsets[p] + index.set_cells[p])
    x[block] += gen.normal(0.0, 3.0, index.set_cells[p])  # only clique 0's top residual: its cells alone move
    m = fam.expand(x)
    assert m.min() < -1.0 and fam.marginal(m, 1).min() >= -1e-9
    x2, m2 = x.copy(), m.copy()
    assert local_repair(problem, x2, m2, sweeps=3000, floor=1e-9) == 1  # the others' cells: -2e-16 at worst
    shape = tuple(int(sizes[a]) for a in fam.sets[0])
    mu = fam.marginal(m, 0).reshape(shape)
    v = cp.Variable(mu.size)
    cube = [cp.reshape(v[k * shape[1] * shape[2]:(k + 1) * shape[1] * shape[2]], (shape[1], shape[2]), order="C")
            for k in range(shape[0])]
    constraints = [v >= 0]
    constraints += [sum(cube) == mu.sum(axis=0)]
    constraints += [cp.sum(c, axis=1) == mu.sum(axis=2)[k] for k, c in enumerate(cube)]
    constraints += [cp.sum(c, axis=0) == mu.sum(axis=1)[k] for k, c in enumerate(cube)]
    # Clarabel, the interior point dpopt's engines use (gap certified to 1e-8): cvxpy's default for a
    # QP, OSQP, crashed the test worker (segmentation fault in its setup) under CI's newest releases.
    cp.Problem(cp.Minimize(cp.sum_squares(v - mu.ravel())), constraints).solve(solver=cp.CLARABEL)
    repaired = fam.marginal(m2, 0)
    assert repaired.min() >= -1e-6
    np.testing.assert_allclose(repaired, v.value, rtol=0, atol=1e-4)
    for i in range(1, len(fam.sets)):
        assert np.array_equal(fam.marginal(m2, i), fam.marginal(m, i))


def test_local_repair_then_records_certify_against_the_brute_force_optimum(monkeypatch):
    """On a cycle, at the multipliers of a few ADMM steps: the locally repaired and then
    record-lifted point is feasible and consistent, its F is at least the optimum of (4) solved as
    a dense QP over the residuals (cvxpy), the dual value at most it (the certificate is valid),
    and here its certified gap is below that of the records alone."""
    cp = pytest.importorskip("cvxpy")
    from dpopt.estimate.marginal_space.polytope.admm import admm
    from dpopt.estimate.marginal_space.polytope.local_repair import local_repair
    from dpopt.estimate.marginal_space.polytope.projection import certify_with
    from dpopt.estimate.marginal_space.polytope.records import record_repair

    _, _, problem = _captured_problem([("a", "b", "c"), ("c", "d"), ("b", "d", "e")], monkeypatch)
    fam = problem.cliques
    e = _dense_expand(problem)
    r = cp.Variable(problem.index.size)
    free = problem.free_flat
    cost = 0.5 * cp.sum(cp.multiply(problem.w_flat[free], cp.square(r[free] - problem.target[free])))
    fixed = np.flatnonzero(~free)
    optimum = cp.Problem(cp.Minimize(cost), [e @ r >= 0, r[fixed] == problem.target[fixed]]).solve(
        solver=cp.CLARABEL)  # its relative gap tolerance is 1e-8, below the 1e-7 compared at (not OSQP: see above)
    point, _ = admm(problem, max_products=12, check_every=10, stop_gap=0.0)
    kappa = point[2]
    rk = problem.residuals(kappa)
    mk = fam.expand(rk)
    x = problem.target.copy()  # a candidate with many negative cells
    m = fam.expand(x)
    assert local_repair(problem, x, m) >= 1
    both = certify_with(problem, kappa, rk, mk, *record_repair(problem, x, m))
    x0 = problem.target.copy()
    alone = certify_with(problem, kappa, rk, mk, *record_repair(problem, x0, fam.expand(x0)))
    scale = np.abs(mk).max()
    assert both[4] <= 1e-9 * scale
    np.testing.assert_allclose(e @ both[0], both[1], rtol=0, atol=1e-11 * scale)
    assert both[5] == pytest.approx(objective(problem, both[0]), rel=1e-12)
    assert both[5] >= optimum * (1 - 1e-7) and both[6] <= optimum * (1 + 1e-7)
    assert both[3] < alone[3]
