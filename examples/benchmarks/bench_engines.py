"""Consistency-engine benchmark (issue 3).

1. nltcs (2^16 cells), all 560 3-way marginals measured once with discrete Laplace at
   epsilon = 1 (seeded: a benchmark, not a release): non-negative weighted least squares,
   L1, L-infinity and entropy reconstructions, and exact integer rounding with a total
   invariant.
2. A synthetic 2^20-cell binary domain with all 190 2-way marginals: non-negative least squares.

Run:  python examples/benchmarks/bench_engines.py
"""

from __future__ import annotations

import itertools
import time
from fractions import Fraction

import numpy as np

from _common import load_binary, peak_memory_mb
from dpopt.estimate import reconstruct, round_to_integers
from dpopt.model.constraints import ConstraintSet, Integrality, Invariant, NonNegativity
from dpopt.model.data import Dataset
from dpopt.model.domain import Domain
from dpopt.model.queries import Marginal, Total
from dpopt.privacy.accountant import Accountant
from dpopt.privacy.mechanisms import laplace_mechanism
from dpopt.privacy.randomness import SeededRandom


#: Seconds each reconstruction may take before it reports TIME_LIMIT.
TIME_LIMIT = 120


def measure_all(data: Dataset, k: int, epsilon, seed: int):
    """All k-way marginals, one Laplace vector each, the budget split evenly (sequential)."""
    sets = list(itertools.combinations(data.domain.attrs, k))
    acct = Accountant.pure(epsilon)
    share = Fraction(epsilon) / len(sets)
    rng = SeededRandom(seed)
    return [laplace_mechanism(Marginal(data.domain, s), data, share, acct, rng, label="+".join(s)) for s in sets], acct


def report(name: str, res, seconds: float, truth: np.ndarray) -> None:
    err = np.abs(res.x - truth).sum() / truth.sum() if res.x is not None else float("nan")
    print(f"  {name:<34} {seconds:7.2f} s  status={res.status.name:<15} backend={res.backend:<6} "
          f"nit={res.nit!s:<6} L1 error/N={err:.4f}  max violation={res.max_violation}")
    if "duality_gap" in res.info:
        print(f"    Frank-Wolfe gap {res.info['duality_gap']:.4g} (objective {res.fun:.6g}): an upper bound on the distance to the optimum")


def main() -> None:
    nltcs = load_binary("nltcs")
    truth = nltcs.histogram().astype(float)
    ms, acct = measure_all(nltcs, 3, 1, seed=1)
    print(f"nltcs: {len(ms)} 3-way marginals measured, ledger total {acct.spent.epsilon} (epsilon = 1)")
    cs = ConstraintSet(nltcs.domain, [NonNegativity()])
    for objective in ("l2", "l1", "linf", "entropy"):
        start = time.perf_counter()
        res = reconstruct(ms, cs, objective, time_limit=TIME_LIMIT)
        report(objective, res, time.perf_counter() - start, truth)
        if objective == "l2":
            l2 = res
    rounding_cs = ConstraintSet(nltcs.domain, [NonNegativity(), Integrality(), Invariant(Total(nltcs.domain), [nltcs.total], name="total")])
    start = time.perf_counter()
    rounded = round_to_integers(l2.x, rounding_cs)
    report("integer rounding (total invariant)", rounded, time.perf_counter() - start, truth)
    print(f"    rounding method: {rounded.info['method']}; total {rounded.x.sum():.0f} = {nltcs.total}")
    print(f"  peak memory so far {peak_memory_mb():.0f} MB")

    d = 20
    dom = Domain(tuple(f"b{i:02d}" for i in range(d)), (2,) * d)
    gen = np.random.default_rng(0)  # synthetic benchmark data, not privacy noise
    records = (gen.random((100_000, d)) < 0.1 + 0.3 * gen.random(d)).astype(np.int64)
    big = Dataset(records, dom)
    ms, _ = measure_all(big, 2, 1, seed=2)
    start = time.perf_counter()
    res = reconstruct(ms, ConstraintSet(dom, [NonNegativity()]), "l2", time_limit=TIME_LIMIT)
    report("2^20 cells, 2-way marginals: NNLS", res, time.perf_counter() - start, big.histogram().astype(float))
    print(f"  peak memory {peak_memory_mb():.0f} MB")


if __name__ == "__main__":
    main()
