"""Benchmark of the Thaler-Ullman-Vadhan polynomial release (issue 17).

    python examples/benchmarks/bench_polynomial.py accuracy --reps 3 --plots /tmp/poly-plots
    python examples/benchmarks/bench_polynomial.py scaling --plots /tmp/poly-plots
    python examples/benchmarks/bench_polynomial.py degrees
    python examples/benchmarks/bench_polynomial.py spec --specs nltcs_polynomial nltcs_mwem kdd99_dualquery

``accuracy``: worst-case (largest |error| of any cell of any k-way marginal) and mean absolute
error per cell over all k-way marginals, k = 2, 3, against epsilon, on nltcs (16 attributes)
and the 20-attribute synthetic table of bench_barak.py (50,000 records), for

* ``poly``        the release with the exact polynomial (t = k, gamma = 0), variance split;
* ``poly-paper``  the same with Theorem 3.1's noise (one Laplace scale on every coefficient);
* ``poly-auto``   (t, gamma) minimising the Theorem 3.1 bound; it is given the true number of
  records as its public ``records`` hint (a benchmark assumption, stated in the output);
* ``poly+l2``     ``poly`` with the L2 consistency projection (``--consistency``);
* ``barak``       dpopt's Barak et al. release with the paper's L-infinity LP (``barak_release``);
* ``mwem``        MWEM on the same marginals (``mwem``: whole-marginal selection, T = 20 rounds,
  5 repeated and 10 final passes with step boost, the options bench_mwem.py calls optimised).

One PNG per k (rows: data sets; columns: worst, mean). Seeded noise: NOT private.

``scaling``: the first d = 10 ... 60 one-hot attributes of KDD99 (``kdd99_dq.csv.gz``, 494,021
records, one binary attribute per declared level, attribute by attribute), all 3-way marginals,
epsilon = 1: number of released coefficients, plan time, release + evaluation time (all 3-way
marginals evaluated as arrays), the time to build every answer frame, and the error against the
Theorem 3.1 bound. Target: release + evaluation at d = 60 within 60 s.

``degrees``: Fact 4.2's Chebyshev degree beside the least degree found by the LP, with the
exact L1 norm of one record's coefficients over d = 60 attributes.

``spec`` (issue 30): shipped specs (``models/<name>.toml``, the data file named in the spec's
header comment) end to end. Each is run twice: through ``dpopt run`` in a child process (the
whole command: wall and CPU seconds of the child) and in this process through
``dpopt.release.run`` (seconds per step, and the share of the run spent writing the files, of
the in-process run and of the command: target at most 10 %). Default: the polynomial release
of nltcs (target: whole command <= 3 s).

Timings depend on the machine's load (report it with the figures).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
from bench_barak import synthetic_binary  # noqa: E402

from dpopt.algorithms.barak import barak_release  # noqa: E402
from dpopt.algorithms.mwem import mwem  # noqa: E402
from dpopt.algorithms.polynomial import Polynomial  # noqa: E402
from dpopt.model.constraints import ConstraintSet  # noqa: E402
from dpopt.model.data import Dataset  # noqa: E402
from dpopt.model.domain import Domain  # noqa: E402
from dpopt.model.polynomials import chebyshev_disjunction, min_degree_polynomial  # noqa: E402
from dpopt.model.queries import all_marginals  # noqa: E402
from dpopt.model.queries._common import marginalize  # noqa: E402
from dpopt.privacy.budget import Budget  # noqa: E402
from dpopt.privacy.randomness import make_random  # noqa: E402

EPSILONS = (0.1, 0.5, 1.0, 2.0)
METHODS = ("poly", "poly-paper", "poly-auto", "poly+l2", "barak", "mwem")
MWEM_OPTIONS = dict(rounds=20, select="block", repeat_passes=5, boost=32.0, final_passes=10)
#: Declared levels of the KDD99 attributes (kdd99_discretize.py's SPEC), in column order.
KDD_LEVELS = (20, 3, 65, 11, 20, 20, 2, 4, 4, 10, 6, 2, 10, 2, 3, 5, 5, 3, 5, 2, 2, 2, 10, 10, 10, 10, 10, 10,
              10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 23)


# ---- data ---------------------------------------------------------------------------------------
def load_case(name: str) -> Dataset:
    if name == "nltcs":
        return _common.load_binary("nltcs")
    return synthetic_binary(20, 50_000, 0)


def kdd_one_hot(d: int) -> Dataset:
    """The first ``d`` one-hot attributes of KDD99 (one per declared level), as binary data."""
    frame = pd.read_csv(_common.shared_file("kdd99_dq.csv.gz"))
    columns, names = [], []
    for col, levels in zip(frame.columns, KDD_LEVELS):
        codes = frame[col].to_numpy()
        for level in range(levels):
            columns.append(codes == level)
            names.append(f"{col}={level}")
            if len(names) == d:
                return Dataset(np.stack(columns, axis=1).astype(np.int64), Domain(tuple(names), (2,) * d))
    raise SystemExit(f"KDD99 has only {len(names)} declared levels")


# ---- one run of each method: every k-way marginal as an array (Q, 2^k) ----------------------------
def run_method(method: str, data: Dataset, k: int, eps: float, seed: int) -> np.ndarray:
    sets = list(combinations(data.domain.attrs, k))
    rng = make_random(seed)
    if method.startswith("poly"):
        options = {"poly": {}, "poly-paper": {"split": "paper"}, "poly-auto": {"records": data.total},
                   "poly+l2": {"consistency": "l2"}}[method]
        alg = Polynomial(workload=k, **options)
        budget = Budget.pure(eps)
        plan = alg.plan(data.domain, ConstraintSet(data.domain), budget)
        rel = alg.run(plan, data, budget.accountant(), rng)
        frames = rel.info["consistent"] if method == "poly+l2" else rel.answers
        return np.stack([frames[", ".join(s)]["count"].to_numpy() for s in sets])
    if method == "barak":
        rel = barak_release(data, k, epsilon=eps, method="linf", rng=rng, integer=False)
        return np.stack([rel.marginals[s]["count"].to_numpy() for s in sets])
    res = mwem(data, all_marginals(data.domain, k), eps, rng=rng, **MWEM_OPTIONS)
    return np.stack([marginalize(res.x, data.domain, s) for s in sets])


def accuracy(args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots = args.plots or Path(tempfile.mkdtemp(prefix="poly-plots-"))
    plots.mkdir(parents=True, exist_ok=True)
    methods = [m for m in args.methods if m != "poly+l2" or args.consistency]
    results = {}
    for name in args.cases:
        data = load_case(name)
        for k in args.ks:
            truth = np.stack([data.marginal(s) for s in combinations(data.domain.attrs, k)]).astype(float)
            print(f"\n{name}: n = {data.total}, {len(data.domain)} attributes, {truth.shape[0]} {k}-way marginals, "
                  f"{args.reps} repetitions (poly-auto is told n as its public records hint)", flush=True)
            print(f"  {'epsilon':>7}  {'method':<10}  {'worst |err|':>12}  {'mean |err|':>11}  {'worst/n':>8}  "
                  f"{'mean/n':>8}  {'time s':>7}")
            for eps in args.epsilons:
                for method in methods:
                    worst, mean, secs = [], [], []
                    for rep in range(args.reps):
                        start = time.perf_counter()
                        est = run_method(method, data, k, eps, 1000 * rep + int(eps * 100))
                        secs.append(time.perf_counter() - start)
                        err = np.abs(est - truth)
                        worst.append(err.max())
                        mean.append(err.mean())
                    results[(name, k, eps, method)] = (np.mean(worst), np.mean(mean))
                    print(f"  {eps:7g}  {method:<10}  {np.mean(worst):12.1f}  {np.mean(mean):11.2f}  "
                          f"{np.mean(worst) / data.total:8.4f}  {np.mean(mean) / data.total:8.4f}  "
                          f"{np.mean(secs):7.2f}", flush=True)
    for k in args.ks:
        fig, axes = plt.subplots(len(args.cases), 2, figsize=(9, 3.4 * len(args.cases)), squeeze=False)
        for row, name in enumerate(args.cases):
            for col, what in enumerate(("worst-case |error|", "mean |error| per cell")):
                ax = axes[row][col]
                for method in methods:
                    ys = [results[(name, k, e, method)][col] for e in args.epsilons]
                    ax.plot(args.epsilons, ys, marker="o", label=method)
                ax.set_xscale("log")
                ax.set_yscale("log")
                ax.set_xlabel("epsilon")
                ax.set_title(f"{name}, {k}-way: {what}")
            axes[row][0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(plots / f"polynomial_accuracy_{k}way.png", dpi=120)
        plt.close(fig)
    print(f"\nplots written to {plots}")


def scaling(args) -> None:
    rows = []
    for d in args.dims:
        data = kdd_one_hot(d)
        for label, options in (("exact (t = 3)", {}), ("gamma = 1/7 (t = 2)", {"gamma": "1/7"})):
            alg = Polynomial(workload=3, **options)
            budget = Budget.pure(1)
            start = time.perf_counter()
            plan = alg.plan(data.domain, ConstraintSet(data.domain), budget)
            planned = time.perf_counter()
            rel = alg.run(plan, data, budget.accountant(), make_random(d))
            released = time.perf_counter()
            frames = sum(len(f) for f in rel.answers.values())
            framed = time.perf_counter()
            errors = rel.errors(data)
            rows.append({"d": d, "polynomial": label, "coefficients": plan.details.num_coefficients,
                         "marginals": len(plan.details.workload), "cells": frames,
                         "plan_s": planned - start, "release_eval_s": released - planned,
                         "frames_s": framed - released, "worst_err": errors["max_error"].max(),
                         "mean_err": errors["mean_error"].mean(), "bound": errors["bound"].max()})
            r = rows[-1]
            print(f"d = {d:2d} {label:<20} coefficients {r['coefficients']:>8,}  marginals {r['marginals']:>6,}  "
                  f"plan {r['plan_s']:.2f} s  release+evaluation {r['release_eval_s']:.2f} s  "
                  f"frames {r['frames_s']:.2f} s  worst |err| {r['worst_err']:.0f} (bound {r['bound']:.0f})",
                  flush=True)
    table = pd.DataFrame(rows)
    last = table[(table.d == max(args.dims)) & (table.polynomial.str.startswith("exact"))]
    if not last.empty:
        t = float(last.release_eval_s.iloc[0])
        print(f"\ntarget (release + evaluation of all 3-way marginals at d = {max(args.dims)} within 60 s): "
              f"{t:.1f} s, {'met' if t <= 60 else 'NOT met'}")
    if args.plots:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        args.plots.mkdir(parents=True, exist_ok=True)
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
        for label, part in table.groupby("polynomial"):
            axes[0].plot(part.d, part.coefficients, marker="o", label=label)
            axes[1].plot(part.d, part.release_eval_s, marker="o", label=label)
        axes[0].set_ylabel("released coefficients")
        axes[1].set_ylabel("release + evaluation (s)")
        for ax in axes:
            ax.set_xlabel("binary attributes d (KDD99 one-hot)")
            ax.set_yscale("log")
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(args.plots / "polynomial_scaling.png", dpi=120)
        plt.close(fig)
        print(f"plot written to {args.plots / 'polynomial_scaling.png'}")


def degrees(args) -> None:
    print(f"{'k':>4} {'gamma':>7} {'Chebyshev (Fact 4.2)':>21} {'LP minimum':>11} {'LP gamma':>9} "
          f"{'record L1, d=60 (Cheb / LP)':>28}")
    for k in (3, 5, 10, 20, 50, 100):
        for gamma in ("1/3", "1/10", "1/100"):
            cheb = chebyshev_disjunction(k, gamma)
            lp = min_degree_polynomial(k, gamma)
            print(f"{k:4d} {gamma:>7} {cheb.degree:21d} {lp.degree:11d} {float(lp.gamma):9.4f} "
                  f"{float(cheb.record_l1(60)):13.3g} / {float(lp.record_l1(60)):.3g}")
    print("\n(sqrt(k) log(1/gamma) for reference: Fact 4.2's O(.) hides the constant)")


# ---- shipped specs end to end ------------------------------------------------------------------------
def spec_data(spec: Path) -> Path | None:
    """The data file a shipped spec's header comment runs it with (``--data ../shared/data/X``)."""
    for line in spec.read_text().splitlines():
        if line.startswith("#") and "--data" in line:
            return _common.shared_file(Path(line.split("--data", 1)[1].split()[0]).name)
    return None


def spec_runs(args) -> None:
    import resource
    import subprocess
    import warnings

    from dpopt.release import run

    repo = Path(__file__).resolve().parents[2]
    dpopt_cmd = Path(sys.executable).with_name("dpopt")
    print("shipped specs end to end (wall and CPU seconds; writing share of the in-process run)")
    for name in args.specs:
        spec = repo / "models" / f"{name}.toml"
        data = spec_data(spec)
        with tempfile.TemporaryDirectory() as tmp:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            command = [str(dpopt_cmd), "run", str(spec), "--out", f"{tmp}/cli"] + (["--data", str(data)] if data else [])
            subprocess.run(command, check=True, capture_output=True)
            wall = time.perf_counter() - start
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            cpu_start, start = time.process_time(), time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                release = run(spec, data=data, out=f"{tmp}/api")
            in_wall, in_cpu = time.perf_counter() - start, time.process_time() - cpu_start
            steps = release.report["timings"]
            files = sum(1 for p in Path(f"{tmp}/api").rglob("*") if p.is_file())
        write = steps.get("write", 0.0)
        print(f"  {name}: `dpopt run` {wall:.2f} s wall, {cpu:.2f} CPU-s; in process {in_wall:.2f} s wall, "
              f"{in_cpu:.2f} CPU-s, of which writing {files} files {write:.3f} s = {write / in_wall:.1%} of the "
              f"in-process run ({write / wall:.1%} of the command's wall time); steps: "
              + ", ".join(f"{k} {v:.2f}" for k, v in steps.items()), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("accuracy", "scaling", "degrees", "spec"))
    parser.add_argument("--specs", nargs="*", default=["nltcs_polynomial"], help="shipped specs for 'spec'")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--epsilons", type=float, nargs="*", default=list(EPSILONS))
    parser.add_argument("--ks", type=int, nargs="*", default=[2, 3])
    parser.add_argument("--cases", nargs="*", default=["nltcs", "synthetic20"], choices=["nltcs", "synthetic20"])
    parser.add_argument("--methods", nargs="*", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--consistency", action="store_true", help="include poly+l2 (an L2 projection per run)")
    parser.add_argument("--dims", type=int, nargs="*", default=[10, 20, 30, 40, 50, 60])
    parser.add_argument("--plots", type=Path, default=None, help="directory for the PNG plots")
    parser.add_argument("--data", type=Path, default=None,
                        help="the shared data directory (default: ../shared/data beside the repository)")
    args = parser.parse_args()
    if args.data is not None:
        _common.SHARED = args.data
    {"accuracy": accuracy, "scaling": scaling, "degrees": degrees, "spec": spec_runs}[args.what](args)


if __name__ == "__main__":
    main()
