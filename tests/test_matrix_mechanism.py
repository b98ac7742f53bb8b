"""The registered matrix mechanism: expected error against simulation with the exact samplers,
the plan's bound and candidates, the privacy contract (ledger, charges before draws, seeds), and
constrained reconstruction keeping zeros, invariants and integrality exactly."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pandas as pd
import pytest

from dpopt.algorithms.base import REGISTRY, Release, get_algorithm
from dpopt.algorithms.matrix_mechanism import MatrixMechanism, MatrixMechanismParams, WorkloadSpec
from dpopt.errors import BudgetExceededError, ParameterError
from dpopt.estimate.status import Status
from dpopt.model.constraints import ConstraintSet, Integrality, Invariant, NonNegativity, StructuralZeros
from dpopt.model.data import Dataset
from dpopt.model.domain import Domain
from dpopt.model.queries import AllRanges, Hierarchical, Marginal, Prefix, Total
from dpopt.privacy.accountant import PrivacyCost
from dpopt.privacy.budget import Budget
from dpopt.privacy.mechanisms import calibrate
from dpopt.privacy.randomness import SeededRandom, make_random
from dpopt.privacy.samplers import discrete_gaussian, discrete_laplace
from dpopt.strategy import trace_term
from dpopt.strategy.optimize import optimize_pidentity
from tests.test_mechanisms import CountingRandom


@pytest.fixture
def ages():
    dom = Domain(("age", "sex"), (12, 2))
    rng = np.random.default_rng(7)
    frame = pd.DataFrame({"age": rng.integers(0, 12, 400), "sex": rng.integers(0, 2, 400)})
    frame.loc[frame["age"] == 0, "sex"] = 0  # a structural zero the data respects
    return dom, Dataset.from_frame(frame, dom)


def _plan(dom, budget, constraints=None, **options):
    alg = MatrixMechanism(**options)
    return alg, alg.plan(dom, constraints or ConstraintSet(dom), budget)


# ---- expected error against simulation ------------------------------------------------------------
@pytest.mark.parametrize("mechanism, strategy", [("laplace", "hierarchical"), ("laplace", "optimized"),
                                                 ("gaussian", "hierarchical"), ("gaussian", "optimized")])
def test_expected_error_agrees_with_simulation_of_the_exact_samplers(mechanism, strategy):
    """Draw the strategy's noise with dpopt's exact samplers (the law calibrate gives), reconstruct
    by A⁺ and measure the workload's total squared error: its mean must match the formula (a
    z-test at 4 standard errors, and within 5%), while 1.1x the formula is rejected."""
    dom = Domain(("x",), (16,))
    W = AllRanges(dom, "x")
    cost = PrivacyCost.pure(1) if mechanism == "laplace" else PrivacyCost.zcdp(Fraction(1, 2))
    A = Hierarchical(dom, "x", 2) if strategy == "hierarchical" else \
        optimize_pidentity(W, norm="l1" if mechanism == "laplace" else "l2").query
    law = calibrate(A, cost, mechanism)
    expected = law.variance * trace_term(W, A)
    reps = 6000
    sampler = discrete_laplace if mechanism == "laplace" else discrete_gaussian
    z = sampler(law.parameter, reps * A.num_rows, SeededRandom(11)).reshape(reps, A.num_rows) * float(law.grid)
    error = z @ (W.to_dense() @ np.linalg.pinv(A.to_dense())).T     # W A⁺ z for every draw
    sq = (error**2).sum(axis=1)
    mean, se = sq.mean(), sq.std(ddof=1) / np.sqrt(reps)
    assert abs(mean - expected) < 4 * se
    assert abs(mean / expected - 1) < 0.05
    assert abs(mean - 1.1 * expected) > 4 * se  # power: a 10% error in the formula is seen


def test_end_to_end_error_matches_the_plan(ages):
    dom, data = ages
    budget = Budget.pure(1)
    alg, plan = _plan(dom, budget, workload=WorkloadSpec("prefix", attrs=("age",)))
    W = plan.details.workload
    truth = W.answer(data)
    errors = []
    for seed in range(300):
        rel = alg.run(plan, data, budget.accountant(), make_random(seed))
        errors.append(float(((rel.answers["workload"]["count"].to_numpy() - truth) ** 2).sum()))
    errors = np.array(errors)
    se = errors.std(ddof=1) / np.sqrt(errors.size)
    assert abs(errors.mean() - plan.details.expected_error) < 4 * se
    # The reported standard errors are the formula's per-query terms.
    rel = alg.run(plan, data, budget.accountant(), make_random(0))
    assert (rel.answers["workload"]["stderr"] ** 2).sum() == pytest.approx(plan.details.expected_error, rel=1e-9)


# ---- the plan -----------------------------------------------------------------------------------------
def test_plan_lists_every_candidate_and_picks_the_least_error(ages):
    dom, _ = ages
    alg, plan = _plan(dom, Budget.pure("1/2"), workload=WorkloadSpec("all_ranges", attrs=("age",)))
    frame = plan.details.frame()
    usable = frame[np.isfinite(frame["expected_total_squared_error"])]
    chosen = frame[frame["chosen"]].iloc[0]
    assert chosen["expected_total_squared_error"] == usable["expected_total_squared_error"].min()
    assert set(frame["strategy"]) == {"identity", "workload", "hierarchical", "wavelet", "fourier", "optimized"}
    assert "binary" in frame.loc[frame["strategy"] == "fourier", "note"].iloc[0]
    # The bound never exceeds an expected error, and the printed plan says both.
    assert (usable["ratio_to_bound"] >= 1 - 1e-9).all()
    text = "\n".join(alg.describe_plan(plan))
    assert "SVD lower bound" in text and "optimized" in text
    assert plan.steps[0].share == 1 and plan.steps[0].query is plan.details.strategy
    assert plan.steps[0].law.variance * trace_term(plan.details.workload, plan.details.strategy) == \
        pytest.approx(plan.details.expected_error)


def test_papers_bound_is_printed_with_its_delta(ages):
    dom, _ = ages
    _, plan = _plan(dom, Budget.approx(1, "1/1000"), workload=WorkloadSpec("prefix", attrs=("age",)))
    d = plan.details
    assert d.paper_delta == Fraction(1, 1000)
    assert d.paper_bound == pytest.approx(2 * np.log(2000) * d.svd_bound)
    assert d.bound == pytest.approx(d.noise_constant * d.svd_bound)
    _, pure = _plan(dom, Budget.pure(1), workload=WorkloadSpec("prefix", attrs=("age",)), bound_delta=Fraction(1, 400))
    assert pure.details.paper_bound == pytest.approx(2 * np.log(800) * pure.details.svd_bound)
    assert pure.details.noise_constant == pytest.approx(2.0)


def test_named_and_given_strategies(ages):
    dom, _ = ages
    _, plan = _plan(dom, Budget.pure(1), workload=WorkloadSpec("prefix", attrs=("age",)), strategy="identity")
    assert plan.details.chosen == "identity" and len(plan.details.candidates) == 1
    given = Hierarchical(dom, "age", 3)
    _, plan = _plan(dom, Budget.pure(1), workload=Prefix(dom, "age"), strategy=given)
    assert plan.details.strategy is given
    with pytest.raises(ParameterError, match="no candidate applies"):
        _plan(dom, Budget.pure(1), workload=Prefix(dom, "age"), strategy=Marginal(dom, ["sex"]))


def test_parameters_are_validated():
    good = {"workload": WorkloadSpec("identity")}
    for bad, match in [({"strategy": "magic"}, "strategy"), ({"candidates": ("identity", "nope")}, "candidates"),
                       ({"template": "x"}, "template"), ({"p": 0}, "p must"), ({"branching": 1}, "branching"),
                       ({"mechanism": "cauchy"}, "mechanism"), ({"objective": "linf"}, "objective"),
                       ({"bound_delta": Fraction(2)}, "bound_delta"), ({"time_limit": -1}, "time_limit")]:
        with pytest.raises(ParameterError, match=match):
            MatrixMechanismParams(**good, **bad)
    with pytest.raises(ParameterError, match="workload"):
        MatrixMechanismParams()
    with pytest.raises(ParameterError, match="count"):
        WorkloadSpec("random_ranges", attrs=("a",))
    with pytest.raises(ParameterError, match="order 3"):
        WorkloadSpec("all_marginals", k=3).build(Domain(("a", "b"), (2, 2)))


def test_registered_under_its_name():
    assert get_algorithm("matrix_mechanism") is MatrixMechanism
    assert REGISTRY["matrix_mechanism"] is MatrixMechanism
    assert get_algorithm("matrix-mechanism") is MatrixMechanism


# ---- the privacy contract --------------------------------------------------------------------------------
@pytest.mark.parametrize("budget", [Budget.pure("1/2"), Budget.approx(1, "1/10000"), Budget.zcdp("1/4"),
                                    Budget.zcdp_from_approx(1, "1/100000")])
def test_ledger_sums_to_the_budget_and_a_seed_reproduces(ages, budget):
    dom, data = ages
    alg, plan = _plan(dom, budget, workload=WorkloadSpec("all_marginals", k=(1, 2)))
    acct = budget.accountant()
    first = alg.run(plan, data, acct, make_random(5))
    assert isinstance(first, Release) and first.status is Status.OPTIMAL and first.success
    assert acct.spent == acct.total
    second = alg.run(plan, data, budget.accountant(), make_random(5))
    np.testing.assert_array_equal(first.counts, second.counts)


def test_over_budget_raises_before_any_draw(ages):
    dom, data = ages
    alg, plan = _plan(dom, Budget.pure(1), workload=WorkloadSpec("prefix", attrs=("age",)))
    rng = CountingRandom(3)
    with pytest.raises(BudgetExceededError):
        alg.run(plan, data, Budget.pure("1/2").accountant(), rng)
    assert rng.drawn == 0


# ---- constrained reconstruction --------------------------------------------------------------------------
def test_constrained_reconstruction_keeps_zeros_invariants_and_integrality(ages):
    dom, data = ages
    cs = (ConstraintSet(dom).add(NonNegativity()).add(StructuralZeros("age == 0 and sex == 1", name="no-0-1"))
          .add(Invariant(Total(dom), [float(data.total)], "total")).add(Integrality()))
    alg, plan = _plan(dom, Budget.pure("1/4"), cs, workload=WorkloadSpec("prefix", attrs=("age",)))
    rel = alg.run(plan, data, Budget.pure("1/4").accountant(), make_random(2))
    assert rel.status is Status.OPTIMAL, rel.message
    table = rel.counts.reshape(12, 2)
    assert rel.counts.dtype == np.int64 and table[0, 1] == 0 and rel.counts.sum() == data.total
    assert (rel.counts >= 0).all()
    assert "stderr" not in rel.answers["workload"]
    table = rel.reconstruction.constraint_residuals  # before rounding: all but integrality hold
    assert table.loc[~table["constraint"].str.startswith("integer"), "max_violation"].max() <= 1e-6
    assert rel.rounding.max_violation <= 1e-6


def test_nonnegative_projection_is_better_than_the_unconstrained_estimate_on_sparse_data():
    """A non-negative least-squares fit never increases the error in the strategy's metric, and on
    data with many empty cells it lowers the workload's error (averaged over seeds)."""
    dom = Domain(("x",), (40,))
    counts = np.zeros(40, dtype=np.int64)
    counts[[3, 17, 18]] = [50, 20, 5]
    data = Dataset.from_histogram(counts, dom)
    budget = Budget.pure("1/2")
    options = dict(workload=WorkloadSpec("all_ranges", attrs=("x",)), strategy="hierarchical")
    free, plan_free = _plan(dom, budget, **options)
    nonneg, plan_nn = _plan(dom, budget, ConstraintSet(dom).add(NonNegativity()), **options)
    W = plan_free.details.workload
    truth = W.answer(data)
    err_free, err_nn = [], []
    for seed in range(12):
        a = free.run(plan_free, data, budget.accountant(), make_random(seed))
        b = nonneg.run(plan_nn, data, budget.accountant(), make_random(seed))
        assert (b.counts >= -1e-9).all()
        err_free.append(((W.matvec(a.counts) - truth) ** 2).sum())
        err_nn.append(((W.matvec(b.counts) - truth) ** 2).sum())
    assert np.mean(err_nn) < np.mean(err_free)


def test_example_params_run_on_small_domains(ages):
    for dom in (ages[0], Domain(tuple("abcd"), (2, 2, 2, 2)), Domain(("z",), (5,))):
        params = MatrixMechanism.example(dom)
        alg = MatrixMechanism(params)
        plan = alg.plan(dom, ConstraintSet(dom), Budget.pure(1))
        data = Dataset.from_histogram(np.arange(dom.size) % 4, dom)
        rel = alg.run(plan, data, Budget.pure(1).accountant(), make_random(1))
        assert rel.status is Status.OPTIMAL
