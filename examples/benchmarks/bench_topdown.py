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
                 "rho": args.rho, "rounding": args.rounding, "upward": not args.no_upward, "uptime_before": uptime()}
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
                               progress=args.progress, rounding=args.rounding, upward=not args.no_upward)
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


# ---- census: top-down (new, today) against bottom-up at both ends of the population range ----------------
#: The marginals every level measures besides its detailed table (the quickstart's attributes).
CENSUS_MARGINALS = (("age_group", "sex"), ("relationship",), ("household_type",))
#: Each level's budget split over its queries: half to the detailed table, the rest to the marginals.
CENSUS_WITHIN = (Fraction(1, 2),) + (Fraction(1, 6),) * 3
#: The issue's split over the levels (nation, state, county).
ISSUE_SPLIT = (Fraction(1, 10), Fraction(3, 10), Fraction(6, 10))


#: The methods of the census benchmark.
METHODS_LEGEND = """  td_today      top-down as on main before issue 26 (no upward pass, cell-wise rounding), the issue's split 0.1/0.3/0.6
  td_new_issue  top-down with the upward pass, the same split
  td_new        top-down with the upward pass, the split chosen by expected error (no shares in the spec)
  td_new_leaves top-down with the upward pass, the whole budget on the counties, split as bu_issue
  bu            bottom-up: measure_reconstruct of the counties' queries, split as td_new splits its counties
  bu_issue      bottom-up: the same queries split 1/2 detailed, 1/6 per marginal (the issue's within-level split)"""
#: Releases with the same measurements of the counties, compared cell for cell.
PAIRS = (("td_new", "bu"), ("td_new_leaves", "bu_issue"))


def census_case(rows: int, states: int, counties: int, data_seed: int):
    """The example data (nation → states → counties), one structural-zero rule, the state totals invariant,
    non-negative integer output: the shape of the issue's release."""
    from dpopt.datasets.census import STRUCTURAL_ZEROS, census_domain, county_parent, generate_census
    from dpopt.model.constraints import ConstraintSet, Hierarchy, Integrality, NonNegativity, StructuralZeros
    from dpopt.model.data import Dataset
    from dpopt.model.queries.marginal import Marginal

    domain = census_domain(states, counties)
    data = Dataset.from_frame(generate_census(rows, num_states=states, counties_per_state=counties, seed=data_seed),
                              domain)
    rule, reason = STRUCTURAL_ZEROS[0]
    cs = ConstraintSet(domain, [NonNegativity(), Integrality(), StructuralZeros(rule, name="rule 1", reason=reason),
                                Hierarchy("state", "county", county_parent(domain), name="geography")])
    cs.invariant_from_data(Marginal(domain, ["state"]), data, "state totals")
    return domain, data, cs


def census_queries(chars) -> dict:
    from dpopt.model.queries.basic import Identity
    from dpopt.model.queries.marginal import Marginal

    return {"detailed": Identity(chars), **{" x ".join(a): Marginal(chars, a) for a in CENSUS_MARGINALS}}


def census_topdown(chars, split, *, upward: bool, mechanism: str = "laplace"):
    """The top-down algorithm with ``split`` over the levels (None: chosen by expected error); without the
    upward pass, with main's cell-wise rounding too (then bit for bit the release before issue 26)."""
    from dpopt.algorithms.topdown import GeographySpec, LevelMeasure, TopDown, TopDownParams

    levels = ("nation", "state", "county")
    queries = census_queries(chars)
    if split is None:
        measures = tuple(LevelMeasure(label, level, q, mechanism, None) for level in levels
                         for label, q in queries.items())
    else:
        measures = tuple(LevelMeasure(label, level, q, mechanism, share * within) for level, share in zip(levels, split)
                         for (label, q), within in zip(queries.items(), CENSUS_WITHIN) if share > 0)
    return TopDown(TopDownParams(GeographySpec(("state", "county")), measures, executor="serial", upward=upward,
                                 rounding="controlled" if upward else "cellwise"))


def census_bottom_up(domain, chars, shares, mechanism: str = "laplace"):
    """measure_reconstruct over the full domain: the counties' queries with the whole budget, split over them
    by ``shares`` (one per query of :func:`census_queries`, summing to 1)."""
    from dpopt.algorithms.measure_reconstruct import MeasureReconstruct, MeasureReconstructParams
    from dpopt.model.queries.marginal import Marginal
    from dpopt.spec.model import MeasureSpec

    measures = tuple(MeasureSpec(f"county x {label}", Marginal(domain, ("county",) + tuple(
        q.attrs if isinstance(q, Marginal) else chars.attrs)), mechanism, share)
        for (label, q), share in zip(census_queries(chars).items(), shares) if share > 0)
    return MeasureReconstruct(MeasureReconstructParams(measures))


def leaf_shares(plan, chars) -> tuple:
    """The shares a top-down plan gives the counties' queries, scaled to sum to 1 (a bottom-up release
    measuring what the top-down measures on its last level, with the whole budget)."""
    shares = {step.label: step.share for step in plan.steps}
    leaf = [shares.get(f"county: {label}", Fraction(0)) for label in census_queries(chars)]
    return tuple(s / sum(leaf) for s in leaf)


def census(args) -> dict:
    """Top-down (new: upward pass; today: without it) and bottom-up on the census example, several noise seeds.

    Errors are mean absolute errors per cell of every level's measured tables and the bias of each
    level's detailed cells (released minus true) by decile of their true count. NOT private.
    """
    from dpopt.model.geography import Geography
    from dpopt.privacy.budget import Budget

    out: dict = {"command": "census", "rows": args.rows, "states": args.states, "counties_per_state": args.counties,
                 "epsilon": args.epsilon, "seeds": args.seeds, "first_seed": args.first_seed,
                 "uptime_before": uptime()}
    print(out["uptime_before"], flush=True)
    domain, data, cs = census_case(args.rows, args.states, args.counties, args.data_seed)
    geography = Geography.from_columns(domain, ["state", "county"])
    chars = geography.characteristics(domain)
    budget = Budget.pure(Fraction(args.epsilon))
    methods = {"td_today": census_topdown(chars, ISSUE_SPLIT, upward=False),
               "td_new_issue": census_topdown(chars, ISSUE_SPLIT, upward=True),
               "td_new": census_topdown(chars, None, upward=True),
               "td_new_leaves": census_topdown(chars, (0, 0, 1), upward=True)}
    plans = {name: m.plan(domain, cs, budget) for name, m in methods.items()}
    # Bottom-up measures the counties' queries with the whole budget: split as the new top-down splits its
    # last level (the same measurements when that split is on the last level alone), and as the issue did.
    for name, shares in (("bu", leaf_shares(plans["td_new"], chars)), ("bu_issue", CENSUS_WITHIN)):
        methods[name] = census_bottom_up(domain, chars, shares)
        plans[name] = methods[name].plan(domain, cs, budget)
    out["split"] = {name: {row.label: str(row.share) for row in plan.steps} for name, plan in plans.items()}
    print("top-down (new) budget split by expected error:", out["split"]["td_new"], flush=True)
    print("\n".join(line for line in plans["td_new"].lines if line.startswith(("  ", "level "))), flush=True)
    truth = [t.toarray() for t in geography.level_histograms(geography.leaf_histograms(data))]
    queries = {label: q.to_sparse() for label, q in census_queries(chars).items()}
    leaf_offset, cell_offset = geography.offsets(domain)
    from dpopt.algorithms.topdown.constraints import zero_rules

    allowed = ~zero_rules(cs, geography, chars).shared
    errors: dict = {}
    bias: dict = {}
    seconds: dict = {}
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        tables = {}
        for name, method in methods.items():
            tick = time.process_time()
            release = method.run(plans[name], data, budget.accountant(), SeededRandom(seed * 1000 + 1))
            seconds.setdefault(name, []).append(time.process_time() - tick)
            if not release.success:
                raise SystemExit(f"{name}, seed {seed}: {release.message}")
            if name.startswith("bu"):
                leaf = release.counts[leaf_offset[:, None] + cell_offset[None, :]]
                tables[name] = [np.asarray(geography.aggregation(k) @ leaf) if k < geography.depth - 1 else leaf
                                for k in range(geography.depth)]
            else:
                tables[name] = [release.level_tables[level] for level in geography.names]
        for k, level in enumerate(geography.names):
            for label, Q in queries.items():
                true = (Q @ truth[k].T).T
                for name in methods:
                    err = float(np.abs((Q @ tables[name][k].T).T - true).mean())
                    errors.setdefault(f"{level} | {label}", {}).setdefault(name, []).append(err)
            for name in methods:
                for d, value in enumerate(size_bias(tables[name][k], truth[k], allowed)):
                    bias.setdefault(f"{level} | {BIAS_GROUPS[d]}", {}).setdefault(name, []).append(value)
        print(f"seed {seed}: " + ", ".join(f"{n} {seconds[n][-1]:.1f} CPU s" for n in methods), flush=True)
    out["errors"] = {key: {n: float(np.mean(v)) for n, v in row.items()} for key, row in errors.items()}
    out["errors_by_seed"] = errors
    out["bias"] = {key: {n: float(np.mean(v)) for n, v in row.items()} for key, row in bias.items()}
    out["cpu_seconds"] = {n: float(np.mean(v)) for n, v in seconds.items()}
    names = list(methods)
    print(f"\nmean absolute error per cell, mean of {args.seeds} seeds (NOT private; {args.rows:,} persons, "
          f"{geography.describe()}):")
    print(METHODS_LEGEND)
    print(f"{'table':32}" + "".join(f"{n:>14}" for n in names) + "".join(f"  {a} <= {b}" for a, b in PAIRS))
    for key, row in out["errors"].items():
        line = f"{key:32}" + "".join(f"{row[n]:14.3f}" for n in names)
        for a, b in PAIRS:
            wins = sum(x <= y for x, y in zip(errors[key][a], errors[key][b]))
            line += f"  {'yes' if row[a] <= row[b] else 'NO '} ({wins}/{args.seeds} seeds)".ljust(len(a) + len(b) + 6)
        print(line)
    out["pairs"] = {f"{a} <= {b}": all(out["errors"][k][a] <= out["errors"][k][b] for k in out["errors"]) for a, b in PAIRS}
    print("\nbias of the detailed cells (released minus true, mean per cell) by their true count: the empty cells, "
          "then deciles of the others:")
    print(f"{'level | cells':32}" + "".join(f"{n:>14}" for n in names))
    for key, row in out["bias"].items():
        print(f"{key:32}" + "".join(f"{row[n]:14.3f}" for n in names))
    out["uptime_after"] = uptime()
    print(out["uptime_after"])
    if args.plots:
        _census_plots(out, args.plots, names)
    return out


#: Cells grouped by their true count: the empty ones, then deciles of the others (by rank).
BIAS_GROUPS = ("true 0",) + tuple(f"decile {d}" for d in range(1, 11))


def size_bias(released: np.ndarray, true: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Mean released minus true per cell, for the cells of :data:`BIAS_GROUPS` (structural zeros left out):
    what non-negativity does to small counts (pushed up) and, through the totals, to large ones."""
    t = true[:, allowed].ravel()
    diff = (released[:, allowed].ravel() - t).astype(np.float64)
    group = np.zeros(t.size, dtype=np.int64)
    positive = np.flatnonzero(t > 0)
    rank = np.empty(positive.size, dtype=np.int64)
    rank[np.argsort(t[positive], kind="stable")] = np.arange(positive.size)
    group[positive] = 1 + rank * 10 // max(positive.size, 1)
    sums = np.bincount(group, weights=diff, minlength=11)
    counts = np.bincount(group, minlength=11)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def _census_plots(out: dict, directory: Path, names: list) -> None:
    """Left: each table's error over its bottom-up's (``bu_issue`` for ``td_new_leaves``, ``bu`` for the
    others); right: the bias of each level's detailed cells by true count, one panel per level."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    directory.mkdir(parents=True, exist_ok=True)
    keys = list(out["errors"])
    levels = list(dict.fromkeys(k.split(" | ")[0] for k in out["bias"]))
    fig = Figure(figsize=(6 + 3.6 * len(levels), 4.6), dpi=100)
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(1, 1 + len(levels), width_ratios=[1.7] + [1] * len(levels))
    ax = fig.add_subplot(grid[0, 0])
    for name in names:
        if name.startswith("bu"):
            continue
        base = "bu_issue" if name == "td_new_leaves" else "bu"
        ratio = [out["errors"][k][name] / out["errors"][k][base] for k in keys]
        ax.plot(np.arange(len(keys)), ratio, marker="o", label=f"{name} / {base}")
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.set_yscale("log")
    ax.set_xticks(np.arange(len(keys)))
    ax.set_xticklabels(keys, rotation=75, fontsize=7)
    ax.set_ylabel("mean absolute error / bottom-up's")
    ax.set_title(f"{out['rows']:,} persons, {out['seeds']} seeds")
    ax.legend(fontsize=7)
    for i, level in enumerate(levels):
        ax = fig.add_subplot(grid[0, 1 + i])
        for name in names:
            ax.plot(range(11), [out["bias"][f"{level} | {g}"][name] for g in BIAS_GROUPS], marker=".", label=name)
        ax.axhline(0.0, color="k", lw=0.8)
        ax.set_xticks(range(11))
        ax.set_xticklabels(["0"] + [str(d) for d in range(1, 11)], fontsize=7)
        ax.set_xlabel("true count: 0, then deciles")
        ax.set_title(f"bias of the {level} cells")
        if i == 0:
            ax.set_ylabel("mean released − true per cell")
            ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(directory / f"topdown_census_{out['rows']}.png")


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
    parser.add_argument("command", choices=["national", "scaling", "census"])
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the nation (1: 330M persons)")
    parser.add_argument("--executor", default="pool", choices=["pool", "spark", "serial"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--spark", default="local[2]")
    parser.add_argument("--rho", default="1")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--accuracy", action="store_true")
    parser.add_argument("--progress", action="store_true")
    parser.add_argument("--rounding", default="controlled", choices=["controlled", "cellwise"],
                        help="national: how each parent's solution is rounded")
    parser.add_argument("--no-upward", action="store_true",
                        help="national: without the upward pass (with --rounding cellwise: main's path, bit for bit)")
    parser.add_argument("--rows", type=int, default=30_000, help="census: persons")
    parser.add_argument("--states", type=int, default=4, help="census: states")
    parser.add_argument("--counties", type=int, default=3, help="census: counties per state")
    parser.add_argument("--seeds", type=int, default=5, help="census: noise seeds")
    parser.add_argument("--first-seed", type=int, default=0,
                        help="census: the first noise seed (more seeds than a first run's, none repeated)")
    parser.add_argument("--epsilon", default="1", help="census: pure epsilon")
    parser.add_argument("--data-seed", type=int, default=2024, help="census: seed of the made-up data")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--plots", type=Path, default=None)
    args = parser.parse_args(argv)
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    out = {"national": national, "scaling": scaling, "census": census}[args.command](args)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
