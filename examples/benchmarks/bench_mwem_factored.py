"""Factored MWEM benchmark (issue 6): the scaling experiment of Hardt, Ligett, McSherry 2012, §4.1.

Synthetic data as in the paper: ``--records`` records (100,000), each of the binary
attributes set independently with probability ``--density`` (0.1), drawn from a seeded
numpy Generator (benchmark data, not privacy noise). ``T`` = number of attributes.

* case ``i``:  100 attributes, every 3-way marginal (161,700 marginals, 1,293,600 cells);
* case ``ii``: 1000 attributes, every 2-way marginal (499,500 marginals, 1,998,000 cells).

Printed per case: time of the data evaluation (once) and of the MWEM logic (scoring,
capped-group mask, selection, measurement, update), total time, peak memory, the largest
group of the factored estimate, the candidates excluded by the group cap, and the mean /
max absolute error over every cell of the workload against the data (the uniform start's
error alongside). The paper reports 19 s of MWEM logic for 1000 attributes on 48 cores.

Groups are capped at ``--max-group-cells`` (2^20): by default (``--on-large-group
exclude``) each round's selection runs only over the queries whose measurement keeps every
group within the cap (a data-independent restriction, see
:mod:`dpopt.algorithms.mwem_factored`), so the run reaches ``T`` = the number of
attributes. ``--on-large-group error`` restores the old behaviour: the run stops with an
error naming the round at the first selection that would need a larger merge.

The noise comes from a seeded source (a benchmark, not a release).

Run (both cases, ~minutes on 2 cores):
    OPENBLAS_NUM_THREADS=2 nice -n 10 python examples/benchmarks/bench_mwem_factored.py
Whole-marginal selection with repeated passes over the new measurement's group:
    OPENBLAS_NUM_THREADS=2 nice -n 10 python examples/benchmarks/bench_mwem_factored.py \
        --select block --repeat-passes 10 --pass-scope group
Quick run:
    python examples/benchmarks/bench_mwem_factored.py --case custom --attributes 60 --ways 2 --records 20000
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from _common import peak_memory_mb
from dpopt.algorithms.mwem_factored import binary_marginal_counts, factored_mwem
from dpopt.errors import DomainError
from dpopt.estimate.engines.factored import BinaryMarginalCells, FactoredTable
from dpopt.model.data import Dataset
from dpopt.model.domain import Domain
from dpopt.privacy.randomness import make_random

CASES = {"i": (100, 3), "ii": (1000, 2)}


def independent_bits(records: int, attributes: int, density: float, seed: int) -> Dataset:
    """Records whose bits are independent Bernoulli(density), generated in chunks."""
    gen = np.random.default_rng(seed)
    codes = np.empty((records, attributes), dtype=np.int64)
    step = max(1, 2**24 // attributes)
    for start in range(0, records, step):
        stop = min(records, start + step)
        codes[start:stop] = gen.random((stop - start, attributes)) < density
    domain = Domain(tuple(f"b{i}" for i in range(attributes)), (2,) * attributes)
    return Dataset(codes, domain)


def run_case(attributes: int, ways: int, args) -> None:
    tick = time.perf_counter()
    data = independent_bits(args.records, attributes, args.density, args.seed)
    rounds = args.rounds or attributes
    print(f"\n== {attributes} binary attributes, all {ways}-way marginals, {args.records} records, "
          f"density {args.density}, T = {rounds}, eps = {args.epsilon}, select = {args.select}, "
          f"repeat_passes = {args.repeat_passes} ({args.pass_scope}), max_group_cells = {args.max_group_cells}, "
          f"on_large_group = {args.on_large_group} "
          f"(data generated in {time.perf_counter() - tick:.1f} s, not counted)", flush=True)
    start = time.perf_counter()
    try:
        res = factored_mwem(data, ways, args.epsilon, rounds=rounds, rng=make_random(args.seed + 1),
                            select=args.select, repeat_passes=args.repeat_passes, pass_scope=args.pass_scope,
                            max_group_cells=args.max_group_cells, on_large_group=args.on_large_group)
    except DomainError as exc:
        print(f"  FAILED at round {getattr(exc, 'round', '?')} after {time.perf_counter() - start:.1f} s: {exc}")
        print(f"  peak memory          {peak_memory_mb():8.0f} MB", flush=True)
        return
    total = time.perf_counter() - start
    info = res.info
    print(f"  candidates           {info['candidates']:>10,d} ({info['marginals']:,d} marginals)")
    print(f"  data evaluation      {info['time_data']:8.2f} s (once: matrix products + inclusion-exclusion)")
    print(f"  MWEM logic           {info['time_logic']:8.2f} s = score {info['time_score']:.2f} + cap mask "
          f"{info['time_mask']:.2f} + select {info['time_select']:.2f} + measure {info['time_measure']:.2f} "
          f"+ update {info['time_update']:.2f}")
    print(f"  exponential mech.    {1000 * info['time_select'] / rounds:8.1f} ms per round "
          f"over at most {info['candidates']:,d} candidates")
    print(f"  total                {total:8.2f} s")
    print(f"  peak memory          {peak_memory_mb():8.0f} MB")
    sizes = info["group_sizes"]
    histogram = np.bincount(sizes)
    print(f"  largest group        {sizes[0]} attributes ({info['largest_group_cells']:,d} cells); "
          f"{info['groups']} groups, {info['merges']} merges; groups by size: "
          + ", ".join(f"{s}:{c}" for s, c in enumerate(histogram) if c))
    excluded = np.asarray(info["excluded_candidates"])
    hit = np.flatnonzero(excluded)
    print(f"  excluded candidates  {info['excluded_candidates_total']:,d} over {rounds} rounds "
          + (f"(first in round {hit[0] + 1}; last round {excluded[-1]:,d} of {info['candidates']:,d}, "
             f"{100 * excluded[-1] / info['candidates']:.1f}%)" if hit.size else "(none)"))

    tick = time.perf_counter()
    truth = binary_marginal_counts(data, ways)
    n = float(data.total)
    fitted = np.abs(n * BinaryMarginalCells(res.table, ways).cells - truth)
    uniform = np.abs(n * BinaryMarginalCells(FactoredTable(data.domain, n), ways).cells - truth)
    print(f"  error per cell       mean {fitted.mean():.1f}, max {fitted.max():.1f} "
          f"(uniform start: mean {uniform.mean():.1f}, max {uniform.max():.1f}; n = {n:.0f}) "
          f"[evaluated in {time.perf_counter() - tick:.1f} s]", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", choices=["i", "ii", "both", "custom"], default="both")
    parser.add_argument("--attributes", type=int, default=None, help="custom case: number of attributes")
    parser.add_argument("--ways", type=int, default=2, help="custom case: marginal order (1-3)")
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--density", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=None, help="T (default: the number of attributes)")
    parser.add_argument("--epsilon", type=str, default="1")
    parser.add_argument("--select", choices=["query", "block"], default="query")
    parser.add_argument("--repeat-passes", type=int, default=0)
    parser.add_argument("--pass-scope", choices=["all", "group"], default="all")
    parser.add_argument("--max-group-cells", type=int, default=2**20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--on-large-group", choices=["exclude", "error"], default="exclude",
                        help="exclude: capped groups (default); error: stop at the first too-large merge")
    args = parser.parse_args()
    if args.case == "custom" or args.attributes is not None:
        run_case(args.attributes or 50, args.ways, args)
        return
    for name in (("i", "ii") if args.case == "both" else (args.case,)):
        run_case(*CASES[name], args)


if __name__ == "__main__":
    main()
