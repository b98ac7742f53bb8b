"""Top-down benchmark (issue 14): the national PL 94-171-like release, executor scaling, accuracy.

1. national: the synthetic nation of :func:`dpopt.datasets.national.generate_nation` (51
   states, 3,200 counties, about 73,000 tracts, 330 million persons, 2,016 cells per unit,
   edit-rule zeros; ``--scale`` shrinks it), the PL94-like workload of
   :mod:`dpopt.algorithms.topdown.pl94` at zCDP ``--rho``, nation → state → county → tract
   on ``--executor`` (pool or spark). Prints the time per level (measure, solve), the
   distribution of per-parent solve times, peak memory of the whole process tree (driver,
   pool workers or Spark's JVM and Python workers, sampled from /proc every 0.5 s) and the
   machine load (``uptime``) before and after. ``--accuracy`` adds the mean absolute error
   per cell by level and by unit population decile, of the release, of its noisy detailed
   measurements and of a bottom-up release (every tract measured with the whole budget,
   summed up) at the same budget: NOT private, for the benchmark only.
2. scaling: the county level (nation → state → county) on Spark ``local[1]`` and
   ``local[2]``, and the projected time on W workers from the measured per-parent solve
   times (longest-first greedy schedule; the driver's noise draws stay serial).

Seeded sources (a benchmark, not a release). Timings on a shared machine vary with its load.

Run:  python examples/benchmarks/bench_topdown.py national --executor pool --accuracy --json /tmp/td.json --plots /tmp/td
      python examples/benchmarks/bench_topdown.py national --scale 0.1 --executor spark
      python examples/benchmarks/bench_topdown.py scaling --scale 1
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import threading
import time
from fractions import Fraction
from pathlib import Path

import numpy as np

from dpopt.algorithms.topdown.pl94 import LEVEL_SHARES, pl94_algorithm
from dpopt.datasets.national import generate_nation
from dpopt.privacy.budget import Budget
from dpopt.privacy.randomness import SeededRandom


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


class TreeMemory:
    """Peak resident memory of this process and all its descendants, sampled from /proc."""

    def __init__(self, every: float = 0.5) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every,), daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self, every: float) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _tree_rss(os.getpid()))
            self._stop.wait(every)


def _tree_rss(root: int) -> int:
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as fh:
                fields = dict(line.split(":", 1) for line in fh if ":" in line)
        except OSError:
            continue
        pid = int(entry)
        children.setdefault(int(fields.get("PPid", "0").strip()), []).append(pid)
        rss[pid] = int(fields.get("VmRSS", "0 kB").split()[0]) * 1024
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo.extend(children.get(pid, []))
    return total


def scaled_nation(scale: float, seed: int = 0):
    states = 51 if scale >= 0.3 else max(3, int(round(51 * scale ** 0.5)))
    return generate_nation(states, max(states, int(round(3_200 * scale))), int(round(330_000_000 * scale)), seed=seed)


def lpt_makespan(times: np.ndarray, workers: int) -> float:
    """Longest-processing-time-first greedy schedule of ``times`` on ``workers`` machines."""
    loads = np.zeros(workers)
    for t in np.sort(times)[::-1]:
        loads[np.argmin(loads)] += t
    return float(loads.max())


def national(args) -> dict:
    out: dict = {"command": "national", "scale": args.scale, "executor": args.executor, "workers": args.workers,
                 "rho": args.rho, "uptime_before": uptime()}
    print(out["uptime_before"])
    tick = time.perf_counter()
    nation = scaled_nation(args.scale)
    data = nation.dataset()
    out["generate_seconds"] = time.perf_counter() - tick
    out["geography"] = nation.geography.describe()
    out["persons"] = nation.persons
    print(f"generated {nation.persons:,} persons in {out['generate_seconds']:.1f} s: {out['geography']}", flush=True)
    budget = Budget.zcdp(Fraction(args.rho))
    algorithm = pl94_algorithm(nation, executor=args.executor, workers=args.workers, spark=args.spark,
                               progress=args.progress)
    plan = algorithm.plan(nation.domain, nation.constraints(), budget)
    with TreeMemory() as memory:
        tick = time.perf_counter()
        release = algorithm.run(plan, data, budget.accountant(), SeededRandom(args.seed))
        out["run_seconds"] = time.perf_counter() - tick
    out["peak_memory_gb"] = memory.peak / 1e9
    out["uptime_after"] = uptime()
    out["status"] = release.status.name
    out["message"] = release.message
    print(f"{release.status.name} in {out['run_seconds']:.0f} s, peak memory {out['peak_memory_gb']:.1f} GB; "
          f"{out['uptime_after']}", flush=True)
    out["levels"] = release.info["levels"]
    out["per_parent_seconds"] = {k: v.tolist() for k, v in release.solve_times.items()}
    for level in out["levels"]:
        if "seconds" not in level:
            continue
        t = level["solve_seconds"]
        print(f"  {level['level']:>7}: {level['units']:>6,} units, {level['parents']:>5,} parents, "
              f"{level['variables']:>11,} variables; measure {level['seconds']['measure']:7.1f} s, "
              f"solve {level['seconds']['solve']:7.1f} s; per parent median {t['median']:.2f} s, "
              f"p90 {t['p90']:.2f} s, max {t['max']:.1f} s, total {t['total']:.0f} s (L2 {level['l2_seconds']:.0f} s, "
              f"rounding {level['rounding_seconds']:.0f} s); failsafe {level['failsafe_events']}, "
              f"parent-sum violation {level['constraint_residuals'].get('parent_sum_max_violation', 0)}")
    if args.accuracy and release.success:
        from dpopt.algorithms.topdown.evaluate import bottom_up, error_by_unit_size

        tick = time.perf_counter()
        base = bottom_up(nation.geography, nation.characteristics, nation.tract_counts, budget, SeededRandom(args.seed + 1))
        noisy = {name: release.noisy[name]["detailed"] for name in release.level_tables}
        frame = error_by_unit_size(nation.geography, nation.tract_counts,
                                   {"topdown": release.level_tables, "noisy": noisy, "bottom_up": base})
        out["accuracy"] = frame.to_dict(orient="records")
        out["accuracy_seconds"] = time.perf_counter() - tick
        print("mean absolute error per cell by level and population decile (NOT private):")
        print(frame.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
        if args.plots:
            _accuracy_plot(frame, args.plots)
    if args.plots and release.success:
        _time_plots(out, args.plots)
    return out


def scaling(args) -> dict:
    """The county level on Spark local[1] and local[2], and its projection to W workers."""
    from dpopt.algorithms.topdown.constraints import ZeroRules, invariant_from_data, sum_up
    from dpopt.algorithms.topdown.engine import LevelQuery, run_levels
    from dpopt.algorithms.topdown.executors import SparkExecutor
    from dpopt.algorithms.topdown.pl94 import pl94_measures
    from dpopt.model.geography import Geography
    from dpopt.model.queries.marginal import Marginal
    from dpopt.privacy.mechanisms import calibrate

    nation = scaled_nation(args.scale)
    g = nation.geography
    counties = Geography(g.names[:3], g.units[:3], g.parents[:3])  # nation → state → county
    leaf = nation.level_counts("county")
    chars = nation.characteristics
    shares = {k: v for k, v in LEVEL_SHARES.items() if k != "tract"}
    total = sum(shares.values())
    shares = {k: v / total for k, v in shares.items()}
    budget = Budget.zcdp(Fraction(args.rho))
    measures = pl94_measures(chars, shares)
    costs = budget.shares({f"{m.level}: {m.label}": m.share for m in measures})
    queries = [LevelQuery(counties.level(m.level), m.label, m.query,
                          calibrate(m.query, costs[f"{m.level}: {m.label}"], "gaussian"), m.share,
                          f"{m.level}: {m.label}") for m in measures]
    inv = invariant_from_data("state population by voting age", counties, "state",
                              Marginal(chars, ("voting_age",)), leaf)
    out = {"command": "scaling", "scale": args.scale, "uptime_before": uptime(), "runs": {}}
    print(out["uptime_before"], flush=True)
    for workers in (1, 2):
        with SparkExecutor(f"local[{workers}]") as executor:
            tick = time.perf_counter()
            outcome = run_levels(counties, chars, leaf, queries, sum_up([inv], counties),
                                 ZeroRules(nation.zero_mask()), budget.accountant(), SeededRandom(args.seed),
                                 executor=executor)
            wall = time.perf_counter() - tick
        county = outcome.levels[-1]
        per_parent = np.array([s.times["total"] for s in county.solutions])
        out["runs"][workers] = {"total_seconds": wall, "county_solve_seconds": county.report["seconds"]["solve"],
                                "county_measure_seconds": county.report["seconds"]["measure"],
                                "per_parent": per_parent.tolist()}
        print(f"spark local[{workers}]: county level solve {county.report['seconds']['solve']:.1f} s "
              f"(sum of per-parent times {per_parent.sum():.1f} s, largest {per_parent.max():.1f} s), "
              f"all three levels {wall:.1f} s", flush=True)
    times = np.array(out["runs"][1]["per_parent"])
    out["projection"] = {w: lpt_makespan(times, w) for w in (1, 2, 4, 8, 16, 32, 64, 128)}
    print("projected county-level solve time from the local[1] per-parent times (longest first, no overheads):")
    for w, t in out["projection"].items():
        print(f"  {w:>4} workers: {t:8.1f} s")
    out["uptime_after"] = uptime()
    print(out["uptime_after"])
    return out


def _time_plots(out: dict, directory: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    directory.mkdir(parents=True, exist_ok=True)
    levels = [lv for lv in out["levels"] if "seconds" in lv]
    fig = Figure(figsize=(10, 4.2), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 2, 1)
    names = [lv["level"] for lv in levels]
    ax.bar(names, [lv["seconds"]["measure"] for lv in levels], label="measure (driver)")
    ax.bar(names, [lv["seconds"]["solve"] for lv in levels], bottom=[lv["seconds"]["measure"] for lv in levels],
           label=f"solve ({out['executor']})")
    ax.set_ylabel("seconds")
    ax.set_title(f"time per level ({out['run_seconds'] / 60:.1f} min in all)")
    ax.legend()
    ax = fig.add_subplot(1, 2, 2)
    for name, times in out["per_parent_seconds"].items():
        if len(times) > 1:
            ax.hist(np.maximum(times, 1e-3), bins=np.logspace(-2, 3, 40), alpha=0.6, label=f"{name} ({len(times)})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("seconds per parent's solve")
    ax.set_ylabel("parents")
    ax.set_title("per-parent solve times")
    ax.legend()
    fig.tight_layout()
    fig.savefig(directory / "topdown_times.png")


def _accuracy_plot(frame, directory: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    directory.mkdir(parents=True, exist_ok=True)
    levels = [lv for lv in frame["level"].unique() if (frame["level"] == lv).sum() > 1]
    fig = Figure(figsize=(4 * len(levels), 3.8), dpi=100)
    FigureCanvasAgg(fig)
    for i, level in enumerate(levels):
        ax = fig.add_subplot(1, len(levels), i + 1)
        part = frame[frame["level"] == level]
        for method in ("topdown", "noisy", "bottom_up"):
            ax.plot(part["group"], part[f"mae_{method}"], marker="o", label=method)
        ax.set_yscale("log")
        ax.set_xlabel("population decile (1 = smallest units)")
        ax.set_ylabel("mean absolute error per cell")
        ax.set_title(level)
        ax.legend()
    fig.tight_layout()
    fig.savefig(directory / "topdown_accuracy.png")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["national", "scaling"])
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the nation (1: 330M persons)")
    parser.add_argument("--executor", default="pool", choices=["pool", "spark", "serial"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--spark", default="local[2]")
    parser.add_argument("--rho", default="1")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--accuracy", action="store_true")
    parser.add_argument("--progress", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--plots", type=Path, default=None)
    args = parser.parse_args(argv)
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    out = national(args) if args.command == "national" else scaling(args)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
