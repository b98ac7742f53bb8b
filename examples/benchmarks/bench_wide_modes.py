"""``auto``'s wide plan forced into each of its modes, beside factored MWEM, paired per seed (issue 27).

On binary data from ``random_sparse_network(d, seed=NET)`` (records seed ``NET + 100``, n = 50,000;
``--bench`` uses bench_wide.py's data instead: network seed 1, records seed 2), every ``k``-way
marginal named, one budget. For each measurement seed and network it runs
:mod:`dpopt.strategy.wide_selection` with ``mode`` = ``auto`` (the default decision), ``all``,
``select`` and ``one-way`` (the probe is charged and drawn in every mode, so the draws up to the
decision are the same), each fitted by the estimator's defaults, the ``records`` of auto's estimate
(:mod:`dpopt.estimate.marginal_space.sampling`, post-processing) and factored MWEM at its documented
defaults (rng ``seed + 1`` as bench_wide.py; its figures are cached in ``--cache`` by cell and
seed, since a run takes a minute). Per run it prints the decision's public and noisy inputs:
``D^/n``, ``E_all/n``, their ratio, ``phi`` and ``steer``.

A seed is one noise stream shared by the networks (the same plan draws the same noise), so the
summary averages the networks within a seed, then gives each mode's mean over seeds, its paired
difference to MWEM and to ``auto`` and the standard error of that difference over seeds.

Error: mean over the workload of ``||estimate - data marginal||_1 / n``. CPU seconds per mode.

Run::

    OPENBLAS_NUM_THREADS=1 nice -n 10 python examples/benchmarks/bench_wide_modes.py --d 27 --k 2 \\
        --accounting pure --eps 1 --bench --seeds 7
    OPENBLAS_NUM_THREADS=1 nice -n 10 python examples/benchmarks/bench_wide_modes.py --d 27 --k 2 \\
        --accounting pure --eps 1 --nets 3 4 5 --seeds 1 2 3 4
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from fractions import Fraction
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

MODES = ("auto", "all", "select", "one-way")


def cell_data(d: int, k: int, net_seed: int | None):
    """``(data, sets, truths, n)``: bench_wide.py's data when ``net_seed`` is None, else network_workload's."""
    if net_seed is None:
        from dpopt.datasets.bayes_net import random_sparse_network

        net = random_sparse_network(d, seed=1)
        data = net.sample(50_000, 2)
        combos, _ = net.marginals(k)
        sets = [tuple(data.domain.attrs[a] for a in c) for c in combos]
        counts = data.binary_marginal_counts(k)
        return data, sets, {s: counts[i].astype(float) for i, s in enumerate(sets)}, float(data.total)
    from _common import network_workload

    _, data, sets, _, truths, n = network_workload(d, k, net_seed)
    return data, sets, truths, n


def error(fitted: dict, truths: dict, n: float) -> float:
    return float(np.mean([np.abs(np.asarray(fitted[s], float) - truths[s]).sum() / n for s in truths]))


def mwem_error(data, k, sets, truths, n, accounting, eps, seed, cache: Path, key: str) -> tuple[float, float]:
    """Factored MWEM at its defaults (bench_wide.py's call), cached by ``key``: ``(error, cpu seconds)``."""
    store = json.loads(cache.read_text()) if cache.exists() else {}
    if key in store:
        return store[key]["error"], store[key]["cpu"]
    from dpopt.algorithms.mwem_factored import factored_mwem
    from dpopt.estimate.engines.factored import BinaryMarginalCells
    from dpopt.privacy.randomness import make_random

    cpu = time.process_time()
    amount = {"epsilon": eps} if accounting == "pure" else {"rho": eps * eps / 2}
    res = factored_mwem(data, k, rng=make_random(seed + 1), **amount)
    cells = BinaryMarginalCells(res.table, k).cells * n
    value = error({s: cells[i] for i, s in enumerate(sets)}, truths, n)
    spent = time.process_time() - cpu
    store = json.loads(cache.read_text()) if cache.exists() else {}
    store[key] = {"error": value, "cpu": spent, "rounds": res.rounds}
    cache.write_text(json.dumps(store, indent=1, sort_keys=True))
    return value, spent


def main() -> None:
    from bench_wide import budget_of
    from dpopt.estimate.marginal_space import estimate_marginals
    from dpopt.model.data import Dataset
    from dpopt.privacy.randomness import make_random
    from dpopt.strategy.wide_selection import plan_wide_selection, run_wide_selection

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--d", type=int, default=27)
    parser.add_argument("--k", type=int, default=2, choices=[2, 3])
    parser.add_argument("--accounting", default="pure", choices=["pure", "zcdp"])
    parser.add_argument("--eps", type=float, default=1.0, help="pure epsilon, or rho = eps^2 / 2 under zCDP")
    parser.add_argument("--nets", type=int, nargs="+", default=[3, 4, 5])
    parser.add_argument("--bench", action="store_true", help="bench_wide.py's data (network 1, records seed 2)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--modes", nargs="+", default=list(MODES) + ["records", "mwem"])
    parser.add_argument("--plan", default="{}", help="JSON keywords of plan_wide_selection (e.g. rounds)")
    parser.add_argument("--cache", type=Path, default=Path("mwem_cache.json"))
    args = parser.parse_args()
    budget = budget_of(args.accounting, args.eps)
    options = {key: (Fraction(v) if key in ("top_up", "select_share", "all_fraction") else v)
               for key, v in json.loads(args.plan).items()}
    nets = [None] if args.bench else args.nets
    results: dict = {}  # (seed, net, mode) -> error
    cpu_of: dict = {m: 0.0 for m in args.modes}
    print(f"d = {args.d}, every {args.k}-way, {args.accounting} eps {args.eps}, "
          f"{'bench data (net 1)' if args.bench else 'nets ' + str(args.nets)}, seeds {args.seeds}, plan {options}",
          flush=True)
    for net in nets:
        data, sets, truths, n = cell_data(args.d, args.k, net)
        plan = plan_wide_selection(data.domain, sets, budget, budget.noise(None), **options)
        for seed in args.seeds:
            line, signals = [], ""
            for mode in [m for m in args.modes if m in MODES]:
                cpu = time.process_time()
                run = run_wide_selection(plan, data, budget.accountant(), make_random(seed), mode=mode)
                est = estimate_marginals(run.measurements, sets)
                results[seed, net, mode] = error(est.marginals(sets), truths, n)
                cpu_of[mode] += time.process_time() - cpu
                line.append(f"{mode}{'(' + run.mode + ')' if mode == 'auto' else ''} "
                            f"{results[seed, net, mode]:.4f}")
                if mode == "auto":
                    signals = (f"D^/n {run.deviation / n:.4f} E_all/n {run.expected_noise_all / n:.4f} "
                               f"ratio {run.expected_noise_all / max(run.deviation, 1):.3f} phi {run.phi} "
                               f"steer {None if run.steer is None else round(run.steer, 3)}")
                    if "records" in args.modes:
                        cpu = time.process_time()
                        codes = Dataset(est.records(rng=make_random(99)), data.domain)
                        scale = n / max(codes.total, 1)
                        results[seed, net, "records"] = error({s: codes.marginal(list(s)) * scale for s in sets},
                                                              truths, n)
                        cpu_of["records"] += time.process_time() - cpu
                        line.append(f"records {results[seed, net, 'records']:.4f}")
            if "mwem" in args.modes:
                key = f"d{args.d}k{args.k}-{args.accounting}-{args.eps}-net{'bench' if net is None else net}-s{seed}"
                results[seed, net, "mwem"], spent = mwem_error(data, args.k, sets, truths, n, args.accounting,
                                                               args.eps, seed, args.cache, key)
                cpu_of["mwem"] += spent
                line.append(f"mwem {results[seed, net, 'mwem']:.4f}")
            print(f"  net {'bench' if net is None else net} seed {seed}: " + "  ".join(line) + f"   [{signals}]",
                  flush=True)
    summarise(results, args.modes, args.seeds, nets, cpu_of)


def summarise(results, modes, seeds, nets, cpu_of) -> None:
    """Each mode's mean over seeds (networks averaged within a seed), paired differences, s.e. over seeds."""
    per_seed = {m: np.array([np.mean([results[s, net, m] for net in nets]) for s in seeds]) for m in modes}
    se = (lambda x: float(np.std(x, ddof=1) / np.sqrt(len(x))) if len(x) > 1 else float("nan"))  # noqa: E731
    print("  mode       mean     - mwem (s.e., wins)         - auto (s.e., wins)        CPU-s")
    for m in modes:
        parts = [f"  {m:<9} {per_seed[m].mean():.4f}"]
        for ref in ("mwem", "auto"):
            if ref in per_seed and ref != m:
                diff = per_seed[m] - per_seed[ref]
                parts.append(f"{diff.mean():+.4f} ({se(diff):.4f}, {int((diff < 0).sum())}/{len(diff)})")
            else:
                parts.append(" " * 24)
        print("   ".join(parts) + f"   {cpu_of[m]:.1f}", flush=True)


if __name__ == "__main__":
    main()
