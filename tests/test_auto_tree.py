"""The adaptive dense candidate of ``auto`` (dpopt.strategy.tree_selection, issue 25): the ledger
is exact under pure ε and zCDP and an unaffordable run is refused before any charge or draw; the
scores and the exponential mechanism match their closed forms on a tiny case and the edges make a
spanning tree; the release reads nothing of the data beyond the charged marginals; zeros and
invariants hold; the charge's pair probability is a spanning tree's, by brute force."""

from fractions import Fraction
from itertools import combinations, product

import numpy as np
import pandas as pd
import pytest
from scipy import stats

import dpopt.privacy.mechanisms as mechanisms
from dpopt.algorithms.auto import Auto, AutoParams
from dpopt.errors import BudgetExceededError, ParameterError
from dpopt.model.constraints import ConstraintSet, Invariant, StructuralZeros
from dpopt.model.data import Dataset
from dpopt.model.domain import Domain
from dpopt.model.queries import Marginal
from dpopt.privacy.accountant import Accountant
from dpopt.privacy.budget import Budget
from dpopt.privacy.randomness import SeededRandom
from dpopt.spec.workload import WorkloadDeclaration
from dpopt.strategy.candidates import CANDIDATES, DEFAULT_CANDIDATES, compare_candidates
from dpopt.strategy.tables import Workload
from dpopt.strategy.tree_selection import plan_tree, run_tree, tree_charge, tree_probabilities, tree_scores

from .algorithms import test_conformance as conformance
from .algorithms.test_conformance import CountingRandom

BUDGETS = [Budget.pure(Fraction(1, 2)), Budget.zcdp(Fraction(1, 8))]


def chain_data(d: int = 5, n: int = 600, seed: int = 0) -> Dataset:
    """A binary chain: each attribute copies the previous one with probability 0.8 (test input)."""
    gen = np.random.default_rng(seed)
    cols = [gen.integers(0, 2, n)]
    for _ in range(d - 1):
        flip = gen.random(n) < 0.2
        cols.append(np.where(flip, 1 - cols[-1], cols[-1]))
    domain = Domain.from_dict({f"a{i}": 2 for i in range(d)})
    return Dataset.from_frame(pd.DataFrame(np.array(cols).T, columns=domain.attrs), domain)


def forced_tree(k: int = 3) -> Auto:
    return Auto(AutoParams(WorkloadDeclaration(k=k), strategy="tree"))


@pytest.mark.parametrize("budget", BUDGETS, ids=["pure", "zcdp"])
def test_the_ledger_sums_exactly_to_the_budget(budget):
    data = chain_data()
    component = "rho" if budget.accounting == "zcdp" else "epsilon"
    algorithm = forced_tree()
    p = algorithm.plan(data.domain, ConstraintSet(data.domain), budget)
    assert sum((getattr(s.budget, component) for s in p.steps), Fraction(0)) == getattr(budget.total, component)
    assert sum((s.share for s in p.steps), Fraction(0)) == 1
    accountant = budget.accountant()
    release = algorithm.run(p, data, accountant, SeededRandom(4))
    frame = accountant.ledger_frame()
    assert sum(frame[component], Fraction(0)) == getattr(budget.total, component)  # exact, as Fractions
    d = len(data.domain.attrs)
    assert list(frame["label"]) == (["tree: one-way marginals"] + [f"tree: edge {r + 1}" for r in range(d - 1)]
                                    + ["tree: pairs"])
    assert release.success and len(release.info["tree"]["edges"]) == d - 1


@pytest.mark.parametrize("budget", BUDGETS, ids=["pure", "zcdp"])
def test_an_unaffordable_tree_is_refused_before_any_charge_or_draw(budget):
    data = chain_data()
    p = plan_tree(data.domain, budget.shares({"all": 1})["all"], budget.noise(None))
    smaller = Accountant.pure(Fraction(1, 4)) if budget.accounting == "pure" else Accountant.zcdp(Fraction(1, 16))
    source = CountingRandom(1)
    with pytest.raises(BudgetExceededError):
        run_tree(p, data, smaller, source)
    assert source.drawn == 0 and smaller.ledger == []


def test_approximate_dp_budgets_are_refused_with_a_reason():
    domain = Domain.from_dict({"a": 2, "b": 2})
    with pytest.raises(ParameterError, match="pure epsilon or zCDP"):
        plan_tree(domain, Budget.approx(1, Fraction(1, 10**6)).shares({"all": 1})["all"], "gaussian")


def test_scores_are_the_l1_deviation_from_the_noisy_independence_model():
    one_way = {"a": np.array([30.0, -2.0]), "b": np.array([10.0, 12.0])}
    counts = [np.array([5.0, 7.0, 9.0, 3.0])]
    pa, pb = np.array([1.0, 0.0]), np.array([10.0, 12.0]) / 22.0  # negative counts set to 0, normalised
    total = (28.0 + 22.0) / 2
    model = [total * pa[i] * pb[j] for i, j in product(range(2), range(2))]  # brute force, cell by cell
    assert tree_scores(counts, one_way, [("a", "b")])[0] == pytest.approx(sum(abs(c - m) for c, m in
                                                                              zip(counts[0], model)))


def test_the_exponential_mechanism_draws_edges_with_their_closed_form_law():
    data = chain_data(3, 300, seed=2)
    pairs = list(combinations(data.domain.attrs, 2))
    counts = [data.marginal(list(p)) for p in pairs]
    one_way = {a: data.marginal([a]).astype(float) + np.array([3.0, -3.0]) for a in data.domain.attrs}
    scores = tree_scores(counts, one_way, pairs)
    eps = Fraction(1, 20)
    expected = tree_probabilities(scores, eps)
    assert np.all(expected > 0.05)  # every pair drawn often enough for the test to have power
    accountant, rng, draws = Accountant.pure(10**6), SeededRandom(0), 1200
    seen = np.bincount([mechanisms.exponential_mechanism(scores, eps, accountant, rng) for _ in range(draws)],
                       minlength=len(pairs))
    assert stats.chisquare(seen, expected * draws).pvalue > 1e-3


def test_run_tree_scores_its_own_noisy_model_and_draws_a_spanning_tree(monkeypatch):
    data = chain_data(5, 400, seed=1)
    budget = Budget.pure(2)
    p = plan_tree(data.domain, budget.shares({"all": 1})["all"], "laplace")
    calls = []
    original = mechanisms.exponential_mechanism

    def recording(scores, epsilon, accountant, rng=None, **kw):
        calls.append((np.array(scores), epsilon))
        return original(scores, epsilon, accountant, rng, **kw)

    monkeypatch.setattr(mechanisms, "exponential_mechanism", recording)
    out = run_tree(p, data, budget.accountant(), SeededRandom(3))
    ones = out.measurements[0]
    sizes = np.cumsum([2] * (len(data.domain.attrs) - 1))
    one_way = dict(zip(data.domain.attrs, np.split(np.asarray(ones.values, dtype=float), sizes)))
    pairs = list(combinations(data.domain.attrs, 2))
    full = tree_scores([data.marginal(list(q)) for q in pairs], one_way, pairs)
    assert np.allclose(calls[0][0], full) and all(e == p.round_epsilon for _, e in calls)
    # Kruskal: each round offers exactly the pairs joining two components; d - 1 edges, no cycle.
    parent = {a: a for a in data.domain.attrs}

    def root(a):
        while parent[a] != a:
            a = parent[a]
        return a

    for (scores, _), (i, j) in zip(calls, out.edges):
        offered = [q for q in pairs if root(q[0]) != root(q[1])]
        assert len(scores) == len(offered) and (i, j) in offered
        parent[root(j)] = root(i)
    assert len({root(a) for a in data.domain.attrs}) == 1
    assert [q.attrs for q in out.measurements[1].query.parts] == out.edges


def test_the_release_reads_nothing_beyond_the_one_and_two_way_marginals():
    """Two datasets with the same one- and two-way marginals (they differ by a three-way parity)
    give the same release under the same seed: selection reads only the charged pair marginals,
    the fit only the noisy answers."""
    domain = Domain.from_dict({"a": 2, "b": 2, "c": 2})
    parity = np.array([(-1) ** (i + j + k) for i, j, k in product(range(2), repeat=3)])
    base = np.array([20, 14, 9, 17, 11, 25, 16, 12])
    first, second = Dataset.from_histogram(base + 4 * parity, domain), Dataset.from_histogram(base - 4 * parity, domain)
    for q in [Marginal(domain, s) for s in combinations(domain.attrs, 2)]:
        assert np.array_equal(q.matvec(first.histogram()), q.matvec(second.histogram()))
    releases = []
    for data in (first, second):
        algorithm = forced_tree()
        p = algorithm.plan(domain, ConstraintSet(domain), Budget.zcdp(1))
        releases.append(algorithm.run(p, data, Budget.zcdp(1).accountant(), SeededRandom(8)))
    assert releases[0].info["tree"] == releases[1].info["tree"]
    assert np.array_equal(releases[0].x, releases[1].x)


def test_zeros_and_invariants_hold_on_the_tree_path():
    chain = chain_data(4, 500, seed=3)
    domain = chain.domain
    counts = chain.histogram().reshape((2,) * 4).copy()
    counts[1, 1] = 0  # the records the structural zero forbids are left out
    data = Dataset.from_histogram(counts.ravel(), domain)
    cs = ConstraintSet(domain, [StructuralZeros("a0 == 1 and a1 == 1"),
                                Invariant(Marginal(domain, ("a2",)), data.marginal(["a2"]).astype(float))])
    algorithm = forced_tree(2)
    p = algorithm.plan(domain, cs, Budget.pure(1))
    release = algorithm.run(p, data, Budget.pure(1).accountant(), SeededRandom(2))
    x = release.x
    assert np.all(x[cs.zero_mask()] == 0) and np.all(x >= 0)
    assert np.allclose(Marginal(domain, ("a2",)).matvec(x), data.marginal(["a2"]), atol=1e-6)


@pytest.mark.parametrize("check", ["test_a_seeded_run_is_reproducible",
                                   "test_an_over_budget_run_raises_before_any_random_draw",
                                   "test_every_algorithm_returns_a_release_with_a_status",
                                   "test_declared_zeros_and_invariants_hold_exactly"])
def test_the_forced_tree_passes_the_conformance_suite(check):
    """The registry's conformance checks (tests/algorithms/test_conformance.py), run on the tree
    path (their tiny domain, pure ε; integer output included)."""
    getattr(conformance, check)("auto", AutoParams(WorkloadDeclaration(k=2), strategy="tree"))


def test_the_tree_is_compared_only_when_named():
    domain = Domain.from_dict({f"a{i}": 2 for i in range(14)})
    assert "tree" in CANDIDATES and "tree" not in DEFAULT_CANDIDATES
    w = Workload.all_k_way(domain, 3)
    default = Auto(AutoParams(WorkloadDeclaration(k=3))).plan(domain, ConstraintSet(domain), Budget.pure(1))
    named = Auto(AutoParams(WorkloadDeclaration(k=3), candidates=CANDIDATES)).plan(domain, ConstraintSet(domain),
                                                                                   Budget.pure(1))
    assert sorted(c.name for c in default.details.comparison.candidates) == sorted(DEFAULT_CANDIDATES)
    assert default.details.chosen.name == "lower orders" and named.details.chosen.name == "tree"
    assert len(w.tables) == 364


def test_a_given_pair_is_in_a_spanning_tree_with_chance_two_over_d():
    """The charge's ``2/d`` (module notes) against every spanning tree of K_d, d = 4 and 5."""
    for d in (4, 5):
        nodes = range(d)
        edges = list(combinations(nodes, 2))
        trees = []
        for chosen in combinations(edges, d - 1):
            parent = list(nodes)

            def root(a):
                while parent[a] != a:
                    a = parent[a]
                return a

            ok = True
            for i, j in chosen:
                if root(i) == root(j):
                    ok = False
                    break
                parent[root(j)] = root(i)
            if ok:
                trees.append(chosen)
        assert len(trees) == d ** (d - 2)  # Cayley
        assert sum((0, 1) in t for t in trees) / len(trees) == pytest.approx(2 / d)


def test_before_data_the_tree_is_charged_and_not_taken_where_the_identity_measures_every_pair_better():
    """Pure ε on six binary attributes (the benchmark's shape): the tree's pairs, measured with a
    third of the budget at sensitivity 5, are noisier than the histogram's; the plan says so."""
    domain = Domain.from_dict({f"a{i}": 2 for i in range(6)})
    w = Workload.all_k_way(domain, 3)
    cost = Budget.pure(1).shares({"all": 1})["all"]
    comparison = compare_candidates(w, cost, "laplace", names=CANDIDATES)
    tree = next(c for c in comparison.candidates if c.name == "tree")
    assert tree.applies and not tree.supports and comparison.chosen.name == "identity"
    p = plan_tree(domain, cost, "laplace")
    charged, variances = tree_charge(w, p, comparison.best_unbiased.coordinate_variance)
    assert charged == tree.charged
    # a pair residual: held with chance 2/d at the tree's variance, else the identity's
    vp = p.pairs_law().variance / (domain.size / 4)
    assert variances[("a0", "a1")] == pytest.approx(vp / 3 + 2 / 3 * comparison.best_unbiased.coordinate_variance[
        ("a0", "a1")])
    weights = [t.weight for t in w.tables]
    assert tree.total(weights, charged=True) > comparison.chosen.total(weights)
