"""What to measure: the ResidualPlanner's closed forms, every candidate's expected error against a
simulation of the same plan, and the rule that picks one (all before any data)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from dpopt.model.domain import Domain
from dpopt.privacy.budget import Budget
from dpopt.privacy.mechanisms import calibrate
from dpopt.strategy.bound import svd_bound
from dpopt.strategy.candidates import compare_candidates
from dpopt.strategy.error import trace_term
from dpopt.strategy.residual_planner import design_residuals, residual_variances, table_errors
from dpopt.strategy.tables import Workload, WorkloadTable

MIXED = Domain.from_dict({"a": 3, "b": 2, "c": 4, "d": 2})


@pytest.mark.parametrize("norm, budget", [("l2", Budget.zcdp(Fraction(1, 2))), ("l1", Budget.pure(1))])
def test_residual_plan_closed_form_equals_the_trace_formula(norm, budget):
    W = Workload.all_k_way(MIXED, 2)
    design = design_residuals(W, norm)
    law = calibrate(design.query, budget.total, "gaussian" if norm == "l2" else "laplace")
    per_table = table_errors(W, design.sets, residual_variances(design.query, law.variance))
    assert sum(per_table) == pytest.approx(law.variance * trace_term(W.gram(), design.query), rel=1e-9)
    # Gaussian: the optimum of the closed form is the SVD bound (the ResidualPlanner's optimality).
    if norm == "l2":
        assert design.unit_error == pytest.approx(svd_bound(W.gram()), rel=1e-9)


def test_gaussian_residual_weights_beat_every_perturbation():
    W = Workload.marginals(MIXED, [("a", "b"), ("b", "c", "d"), ("a",)], [1.0, 2.0, 0.5])
    design = design_residuals(W, "l2")
    gen = np.random.default_rng(3)  # test input

    def error(weights):
        from dpopt.model.queries import Residuals
        q = Residuals(MIXED, design.sets, weights)
        return q.squared_l2_sensitivity() * sum(table_errors(W, design.sets, residual_variances(q, 1.0)) *
                                                np.array([t.weight for t in W.tables]))

    best = error(design.query.weights)
    for _ in range(20):
        assert error(design.query.weights * np.exp(0.2 * gen.standard_normal(len(design.sets)))) >= best * (1 - 1e-9)


def _simulated(workload: Workload, candidate, runs: int, laplace: bool, seed: int):
    """Per-table mean squared error of the least-squares answers over ``runs`` noise draws."""
    A = candidate.query.to_sparse().toarray()
    pinv = np.linalg.pinv(A)
    gen = np.random.default_rng(seed)  # the simulation's noise (not private: a test)
    v = candidate.law.variance
    z = gen.laplace(0, np.sqrt(v / 2), (A.shape[0], runs)) if laplace else gen.normal(0, np.sqrt(v), (A.shape[0], runs))
    x_err = pinv @ z
    out = []
    for t in workload.tables:
        T = t.query(workload.domain).to_sparse().toarray()
        sq = ((T @ x_err) ** 2).sum(axis=0)
        out.append((sq.mean(), sq.std(ddof=1) / np.sqrt(runs)))
    return out


CASES = [
    ("residuals", Workload.all_k_way(MIXED, 2), Budget.zcdp(Fraction(1, 2)), False),
    ("workload", Workload.marginals(MIXED, [("a", "b"), ("c",), ("b", "d")], [1.0, 3.0, 1.0]), Budget.pure(1), True),
    ("identity", Workload.all_k_way(Domain.from_dict({f"x{i}": 2 for i in range(5)}), 3), Budget.pure(1), True),
    ("hdmm", Workload(Domain.from_dict({"age": 16}), [WorkloadTable("ranges of age", "ranges", ("age",))]),
     Budget.pure(1), True),
    ("hdmm", Workload(Domain.from_dict({"age": 8, "sex": 2}),
                      [WorkloadTable("ranges of age", "ranges", ("age",)), WorkloadTable("sex", "marginal", ("sex",))]),
     Budget.zcdp(Fraction(1, 2)), False),
]


@pytest.mark.parametrize("name, workload, budget, laplace", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_expected_error_per_table_equals_a_simulation_of_the_plan(name, workload, budget, laplace):
    comparison = compare_candidates(workload, budget.total, budget.noise(None), names=(name,))
    (cand,) = [c for c in comparison.candidates if c.name == name]
    assert cand.supports, cand.reason
    for expected, (mean, se) in zip(cand.errors, _simulated(workload, cand, 2000, laplace, seed=11)):
        assert abs(mean - expected) <= 4 * se, (name, expected, mean, se)


def test_the_rule_measures_the_histogram_residuals_or_lower_orders_as_the_noise_dictates():
    six = Workload.all_k_way(Domain.from_dict({f"x{i}": 2 for i in range(6)}), 3)
    pure = compare_candidates(six, Budget.pure(1).total, "laplace")
    assert pure.chosen.name == "identity"
    gauss = compare_candidates(six, Budget.zcdp(Fraction(1, 2)).total, "gaussian")
    assert gauss.chosen.name == "residuals"
    assert gauss.chosen.total([1.0] * 20) == pytest.approx(gauss.bound, rel=1e-3)  # attains the SVD bound
    wide = Workload.all_k_way(Domain.from_dict({f"x{i}": 2 for i in range(14)}), 3)
    fixed = ("identity", "workload", "residuals", "lower orders")
    lower = compare_candidates(wide, Budget.pure(1).total, "laplace", names=fixed)
    assert lower.chosen.name == "lower orders" and lower.best_unbiased.name == "identity"
    # With the adaptive tree named among the candidates, its charge is lower still on 14 attributes.
    adaptive = compare_candidates(wide, Budget.pure(1).total, "laplace", names=fixed + ("tree",))
    weights = [1.0] * len(wide.tables)
    (tree,) = [c for c in adaptive.candidates if c.name == "tree"]
    assert adaptive.chosen is tree and tree.total(weights, charged=True) < lower.chosen.total(weights, charged=True)
    text = "\n".join(lower.lines())
    assert "SVD lower bound" in text and "chosen: lower orders" in text
    assert all(np.isfinite(lower.chosen.charged)) and not all(np.isfinite(lower.chosen.errors))
