"""The bias of issue 12 on dpopt's census example: per-cell rounding piles mass into the dense
categories; controlled rounding keeps every measured marginal within floor/ceil of the fit.

Setting (chosen where the cell-wise bias shows on the census example in a few seconds): 10,000
people in 1 state x 50 counties (7,300 free cells, 1.4 persons per cell), the quickstart's four
marginals at epsilon = 1 with its shares, state total invariant, weighted least squares, then
both roundings. Seeds are fixed: the runs are reproducible, NOT private.
"""

from __future__ import annotations

import numpy as np
import pytest

from dpopt.datasets.census import census_constraints, census_domain, generate_census
from dpopt.estimate import reconstruct, round_to_integers
from dpopt.model.data import Dataset
from dpopt.model.queries.marginal import Marginal
from dpopt.privacy.accountant import Accountant
from dpopt.privacy.mechanisms import laplace_mechanism
from dpopt.privacy.randomness import make_random

#: The quickstart's marginals and shares (models/quickstart.toml).
QUICKSTART = {("county", "sex", "age_group"): "0.35", ("state", "relationship", "household_type"): "0.25",
              ("age_group", "sex", "relationship", "household_type"): "0.3", ("county", "household_type"): "0.1"}
RUNS = 3
#: Runs in which a category with >= 30 people may be released as 0 by controlled rounding. It
#: can only happen where the fractional fit itself is below 1 (checked below), i.e. never
#: because of the rounding.
ALLOWED_ZERO_RUNS = 1


@pytest.fixture(scope="module")
def census():
    domain = census_domain(1, 50)
    data = Dataset.from_frame(generate_census(10_000, num_states=1, counties_per_state=50, seed=3), domain)
    return domain, data, census_constraints(domain, data)


def test_controlled_rounding_removes_the_cellwise_bias(census):
    domain, data, cs = census
    truth = data.histogram()
    zero_runs = 0
    for run in range(RUNS):
        accountant, rng = Accountant.pure(1), make_random(seed=100 + run)  # seeded: NOT private
        ms = [laplace_mechanism(Marginal(domain, list(a)), data, e, accountant, rng, label=" x ".join(a))
              for a, e in QUICKSTART.items()]
        fit = reconstruct(ms, cs, "l2", integer=False)
        assert fit.success
        cellwise = round_to_integers(fit.x, cs, method="cellwise")
        controlled = round_to_integers(fit.x, cs, measured=ms)
        assert cellwise.success and controlled.success and "fallback" not in controlled.info
        assert len(controlled.info["exceptions"]) == 0 and controlled.max_violation == 0.0
        zeroed = False
        for m in ms:
            true, frac = m.query.matvec(truth), m.query.matvec(fit.x)
            released = m.query.matvec(controlled.x)
            err_fit = np.abs(frac - true).mean()
            assert np.abs(released - true).mean() <= 1.10 * err_fit, m.label
            # floor/ceil of the fit: a category the fit puts at 1 or more is never released as 0
            assert not np.any((frac >= 1) & (released == 0)), m.label
            zeroed |= bool(np.any((true >= 30) & (released == 0)))
        zero_runs += zeroed
        # the per-cell optimum piles mass into dense categories: on state x relationship x
        # household type it is 3.7-5 times further from the truth than the fit it rounds
        m = ms[1]
        true = m.query.matvec(truth)
        assert np.abs(m.query.matvec(cellwise.x) - true).mean() >= 2.0 * np.abs(m.query.matvec(fit.x) - true).mean()
    assert zero_runs <= ALLOWED_ZERO_RUNS
