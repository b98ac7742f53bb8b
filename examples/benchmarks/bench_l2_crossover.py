"""The l2 engine's active-set polish (``crossover``): how often it runs and what residue it leaves (#25).

1. ``--family``: the reproducer of ``tests/test_l2_crossover.py``: least squares on the residuals up to
   order 2 of a sparse table's noisy histogram (binary attributes, 20 draws each), the total held.
   Per size: the fits the polish ran on, the largest value left on a cell that HiGHS's QP solver
   (through cvxpy, default tolerances) puts at 0 with a multiplier above 1e-4 of the gradient's
   scale, our answers against HiGHS's, and the fit's CPU seconds.
2. ``--auto``: every l2 engine call of the ``auto`` pipeline (all 3-way marginals, zCDP ρ = ε²/2,
   ε ∈ {0.1, 1}) on generated networks (``random_sparse_network(d, 950)``, records' seed 2250; not
   the benchmark tables; seeded noise, NOT private): the fits the polish ran on, the fits that left
   a positive value on a cell the KKT conditions put at 0 (reduced gradient ``g + Aᵀν`` above 1e-6 of
   its scale at the released point), the largest such value in counts, and the CPU seconds per fit.

Run the same script against an older tree (``PYTHONPATH=<tree>``) for the figures before a change.

    OPENBLAS_NUM_THREADS=1 python examples/benchmarks/bench_l2_crossover.py --family --auto
"""

from __future__ import annotations

import argparse
import time
from fractions import Fraction

import numpy as np
import scipy.sparse as sp


def family(sizes=(4, 5, 6), draws: int = 20) -> None:
    import cvxpy as cp

    from dpopt.estimate import reconstruct
    from dpopt.estimate.choice.statistics import residual_statistics
    from dpopt.model.constraints import ConstraintSet, Invariant, NonNegativity
    from dpopt.model.domain import Domain
    from dpopt.model.measurement import Measurement
    from dpopt.model.queries import Identity, Total

    for d in sizes:
        ran, worst, answers, cpu, bound_cells = 0, 0.0, 0.0, 0.0, 0
        for seed in range(draws):
            dom = Domain.from_dict({f"a{i}": 2 for i in range(d)})
            gen = np.random.default_rng(seed)  # benchmark input and noise
            x = gen.integers(0, 8, dom.size).astype(float)
            x[: dom.size // 2] = 0.0
            y = x + gen.normal(0, 4.0, dom.size)
            stats = residual_statistics([Measurement(Identity(dom), y, "gaussian", 4.0, 16.0)])
            meas = stats.measurement([a for a in stats.sets if len(a) <= 2])
            q, v = meas.query, np.asarray(meas.values, dtype=np.float64)
            i0 = list(q.sets).index(())
            total = max(float(v[int(q.offsets[i0])] / q.weights[i0]), 1.0)
            cs = ConstraintSet(dom, [NonNegativity(), Invariant(Total(dom), np.array([total]), name="held total")])
            start = time.process_time()
            r = reconstruct([Measurement(q, v, "derived", 1.0, 1.0)], cs, "l2")
            cpu += time.process_time() - start
            ran += "crossover" in r.info
            Q = q.to_dense()
            xr = cp.Variable(dom.size)
            nonneg = xr >= 0
            cp.Problem(cp.Minimize(cp.sum_squares(Q @ xr - v)), [cp.sum(xr) == total, nonneg]).solve(solver=cp.HIGHS)
            bound = np.asarray(nonneg.dual_value) > 1e-4 * float(np.abs(2 * Q.T @ v).max())
            bound_cells += int(bound.sum())
            worst = max(worst, float(r.x[bound].max(initial=0.0)))
            answers = max(answers, float(np.abs(Q @ (r.x - xr.value)).max() / max(1.0, np.abs(Q @ xr.value).max())))
        print(f"residuals <= 2 of {d} binary attributes, total held, {draws} draws: polish ran on {ran}; "
              f"largest value on the {bound_cells} cells HiGHS puts at 0: {worst:.2e}; answers against HiGHS "
              f"{answers:.1e} relative; fit {cpu / draws:.3f} CPU s each", flush=True)


def _kkt_bound(problem, x) -> np.ndarray:
    """Cells whose reduced gradient at ``x`` exceeds 1e-6 of its scale (``ν`` fitted on ``x``'s clearly
    positive cells): the cells the KKT conditions put at 0."""
    from dpopt.estimate.engines.least_squares import normalised_sigmas

    Q = problem.stacked_sparse().tocsr()
    w = 1.0 / normalised_sigmas(problem)
    y = problem.targets()
    g = Q.T @ (w * w * (Q @ x - y))
    A = sp.csr_matrix(problem.constraints.equality_rows()[0])
    if A.shape[0]:
        positive = x > 1e-6 * x.max()
        g = g + A.T @ np.linalg.lstsq(A[:, positive].toarray().T, -g[positive], rcond=None)[0]
    return g > 1e-6 * float(np.abs(Q.T @ (w * w * y)).max())


def auto(cases=((8, 1000), (9, 1000), (12, 5000)), seeds: int = 4) -> None:
    import dpopt.estimate as estimate
    from bench_auto import run_auto_params
    from dpopt.algorithms.auto import AutoParams
    from dpopt.datasets.bayes_net import random_sparse_network
    from dpopt.privacy.budget import Budget
    from dpopt.spec.workload import WorkloadDeclaration

    calls = []
    engine, units = estimate.ENGINES["l2"], estimate.in_original_units

    def recording_engine(problem, *args, **kwargs):
        start = time.process_time()
        result = engine(problem, *args, **kwargs)
        calls.append({"problem": problem, "result": result, "cpu": time.process_time() - start, "scale": 1.0})
        return result

    def recording_units(result, problem, prepared):
        if calls and calls[-1]["result"] is result:
            calls[-1]["scale"] = prepared.scale
        return units(result, problem, prepared)

    estimate.ENGINES["l2"], estimate.in_original_units = recording_engine, recording_units
    try:
        for d, n in cases:
            data = random_sparse_network(d, seed=950).sample(n, 2250)
            fits = ran = dirty = 0
            worst, cpu = 0.0, []
            for eps in (Fraction(1, 10), Fraction(1)):
                for seed in range(seeds):
                    calls.clear()
                    run_auto_params(data, AutoParams(WorkloadDeclaration(k=3)), Budget.zcdp(eps * eps / 2), seed)
                    for c in calls:
                        r = c["result"]
                        if not r.success or r.x is None:
                            continue
                        fits += 1
                        ran += "crossover" in r.info
                        left = r.x[_kkt_bound(c["problem"], r.x)]
                        dirty += bool((left > 0).any())
                        worst = max(worst, float(left.max(initial=0.0)) * c["scale"])
                        cpu.append(c["cpu"])
            print(f"auto, {d} attributes, {n:,} records, zCDP eps 0.1 and 1, {seeds} seeds each: {fits} l2 fits, "
                  f"polish ran on {ran}; {dirty} left a positive value on a cell the KKT conditions put at 0 "
                  f"(largest {worst:.2e} counts); fit {np.mean(cpu):.3f} CPU s mean, {np.max(cpu):.3f} max", flush=True)
    finally:
        estimate.ENGINES["l2"], estimate.in_original_units = engine, units


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", action="store_true", help="the reproducer family against HiGHS")
    parser.add_argument("--auto", action="store_true", help="the auto pipeline's l2 fits on generated networks")
    args = parser.parse_args()
    if args.family or not args.auto:
        family()
    if args.auto or not args.family:
        auto()


if __name__ == "__main__":
    main()
