"""DualQuery: synthetic records that respect the household edit rules, from a game with an IP oracle.

    python examples/dualquery_synthetic_records.py

Teaches: DualQuery (Gaboardi et al., ICML 2014) releases synthetic *records*. Its privacy comes
from sampling queries from the query player's multiplicative-weights distribution, charged as
one (epsilon, delta) cost before anything is drawn; the data player's integer programs only
see the sampled queries, so their time limits and gaps change the records' quality, never the
privacy. Structural zeros are constraints of every integer program: no released record breaks
an edit rule. An invariant (the state totals) is kept by projecting the records' table, a
post-processing step reported next to the records.
The noise is seeded so that the printout is reproducible: a seeded run is NOT private.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from dpopt.algorithms.dualquery import DualQuery
from dpopt.datasets.census import STRUCTURAL_ZEROS, census_domain, generate_census
from dpopt.estimate.engines.best_response import RecordProgram
from dpopt.model.constraints import ConstraintSet, NonNegativity, StructuralZeros
from dpopt.model.data import Dataset
from dpopt.model.queries import Marginal
from dpopt.privacy.budget import Budget
from dpopt.privacy.randomness import make_random


def workload_errors(workload, data, codes) -> tuple[float, float]:
    """Max and mean error (fractions of records) of records ``codes`` on the workload's conjunctions."""
    positive = ~workload.negated
    truth = workload.count_records(data.codes)[positive] / data.total
    synthetic = workload.count_records(codes)[positive] / len(codes)
    err = np.abs(synthetic - truth)
    return float(err.max()), float(err.mean())


def main() -> None:
    domain = census_domain()
    data = Dataset.from_frame(generate_census(20_000, seed=3), domain)
    constraints = ConstraintSet(domain)
    for i, (rule, reason) in enumerate(STRUCTURAL_ZEROS):
        constraints.add(StructuralZeros(rule, name=f"rule {i + 1}", reason=reason))
    budget = Budget.approx(1, Fraction(1, 10**5))

    print(f"{data.total:,} persons over {domain.size:,} cells; every 2-way marginal cell and its negation\n")
    print(f"{'eta':>5} {'T':>4} {'s':>5} {'max err':>8} {'mean err':>9} {'IP median s':>12} {'optimal':>8}")
    for eta in (Fraction(1, 2), Fraction(1), Fraction(2)):
        algorithm = DualQuery(order=2, eta=eta, samples=200, time_limit=5.0)
        plan = algorithm.plan(domain, constraints, budget)
        release = algorithm.run(plan, data, budget.accountant(), make_random(seed=7))  # seeded: NOT private
        codes = release.info["record_codes"]  # the records as codes (release.records has labels)
        assert RecordProgram(domain, constraints).allows(codes).all()  # no record breaks an edit rule
        log = release.info["rounds_log"]
        mx, mean = workload_errors(plan.details, data, codes)
        print(f"{str(eta):>5} {release.info['rounds']:>4} {release.info['samples']:>5} {mx:8.3f} {mean:9.4f} "
              f"{log['time'].median():12.3f} {(log['status'] == 'OPTIMAL').sum():>5}/{len(log)}")

    gen = np.random.default_rng(0)  # baseline: random allowed records, the same number
    cells = domain.unravel(np.flatnonzero(~constraints.zero_mask()))
    rand = cells[gen.integers(0, len(cells), release.info["rounds"])]
    mx, mean = workload_errors(plan.details, data, rand)
    print(f"{'random allowed records':>25}: max err {mx:.3f}, mean err {mean:.4f}")
    print(f"ledger: {len(release.ledger)} charge, epsilon {release.ledger['epsilon'].sum()}, "
          f"delta {release.ledger['delta'].sum()}; guarantee epsilon = "
          f"{float(Fraction(release.info['epsilon_of_the_guarantee'])):.4f}")

    # Publishing the state totals exactly: project the records' table onto them (post-processing).
    with_totals = ConstraintSet(domain, list(constraints.constraints))
    with_totals.add(NonNegativity())
    states = Marginal(domain, ["state"])
    with_totals.invariant_from_data(states, data, "state totals")
    algorithm = DualQuery(order=2, eta=Fraction(1), samples=200, time_limit=5.0, project=True)
    plan = algorithm.plan(domain, with_totals, budget)
    release = algorithm.run(plan, data, budget.accountant(), make_random(seed=7))  # seeded: NOT private
    print(f"\nprojected table: state totals {np.round(states.matvec(release.counts)).astype(int).tolist()} "
          f"(published {states.answer(data).astype(int).tolist()}); "
          f"impossible cells hold {float(np.abs(release.counts[with_totals.zero_mask()]).sum()):.1f}")


if __name__ == "__main__":
    main()
