"""The full privacy audit: every mechanism, every registered algorithm, and the planted bugs.

Run:  python examples/benchmarks/bench_audit.py [mechanisms] [algorithms] [mutants] [power]
          [--mechanism-runs 10000] [--algorithm-runs 3000] [--workers 2] [--plots DIR] [--json FILE]

Sections (all by default):

``mechanisms``
    Laplace, discrete Gaussian, exponential and report-noisy-max at claimed ε = 0.5 (δ = 1e-6
    for the Gaussian), ``--mechanism-runs`` runs per dataset of the worst pair (default: the
    harness default, 10^4).
``algorithms``
    Every registered algorithm's full pipeline with its ``example`` parameters on a 3-bit
    domain (8 cells), neighbouring datasets of up to 2 records, budget ε = 1 (or ρ = 1/2 /
    (1, 1e-6) for algorithms proved under zCDP / (ε, δ) only), ``--algorithm-runs`` runs.
``mutants``
    The planted bugs of :mod:`dpopt.audit.mutants` at the default run count: noise for 1.05·ε
    and 1.5·ε, float Laplace (Mironov 2012), structural zeros from the data, a skipped charge.
``power``
    Runs needed to flag noise for 1.2·ε, 1.5·ε, 2·ε: the smallest run count of a doubling grid
    at which at least 2 of 3 seeded audits flag; and the *oracle* count, also for 1.05·ε: the
    test runs at which the best threshold event, with the exact discrete Laplace probabilities
    in place of counts, certifies more than the claim (what any audit with that event needs).

Prints one table per section (claimed ε (δ), total runs, ε lower bound, Fisher p, time).
Timings depend on the machine's load: the audit's runs are seeded (a benchmark, not a release).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import time
from fractions import Fraction
from pathlib import Path

import numpy as np

from dpopt.algorithms import REGISTRY
from dpopt.audit import DEFAULT_RUNS, AlgorithmTarget, audit
from dpopt.audit.mechanisms import MECHANISMS, MechanismTarget
from dpopt.audit.mutants import DataZeros, FloatLaplace, ScaledNoise, Uncharged
from dpopt.audit.stats import epsilon_lower_bound
from dpopt.model.domain import Domain
from dpopt.privacy.budget import Budget
from dpopt.privacy.samplers import discrete_laplace_pmf

BUDGETS = {"pure": Budget.pure(1), "approx": Budget.approx(1, Fraction(1, 10**6)), "zcdp": Budget.zcdp(Fraction(1, 2))}
CLAIM = Fraction(1, 2)
TWO = Domain.from_dict({"x": 2})
GRID = (250, 500, 1000, 2000, 4000, 8000, 16000, 32000)


def row(name, report, seconds) -> dict:
    c = report.claim
    out = {"target": name, "claimed": c.describe(), "runs": report.total_runs,
           "epsilon_lower_bound": report.epsilon_lower_bound, "fisher_p": report.fisher_p,
           "flagged": report.flagged, "ledger_ok": report.ledger_ok, "event": report.event.label,
           "pair": report.pair_text, "seconds": seconds, "cpu_seconds": getattr(report, "cpu_seconds", float("nan")),
           "exact_disclosures": report.exact_disclosures}
    if report.conditional is not None:
        k = report.conditional
        out["conditional"] = {"claimed": k.claim.describe(), "runs": k.total_runs,
                              "epsilon_lower_bound": k.epsilon_lower_bound, "flagged": k.flagged}
    return out


def print_rows(title: str, rows: list[dict]) -> None:
    print(f"\n{title}")
    print(f"  {'target':<26} {'claimed':<28} {'runs':>8} {'eps >=':>8} {'Fisher p':>9} {'verdict':<14} {'wall':>8} "
          f"{'CPU':>8}")
    for r in rows:
        verdict = ("FLAGGED" if r["flagged"] else "not flagged") + ("" if r["ledger_ok"] else ", LEDGER")
        print(f"  {r['target']:<26} {r['claimed']:<28} {r['runs']:>8,} {r['epsilon_lower_bound']:>8.3f} "
              f"{r['fisher_p']:>9.2g} {verdict:<14} {r['seconds']:>7.1f}s {r['cpu_seconds']:>7.1f}s")
        print(f"  {'':<26} event: {r['event'][:100]}")
        if r.get("exact_disclosures"):
            print(f"  {'':<26} exact disclosure: {', '.join(r['exact_disclosures'][:3])}")
        if "conditional" in r:
            k = r["conditional"]
            print(f"  {'':<26} conditional on the record count: claimed {k['claimed']}, {k['runs']:,} runs, "
                  f"eps >= {k['epsilon_lower_bound']:.3f}, {'FLAGGED' if k['flagged'] else 'not flagged'}")


def timed_audit(target, **kw):
    start, cpu = time.perf_counter(), cpu_seconds()
    report = audit(target, **kw)
    report.cpu_seconds = cpu_seconds() - cpu  # workers are reaped when the audit ends
    return report, time.perf_counter() - start


def mechanisms(args) -> list[dict]:
    rows = []
    for m in MECHANISMS:
        report, s = timed_audit(MechanismTarget(m, CLAIM), runs=args.mechanism_runs, workers=args.workers)
        rows.append(row(m, report, s))
        if args.plots:
            from dpopt.audit.plots import plot_worst_pair

            plot_worst_pair(report, Path(args.plots) / f"audit_{m}.png")
    print_rows(f"Mechanisms (claimed epsilon = {CLAIM}; {args.mechanism_runs:,} runs per dataset of the worst pair)",
               rows)
    return rows


def algorithms(args) -> list[dict]:
    domain = Domain.from_dict({f"a{i}": 2 for i in range(3)})
    rows = []
    for name, cls in REGISTRY.items():
        params = cls.example(domain)
        if params is None:
            print(f"  {name}: no example on a binary domain; skipped")
            continue
        budget = BUDGETS[cls.accountings[0]]
        report, s = timed_audit(AlgorithmTarget(cls(params), domain, budget), runs=args.algorithm_runs,
                                workers=args.workers)
        rows.append(row(name, report, s))
        if args.plots:
            from dpopt.audit.plots import plot_worst_pair

            plot_worst_pair(report, Path(args.plots) / f"audit_{name}.png")
    print_rows(f"Algorithms ({domain.size} cells, {args.algorithm_runs:,} runs per dataset of the worst pair)", rows)
    return rows


def mutant_targets():
    budget = Budget.pure(CLAIM)
    return [("noise for 1.05 eps", AlgorithmTarget(ScaledNoise(factor=Fraction(105, 100)), TWO, budget)),
            ("noise for 1.5 eps", AlgorithmTarget(ScaledNoise(factor=Fraction(3, 2)), TWO, budget)),
            ("float Laplace (Mironov)", AlgorithmTarget(FloatLaplace(), TWO, budget)),
            ("zeros from the data", AlgorithmTarget(DataZeros(), TWO, budget)),
            ("skipped charge", AlgorithmTarget(Uncharged(), TWO, budget))]


def mutants(args) -> list[dict]:
    rows = []
    for name, target in mutant_targets():
        report, s = timed_audit(target, runs=DEFAULT_RUNS, workers=args.workers)
        rows.append(row(name, report, s))
    print_rows(f"Planted bugs at the default run count ({DEFAULT_RUNS:,} runs per dataset; claimed epsilon = {CLAIM})",
               rows)
    return rows


def oracle_runs(factor: float, eps: float = float(CLAIM), alpha: float = 0.05) -> int:
    """Runs per dataset (test half) at which the best threshold event certifies more than ``eps``.

    Noise for ``factor · eps`` on a count of 0 against 1: the exact discrete Laplace probabilities
    of ``{y >= t}`` stand in for the counts (a median-case estimate for that event).
    """
    scale = 1.0 / (factor * eps)
    z = np.arange(-200, 201)
    pmf = discrete_laplace_pmf(z, scale)
    best = math.inf
    for t in range(-3, 6):
        p_b = pmf[z >= t].sum()        # count 0
        p_a = pmf[z >= t - 1].sum()    # count 1
        for n in np.unique(np.logspace(1, 7, 400).astype(int)):
            if epsilon_lower_bound(p_a * n, n, p_b * n, n, 0.0, alpha) > eps:
                best = min(best, int(n))
                break
    return best


def power(args) -> list[dict]:
    rows = []
    budget = Budget.pure(CLAIM)
    for factor in (Fraction(6, 5), Fraction(3, 2), Fraction(2)):
        needed, flags = None, {}
        start = time.perf_counter()
        for runs in GRID:
            hits = sum(audit(AlgorithmTarget(ScaledNoise(factor=factor), TWO, budget), runs=runs, seed=seed,
                             workers=args.workers).flagged for seed in range(3))
            flags[runs] = hits
            if hits >= 2:
                needed = runs
                break
        oracle = oracle_runs(float(factor))
        rows.append({"factor": str(factor), "runs_needed": needed, "flags_of_3": flags,
                     "oracle_test_runs": oracle, "seconds": time.perf_counter() - start})
    print("\nPower: runs per dataset (half search, half test) at which >= 2 of 3 seeded audits flag noise for "
          f"factor x epsilon (claimed {CLAIM})")
    print(f"  {'factor':<8} {'runs needed':>12} {'oracle test runs':>17}  flags of 3 by runs")
    for r in rows:
        need = f"{r['runs_needed']:,}" if r["runs_needed"] else f"> {max(r['flags_of_3']):,}"
        print(f"  {float(Fraction(r['factor'])):<8.2f} {need:>12} {r['oracle_test_runs']:>17,}  "
              f"{', '.join(f'{k:,}: {v}' for k, v in r['flags_of_3'].items())}  ({r['seconds']:.0f} s)")
    weak = oracle_runs(1.05)
    print(f"  1.05     (not run) {weak:>17,}  the power limit: about {2 * weak:,} runs per dataset, "
          f"{2 * weak / DEFAULT_RUNS:.1f}x the default")
    rows.append({"factor": "21/20", "runs_needed": None, "oracle_test_runs": weak})
    return rows


def cpu_seconds() -> float:
    """CPU time of this process and of its finished worker processes (a load-independent cost)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("sections", nargs="*", metavar="SECTION",
                        help="mechanisms, algorithms, mutants, power (default: all)")
    parser.add_argument("--mechanism-runs", type=int, default=DEFAULT_RUNS)
    parser.add_argument("--algorithm-runs", type=int, default=3000)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--plots", type=str, default=None, help="directory for the worst-pair PNG plots")
    parser.add_argument("--json", type=str, default=None, help="write every row to this JSON file")
    args = parser.parse_args()
    sections = ("mechanisms", "algorithms", "mutants", "power")
    unknown = [s for s in args.sections if s not in sections]
    if unknown:
        parser.error(f"unknown section {unknown[0]!r}; choose from {', '.join(sections)}")
    args.sections = args.sections or list(sections)
    if args.plots:
        Path(args.plots).mkdir(parents=True, exist_ok=True)
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; {args.workers} workers")
    start, cpu0 = time.perf_counter(), cpu_seconds()
    results = {}
    for section in args.sections:
        t, c = time.perf_counter(), cpu_seconds()
        results[section] = globals()[section](args)
        print(f"  ({section}: {time.perf_counter() - t:.0f} s wall, {cpu_seconds() - c:.0f} s of CPU)")
    total, cpu = time.perf_counter() - start, cpu_seconds() - cpu0
    print(f"\ntotal {total / 60:.1f} min wall, {cpu / 60:.1f} min of CPU (this process and its workers): "
          f"about {cpu / 60 / min(args.workers, os.cpu_count() or 1):.1f} min on {args.workers} idle cores; "
          f"load average at end: {os.getloadavg()[0]:.2f}")
    results["cpu_seconds"] = cpu
    if args.json:
        Path(args.json).write_text(json.dumps({**results, "seconds": total}, indent=2, default=str))


if __name__ == "__main__":
    main()
