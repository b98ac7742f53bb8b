"""Measure and reconstruct by hand: one release with dpopt's building blocks, one step per line.

    python examples/measure_and_reconstruct.py

Teaches: the two-step model y = Q x + z, then x^ = argmin loss(Q x, y) subject to constraints.
Exact noise is charged to an accountant before it is drawn; reconstruction is post-processing.
The noise is seeded so that the printout is reproducible: a seeded run is NOT private.
"""

from __future__ import annotations

import numpy as np

from dpopt.datasets.census import census_domain, county_parent, generate_census, structural_zero_rules
from dpopt.estimate import reconstruct
from dpopt.model.constraints import ConstraintSet, Hierarchy, Integrality, NonNegativity, StructuralZeros
from dpopt.model.data import Dataset
from dpopt.model.queries.marginal import Marginal
from dpopt.privacy.accountant import Accountant
from dpopt.privacy.mechanisms import laplace_mechanism
from dpopt.privacy.randomness import make_random


def main() -> None:
    # 1. The public domain and the confidential data (here: dpopt's made-up census file).
    domain = census_domain()
    data = Dataset.from_frame(generate_census(5_000, seed=1), domain)
    print(f"domain: {domain.size:,} cells; data: {data.total:,} records")

    # 2. The public constraints, checked before any noise is drawn.
    constraints = ConstraintSet(domain).add(NonNegativity()).add(Integrality())
    constraints.add(Hierarchy("state", "county", county_parent(domain), name="geography"))
    for i, (predicate, reason) in enumerate(structural_zero_rules(domain)):
        constraints.add(StructuralZeros(predicate, name=f"rule {i + 1}", reason=reason))
    constraints.check()
    print(f"constraints: {len(constraints)}, of which {constraints.zero_mask().sum():,} cells are structural zeros")

    # 3. Measure: a budget of epsilon = 1 split over three marginals (exact fractions).
    accountant = Accountant.pure(1)
    rng = make_random(seed=2024)  # seeded: reproducible and NOT private; omit the seed for a real release
    workload = {
        ("county", "sex", "age_group"): "1/2",
        ("state", "relationship", "household_type"): "1/4",
        ("age_group", "sex", "relationship", "household_type"): "1/4",
    }
    measurements = [
        laplace_mechanism(Marginal(domain, attrs), data, eps, accountant, rng, label=" x ".join(attrs))
        for attrs, eps in workload.items()
    ]
    for m in measurements:
        print(f"  measured {m.label:<45} {m.query.num_rows:4d} answers, noise std. dev. {m.stddev:5.2f}")
    print(f"ledger: {list(accountant.ledger_frame()['epsilon'])}, spent {accountant.spent.epsilon} of 1")

    # 4. Reconstruct: weighted least squares under the constraints, then exact integer rounding.
    result = reconstruct(measurements, constraints, "l2")
    print(f"reconstruction: {result.status.name} with {result.solver} in {result.time:.2f} s; "
          f"rounding: {result.info['rounding']['info']['method']}")
    print(f"largest constraint violation: {result.max_violation}")

    # 5. Compare with the truth (possible only because the data are made up; NOT private).
    truth = data.histogram()
    for m in measurements:
        t = m.query.matvec(truth)
        noisy = np.abs(m.values - t).sum()
        released = np.abs(m.query.matvec(result.x) - t).sum()
        print(f"  L1 error {m.label:<45} noisy {noisy:7.0f}   released {released:7.0f}")


if __name__ == "__main__":
    main()
