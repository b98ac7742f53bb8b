"""Which path should the projection take, by clique cells? (issue 27; the evidence behind
``dpopt.estimate.marginal_space.polytope.projection.NEWTON_CELLS``).

Least squares over the local polytope (``estimate_marginals(objective="l2")``) on every k-set of
a case, fitted twice from the same measurements: by the default path for its size, and by the path
of projected-Newton rounds then ADMM (``NEWTON_CELLS = 0``). Cases: slices of adult_pgm (every
triple of the attributes named) and generated binary networks (every k-set of d attributes, as
``bench_wide.py --cases bn``). Prints, per case and path, the clique cells, status, certified gap,
products, CPU seconds and the mean L1/n error over the k-sets (bench_wide's measure), zCDP.

Run::

    OPENBLAS_NUM_THREADS=1 python examples/benchmarks/bench_newton_cells.py --eps 1 \\
        --adult "age marital-status occupation race hours-per-week income>50K sex" \\
        --bn 27:3 100:2
"""

from __future__ import annotations

import argparse
import sys
import time
from itertools import combinations
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_alm_overhead import adult_data  # noqa: E402
from bench_wide import RECORDS, errors, measure_sets  # noqa: E402


def adult_case(attrs: list[str]):
    data = adult_data(tuple(attrs))
    return f"adult {len(attrs)} attributes", data, list(combinations(attrs, 3))


def bn_case(d: int, k: int):
    from dpopt.datasets.bayes_net import random_sparse_network

    net = random_sparse_network(d, seed=1)
    data = net.sample(RECORDS, 2)
    combos, _ = net.marginals(k)
    names = data.domain.attrs
    return f"bn d={d} k={k}", data, [tuple(names[a] for a in c) for c in combos]


def fit(ms, sets, truths, n, newton_cells):
    from dpopt.estimate.marginal_space import estimate_marginals
    from dpopt.estimate.marginal_space.polytope import projection

    default = projection.NEWTON_CELLS
    if newton_cells is not None:
        projection.NEWTON_CELLS = newton_cells
    try:
        cpu = time.process_time()
        est = estimate_marginals(ms, sets, objective="l2")
        seconds = time.process_time() - cpu
    finally:
        projection.NEWTON_CELLS = default
    cert = est.info.get("certificate", {})
    error = errors(est.marginals(sets), truths, n) if est.success else float("nan")
    return {"status": est.status.name, "polytope": est.info.get("polytope"), "cells": est.info.get("clique_cells"),
            "gap": cert.get("gap"), "products": est.nit, "cpu": seconds, "error": error,
            "methods": est.message.split("iterations (")[-1].split(")")[0] if "iterations (" in est.message else ""}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--eps", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--adult", nargs="*", default=[], help="attribute lists (space-separated, quoted)")
    parser.add_argument("--bn", nargs="*", default=[], help="d:k pairs")
    args = parser.parse_args()
    cases = [adult_case(a.split()) for a in args.adult]
    cases += [bn_case(*map(int, p.split(":"))) for p in args.bn]
    for label, data, sets in cases:
        ms, _ = measure_sets(data, sets, "zcdp", args.eps, args.seed)
        truths = {tuple(s): data.marginal(tuple(s)).astype(float) for s in sets}
        n = float(data.total)
        for path, newton_cells in (("default", None), ("rounds, then ADMM", 0)):
            row = fit(ms, sets, truths, n, newton_cells)
            gap = "n/a" if row["gap"] is None else f"{row['gap']:.2g}"
            print(f"{label}: {len(sets)} sets, {row['cells']:,} clique cells; {path} ({row['methods']}): "
                  f"{row['status']}, gap {gap}, {row['products']} products, {row['cpu']:.1f} CPU-s, "
                  f"error {row['error']:.4f}", flush=True)


if __name__ == "__main__":
    main()
