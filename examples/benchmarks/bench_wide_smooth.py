"""Validation of the marginal-space smooth estimate (issue 27) on networks other than bench_wide.py's.

On binary data from ``random_sparse_network(d, seed=NET, window=W)`` (records seed ``NET + 100``,
n = 50,000), ``auto``'s wide plan (:mod:`dpopt.strategy.wide_selection`: one-way marginals,
then every workload marginal or ``d`` selected ones) measures; on the *same* measurements this
compares the least-squares estimate (``ls``: ``objective="l2"``, ``total="auto"``) with the smooth
estimate (``objective="smooth"``, uniform and one-way priors; ``--estimators`` picks them). With
both priors, the last column is the one-way prior's mean difference in error over the workload's
marginals, and its standard error (the evidence that kept the uniform prior). The smooth estimate needs the
junction tree of the *measured* sets to fit (``--max-cells``); where it does not (every pair
measured, say), the row says so: there only ``ls`` applies. bench_wide.py's figures use
network seed 1 and measurement seed 7; the figures here use other seeds.

Each row: the public quantities a rule could read (the mode auto chose, the junction tree's
cells, ``σ̄ D̄ / n̂``: the root-mean-square noise s.d. times the mean cells of a measured
marginal over the measured total), then mean L1/n over the workload per estimator and CPU
seconds. Seeded (a benchmark, not a release).

Run::

    OPENBLAS_NUM_THREADS=1 nice -n 10 python examples/benchmarks/bench_wide_smooth.py --d 50 --k 2 \\
        --net 3 4 5 --seeds 1 2 --accounting pure zcdp --eps 0.1 1
"""

from __future__ import annotations

import argparse
import time
from fractions import Fraction

import numpy as np

ESTIMATORS = {"ls": {"objective": "l2"}, "smooth": {"objective": "smooth", "smooth": {"prior": "uniform"}},
              "smooth-1way": {"objective": "smooth", "smooth": {"prior": "one-way"}}}


def main() -> None:
    from _common import network_workload
    from dpopt.errors import DomainError
    from dpopt.estimate.marginal_space import estimate_marginals
    from dpopt.privacy.budget import Budget
    from dpopt.privacy.randomness import make_random
    from dpopt.strategy.wide_selection import plan_wide_selection, run_wide_selection

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--d", type=int, default=50)
    parser.add_argument("--k", type=int, default=2, choices=[2, 3])
    parser.add_argument("--net", type=int, nargs="+", default=[3, 4, 5], help="network seeds (bench_wide.py uses 1)")
    parser.add_argument("--window", type=int, default=3)
    parser.add_argument("--accounting", nargs="+", default=["pure"], choices=["pure", "zcdp"])
    parser.add_argument("--eps", type=float, nargs="+", default=[1.0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--max-cells", type=int, default=2**22, help="largest junction tree tried")
    parser.add_argument("--estimators", nargs="+", default=list(ESTIMATORS), choices=list(ESTIMATORS))
    args = parser.parse_args()
    estimators = {name: ESTIMATORS[name] for name in args.estimators}
    paired = "smooth" in estimators and "smooth-1way" in estimators
    print(f"{'net':>3} {'acc':>4} {'eps':>4} {'seed':>4} {'mode':>6} {'tree cells':>10} {'noise/count':>11} "
          + " ".join(f"{name:>18}" for name in estimators)
          + ("  1way-uniform (s.e.)" if paired else ""), flush=True)
    for net_seed in args.net:
        _, data, sets, _, truths, n = network_workload(args.d, args.k, net_seed, args.window)
        for accounting in args.accounting:
            for eps in args.eps:
                e = Fraction(eps).limit_denominator(10**6)
                budget = Budget.pure(e) if accounting == "pure" else Budget.zcdp(e * e / 2)
                for seed in args.seeds:
                    plan = plan_wide_selection(data.domain, sets, budget, budget.noise(None))
                    chosen = run_wide_selection(plan, data, budget.accountant(), make_random(seed))
                    ms = chosen.measurements
                    variances = np.array([m.variance for m in ms])
                    cells = np.array([m.query.num_rows for m in ms], dtype=float)
                    rows = cells.sum()
                    sigma_bar = float(np.sqrt(rows / np.sum(cells / variances)))
                    weights = 1.0 / (variances * cells)
                    n_hat = float(np.sum(weights * np.array([m.values.sum() for m in ms])) / weights.sum())
                    ratio = sigma_bar * float(np.mean(cells)) / max(n_hat, 1.0)
                    out, tree, per_set = [], "-", {}
                    for name, options in estimators.items():
                        cpu = time.process_time()
                        try:
                            est = estimate_marginals(ms, sets, max_cells=args.max_cells, **options)
                        except DomainError:
                            out.append(f"{'tree too large':>18}")
                            continue
                        if name == "smooth":
                            tree = est.info["clique_cells"]
                        if not est.success:
                            out.append(f"{est.status.name:>18}")
                            continue
                        fit = est.marginals(sets)
                        per_set[name] = np.array([np.abs(np.asarray(fit[s], float) - truths[s]).sum() / n
                                                  for s in sets])
                        err = float(per_set[name].mean())
                        out.append(f"{err:.4f} ({time.process_time() - cpu:5.1f} s)".rjust(18))
                    # the prior's effect: the mean over the workload of the per-marginal difference, and its
                    # standard error over the workload's marginals
                    diff = ""
                    if paired and "smooth" in per_set and "smooth-1way" in per_set:
                        delta = per_set["smooth-1way"] - per_set["smooth"]
                        diff = f"  {delta.mean():+.5f} ({delta.std(ddof=1) / np.sqrt(delta.size):.5f})"
                    print(f"{net_seed:>3} {accounting:>4} {eps:>4} {seed:>4} {chosen.mode:>6} {tree!s:>10} "
                          f"{ratio:>11.3g} " + " ".join(out) + diff, flush=True)


if __name__ == "__main__":
    main()
