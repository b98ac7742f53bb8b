"""The smooth objective (issue 12, deliver 2): certificate, unique optimum, full support, exact-fit limit.

Independent references: scipy's L-BFGS-B on the primal (small problems), the closed-form
maximum-entropy exact fit of one-way marginals (the product of the margins), and the
problem's own definition of the weight ``λ = 1 / σ̄``.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.optimize import minimize

from dpopt.errors import SolverError
from dpopt.estimate import BACKENDS_FOR, OBJECTIVES, Status, reconstruct
from dpopt.estimate.engines import smooth as smooth_module
from dpopt.estimate.problem import ConsistencyProblem
from dpopt.model.constraints import (
    ConstraintSet,
    Invariant,
    LinearInequality,
    NonNegativity,
    StructuralZeros,
)
from dpopt.model.domain import Domain
from dpopt.model.measurement import Measurement
from dpopt.model.queries import Identity, Marginal, Total


@pytest.fixture
def domain():
    return Domain(("a", "b", "c"), (2, 3, 2))


def _truth(domain, rng):
    x = rng.poisson(6.0, domain.size).astype(float)
    x[3] = 0.0  # a cell the data leave empty
    return x


def _noisy(query, truth, sigma, rng, label):
    values = query.matvec(truth) + rng.normal(0.0, sigma, query.num_rows)  # test noise, not privacy noise
    return Measurement(query, values, "gaussian", sigma, sigma**2, label=label)


def _objective(problem: ConsistencyProblem, lam: float, prior: np.ndarray):
    op, y, s = problem.stacked_operator(), problem.targets(), problem.sigmas()

    def f(x):
        r = (op.matvec(x) - y) / s
        kl = np.sum(x * np.log(x / prior) - x + prior)
        grad = op.rmatvec(r / s) + lam * np.log(x / prior)
        return 0.5 * r @ r + lam * kl, grad

    return f


def test_smooth_is_registered():
    assert "smooth" in OBJECTIVES
    assert BACKENDS_FOR["smooth"] == ("newton",)


def test_certified_optimum_matches_an_independent_primal_solve(domain, rng):
    """One step with the total free: the single penalised fit ½ χ² + λ D(x ‖ p)."""
    truth = _truth(domain, rng)
    ms = [_noisy(Marginal(domain, ["a", "b"]), truth, 3.0, rng, "ab"),
          _noisy(Marginal(domain, ["b", "c"]), truth, 2.0, rng, "bc")]
    res = reconstruct(ms, ConstraintSet(domain, [NonNegativity()]), "smooth", steps=1, total="free")
    assert res.status is Status.OPTIMAL and res.success, res.message
    assert res.info["smoothing"] == 1.0 and res.info["held_total"] is None
    for key in ("stationarity", "invariant_residual"):
        assert res.info[key] <= 1e-6
    assert abs(res.info["duality_gap"]) <= 1e-6
    problem = ConsistencyProblem(ms, ConstraintSet(domain, [NonNegativity()]), "smooth")
    prior = np.full(domain.size, problem.total_estimate() / domain.size)
    f = _objective(problem, res.info["lambda"], prior)
    ref = minimize(f, prior, jac=True, method="L-BFGS-B", bounds=[(1e-12, None)] * domain.size,
                   options={"ftol": 1e-15, "gtol": 1e-12, "maxiter": 10_000})
    # L-BFGS-B certifies only its own tolerance (about 1e-7 relative on x here).
    np.testing.assert_allclose(res.x, ref.x, rtol=1e-5, atol=1e-6)
    assert res.fun == pytest.approx(f(res.x)[0], rel=1e-12)
    assert res.fun <= ref.fun + 1e-9 * abs(ref.fun)


def test_default_is_three_proximal_steps_with_the_total_held(domain, rng):
    """The default estimate: K = 3 steps, step k the minimiser of ½ χ² + λ D(x ‖ x_{k−1}) over
    tables with the measurements' total, x_0 the uniform prior, λ = (1 / (2^{1/3} − 1)) / σ̄.
    Each step is checked against an independent primal solve (scipy's SLSQP with the total as an
    equality constraint), the next step started from the previous step's dpopt table."""
    truth = _truth(domain, rng)
    ms = [_noisy(Marginal(domain, ["a", "b"]), truth, 3.0, rng, "ab"),
          _noisy(Marginal(domain, ["b", "c"]), truth, 2.0, rng, "bc")]
    cs = ConstraintSet(domain, [NonNegativity()])
    problem = ConsistencyProblem(ms, cs, "smooth")
    total = problem.total_estimate()
    c = 1.0 / (2.0 ** (1.0 / 3.0) - 1.0)
    previous = np.full(domain.size, total / domain.size)
    for k in (1, 2, 3):
        res = reconstruct(ms, cs, "smooth", steps=k, smoothing=c)
        assert res.success, res.message
        assert res.info["steps"] == k and res.info["held_total"] == pytest.approx(total, rel=1e-12)
        assert res.x.sum() == pytest.approx(total, rel=1e-10)
        assert res.info["lambda"] == pytest.approx(c * np.sqrt((6 / 9 + 6 / 4) / 12), rel=1e-12)
        f = _objective(problem, res.info["lambda"], previous)
        ref = minimize(f, previous, jac=True, method="SLSQP", bounds=[(1e-9, None)] * domain.size,
                       constraints=[{"type": "eq", "fun": lambda x: x.sum() - total, "jac": lambda x: np.ones_like(x)}],
                       options={"ftol": 1e-14, "maxiter": 1000})
        assert ref.success, ref.message
        # SLSQP certifies only its own tolerance (about 1e-6 relative on x here).
        np.testing.assert_allclose(res.x, ref.x, rtol=1e-4, atol=1e-5)
        assert res.fun <= ref.fun + 1e-9 * abs(ref.fun)
        previous = res.x  # the next step's prior
    default = reconstruct(ms, cs, "smooth")
    assert default.info["steps"] == 3 and default.info["smoothing"] == pytest.approx(c, rel=1e-12)
    assert reconstruct(ms, cs, "smooth", steps=2).info["smoothing"] == pytest.approx(1 / (np.sqrt(2) - 1), rel=1e-12)
    np.testing.assert_allclose(default.x, res.x, rtol=1e-12)


def test_unique_optimum_whatever_the_solver_path(domain, rng, monkeypatch):
    """The explicit Cholesky path and the matrix-free conjugate-gradient path (different iterates)
    reach the same table, and a strictly convex objective rises in every direction around it."""
    truth = _truth(domain, rng)
    ms = [_noisy(Marginal(domain, ["a", "b"]), truth, 3.0, rng, "ab"), _noisy(Identity(domain), truth, 5.0, rng, "id")]
    cs = ConstraintSet(domain, [NonNegativity(), Invariant(Total(domain), [truth.sum()], name="total")])
    explicit = reconstruct(ms, cs, "smooth")
    monkeypatch.setattr(smooth_module, "EXPLICIT_ROWS", 0)
    iterative = reconstruct(ms, cs, "smooth")
    assert explicit.success and iterative.success
    assert "conjugate gradients" in iterative.solver and "conjugate" not in explicit.solver
    np.testing.assert_allclose(explicit.x, iterative.x, rtol=1e-7, atol=1e-9)
    problem = ConsistencyProblem(ms, cs, "smooth")
    # The last of the default's three steps: its prior is the second step's optimum.
    prior = reconstruct(ms, cs, "smooth", steps=2, smoothing=explicit.info["smoothing"]).x
    f = _objective(problem, explicit.info["lambda"], prior)
    assert explicit.fun == pytest.approx(f(explicit.x)[0], rel=1e-10)
    base = f(explicit.x)[0]
    gen = np.random.default_rng(3)
    for _ in range(20):
        d = gen.normal(size=domain.size)
        d -= d.mean()  # keep the total invariant
        step = 1e-3 * explicit.x.min() * d / np.abs(d).max()
        assert f(explicit.x + step)[0] > base


def test_full_support_and_structural_zeros(domain, rng):
    """Very noisy measurements of a table with an empty cell: every free cell is positive (finite
    KL(true || estimate)), structural zeros stay exactly zero, nothing is added afterwards."""
    truth = _truth(domain, rng)
    zero = StructuralZeros("a == 1 and c == 1", name="rule")
    cs = ConstraintSet(domain, [NonNegativity(), zero])
    truth[cs.zero_mask()] = 0
    ms = [_noisy(Marginal(domain, ["a", "b"]), truth, 40.0, rng, "ab"),
          _noisy(Marginal(domain, ["c"]), truth, 40.0, rng, "c")]
    res = reconstruct(ms, cs, "smooth")
    assert res.success, res.message
    free = ~cs.zero_mask()
    assert np.all(res.x[free] > 0) and np.all(res.x[~free] == 0)
    assert res.info["full_support"] and res.info["smallest_cell"] == pytest.approx(res.x[free].min())
    p = truth / truth.sum()
    q = res.x / res.x.sum()
    held = p > 0
    assert np.isfinite(np.sum(p[held] * np.log(p[held] / q[held])))
    l2 = reconstruct(ms, cs, "l2")
    assert (l2.x[free] < 1e-6).any()  # the least-squares fit, by contrast, empties cells here (to its tolerance)


def test_equals_the_exact_fit_as_the_noise_vanishes(domain, rng):
    """One-way marginals measured with noise variance v -> 0 (the answers are the true ones): the
    estimate tends to the maximum-entropy exact fit, the product of the margins."""
    truth = rng.poisson(8.0, domain.size).astype(float)
    n = truth.sum()
    expected = np.full(1, n)
    for attr in domain.attrs:
        expected = np.multiply.outer(expected, Marginal(domain, [attr]).matvec(truth) / n).ravel()
    gaps = []
    for variance in (1.0, 1e-2, 1e-4, 1e-6):
        ms = [Measurement(Marginal(domain, [a]), Marginal(domain, [a]).matvec(truth), "gaussian", np.sqrt(variance),
                          variance, label=a) for a in domain.attrs]
        res = reconstruct(ms, ConstraintSet(domain, [NonNegativity()]), "smooth")
        assert res.success, res.message
        gaps.append(np.abs(res.x - expected).max() / n)
    assert all(b < a for a, b in itertools.pairwise(gaps))
    assert gaps[-1] < 1e-5
    # Below the solvers' resolution the measurements become equalities: the exact fit itself.
    ms = [Measurement(Marginal(domain, [a]), Marginal(domain, [a]).matvec(truth), "gaussian", 1e-12, 1e-24, label=a)
          for a in domain.attrs]
    res = reconstruct(ms, ConstraintSet(domain, [NonNegativity()]), "smooth", prior=np.ones(domain.size))
    assert res.success and sorted(res.info["exact_by_resolution"]) == sorted(domain.attrs)
    np.testing.assert_allclose(res.x, expected, rtol=1e-9)


def test_weight_follows_the_noise_not_the_answers(domain, rng):
    truth = _truth(domain, rng)
    q = Marginal(domain, ["a", "b"])
    first = reconstruct([_noisy(q, truth, 3.0, rng, "ab")], ConstraintSet(domain, [NonNegativity()]), "smooth")
    other = reconstruct([_noisy(q, 2 * truth, 3.0, rng, "ab")], ConstraintSet(domain, [NonNegativity()]), "smooth")
    # λ = c / σ̄ with the default c = 1 / (2^{1/3} − 1) of three proximal steps.
    assert first.info["lambda"] == pytest.approx(1.0 / (2.0 ** (1.0 / 3.0) - 1.0) / 3.0, rel=1e-12)
    assert other.info["lambda"] == pytest.approx(first.info["lambda"], rel=1e-12)
    mixed = [_noisy(q, truth, 3.0, rng, "ab"), _noisy(Marginal(domain, ["c"]), truth, 1.0, rng, "c")]
    res = reconstruct(mixed, ConstraintSet(domain, [NonNegativity()]), "smooth", smoothing=2.0)
    sigma_bar = np.sqrt((q.num_rows + 2) / (q.num_rows / 9.0 + 2 / 1.0))
    assert res.info["lambda"] == pytest.approx(2.0 / sigma_bar, rel=1e-12)


def test_invariants_hold_and_units_do_not_matter(domain, rng):
    truth = _truth(domain, rng)
    cs = ConstraintSet(domain, [NonNegativity(), Invariant(Marginal(domain, ["a"]), Marginal(domain, ["a"]).matvec(truth),
                                                           name="a totals")])
    ms = [_noisy(Marginal(domain, ["b", "c"]), truth, 2.0, rng, "bc")]
    res = reconstruct(ms, cs, "smooth")
    assert res.success and res.constraint_residuals["satisfied"].all()
    np.testing.assert_allclose(Marginal(domain, ["a"]).matvec(res.x), Marginal(domain, ["a"]).matvec(truth), rtol=1e-9)
    # Counts in other units (times 1000, noise too): the same table, times 1000.
    big = [Measurement(m.query, 1000 * m.values, m.noise, 1000 * m.scale, 1e6 * m.variance, label=m.label) for m in ms]
    cs_big = ConstraintSet(domain, [NonNegativity(), Invariant(Marginal(domain, ["a"]),
                                                               1000 * Marginal(domain, ["a"]).matvec(truth), name="a")])
    res_big = reconstruct(big, cs_big, "smooth")
    np.testing.assert_allclose(res_big.x, 1000 * res.x, rtol=1e-7)
    # A prior is a table of counts: in other units it scales with them (here the prior's total
    # matters: no invariant, the total free).
    prior = rng.uniform(0.5, 2.0, domain.size) * truth.sum() / domain.size
    cs_free = ConstraintSet(domain, [NonNegativity()])
    res = reconstruct(ms, cs_free, "smooth", prior=prior, total="free")
    res_big = reconstruct(big, cs_free, "smooth", prior=1000 * prior, total="free")
    assert res.success and res_big.success and res_big.info["count_scale"] != 1.0
    np.testing.assert_allclose(res_big.x, 1000 * res.x, rtol=1e-7)
    assert res_big.info["prior_total"] == pytest.approx(1000 * prior.sum(), rel=1e-12)


def test_separable_path_agrees_with_the_general_engine(domain, rng):
    truth = _truth(domain, rng)
    ms = [_noisy(Identity(domain), truth, 2.0, rng, "id")]
    cs = ConstraintSet(domain, [NonNegativity(), Invariant(Marginal(domain, ["a"]), Marginal(domain, ["a"]).matvec(truth),
                                                           name="a")])
    separable = reconstruct(ms, cs, "smooth")
    general = reconstruct(ms, cs, "smooth", backend="newton")
    assert separable.backend == "separable" and general.backend == "newton"
    assert separable.success and general.success
    np.testing.assert_allclose(separable.x, general.x, rtol=1e-7)
    assert separable.fun == pytest.approx(general.fun, rel=1e-9)
    # Without invariants both hold the total at the measurements' estimate, over the same three steps.
    free = ConstraintSet(domain, [NonNegativity()])
    separable, general = reconstruct(ms, free, "smooth"), reconstruct(ms, free, "smooth", backend="newton")
    assert separable.backend == "separable" and general.backend == "newton"
    assert separable.info["held_total"] == pytest.approx(general.info["held_total"], rel=1e-12)
    assert separable.info["steps"] == general.info["steps"] == 3
    assert separable.x.sum() == pytest.approx(separable.info["held_total"], rel=1e-9)
    np.testing.assert_allclose(separable.x, general.x, rtol=1e-7)
    assert separable.fun == pytest.approx(general.fun, rel=1e-9)
    assert separable.info["kl_to_prior"] == pytest.approx(general.info["kl_to_prior"], rel=1e-7)


def test_bad_input_is_refused(domain, rng):
    truth = _truth(domain, rng)
    ms = [_noisy(Marginal(domain, ["a"]), truth, 1.0, rng, "a")]
    ineq = ConstraintSet(domain, [NonNegativity(), LinearInequality(Total(domain), 0.0, 1e6, name="cap")])
    with pytest.raises(SolverError, match="inequalities"):
        reconstruct(ms, ineq, "smooth")
    with pytest.raises(SolverError, match="smoothing must be a positive"):
        reconstruct(ms, None, "smooth", smoothing=0.0)
    with pytest.raises(SolverError, match="prior must be"):
        reconstruct(ms, None, "smooth", prior=np.zeros(domain.size))
    for steps in (0, 1.5, True):
        with pytest.raises(SolverError, match="steps must be a positive whole number"):
            reconstruct(ms, None, "smooth", steps=steps)
    with pytest.raises(SolverError, match="total must be 'estimate' or 'free'"):
        reconstruct(ms, None, "smooth", total="fixed")
    with pytest.raises(SolverError, match="does not solve the 'smooth' objective"):
        reconstruct(ms, None, "smooth", backend="highs")
