"""Thaler-Ullman-Vadhan polynomial release of every 3-way marginal of a binary table.

    python examples/polynomial_release.py [../shared/data/nltcs.csv] [--epsilon 1] [--seed 0]

Without a path it reads ../shared/data/nltcs.csv beside the repository, or, when that is
absent, a generated 12-attribute binary table.

Plans the release (public: which conjunction counts are measured, with which noise, and the
Theorem 3.1 worst-case bound), runs it, and prints one released marginal, the measured errors
next to the bound (evaluation against the data: NOT private) for three choices of the
polynomial -- exact (t = k), Fact 4.2's Chebyshev polynomial for gamma = 1/7, and (t, gamma)
chosen to minimise the bound for the table's size -- and the L2 consistency projection.
A seed makes the run reproducible and NOT private.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from dpopt.algorithms.polynomial import Polynomial
from dpopt.model.constraints import ConstraintSet
from dpopt.model.data import Dataset
from dpopt.model.domain import Domain
from dpopt.privacy.budget import Budget
from dpopt.privacy.randomness import make_random

NLTCS = Path(__file__).resolve().parents[2] / "shared" / "data" / "nltcs.csv"


def load(path: str) -> Dataset:
    """The 0/1 table at ``path``; a generated one (latent class, bits flipped w.p. 1/4) when absent."""
    if not Path(path).is_file():
        print(f"{path} is absent: using a generated binary table")
        gen = np.random.default_rng(0)  # example data, not privacy noise
        bits = gen.integers(0, 2, (5000, 1)) ^ (gen.random((5000, 12)) < 0.25)
        return Dataset(bits.astype(np.int64), Domain(tuple(f"b{i}" for i in range(12)), (2,) * 12))
    frame = pd.read_csv(path)
    return Dataset.from_frame(frame, Domain(tuple(frame.columns), (2,) * frame.shape[1]))  # public: 0/1 attributes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", nargs="?", default=str(NLTCS), help="CSV of 0/1 records, one column per attribute")
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None, help="noise seed (NOT private)")
    args = parser.parse_args()
    data = load(args.data)
    domain = data.domain
    budget = Budget.pure(args.epsilon)
    choices = {
        "exact polynomial (t = k)": dict(workload=3),
        "Fact 4.2 Chebyshev, gamma = 1/7": dict(workload=3, construction="chebyshev", gamma="1/7"),
        "(t, gamma) minimising the bound": dict(workload=3, records=data.total),  # n taken as public here
        "exact, then L2 consistency": dict(workload=3, consistency="l2"),
    }
    for title, options in choices.items():
        if "consistency" in options and len(domain) > 20:
            continue
        alg = Polynomial(**options)
        plan = alg.plan(domain, ConstraintSet(domain), budget)  # reads no data
        rng = make_random(args.seed)
        release = alg.run(plan, data, budget.accountant(), rng)
        print(f"\n== {title} ==")
        print("\n".join(plan.lines))
        errors = release.errors(data)  # NOT private: compares with the data
        print(f"measured: worst |error| {errors.max_error.max():.0f}, mean |error| per cell "
              f"{errors.mean_error.mean():.1f}; all within the bound: {bool(errors.within_bound.all())}")
        if "consistent_mean_error" in errors:
            print(f"after the L2 projection: worst {errors.consistent_max_error.max():.0f}, mean "
                  f"{errors.consistent_mean_error.mean():.1f} ({release.reconstruction.status.name})")
    first = next(iter(release.answers))
    print(f"\nreleased marginal {first}:\n{release.answers[first].to_string(index=False)}")
    print(f"\nledger (random source: {rng.description}):\n{release.ledger.to_string(index=False)}")


if __name__ == "__main__":
    main()
