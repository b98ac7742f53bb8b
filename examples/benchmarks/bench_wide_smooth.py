"""Validation of the marginal-space smooth estimate (issue 27) on networks other than bench_wide.py's.

On binary data from ``random_sparse_network(d, seed=NET, window=W)`` (records seed ``NET + 100``,
n = 50,000), ``auto``'s wide plan (:mod:`dpopt.strategy.wide_selection`: one-way marginals,
then every workload marginal or ``d`` selected ones) measures; on the *same* measurements this
compares the least-squares estimate (``ls``: ``objective="l2"``, ``total="auto"``) with the smooth
estimate (``objective="smooth"``) under the uniform prior (``smooth``, the default before issue
27), the one-way prior (``smooth-1way``) and the per-attribute prior (``smooth-attribute``, the
default since: marginal_space/graphical/smooth.py, equation (8)); ``--estimators`` picks them. Each other
smooth estimate gets a last column: its mean difference in error from ``smooth`` over the
scored marginals, and its standard error (paired: the same measurements). The smooth estimate needs the
junction tree of the *measured* sets to fit (``--max-cells``); where it does not (every pair
measured, say), the row says so: there only ``ls`` applies. bench_wide.py's figures use
network seed 1 and measurement seed 7; the figures here use other seeds.

Each row: the public quantities a rule could read (the mode auto chose, the junction tree's
cells, ``σ̄ D̄ / n̂``: the root-mean-square noise s.d. times the mean cells of a measured
marginal over the measured total), then mean L1/n over the workload per estimator and CPU
seconds; for the smooth estimates also the CPU seconds of reading the workload's marginals that
no clique holds (``info["read"]``: elimination over the tree, junction_tree.py's notes), and the
process's peak resident memory so far. Seeded (a benchmark, not a release).

``--groups`` merges consecutive binary attributes into attributes of ``2^g`` values (skewed,
as adult's are): ``auto`` plans for every ``k``-set of them and ``--eval`` drawn sets are
scored; ``--pgm`` adds Private-PGM (mbi, 1,000 mirror-descent iterations) on the same
measurements. ``smooth-noisiest`` is a candidate rule, ``λ = c / σ_max``, paired with the default
``λ = c / σ̄`` (issue 27: it closes the gap to PGM on the merged domains but loses on the binary
d = 27 triples at pure ε 0.1, so it is not the default; marginal-space.md).

``--adult`` instead measures adult_pgm's chain of triples (attributes i, i+1, i+2, as
bench_wide.py's ``adult-chain``, its measurement seed 7) and releases all 364 triples from it:
the read's large case (conditioning attributes of up to 100 values). ``DPOPT_SHARED_DATA``
must point at the shared data.

Run::

    OPENBLAS_NUM_THREADS=1 nice -n 10 python examples/benchmarks/bench_wide_smooth.py --d 50 --k 2 \\
        --net 3 4 5 --seeds 1 2 --accounting pure zcdp --eps 0.1 1
    OPENBLAS_NUM_THREADS=1 nice -n 10 python examples/benchmarks/bench_wide_smooth.py --d 100 --k 2 --net 3 \\
        --seeds 1 --estimators smooth                       # the read on 4,950 pairs
    OPENBLAS_NUM_THREADS=1 nice -n 10 python examples/benchmarks/bench_wide_smooth.py --d 45 --k 3 \\
        --groups 1,7,3,1,7,4,1,2,6,1,7,3,1,1 --net 3 4 5 --seeds 1 2 --accounting zcdp --eps 0.1 1 \\
        --estimators smooth smooth-1way smooth-attribute [--pgm]   # up to 128 values
    DPOPT_SHARED_DATA=/work/shared/data OPENBLAS_NUM_THREADS=1 nice -n 10 \\
        python examples/benchmarks/bench_wide_smooth.py --adult --accounting zcdp --eps 1 --seeds 7
"""

from __future__ import annotations

import argparse
import json
import time
from fractions import Fraction

import numpy as np
from _common import peak_memory_mb

ESTIMATORS = {"ls": {"objective": "l2"}, "smooth": {"objective": "smooth", "smooth": {"prior": "uniform"}},
              "smooth-1way": {"objective": "smooth", "smooth": {"prior": "one-way"}},
              # issue 27 (s27p): the default since then: the one-way factor for the attributes with a
              # cell the K steps cannot resolve, uniform for the others
              "smooth-attribute": {"objective": "smooth", "smooth": {"prior": "per-attribute"}},
              # issue 27 (s27x): λ = c / σ_max, the noisiest measurement's s.d., instead of c / σ̄ (a
              # candidate rule, public quantities only: passed as smoothing = c σ̄ / σ_max)
              "smooth-noisiest": {"objective": "smooth", "smooth": {"prior": "uniform"}, "noisiest": True}}


def noisiest_smoothing(ms) -> float:
    """``c σ̄ / σ_max``: the ``smoothing`` that makes the default ``λ = c / σ̄`` equal ``c / σ_max``
    (σ̄ as in :func:`dpopt.estimate.engines.smooth.smooth_weight`; public quantities only)."""
    from dpopt.estimate.engines.smooth import STEPS, default_smoothing

    variances = np.array([float(m.variance) for m in ms])
    cells = np.array([np.asarray(m.values).size for m in ms], dtype=float)
    sigma_bar = float(np.sqrt(cells.sum() / np.sum(cells / variances)))
    return default_smoothing(STEPS) * sigma_bar / float(np.sqrt(variances.max()))


def main() -> None:
    from _common import network_workload
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
    parser.add_argument("--estimators", nargs="+", default=None, choices=list(ESTIMATORS),
                        help="default: all; with --adult, smooth")
    parser.add_argument("--groups", default="",
                        help="comma-separated bit counts: merge consecutive binary attributes into attributes of "
                             "2^g values (e.g. 1,7,3,...; they must sum to --d); the workload is then every "
                             "k-set of the merged attributes, scored on --eval of them drawn at random")
    parser.add_argument("--eval", type=int, default=60, help="with --groups: workload sets scored")
    parser.add_argument("--pgm", action="store_true", help="also Private-PGM (mbi, 1,000 iterations)")
    parser.add_argument("--adult", action="store_true",
                        help="adult_pgm: its chain of triples measured, all 364 triples released")
    parser.add_argument("--dump", default="", help="append each run's per-marginal errors to this file (JSON "
                        "lines), for paired comparisons of two code versions on the same draws")
    args = parser.parse_args()
    if args.adult:
        adult(args)
        return
    estimators = {name: ESTIMATORS[name] for name in args.estimators or ESTIMATORS}
    others = [o for o in estimators if o.startswith("smooth-")] if "smooth" in estimators else []
    print(f"{'net':>3} {'acc':>4} {'eps':>4} {'seed':>4} {'mode':>6} {'tree cells':>10} {'noise/count':>11} "
          + " ".join(f"{name:>18}" for name in estimators)
          + "".join(f"  {other}-smooth (s.e.)" for other in others), flush=True)
    for net_seed in args.net:
        _, data, sets, _, truths, n = network_workload(args.d, args.k, net_seed, args.window)
        workload = sets
        if args.groups:  # auto plans for every k-set; the estimates are scored on the drawn ones
            data, workload, sets, truths = merged(data, [int(g) for g in args.groups.split(",")], args.k, args.eval)
        for accounting in args.accounting:
            for eps in args.eps:
                e = Fraction(eps).limit_denominator(10**6)
                budget = Budget.pure(e) if accounting == "pure" else Budget.zcdp(e * e / 2)
                for seed in args.seeds:
                    plan = plan_wide_selection(data.domain, workload, budget, budget.noise(None))
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
                        cell, est, per_set[name] = run(ms, sets, truths, n, args.max_cells, options)
                        out.append(cell)
                        if name == "smooth" and est is not None:
                            tree = est.info.get("clique_cells", "-")
                        if per_set[name] is None:
                            del per_set[name]
                    # the prior's effect: the mean over the workload of the per-marginal difference, and its
                    # standard error over the workload's marginals
                    diff = ""
                    for other in others:
                        if "smooth" in per_set and other in per_set:
                            delta = per_set[other] - per_set["smooth"]
                            diff += f"  {delta.mean():+.6f} ({delta.std(ddof=1) / np.sqrt(delta.size):.6f})"
                        else:
                            diff += "  -"
                    if args.pgm:
                        from bench_wide import pgm_row

                        row = pgm_row(data, ms, sets, truths, n)
                        diff += f"  pgm {row.get('error', float('nan')):.4f} ({row.get('cpu_seconds', 0):.0f} s)"
                    if args.dump:
                        with open(args.dump, "a") as f:
                            f.write(json.dumps({"net": net_seed, "accounting": accounting, "eps": eps, "seed": seed,
                                                "mode": chosen.mode, "errors": {k: v.tolist()
                                                                                 for k, v in per_set.items()}}) + "\n")
                    print(f"{net_seed:>3} {accounting:>4} {eps:>4} {seed:>4} {chosen.mode:>6} {tree!s:>10} "
                          f"{ratio:>11.3g} " + " ".join(out) + diff + f"  peak {peak_memory_mb():,.0f} MB", flush=True)


def merged(data, groups, k, scored):
    """The binary records with consecutive attributes merged (``g`` bits → ``2^g`` values, the
    first bit most significant): a generated domain with attributes of many, skewed values
    (the network's biases make most bits 0). Returns the data, ``scored`` of its ``k``-sets drawn
    at random (generator seed 12345), and their counts: ``(data, every k-set, scored sets, counts)``."""
    from itertools import combinations

    from dpopt.model.data import Dataset
    from dpopt.model.domain import Domain

    if sum(groups) != len(data.domain):
        raise SystemExit(f"--groups must sum to --d = {len(data.domain)}, got {sum(groups)}")
    edges = np.concatenate([[0], np.cumsum(groups)])
    codes = np.stack([data.codes[:, a:b] @ (1 << np.arange(b - a)[::-1]) for a, b in zip(edges[:-1], edges[1:])], 1)
    domain = Domain(tuple(f"a{i:02d}" for i in range(len(groups))), tuple(2**g for g in groups))
    data = Dataset(codes, domain)
    every = list(combinations(domain.attrs, k))
    pick = np.random.default_rng(12345).choice(len(every), size=min(scored, len(every)), replace=False)
    sets = [every[i] for i in sorted(pick)]
    return data, every, sets, {s: data.marginal(s).astype(float).ravel() for s in sets}


def run(ms, sets, truths, n, max_cells, options):
    """One estimator on the measurements: its cell of the table (error, CPU s, and for the smooth
    estimate the read's CPU s), the estimate, and the error per workload marginal (None if none)."""
    from dpopt.errors import DomainError
    from dpopt.estimate.marginal_space import estimate_marginals

    cpu = time.process_time()
    options = dict(options)
    if options.pop("noisiest", False):
        options["smooth"] = {**options["smooth"], "smoothing": noisiest_smoothing(ms)}
    try:
        est = estimate_marginals(ms, sets, max_cells=max_cells, **options)
    except DomainError:
        return f"{'tree too large':>18}", None, None
    seconds = time.process_time() - cpu
    if not est.success:
        return f"{est.status.name:>18}", est, None
    fit = est.marginals(sets)
    errors = np.array([np.abs(np.asarray(fit[s], float) - truths[s]).sum() / n for s in sets])
    read = est.info.get("read")
    cell = f"{errors.mean():.4f} ({seconds:5.1f} s" + (f"; read {read['cpu_seconds']:.2f} s)" if read else ")")
    return cell.rjust(18 if not read else 31), est, errors


def adult(args) -> None:
    """adult_pgm's chain of triples measured (bench_wide.py's measurements), all 364 triples
    released by each estimator: error, CPU s, the read's CPU s and sets, peak memory."""
    from itertools import combinations

    from _common import load_adult_pgm
    from bench_wide import measure_sets

    data = load_adult_pgm()
    attrs = data.domain.attrs
    chain = [tuple(attrs[i:i + 3]) for i in range(len(attrs) - 2)]
    sets = list(combinations(attrs, 3))
    truths = {s: data.marginal(s).astype(float) for s in sets}
    n = float(data.total)
    names = args.estimators or ["smooth"]
    print(f"{'acc':>4} {'eps':>4} {'seed':>4} {'tree cells':>10} {'read sets':>9} {'largest':>10} "
          + " ".join(f"{name:>31}" for name in names), flush=True)
    for accounting in args.accounting:
        for eps in args.eps:
            for seed in args.seeds:
                ms, _ = measure_sets(data, chain, accounting, eps, seed)
                out, info = [], {}
                for name in names:
                    cell, est, _ = run(ms, sets, truths, n, args.max_cells, ESTIMATORS[name])
                    out.append(cell)
                    if est is not None and "read" in est.info:
                        info = est.info
                    del est  # not held while the next estimate runs (the peak column is the process's)
                read = info.get("read", {})
                print(f"{accounting:>4} {eps:>4} {seed:>4} {info.get('clique_cells', '-')!s:>10} "
                      f"{read.get('sets', '-')!s:>9} {read.get('largest_array_cells', '-')!s:>10} " + " ".join(out)
                      + f"  peak {peak_memory_mb():,.0f} MB", flush=True)


if __name__ == "__main__":
    main()
