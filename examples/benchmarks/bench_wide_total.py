"""Validation of the marginal-space estimator's total rule (issue 27): free total against ``total="auto"``.

:func:`dpopt.estimate.marginal_space.estimate_marginals` holds the record count at its measured
estimate ``n̂`` when the free total's predicted bias exceeds ``n̂``'s standard error
(:mod:`dpopt.estimate.marginal_space.total`). This script checks, on data the rule was *not*
designed on (not adult), that it never hurts where the free total was fine: on the *same*
measurements it runs ``total="free"`` (the old default), ``total="auto"`` (the new one) and, when
``auto`` keeps the total free, ``total="measured"`` for reference. It prints the rule's evidence
(predicted bias, standard error of ``n̂``), each total against the true n and each estimate's mean
L1 error / n over the workload marginals.

Cases (``--cases``): ``nltcs`` (16 binary attributes, every triple: solved as a table),
``bnDkK`` (the Bayesian network of ``bench_wide.py``, seed 1, n = 50,000: every K-way marginal
of D attributes), and ``autoDkK`` (the same data through ``auto``'s wide plan,
:mod:`dpopt.strategy.wide_selection`, whose measurements then go to the estimator).

Run::

    OPENBLAS_NUM_THREADS=1 nice -n 10 python examples/benchmarks/bench_wide_total.py \\
        --cases nltcs bn27k3 bn27k2 bn50k2 bn100k2 auto27k3 auto50k2 auto100k2 --accounting zcdp pure --eps 1 0.1
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from itertools import combinations
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import load_binary, peak_memory_mb  # noqa: E402
from bench_wide import RECORDS, errors, measure_sets  # noqa: E402


def case_data(case: str):
    """``(data, sets, truths)`` of a case."""
    if case == "nltcs":
        data = load_binary("nltcs")
        sets = list(combinations(data.domain.attrs, 3))
        return data, sets, {s: data.marginal(s).astype(float) for s in sets}
    from dpopt.datasets.bayes_net import random_sparse_network

    match = re.fullmatch(r"(?:bn|auto)(\d+)k(\d+)", case)
    if match is None:
        raise SystemExit(f"unknown case {case!r}: nltcs, bnDkK or autoDkK")
    d, k = int(match[1]), int(match[2])
    net = random_sparse_network(d, seed=1)
    data = net.sample(RECORDS, 2)
    combos, _ = net.marginals(k)
    sets = [tuple(data.domain.attrs[a] for a in c) for c in combos]
    counts = data.binary_marginal_counts(k)
    return data, sets, {s: counts[i].astype(float) for i, s in enumerate(sets)}


def measurements(case, data, sets, accounting, eps, seed):
    if not case.startswith("auto"):
        return measure_sets(data, sets, accounting, eps, seed)[0], "every workload marginal"
    from dpopt.privacy.randomness import make_random
    from dpopt.strategy.wide_selection import plan_wide_selection, run_wide_selection

    _, budget = measure_sets(data, sets[:1], accounting, eps, seed)  # the budget only (one marginal measured)
    plan = plan_wide_selection(data.domain, sets, budget, budget.noise(None))
    chosen = run_wide_selection(plan, data, budget.accountant(), make_random(seed))
    return chosen.measurements, f"auto wide: {chosen.mode}, {len(chosen.measurements)} measurements"


def run(case, accounting, eps, seed) -> None:
    from dpopt.estimate.marginal_space import estimate_marginals

    data, sets, truths = case_data(case)
    ms, what = measurements(case, data, sets, accounting, eps, seed)
    n = float(data.total)
    print(f"\n== {case}, {accounting}, eps = {eps}: {what}; n = {n:,.0f}", flush=True)
    modes = ["free", "auto"]
    for mode in modes:
        cpu = time.process_time()
        est = estimate_marginals(ms, sets, total=mode)
        cpu = time.process_time() - cpu
        choice = est.info["total"]
        err = errors(est.marginals(sets), truths, n) if est.success else float("nan")
        print(f"  total={mode:<9} error {err:.4f}  total {est.total:>10,.0f} ({est.total / n - 1:+.2%})  "
              f"{est.status.name} {cpu:6.1f} CPU-s  held {choice['held']}", flush=True)
        if mode == "auto":
            print(f"    rule: {choice['reason']}", flush=True)
            if not choice["held"] and "measured" not in modes:
                modes.append("measured")
    print(f"  peak {peak_memory_mb():.0f} MB", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=["nltcs", "bn27k3", "bn27k2", "bn50k2", "bn100k2"])
    parser.add_argument("--eps", nargs="+", type=float, default=[1.0])
    parser.add_argument("--accounting", nargs="+", default=["zcdp", "pure"], choices=["zcdp", "pure"])
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    for case in args.cases:
        for accounting in args.accounting:
            for eps in args.eps:
                run(case, accounting, eps, args.seed)


if __name__ == "__main__":
    main()
