"""A PL 94-171-like top-down release of a synthetic nation, level by level, on a process pool or Spark.

dpopt generates the nation itself (no download): states, counties and tracts with skewed
populations, each tract's table of 2 (voting age) x 2 (Hispanic) x 63 (race) x 8 (group
quarters) = 2,016 cells with made-up edit rules. The release measures every unit of every level
with exact discrete Gaussian noise (zCDP), then solves each parent's children jointly so that the
tables add up exactly from tract to nation, the state populations by voting age (published
exactly, on purpose) hold, the edit rules hold and every count is a non-negative integer.

By default a small nation (3 states, 40 counties, about 220 tracts) runs in seconds; ``--full``
is the national scale of the benchmark (51 states, 3,200 counties, about 73,000 tracts, 330
million persons): about 7 minutes and 12 GB on a 2-core machine (docs: top-down, Performance).
The noise is seeded (``--seed``) so that runs can be compared: a seeded release is NOT private. The
accuracy printed at the end compares with the confidential counts: NOT private either, for the example only.

Run:  python examples/topdown_national.py [--full] [--executor pool|serial|spark] [--out DIR]
"""

from __future__ import annotations

import argparse
import time
from fractions import Fraction
from pathlib import Path

import numpy as np

from dpopt.algorithms.topdown.evaluate import error_by_unit_size
from dpopt.algorithms.topdown.pl94 import pl94_algorithm
from dpopt.datasets.national import generate_nation
from dpopt.privacy.budget import Budget
from dpopt.privacy.randomness import make_random


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="national scale: 51 states, 3,200 counties, 330M persons")
    parser.add_argument("--states", type=int, default=3)
    parser.add_argument("--counties", type=int, default=40)
    parser.add_argument("--persons", type=int, default=1_000_000)
    parser.add_argument("--rho", default="1", help="the zCDP budget (default 1)")
    parser.add_argument("--executor", default="pool", choices=["serial", "pool", "spark"])
    parser.add_argument("--workers", type=int, default=None, help="pool processes, or Spark's local[N]")
    parser.add_argument("--spark", default="local[*]", help="Spark master URL with --executor spark")
    parser.add_argument("--seed", type=int, default=1, help="noise seed (seeded runs are NOT private)")
    parser.add_argument("--out", type=Path, default=None, help="write every level's table (Parquet) here")
    args = parser.parse_args(argv)
    if args.full:
        args.states, args.counties, args.persons = 51, 3_200, 330_000_000

    tick = time.perf_counter()
    nation = generate_nation(args.states, args.counties, args.persons, seed=0)
    print(f"generated {nation.persons:,} persons in {time.perf_counter() - tick:.1f} s: {nation.geography.describe()}")
    budget = Budget.zcdp(Fraction(args.rho))
    algorithm = pl94_algorithm(nation, executor=args.executor, workers=args.workers, spark=args.spark,
                               progress=args.full)
    plan = algorithm.plan(nation.domain, nation.constraints(), budget)
    print("\n".join(plan.lines))
    print(f"budget: {budget.describe()}; noise seed {args.seed} (seeded: NOT private)")
    tick = time.perf_counter()
    release = algorithm.run(plan, nation.dataset(), budget.accountant(), make_random(args.seed))
    print(f"{release.status.name}: {release.message} in {time.perf_counter() - tick:.1f} s")
    if not release.success:
        return 1
    for level in release.info["levels"]:
        res, times = level["constraint_residuals"], level["solve_seconds"]
        fit = ", ".join(f"{q['query']} {q['rms_standardized']:.2f}" for q in level["queries"])
        print(f"  {level['level']:>7}: {level['units']:>6,} units, {level['variables']:>10,} variables, "
              f"measure {level['seconds']['measure']:6.1f} s, solve {level['seconds']['solve']:6.1f} s "
              f"(per parent median {times['median']:.2f} s, max {times['max']:.1f} s); "
              f"parent-sum violation {res.get('parent_sum_max_violation', 0)}, invariants "
              f"{res['invariants_max_violation']:g}, failsafe {level['failsafe_events']}; standardised RMS {fit}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        for name in release.level_tables:
            release.level_frame(name, cells="nonzero").to_parquet(args.out / f"level_{name}.parquet", index=False)
        print(f"wrote {len(release.level_tables)} level tables to {args.out}/")

    # NOT private: the confidential counts, for the example only.
    noisy = {name: release.noisy[name]["detailed"] for name in release.level_tables}
    errors = error_by_unit_size(nation.geography, nation.tract_counts,
                                {"released": release.level_tables, "noisy": noisy}, groups=1)
    print("mean absolute error per cell (NOT private):")
    for row in errors.itertuples():
        print(f"  {row.level:>7}: released {row.mae_released:.4f}, noisy measurements {row.mae_noisy:.4f}")
    assert np.array_equal(release.level_tables["nation"][0], release.level_tables["tract"].sum(axis=0))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
