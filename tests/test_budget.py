"""One budget value and one calibration: the plan's noise preview and the draw agree, for every
query kind and every accounting."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pandas as pd
import pytest

from dpopt.errors import PrivacyParameterError
from dpopt.model.data import Dataset
from dpopt.model.domain import Domain
from dpopt.model.queries import (
    AllRanges,
    FourierParity,
    Identity,
    Kronecker,
    Marginal,
    MarginalWorkload,
    PredicateCount,
    Prefix,
    SelectedRows,
    SparseQuery,
    Stack,
    Total,
    Weighted,
    downward_closure,
)
from dpopt.privacy import Accountant, Budget, PrivacyCost, calibrate, measure
from dpopt.privacy.randomness import SeededRandom

DOMAIN = Domain.from_dict({"a": 2, "b": 3, "c": 2})


def queries():
    bits = Domain.from_dict({"x": 2, "y": 2, "z": 2})
    return [
        Identity(DOMAIN), Total(DOMAIN), Marginal(DOMAIN, ("a", "c")), Prefix(DOMAIN, "b"), AllRanges(DOMAIN, "b"),
        PredicateCount(DOMAIN, "b >= 1"), SelectedRows(Marginal(DOMAIN, ("b",)), [0, 2]),
        Stack([Marginal(DOMAIN, ("a",)), Total(DOMAIN)]), Weighted(Marginal(DOMAIN, ("b",)), [0.5, 1.25, 2.0]),
        SparseQuery(DOMAIN, np.eye(DOMAIN.size)[:3] * 3.0),
        MarginalWorkload(DOMAIN, [("a",), ("b", "c")]),
        Kronecker([Identity(Domain.from_dict({"a": 2})), Total(Domain.from_dict({"b": 3})),
                   Identity(Domain.from_dict({"c": 2}))], DOMAIN),
        FourierParity(bits, downward_closure([("x", "y")], bits)),
    ]


def data_for(domain: Domain) -> Dataset:
    gen = np.random.default_rng(3)  # test input
    frame = pd.DataFrame({a: gen.integers(0, s, 60) for a, s in zip(domain.attrs, domain.sizes)})
    return Dataset.from_frame(frame, domain)


COSTS = {
    "pure": (Budget.pure(Fraction(1, 2)), None),
    "approx gaussian": (Budget.approx(1, Fraction(1, 10**6)), "gaussian"),
    "approx laplace": (Budget.approx(1, Fraction(1, 10**6)), "laplace"),
    "zcdp": (Budget.zcdp(Fraction(1, 3)), None),
    "zcdp from approx": (Budget.zcdp_from_approx(1, Fraction(1, 10**6)), None),
}


@pytest.mark.parametrize("accounting", list(COSTS))
@pytest.mark.parametrize("query", queries(), ids=lambda q: type(q).__name__)
def test_the_preview_and_the_draw_use_the_same_law(query, accounting):
    budget, mechanism = COSTS[accounting]
    cost = budget.shares({"q": 1})["q"]
    law = calibrate(query, cost, budget.noise(mechanism))
    accountant = budget.accountant()
    m = measure(query, data_for(query.domain), law, accountant, SeededRandom(1), label="q")
    assert (m.noise, m.scale, m.variance) == (law.family, law.scale, law.variance)
    entry = accountant.ledger[0]
    assert entry.cost == accountant.convert(law.cost)
    # the law is derived from the operator: its sensitivity, not a guess
    if law.mechanism == "laplace":
        assert law.sensitivity >= Fraction(query.sensitivity(1)) and law.scale == pytest.approx(
            float(law.sensitivity) / float(cost.epsilon), rel=1e-12)
    else:
        assert law.sensitivity >= Fraction(query.squared_l2_sensitivity())
    # integer queries need no grid; real-valued ones go on a public power-of-two grid
    assert (law.grid == 1) == bool(query.is_integer)


def test_the_release_plan_prints_the_laws_the_run_draws():
    from dpopt.release import load_data, measure as measure_plan, plan

    spec = {
        "domain": {"attributes": {"a": 2, "b": 3, "c": 2}},
        "privacy": {"accounting": "zcdp", "epsilon": 1, "delta": 1e-6},
        "measure": [{"query": "marginal", "attrs": ["a", "b"], "mechanism": "gaussian", "share": "2/3"},
                    {"query": "prefix", "attr": "b", "mechanism": "gaussian", "share": "1/3"}],
    }
    frame = pd.DataFrame({"a": [0, 1] * 30, "b": [0, 1, 2] * 20, "c": [1] * 60})
    p = plan(spec, data=frame, seed=2)
    measurements, accountant, _ = measure_plan(p, load_data(p))
    frame_preview = p.budget_frame()
    for row, m in zip(frame_preview.itertuples(), measurements):
        assert row.noise_stddev == m.stddev and row.noise == m.noise
    assert sum(accountant.ledger_frame()["rho"], Fraction(0)) == p.budget.rho


def test_budget_values():
    b = Budget.approx("1/2", "1e-6")
    shares = b.shares({"x": 1, "y": 2})
    assert shares["x"].epsilon + shares["y"].epsilon == Fraction(1, 2)
    assert shares["x"].delta + shares["y"].delta == Fraction(1, 10**6)
    assert Budget.of(b.accountant()) == b
    z = Budget.zcdp_from_approx(1, Fraction(1, 10**5))
    assert Budget.of(z.accountant()) == z and z.rho > 0
    assert Budget.pure(1).noise() == "laplace" and Budget.zcdp(1).noise() == "gaussian"
    with pytest.raises(PrivacyParameterError, match="not pure-DP"):
        Budget.pure(1).noise("gaussian")
    with pytest.raises(PrivacyParameterError, match="exact share of rho"):
        Budget.zcdp(1).noise("laplace")
    with pytest.raises(PrivacyParameterError, match="epsilon"):
        Budget.pure(0)
    assert Budget.pure(1).share("1/4") == PrivacyCost.pure(Fraction(1, 4))


def test_calibrate_refuses_a_cost_that_cannot_buy_the_noise():
    with pytest.raises(PrivacyParameterError, match="Laplace mechanism needs epsilon"):
        calibrate(Total(DOMAIN), PrivacyCost.zcdp(1), "laplace")
    with pytest.raises(PrivacyParameterError, match="Gaussian mechanism needs rho"):
        calibrate(Total(DOMAIN), PrivacyCost.pure(1), "gaussian")
    with pytest.raises(PrivacyParameterError, match="PrivacyCost"):
        calibrate(Total(DOMAIN), 1.0)
    # the same law from laplace_mechanism's path: a draw charges exactly what calibrate said
    acc = Accountant.pure(1)
    law = calibrate(Total(DOMAIN), PrivacyCost.pure(1))
    measure(Total(DOMAIN), data_for(DOMAIN), law, acc, SeededRandom(0))
    assert acc.remaining.epsilon == 0
