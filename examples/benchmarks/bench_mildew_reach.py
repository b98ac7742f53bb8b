"""Which lost cells of issue 25 can be reached at all: hindsight over measurement plans and fits (mildew).

Mildew has 70 records on 6 binary attributes (64 cells). ``auto`` measures, under pure ε, the
histogram, and on it it loses the 3-way mean and max at ε 0.1 to the issue's best peer
(diffprivlib's noisy histogram, medians of seeds 0-2: ``bench_peer_seeds.py``). This script asks
whether *any* fixed plan reaches the peer, with hindsight over

* **what is measured** (every plan fixed before data, the whole budget ε spent by the Laplace
  mechanism of dpopt, charged before the draw; shares of ε as written; with ``--accounting zcdp``
  the Gaussian mechanism at the same shares of ρ = ε²/2): what ``auto`` measures itself; the histogram; the total only (its only fit is the uniform table); the one-way marginals; the
  one-ways and the total; every pair; a spanning tree of pairs (the Chow-Liu tree of the *true*
  table: hindsight); the tree with the one-ways; the 3-way workload itself; the histogram mixed
  with the one-ways or the pairs at several splits;
* **how it is fitted**: least squares (total held, total free; on all residuals measured, on the
  workload's, on the lower orders) and the smooth estimate on each family at weights
  c × {1/16, 1/4, 1, 4, 16, 64, 256}, all under non-negativity (``choose_fit`` with one candidate
  at a time, the measurements marked Gaussian of the same variance so no family is left out:
  the fits do not depend on the noise law, only the risk estimates do, and none is used here).

For every plan the table gives the fit that is best *with hindsight* (lowest mean over the seeds
of the 3-way mean error; the same for the max), its mean ± standard error, and its 3-seed median
(seeds 0-2, the issue's statistic), against the peer's 3-seed median and its 30-seed mean
(``bench_peer_seeds.py``), and against the true independence model (non-private). A plan whose
best fit, chosen on the truth, does not reach the peer is evidence that the cell is out of reach
for that plan. Seeded noise: NOT private, a benchmark.

    python examples/benchmarks/bench_mildew_reach.py [--seeds 30] [--eps 0.1 0.5 1] [--plans histogram pairs]
        [--accounting zcdp]   # Gaussian noise at ρ = ε²/2, split by the same shares
"""

from __future__ import annotations

import argparse
import itertools
import math
import time
from collections import defaultdict
from fractions import Fraction

import numpy as np
from _common import load_binary
from bench_peer_seeds import score

from dpopt.estimate.choice.rule import SMOOTHING_FACTORS, EstimatorCandidate, choose_fit  # noqa: F401
from dpopt.model.constraints import ConstraintSet
from dpopt.model.measurement import Measurement
from dpopt.model.queries import Identity, Marginal, Total
from dpopt.privacy.accountant import Accountant
from dpopt.privacy.mechanisms import gaussian_mechanism, laplace_mechanism
from dpopt.privacy.randomness import make_random
from dpopt.strategy.tables import Workload

#: The peer on mildew (diffprivlib's noisy histogram): its 3-seed median (the issue's figure) and
#: its 30-seed mean, 3-way mean / max, by epsilon (``bench_peer_seeds.py --run-peer dpl_hist``).
PEER = {0.1: ((0.0743, 0.2767), (0.0855, 0.3040)), 0.5: ((0.0439, 0.1667), (0.0508, 0.1826)),
        1.0: ((0.0263, 0.0898), (0.0309, 0.1096))}
FACTORS = (1 / 16, 1 / 4, 1.0, 4.0, 16.0, 64.0, 256.0)


def chow_liu(data) -> list[tuple[str, str]]:
    """The maximum-mutual-information spanning tree of the TRUE table (hindsight, not private)."""
    names = data.domain.attrs
    x = data.histogram().astype(float).reshape((2,) * len(names))
    x /= x.sum()
    d = len(names)
    info = {}
    for i, j in itertools.combinations(range(d), 2):
        pij = x.sum(axis=tuple(a for a in range(d) if a not in (i, j)))
        pi, pj = pij.sum(axis=1, keepdims=True), pij.sum(axis=0, keepdims=True)
        held = pij > 0
        info[i, j] = float(np.sum(pij[held] * np.log(pij[held] / (pi * pj)[held])))
    parent = list(range(d))

    def root(a):
        while parent[a] != a:
            a = parent[a]
        return a

    tree = []
    for (i, j), _ in sorted(info.items(), key=lambda kv: -kv[1]):
        if root(i) != root(j):
            parent[root(i)] = root(j)
            tree.append((names[i], names[j]))
    return tree


def plans(data) -> dict:
    """Plan name -> [(query, share of epsilon)], shares summing to 1; ``"auto"``: what ``auto``
    measures for the benchmark's spec (the histogram under pure ε, its residual plan under zCDP)."""
    dom, names = data.domain, data.domain.attrs
    ones = [Marginal(dom, (a,)) for a in names]
    pairs = [Marginal(dom, s) for s in itertools.combinations(names, 2)]
    tree = [Marginal(dom, s) for s in chow_liu(data)]
    triples = [Marginal(dom, s) for s in itertools.combinations(names, 3)]

    def spread(queries, share):
        return [(q, share / len(queries)) for q in queries]

    out = {"auto's own plan": "auto", "histogram": [(Identity(dom), 1.0)], "total only": [(Total(dom), 1.0)],
           "one-ways": spread(ones, 1.0), "one-ways 1/2 + total 1/2": spread(ones, 0.5) + [(Total(dom), 0.5)],
           "pairs": spread(pairs, 1.0), "tree (Chow-Liu, hindsight)": spread(tree, 1.0),
           "one-ways 1/2 + tree 1/2": spread(ones, 0.5) + spread(tree, 0.5),
           "one-ways 1/2 + pairs 1/2": spread(ones, 0.5) + spread(pairs, 0.5),
           "triples (the workload)": spread(triples, 1.0)}
    for f in (0.25, 0.5, 0.75):
        out[f"histogram {f:g} + one-ways {1 - f:g}"] = [(Identity(dom), f)] + spread(ones, 1 - f)
    out["histogram 0.5 + tree 0.5"] = [(Identity(dom), 0.5)] + spread(tree, 0.5)
    out["histogram 0.5 + pairs 0.5"] = [(Identity(dom), 0.5)] + spread(pairs, 0.5)
    return out


def candidates() -> list[EstimatorCandidate]:
    out = [EstimatorCandidate("l2", "all"), EstimatorCandidate("l2", "all", held=False),
           EstimatorCandidate("l2", "workload"), EstimatorCandidate("l2", "lower")]
    return out + [EstimatorCandidate("smooth", f, c) for f in ("all", "workload", "lower") for c in FACTORS]


def measure_plan(data, plan, eps: Fraction, seed: int, accounting: str = "pure") -> list[Measurement]:
    """The plan's measurements: Laplace at ``share × ε`` each (pure), or Gaussian at ``share × ρ``
    with ``ρ = ε²/2`` (zCDP)."""
    if plan == "auto":
        from bench_auto import run_auto

        release, _, _ = run_auto(data, accounting, eps, seed)
        return [Measurement(m.query, m.values, "gaussian", math.sqrt(m.variance), m.variance, label=m.label)
                for m in release.measurements if m.variance > 0]
    rho = eps * eps / 2
    acct = Accountant.pure(eps) if accounting == "pure" else Accountant.zcdp(rho)
    rng = make_random(seed)  # seeded: NOT private (the histogram plan's noise = auto's and the noisy histogram's)
    out = []
    for query, share in plan:
        part = Fraction(share).limit_denominator(1000)
        m = laplace_mechanism(query, data, eps * part, acct, rng) if accounting == "pure" else \
            gaussian_mechanism(query, data, acct, rng, rho=rho * part)
        # marked Gaussian of the same variance: the fits do not read the law, and no family is left out
        out.append(Measurement(m.query, m.values, "gaussian", math.sqrt(m.variance), m.variance, label=m.label))
    return out


def fits(measurements, domain, workload) -> dict:
    """Every candidate's fit (name -> table); a candidate that is not fitted is left out."""
    out, seen = {}, set()
    cs = ConstraintSet(domain)
    for cand in candidates():
        choice = choose_fit(measurements, cs, workload, candidates=[cand], blend=False, select="least")
        if choice.chosen is None or choice.chosen.candidate != cand:
            continue
        x = np.asarray(choice.result.x, dtype=float)
        key = np.round(x, 6).tobytes()
        if key not in seen:
            seen.add(key)
            out[cand.name] = x
    return out


def reach(eps_list, seeds: int, names=None, accounting: str = "pure") -> None:
    data = load_binary("mildew")
    truth = data.histogram().astype(float)
    W = Workload.all_k_way(data.domain, 3)
    all_plans = plans(data)
    x = truth.reshape((2,) * len(data.domain.attrs)) / truth.sum()
    d = x.ndim
    independent = np.ones(())
    for a in range(d):
        independent = np.multiply.outer(independent, x.sum(axis=tuple(b for b in range(d) if b != a)))
    print(f"mildew: true independence model 3-way mean / max {score(truth, independent.ravel() * truth.sum())[1]:.4f}"
          f" / {score(truth, independent.ravel() * truth.sum())[2]:.4f}; uniform "
          f"{score(truth, np.ones_like(truth))[1]:.4f} / {score(truth, np.ones_like(truth))[2]:.4f}; "
          f"Chow-Liu tree {chow_liu(data)}", flush=True)
    for eps in eps_list:
        frac = Fraction(eps).limit_denominator(100)
        (peer3_mean, peer3_max), (peer30_mean, peer30_max) = PEER[float(eps)]
        print(f"\n### {'pure ε' if accounting == 'pure' else 'zCDP ρ = ε²/2, ε'} {eps:g}: peer (diffprivlib noisy histogram) 3-seed median {peer3_mean:.4f} / "
              f"{peer3_max:.4f}, 30-seed mean {peer30_mean:.4f} / {peer30_max:.4f}")
        print("| plan | best fit for the mean (hindsight) | mean ± se | 3-seed median | best fit for the max | max ± se "
              "| 3-seed median | oracle per seed: mean / max | CPU s |")
        print("|---|---|---|---|---|---|---|---|---|")
        for pname, plan in all_plans.items():
            if names and pname not in names:
                continue
            start = time.process_time()
            err = defaultdict(dict)  # fit -> seed -> (mean, max)
            for seed in range(seeds):
                for fname, fx in fits(measure_plan(data, plan, frac, seed, accounting), data.domain, W).items():
                    err[fname][seed] = score(truth, fx)[1:]
            full = {f: v for f, v in err.items() if len(v) == seeds}
            cells = []
            for j in (0, 1):
                best = min(full, key=lambda f: np.mean([v[j] for v in full[f].values()]))
                v = np.array([full[best][s][j] for s in range(seeds)])
                cells += [best, f"{v.mean():.4f} ± {v.std(ddof=1) / math.sqrt(seeds):.4f}",
                          f"{np.median(v[:3]):.4f}"]
            oracle = [np.mean([min(full[f][s][j] for f in full) for s in range(seeds)]) for j in (0, 1)]
            print(f"| {pname} | " + " | ".join(cells) + f" | {oracle[0]:.4f} / {oracle[1]:.4f} | "
                  f"{time.process_time() - start:.0f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=30)
    parser.add_argument("--eps", type=float, nargs="*", default=[0.1, 0.5, 1.0])
    parser.add_argument("--plans", nargs="*", help="only these plans (names as printed)")
    parser.add_argument("--accounting", choices=["pure", "zcdp"], default="pure",
                        help="zcdp: Gaussian noise at rho = eps^2/2, split as the shares")
    args = parser.parse_args()
    reach(args.eps, args.seeds, args.plans, args.accounting)


if __name__ == "__main__":
    main()
