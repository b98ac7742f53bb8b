"""MWEM on random range queries over Adult (issue 6): the protocol of Figure 2 of Hardt,
Ligett, McSherry, "A simple and practical algorithm for differentially private data
release", NIPS 2012.

Data: ``../shared/data/adult.csv`` (raw UCI Adult, all 48,842 rows: ``adult.data`` and
``adult.test``), two domains:

* ``capital-loss``: one attribute, 4,357 values; code = the dollar amount 0..4356
  (the data's range is exactly 0..4356, 46,560 records at 0).
* ``age-hours``: age x hours-per-week, 91 x 25 = 2,275 cells.
  ``age`` code = age in years, 0..90 (UCI top-codes age at 90; the data hold 17..90,
  so codes 0..16 are empty cells of the domain, as in a 0..90 age axis).
  ``hours`` code = ``hours-per-week // 4``: bins [0-3], [4-7], ..., [96-99] of width 4,
  codes 0..24 (the data hold 1..99).

No record is dropped, clipped or re-binned silently: every value outside its domain is
counted and printed, and the run stops with a ``DataError`` if there is any (on this file
there are none).

Workload: random ranges (``dpopt.model.queries.random_ranges``: per attribute both ends
uniform, sorted) -- intervals for capital-loss, rectangles for age x hours. The workloads
are public and drawn from a seeded ``numpy.random.Generator``; per run, one workload of the
largest size is drawn and the smaller ones are its first rows (nested), so the curves over
the number of queries compare like with like.

Methods (the same workload and data for each):

* ``MWEM optimised``: ``OPTIMISED_RANGES`` (5 repeated passes per round with a growing
  step, 30 final passes), T rounds, single-query selection, last iterate. The nltcs speed
  benchmark's ``bench_mwem.OPTIMISED`` stops after 10 final passes; on overlapping ranges
  that leaves the last measurements under-absorbed (capital-loss error about 2.5 times
  higher), so this benchmark keeps 30;
* ``MWEM reference``: ``bench_mwem.REFERENCE``, the paper's reference loop (100 plain passes
  over all past measurements after each round, one update per measurement, in order). The
  tables print the number of distinct ranges each selected out of T (repeated selections
  mean a measurement was not absorbed);
* ``noisy histogram``: discrete Laplace on every cell with all of epsilon (sensitivity 1),
  each range answered as the sum of its noisy cells (no clipping, no consistency step);
* ``Laplace per query``: the workload answered directly with discrete Laplace noise
  calibrated to its exact L1 sensitivity (the largest number of ranges covering a cell).

MWEM uses the record count n as public (as in the paper, which starts from n * uniform);
the two baselines do not need it.

With ``--matrix`` (issue 15: the figure completed with the matrix mechanism's side):

* ``SVD bound``: Li and Miklau's lower bound on every matrix-mechanism strategy, with the
  papers' Gaussian constant ``P(eps, delta) = 2 ln(2/delta) / eps^2`` at ``delta = 1/n`` (n the
  number of records), as the MWEM paper instantiates it (no data, no noise);
* ``MM best (expected)``: the least expected error over the strategies below, from the exact
  formula ``v · trace(W (AᵀA)⁺ Wᵀ) / Q`` with ``v`` the discrete Laplace variance (no data);
* ``MM <strategy> >= 0``: the strategy (identity, hierarchical b = 2, Haar wavelet, HDMM's
  optimised p-Identity -- on age x hours the better of p-Identity and a Kronecker product of
  per-attribute p-Identity) measured with discrete Laplace at its L1 sensitivity, then the
  non-negative weighted least-squares table (``dpopt.estimate.reconstruct``), pure epsilon-DP.

Measure: average squared error per query, ``mean_q (q(estimate) - q(data))^2``, then its
mean (and standard error) over ``--runs`` runs with independent workloads and seeded noise
sources (``dpopt.privacy.randomness.make_random``: seeded, NOT private -- a benchmark).

Panels: (i) error vs number of queries at epsilon = 0.1; (ii) error vs epsilon with 2,000
queries. T = 10 (``--rounds``). The paper's Figure 2 (``../shared/seeds/mwem-nips-2012.txt``,
its caption and Sec. 3.1) varies |Q| from 500 to 4,000 at epsilon = 0.1 and epsilon from
0.0125 to 0.1 at |Q| = 2,000, reports the best T in {10, 12, 14, 16}, averages 5 repetitions
and instantiates the SVD bound at delta = 1/n; the grids here are wider on both axes.

With ``--boxes`` (issue 28): every box of a 75 x 50 grid (age 17..91 x hours-per-week in bins of
2, all of Adult: 3,633,750 candidate queries), given as ``Kronecker([AllRanges, AllRanges])``;
MWEM with ``OPTIMISED_RANGES`` at T = ``--rounds``, epsilon = 0.1: fit CPU and wall seconds, peak
memory, and the average squared error per box against the noisy-histogram baseline.

Run:  python examples/benchmarks/bench_mwem_ranges.py --runs 10 --plots /tmp/mwem-fig2
      python examples/benchmarks/bench_mwem_ranges.py --boxes --runs 3
      python examples/benchmarks/bench_mwem_ranges.py --runs 5 --matrix --plots /tmp/fig2   (with the MM side)
      python examples/benchmarks/bench_mwem_ranges.py --quick          (smoke test, 2 runs)
"""

from __future__ import annotations

import argparse
import time
from fractions import Fraction
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from _common import peak_memory_mb, shared_file
from bench_mwem import REFERENCE
from dpopt.algorithms.mwem import mwem
from dpopt.errors import DataError
from dpopt.estimate import reconstruct
from dpopt.model.constraints import ConstraintSet, NonNegativity
from dpopt.model.data import Dataset
from dpopt.model.domain import Domain
from dpopt.model.queries import HaarWavelet, Hierarchical, Identity, Kronecker, RangeQueries, random_ranges
from dpopt.privacy.accountant import Accountant, PrivacyCost
from dpopt.privacy.mechanisms import calibrate, laplace_mechanism, measure
from dpopt.privacy.randomness import make_random
from dpopt.strategy import gram_of, trace_term
from dpopt.strategy.bound import classic_gaussian_constant, svd_bound
from dpopt.strategy.optimize import optimize_kronecker, optimize_pidentity

#: MWEM's improved options for range workloads (see the module notes).
OPTIMISED_RANGES = dict(repeat_passes=5, boost=32.0, final_passes=30)

CAPITAL_LOSS_SIZE = 4357
AGE_SIZE = 91
HOURS_BIN_WIDTH = 4
HOURS_SIZE = 25
DOMAINS = ("capital-loss", "age-hours")

QUERY_COUNTS = (250, 500, 1000, 2000, 4000, 8000)
EPSILONS = (Fraction(1, 40), Fraction(1, 20), Fraction(1, 10), Fraction(1, 5), Fraction(2, 5))
QUICK_QUERY_COUNTS = (250, 2000, 8000)
QUICK_EPSILONS = (Fraction(1, 40), Fraction(1, 10), Fraction(2, 5))
EPS_FOR_COUNTS = Fraction(1, 10)
COUNT_FOR_EPS = 2000

METHODS = ("MWEM optimised", "MWEM reference", "noisy histogram", "Laplace per query")
#: The matrix mechanism's side (``--matrix``).
MM_STRATEGIES = ("identity", "hierarchical", "wavelet", "optimised")
MM_METHODS = ("SVD bound", "MM best (expected)") + tuple(f"MM {s} >= 0" for s in MM_STRATEGIES)


# ---- data --------------------------------------------------------------------------------------
def _integer_column(frame: pd.DataFrame, column: str) -> np.ndarray:
    """The column as int64; NaN or non-integer values raise a DataError naming the column."""
    if column not in frame.columns:
        raise DataError(f"column {column!r} is missing from the Adult data (columns: {list(frame.columns)})")
    values = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=np.float64)
    bad = ~np.isfinite(values) | (values != np.round(values))
    if bad.any():
        first = frame[column][bad].iloc[0]
        raise DataError(f"column {column!r}: {int(bad.sum())} rows are not integers (first: {first!r})")
    return values.astype(np.int64)


def encode_adult(frame: pd.DataFrame, name: str) -> tuple[Dataset, tuple[str, ...], dict[str, int]]:
    """Encode raw Adult records on one of the two range domains (see the module docstring).

    Parameters
    ----------
    frame : DataFrame
        Raw Adult records with columns ``capital-loss`` or ``age`` and ``hours-per-week``.
    name : {"capital-loss", "age-hours"}

    Returns
    -------
    data : Dataset
    attrs : tuple of str
        The ranged attributes (all of the domain's).
    outside : dict
        Per source column, how many records fall outside the domain (all zero, otherwise
        a DataError is raised: records are never dropped or clipped).
    """
    if name == "capital-loss":
        domain = Domain(("capital-loss",), (CAPITAL_LOSS_SIZE,))
        columns = {"capital-loss": (_integer_column(frame, "capital-loss"), 1, CAPITAL_LOSS_SIZE)}
    elif name == "age-hours":
        domain = Domain(("age", "hours"), (AGE_SIZE, HOURS_SIZE))
        columns = {
            "age": (_integer_column(frame, "age"), 1, AGE_SIZE),
            "hours-per-week": (_integer_column(frame, "hours-per-week"), HOURS_BIN_WIDTH, HOURS_SIZE),
        }
    else:
        raise DataError(f"unknown range domain name={name!r}; expected one of {DOMAINS}")
    codes, outside = [], {}
    for column, (values, width, size) in columns.items():
        # Floor division keeps negative values negative, so they are counted as outside.
        code = values // width
        bad = (code < 0) | (code >= size)
        outside[column] = int(bad.sum())
        if bad.any():
            raise DataError(
                f"column {column!r}: {outside[column]} records outside 0..{size * width - 1} "
                f"(e.g. {int(values[bad][0])}); the benchmark does not drop or clip records"
            )
        codes.append(code)
    return Dataset(np.stack(codes, axis=1), domain), domain.attrs, outside


def load_domain(name: str) -> tuple[Dataset, tuple[str, ...], dict[str, int]]:
    frame = pd.read_csv(shared_file("adult.csv"), usecols=["age", "capital-loss", "hours-per-week"])
    return encode_adult(frame, name)


# ---- workloads and baselines -------------------------------------------------------------------
def nested_workloads(domain: Domain, attrs: Sequence[str], counts: Sequence[int],
                     rng: np.random.Generator) -> dict[int, RangeQueries]:
    """Random range workloads of the given sizes, each the first rows of the largest one."""
    largest = random_ranges(domain, attrs, max(counts), rng)
    return {int(c): RangeQueries(domain, largest.attrs, largest.lows[:c], largest.highs[:c]) for c in counts}


def mean_squared_error(estimate: np.ndarray, truth: np.ndarray) -> float:
    """Average squared error per query."""
    diff = np.asarray(estimate, dtype=np.float64) - np.asarray(truth, dtype=np.float64)
    return float(np.mean(diff * diff))


def noisy_histogram_answers(data: Dataset, workload: RangeQueries, epsilon, seed: int) -> np.ndarray:
    """Every range as the sum of discrete-Laplace-noised cells (all of epsilon on the histogram)."""
    accountant = Accountant.pure(epsilon)
    noisy = laplace_mechanism(Identity(data.domain), data, epsilon, accountant, make_random(seed),
                              label="noisy histogram")
    return workload.matvec(np.asarray(noisy.values, dtype=np.float64))


def laplace_per_query_answers(data: Dataset, workload: RangeQueries, epsilon, seed: int) -> np.ndarray:
    """The workload answered directly, discrete Laplace at its exact L1 sensitivity over epsilon."""
    accountant = Accountant.pure(epsilon)
    return np.asarray(laplace_mechanism(workload, data, epsilon, accountant, make_random(seed),
                                        label="Laplace per query").values, dtype=np.float64)


def _seed(*parts: int) -> int:
    """A reproducible 63-bit seed from integers (distinct streams per domain/size/eps/run/method)."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(2, dtype=np.uint64)[0] >> np.uint64(1))


# ---- the matrix mechanism's side -------------------------------------------------------------------
def _per_attribute(domain: Domain, make):
    if len(domain) == 1:
        return make(domain, domain.attrs[0])
    return Kronecker([make(domain.project([a]), a) for a in domain.attrs], domain)


def fixed_strategies(domain: Domain) -> dict:
    """The workload-independent strategies (each with its Gram, inverted once and kept)."""
    out = {"identity": Identity(domain), "hierarchical": _per_attribute(domain, lambda d, a: Hierarchical(d, a, 2)),
           "wavelet": _per_attribute(domain, HaarWavelet)}
    return {k: (q, gram_of(q)) for k, q in out.items()}


def optimised_strategy(W: RangeQueries):
    """HDMM's p-Identity for the workload (Laplace); on several attributes the better of it and
    a Kronecker product of per-attribute p-Identity."""
    G = gram_of(W)
    if len(W.domain) == 1:
        return optimize_pidentity(G, norm="l1").query
    fits = [optimize_kronecker(G, "l1"), optimize_pidentity(G, norm="l1")]
    return min(fits, key=lambda f: f.loss).query


def nonnegative_answers(data: Dataset, W: RangeQueries, strategy, epsilon, seed: int) -> np.ndarray:
    """The strategy measured with discrete Laplace (all of epsilon), the non-negative least-squares
    table, and the workload answered from it."""
    law = calibrate(strategy, PrivacyCost.pure(epsilon), "laplace")
    m = measure(strategy, data, law, Accountant.pure(epsilon), make_random(seed), label="strategy")
    result = reconstruct([m], ConstraintSet(data.domain).add(NonNegativity()), "l2")
    if not result.success:
        raise RuntimeError(f"non-negative reconstruction ended with status {result.status.name}: {result.message}")
    return W.matvec(result.x)


def paper_bound_per_query(W: RangeQueries, epsilon, records: int) -> float:
    """The SVD bound as the MWEM paper instantiates it: P(eps, 1/n) (Σσ)² / N, per query."""
    return classic_gaussian_constant(epsilon, Fraction(1, records)) * svd_bound(W) / W.num_rows


# ---- experiment --------------------------------------------------------------------------------
class Experiment:
    """Errors per (domain, method, number of queries, epsilon), one entry per run, cached."""

    def __init__(self, rounds: int, runs: int, counts: Sequence[int], matrix: bool = False) -> None:
        self.rounds, self.runs, self.counts = rounds, runs, tuple(counts)
        self.methods = METHODS + (MM_METHODS if matrix else ())
        self.errors: dict[tuple, list[float]] = {}
        self.distinct: dict[tuple, list[int]] = {}
        self.seconds: dict[str, float] = {m: 0.0 for m in self.methods}
        self.calls: dict[str, int] = {m: 0 for m in self.methods}
        self._workloads: dict[tuple[str, int], dict[int, RangeQueries]] = {}
        self._truth: dict[tuple[str, int, int], np.ndarray] = {}
        self._fixed: dict[str, dict] = {}
        self._optimised: dict[tuple[str, int, int], object] = {}
        self._traces: dict[tuple[str, int, int], dict[str, float]] = {}
        self.optimise_seconds: list[float] = []

    def strategies(self, name: str, data: Dataset, run: int, count: int, W: RangeQueries) -> dict:
        """Every matrix-mechanism strategy for this workload (the optimised one fitted once)."""
        if name not in self._fixed:
            self._fixed[name] = fixed_strategies(data.domain)
        key = (name, run, count)
        if key not in self._optimised:
            start = time.perf_counter()
            q = optimised_strategy(W)
            self.optimise_seconds.append(time.perf_counter() - start)
            self._optimised[key] = (q, gram_of(q))
        return {**self._fixed[name], "optimised": self._optimised[key]}

    def matrix_method(self, method: str, name: str, data: Dataset, run: int, count: int, W, truth, epsilon, seed):
        strategies = self.strategies(name, data, run, count, W)
        if method == "SVD bound":
            return paper_bound_per_query(W, epsilon, data.total)
        if method == "MM best (expected)":
            key = (name, run, count)
            if key not in self._traces:  # trace(W (AᵀA)⁺ Wᵀ) does not depend on epsilon
                G = gram_of(W)
                self._traces[key] = {s: trace_term(G, g) for s, (_, g) in strategies.items()}
            cost = PrivacyCost.pure(epsilon)
            return min(calibrate(q, cost, "laplace").variance * self._traces[key][s] / count
                       for s, (q, _) in strategies.items())
        strategy = strategies[method.removeprefix("MM ").removesuffix(" >= 0")][0]
        return mean_squared_error(nonnegative_answers(data, W, strategy, epsilon, seed), truth)

    def workload(self, name: str, data: Dataset, attrs, run: int, count: int) -> tuple[RangeQueries, np.ndarray]:
        key = (name, run)
        if key not in self._workloads:
            rng = np.random.default_rng(_seed(DOMAINS.index(name), run, 7))
            self._workloads[key] = nested_workloads(data.domain, attrs, self.counts, rng)
        W = self._workloads[key][count]
        if (name, run, count) not in self._truth:
            self._truth[(name, run, count)] = W.matvec(data.histogram())
        return W, self._truth[(name, run, count)]

    def point(self, name: str, data: Dataset, attrs, count: int, epsilon: Fraction) -> None:
        """Run every method ``runs`` times at one (number of queries, epsilon)."""
        if (name, METHODS[0], count, epsilon) in self.errors:
            return
        for run in range(self.runs):
            W, truth = self.workload(name, data, attrs, run, count)
            for m, method in enumerate(self.methods):
                seed = _seed(DOMAINS.index(name), count, epsilon.numerator, epsilon.denominator, run, m)
                start = time.perf_counter()
                if method.startswith("MWEM"):
                    options = OPTIMISED_RANGES if method == "MWEM optimised" else REFERENCE
                    result = mwem(data, W, epsilon, rounds=self.rounds, rng=make_random(seed), **options)
                    estimate = W.matvec(result.x)
                    self.distinct.setdefault((name, method, count, epsilon), []).append(
                        len({row for _, row in result.selected}))
                elif method in MM_METHODS:
                    error = self.matrix_method(method, name, data, run, count, W, truth, epsilon, seed)
                    self.seconds[method] += time.perf_counter() - start
                    self.calls[method] += 1
                    self.errors.setdefault((name, method, count, epsilon), []).append(error)
                    continue
                elif method == "noisy histogram":
                    estimate = noisy_histogram_answers(data, W, epsilon, seed)
                else:
                    estimate = laplace_per_query_answers(data, W, epsilon, seed)
                self.seconds[method] += time.perf_counter() - start
                self.calls[method] += 1
                self.errors.setdefault((name, method, count, epsilon), []).append(mean_squared_error(estimate, truth))

    def summary(self, name: str, method: str, count: int, epsilon: Fraction) -> tuple[float, float]:
        """(mean, standard error of the mean) over runs."""
        errs = np.asarray(self.errors[(name, method, count, epsilon)])
        sem = float(errs.std(ddof=1) / np.sqrt(errs.size)) if errs.size > 1 else float("nan")
        return float(errs.mean()), sem


def print_panel(exp: Experiment, name: str, keys: list, label: Callable, header: str) -> None:
    print(f"\n{header}")
    width = 22
    print("  " + f"{'method':<{width}}" + "".join(f"{label(k):>22}" for k in keys))
    for method in exp.methods:
        cells = []
        for count, eps in keys:
            mean, sem = exp.summary(name, method, count, eps)
            cells.append(f"{mean:11.3g} ± {sem:8.2g}")
        print("  " + f"{method:<{width}}" + "".join(f"{c:>22}" for c in cells))
    for method in ("MWEM optimised", "MWEM reference"):
        distinct = [np.mean(exp.distinct[(name, method, c, e)]) for c, e in keys]
        print("  " + f"{'  distinct sel.':<{width}}" + "".join(f"{d:>22.1f}" for d in distinct)
              + f"   <- {method}: distinct queries selected out of T = {exp.rounds}")


def plot(exp: Experiment, counts, epsilons, directory: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    styles = {"MWEM optimised": "o-", "MWEM reference": "s-", "noisy histogram": "^--", "Laplace per query": "v:",
              "SVD bound": "k--", "MM best (expected)": "kx:", "MM identity >= 0": "d-.", "MM hierarchical >= 0": "p-.",
              "MM wavelet >= 0": "h-.", "MM optimised >= 0": "*-"}
    titles = {"capital-loss": "Adult capital-loss (4357)", "age-hours": "Adult age x hours (91 x 25)"}
    fig, axes = plt.subplots(2, 2, figsize=(13, 9) if len(exp.methods) > len(METHODS) else (11, 8))
    for row, name in enumerate(DOMAINS):
        panels = ((axes[row, 0], [(c, EPS_FOR_COUNTS) for c in counts], [c for c in counts],
                   "number of queries", f"{titles[name]}, eps = {float(EPS_FOR_COUNTS):g}"),
                  (axes[row, 1], [(COUNT_FOR_EPS, e) for e in epsilons], [float(e) for e in epsilons],
                   "epsilon", f"{titles[name]}, {COUNT_FOR_EPS} queries"))
        for ax, keys, xs, xlabel, title in panels:
            for method in exp.methods:
                stats = [exp.summary(name, method, c, e) for c, e in keys]
                ax.errorbar(xs, [s[0] for s in stats], yerr=[s[1] for s in stats], fmt=styles[method],
                            label=method, capsize=2, markersize=4)
            ax.set(xscale="log", yscale="log", xlabel=xlabel, ylabel="average squared error per query",
                   title=title)
            # Label exactly the measured x values (log-axis minor labels overlap otherwise).
            ax.set_xticks(xs)
            ax.set_xticklabels([f"{x:g}" for x in xs])
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.grid(True, which="major", alpha=0.3)
    axes[0, 0].legend(fontsize=7, ncol=2 if len(exp.methods) > len(METHODS) else 1)
    side = " and the matrix mechanism (SVD bound at delta = 1/n)" if len(exp.methods) > len(METHODS) else ""
    fig.suptitle(f"MWEM (T = {exp.rounds}){side} on random range queries, mean ± s.e. over {exp.runs} runs")
    fig.tight_layout()
    path = directory / "mwem_figure2_ranges.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return [path]


#: The grid of ``--boxes``: age 17..91 (75 codes) x hours-per-week // 2 (50 codes).
BOX_AGE_FIRST, BOX_AGE_SIZE, BOX_HOURS_WIDTH, BOX_HOURS_SIZE = 17, 75, 2, 50


def box_grid() -> Dataset:
    """All Adult records on the 75 x 50 grid of ``--boxes`` (a DataError if any falls outside)."""
    frame = pd.read_csv(shared_file("adult.csv"), usecols=["age", "hours-per-week"])
    age = _integer_column(frame, "age") - BOX_AGE_FIRST
    hours = _integer_column(frame, "hours-per-week") // BOX_HOURS_WIDTH
    for name, code, size in (("age", age, BOX_AGE_SIZE), ("hours-per-week", hours, BOX_HOURS_SIZE)):
        if ((code < 0) | (code >= size)).any():
            raise DataError(f"column {name!r}: {int(((code < 0) | (code >= size)).sum())} records outside the grid")
    return Dataset(np.stack([age, hours], axis=1), Domain(("age", "hours"), (BOX_AGE_SIZE, BOX_HOURS_SIZE)))


def boxes(args, runs: int) -> None:
    from dpopt.algorithms.mwem import as_boxes
    from dpopt.model.queries import AllRanges

    data = box_grid()
    dom = data.domain
    W = Kronecker([AllRanges(dom.project(["age"]), "age"), AllRanges(dom.project(["hours"]), "hours")])
    truth = as_boxes(W).answer(data)
    eps = Fraction(1, 10)
    print(f"MWEM over every box of the {BOX_AGE_SIZE} x {BOX_HOURS_SIZE} age x hours grid: {W.num_rows:,} "
          f"candidates, {data.total:,} records, T = {args.rounds}, eps = {float(eps):g}, {OPTIMISED_RANGES}")
    for run in range(runs):
        cpu, wall = time.process_time(), time.perf_counter()
        res = mwem(data, W, eps, rounds=args.rounds, rng=make_random(_seed(28, run)), **OPTIMISED_RANGES)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        mwem_error = mean_squared_error(as_boxes(W).matvec(res.x), truth)
        hist_error = mean_squared_error(noisy_histogram_answers(data, as_boxes(W), eps, _seed(28, run)), truth)
        print(f"  run {run}: fit {cpu:.1f} CPU-s ({wall:.1f} s wall), select {res.info['time_select']:.1f} s, "
              f"update {res.info['time_update']:.1f} s; average squared error per box: MWEM {mwem_error:.4g}, "
              f"noisy histogram {hist_error:.4g}; peak memory {peak_memory_mb():.0f} MB", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=None, help="runs per point (default 10; 2 with --quick)")
    parser.add_argument("--rounds", type=int, default=10, help="MWEM's T (default 10)")
    parser.add_argument("--quick", action="store_true", help="3 query counts, 3 epsilons, 2 runs: a smoke test")
    parser.add_argument("--plots", type=str, default=None, help="directory for the PNG plot")
    parser.add_argument("--matrix", action="store_true",
                        help="add the matrix mechanism's side: SVD bound, best expected error, non-negative fits")
    parser.add_argument("--boxes", action="store_true",
                        help="only MWEM over every box of a 75 x 50 grid (3.6 million candidates)")
    args = parser.parse_args()
    runs = args.runs if args.runs is not None else (2 if args.quick else 10)
    if runs < 1 or args.rounds < 1:
        parser.error(f"--runs and --rounds must be positive, got runs={runs}, rounds={args.rounds}")
    if args.boxes:
        boxes(args, runs)
        return
    counts = QUICK_QUERY_COUNTS if args.quick else QUERY_COUNTS
    epsilons = QUICK_EPSILONS if args.quick else EPSILONS
    exp = Experiment(args.rounds, runs, counts, matrix=args.matrix)
    start = time.perf_counter()
    print(f"MWEM on Adult range queries (HLM 2012, Fig. 2 protocol): T = {args.rounds}, {runs} runs per point")
    for name in DOMAINS:
        data, attrs, outside = load_domain(name)
        print(f"\n== {name}: domain {dict(zip(data.domain.attrs, data.domain.sizes))}, "
              f"{data.total} records; records outside the domain per column: {outside}")
        for count in counts:
            exp.point(name, data, attrs, count, EPS_FOR_COUNTS)
        for eps in epsilons:
            exp.point(name, data, attrs, COUNT_FOR_EPS, eps)
        print_panel(exp, name, [(c, EPS_FOR_COUNTS) for c in counts], lambda k: f"Q = {k[0]}",
                    f"{name}: average squared error per query vs number of queries, "
                    f"eps = {float(EPS_FOR_COUNTS):g} (mean ± s.e.)")
        print_panel(exp, name, [(COUNT_FOR_EPS, e) for e in epsilons], lambda k: f"eps = {float(k[1]):g}",
                    f"{name}: average squared error per query vs epsilon, {COUNT_FOR_EPS} queries (mean ± s.e.)")
    print("\nseconds per call: " + ", ".join(
        f"{m} {exp.seconds[m] / max(exp.calls[m], 1):.3f} s" for m in exp.methods))
    if exp.optimise_seconds:
        times = np.array(exp.optimise_seconds)
        print(f"strategy optimisation: {times.size} fits, {times.mean():.2f} s mean, {times.max():.2f} s max "
              "(included in the first call of each workload)")
    print(f"total {time.perf_counter() - start:.1f} s, peak memory {peak_memory_mb():.0f} MB")
    if args.plots:
        directory = Path(args.plots)
        directory.mkdir(parents=True, exist_ok=True)
        for path in plot(exp, counts, epsilons, directory):
            print(f"plot: {path}")


if __name__ == "__main__":
    main()
