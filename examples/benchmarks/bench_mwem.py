"""MWEM benchmark (issues 6 and 30): speed on nltcs against two peers, and the paper's Figures 3 and 4.

1. speed: nltcs (2^16 cells), all 560 3-way marginals' 4,480 cells as the query set,
   epsilon = 1, T = 40, repeated updates each round ("optimised" options below). Fit CPU
   seconds (``time.process_time`` around the call, OPENBLAS_NUM_THREADS=1), methods run one
   after the other for each seed so that every ratio compares runs of the same minute:

   * ``dpopt``: :func:`dpopt.algorithms.mwem.mwem` with ``OPTIMISED``;
   * ``smartnoise``: smartnoise-synth's ``MWEMSynthesizer`` (``pip install smartnoise-synth``,
     not a dpopt dependency; skipped when absent) at the same epsilon and T with 3-way
     cuboids. It cannot hold one 16-attribute histogram (its ``histogramdd`` asks for 4^16
     bins), so it runs on two independent 8-attribute halves (``splits``): a smaller problem
     (2 x 256 cells), and its error is that of the product of the halves;
   * ``reference``: the paper's reference code (Fig. 8 of Hardt, Ligett, McSherry 2012)
     transcribed to numpy, independent of dpopt: float exponential mechanism and Laplace noise,
     and after each round 100 passes of the multiplicative update over every past measurement,
     one full pass over the table per measurement;
   * with ``--dpopt-reference`` also dpopt with the reference loop's options (``REFERENCE``).

   Accuracy: mean absolute error per 3-way marginal cell.
   ``profile`` prints where each method's fit CPU goes (dpopt: selection's answers and exact draw,
   measurement, the MW passes and their loss, and the cost of one update's gather, sums and
   multiplication; smartnoise: its data preprocessing, selection, noise and updates).
   ``halves`` gives dpopt smartnoise's own problem: the same two 8-attribute halves, each at
   epsilon / 2 with T = 40, whole-marginal selection over the very cuboids smartnoise sampled,
   20 plain passes per round (its ``mult_weights_iterations``); the error is that of the
   product of the halves for both.
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

Run:  OPENBLAS_NUM_THREADS=1 python examples/benchmarks/bench_mwem.py speed --speed-seeds 3
      OPENBLAS_NUM_THREADS=1 python examples/benchmarks/bench_mwem.py profile halves --speed-seeds 3
      python examples/benchmarks/bench_mwem.py speed figure4 figure3 --runs 10 --plots /tmp/mwem-plots
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


def cpu_seconds(call):
    """``(result, CPU seconds of this process)`` of ``call()``."""
    start = time.process_time()
    out = call()
    return out, time.process_time() - start


def smartnoise_fit(frame, epsilon: float, rounds: int, seed: int):
    """smartnoise-synth's MWEM on two independent 8-attribute halves: the fitted joint table
    (the product of the halves' tables, C order over the columns), or None when not installed."""
    try:
        import warnings

        from snsynth.mwem import MWEMSynthesizer
    except ImportError:
        return None
    import random

    np.random.seed(seed)  # smartnoise draws from numpy's and Python's global generators
    random.seed(seed)
    half = frame.shape[1] // 2
    synth = MWEMSynthesizer(epsilon=float(epsilon), iterations=rounds, marginal_width=3,
                            splits=[list(range(half)), list(range(half, frame.shape[1]))])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        synth.fit(frame.copy(), categorical_columns=list(frame.columns))
    (first, *_), (second, *_) = synth.synthetic_histograms
    n = float(np.sum(first))
    return np.multiply.outer(first, second).reshape(-1) / n


def reference_loop(domain, W, truth_by_block, hist, epsilon: float, rounds: int, seed: int) -> np.ndarray:
    """Fig. 8 of Hardt, Ligett, McSherry (2012), the paper's reference code, in numpy.

    Float exponential mechanism at eps/(2T) over every cell query (rejecting queries measured
    before), Laplace(2T/eps) noise, and after each round 100 passes over all measurements in
    order: ``A *= exp(q * (m - q.A) / (2 total))``, renormalised to ``total`` after each.
    Independent of dpopt's engines (only the data's answers are shared).
    """
    gen = np.random.default_rng(seed)
    shape = domain.shape
    n = float(hist.sum())
    A = np.full(hist.size, n / hist.size)
    axes = [tuple(domain.axis(a) for a in q.attrs) for q in W]
    cells = [(b, c) for b, q in enumerate(W) for c in range(q.num_rows)]
    truth = np.concatenate(truth_by_block)
    measured: dict[int, float] = {}
    masks: dict[int, np.ndarray] = {}
    eps = epsilon / (2 * rounds)
    for _ in range(rounds):
        tensor = A.reshape(shape)
        estimate = np.concatenate([tensor.sum(axis=tuple(i for i in range(len(shape)) if i not in ax)).reshape(-1)
                                   for ax in axes])
        errors = eps * np.abs(truth - estimate) / 2.0
        weights = np.exp(errors - errors.max())
        while True:
            qi = int(np.searchsorted(np.cumsum(weights), gen.random() * weights.sum()))
            qi = min(qi, len(weights) - 1)
            if qi not in measured:
                break
        measured[qi] = float(truth[qi] + gen.laplace(0.0, 2 * rounds / epsilon))
        b, c = cells[qi]
        sub = np.unravel_index(c, tuple(shape[i] for i in axes[b]))
        mask = np.ones(shape, dtype=bool)
        for i, v in zip(axes[b], sub):
            index = [slice(None)] * len(shape)
            index[i] = np.arange(shape[i]) != v
            mask[tuple(index)] = False
        masks[qi] = mask.reshape(-1)
        total = A.sum()
        for _ in range(100):
            for q, m in measured.items():
                error = m - A[masks[q]].sum()
                A *= np.exp(masks[q] * (error / (2.0 * total)))
                A *= total / A.sum()
    return A


def speed(args) -> None:
    import pandas as pd

    from _common import shared_file

    data = load_binary("nltcs")
    frame = pd.read_csv(shared_file("nltcs.csv"))
    W = all_marginals(data.domain, 3)
    ev = WorkloadEvaluator(data.domain, W)
    truth = ev.answers(data.histogram())
    truth_by_block = [truth[ev.offsets[b]:ev.offsets[b + 1]] for b in range(len(W))]
    print(f"\nspeed: nltcs, {len(W)} 3-way marginals = {ev.num_rows} cell queries, eps = 1, T = 40; "
          "fit CPU seconds, methods alternated per seed; mean |error| per 3-way cell")
    rows = []
    for seed in range(args.speed_seeds):
        res, dp = cpu_seconds(lambda: mwem(data, W, 1, rounds=40, rng=make_random(100 + seed), **OPTIMISED))
        row = {"seed": seed, "dpopt": dp, "dpopt error": mean_cell_error(ev, res.x, truth)}
        phases = "  ".join(f"{k[5:]} {v:.3f}" for k, v in res.info.items() if k.startswith("time_"))
        table, sn = cpu_seconds(lambda: smartnoise_fit(frame, 1.0, 40, seed))
        if table is not None:
            row.update({"smartnoise": sn, "smartnoise error": mean_cell_error(ev, table, truth)})
        if not args.no_reference:
            ref, rf = cpu_seconds(lambda: reference_loop(data.domain, W, truth_by_block, data.histogram(), 1.0, 40,
                                                          100 + seed))
            row.update({"reference": rf, "reference error": mean_cell_error(ev, ref, truth)})
        if args.dpopt_reference:
            slow, sl = cpu_seconds(lambda: mwem(data, W, 1, rounds=40, rng=make_random(100 + seed), **REFERENCE))
            row.update({"dpopt reference options": sl,
                        "dpopt reference options error": mean_cell_error(ev, slow.x, truth)})
        rows.append(row)
        print(f"  seed {seed}: " + ", ".join(f"{k} {v:.3f}" if "error" not in k else f"{k} {v:.1f}"
                                             for k, v in row.items() if k != "seed") + f"  (dpopt phases: {phases})",
              flush=True)
    median = {k: float(np.median([r[k] for r in rows])) for k in rows[0] if k != "seed"}
    print("  median: " + ", ".join(f"{k} {v:.3f}" for k, v in median.items()))
    for peer in ("smartnoise", "reference", "dpopt reference options"):
        if peer in median:
            ratios = [r[peer] / r["dpopt"] for r in rows]
            print(f"  {peer} / dpopt fit CPU: median {np.median(ratios):.1f}x (per seed: "
                  + ", ".join(f"{x:.1f}" for x in ratios) + ")")


class _CpuPhases:
    """CPU seconds spent in named functions (wrapped in place, restored on exit): a profile
    without the profiler's per-call overhead, which would swamp thousands of small updates."""

    def __init__(self, targets):
        self.targets, self.seconds, self._saved = targets, {}, []

    def __enter__(self):
        for label, owner, name in self.targets:
            original = getattr(owner, name)
            self._saved.append((owner, name, original))
            setattr(owner, name, self._timed(label, original))
        return self

    def _timed(self, label, original):
        def call(*args, **kwargs):
            start = time.process_time()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[label] = self.seconds.get(label, 0.0) + time.process_time() - start
        return call

    def __exit__(self, *exc):
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)


def _per_call_us(call, repeats: int = 200) -> float:
    """Best of five: CPU microseconds per ``call()``."""
    best = float("inf")
    for _ in range(5):
        start = time.process_time()
        for _ in range(repeats):
            call()
        best = min(best, (time.process_time() - start) / repeats)
    return 1e6 * best


def profile(args) -> None:
    """Where the fit CPU goes, dpopt and smartnoise (``speed``'s problem and options)."""
    import sys
    import warnings

    import pandas as pd

    import dpopt.estimate.engines.mw_step as mw_step
    from _common import shared_file

    module = sys.modules["dpopt.algorithms.mwem"]
    data = load_binary("nltcs")
    W = all_marginals(data.domain, 3)
    targets = [("selection: answers of all cells", module.WorkloadEvaluator, "answers"),
               ("selection: exact exponential draw", module, "exponential_mechanism"),
               ("measurement (exact noise)", module, "measure_round"),
               ("MW passes (updates and loss)", mw_step.MWState, "passes"),
               ("  of which the loss after each pass", mw_step.MWState, "loss")]
    print(f"\nprofile: dpopt, nltcs, {len(W)} 3-way marginals, eps = 1, T = 40, {OPTIMISED}; "
          f"CPU seconds per fit, mean of {args.speed_seeds}")
    mwem(data, W, 1, rounds=40, rng=make_random(99), **OPTIMISED)  # warm the caches of the first call
    total, updates = 0.0, 0
    with _CpuPhases(targets) as phases:
        for seed in range(args.speed_seeds):
            res, cpu = cpu_seconds(lambda: mwem(data, W, 1, rounds=40, rng=make_random(100 + seed), **OPTIMISED))
            total, updates = total + cpu, updates + res.info["updates"]
    k = args.speed_seeds
    print(f"  fit {total / k:.3f} CPU-s, {updates / k:.0f} updates of the {data.domain.size:,}-cell table")
    for label, *_ in targets:
        seconds = phases.seconds.get(label, 0.0)
        print(f"  {label:38s} {seconds / k:.3f}  ({100 * seconds / total:.0f}%)")
    # One update's parts on this table, over a pass of the last run's marginals in their order:
    # the move into each marginal's layout (a gather), the contiguous sums, the multiplication in
    # place, and the arithmetic on the marginal's cells.
    state = mw_step.MWState(data.domain, float(data.total))
    indices = [state._index_for(W[b]) for b in dict.fromkeys(b for b, _ in res.selected)]
    layouts, table = state._layouts, state.x

    def moves():
        t, at = table, None
        for index in indices:
            t, at = layouts.move(t, at, index), index

    rows = table.reshape(indices[0].size, -1)
    factor = np.full(indices[0].size, 1.0)
    parts = {"gather into the marginal's layout": (moves, len(indices)),
             "contiguous sums per marginal cell": (lambda: rows.sum(axis=1), 1),
             "multiplication in place": (lambda: rows.__imul__(factor[:, None]), 1),
             "the factors (exp, dot, scale)": (lambda: np.exp(0.1 * (factor - factor * factor)) @ factor, 1)}
    print(f"  one update's parts, CPU microseconds (best of 5; gathers: mean over a pass of the last run's "
          f"{len(indices)} marginals):")
    for label, (call, per) in parts.items():
        print(f"    {label:36s} {_per_call_us(call, 200 // per) / per:7.1f}")

    try:
        import snsynth.mwem as sn
    except ImportError:
        print("\nprofile: smartnoise-synth is not installed")
        return

    frame = pd.read_csv(shared_file("nltcs.csv"))
    targets = [("preprocessing: its table transformer", sn.MWEMSynthesizer, "_get_train_data"),
               ("preprocessing: its histograms", sn.MWEMSynthesizer, "_histogram_from_data_attributes"),
               ("selection", sn.MWEMSynthesizer, "_exponential_mechanism"),
               ("Laplace noise", sn.MWEMSynthesizer, "_laplace"),
               ("multiplicative weights", sn.MWEMSynthesizer, "_multiplicative_weights")]
    total = 0.0
    with _CpuPhases(targets) as phases, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for seed in range(k):
            _, cpu = cpu_seconds(lambda: smartnoise_fit(frame, 1.0, 40, seed))
            total += cpu
    print(f"\nprofile: smartnoise-synth MWEM (two 8-attribute halves, T = 40 each), CPU seconds per fit")
    print(f"  fit {total / k:.3f} CPU-s")
    for label, *_ in targets:
        seconds = phases.seconds.get(label, 0.0)
        print(f"  {label:38s} {seconds / k:.3f}  ({100 * seconds / total:.0f}%)")


def smartnoise_cuboids(synth) -> list[list[list[int]]]:
    """The columns of every cuboid smartnoise sampled, per half (its queries index the
    histogram's transpose, so position ``i`` of a query is column ``d - 1 - i``)."""
    out = []
    for h in synth.histograms:
        cuboids = []
        for cuboid in h.queries:
            first = cuboid.queries[0].query
            cuboids.append(sorted(len(first) - 1 - i for i, v in enumerate(first) if not isinstance(v, slice)))
        out.append(cuboids)
    return out


def halves(args) -> None:
    """smartnoise's problem given to dpopt: the same halves, budget, T, cuboids and passes."""
    import random
    import warnings

    import pandas as pd

    from _common import shared_file
    from dpopt.model.data import Dataset
    from dpopt.model.domain import Domain
    from dpopt.model.queries import Marginal

    try:
        from snsynth.mwem import MWEMSynthesizer
    except ImportError:
        print("\nhalves: smartnoise-synth is not installed")
        return
    data = load_binary("nltcs")
    W = all_marginals(data.domain, 3)
    ev = WorkloadEvaluator(data.domain, W)
    truth = ev.answers(data.histogram())
    frame = pd.read_csv(shared_file("nltcs.csv"))
    columns = list(frame.columns)
    half = len(columns) // 2
    splits = [columns[:half], columns[half:]]
    print("\nhalves: smartnoise's own problem for both: nltcs as two independent 8-attribute halves, "
          "eps = 1/2 and T = 40 each,\n  whole-marginal selection over the 1- to 3-way cuboids smartnoise "
          "sampled, 20 plain passes per round; fit CPU seconds (dpopt's includes building its tables), "
          "mean |error| per 3-way cell of the product of the halves")
    rows = []
    for seed in range(args.speed_seeds):
        np.random.seed(seed)
        random.seed(seed)
        synth = MWEMSynthesizer(epsilon=1.0, iterations=40, marginal_width=3,
                                splits=[list(range(half)), list(range(half, len(columns)))])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _, sn = cpu_seconds(lambda: synth.fit(frame.copy(), categorical_columns=columns))
        (first, *_), (second, *_) = synth.synthetic_histograms
        sn_table = np.multiply.outer(first, second).reshape(-1) / float(np.sum(first))

        def fit_halves():
            tables = []
            for h, (names, cuboids) in enumerate(zip(splits, smartnoise_cuboids(synth))):
                domain = Domain(tuple(names), (2,) * len(names))
                part = Dataset.from_frame(frame[names], domain)
                blocks = [Marginal(domain, [names[i] for i in c]) for c in cuboids]
                tables.append(mwem(part, blocks, Fraction(1, 2), rounds=40, select="block", repeat_passes=20,
                                   rng=make_random(200 + 2 * seed + h)).x)  # a seed per half
            return np.multiply.outer(tables[0], tables[1]).reshape(-1) / float(tables[0].sum())

        dp_table, dp = cpu_seconds(fit_halves)
        rows.append((sn, dp))
        print(f"  seed {seed}: smartnoise {sn:.3f} CPU-s (error {mean_cell_error(ev, sn_table, truth):.1f}), "
              f"dpopt {dp:.3f} CPU-s (error {mean_cell_error(ev, dp_table, truth):.1f}): {sn / dp:.1f}x", flush=True)
    ratios = [sn / dp for sn, dp in rows]
    print(f"  median: smartnoise {np.median([r[0] for r in rows]):.3f}, dpopt {np.median([r[1] for r in rows]):.3f} "
          f"CPU-s; smartnoise / dpopt {np.median(ratios):.1f}x")


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
    parser.add_argument("parts", nargs="*", default=["speed"],
                        choices=["speed", "profile", "halves", "figure4", "figure3"])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--speed-seeds", type=int, default=3)
    parser.add_argument("--no-reference", action="store_true", help="skip the numpy transcription of Fig. 8 (~15 s)")
    parser.add_argument("--dpopt-reference", action="store_true",
                        help="also time dpopt with the reference loop's options (REFERENCE)")
    parser.add_argument("--plots", type=str, default=None, help="directory for PNG plots")
    args = parser.parse_args()
    if args.plots:
        Path(args.plots).mkdir(parents=True, exist_ok=True)
    for part in args.parts:
        {"speed": speed, "profile": profile, "halves": halves, "figure4": figure4, "figure3": figure3}[part](args)


if __name__ == "__main__":
    main()
