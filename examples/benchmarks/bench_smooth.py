"""The smooth objective against the peers' figures (issue 12): KL(true || estimate) and 3-way errors.

The peers' harness: every 2-way marginal of a binary table measured once with Laplace noise,
the budget split evenly (each marginal has L1 sensitivity 1, so scale |W| / epsilon), and
the estimate judged by

- KL(true || estimate) over the full table (probabilities; infinite when the estimate puts
  no mass on a cell the data holds — reported as inf, never smoothed here), and
- the mean and the largest absolute error of every cell of every 3-way marginal, on
  probabilities (the marginal divided by its total).

For each dataset (nltcs, czech, rochdale, mildew) and epsilon (0.1, 0.5, 1) it runs ``--runs``
seeded repetitions (seeded noise: NOT private, a benchmark) and prints, for the objectives
asked (default: smooth, l2 and entropy), the mean KL, how many runs had a finite KL, the
mean 3-way errors and the mean seconds per fit.

**The peer on the same noise.** With ``--peer pgm`` (needs ``pip install mbi``: Private-PGM,
McKenna et al. 2019, with JAX) each run's noisy marginals also go to Private-PGM's least-squares
estimate (``mbi.estimation.MirrorDescent``, its default 1,000 iterations, float64, the total
at its minimum-variance estimate), and the table says by how much the first objective's 3-way
error differs from PGM's on the same measurements (paired: mean difference ± its standard
error; ``--pgm-iters`` changes its iteration count). Issue 12 quoted Private-PGM's least
squares on nltcs at KL 1.32 / 0.59 / 0.34 and 3-way mean 0.0172 / 0.0057 / 0.0032 (printed for
nltcs as well).

    python examples/benchmarks/bench_smooth.py --runs 10 [--datasets nltcs] [--objectives smooth l2] [--peer pgm]
        [--plots DIR]   # DIR/smooth_3way_errors.png: error against epsilon, one panel per dataset

An objective may carry engine options after a colon, e.g. ``smooth:steps=1,total=free`` (the
single penalised fit of issue 12's first version) or ``smooth:smoothing=6``.

Set OPENBLAS_NUM_THREADS=1 when timing; ``DPOPT_SHARED_DATA`` points at ../shared/data from a worktree.
"""

from __future__ import annotations

import argparse
import itertools
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
from _common import load_binary

from dpopt.errors import SolverError
from dpopt.estimate import reconstruct
from dpopt.model.constraints import ConstraintSet, NonNegativity
from dpopt.model.queries import Marginal, MarginalWorkload, all_marginals
from dpopt.privacy.accountant import Accountant
from dpopt.privacy.mechanisms import laplace_mechanism
from dpopt.privacy.randomness import make_random

EPSILONS = (Fraction(1, 10), Fraction(1, 2), Fraction(1))
#: Private-PGM least squares on nltcs, all 2-way marginals (issue 12): (KL, 3-way mean error) by epsilon.
PGM_NLTCS = {Fraction(1, 10): (1.32, 0.0172), Fraction(1, 2): (0.59, 0.0057), Fraction(1): (0.34, 0.0032)}


def kl(truth: np.ndarray, estimate: np.ndarray) -> float:
    """KL(true || estimate) on probabilities; inf when the estimate misses a cell the data holds."""
    p = truth / truth.sum()
    q = np.maximum(estimate, 0.0) / np.maximum(estimate, 0.0).sum()
    held = p > 0
    if np.any(q[held] <= 0):
        return float("inf")
    return float(np.sum(p[held] * np.log(p[held] / q[held])))


def measure_two_way(data, epsilon: Fraction, seed: int):
    sets = list(itertools.combinations(data.domain.attrs, 2))
    acct = Accountant.pure(epsilon)
    share = epsilon / len(sets)
    rng = make_random(seed)
    return [laplace_mechanism(Marginal(data.domain, s), data, share, acct, rng, label="+".join(s)) for s in sets]


def pgm_table(data, ms, iters: int = 1000) -> np.ndarray:
    """Private-PGM's least-squares estimate from the same measurements (full table, counts)."""
    import mbi
    from mbi.estimation import MirrorDescent

    attrs = list(data.domain.attrs)
    domain = mbi.Domain(attrs, list(data.domain.shape))
    measured = [mbi.LinearMeasurement(np.asarray(m.values, dtype=float), tuple(m.query.attrs), stddev=float(m.stddev))
                for m in ms]
    model = MirrorDescent().estimate(domain, measured, iters=iters)
    return np.asarray(model.project(tuple(attrs)).datavector(), dtype=float).ravel()


def parse_objective(spec: str) -> tuple[str, dict]:
    """``"smooth:steps=1,total=free"`` -> ``("smooth", {"steps": 1, "total": "free"})``."""
    name, _, options = spec.partition(":")
    pairs = (item.partition("=") for item in options.split(",") if item)
    return name, {key: _number_or_text(value) for key, _, value in pairs}


def _number_or_text(value: str):
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def run(datasets, objectives, runs: int, peer: str | None = None, pgm_iters: int = 1000) -> dict:
    """Print the table; return ``{dataset: {objective: [(eps, mean 3-way error, its s.e.)]}}``."""
    if peer == "pgm":
        try:
            import jax

            jax.config.update("jax_enable_x64", True)  # once, before mbi: changing it later discards compiled code
            jax.config.update("jax_enable_compilation_cache", False)  # mbi's advice for sweeps
            import mbi  # noqa: F401
        except ImportError:
            raise SystemExit("--peer pgm needs Private-PGM: pip install mbi") from None
        objectives = [*objectives, "PGM"]
    curves: dict = {}
    for name in datasets:
        data = load_binary(name)
        truth = data.histogram().astype(float)
        three = MarginalWorkload(data.domain, [m.attrs for m in all_marginals(data.domain, 3)])
        true3 = three.matvec(truth) / truth.sum()
        cs = ConstraintSet(data.domain, [NonNegativity()])
        print(f"\n{name}: {data.domain.size} cells, {int(truth.sum())} records, all 2-way marginals measured, "
              f"{runs} runs")
        print(f"  {'eps':>5} {'objective':>9} {'KL mean':>9} {'finite':>7} {'3-way mean (± s.e.)':>22} "
              f"{'3-way max':>10} {'s/fit':>7}  status")
        for eps in EPSILONS:
            rows = {obj: [] for obj in objectives}
            for r in range(runs):
                ms = measure_two_way(data, eps, seed=1000 * r + int(eps * 100))
                for obj in objectives:
                    start = time.perf_counter()
                    if obj == "PGM":
                        x = pgm_table(data, ms, pgm_iters)
                        err = np.abs(three.matvec(x) / x.sum() - true3)
                        rows[obj].append((kl(truth, x), err.mean(), err.max(), time.perf_counter() - start, "PGM"))
                        continue
                    try:
                        objective, options = parse_objective(obj)
                        res = reconstruct(ms, cs, objective, **options)
                    except SolverError as exc:  # e.g. entropy with a non-positive noisy total: refused
                        rows[obj].append((np.nan, np.nan, np.nan, time.perf_counter() - start, "refused"))
                        print(f"    {obj} refused in run {r}: {exc}")
                        continue
                    seconds = time.perf_counter() - start
                    if res.x is None:
                        rows[obj].append((np.nan, np.nan, np.nan, seconds, res.status.name))
                        continue
                    err = np.abs(three.matvec(res.x) / res.x.sum() - true3)
                    rows[obj].append((kl(truth, res.x), err.mean(), err.max(), seconds, res.status.name))
            for obj in objectives:
                values = np.array([row[:4] for row in rows[obj]], dtype=float)
                solved = ~np.isnan(values[:, 0])
                finite = np.isfinite(values[:, 0])
                kl_mean = values[finite, 0].mean() if finite[solved].all() and finite.any() else float("inf")
                statuses = sorted({row[4] for row in rows[obj]})
                spread = np.nanstd(values[:, 1], ddof=1) / np.sqrt(runs) if runs > 1 else float("nan")
                curves.setdefault(name, {}).setdefault(obj, []).append((float(eps), np.nanmean(values[:, 1]), spread))
                print(f"  {float(eps):5.2f} {obj:>9} {kl_mean:9.4f} {int(finite.sum()):>3}/{runs:<3} "
                      f"{np.nanmean(values[:, 1]):12.5f} ± {spread:7.5f} {np.nanmean(values[:, 2]):10.4f} "
                      f"{values[:, 3].mean():7.2f}  {','.join(statuses)}", flush=True)
            if peer == "pgm":
                diff = np.array([a[1] - b[1] for a, b in zip(rows[objectives[0]], rows["PGM"], strict=True)])
                print(f"  {float(eps):5.2f} {objectives[0]} − PGM, 3-way mean (paired): {np.nanmean(diff):+.5f} ± "
                      f"{np.nanstd(diff, ddof=1) / np.sqrt(runs) if runs > 1 else float('nan'):.5f}; "
                      f"{objectives[0]} lower in {int(np.sum(diff < 0))} of {runs} runs")
            if name == "nltcs":
                pgm = PGM_NLTCS[eps]
                print(f"  {float(eps):5.2f} {'PGM (LS)':>9} {pgm[0]:9.2f} {'':>7} {pgm[1]:12.4f}{'':>10}   "
                      "(issue 12's quoted figures)")
    return curves


def plot(curves: dict, directory: Path) -> None:
    """One panel per dataset: mean 3-way error against epsilon, ± one standard error, log scales."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, len(curves), figsize=(4.2 * len(curves), 3.8), squeeze=False)
    for ax, (name, by_objective) in zip(axes[0], curves.items(), strict=True):
        for obj, points in by_objective.items():
            eps, mean, se = np.array(points).T
            ax.errorbar(eps, mean, yerr=se, marker="o", capsize=3, label=obj)
        ax.set(xscale="log", yscale="log", xlabel="epsilon", title=name)
    axes[0][0].set_ylabel("mean 3-way marginal error (probability)")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    path = directory / "smooth_3way_errors.png"
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--datasets", nargs="*", default=["nltcs", "czech", "rochdale", "mildew"])
    parser.add_argument("--objectives", nargs="*", default=["smooth", "l2", "entropy"])
    parser.add_argument("--peer", choices=["pgm"], help="also run Private-PGM (pip install mbi) on the same noise")
    parser.add_argument("--pgm-iters", type=int, default=1000, help="Private-PGM's mirror-descent iterations "
                        "(default 1000, its own default)")
    parser.add_argument("--plots", type=Path, default=None, help="directory for a plot of the 3-way errors")
    args = parser.parse_args()
    curves = run(args.datasets, args.objectives, args.runs, args.peer, args.pgm_iters)
    if args.plots is not None:
        plot(curves, args.plots)


if __name__ == "__main__":
    main()
