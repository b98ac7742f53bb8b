"""Issue 25's lost cells over many seeds: the peers that set the figures, ``auto`` and the noisy histogram.

The issue's peer figures are medians of three seeds (0, 1, 2). This script asks whether a lost
cell is a seed artefact: it runs the peer that set the figure on 15–30 seeds and reports, per
cell and method, the 3-seed median (seeds 0–2), the mean and median over all seeds, and where the
3-seed median sits in the seed distribution (the share of seeds at or below it).

Two halves, because the peers cannot share dpopt's environment (smartnoise-synth 1.0.8 pins
``mbi < 2`` and, through smartnoise-sql, ``pandas < 3``; diffprivlib 0.6.6 does not import with
scikit-learn 1.9, whose ``sklearn.tree._tree`` dropped ``DOUBLE``):

1. **The peers**, in a separate environment that has them (never a dpopt dependency)::

       python -m venv /tmp/peers && /tmp/peers/bin/pip install smartnoise-synth diffprivlib "scikit-learn<1.9"
       /tmp/peers/bin/python examples/benchmarks/bench_peer_seeds.py --run-peer mwem aim mst dpl_hist \\
           --datasets mildew czech --seeds 30 --out peers_seeds.jsonl

   This half imports neither dpopt nor anything from this repository: it reads
   ``$DPOPT_SHARED_DATA/<name>.csv`` with pandas and scores with numpy. Peers:

   * ``mwem``: smartnoise-synth's MWEM at its defaults, pure ε (Hardt, Ligett, McSherry 2012);
   * ``aim``, ``mst``: smartnoise-synth's AIM (McKenna et al. 2022) and MST (McKenna et al. 2021)
     at their default δ = 1e-9 — (ε, δ)-DP, *not* pure ε, as the issue's table treats them;
   * ``dpl_hist``: diffprivlib's ``histogramdd`` (truncated geometric noise, sensitivity 1, counts
     below 0 set to 0: the same law as dpopt's noisy histogram, another random stream).

   The synthesizers release records; each is sampled at the data's record count (what a user of
   the synthesizer gets), and the sample's histogram is scored. Seed ``s`` seeds numpy's and
   Python's global generators (the synthesizers take no seed), ``random_state=s`` for diffprivlib.

2. **The summary**, in dpopt's environment: ``auto`` (pure ε and zCDP ρ = ε²/2, the spec of
   ``bench_auto.py``) and dpopt's noisy histogram on the same seeds, and the peers' lines read
   back::

       python examples/benchmarks/bench_peer_seeds.py --peer-results peers_seeds.jsonl --seeds 30

Metrics as the peers' harness (``bench_smooth.py``): KL(true ‖ released) over the full table, and
the mean and largest absolute error over every cell of every 3-way marginal, on probabilities.
Seeded noise is NOT private: a benchmark.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

EPSILONS = (0.1, 0.5, 1.0)
#: The cells issue 25's table still loses (dataset, accounting, epsilon): what this script is for
#: (czech zCDP 1: its KL is lost once diffprivlib's histogram, finite there, counts as a peer).
LOST = (("czech", "pure", 0.1), ("czech", "pure", 1.0), ("czech", "zcdp", 1.0), ("mildew", "pure", 0.1),
        ("mildew", "pure", 0.5), ("mildew", "pure", 1.0), ("mildew", "zcdp", 0.1))
#: Issue 25's best peer figures (3-way mean) at epsilon 0.1 / 0.5 / 1, pure.
ISSUE_MEAN = {"czech": (0.0158, 0.0032, 0.0015), "mildew": (0.0743, 0.0439, 0.0263)}


def shared_csv(name: str) -> Path:
    root = Path(os.environ.get("DPOPT_SHARED_DATA", Path(__file__).resolve().parents[3] / "shared" / "data"))
    path = root / f"{name}.csv"
    if not path.is_file():
        raise SystemExit(f"benchmark data {path} is absent: set DPOPT_SHARED_DATA")
    return path


def cells_of(records: np.ndarray) -> np.ndarray:
    """Counts over the 2^d cells of binary records (rows), cell index in C order of the columns."""
    d = records.shape[1]
    index = records.astype(np.int64) @ (1 << np.arange(d - 1, -1, -1))
    return np.bincount(index, minlength=1 << d).astype(float)


def three_way(x: np.ndarray, d: int) -> np.ndarray:
    """Every 3-way marginal of the table ``x`` (2^d cells) stacked, on proportions."""
    t = x.reshape((2,) * d) / x.sum()
    return np.concatenate([t.sum(axis=tuple(a for a in range(d) if a not in s)).ravel()
                           for s in itertools.combinations(range(d), 3)])


def kl(truth: np.ndarray, estimate: np.ndarray) -> float:
    """KL(true ‖ estimate) on probabilities; inf when the estimate misses a cell the data holds
    (the same function as ``bench_smooth.kl``)."""
    p = truth / truth.sum()
    q = np.maximum(estimate, 0.0) / np.maximum(estimate, 0.0).sum()
    held = p > 0
    if np.any(q[held] <= 0):
        return float("inf")
    return float(np.sum(p[held] * np.log(p[held] / q[held])))


def score(truth: np.ndarray, x: np.ndarray) -> tuple[float, float, float]:
    d = int(round(math.log2(truth.size)))
    err = np.abs(three_way(x, d) - three_way(truth, d))
    return kl(truth, x), float(err.mean()), float(err.max())


# ---------------------------------------------------------------- the peers (their own environment)

def run_peer(mech: str, frame, eps: float, seed: int) -> np.ndarray:
    """One seeded release of ``mech`` on ``frame`` (binary columns): its table of counts."""
    np.random.seed(seed)
    random.seed(seed)
    d = frame.shape[1]
    if mech == "dpl_hist":
        from diffprivlib.tools import histogramdd

        counts, _ = histogramdd(frame.to_numpy(), epsilon=eps, bins=[2] * d, range=[(0, 1)] * d,
                                random_state=seed)
        x = np.asarray(counts, dtype=float).ravel()  # histogramdd's axes are the columns: C order
        return x if x.sum() > 0 else np.ones_like(x)
    from snsynth import Synthesizer

    synth = Synthesizer.create(mech, epsilon=eps)
    synth.fit(frame, categorical_columns=list(frame.columns), preprocessor_eps=0.0)
    sample = synth.sample(len(frame))
    records = sample[list(frame.columns)].to_numpy().astype(np.int64)
    return cells_of(records)


def peers(mechs, datasets, seeds: int, out: Path) -> None:
    import pandas as pd

    with out.open("a") as sink:
        for name in datasets:
            frame = pd.read_csv(shared_csv(name)).astype(int)
            truth = cells_of(frame.to_numpy())
            for mech, eps, seed in itertools.product(mechs, EPSILONS, range(seeds)):
                start = time.process_time()
                k, mean, mx = score(truth, run_peer(mech, frame, eps, seed))
                line = {"dataset": name, "mech": mech, "eps": eps, "seed": seed, "kl": k, "mean": mean, "max": mx,
                        "cpu_s": time.process_time() - start}
                sink.write(json.dumps(line) + "\n")
                sink.flush()
                print(json.dumps(line), flush=True)


# ---------------------------------------------------------------- the summary (dpopt's environment)

def dpopt_runs(datasets, seeds: int) -> dict:
    """auto (pure, zCDP) and dpopt's noisy histogram on seeds 0..seeds-1 over the lost cells."""
    from fractions import Fraction

    from _common import load_binary
    from bench_auto import peer_hist, run_auto

    runs = defaultdict(list)  # (dataset, method, accounting, eps) -> [(seed, kl, mean, max)]
    for name in datasets:
        data = load_binary(name)
        truth = data.histogram().astype(float)
        for dname, accounting, eps in LOST:
            if dname != name:
                continue
            frac = Fraction(eps).limit_denominator(100)
            for seed in range(seeds):
                release, _, _ = run_auto(data, accounting, frac, seed)
                runs[(name, "auto", accounting, eps)].append((seed, *score(truth, release.x)))
                if accounting == "pure":
                    runs[(name, "noisy histogram", accounting, eps)].append(
                        (seed, *score(truth, peer_hist(data, frac, seed))))
    return runs


def summarise(runs: dict, peer_lines: list[dict], seeds: int) -> list[dict]:
    for r in peer_lines:
        if r["seed"] < seeds:
            for accounting in ("pure", "zcdp"):
                runs[(r["dataset"], r["mech"], accounting, float(r["eps"]))].append(
                    (r["seed"], r["kl"], r["mean"], r["max"]))
    rows = []
    print("\n| cell | method | seeds | metric | 3-seed median (0-2) | mean ± se | median | share of seeds <= 3-seed "
          "median |")
    print("|---|---|---|---|---|---|---|---|")
    for dname, accounting, eps in LOST:
        for (name, method, acc, e), vals in sorted(runs.items()):
            if (name, acc, e) != (dname, accounting, eps):
                continue
            vals = sorted(vals)
            for j, metric in ((1, "KL"), (2, "mean"), (3, "max")):
                v = np.array([t[j] for t in vals])
                three = float(np.median([t[j] for t in vals if t[0] < 3]))
                row = {"dataset": name, "accounting": acc, "eps": e, "method": method, "metric": metric,
                       "seeds": v.size, "median3": three, "mean": float(v.mean()),
                       "se": float(v.std(ddof=1) / math.sqrt(v.size)), "median": float(np.median(v)),
                       "share_below": float(np.mean(v <= three))}
                rows.append(row)
                print(f"| {name} {acc} ε {e:g} | {method} | {v.size} | {metric} | {three:.4f} | "
                      f"{row['mean']:.4f} ± {row['se']:.4f} | {row['median']:.4f} | {row['share_below']:.2f} |")
    print("\nauto minus each other method over the same seeds (negative: auto lower), mean ± standard error; paired "
          "(same seed, same noise) against dpopt's noisy histogram under pure ε, unpaired against the peers")
    for dname, accounting, eps in LOST:
        ours = dict((t[0], t) for t in runs.get((dname, "auto", accounting, eps), []))
        for (name, method, acc, e), vals in sorted(runs.items()):
            if (name, acc, e) != (dname, accounting, eps) or method == "auto" or not ours:
                continue
            theirs = dict((t[0], t) for t in vals)
            common = sorted(set(ours) & set(theirs))
            paired = method == "noisy histogram"
            finite = [sum(math.isfinite(d[s][1]) for s in common) for d in (ours, theirs)]
            parts = [f"KL finite in {finite[0]} / {finite[1]} seeds"]
            for j, metric in ((2, "mean"), (3, "max")):
                a = np.array([ours[s][j] for s in common])
                b = np.array([theirs[s][j] for s in common])
                se = (np.std(a - b, ddof=1) if paired else math.sqrt(a.var(ddof=1) + b.var(ddof=1))) / math.sqrt(a.size)
                parts.append(f"{metric} {a.mean() - b.mean():+.4f} ± {se:.4f}")
            print(f"  {dname} {accounting} ε {eps:g}, auto − {method} ({len(common)} seeds"
                  f"{', paired' if paired else ''}): " + "; ".join(parts))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-peer", nargs="*", choices=["mwem", "aim", "mst", "dpl_hist"],
                        help="run these peers (in an environment that has them) and append JSON lines to --out")
    parser.add_argument("--datasets", nargs="*", default=["czech", "mildew"])
    parser.add_argument("--seeds", type=int, default=30, help="seeds 0..N-1")
    parser.add_argument("--out", type=Path, default=Path("peers_seeds.jsonl"))
    parser.add_argument("--peer-results", type=Path, nargs="*", default=[], help="JSON lines from --run-peer")
    args = parser.parse_args()
    if args.run_peer:
        peers(args.run_peer, args.datasets, args.seeds, args.out)
        return
    lines = [json.loads(s) for p in args.peer_results for s in p.read_text().splitlines() if s.strip()]
    start = time.process_time()
    runs = dpopt_runs(args.datasets, args.seeds)
    summarise(runs, [r for r in lines if r["dataset"] in args.datasets], args.seeds)
    print(f"\ndpopt side: {time.process_time() - start:.0f} CPU s")


if __name__ == "__main__":
    main()
