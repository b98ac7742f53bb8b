"""Tests of dpopt.privacy.conversions and dpopt.privacy.accountant."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpopt.errors import BudgetExceededError, PrivacyParameterError
from dpopt.privacy.accountant import Accountant, AdvancedBlock, LedgerEntry, ParallelBudget, PrivacyCost
from dpopt.privacy.conversions import (
    advanced_composition,
    advanced_composition_per_step,
    approx_dp_to_zcdp,
    as_fraction,
    pure_to_zcdp,
    zcdp_to_approx_dp,
)

F = Fraction


# ---------------------------------------------------------------------------------------------
# zCDP -> (epsilon, delta)
# ---------------------------------------------------------------------------------------------


def cks_objective(alpha: np.ndarray, rho: float, delta: float) -> np.ndarray:
    """CKS 2020 Corollary 13 objective, written directly from the paper's statement."""
    return rho * alpha + np.log(1.0 / (alpha * delta)) / (alpha - 1.0) + np.log(1.0 - 1.0 / alpha)


def test_zcdp_to_approx_dp_reference_value():
    assert zcdp_to_approx_dp(F(1, 32), F(1, 1000)) == pytest.approx(0.6880024554878085, abs=1e-12)
    assert zcdp_to_approx_dp(1 / 32, 1e-3) == pytest.approx(0.6880024554878085, abs=1e-12)
    assert zcdp_to_approx_dp("1/32", "0.001") == pytest.approx(0.6880024554878085, abs=1e-12)


@pytest.mark.parametrize(
    "rho, delta",
    [(1 / 32, 1e-3), (1e-4, 1e-9), (0.5, 1e-6), (2.0, 1e-5), (10.0, 0.1), (1e-3, 1e-3), (100.0, 1e-12)],
)
def test_zcdp_to_approx_dp_matches_dense_grid_minimum(rho, delta):
    # Brute force: the objective on a fine log grid of alpha - 1, refined around the best point.
    s = np.logspace(-8, 9, 400_001)
    values = cks_objective(1.0 + s, rho, delta)
    best = int(np.nanargmin(values))
    fine = np.linspace(s[max(best - 1, 0)], s[min(best + 1, s.size - 1)], 200_001)
    grid_min = max(0.0, float(np.nanmin(cks_objective(1.0 + fine, rho, delta))))
    ours = zcdp_to_approx_dp(rho, delta)
    # ours is an infimum with a few-ulp upward rounding allowance: never below the grid by
    # more than grid resolution, never above the grid minimum by more than the allowance.
    assert ours <= grid_min + 1e-12 * max(1.0, grid_min)
    assert ours >= grid_min - 1e-9 * max(1.0, grid_min)


@pytest.mark.parametrize("rho", [1e-12, 1e-6, 1e-3, 1 / 32, 1.0, 100.0, 1e6, 1e12])
@pytest.mark.parametrize("delta", [F(1, 10**400), 1e-300, 1e-10, 1e-3, 0.5, 0.99, 1 - 1e-9])
def test_zcdp_to_approx_dp_never_worse_than_bun_steinke(rho, delta):
    ours = zcdp_to_approx_dp(rho, delta)
    log_inv_delta = 400 * math.log(10) if isinstance(delta, Fraction) else -math.log(delta)
    bun_steinke = rho + 2 * math.sqrt(rho * log_inv_delta)
    assert math.isfinite(ours) and ours >= 0.0
    assert ours <= bun_steinke * (1 + 1e-14)


def test_zcdp_to_approx_dp_small_rho_large_delta_is_zero():
    # rho-zCDP bounds KL by rho, so the total variation is <= sqrt(rho/2) (Pinsker): with
    # sqrt(1e-6 / 2) < 1e-3 the mechanism is (0, 1e-3)-DP, and the CKS bound reaches 0.
    assert zcdp_to_approx_dp(1e-6, 1e-3) == 0.0
    assert zcdp_to_approx_dp(1e-2, 1e-3) > 0.0


def test_zcdp_to_approx_dp_monotone():
    rhos = np.logspace(-5, 3, 60)
    eps = [zcdp_to_approx_dp(r, 1e-6) for r in rhos]
    assert all(b > a for a, b in zip(eps, eps[1:]))
    deltas = np.logspace(-15, -0.5, 60)
    eps = [zcdp_to_approx_dp(0.1, d) for d in deltas]
    assert all(b < a for a, b in zip(eps, eps[1:]))


def test_pure_to_zcdp_exact():
    assert pure_to_zcdp(0.1) == F(1, 200)
    assert pure_to_zcdp(F(2, 3)) == F(2, 9)
    assert isinstance(pure_to_zcdp(1), Fraction)


# ---------------------------------------------------------------------------------------------
# (epsilon, delta) -> zCDP
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("epsilon, delta", [(1, 1e-6), (0.1, 1e-9), (F(1, 3), F(1, 10**5)), (5, 1e-3), (1e-3, 0.25)])
def test_approx_dp_to_zcdp_round_trip_is_safe_and_tight(epsilon, delta):
    rho = approx_dp_to_zcdp(epsilon, delta)
    assert isinstance(rho, Fraction) and rho > 0
    eps = float(F(str(epsilon)) if isinstance(epsilon, float) else F(epsilon))
    assert zcdp_to_approx_dp(rho, delta) <= eps
    assert zcdp_to_approx_dp(float(rho) * (1 + 1e-10), delta) > eps


def test_approx_dp_to_zcdp_monotone():
    by_eps = [approx_dp_to_zcdp(e, 1e-6) for e in (0.1, 0.2, 0.5, 1, 2, 4)]
    assert all(b > a for a, b in zip(by_eps, by_eps[1:]))
    by_delta = [approx_dp_to_zcdp(1, d) for d in (1e-12, 1e-9, 1e-6, 1e-3, 0.1)]
    assert all(b > a for a, b in zip(by_delta, by_delta[1:]))


def test_approx_dp_to_zcdp_beats_bun_steinke_inverse():
    # The Bun-Steinke inverse rho = (sqrt(L + eps) - sqrt(L))^2 is always feasible; CKS is tighter.
    L = math.log(1e6)
    bs = (math.sqrt(L + 1) - math.sqrt(L)) ** 2
    assert float(approx_dp_to_zcdp(1, 1e-6)) > bs


# ---------------------------------------------------------------------------------------------
# Advanced composition
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("eps0, delta0, k, delta_prime", [(0.01, 0, 100, 1e-6), (0.1, 1e-8, 7, 1e-5), (1, 0, 1, 0.5)])
def test_advanced_composition_matches_formula(eps0, delta0, k, delta_prime):
    eps, delta = advanced_composition(eps0, delta0, k, delta_prime)
    by_hand = math.sqrt(2 * k * math.log(1 / delta_prime)) * eps0 + k * eps0 * (math.exp(eps0) - 1)
    assert isinstance(eps, Fraction)
    assert float(eps) == pytest.approx(by_hand, rel=1e-13)
    assert eps >= F(by_hand) * (1 - F(1, 10**14))  # rounded up, so never below the value
    assert delta == k * F(str(delta0)) + F(str(delta_prime))  # exact


@pytest.mark.parametrize(
    "eps0, k, delta_prime",
    [(F(1, 10**40), 3, F(1, 10)), (F(1, 100), 100, F(1, 10**6)), (F(7, 3), 5, F(1, 3)), (F(1, 7), 10**6, F(1, 10**9))],
)
def test_advanced_composition_rounds_up_against_high_precision(eps0, k, delta_prime):
    # Independent reference: 100-digit decimal arithmetic, expm1 by its Taylor series.
    import decimal

    with decimal.localcontext() as ctx:
        ctx.prec = 100
        e0 = Decimal(eps0.numerator) / Decimal(eps0.denominator)
        term, expm1, n = e0, Decimal(0), 1
        while term > Decimal(10) ** -150 * max(expm1, Decimal(10) ** -300):
            expm1 += term
            n += 1
            term = term * e0 / n
        log_inv = -(Decimal(delta_prime.numerator) / Decimal(delta_prime.denominator)).ln()
        reference = Fraction((2 * k * log_inv).sqrt() * e0 + k * e0 * expm1)
    eps, delta = advanced_composition(eps0, 0, k, delta_prime)
    assert eps >= reference  # never under-reported
    assert eps - reference <= reference * F(1, 10**14)  # and only rounded, not inflated
    assert delta == delta_prime


def test_advanced_versus_basic_composition():
    # Small k: basic composition (k * eps0) is cheaper; large k: advanced is cheaper.
    for k in (1, 2, 5):
        eps, _ = advanced_composition(0.1, 0, k, 1e-6)
        assert eps > k * F(1, 10)
    eps, _ = advanced_composition(0.001, 0, 10_000, 1e-6)
    assert eps < 10_000 * F(1, 1000)


@pytest.mark.parametrize("epsilon, delta_prime, k", [(1, 1e-6, 100), (0.5, 1e-9, 10), (10, 1e-3, 1000), (1, 0.5, 1)])
def test_advanced_composition_per_step_inverse(epsilon, delta_prime, k):
    eps0 = advanced_composition_per_step(epsilon, delta_prime, k)
    assert isinstance(eps0, Fraction) and eps0 > 0
    total = as_fraction(epsilon, "epsilon")
    assert advanced_composition(eps0, 0, k, delta_prime)[0] <= total
    assert advanced_composition(eps0 * (1 + F(1, 10**9)), 0, k, delta_prime)[0] > total


# ---------------------------------------------------------------------------------------------
# Validation of the conversions
# ---------------------------------------------------------------------------------------------

BAD_POSITIVE = [0, -1, 0.0, float("nan"), float("inf"), -float("inf"), True, None, "abc", "1/0", [1]]
BAD_DELTA = [0, 1, 1.5, -0.1, float("nan"), float("inf"), False, None, "x"]


@pytest.mark.parametrize("bad", BAD_POSITIVE)
def test_conversions_reject_bad_rho_and_epsilon(bad):
    with pytest.raises(PrivacyParameterError, match="rho"):
        zcdp_to_approx_dp(bad, 1e-6)
    with pytest.raises(PrivacyParameterError, match="epsilon"):
        approx_dp_to_zcdp(bad, 1e-6)
    with pytest.raises(PrivacyParameterError, match="epsilon"):
        pure_to_zcdp(bad)
    with pytest.raises(PrivacyParameterError, match="eps0"):
        advanced_composition(bad, 0, 10, 1e-6)
    with pytest.raises(PrivacyParameterError, match="epsilon"):
        advanced_composition_per_step(bad, 1e-6, 10)


@pytest.mark.parametrize("bad", BAD_DELTA)
def test_conversions_reject_bad_delta(bad):
    with pytest.raises(PrivacyParameterError, match="delta"):
        zcdp_to_approx_dp(0.1, bad)
    with pytest.raises(PrivacyParameterError, match="delta"):
        approx_dp_to_zcdp(1, bad)
    with pytest.raises(PrivacyParameterError, match="delta_prime"):
        advanced_composition(0.1, 0, 10, bad)
    with pytest.raises(PrivacyParameterError, match="delta_prime"):
        advanced_composition_per_step(1, bad, 10)


@pytest.mark.parametrize("bad", [0, -3, 2.0, 2.5, True, None, "3", F(3)])
def test_conversions_reject_bad_k(bad):
    with pytest.raises(PrivacyParameterError, match="k must be an integer"):
        advanced_composition(0.1, 0, bad, 1e-6)
    with pytest.raises(PrivacyParameterError, match="k must be an integer"):
        advanced_composition_per_step(1, 1e-6, bad)


def test_advanced_composition_rejects_bad_delta0_and_vacuous_delta():
    with pytest.raises(PrivacyParameterError, match="delta0"):
        advanced_composition(0.1, -1e-9, 10, 1e-6)
    with pytest.raises(PrivacyParameterError, match="delta0"):
        advanced_composition(0.1, 1, 10, 1e-6)
    with pytest.raises(PrivacyParameterError, match="vacuous"):
        advanced_composition(0.1, 0.2, 5, 1e-6)


def test_as_fraction_reads_decimals_exactly():
    assert as_fraction(0.1, "x") == F(1, 10)
    assert as_fraction(np.float64(0.1), "x") == F(1, 10)
    assert as_fraction(np.float32(0.1), "x") == F(1, 10)
    assert as_fraction(np.int64(3), "x") == 3
    assert as_fraction(" 1/3 ", "x") == F(1, 3)
    assert as_fraction("1e-6", "x") == F(1, 10**6)
    assert as_fraction(Decimal("0.25"), "x") == F(1, 4)
    for bad in (Decimal("NaN"), Decimal("Infinity"), complex(1, 0), "nan", "inf"):
        with pytest.raises(PrivacyParameterError, match="myparam"):
            as_fraction(bad, "myparam")


# ---------------------------------------------------------------------------------------------
# PrivacyCost
# ---------------------------------------------------------------------------------------------


def test_privacy_cost_constructors():
    assert PrivacyCost.pure(0.1) == PrivacyCost(epsilon=F(1, 10))
    assert PrivacyCost.approx("1/2", 1e-6) == PrivacyCost(F(1, 2), F(1, 10**6))
    assert PrivacyCost.zcdp(0.5).rho == F(1, 2)
    both = PrivacyCost.zcdp(F(1, 8), epsilon=2, delta=1e-6)
    assert (both.rho, both.epsilon, both.delta) == (F(1, 8), 2, F(1, 10**6))
    assert PrivacyCost.approx(0, 1e-9).states_approx  # (0, delta) is a statement


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: PrivacyCost.pure(0), "epsilon"),
        (lambda: PrivacyCost.pure(float("nan")), "epsilon"),
        (lambda: PrivacyCost.pure(True), "epsilon"),
        (lambda: PrivacyCost.approx(-1, 1e-6), "epsilon"),
        (lambda: PrivacyCost.approx(1, 1), "delta"),
        (lambda: PrivacyCost.approx(0, 0), "epsilon > 0 or delta > 0"),
        (lambda: PrivacyCost.zcdp(0), "rho"),
        (lambda: PrivacyCost.zcdp(float("inf")), "rho"),
        (lambda: PrivacyCost.zcdp(1, delta=1e-6), "delta given without epsilon"),
        (lambda: PrivacyCost(epsilon="many"), "epsilon"),
        (lambda: PrivacyCost(delta=-0.5), "delta"),
        (lambda: PrivacyCost(rho=-1), "rho"),
    ],
)
def test_privacy_cost_validation(make, match):
    with pytest.raises(PrivacyParameterError, match=match):
        make()


# ---------------------------------------------------------------------------------------------
# Accountant: sequential composition
# ---------------------------------------------------------------------------------------------


def test_ten_charges_of_a_tenth_sum_exactly_to_one():
    acc = Accountant.pure(1)
    for i in range(10):
        entry = acc.charge(PrivacyCost.pure(0.1), f"query {i}")
        assert isinstance(entry, LedgerEntry)
        assert entry.cumulative.epsilon == F(i + 1, 10)
    assert acc.spent.epsilon == 1 and acc.remaining.epsilon == 0
    assert sum(e.cost.epsilon for e in acc.ledger) == acc.total.epsilon
    with pytest.raises(BudgetExceededError, match=r"query 10.*asks epsilon=1/10.*only epsilon=0"):
        acc.charge(PrivacyCost.pure(0.1), "query 10")
    with pytest.raises(BudgetExceededError, match="tiny"):
        acc.charge(PrivacyCost.pure(F(1, 10**30)), "tiny")
    assert len(acc.ledger) == 10 and acc.spent.epsilon == 1  # failed charges changed nothing


def test_thirds_are_exact():
    acc = Accountant.pure("1")
    for i in range(3):
        acc.charge(PrivacyCost.pure("1/3"), f"third {i}")
    assert acc.remaining.epsilon == 0
    assert not acc.can_afford(PrivacyCost.pure(F(1, 10**40)))


def test_approx_accountant_adds_epsilon_and_delta():
    acc = Accountant.approx(1, 1e-6)
    acc.charge(PrivacyCost.approx(0.5, 4e-7), "a")
    acc.charge(PrivacyCost.pure(0.25), "b")
    assert acc.spent == PrivacyCost(F(3, 4), F(4, 10**7))
    # epsilon fits but delta does not: refused, nothing recorded
    with pytest.raises(BudgetExceededError, match=r"'c' asks .*delta=7/10000000"):
        acc.charge(PrivacyCost.approx(0.1, 7e-7), "c")
    assert acc.spent == PrivacyCost(F(3, 4), F(4, 10**7))
    acc.charge(PrivacyCost.approx(0.25, 6e-7), "d")
    assert acc.remaining == PrivacyCost(0, 0)
    assert acc.spent == acc.total


def test_zcdp_accountant_conversions():
    acc = Accountant.zcdp(1)
    entry = acc.charge(PrivacyCost.pure(0.1), "pure under zcdp")
    assert entry.cost.rho == F(1, 200) and entry.requested == PrivacyCost.pure(0.1)
    acc.charge(PrivacyCost.zcdp(F(1, 4)), "gaussian")
    # a cost stating both rho and a pure epsilon is charged the smaller of rho and eps^2/2
    assert acc.charge(PrivacyCost.zcdp(F(1, 2), epsilon=F(1, 2)), "both").cost.rho == F(1, 8)
    assert acc.spent.rho == F(1, 200) + F(1, 4) + F(1, 8)
    with pytest.raises(PrivacyParameterError, match="cannot be charged to a zCDP accountant"):
        acc.charge(PrivacyCost.approx(0.1, 1e-9), "approx under zcdp")


def test_currency_mismatches():
    pure = Accountant.pure(1)
    with pytest.raises(PrivacyParameterError, match="pure-DP accountant"):
        pure.charge(PrivacyCost.zcdp(0.01), "zcdp under pure")
    with pytest.raises(PrivacyParameterError, match="pure-DP accountant"):
        pure.charge(PrivacyCost.approx(0.1, 1e-9), "approx under pure")
    assert pure.charge(PrivacyCost.approx(0.1, 0), "delta zero is pure").cost.epsilon == F(1, 10)
    assert pure.charge(PrivacyCost.zcdp(0.01, epsilon=0.2), "zcdp with pure eps").cost.epsilon == F(1, 5)
    approx = Accountant.approx(1, 1e-5)
    with pytest.raises(PrivacyParameterError, match="also states its"):
        approx.charge(PrivacyCost.zcdp(0.01), "zcdp without eps")
    entry = approx.charge(PrivacyCost.zcdp(0.01, epsilon=0.5, delta=1e-6), "zcdp with eps")
    assert entry.cost == PrivacyCost(F(1, 2), F(1, 10**6))
    assert len(pure.ledger) == 2 and len(approx.ledger) == 1


def test_zcdp_from_approx_reports_epsilon_delta():
    acc = Accountant.zcdp_from_approx(1, 1e-6)
    assert acc.total.rho == approx_dp_to_zcdp(1, 1e-6)
    shares = acc.split({"a": 1, "b": 3})
    for name, share in shares.items():
        acc.charge(share, name)
    assert acc.spent == acc.total and sum(e.cost.rho for e in acc.ledger) == acc.total.rho
    summary = acc.summary()
    assert summary["declared"] == {"epsilon": "1", "delta": "1/1000000"}
    assert summary["epsilon_at_delta"]["spent"] <= 1.0
    assert summary["epsilon_at_delta"]["spent"] == pytest.approx(1.0, abs=1e-9)
    frame = acc.ledger_frame()
    assert frame["cumulative_epsilon_at_delta"].iloc[-1] <= 1.0
    assert frame["cumulative_epsilon_at_delta"].is_monotonic_increasing


# ---------------------------------------------------------------------------------------------
# split / parallel / advanced block
# ---------------------------------------------------------------------------------------------


def test_split_is_exact_and_proportional():
    acc = Accountant.approx(1, 1e-6)
    shares = acc.split({"nation": 1, "state": 2, "county": 0.5, "tract": "1/7"})
    assert sum(s.epsilon for s in shares.values()) == 1
    assert sum(s.delta for s in shares.values()) == F(1, 10**6)
    assert shares["state"].epsilon == 2 * shares["nation"].epsilon
    assert shares["county"].epsilon * 14 == shares["tract"].epsilon * 49
    for name, share in shares.items():
        acc.charge(share, name)
    assert acc.spent == acc.total  # a release spending its whole budget sums exactly to it
    assert sum(e.cost.epsilon for e in acc.ledger) == acc.total.epsilon


def test_split_remaining_versus_total():
    acc = Accountant.zcdp(1)
    acc.charge(PrivacyCost.zcdp(F(1, 2)), "first")
    assert acc.split({"x": 1, "y": 1})["x"] == PrivacyCost(rho=F(1, 4))
    assert acc.split({"x": 1, "y": 1}, of="total")["x"] == PrivacyCost(rho=F(1, 2))
    acc.charge(PrivacyCost.zcdp(F(1, 2)), "second")
    with pytest.raises(BudgetExceededError, match="nothing left"):
        acc.split({"x": 1})


@pytest.mark.parametrize(
    "shares, of, match",
    [
        ({}, "remaining", "shares"),
        ([("a", 1)], "remaining", "shares"),
        ({"a": 0}, "remaining", r"shares\['a'\]"),
        ({"a": -1}, "remaining", r"shares\['a'\]"),
        ({"a": float("nan")}, "remaining", r"shares\['a'\]"),
        ({"a": "lots"}, "remaining", r"shares\['a'\]"),
        ({"": 1}, "remaining", "label"),
        ({"a": 1}, "everything", "of must be"),
    ],
)
def test_split_validation(shares, of, match):
    with pytest.raises(PrivacyParameterError, match=match):
        Accountant.pure(1).split(shares, of=of)


def test_parallel_composition_charges_the_cost_once():
    acc = Accountant.pure(1)
    block = acc.parallel("counties", PrivacyCost.pure(0.5))
    assert isinstance(block, ParallelBudget)
    assert acc.spent.epsilon == F(1, 2) and len(acc.ledger) == 1  # charged before any part runs
    spends = {"A": F(1, 2), "B": F(1, 4), "C": F(1, 3)}
    for county, eps in spends.items():
        part = block.part(county)
        assert part.total.epsilon == F(1, 2)
        part.charge(PrivacyCost.pure(eps), f"{county} counts")
    assert block.part("A") is block.parts["A"]  # the same part never gets a second budget
    with pytest.raises(BudgetExceededError, match="A again"):
        block.part("A").charge(PrivacyCost.pure(F(1, 100)), "A again")
    assert block.max_spent.epsilon == max(spends.values())
    assert acc.spent.epsilon == F(1, 2)  # the parent paid the maximum once, not the sum
    acc.charge(PrivacyCost.pure(0.5), "rest")
    with pytest.raises(BudgetExceededError):
        acc.parallel("too much", PrivacyCost.pure(F(1, 10**9)))


def test_parallel_in_zcdp_and_approx():
    z = Accountant.zcdp_from_approx(1, 1e-6)
    block = z.parallel("tracts", PrivacyCost.pure(0.1))
    assert block.part("t1").kind == "zcdp" and block.part("t1").total.rho == F(1, 200)
    a = Accountant.approx(1, 1e-6)
    block = a.parallel("tracts", PrivacyCost.pure(0.1))
    part = block.part("t1")
    assert part.total == PrivacyCost(F(1, 10), 0)
    with pytest.raises(BudgetExceededError, match="delta"):
        part.charge(PrivacyCost.approx(0.05, 1e-9), "needs delta the block did not reserve")


def test_advanced_block():
    acc = Accountant.approx(1, 1e-6)
    eps, delta = advanced_composition(0.01, 0, 20, 1e-7)
    block = acc.advanced_block("mwem rounds", 20, 0.01, 0, 1e-7)
    assert isinstance(block, AdvancedBlock)
    assert acc.spent == PrivacyCost(eps, delta) and block.total == PrivacyCost(eps, delta)
    with pytest.raises(BudgetExceededError, match="per step"):
        block.charge(PrivacyCost.pure(0.02), "too large a step")
    with pytest.raises(BudgetExceededError, match="per step"):
        block.charge(PrivacyCost.approx(0.01, 1e-12), "delta not reserved")
    for i in range(20):
        assert block.can_afford(PrivacyCost.pure(0.01))
        block.charge(PrivacyCost.pure(0.01 if i % 2 else 0.005), f"round {i}")
    assert block.steps_remaining == 0 and not block.can_afford(PrivacyCost.pure(0.001))
    with pytest.raises(BudgetExceededError, match="allows 20 steps"):
        block.charge(PrivacyCost.pure(0.001), "round 21")
    assert block.spent.epsilon == 10 * F(1, 100) + 10 * F(1, 200) == block.ledger_frame()["epsilon"].sum()
    assert acc.spent == PrivacyCost(eps, delta)  # the parent paid once, up front


def test_advanced_block_refusals():
    with pytest.raises(PrivacyParameterError, match="'pure'"):
        Accountant.pure(1).advanced_block("b", 10, 0.01, 0, 1e-6)
    with pytest.raises(PrivacyParameterError, match="'zcdp'"):
        Accountant.zcdp(1).advanced_block("b", 10, 0.01, 0, 1e-6)
    small = Accountant.approx(0.1, 1e-6)
    with pytest.raises(BudgetExceededError, match="big block"):
        small.advanced_block("big block", 100, 0.01, 0, 1e-7)
    assert small.ledger == []
    with pytest.raises(PrivacyParameterError, match="k must be"):
        Accountant.approx(1, 1e-6).advanced_block("b", 0, 0.01, 0, 1e-7)
    with pytest.raises(PrivacyParameterError, match="delta_prime"):
        Accountant.approx(1, 1e-6).advanced_block("b", 3, 0.01, 0, 0)


# ---------------------------------------------------------------------------------------------
# Ledger, summary, validation
# ---------------------------------------------------------------------------------------------


def test_ledger_frame():
    acc = Accountant.approx(2, 1e-5)
    acc.charge(PrivacyCost.pure(0.1), "one", detail={"mechanism": "laplace"})
    acc.charge(PrivacyCost.approx("1/3", 1e-6), "two")
    frame = acc.ledger_frame()
    assert isinstance(frame, pd.DataFrame)
    assert list(frame.columns) == [
        "label", "epsilon", "epsilon_float", "cumulative_epsilon",
        "delta", "delta_float", "cumulative_delta", "detail",
    ]
    assert list(frame["label"]) == ["one", "two"]
    assert frame["epsilon"].sum() == acc.spent.epsilon == F(1, 10) + F(1, 3)
    assert frame["delta"].sum() == acc.spent.delta
    assert frame["cumulative_epsilon"].iloc[-1] == acc.spent.epsilon
    assert frame["epsilon_float"].tolist() == [0.1, 1 / 3]
    assert frame["detail"].iloc[0] == {"mechanism": "laplace"}
    empty = Accountant.zcdp(1).ledger_frame()
    assert len(empty) == 0 and "rho" in empty.columns


def test_summary():
    acc = Accountant.pure("1/2")
    acc.charge(PrivacyCost.pure("1/8"), "a")
    s = acc.summary()
    assert s["kind"] == "pure" and s["charges"] == 1
    assert s["total"] == {"epsilon": "1/2"} and s["spent"] == {"epsilon": "1/8"}
    assert s["remaining"] == {"epsilon": "3/8"} and s["remaining_float"] == {"epsilon": 0.375}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.fractions(min_value=F(1, 1000), max_value=F(1, 2), max_denominator=1009), max_size=40))
def test_ledger_sums_exactly_to_spent(costs):
    acc = Accountant.zcdp(3)
    for i, c in enumerate(costs):
        if acc.can_afford(PrivacyCost.zcdp(c)):
            acc.charge(PrivacyCost.zcdp(c), f"c{i}")
        else:
            with pytest.raises(BudgetExceededError):
                acc.charge(PrivacyCost.zcdp(c), f"c{i}")
    assert sum((e.cost.rho for e in acc.ledger), F(0)) == acc.spent.rho <= acc.total.rho
    assert acc.spent.rho + acc.remaining.rho == acc.total.rho


@pytest.mark.parametrize("bad", BAD_POSITIVE)
def test_accountant_constructors_reject_bad_budgets(bad):
    with pytest.raises(PrivacyParameterError, match="epsilon"):
        Accountant.pure(bad)
    with pytest.raises(PrivacyParameterError, match="epsilon"):
        Accountant.approx(bad, 1e-6)
    with pytest.raises(PrivacyParameterError, match="rho"):
        Accountant.zcdp(bad)
    with pytest.raises(PrivacyParameterError, match="epsilon"):
        Accountant.zcdp_from_approx(bad, 1e-6)


@pytest.mark.parametrize("bad", BAD_DELTA)
def test_accountant_constructors_reject_bad_delta(bad):
    with pytest.raises(PrivacyParameterError, match="delta"):
        Accountant.approx(1, bad)
    with pytest.raises(PrivacyParameterError, match="delta"):
        Accountant.zcdp_from_approx(1, bad)


@pytest.mark.parametrize(
    "cost, label, match",
    [
        (0.1, "x", "cost must be a PrivacyCost"),
        (PrivacyCost(), "x", "states no privacy loss"),
        (PrivacyCost(rho=0), "x", "states no privacy loss"),
        (PrivacyCost.pure(0.1), "", "label"),
        (PrivacyCost.pure(0.1), None, "label"),
    ],
)
def test_charge_validation(cost, label, match):
    acc = Accountant.pure(1)
    with pytest.raises(PrivacyParameterError, match=match):
        acc.charge(cost, label)
    assert acc.ledger == [] and acc.spent.epsilon == 0
