"""What to measure on wide domains (dpopt.strategy.wide_selection, issue 27): the ledger sums
exactly to the budget on both paths and under pure eps and zCDP, the selection's scores and its
exponential mechanism match their closed forms on a tiny case, and ``auto`` under pure eps on 30
attributes selects, runs from a spec and never allocates the table."""

from fractions import Fraction
from itertools import combinations

import numpy as np
import pytest
from scipy import stats

from dpopt.datasets.bayes_net import random_sparse_network
from dpopt.estimate.marginal_space import estimate_marginals
from dpopt.model.data import Dataset
from dpopt.model.domain import Domain
from dpopt.privacy.budget import Budget
from dpopt.privacy.mechanisms import exponential_mechanism
from dpopt.privacy.randomness import make_random
from dpopt.release import plan
from dpopt.strategy.wide_selection import (
    _Model,
    plan_wide_selection,
    run_wide_selection,
    selection_probabilities,
    selection_scores,
)

from .test_wide_specs import PEAK_BYTES, run_measuring_memory

D = 30


@pytest.fixture(scope="module")
def small():
    net = random_sparse_network(8, seed=3)
    data = net.sample(2000, 1)
    return data, list(combinations(data.domain.attrs, 3))


def _ledger_sum(accountant, component):
    return sum(accountant.ledger_frame()[component], Fraction(0))


@pytest.mark.parametrize("budget", [Budget.pure(Fraction(1, 2)), Budget.zcdp(Fraction(1, 8)),
                                    Budget.approx(Fraction(1, 2), Fraction(1, 10**6)),
                                    Budget.zcdp_from_approx(1, Fraction(1, 10**6))],
                         ids=["pure", "zcdp", "approx", "zcdp-from-approx"])
@pytest.mark.parametrize("mode", ["all", "select", "anneal", "top-up"])
def test_the_ledger_sums_exactly_to_the_budget(small, budget, mode):
    data, workload = small
    p = plan_wide_selection(data.domain, workload, budget, budget.noise(None), rounds=5, anneal=mode == "anneal",
                            top_up=Fraction(1, 5) if mode == "top-up" else None)
    forced_top_up = mode == "top-up"
    mode, anneal = ("select", mode == "anneal") if mode in ("anneal", "top-up") else (mode, False)
    component = "rho" if budget.accounting == "zcdp" else "epsilon"
    planned = sum((getattr(s.budget, component) for s in p.steps()), Fraction(0))
    assert planned == getattr(budget.total, component)
    assert sum((s.share for s in p.steps()), Fraction(0)) == 1
    accountant = budget.accountant()
    out = run_wide_selection(p, data, accountant, make_random(3), mode=mode)
    assert _ledger_sum(accountant, component) == getattr(budget.total, component)  # exact, as Fractions
    if budget.accounting == "approx":
        assert _ledger_sum(accountant, "delta") == budget.total.delta
    labels = list(accountant.ledger_frame()["label"])
    assert labels[:2] == ["one-way marginals", "wide selection: deviation probe"]
    if mode == "select":
        top = int(labels[2] == "one-way marginals (selection's top-up)")
        assert top or not forced_top_up
        rounds = len(out.chosen)
        assert (rounds == 5 if not anneal else 1 <= rounds <= 5) and len(set(out.chosen)) == rounds
        assert labels[2 + top:] == [x for t in range(1, rounds + 1) for x in (
            f"wide selection round {t}", f"selected {', '.join(out.chosen[t - 1])}")]
        if not anneal:   # equal rounds: every exponential mechanism costs the same
            select = list(accountant.ledger_frame()[component][2 + top::2])
            assert all(c == select[0] for c in select)
        assert all(any(set(c) <= set(w) for w in workload) for c in out.chosen)
    else:
        assert len(out.measurements) == len(data.domain.attrs) + len(workload) and not out.chosen


def test_a_plan_the_accountant_cannot_afford_is_refused_before_any_charge(small):
    data, workload = small
    budget = Budget.pure(1)
    p = plan_wide_selection(data.domain, workload, budget, "laplace")
    accountant = Budget.pure(Fraction(1, 2)).accountant()
    with pytest.raises(Exception, match="wide selection plan needs"):
        run_wide_selection(p, data, accountant, make_random(1))
    assert accountant.ledger_frame().empty


def test_scores_and_the_exponential_mechanism_against_closed_forms():
    """Three binary attributes, eight records: the scores are hand-computed L1 deviations from
    the product of the one-way marginals (minus the public noise penalty), and the pick follows
    exp(eps q / 2) / Z (chi-square over 6,000 draws)."""
    domain = Domain(["a", "b", "c"], [2, 2, 2])
    codes = np.array([[0, 0, 0], [0, 0, 1], [0, 0, 0], [1, 1, 1], [1, 1, 0], [1, 1, 1], [0, 1, 0], [1, 0, 1]])
    data = Dataset(codes, domain)
    n = 8.0
    one_way = {(a,): data.marginal([a]).astype(float) for a in domain.attrs}   # a: 4/4, b: 4/4, c: 4/4
    model = _Model(domain, one_way, n)
    pairs = [("a", "b"), ("a", "c"), ("b", "c")]
    true = [data.marginal(list(p)) for p in pairs]
    modelled = [model.counts(p) for p in pairs]
    np.testing.assert_allclose(modelled, 2.0)                        # n * 1/2 * 1/2 on every cell
    # ab = [3, 1, 1, 3]: |3-2|+|1-2|+|1-2|+|3-2| = 4; ac = [3, 1, 1, 3] -> 4; bc = [2, 2, 2, 2] -> 0
    penalty = np.array([0.5, 0.5, 0.5])
    scores = selection_scores(true, modelled, penalty)
    np.testing.assert_allclose(scores, [3.5, 3.5, -0.5])
    eps = Fraction(3, 2)
    closed = selection_probabilities(scores, eps)
    w = np.exp(0.75 * np.array([3.5, 3.5, -0.5]))
    np.testing.assert_allclose(closed, w / w.sum())
    rng = make_random(11)
    accountant = Budget.pure(10**4).accountant()
    draws = np.array([exponential_mechanism(scores, eps, accountant, rng) for _ in range(6000)])
    observed = np.bincount(draws, minlength=3)
    assert stats.chisquare(observed, 6000 * closed).pvalue > 1e-3
    # Once ab is measured, ac's model is the measured ab times c's one-way law: a chain through a.
    model.add(("a", "b"), true[0].astype(float))
    abc = model.counts(("a", "b", "c")).reshape(2, 2, 2)
    np.testing.assert_allclose(abc, true[0].reshape(2, 2)[:, :, None] * np.array([0.5, 0.5]))
    model.add(("b", "c"), true[2].astype(float))
    abc = model.counts(("a", "b", "c")).reshape(2, 2, 2)
    ab, bc = true[0].reshape(2, 2) / n, true[2].reshape(2, 2) / n
    np.testing.assert_allclose(abc, n * ab[:, :, None] * bc[None, :, :] / ab.sum(axis=0)[None, :, None])


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_pure_epsilon_auto_selects_on_30_attributes_without_the_table():
    """Issue 27: under pure eps the workload-first plan on 10^9 cells measures a few marginals
    chosen privately (d, not all 435), never allocates the table, spends exactly the budget, and
    answers every pair with less than half the uniform table's mean error."""
    net = random_sparse_network(D, seed=4)
    data = net.sample(4000, 5)
    spec = {"name": "wide-pure", "domain": {"attributes": {a: 2 for a in net.domain.attrs}},
            "data": {"source": "file"}, "privacy": {"accounting": "pure", "epsilon": 1},
            "workload": {"marginals": "all 2-way"}}
    p = plan(spec, data=data)
    assert "exponential-mechanism" in p.describe()
    release, peak = run_measuring_memory(spec, data)
    assert peak < PEAK_BYTES, f"peak {peak / 2**20:.0f} MiB"
    info = release.info["wide_selection"]
    assert release.success and info["mode"] == "select" and len(info["chosen"]) == D
    assert sum(release.accountant.ledger_frame()["epsilon"], Fraction(0)) == 1
    assert len(release.answers) == D * (D - 1) // 2
    n = data.total
    err, uniform, independent = [], [], []
    for attrs in combinations(data.domain.attrs, 2):
        truth = data.marginal(list(attrs))
        fitted = release.answers[", ".join(attrs)]["count"].to_numpy(dtype=float)
        err.append(np.abs(fitted - truth).sum() / n)
        uniform.append(np.abs(n / 4 - truth).sum() / n)
        one = [data.marginal([a]) / n for a in attrs]
        independent.append(np.abs(n * np.outer(*one).ravel() - truth).sum() / n)
    # Measuring every pair instead (the plan before selection), same budget and shares:
    budget = Budget.pure(1)
    every = run_wide_selection(plan_wide_selection(data.domain, list(combinations(data.domain.attrs, 2)), budget,
                                                   "laplace"), data, budget.accountant(), make_random(2), mode="all")
    fit = estimate_marginals(every.measurements, list(combinations(data.domain.attrs, 2)))
    all_err = [np.abs(np.asarray(v) - data.marginal(list(s))).sum() / n for s, v in fit.marginals().items()]
    print(f"mean error {np.mean(err):.4f}, all measured {np.mean(all_err):.4f}, uniform {np.mean(uniform):.4f}, "
          f"independent (exact one-way) {np.mean(independent):.4f}")
    assert np.mean(err) < 0.5 * np.mean(all_err) and np.mean(err) < 0.2 * np.mean(uniform)


@pytest.mark.parametrize("accounting", ["pure", "zcdp"])
def test_the_one_way_top_up_minimises_its_expected_error(accounting):
    """one_way_top_up's share against a continuous minimiser of the docstring's expected error
    (binary pairs, d = 100, T = d): the grid's answer is within its step of it; no model noise
    (noise_fraction 0) asks for no top-up, and more noise asks for more."""
    from scipy.optimize import minimize_scalar

    from dpopt.strategy.wide_selection import ONE_WAY_SHARE, PROBE_SHARE, SELECT_SHARE, one_way_top_up

    d = 100
    domain = Domain([f"x{i}" for i in range(d)], [2] * d)
    candidates = list(combinations(domain.attrs, 2))
    s, r, spread = float(ONE_WAY_SHARE), float(1 - PROBE_SHARE), d / float(1 - SELECT_SHARE)
    if accounting == "pure":   # A / sqrt(s^2 + x^2) + B / (r - s - x), A = d * 4, B = 4 * T / (1 - select)
        f = lambda x: d * 4 / np.sqrt(s * s + x * x) + 4 * spread / (r - s - x)  # noqa: E731
    else:                      # a / sqrt(s + x) + b / sqrt(r - s - x), a = sqrt(d) * 4, b = 4 sqrt(T / (1 - select))
        f = lambda x: np.sqrt(d) * 4 / np.sqrt(s + x) + 4 * np.sqrt(spread) / np.sqrt(r - s - x)  # noqa: E731
    best = minimize_scalar(f, bounds=(0, r - s - 1e-9), method="bounded", options={"xatol": 1e-9}).x
    x = one_way_top_up(domain, candidates, d, accounting)
    assert abs(float(x) - best) <= 1e-3 and x.denominator <= 1000
    assert one_way_top_up(domain, candidates, d, accounting, noise_fraction=0) == 0
    shares = [one_way_top_up(domain, candidates, d, accounting, noise_fraction=phi) for phi in (0.1, 0.5, 1)]
    assert shares == sorted(shares) and shares[0] < shares[-1]


def test_beyond_the_candidate_limit_the_run_reads_a_data_independent_pool(monkeypatch):
    """Issue 27 (d = 100 triples: 161,700 candidates): beyond CANDIDATE_LIMIT the probe and the
    selection read every pair and a uniform sample of the larger sets, never the rest; the pool is a
    function of the candidates and the rng only (never of the data); the ledger stays exact;
    and the probe's statistic over the pool moves by at most 1 when one record is added."""
    import dpopt.strategy.wide_selection as ws

    monkeypatch.setattr(ws, "CANDIDATE_LIMIT", 100)
    net = random_sparse_network(12, seed=2)
    data = net.sample(3000, 4)
    workload = list(combinations(data.domain.attrs, 3))   # 220 triples + 66 pairs = 286 candidates
    budget = Budget.pure(Fraction(1, 2))
    p = plan_wide_selection(data.domain, workload, budget, "laplace", rounds=6)
    assert len(p.candidates) == 286
    reads = []

    class Counting(Dataset):
        def marginal(self, attrs):
            reads.append(tuple(attrs))
            return super().marginal(attrs)

    counted = Counting(data.codes, data.domain)
    accountant = budget.accountant()
    out = run_wide_selection(p, counted, accountant, make_random(5), mode="select")
    assert sum(accountant.ledger_frame()["epsilon"], Fraction(0)) == budget.total.epsilon
    read_sets = {r for r in reads if len(r) >= 2}
    assert len(read_sets) == 100
    assert sum(len(r) == 2 for r in read_sets) == 66 and set(out.chosen) <= read_sets
    pool = ws._candidate_pool(p.candidates, make_random(5))
    other = ws._candidate_pool(p.candidates, make_random(5))
    assert pool == other and len(pool) == 100 and len(set(pool)) == 100
    # The probe's statistic (before rounding and noise) on neighbours: |difference| <= 1.
    one_way = {(a,): data.marginal([a]).astype(float) + 0.5 for a in data.domain.attrs}  # any fixed model
    model = _Model(data.domain, one_way, data.total)
    bigger = Dataset(np.vstack([data.codes, data.codes[:1] ^ 1]), data.domain)

    def statistic(d):
        return np.mean([np.abs(d.marginal(list(c)) - model.counts(c)).sum() for c in pool])

    assert abs(statistic(bigger) - statistic(data)) <= 1 + 1e-9
