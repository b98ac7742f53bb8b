"""The registered polynomial release (Thaler, Ullman, Vadhan 2012), called through plan/run.

Noise-free runs use epsilon = 10^7: every group's discrete Laplace scale is then below 10^-3,
so a non-zero draw has probability below e^-1000 and the release is the exact evaluation.
"""

from __future__ import annotations

import math
from fractions import Fraction
from itertools import combinations

import numpy as np
import pandas as pd
import pytest

from dpopt.algorithms.base import Release, get_algorithm
from dpopt.algorithms.polynomial import Polynomial, PolynomialParams
from dpopt.errors import BudgetExceededError, ParameterError
from dpopt.estimate.status import Status
from dpopt.model.constraints import ConstraintSet
from dpopt.model.data import Dataset
from dpopt.model.domain import Domain
from dpopt.privacy.budget import Budget
from dpopt.privacy.mechanisms import calibrate
from dpopt.privacy.randomness import SeededRandom, make_random

HUGE = 10**7


def _binary_frame(d: int, n: int, rng) -> tuple[pd.DataFrame, Domain]:
    latent = rng.integers(0, 2, (n, 1))
    codes = latent ^ (rng.random((n, d)) < rng.uniform(0.1, 0.4, d))
    names = tuple(f"x{i}" for i in range(d))
    return pd.DataFrame(codes.astype(int), columns=names), Domain(names, (2,) * d)


def _release(data: Dataset, budget: Budget, seed: int = 0, **options):
    alg = Polynomial(**options)
    plan = alg.plan(data.domain, ConstraintSet(data.domain), budget)
    return plan, alg.run(plan, data, budget.accountant(), make_random(seed))


@pytest.fixture
def binary(rng) -> Dataset:
    frame, dom = _binary_frame(6, 400, rng)
    return Dataset.from_frame(frame, dom)


def test_registered():
    assert get_algorithm("polynomial") is Polynomial


@pytest.mark.parametrize("budget", [Budget.pure("1/2"), Budget.approx(1, "1e-6"), Budget.zcdp("1/4")])
@pytest.mark.parametrize("split", ["variance", "paper"])
def test_plan_shares_sum_to_the_budget_and_laws_come_from_calibrate(budget, split):
    dom = Domain(tuple(f"x{i}" for i in range(7)), (2,) * 7)
    plan = Polynomial(workload=3, split=split).plan(dom, ConstraintSet(dom), budget)
    assert sum((s.share for s in plan.steps), Fraction(0)) == 1
    total = budget.total
    for field in ("epsilon", "delta") if budget.accounting != "zcdp" else ("rho",):
        assert sum((getattr(s.budget, field) for s in plan.steps), Fraction(0)) == getattr(total, field)
    for s in plan.steps:
        assert calibrate(s.query, s.budget, budget.noise()) == s.law
        size = int(s.label.split(":")[1]) if ":" in s.label else 0
        # L1 and squared L2 sensitivity alike: one record matches one pattern of every subset.
        assert s.law.sensitivity == math.comb(7, size)
    if split == "paper" and budget.accounting == "pure":
        # Theorem 3.1: one Laplace scale on every coefficient w_m c_T (here |w_m| = 1).
        scales = {round(s.law.scale, 9) for s in plan.steps}
        assert len(scales) == 1


@pytest.mark.parametrize("k, gamma", [(3, None), (4, "1/5"), (5, "1/10")])
def test_noise_free_release_answers_every_disjunction_within_gamma_n(rng, k, gamma):
    frame, dom = _binary_frame(7, 300, rng)
    data = Dataset.from_frame(frame, dom)
    plan, rel = _release(data, Budget.pure(HUGE), workload=k, queries="disjunctions", gamma=gamma)
    got = rel.answers["disjunctions"]
    g = float(plan.details.polynomial.gamma)
    assert (gamma is None) == (g == 0)
    codes = data.codes
    for attrs, count in zip(got["attributes"], got["count"]):
        idx = [dom.axis(a.strip()) for a in attrs.split(",")]
        truth = codes[:, idx].any(axis=1).sum()
        assert abs(count - truth) <= g * truth + 1e-6  # float evaluation of exact counts
    assert len(got) == math.comb(7, k)


@pytest.mark.parametrize("gamma", [None, "1/5"])
def test_noise_free_marginals_and_conjunctions(rng, gamma):
    frame, dom = _binary_frame(6, 300, rng)
    data = Dataset.from_frame(frame, dom)
    plan, rel = _release(data, Budget.pure(HUGE), workload=4, gamma=gamma)
    g = float(plan.details.polynomial.gamma)
    assert len(rel.answers) == math.comb(6, 4)
    for attrs in combinations(dom.attrs, 4):
        released = rel.answers[", ".join(attrs)]
        truth = data.marginal_frame(attrs)
        assert list(released.columns[:4]) == list(attrs)
        assert np.array_equal(released[list(attrs)].to_numpy(), truth[list(attrs)].to_numpy())
        err = np.abs(released["count"].to_numpy() - truth["count"].to_numpy())
        assert err.max() <= g * data.total + 1e-6
        if g == 0:
            assert err.max() < 1e-6
    _, conj = _release(data, Budget.pure(HUGE), workload=3, queries="conjunctions")
    got = conj.answers["conjunctions"]
    for attrs, count in zip(got["attributes"], got["count"]):
        idx = [dom.axis(a.strip()) for a in attrs.split(",")]
        assert abs(count - data.codes[:, idx].all(axis=1).sum()) < 1e-6


def test_noise_free_thresholds(rng):
    frame, dom = _binary_frame(7, 300, rng)
    data = Dataset.from_frame(frame, dom)
    plan, rel = _release(data, Budget.pure(HUGE), workload=5, queries="thresholds", threshold=2, gamma="1/8")
    g = float(plan.details.polynomial.gamma)
    got = rel.answers["thresholds"]
    for attrs, count in zip(got["attributes"], got["count"]):
        idx = [dom.axis(a.strip()) for a in attrs.split(",")]
        assert abs(count - (data.codes[:, idx].sum(axis=1) >= 2).sum()) <= g * data.total + 1e-6


def test_non_binary_attributes_through_the_binary_encoding(rng):
    dom = Domain.from_dict({"age": ["0-17", "18-64", "65+"], "sex": ["F", "M"], "region": 5})
    frame = pd.DataFrame({"age": rng.choice(["0-17", "18-64", "65+"], 500), "sex": rng.choice(["F", "M"], 500),
                          "region": rng.integers(0, 5, 500)})
    data = Dataset.from_frame(frame, dom)
    plan, rel = _release(data, Budget.pure(HUGE), workload=2)
    details = plan.details
    assert details.k == 5  # region (3 bits) with age (2 bits)
    # Patterns that spell an unused code are public zeros, not measured.
    for g in details.groups[1:]:
        assert g.query.num_rows < g.query.num_subsets * 2**g.size or g.size == 1
    for attrs in combinations(dom.attrs, 2):
        released = rel.answers[", ".join(attrs)]
        truth = data.marginal_frame(attrs)
        for a in attrs:  # labelled like the data's own marginal
            assert released[a].astype(str).tolist() == truth[a].astype(str).tolist()
        assert np.allclose(released["count"], truth["count"], atol=1e-6)
    errors = rel.errors(data)
    assert (errors["max_error"] < 1e-6).all()


@pytest.mark.parametrize("budget", [Budget.approx(1, "1e-6"), Budget.zcdp("1/2"), Budget.zcdp_from_approx(1, "1e-6")])
def test_gaussian_accountings(binary, budget):
    plan, rel = _release(binary, budget, workload=2)
    assert {m.noise for m in rel.measurements} == {"discrete_gaussian"}
    ledger = rel.ledger
    spent = rel.accountant.spent
    assert spent == budget.accountant().total
    assert len(ledger) == len(plan.steps)


def test_release_structure(binary):
    budget = Budget.pure(1)
    plan, rel = _release(binary, budget, workload=2)
    assert isinstance(rel, Release) and rel.status is Status.COMPLETED and rel.success
    assert rel.counts is None and rel.x is None
    assert rel.accountant.spent == budget.total
    assert len(rel.answers) == math.comb(6, 2)
    for frame in rel.answers.values():
        assert {"count", "stddev"} <= set(frame.columns)
    assert rel.algorithm == "polynomial" and "Thaler" in rel.reference
    assert rel.info["coefficients"] == plan.details.num_coefficients


def test_seeded_runs_are_reproducible(binary):
    budget = Budget.pure(1)
    alg = Polynomial(workload=2)
    plan = alg.plan(binary.domain, ConstraintSet(binary.domain), budget)
    a = alg.run(plan, binary, budget.accountant(), make_random(7))
    b = alg.run(plan, binary, budget.accountant(), make_random(7))
    c = alg.run(plan, binary, budget.accountant(), make_random(8))
    key = next(iter(a.answers))
    assert a.answers[key].equals(b.answers[key])
    assert not a.answers[key]["count"].equals(c.answers[key]["count"])


class _CountingSource(SeededRandom):
    def __init__(self):
        super().__init__(0)
        self.calls = 0

    def words(self, n):
        self.calls += 1
        return super().words(n)


def test_over_budget_raises_before_any_draw(binary):
    alg = Polynomial(workload=2)
    plan = alg.plan(binary.domain, ConstraintSet(binary.domain), Budget.pure(1))
    source = _CountingSource()
    with pytest.raises(BudgetExceededError):
        alg.run(plan, binary, Budget.pure("1/2").accountant(), source)
    assert source.calls == 0


@pytest.mark.parametrize("budget", [Budget.pure(2), Budget.zcdp(2)])
def test_noise_matches_its_law(rng, budget):
    """The released counts minus the true ones have the law's mean (0) and variance."""
    frame, dom = _binary_frame(10, 200, rng)
    data = Dataset.from_frame(frame, dom)
    alg = Polynomial(workload=2)
    plan = alg.plan(dom, ConstraintSet(dom), budget)
    group = [g for g in plan.details.groups if g.size == 2][0]
    truth = group.query.answer(data)
    noise = []
    for seed in range(12):
        rel = alg.run(plan, data, budget.accountant(), make_random(seed))
        m = [x for x in rel.measurements if x.label == group.label][0]
        noise.append(m.values - truth)
    noise = np.concatenate(noise)  # 12 x 180 draws
    var = group.law.variance
    assert abs(noise.mean()) < 5 * math.sqrt(var / noise.size)
    # Laplace kurtosis 6 (Gaussian 3): the sample variance has relative s.e. at most sqrt(5 / N) ~ 5%.
    assert 0.75 < noise.var() / var < 1.25


def test_error_bound_holds_and_is_reported(rng):
    frame, dom = _binary_frame(8, 2000, rng)
    data = Dataset.from_frame(frame, dom)
    plan, rel = _release(data, Budget.pure(1), seed=3, workload=3, records=2000)
    errors = rel.errors(data)
    assert set(errors.columns) >= {"max_error", "mean_error", "bound", "within_bound"}
    assert errors["within_bound"].all()
    candidates = plan.details.candidates
    assert list(candidates["degree"]) == [1, 2, 3]
    assert plan.details.polynomial.degree == candidates["degree"][candidates["bound"].idxmin()]
    assert any("Theorem 3.1 bound" in line for line in plan.lines)


def test_consistency_projection_is_consistent_non_negative_and_better(rng):
    frame, dom = _binary_frame(6, 300, rng)
    data = Dataset.from_frame(frame, dom)
    raw, projected = [], []
    for seed in range(4):
        _, rel = _release(data, Budget.pure("1/2"), seed=seed, workload=2, consistency="l2")
        assert rel.reconstruction.status is Status.OPTIMAL
        consistent = rel.info["consistent"]
        assert all(rel.answers[f"consistent: {key}"] is f for key, f in consistent.items())
        assert len(rel.answers) == 2 * len(consistent)
        for key, frame_ in consistent.items():
            assert (frame_["count"] >= -1e-7).all()  # non-negativity to the QP solver's tolerance
        # Consistency: every pair marginal implies the same one-way marginals and total.
        one_way = {}
        for key, f in consistent.items():
            for a in key.split(", "):
                one_way.setdefault(a, []).append(f.groupby(a, observed=True)["count"].sum().to_numpy())
        for sums in one_way.values():
            assert np.allclose(sums, sums[0], atol=1e-5 * data.total)
        errors = rel.errors(data)
        raw.append(errors["mean_error"].mean())
        projected.append(errors["consistent_mean_error"].mean())
    assert np.mean(projected) < np.mean(raw)


def test_example_params_run():
    assert Polynomial.example(Domain(("a", "b"), (2, 2**11))) is None
    assert Polynomial.example(Domain(("a", "b"), (2**6, 2**6))).workload == 1
    dom = Domain(("a", "b", "c"), (2, 3, 2))
    params = Polynomial.example(dom)
    alg = Polynomial(params)
    budget = Budget.pure(1)
    plan = alg.plan(dom, ConstraintSet(dom), budget)
    data = Dataset(np.array([[0, 2, 1], [1, 0, 0], [1, 1, 1]]), dom)
    rel = alg.run(plan, data, budget.accountant(), make_random(0))
    assert rel.success and len(rel.answers) == 3


@pytest.mark.parametrize("options, match", [
    (dict(workload=0), "at least 1"),
    (dict(workload="abc"), "workload must be"),
    (dict(workload=[[]]), "non-empty list"),
    (dict(queries="cells"), "queries must be one of"),
    (dict(gamma=1), r"gamma must be in \[0, 1\)"),
    (dict(gamma="1/10", degree=2), "not both"),
    (dict(construction="exact", degree=2), "neither gamma nor degree"),
    (dict(queries="thresholds"), "threshold goes with"),
    (dict(threshold=2), "threshold goes with"),
    (dict(universe="monotone"), "negated literals"),
    (dict(consistency="l2", queries="disjunctions"), "needs queries"),
    (dict(degree=0), "degree must be a positive integer"),
    (dict(bound_beta=2), "bound_beta"),
    (dict(split="even"), "split must be one of"),
    (dict(construction="chebyshev", queries="thresholds", threshold=2, gamma="1/10"), "disjunction polynomial"),
])
def test_parameter_errors(options, match):
    with pytest.raises(ParameterError, match=match):
        PolynomialParams(**options)


def test_plan_errors():
    dom = Domain.from_dict({"a": 3, "b": 2, "c": 2})
    budget = Budget.pure(1)
    with pytest.raises(ParameterError, match="non-binary"):
        Polynomial(workload=2, queries="disjunctions").plan(dom, ConstraintSet(dom), budget)
    with pytest.raises(ParameterError, match="only 3 attributes"):
        Polynomial(workload=4).plan(dom, ConstraintSet(dom), budget)
    with pytest.raises(ParameterError, match="below the widest"):
        Polynomial(workload=2, k=2).plan(dom, ConstraintSet(dom), budget)
    with pytest.raises(ParameterError, match="'zz'"):
        Polynomial(workload=[["a", "zz"]]).plan(dom, ConstraintSet(dom), budget)
    wide = Domain(tuple(f"x{i}" for i in range(30)), (2,) * 30)
    with pytest.raises(ParameterError, match="consistency projects"):
        Polynomial(workload=2, consistency="l2").plan(wide, ConstraintSet(wide), budget)
