"""What public constraints buy: the same measurements with more and more constraints.

    python examples/structural_zeros_and_invariants.py

Teaches: structural zeros and invariants are public facts; imposing them costs no privacy and
makes the release more accurate. Contradictory constraints are refused before any noise.
The noise is seeded so that the printout is reproducible: a seeded run is NOT private.
"""

from __future__ import annotations

import numpy as np

from dpopt.datasets.census import STRUCTURAL_ZEROS, census_domain, county_parent, generate_census
from dpopt.errors import InconsistentConstraintsError
from dpopt.estimate import reconstruct
from dpopt.model.constraints import (
    ConstraintSet,
    Hierarchy,
    Integrality,
    Invariant,
    NonNegativity,
    StructuralZeros,
)
from dpopt.model.data import Dataset
from dpopt.model.queries.basic import Total
from dpopt.model.queries.marginal import Marginal
from dpopt.privacy.accountant import Accountant
from dpopt.privacy.mechanisms import laplace_mechanism
from dpopt.privacy.randomness import make_random


def main() -> None:
    domain = census_domain()
    data = Dataset.from_frame(generate_census(8_000, seed=5), domain)
    truth = data.histogram()

    accountant = Accountant.pure("1/2")
    rng = make_random(seed=11)  # seeded: NOT private
    measurements = [
        laplace_mechanism(Marginal(domain, ["county", "sex", "age_group"]), data, "1/4", accountant, rng, label="c"),
        laplace_mechanism(Marginal(domain, ["state", "relationship", "household_type"]), data, "1/4", accountant,
                          rng, label="s"),
    ]

    # The household edit rules (a householder is at least 15, ...); the geography comes with the hierarchy.
    zeros = [StructuralZeros(p, name=f"rule {i + 1}", reason=r) for i, (p, r) in enumerate(STRUCTURAL_ZEROS)]
    states = Marginal(domain, ["state"])
    stages = {
        "none": [],
        "+ non-negativity": [NonNegativity()],
        "+ structural zeros": [NonNegativity(), *zeros],
        "+ hierarchy": [NonNegativity(), *zeros, Hierarchy("state", "county", county_parent(domain))],
        "+ state totals (from the data)": [NonNegativity(), *zeros, Hierarchy("state", "county", county_parent(domain)),
                                           Invariant(states, states.answer(data), "state totals", from_data=True)],
    }
    # The QP backend (cvxpy) is used throughout: it is fast on every stage of this comparison.
    print(f"{'constraints':<32} {'L1 error: full table':>21} {'state totals':>13} {'on impossible cells':>20}")
    impossible = ConstraintSet(domain, [*zeros, Hierarchy("state", "county", county_parent(domain))]).zero_mask()
    true_states = states.answer(data)
    for name, items in stages.items():
        result = reconstruct(measurements, ConstraintSet(domain, list(items)), "l2", backend="cvxpy")
        x = result.x
        print(f"{name:<32} {np.abs(x - truth).sum():21.0f} {np.abs(states.matvec(x) - true_states).sum():13.1f} "
              f"{np.abs(x[impossible]).sum():20.1f}")

    # Integer release: every constraint still holds exactly after rounding.
    final = ConstraintSet(domain, [*stages["+ state totals (from the data)"], Integrality()])
    result = reconstruct(measurements, final, "l2", backend="cvxpy")
    print(f"integer release: largest constraint violation {result.max_violation}, "
          f"state totals {states.matvec(result.x).astype(int).tolist()} (true {states.answer(data).astype(int).tolist()})")

    # A public invariant that contradicts the published state totals is refused up front.
    conflicting = ConstraintSet(domain, [*final.constraints, Invariant(Total(domain), [100], "claimed total")])
    try:
        conflicting.check()
    except InconsistentConstraintsError as exc:
        print(f"refused before any noise: {exc}")


if __name__ == "__main__":
    main()
