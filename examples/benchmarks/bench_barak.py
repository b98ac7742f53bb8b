"""Benchmark of the Barak et al. (PODS 2007) Fourier release: LP time and KL(true || released).

    python examples/benchmarks/bench_barak.py lp                    # LP timings (nltcs 3-way, synthetic k=20)
    python examples/benchmarks/bench_barak.py kl --reps 20 --plots /tmp/barak-plots

``lp`` times the L-infinity consistency LP (column generation) with exact rounding on nltcs
with all 3-way marginals (|B| = 697, 65,536 cells; target <= 10 s) and on a synthetic
20-attribute binary table with all 3-way marginals (|B| = 1351, 2^20 cells; target <= 60 s).
``--lp-methods linf l1 l2 entropy`` times the other consistency methods on the same cases.

``kl`` prints the relative entropy KL(true || released) of the full table against epsilon
for each consistency method on mildew, czech, rochdale (3-way) and nltcs (2-way and 3-way),
averaged over seeded repetitions, and draws one plot per dataset (PNG files in ``--plots``,
default a temporary directory). The released table is the fractional consistent table
mixed with the uniform table at weight ``SMOOTH`` (basic LP solutions put zero mass on most
cells, where KL would be infinite). The shift method releases marginals only and has no
table, so it is not in this grid. Seeded noise: NOT private, for benchmarking only.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import load_binary  # noqa: E402

from dpopt.algorithms.barak import fourier_consistency, fourier_plan, measure_fourier  # noqa: E402
from dpopt.model.data import Dataset  # noqa: E402
from dpopt.model.domain import Domain  # noqa: E402
from dpopt.privacy.accountant import Accountant  # noqa: E402
from dpopt.privacy.randomness import make_random  # noqa: E402

EPSILONS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0)
METHODS = ("linf", "l1", "l2", "entropy")
SMOOTH = 1e-3
CASES = {  # name: (dataset, marginal order)
    "mildew": ("mildew", 3), "czech": ("czech", 3), "rochdale": ("rochdale", 3),
    "nltcs-2way": ("nltcs", 2), "nltcs-3way": ("nltcs", 3),
}


def synthetic_binary(k: int, n: int, seed: int) -> Dataset:
    """Correlated binary records (a latent class flips each bit with probability 0.2)."""
    gen = np.random.default_rng(seed)  # benchmark data, not privacy noise
    latent = gen.integers(0, 2, size=(n, 1))
    codes = (latent ^ (gen.random((n, k)) < 0.2)).astype(np.int64)
    return Dataset(codes, Domain(tuple(f"b{i:02d}" for i in range(k)), (2,) * k))


def time_lp(label: str, data: Dataset, order: int, target: float, time_limit: float, engine: dict,
            methods=("linf",)) -> None:
    plan = fourier_plan(data.domain, order)
    m = measure_fourier(plan, data, Accountant.pure(1), make_random(0))
    for method in methods:
        start = time.perf_counter()
        r = fourier_consistency(plan, m, method, truth=data, time_limit=time_limit,
                                engine_options=engine if method in ("linf", "l1") else None)
        total = time.perf_counter() - start
        lp = r.lp
        print(f"{label}, {method}: |B| = {plan.closure_size}, cells = {plan.domain.size:,}, status {r.status}; "
              f"{lp['solver']}")
        goal = f" (target <= {target:g} s: {'met' if lp['time'] <= target else 'NOT met'})" if method == "linf" else ""
        print(f"  engine time {lp['time']:.2f} s{goal}, rounds {lp['rounds']}, rows {lp['rows']}, "
              f"cell columns {lp['cell_columns']}, b = {lp.get('max_coefficient_error', float('nan')):.1f}; "
              f"with rounding and report {total:.2f} s")
        _report_errors(r)


def _report_errors(r) -> None:
    if r.success:
        b = r.bounds
        print(f"  marginal L1 error: mean {b.l1_error.mean():.1f}, max {b.l1_error.max():.1f}; "
              f"Theorem 5 bound {b.theorem5_bound.iloc[0]:.3g}; all within: {bool(b.within_bound.all())}")


def kl(true: np.ndarray, released: np.ndarray) -> float:
    p = true / true.sum()
    q = np.maximum(released, 0.0)
    q = (1 - SMOOTH) * q / q.sum() + SMOOTH / q.size
    nz = p > 0
    return float(np.sum(p[nz] * np.log(p[nz] / q[nz])))


def kl_grid(cases, reps: int, epsilons, plots: Path, mw_passes: int, methods=METHODS, progress: bool = False) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots.mkdir(parents=True, exist_ok=True)
    for name in cases:
        dataset, order = CASES[name]
        data = load_binary(dataset)
        truth = data.histogram().astype(float)
        plan = fourier_plan(data.domain, order)
        results = {meth: np.zeros((len(epsilons), reps)) for meth in methods}
        start = time.perf_counter()
        for i, eps in enumerate(epsilons):
            for rep in range(reps):
                m = measure_fourier(plan, data, Accountant.pure(eps), make_random(1000 * rep + i))
                for meth in methods:
                    engine = {"max_passes": mw_passes} if meth == "entropy" and mw_passes else {}
                    solve_start = time.perf_counter()
                    r = fourier_consistency(plan, m, meth, integer=False, engine_options=engine)
                    results[meth][i, rep] = kl(truth, r.binary_table) if r.binary_table is not None else np.nan
                    if progress:  # one line per solve, so that a long run that is stopped still reports
                        print(f"  {name} eps={eps:g} rep={rep} {meth}: KL {results[meth][i, rep]:.4f} "
                              f"({time.perf_counter() - solve_start:.1f} s, {r.status})", flush=True)
        print(f"\n{name}: {order}-way marginals, |B| = {plan.closure_size}, {reps} repetitions "
              f"({time.perf_counter() - start:.0f} s); mean KL(true || released)")
        print("  epsilon  " + "".join(f"{meth:>10}" for meth in methods))
        for i, eps in enumerate(epsilons):
            print(f"  {eps:7g}  " + "".join(f"{np.nanmean(results[meth][i]):10.4f}" for meth in methods))
        failed = {meth: int(np.isnan(results[meth]).sum()) for meth in methods if np.isnan(results[meth]).any()}
        if failed:
            print(f"  failed solves (left out of the means): {failed}")
        fig, ax = plt.subplots(figsize=(5, 3.5))
        for meth in methods:
            ax.plot(epsilons, np.nanmean(results[meth], axis=1), marker="o", label=meth)
        ax.set_xscale("log")
        ax.set_xlabel("epsilon")
        ax.set_ylabel("KL(true || released)")
        ax.set_title(f"{name} ({order}-way, {reps} reps)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(plots / f"barak_kl_{name}{'' if tuple(methods) == METHODS else '_' + '-'.join(methods)}.png", dpi=120)
        plt.close(fig)
    print(f"\nplots written to {plots}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("lp", "kl"))
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--epsilons", type=float, nargs="*", default=list(EPSILONS))
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    parser.add_argument("--plots", type=Path, default=None, help="directory for the PNG plots (default: a temp dir)")
    parser.add_argument("--mw-passes", type=int, default=0,
                        help="entropy by multiplicative weights with this many passes (default 0: the exact backend)")
    parser.add_argument("--lp-method", default=None, help="HiGHS method for the LP masters (default: warm-started "
                        "primal simplex from the NNLS support; naming a method re-solves each master from scratch)")
    parser.add_argument("--time-limit", type=float, default=600.0)
    parser.add_argument("--skip-synthetic", action="store_true")
    parser.add_argument("--methods", nargs="*", default=list(METHODS), choices=list(METHODS),
                        help="consistency methods of the KL grid (l1 on nltcs 3-way takes ~2 min a solve)")
    parser.add_argument("--progress", action="store_true", help="print one line per solve as it finishes")
    parser.add_argument("--lp-methods", nargs="*", default=["linf"], choices=list(METHODS),
                        help="methods ``lp`` times (default: the paper's LP only; the target is for it)")
    args = parser.parse_args()
    if args.what == "lp":
        engine = {"method": args.lp_method} if args.lp_method else {}
        time_lp("nltcs, 3-way marginals", load_binary("nltcs"), 3, 10.0, args.time_limit, engine, args.lp_methods)
        if not args.skip_synthetic:
            time_lp("synthetic k = 20, 3-way marginals", synthetic_binary(20, 50_000, 0), 3, 60.0,
                    args.time_limit, engine, args.lp_methods)
    else:
        plots = args.plots or Path(tempfile.mkdtemp(prefix="barak-plots-"))
        kl_grid(args.cases, args.reps, args.epsilons, plots, args.mw_passes, tuple(args.methods), args.progress)


if __name__ == "__main__":
    main()
