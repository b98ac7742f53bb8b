"""The matrix mechanism: choose a strategy by its expected error before reading the data, measure
it, answer a range workload from least squares, with and without census-style constraints.

    python examples/matrix_mechanism.py

Teaches: the plan prints every candidate strategy's expected error and the SVD bound no strategy
can beat (public: no data is read and no budget is spent to choose); the run spends all of the
budget on the chosen strategy; the unconstrained answers carry exact standard errors, the
constrained table keeps non-negativity, a structural zero and a published total exactly.
The people are made up and the noise is seeded so that the printout is reproducible: a seeded
run is NOT private.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pandas as pd

from dpopt.algorithms.matrix_mechanism import MatrixMechanism
from dpopt.model.constraints import ConstraintSet, Invariant, NonNegativity, StructuralZeros
from dpopt.model.data import Dataset
from dpopt.model.domain import Domain
from dpopt.model.queries import AllRanges, Identity, Kronecker, Total
from dpopt.privacy.budget import Budget
from dpopt.privacy.randomness import make_random


def main() -> None:
    # 1. A public domain (age in years x sex) and made-up confidential records.
    domain = Domain.from_dict({"age": 100, "sex": ["F", "M"]})
    people = np.random.default_rng(1)
    frame = pd.DataFrame({"age": np.clip(people.gamma(4.0, 9.0, 3000).astype(int), 1, 99),
                          "sex": people.choice(["F", "M"], 3000)})  # nobody is recorded at age 0
    data = Dataset.from_frame(frame, domain)

    # 2. The workload: every age range, for each sex (10,100 counting queries).
    workload = Kronecker([AllRanges(domain.project(["age"]), "age"), Identity(domain.project(["sex"]))], domain)
    budget = Budget.pure(Fraction(1, 2))

    # 3. The plan: public, before any data is read.
    alg = MatrixMechanism(workload=workload)
    plan = alg.plan(domain, ConstraintSet(domain), budget)
    print("\n".join(plan.lines))

    # 4. The run: all of epsilon on the chosen strategy, then x = A⁺y.
    rng = make_random(seed=7)  # seeded: reproducible and NOT private; omit the seed for a real release
    release = alg.run(plan, data, budget.accountant(), rng)
    answers = release.answers["workload"]
    truth = workload.answer(data)
    print(f"\nunconstrained: {release.message}")
    print(answers.head(3).to_string(index=False))
    print(f"realised RMSE per query {np.sqrt(np.mean((answers['count'] - truth) ** 2)):.2f} "
          f"(expected {np.sqrt(plan.details.expected_error / workload.num_rows):.2f}); "
          f"the ledger spent {release.accountant.spent.epsilon}")

    # 5. The same strategy under constraints: no negative counts, a structural zero (this file
    #    records nobody at age 0: an illustrative rule) and the published total.
    constraints = (ConstraintSet(domain).add(NonNegativity())
                   .add(StructuralZeros("age == 0", name="nobody recorded at age 0"))
                   .add(Invariant(Total(domain), [float(data.total)], "published total")))
    constrained = MatrixMechanism(workload=workload, strategy=plan.details.strategy)
    plan2 = constrained.plan(domain, constraints, budget)
    release2 = constrained.run(plan2, data, budget.accountant(), make_random(seed=7))
    table = release2.counts.reshape(100, 2)
    print(f"\nconstrained: {release2.status.name}; smallest cell {table.min():.3g}, "
          f"age 0 = {table[0].tolist()}, total {table.sum():.6g} (published {data.total})")
    realised = np.sqrt(np.mean((release2.answers["workload"]["count"] - truth) ** 2))
    print(f"realised RMSE per query {realised:.2f} with the constraints")


if __name__ == "__main__":
    main()
