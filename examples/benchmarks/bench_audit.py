"""The full privacy audit: every shipped spec, planted bugs in real algorithms, every mechanism and
registered algorithm, the planted-bug mutants and the power of the audit.

Run:  python examples/benchmarks/bench_audit.py [specs] [census] [auto] [planted] [mechanisms] [algorithms]
          [mutants] [power] [--spec-runs 1000] [--planted-runs 2000] [--mechanism-runs 10000]
          [--algorithm-runs 3000] [--bugs halved_scale,...] [--algorithms mwem,...] [--shipped] [--workers 2]
          [--plots DIR] [--json FILE]

Sections (all by default):

``specs``
    Every spec of ``models/`` audited as ``dpopt audit`` does, at ``--spec-runs`` runs per
    dataset of the worst pair (issue #29's table re-run): the verdict's outcome and the
    assumption it rests on, the lower bound, the excess its test would have detected with 95%
    probability, runs and time.
``census``
    A 449,280-cell census spec built from the census example's labels (4 states, 12 counties,
    8 age groups, sex, 9 races, 13 education levels, 5 household types; structural zeros, the
    state-county hierarchy and published state totals) at 1,000 runs: the audit's speed target
    is 3 minutes on 2 cores.
``auto``
    ``--runs auto`` on the quickstart: the excess asked (0.25 x epsilon), the runs chosen and
    the excess the test then detects.
``planted``
    The bugs of :class:`dpopt.audit.mutants.Planted` (a halved noise scale, one answer without
    noise: the first or the last draw's, textbook float Laplace noise, zeros read off the data,
    a skipped charge) planted in the real runs of the quickstart and of one spec each of mwem,
    dualquery, polynomial and topdown, in each of its *audit configurations*
    (:mod:`dpopt.audit.configurations`: few rounds, a noisy record count, a small pure claim;
    top-down with and without structural zeros; ``--shipped``: the shipped specs instead), at
    ``--planted-runs`` runs: caught or not, and per algorithm caught when any configuration
    catches it. A bug with nothing to act on is a row "n/a" with the reason (data zeros in an
    algorithm that keeps no structural zeros; an unnoised answer when public constraints fix
    every answer of the first draw). ``--bugs none`` adds the correct algorithm's row in every
    configuration (it must pass all). Bug by bug (``--bugs`` and ``--algorithms`` pick some;
    ``topdown:no-zeros`` one configuration), each row printed and written to ``--json`` as it
    finishes.
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

Prints one table per section. Timings depend on the machine's load: wall seconds and the CPU
seconds of this process and its workers are both printed. The audit's runs are seeded (a
benchmark, not a release).
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
from dpopt.audit.mutants import PLANTED_BUGS, DataZeros, FloatLaplace, Planted, ScaledNoise, Uncharged
from dpopt.audit.report import NO_VIOLATION
from dpopt.audit.spec import audit_spec, spec_target
from dpopt.audit.stats import epsilon_lower_bound
from dpopt.model.domain import Domain
from dpopt.privacy.budget import Budget
from dpopt.spec import list_models, load_spec, parse_spec_text
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


def spec_row(name, report, seconds) -> dict:
    out = row(name, report, seconds)
    final = report.conditional or report
    out.update(outcome=report.outcome, verdict=report.verdict, detectable_excess=final.detectable_excess,
               claim_epsilon=final.claim.epsilon, assumptions=list(final.assumed),
               domain=f"{report.settings.get('possible_cells')}/{report.settings.get('domain_cells')}")
    return out


def print_spec_rows(title: str, rows: list[dict]) -> None:
    print(f"\n{title}")
    print(f"  {'spec':<24} {'outcome':<18} {'claim':>7} {'eps >=':>8} {'detects':>9} {'cells':>7} {'runs':>7} "
          f"{'wall':>8} {'CPU':>8}")
    for r in rows:
        det = r["detectable_excess"]
        detects = "none" if math.isinf(det) else f"+{det:.3g}"
        bound = r["conditional"]["epsilon_lower_bound"] if "conditional" in r else r["epsilon_lower_bound"]
        print(f"  {r['target']:<24} {r['outcome']:<18} {r['claim_epsilon']:>7.3g} {bound:>8.3f} {detects:>9} "
              f"{r['domain']:>7} {r['runs']:>7,} {r['seconds']:>7.1f}s {r['cpu_seconds']:>7.1f}s")
        print(f"  {'':<24} {r['verdict'][:150]}")


def timed_spec(spec, **kw):
    start, cpu = time.perf_counter(), cpu_seconds()
    report = audit_spec(spec, **kw)
    report.cpu_seconds = cpu_seconds() - cpu
    return report, time.perf_counter() - start


def checkpoint(args, section: str, rows: list[dict]) -> None:
    """Print the newest row and rewrite ``--json`` with every row so far (a long run stopped early
    keeps what finished); each row records the load average when it finished."""
    rows[-1]["load_average"] = os.getloadavg()[0]
    r = rows[-1]
    print(f"  [{section}] {r.get('target') or r.get('algorithm', '')} {r.get('bug', '')}: "
          f"{r.get('outcome', '')} caught={r.get('caught', '-')} "
          f"eps >= {r.get('epsilon_lower_bound', float('nan')):.3f} "
          f"{r.get('seconds', float('nan')):.0f} s wall, load {r['load_average']:.1f}", flush=True)
    if args.json:
        PARTIAL[section] = rows
        PARTIAL["errors"] = ERRORS
        tmp = Path(args.json + ".tmp")
        tmp.write_text(json.dumps(PARTIAL, indent=2, default=str))
        tmp.replace(args.json)


#: Rows of every section so far (``checkpoint``), and the audits that failed.
PARTIAL: dict = {}
ERRORS: list = []


def specs(args) -> list[dict]:
    rows = []
    chosen = set(args.specs.split(",")) if args.specs else None
    for path in list_models():
        if chosen is not None and path.stem not in chosen:
            continue
        try:
            report, s = timed_spec(path, runs=args.spec_runs, workers=args.workers)
        except Exception as exc:  # noqa: BLE001 -- a benchmark row, not a release: record it and go on
            print(f"  [specs] {path.stem}: FAILED: {type(exc).__name__}: {exc}", flush=True)
            ERRORS.append({"section": "specs", "target": path.stem, "error": f"{type(exc).__name__}: {exc}"})
            continue
        rows.append(spec_row(path.stem, report, s))
        checkpoint(args, "specs", rows)
        if args.plots:
            from dpopt.audit.plots import plot_worst_pair

            plot_worst_pair(report, Path(args.plots) / f"audit_spec_{path.stem}.png")
    print_spec_rows(f"Every shipped spec ({args.spec_runs:,} runs per dataset of the worst pair; 'detects': the "
                    "excess over the claim the test would have detected with 95% probability; 'cells': possible/"
                    "all cells of the audit domain)", rows)
    return rows


def census_spec_text() -> str:
    """A 449,280-cell census spec from the census example's geography (module notes)."""
    from dpopt.datasets.census import census_domain, county_parent

    geo = census_domain(4, 3)
    parents = ", ".join(f'"{c}" = "{s}"' for c, s in county_parent(geo).items())
    ages = ["0-4", "5-14", "15-17", "18-24", "25-44", "45-64", "65-74", "75+"]
    races = [f"race {i}" for i in range(1, 10)]
    education = ["none", "preschool", "primary", "lower secondary", "upper secondary", "vocational", "some college",
                 "associate", "bachelor", "master", "professional", "doctorate", "unknown"]
    households = ["married couple", "other family", "alone", "nonfamily", "group quarters"]

    def labels(values):
        return "[" + ", ".join(f'"{v}"' for v in values) + "]"

    measures = "\n".join(
        f'[[measure]]\nlabel = "{" x ".join(attrs)}"\nquery = "marginal"\nattrs = {labels(attrs)}\n'
        f'mechanism = "laplace"\nshare = {share}\n'
        for attrs, share in ((["county", "sex", "age_group"], 0.3), (["state", "race", "education"], 0.3),
                             (["age_group", "sex", "race"], 0.2), (["education", "age_group", "household_type"], 0.2)))
    school = "age_group in ['0-4', '5-14'] and education not in ['none', 'preschool', 'primary', 'unknown']"
    degree = "age_group in ['0-4', '5-14', '15-17'] and education in ['bachelor', 'master', 'doctorate']"

    return f"""
name = "census_449k"
description = "A census-like spec of 449,280 cells for the audit's speed benchmark."
[domain.attributes]
state = {labels(geo.labels["state"])}
county = {labels(geo.labels["county"])}
age_group = {labels(ages)}
sex = ["F", "M"]
race = {labels(races)}
education = {labels(education)}
household_type = {labels(households)}
[data]
source = "file"
[privacy]
accounting = "pure"
epsilon = 1.0
{measures}
[constraints]
nonnegative = true
integer = true
structural_zeros = [
    {{ where = "{school}", name = "children in school" }},
    {{ where = "{degree}", name = "no degree before 18" }},
]
hierarchy = [{{ parent = "state", child = "county", parent_of = {{ {parents} }}, name = "geography" }}]
invariants = [{{ name = "state totals", query = "marginal", attrs = ["state"], from_data = true }}]
"""


def census(args) -> list[dict]:
    spec = parse_spec_text(census_spec_text())
    from dpopt.audit.spec import _public

    cells = _public(spec).domain.size
    report, s = timed_spec(spec, runs=1000, workers=args.workers)
    rows = [spec_row(f"census ({cells:,} cells)", report, s)]
    checkpoint(args, "census", rows)
    print_spec_rows(f"A {cells:,}-cell census spec at 1,000 runs (target: 3 minutes on 2 cores)", rows)
    for note in report.notes[:2]:
        print(f"  note: {note}")
    return rows


def auto(args) -> list[dict]:
    report, s = timed_spec("quickstart", runs="auto", excess=0.25, workers=args.workers, echo=print)
    rows = [spec_row("quickstart --runs auto", report, s)]
    rows[0]["test_sizing"] = report.settings.get("test_sizing")
    print_spec_rows("--runs auto on the quickstart (excess asked: 0.25 x epsilon)", rows)
    return rows


#: The spec of each algorithm the planted bugs go into (DualQuery with its noisy record count).
PLANTED_SPECS = {"measure_reconstruct": "quickstart", "mwem": "nltcs_mwem", "dualquery": "kdd99_dualquery",
                 "polynomial": "nltcs_polynomial", "topdown": "census_topdown"}


def planted_specs(shipped: bool, tokens: list[str]) -> list[tuple[str, str, object]]:
    """``(algorithm, name, spec)`` for each spec the planted bugs go into, in the order of
    ``tokens`` (``algorithm``: every audit configuration of it, :func:`dpopt.audit.configurations.configurations`;
    ``algorithm:key``: that one); with ``shipped`` the shipped spec instead (DualQuery's with a
    noisy record count, count_share = 0.1: the public-n default discloses n)."""
    from dpopt.audit.configurations import MAIN, configurations, configured_spec
    from dpopt.spec import parse_spec

    chosen = []
    for token in tokens:
        algorithm, _, key = token.partition(":")
        if algorithm not in PLANTED_SPECS:
            raise SystemExit(f"--algorithms: no planted spec for {algorithm!r}; choose from {', '.join(PLANTED_SPECS)}")
        if not shipped:
            keys = [key] if key else list(configurations(algorithm))
            for k in keys:
                suffix = " (audit configuration)" if k == MAIN else f" (audit configuration {k})"
                chosen.append((algorithm, PLANTED_SPECS[algorithm] + suffix, configured_spec(algorithm, k)))
            continue
        spec = load_spec(PLANTED_SPECS[algorithm])
        if algorithm == "dualquery":
            raw = dict(spec.raw, dualquery=dict(spec.raw["dualquery"], count_share=0.1))
            spec = parse_spec(raw, source=spec.source, base_dir=spec.base_dir)
        chosen.append((algorithm, PLANTED_SPECS[algorithm], spec))
    return chosen


def planted(args) -> list[dict]:
    rows = []
    chosen = planted_specs(args.shipped, args.algorithms.split(",") if args.algorithms else list(PLANTED_SPECS))
    asked = args.bugs.split(",") if args.bugs else list(PLANTED_BUGS)
    bugs = (["none"] if "none" in asked else []) + [b for b in PLANTED_BUGS if b in asked]
    for bug in bugs:  # bug by bug: a run stopped early has each bug on every algorithm it reached
        for algorithm, name, spec in chosen:
            target, _, _ = spec_target(spec)
            mutant = target if bug == "none" else Planted(target, bug)  # none: the correct algorithm
            if bug != "none" and not mutant.applies:
                rows.append({"algorithm": algorithm, "spec": name, "bug": bug, "caught": None,
                             "why": mutant.not_applicable})
                checkpoint(args, "planted", rows)
                continue
            try:
                report, s = timed_audit(mutant, runs=args.planted_runs, workers=args.workers)
            except Exception as exc:  # noqa: BLE001 -- record it and go on (a benchmark row)
                print(f"  [planted] {algorithm} {bug}: FAILED: {type(exc).__name__}: {exc}", flush=True)
                ERRORS.append({"section": "planted", "target": f"{algorithm} {bug}",
                               "error": f"{type(exc).__name__}: {exc}"})
                continue
            # an exact count is the bug's doing unless the release declares the count public (the
            # papers' n): then the conditional audit's verdict is the one that catches or misses it
            final = report.conditional if report.conditional is not None and report.count_declared_public else report
            caught = not final.passed  # for "none": a false alarm
            rows.append({"algorithm": algorithm, "spec": name, "bug": bug, "caught": caught,
                         "planted_where": mutant.first_free_answer()[1] if bug == "unnoised_answer" else None,
                         "outcome": report.outcome, "epsilon_lower_bound": final.epsilon_lower_bound,
                         "claimed": final.claim.epsilon, "event": final.event.label,
                         "detectable_excess": final.detectable_excess, "seconds": s,
                         "cpu_seconds": report.cpu_seconds, "runs": report.total_runs,
                         "exact_disclosures": final.exact_disclosures, "pair": final.pair_text})
            checkpoint(args, "planted", rows)
    print(f"\nPlanted bugs in real runs ({args.planted_runs:,} runs per dataset of the worst pair; 'detects': the "
          "excess over the claim the test would have detected with 95% probability)")
    print(f"  {'algorithm (spec)':<52} {'bug':<16} {'caught':<7} {'outcome':<18} {'eps >=':>8} {'claim':>7} "
          f"{'detects':>8} {'runs':>7} {'wall':>8} {'CPU':>8}")
    for r in rows:
        label = f"{r['algorithm']} ({r['spec']})"
        if r["caught"] is None:
            print(f"  {label:<52} {r['bug']:<16} {'n/a':<7} {r['why'][:120]}")
            continue
        det = "none" if math.isinf(r["detectable_excess"]) else f"+{r['detectable_excess']:.3g}"
        if r["bug"] == "none":
            caught = "FALSE ALARM" if r["caught"] else "passes"
        else:
            caught = "yes" if r["caught"] else "NO"
        print(f"  {label:<52} {r['bug']:<16} {caught:<7} {r['outcome']:<18} "
              f"{r['epsilon_lower_bound']:>8.3f} {r['claimed']:>7.3g} {det:>8} {r['runs']:>7,} {r['seconds']:>7.1f}s "
              f"{r['cpu_seconds']:>7.1f}s")
        print(f"  {'':<40} event: {r['event'][:100]}")
    verdicts: dict = {}
    for r in rows:  # a bug is caught when any configuration catches it; the correct one must pass all
        if r["caught"] is not None:
            verdicts.setdefault((r["algorithm"], r["bug"]), []).append(r["caught"])
    print("\n  By algorithm, over its audit configurations (caught when any catches; 'none': passes when all pass)")
    for (algorithm, bug), seen in verdicts.items():
        if bug == "none":
            word = "FALSE ALARM" if any(seen) else "passes"
        else:
            word = "caught" if any(seen) else "MISSED"
        print(f"  {algorithm:<22} {bug:<16} {word} ({sum(seen)} of {len(seen)} configurations flag)")
    return rows


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
        algorithm, _ = cls(params).resized(2, budget)
        report, s = timed_audit(AlgorithmTarget(algorithm, domain, budget), runs=args.algorithm_runs,
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
                        help="specs, census, auto, planted, mechanisms, algorithms, mutants, power (default: all)")
    parser.add_argument("--spec-runs", type=int, default=1000)
    parser.add_argument("--planted-runs", type=int, default=2000)
    parser.add_argument("--bugs", type=str, default=None,
                        help="planted: only these bugs (comma-separated; 'none' adds the correct algorithm's row)")
    parser.add_argument("--algorithms", type=str, default=None,
                        help="planted: only these algorithms, in this order (comma-separated: "
                             + ", ".join(PLANTED_SPECS) + "; each with every audit configuration, or "
                             "algorithm:key for one, e.g. topdown:no-zeros)")
    parser.add_argument("--shipped", action="store_true",
                        help="planted: plant into the shipped specs instead of the audit configurations")
    parser.add_argument("--specs", type=str, default=None,
                        help="specs: only these shipped specs, by file stem (comma-separated)")
    parser.add_argument("--mechanism-runs", type=int, default=DEFAULT_RUNS)
    parser.add_argument("--algorithm-runs", type=int, default=3000)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--plots", type=str, default=None, help="directory for the worst-pair PNG plots")
    parser.add_argument("--json", type=str, default=None, help="write every row to this JSON file")
    args = parser.parse_args()
    sections = ("specs", "census", "auto", "planted", "mechanisms", "algorithms", "mutants", "power")
    unknown = [s for s in args.sections if s not in sections]
    if unknown:
        parser.error(f"unknown section {unknown[0]!r}; choose from {', '.join(sections)}")
    args.sections = args.sections or list(sections)
    if args.specs:
        stems = {path.stem for path in list_models()}
        missing = sorted(set(args.specs.split(",")) - stems)
        if missing:
            parser.error(f"--specs: no shipped spec named {missing[0]!r}; choose from {', '.join(sorted(stems))}")
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
        Path(args.json).write_text(json.dumps({**results, "seconds": total, "complete": True}, indent=2, default=str))


if __name__ == "__main__":
    main()
