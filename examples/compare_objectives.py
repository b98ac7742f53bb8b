"""Compare the consistency objectives (L2, L1, L-infinity, entropy) on the same measurements.

    python examples/compare_objectives.py

Teaches: reconstruction is post-processing, so one set of noisy measurements can be
reconstructed several ways at no extra privacy cost; the objectives trade accuracy on the
measured tables, accuracy on unmeasured ones and speed differently.
The noise is seeded so that the printout is reproducible: a seeded run is NOT private.
"""

from __future__ import annotations

from itertools import combinations

import numpy as np

from dpopt.datasets.census import census_domain, generate_census, structural_zero_rules
from dpopt.estimate import reconstruct
from dpopt.model.constraints import ConstraintSet, NonNegativity, StructuralZeros
from dpopt.model.data import Dataset
from dpopt.model.queries.marginal import Marginal
from dpopt.privacy.accountant import Accountant
from dpopt.privacy.mechanisms import laplace_mechanism
from dpopt.privacy.randomness import make_random


#: Per-objective settings: a backend for L2 (the QP solver is fast on this size).
OPTIONS = {"l2": {"backend": "cvxpy"}}


def main() -> None:
    domain = census_domain(num_states=2, counties_per_state=2)
    data = Dataset.from_frame(generate_census(4_000, num_states=2, counties_per_state=2, seed=3), domain)
    truth = data.histogram()

    constraints = ConstraintSet(domain).add(NonNegativity())
    for i, (predicate, reason) in enumerate(structural_zero_rules(domain)):
        constraints.add(StructuralZeros(predicate, name=f"rule {i + 1}", reason=reason))

    accountant = Accountant.pure("1/2")
    rng = make_random(seed=7)  # seeded: NOT private
    measured = [("county", "sex", "age_group"), ("relationship", "household_type", "age_group")]
    measurements = [laplace_mechanism(Marginal(domain, a), data, "1/4", accountant, rng, label=" x ".join(a))
                    for a in measured]

    held_out = [Marginal(domain, a) for a in combinations(domain.attrs, 2)]
    print(f"{len(measurements)} measured marginals, epsilon = 1/2; errors are L1, summed over cells")
    print(f"{'objective':<10} {'status':<10} {'time (s)':>8} {'measured':>9} {'2-way held out':>15} {'total':>8}")
    for objective in ("l2", "l1", "linf", "entropy"):
        result = reconstruct(measurements, constraints, objective, **OPTIONS.get(objective, {}))
        x = result.x
        err_measured = sum(np.abs(m.query.matvec(x) - m.query.matvec(truth)).sum() for m in measurements)
        err_held = np.mean([np.abs(q.matvec(x) - q.matvec(truth)).sum() for q in held_out])
        print(f"{objective:<10} {result.status.name:<10} {result.time:8.2f} {err_measured:9.0f} "
              f"{err_held:15.1f} {x.sum():8.0f}")
    noisy = sum(np.abs(m.values - m.query.matvec(truth)).sum() for m in measurements)
    print(f"{'(noisy)':<10} {'':<10} {'':>8} {noisy:9.0f}")
    print("Two marginals do not determine the table: L2, L1 and L-infinity have many optimal tables and\n"
          "the solver picks one; entropy picks the most uniform one, which tends to help held-out queries.")


if __name__ == "__main__":
    main()
