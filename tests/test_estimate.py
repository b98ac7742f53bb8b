"""Consistency engines: exact recovery without noise, backends agreeing, rounding optimality,
infeasibility named, error bars against simulation."""

from __future__ import annotations

import numpy as np
import pytest

from dpopt.errors import SolverError
from dpopt.estimate import Status, reconstruct, standard_errors
from dpopt.estimate.backends import installed_backends
from dpopt.model.constraints import (
    ConstraintSet,
    Hierarchy,
    Integrality,
    Invariant,
    NonNegativity,
    StructuralZeros,
)
from dpopt.model.data import Dataset
from dpopt.model.domain import Domain
from dpopt.model.measurement import Measurement
from dpopt.model.queries import Identity, Marginal, Total, all_marginals


def noiseless(query, data, sigma=1.0, label=None):
    """A measurement carrying the true answers but a nominal noise level (noise turned off)."""
    return Measurement(query, query.answer(data), "gaussian", sigma, sigma**2, label=label or query.name)


def noisy(query, data, rng, sigma=1.0, label=None):
    values = query.answer(data) + rng.normal(0, sigma, query.num_rows)  # test input, not a release
    return Measurement(query, values, "gaussian", sigma, sigma**2, label=label or query.name)


@pytest.fixture
def binary4(rng):
    dom = Domain(("a", "b", "c", "d"), (2, 2, 2, 2))
    counts = rng.integers(0, 20, dom.size)
    counts[3] = 0
    return Dataset.from_histogram(counts, dom)


@pytest.fixture
def geo(rng):
    dom = Domain.from_dict({"state": ["A", "B"], "county": ["A1", "A2", "B1"], "age": 3, "sex": 2})
    hier = Hierarchy("state", "county", {"A1": "A", "A2": "A", "B1": "B"})
    young = StructuralZeros("age == 0 and sex == 1", name="rule")
    cs = ConstraintSet(dom, [NonNegativity(), hier, young])
    counts = rng.integers(0, 30, dom.size).astype(float)
    counts[cs.zero_mask()] = 0
    return Dataset.from_histogram(counts.astype(int), dom), cs


# ---- exact recovery without noise -----------------------------------------------------------
@pytest.mark.parametrize("objective", ["l2", "l1", "linf", "entropy"])
def test_identity_recovered_exactly(binary4, objective):
    res = reconstruct([noiseless(Identity(binary4.domain), binary4)], ConstraintSet(binary4.domain, [NonNegativity()]), objective)
    assert res.success, res.message
    tol = 1e-3 if objective == "entropy" else 1e-6
    assert np.allclose(res.x, binary4.histogram(), atol=tol * binary4.total)


@pytest.mark.parametrize("objective", ["l2", "l1", "linf", "entropy"])
def test_all_two_way_marginals_reproduced(binary4, objective):
    ms = [noiseless(q, binary4) for q in all_marginals(binary4.domain, 2)]
    res = reconstruct(ms, ConstraintSet(binary4.domain, [NonNegativity()]), objective)
    assert res.success, res.message
    tol = 1e-3 * binary4.total if objective == "entropy" else 1e-6
    if objective == "entropy":  # the Frank-Wolfe gap certifies near-optimality of the fit
        assert 0 <= res.info["duality_gap"] <= 1e-3 * binary4.total
    for m in ms:
        assert np.allclose(m.query.matvec(res.x), m.values, atol=tol)
    assert res.x.min() >= -1e-9


@pytest.mark.parametrize("objective", ["l2", "l1", "linf", "entropy"])
def test_two_level_hierarchy_with_invariants_and_zeros(geo, objective):
    data, cs = geo
    dom = data.domain
    cs = ConstraintSet(dom, list(cs.constraints))
    cs.invariant_from_data(Marginal(dom, ["state"]), data, "state_totals")
    ms = [noiseless(Marginal(dom, ["county", "age", "sex"]), data), noiseless(Marginal(dom, ["state", "age"]), data)]
    res = reconstruct(ms, cs, objective)
    assert res.success, res.message
    tol = 1e-3 * data.total if objective == "entropy" else 1e-6
    assert np.allclose(Marginal(dom, ["county", "age", "sex"]).matvec(res.x), ms[0].values, atol=tol)
    assert res.max_violation <= 1e-6 * data.total
    assert np.all(res.x[cs.zero_mask()] == 0)


# ---- backends agree -----------------------------------------------------------------------
def _noisy_problem(geo, rng):
    data, cs = geo
    dom = data.domain
    cs = ConstraintSet(dom, list(cs.constraints))
    cs.invariant_from_data(Total(dom), data, "total")
    ms = [noisy(q, data, rng, sigma=s) for q, s in ((Marginal(dom, ["county", "age"]), 2.0), (Marginal(dom, ["state", "sex"]), 1.0), (Marginal(dom, ["age", "sex"]), 3.0))]
    return ms, cs


@pytest.mark.parametrize("objective, backends", [
    ("l2", ["cvxpy", "highs"]),
    ("l1", ["highs", "scipy", "cvxpy", "pulp"]),
    ("linf", ["highs", "scipy", "cvxpy", "pulp"]),
])
def test_backends_agree(geo, rng, objective, backends):
    ms, cs = _noisy_problem(geo, rng)
    results = {}
    for name in backends:
        if name not in installed_backends():
            continue
        res = reconstruct(ms, cs, objective, backend=name)
        assert res.success, (name, res.message)
        results[name] = res
    assert len(results) >= 2
    ref = next(iter(results.values()))
    for name, res in results.items():
        assert res.fun == pytest.approx(ref.fun, rel=1e-6, abs=1e-7), name
    if objective == "l2":  # strictly convex in the measured directions: compare answers
        for res in results.values():
            for m in ms:
                assert np.allclose(m.query.matvec(res.x), m.query.matvec(ref.x), rtol=1e-5, atol=1e-4)


def test_bounds_only_l2_scipy_matches_qp(binary4, rng):
    ms = [noisy(q, binary4, rng, sigma=2.0) for q in all_marginals(binary4.domain, 2)]
    cs = ConstraintSet(binary4.domain, [NonNegativity()])
    a = reconstruct(ms, cs, "l2", backend="scipy")  # bounded least squares, matrix-free methods
    b = reconstruct(ms, cs, "l2")
    assert a.backend == "scipy" and b.backend == "clarabel"  # the QP default: Clarabel, called directly
    assert a.fun == pytest.approx(b.fun, rel=1e-6, abs=1e-6)


def test_nnls_working_set_matches_qp(rng):
    dom = Domain(tuple("abcdefg"), (2,) * 7)
    data = Dataset.from_histogram(rng.poisson(rng.gamma(0.3, 4.0, dom.size)), dom)
    ms = [noisy(q, data, rng, sigma=1.0 + i % 3) for i, q in enumerate(all_marginals(dom, 3))]
    cs = ConstraintSet(dom, [NonNegativity(), StructuralZeros({"a": 1, "b": 1, "c": 1}, name="z")])
    ws = reconstruct(ms, cs, "l2", working_set=True)
    qp = reconstruct(ms, cs, "l2")
    assert ws.success and "KKT" in ws.message and ws.info["form"] == "NNLS working set"
    assert ws.fun == pytest.approx(qp.fun, rel=1e-7)
    assert np.all(ws.x >= 0) and np.all(ws.x[cs.zero_mask()] == 0)
    for m in ms:  # the optimal answers are unique even where the table is not
        assert np.allclose(m.query.matvec(ws.x), m.query.matvec(qp.x), atol=1e-4)


def test_marginal_workload_equals_stacked_marginals(rng):
    from dpopt.model.queries import MarginalWorkload, Stack

    for dom in (Domain(tuple("abcde"), (2,) * 5), Domain.from_dict({"a": 3, "b": 2, "c": 4, "d": 2})):
        sets = [m.attrs for m in all_marginals(dom, 2)] + [("a",), ("a", "b", "c")]
        work, stack = MarginalWorkload(dom, sets), Stack([Marginal(dom, s) for s in sets])
        x, y = rng.random(dom.size), rng.random(work.num_rows)
        assert np.allclose(work.matvec(x), stack.matvec(x))
        assert np.allclose(work.rmatvec(y), stack.rmatvec(y))
        assert np.array_equal(work.to_dense(), stack.to_dense())
        cells = rng.choice(dom.size, 7, replace=False)
        assert np.array_equal(work.columns(cells).toarray(), stack.to_dense()[:, cells])
        assert work.sensitivity(1) == stack.sensitivity(1)


def test_column_generation_equals_full_lp(rng):
    dom = Domain(tuple("abcdefgh"), (2,) * 8)
    data = Dataset.from_histogram(rng.poisson(rng.gamma(0.3, 4.0, dom.size)), dom)
    ms = [noisy(q, data, rng, sigma=1.5) for q in all_marginals(dom, 2)]
    cs = ConstraintSet(dom, [NonNegativity()])
    cs.invariant_from_data(Total(dom), data, "total")
    for objective in ("l1", "linf"):
        full = reconstruct(ms, cs, objective, column_generation=False)
        cg = reconstruct(ms, cs, objective, column_generation=True)
        assert full.success and cg.success
        assert cg.info["column_generation"] and cg.info["cell_columns"] < dom.size
        assert "warm-started" in cg.solver
        cold = reconstruct(ms, cs, objective, column_generation=True, warm_start=False)
        assert cold.success and cold.fun == pytest.approx(full.fun, rel=1e-6, abs=1e-7)
        capped = reconstruct(ms, cs, objective, column_generation=True, max_rounds=1, initial="score")
        assert capped.status is Status.ITERATION_LIMIT and not capped.success and capped.incumbent
        assert capped.x.shape == (dom.size,) and capped.fun >= full.fun - 1e-9
        assert cg.fun == pytest.approx(full.fun, rel=1e-6, abs=1e-7)


# ---- infeasibility ------------------------------------------------------------------------
def test_infeasible_is_a_status_naming_constraints(binary4):
    dom = binary4.domain
    cs = ConstraintSet(dom, [NonNegativity()])
    cs.add(Invariant(Total(dom), [10.0], name="total"))
    cs.add(Invariant(Marginal(dom, ["a"]), [3.0, 4.0], name="a_counts"))
    from dpopt.errors import InconsistentConstraintsError

    with pytest.raises(InconsistentConstraintsError, match="'invariant:total', 'invariant:a_counts'"):
        reconstruct([noiseless(Identity(dom), binary4)], cs)
    # The engines themselves report infeasibility as a status with the conflicting groups.
    from dpopt.estimate.engines.linear import solve_linear
    from dpopt.estimate.problem import ConsistencyProblem

    res = solve_linear(ConsistencyProblem([noiseless(Identity(dom), binary4)], cs, "l1"), None)
    assert res.status is Status.INFEASIBLE and not res.success and res.x is None
    assert set(res.info["conflicting_constraints"]) >= {"invariant:total", "invariant:a_counts"}


def test_entropy_survives_huge_noise(binary4, rng):
    """Noisy answers far from the data must not overflow the multiplicative updates."""
    ms = [noisy(q, binary4, rng, sigma=5000.0) for q in all_marginals(binary4.domain, 2)]
    cs = ConstraintSet(binary4.domain, [NonNegativity()])
    cs.invariant_from_data(Total(binary4.domain), binary4, "total")
    res = reconstruct(ms, cs, "entropy", max_passes=200)
    assert res.x is not None and np.isfinite(res.x).all() and res.x.min() >= 0


def test_unknown_backend_and_option(binary4):
    m = [noiseless(Identity(binary4.domain), binary4)]
    with pytest.raises(SolverError, match="installed"):
        reconstruct(m, None, "l1", backend="gurobi")
    with pytest.raises(SolverError, match="unknown objective"):
        reconstruct(m, None, "l3")
    with pytest.raises(SolverError, match="unknown options"):
        reconstruct(m, ConstraintSet(binary4.domain, [NonNegativity()]), "entropy", bogus=1)


# ---- integer rounding (the rounding itself is tested in tests/test_rounding.py) ------------------
def test_reconstruct_with_integrality_rounds(geo, rng):
    ms, cs = _noisy_problem(geo, rng)
    cs = ConstraintSet(cs.domain, list(cs.constraints) + [Integrality()])
    res = reconstruct(ms, cs, "l2")
    assert res.success and np.array_equal(res.x, np.round(res.x))
    assert res.max_violation == 0.0
    assert res.info["rounding"]["status"] is Status.OPTIMAL


# ---- error bars -------------------------------------------------------------------------------
def test_gls_error_bars_match_simulation(rng):
    dom = Domain(("a", "b"), (3, 2))
    truth = Dataset.from_histogram(rng.integers(5, 30, dom.size), dom)
    queries = [Identity(dom), Marginal(dom, ["a"]), Marginal(dom, ["b"])]
    sigmas = [4.0, 2.0, 1.0]
    cs = ConstraintSet(dom)
    cs.invariant_from_data(Total(dom), truth, "total")
    template = [noisy(q, truth, rng, s) for q, s in zip(queries, sigmas)]
    predicted = standard_errors(reconstruct(template, cs, "l2", backend="cvxpy"))
    predicted_b = standard_errors(reconstruct(template, cs, "l2", backend="cvxpy"), Marginal(dom, ["b"]))
    estimates = []
    for _ in range(400):
        ms = [noisy(q, truth, rng, s) for q, s in zip(queries, sigmas)]
        estimates.append(reconstruct(ms, cs, "l2", backend="cvxpy").x)
    estimates = np.array(estimates)
    empirical = estimates.std(axis=0, ddof=1)
    # 400 replicates: the sample sd is within ~3.5 * sd/sqrt(2*399) of the truth
    assert np.allclose(empirical, predicted, rtol=3.5 / np.sqrt(2 * 399))
    emp_b = (estimates @ Marginal(dom, ["b"]).to_dense().T).std(axis=0, ddof=1)
    assert np.allclose(emp_b, predicted_b, rtol=3.5 / np.sqrt(2 * 399))
    assert np.all(predicted > 0)


def test_exact_least_squares_fit_is_returned_as_the_lp_optimum(rng):
    """Consistent measurements of a large domain: the NNLS warm start already has zero
    residual, which is the L1/L-infinity lower bound, so no LP is solved; the same problem
    with the shortcut disabled (initial='score') reaches the same objective by simplex."""
    dom = Domain(tuple("abcdefghijklmn"), (2,) * 14)
    data = Dataset.from_histogram(rng.poisson(0.5, dom.size), dom)
    ms = [noiseless(q, data) for q in all_marginals(dom, 1)]
    cs = ConstraintSet(dom, [NonNegativity()])
    for objective in ("l1", "linf"):
        fast = reconstruct(ms, cs, objective, column_generation=True)
        assert fast.success and fast.info["exact_fit"] and fast.fun <= 1e-6
        slow = reconstruct(ms, cs, objective, column_generation=True, initial="score")
        assert slow.success and "exact_fit" not in slow.info and slow.fun == pytest.approx(fast.fun, abs=1e-6)
        for m in ms:
            assert np.allclose(m.query.matvec(fast.x), m.values, atol=1e-6)


# ---- the measurement residual table, built when read ----------------------------------------------
@pytest.mark.parametrize("objective", ["l2", "l1"])
def test_measurement_residuals_are_those_of_the_returned_estimate(geo, rng, objective):
    """The residual tables are built on first read, the measurements' from a copy of the estimate
    as returned: the same tables as ones built then, even when the caller has since changed ``x``
    in place or pickled the result."""
    import pickle

    import pandas as pd

    from dpopt.estimate.result import measurement_residual_frame

    ms, cs = _noisy_problem(geo, rng)
    res = reconstruct(ms, cs, objective)
    x0 = res.x.copy()
    expected = measurement_residual_frame(ms, x0)
    assert "measurement_residuals" not in res and "constraint_residuals" not in res  # not built yet
    table = res.constraint_residuals
    rows = cs.residuals(x0)
    assert list(table.columns) == ["constraint", "max_violation", "satisfied"]
    assert list(table["constraint"]) == [r["constraint"] for r in rows]
    assert list(table["max_violation"]) == [r["max_violation"] for r in rows]
    assert res.max_violation == float(table["max_violation"].max()) and table["satisfied"].all()
    copy = pickle.loads(pickle.dumps(res))
    res.x += 1.0  # a caller's change after the solve
    pd.testing.assert_frame_equal(res.measurement_residuals, expected)
    pd.testing.assert_frame_equal(copy.measurement_residuals, expected)
    assert list(expected["measurement"]) == [m.label for m in ms] and (expected["rms_z"] > 0).all()
    res.measurement_residuals = expected.iloc[:1]  # set like any entry
    assert len(res.measurement_residuals) == 1
