"""MWEM benchmark (issue 6): speed on nltcs and the paper's Figures 3 and 4.

1. speed: nltcs (2^16 cells), all 560 3-way marginals' 4,480 cells as the query set,
   epsilon = 1, T = 40, repeated updates each round ("optimised" options below), timed by
   phase; with ``--reference`` also the paper's reference loop (100 plain passes over all
   past measurements each round, one update per measurement), on the same seeds, for the
   error comparison (mean absolute error per 3-way marginal cell).
2. figure4: nltcs, all 2-way / all 3-way marginal cells, T = 20, 30, 40, mean absolute
   error per cell over ``--runs`` runs (the paper: 10), epsilon = 1.
3. figure3: relative entropy KL(data || estimate) vs epsilon on mildew, rochdale, czech,
   workload all 3-way marginals, over ``--runs`` runs (the paper: 100): basic MWEM (Fig. 1,
   T = 10), optimised MWEM (whole-marginal selection, 100 plain repeated passes per round
   as in the reference code, T = 10) and the measure-all baseline (every marginal measured
   with epsilon/|W|, entropy reconstruction limited to 100 passes, n public: the paper's
   "modified Barak" with uniform accuracy). Fitted tables put (numerically) zero mass on
   cells the data holds, where KL(data || estimate) is infinite; the table and the plot use
   the estimate mixed with the uniform table at weight ``SMOOTH`` (as bench_barak.py does),
   and the raw figure (zeros clamped to 1e-300) is printed beside it.

Seeded sources (a benchmark, not a release). Plots (PNG) go to ``--plots DIR`` if given.

Run:  python examples/benchmarks/bench_mwem.py speed figure4 figure3 --runs 10 --plots /tmp/mwem-plots
"""

from __future__ import annotations

import argparse
import time
from fractions import Fraction
from pathlib import Path

import numpy as np

from _common import load_binary
from dpopt.algorithms.mwem import WorkloadEvaluator, mwem
from dpopt.estimate import reconstruct
from dpopt.model.constraints import ConstraintSet, Invariant
from dpopt.model.queries import Total, all_marginals
from dpopt.privacy.accountant import Accountant
from dpopt.privacy.mechanisms import laplace_mechanism
from dpopt.privacy.randomness import make_random

#: The options called "optimised" here: repeated updates with a growing step, a final fit.
OPTIMISED = dict(repeat_passes=5, boost=32.0, final_passes=10)
#: The paper's reference code: 100 plain passes, one update per measurement, in order.
REFERENCE = dict(repeat_passes=100, merge=False)


def mean_cell_error(evaluator, x, truth) -> float:
    return float(np.abs(evaluator.answers(x) - truth).mean())


#: Weight of the uniform table mixed into an estimate for the smoothed relative entropy (as in
#: bench_barak.py): converged fits put (numerically) zero mass on cells the data holds, where
#: KL(data || estimate) is infinite and the raw figure measures only how close to 0 they got.
SMOOTH = 1e-3


def relative_entropy(hist: np.ndarray, x: np.ndarray, smooth: float = 0.0) -> float:
    """KL(data || estimate); with ``smooth`` the estimate is first mixed with the uniform table."""
    p = hist / hist.sum()
    q = (1 - smooth) * np.maximum(x, 1e-300) / x.sum() + smooth / x.size
    keep = p > 0
    return float(np.sum(p[keep] * np.log(p[keep] / q[keep])))


def speed(args) -> None:
    data = load_binary("nltcs")
    W = all_marginals(data.domain, 3)
    ev = WorkloadEvaluator(data.domain, W)
    truth = ev.answers(data.histogram())
    print(f"\nspeed: nltcs, {len(W)} 3-way marginals = {ev.num_rows} cell queries, eps = 1, T = 40")
    for seed in range(args.speed_seeds):
        start = time.perf_counter()
        res = mwem(data, W, 1, rounds=40, rng=make_random(100 + seed), **OPTIMISED)
        total = time.perf_counter() - start
        phases = "  ".join(f"{k[5:]} {v:.3f}s" for k, v in res.info.items() if k.startswith("time_"))
        line = (f"  seed {seed}: optimised {total:.3f} s ({phases}; {res.info['passes']} passes), "
                f"mean |error| per cell {mean_cell_error(ev, res.x, truth):.1f}")
        if args.reference:
            start = time.perf_counter()
            ref = mwem(data, W, 1, rounds=40, rng=make_random(100 + seed), **REFERENCE)
            line += (f"; reference {time.perf_counter() - start:.1f} s, "
                     f"error {mean_cell_error(ev, ref.x, truth):.1f}")
        print(line, flush=True)


def figure4(args) -> None:
    data = load_binary("nltcs")
    rows = {}
    print(f"\nfigure 4: nltcs, eps = 1, mean |error| per marginal cell over {args.runs} runs (optimised MWEM)")
    for k in (2, 3):
        W = all_marginals(data.domain, k)
        ev = WorkloadEvaluator(data.domain, W)
        truth = ev.answers(data.histogram())
        for T in (20, 30, 40):
            errs = [mean_cell_error(ev, mwem(data, W, 1, rounds=T, rng=make_random(1000 * T + r), **OPTIMISED).x, truth)
                    for r in range(args.runs)]
            rows[(k, T)] = errs
            print(f"  {k}-way  T = {T}: {np.mean(errs):8.1f} ± {np.std(errs):6.1f}", flush=True)
    if args.plots:
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5, 3.5))
        for k in (2, 3):
            ax.errorbar([20, 30, 40], [np.mean(rows[(k, T)]) for T in (20, 30, 40)],
                        yerr=[np.std(rows[(k, T)]) for T in (20, 30, 40)], marker="o", label=f"{k}-way")
        ax.set(xlabel="T", ylabel="mean |error| per cell", title="nltcs, eps = 1")
        ax.legend()
        fig.tight_layout()
        fig.savefig(Path(args.plots) / "mwem_figure4_nltcs.png", dpi=120)


def measure_all_baseline(data, W, epsilon, seed) -> np.ndarray:
    acct = Accountant.pure(epsilon)
    share = Fraction(epsilon) / len(W)
    rng = make_random(seed)
    ms = [laplace_mechanism(q, data, share, acct, rng) for q in W]
    # n is public here as for MWEM (which starts from n * uniform).
    total = ConstraintSet(data.domain, [Invariant(Total(data.domain), [data.total], "n")])
    return reconstruct(ms, total, objective="entropy", max_passes=100, tol=1e-7).x


def figure3(args) -> None:
    epsilons = [Fraction(1, 10), Fraction(1, 4), Fraction(1, 2), Fraction(1), Fraction(2)]
    print(f"\nfigure 3: relative entropy vs epsilon, all 3-way marginals, {args.runs} runs each")
    results = {}
    for name in ("mildew", "rochdale", "czech"):
        data = load_binary(name)
        hist = data.histogram()
        W = all_marginals(data.domain, 3)
        for eps in epsilons:
            tables = {"basic": [], "optimised": [], "measure-all": []}
            for r in range(args.runs):
                seed = 7919 * r + int(eps * 1000)
                tables["basic"].append(mwem(data, W, eps, rounds=10, rng=make_random(seed)).x)
                tables["optimised"].append(mwem(data, W, eps, rounds=10, rng=make_random(seed), select="block",
                                                repeat_passes=100).x)
                tables["measure-all"].append(measure_all_baseline(data, W, eps, seed))
            row = {k: [relative_entropy(hist, x, SMOOTH) for x in v] for k, v in tables.items()}
            raw = {k: [relative_entropy(hist, x) for x in v] for k, v in tables.items()}
            results[(name, eps)] = row
            print(f"  {name:9s} eps = {float(eps):4.2f}: smoothed " + "  ".join(
                f"{k} {np.mean(v):.4f}" for k, v in row.items()) + "  | raw " + "  ".join(
                f"{np.mean(v):.4g}" for v in raw.values()), flush=True)
    if args.plots:
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 3, figsize=(12, 3.5))
        for ax, name in zip(axes, ("mildew", "rochdale", "czech")):
            for method in ("basic", "optimised", "measure-all"):
                ax.plot([float(e) for e in epsilons], [np.mean(results[(name, e)][method]) for e in epsilons],
                        marker="o", label=method)
            ax.set(xscale="log", yscale="log", xlabel="epsilon", ylabel=f"KL, smoothed {SMOOTH:g}", title=name)
        axes[0].legend()
        fig.tight_layout()
        fig.savefig(Path(args.plots) / "mwem_figure3.png", dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("parts", nargs="*", default=["speed"], choices=["speed", "figure4", "figure3"])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--speed-seeds", type=int, default=3)
    parser.add_argument("--reference", action="store_true", help="also time the paper's reference loop (~30 s a run)")
    parser.add_argument("--plots", type=str, default=None, help="directory for PNG plots")
    args = parser.parse_args()
    if args.plots:
        Path(args.plots).mkdir(parents=True, exist_ok=True)
    for part in args.parts:
        {"speed": speed, "figure4": figure4, "figure3": figure3}[part](args)


if __name__ == "__main__":
    main()
