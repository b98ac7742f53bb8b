"""Rounds for pairs (dpopt.strategy.wide_selection, module notes *Rounds for pairs*, issue 27): a
workload of pairs selects 2d rounds when a round's expected measurement noise (public) is at most
half the probe's noisy deviation, and d otherwise; triples and an explicit ``rounds`` never take
the option; under pure epsilon a workload of pairs fitted by least squares measures "all" only below
half the deviation. The ledger sums exactly to the budget with the doubled rounds, and each round's
exponential mechanism and measurement are charged (in that order) before the next draw."""

import math
from fractions import Fraction
from itertools import combinations

import pytest

from dpopt.datasets.bayes_net import random_sparse_network
from dpopt.model.domain import Domain
from dpopt.privacy.budget import Budget
from dpopt.privacy.randomness import make_random
from dpopt.strategy import wide_selection as ws


@pytest.fixture(scope="module")
def pairs10():
    data = random_sparse_network(10, seed=3).sample(20000, 1)
    return data, list(combinations(data.domain.attrs, 2))


def _ledger_sum(accountant, component):
    return sum(accountant.ledger_frame()[component], Fraction(0))


@pytest.mark.parametrize("budget", [Budget.pure(2), Budget.zcdp(Fraction(1, 2))], ids=["pure", "zcdp"])
def test_pairs_select_twice_the_rounds_where_a_round_is_cheap_and_the_ledger_is_exact(pairs10, budget):
    data, pairs = pairs10
    plan = ws.plan_wide_selection(data.domain, pairs, budget, budget.noise(None))
    assert plan.more_rounds == 2 * len(data.domain.attrs) == 20 and plan.rounds == 10
    accountant = budget.accountant()
    run = ws.run_wide_selection(plan, data, accountant, make_random(3), mode="select")
    assert ws.more_rounds_pay(plan.expected_noise_more_rounds, run.deviation)
    assert run.rounds == 20 and len(run.chosen) == 20 == len(set(run.chosen))
    component = "rho" if budget.accounting == "zcdp" else "epsilon"
    assert _ledger_sum(accountant, component) == getattr(budget.total, component)  # exact, as Fractions
    labels = list(accountant.ledger_frame()["label"])
    top = int(labels[2] == "one-way marginals (selection's top-up)")
    # Each pick is charged, then measured and charged, before the next round's draw.
    assert labels[2 + top:] == [x for t in range(1, 21) for x in (
        f"wide selection round {t}", f"selected {', '.join(run.chosen[t - 1])}")]
    select = list(accountant.ledger_frame()[component][2 + top::2])
    assert all(c == select[0] for c in select)  # equal rounds: each 1/20 of what the top-up leaves
    assert run.info()["rounds"] == 20


@pytest.mark.parametrize("budget", [Budget.pure(Fraction(1, 40)), Budget.zcdp(Fraction(1, 5000))],
                         ids=["pure", "zcdp"])
def test_pairs_keep_d_rounds_where_a_round_of_twice_as_many_is_too_noisy(pairs10, budget):
    data, pairs = pairs10
    plan = ws.plan_wide_selection(data.domain, pairs, budget, budget.noise(None))
    for seed in (1, 2, 3):
        accountant = budget.accountant()
        run = ws.run_wide_selection(plan, data, accountant, make_random(seed), mode="select")
        assert not ws.more_rounds_pay(plan.expected_noise_more_rounds, run.deviation)
        assert run.rounds == 10 == len(run.chosen)
        component = "rho" if budget.accounting == "zcdp" else "epsilon"
        assert _ledger_sum(accountant, component) == getattr(budget.total, component)


def test_the_option_is_for_pairs_at_the_default_rounds_only(pairs10):
    data, pairs = pairs10
    budget = Budget.pure(2)
    triples = list(combinations(data.domain.attrs, 3))
    assert ws.plan_wide_selection(data.domain, triples, budget, "laplace").more_rounds == 0
    assert ws.plan_wide_selection(data.domain, triples[:5] + pairs, budget, "laplace").more_rounds == 0
    assert ws.plan_wide_selection(data.domain, pairs, budget, "laplace", rounds=10).more_rounds == 0
    # Never more rounds than candidates (each round measures a new one): 4 attributes, 6 pairs.
    four = Domain(("a", "b", "c", "d"), (2, 2, 2, 2))
    assert ws.plan_wide_selection(four, list(combinations(four.attrs, 2)), budget, "laplace").more_rounds == 6


def test_the_expected_noise_of_the_doubled_rounds_against_its_closed_form():
    """Laplace: a round's measurement of a binary pair (sensitivity 1) has E|z| = b = 1 / epsilon_m,
    epsilon_m = (1 - SELECT_SHARE) (1 - ONE_WAY_SHARE - PROBE_SHARE - x) epsilon / (2d), x the top-up
    for 2d rounds at phi = 1; the expected L1 noise is 4 b. Gaussian: 4 sqrt(2/pi) sigma with
    sigma^2 = 1 / (2 rho_m), rho_m what the round's share leaves after the exponential mechanism's
    eps^2 / 2."""
    domain = Domain(tuple(f"a{i}" for i in range(27)), (2,) * 27)
    pairs = list(combinations(domain.attrs, 2))
    left = 1 - ws.ONE_WAY_SHARE - ws.PROBE_SHARE
    pure = ws.plan_wide_selection(domain, pairs, Budget.pure(1), "laplace")
    x = ws.one_way_top_up(domain, pure.candidates, 54, "pure")
    eps_m = (1 - ws.SELECT_SHARE) * (left - x) / 54
    assert pure.more_rounds == 54
    assert pure.expected_noise_more_rounds == pytest.approx(4 / float(eps_m), rel=1e-12)
    rho = Fraction(1, 2)
    zcdp = ws.plan_wide_selection(domain, pairs, Budget.zcdp(rho), "gaussian")
    x = ws.one_way_top_up(domain, zcdp.candidates, 54, "zcdp")
    per_round = rho * (left - x) / 54
    _, measure_cost, eps = ws._round_costs(ws.PrivacyCost.zcdp(per_round), "zcdp", ws.SELECT_SHARE)
    assert float(measure_cost.rho) == pytest.approx(float(per_round) - float(eps) ** 2 / 2, rel=1e-12)
    assert zcdp.expected_noise_more_rounds == pytest.approx(
        4 * math.sqrt(2 / math.pi) * math.sqrt(1 / (2 * float(measure_cost.rho))), rel=1e-9)
    e = pure.expected_noise_more_rounds
    assert ws.more_rounds_pay(e, 2 * e) and not ws.more_rounds_pay(e, 2 * e * (1 - 1e-9))
    assert "27 rounds (or 54, each 1/2 as large, if the expected noise" in "\n".join(pure.lines())


def test_pure_epsilon_pairs_fitted_by_least_squares_measure_all_below_half_the_deviation():
    """Every pair of 27 binary attributes: "all" is fitted by least squares (a 2^27-cell tree). Under
    pure epsilon the half applies (ALL_L2_NOISE_FRACTION); under zCDP pairs keep AIM's criterion; a
    smooth fit of "all" (a chain of pairs) or least squares forced for both keep it too."""
    domain = Domain(tuple(f"a{i}" for i in range(27)), (2,) * 27)
    pairs = list(combinations(domain.attrs, 2))
    pure = ws.plan_wide_selection(domain, pairs, Budget.pure(1), "laplace")
    assert pure.all_fit.objective == "l2" and pure.all_fraction == ws.ALL_L2_NOISE_FRACTION == Fraction(1, 2)
    approx = ws.plan_wide_selection(domain, pairs, Budget.approx(1, Fraction(1, 10**6)), "laplace")
    assert approx.all_fraction == Fraction(1, 2)
    assert ws.plan_wide_selection(domain, pairs, Budget.zcdp(Fraction(1, 2)), "gaussian").all_fraction == 1
    chain = [(domain.attrs[i], domain.attrs[i + 1]) for i in range(26)]
    assert ws.plan_wide_selection(domain, chain, Budget.pure(1), "laplace").all_fraction == 1
    forced = ws.plan_wide_selection(domain, pairs, Budget.pure(1), "laplace", fit={"objective": "l2"})
    assert forced.all_fraction == 1
