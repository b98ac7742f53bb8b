"""The per-attribute prior rules of the pure-ε fallback's fit, on the same measurements (issue 27).

Where ``auto``'s wide plan (:mod:`dpopt.strategy.wide_selection`) takes the one-way fallback,
only one-way marginals are measured, and the smooth marginal-space estimate is a product of one
factor per attribute, each that attribute's own ``K`` proximal steps from its prior factor
(:mod:`dpopt.estimate.marginal_space.graphical.prior_risk`). So every per-attribute choice of
prior is scored exactly from two fits of the same draw, one with every factor uniform and one with
every factor the projected one-way: an attribute's estimate is its column of the fit its rule
picks, and a workload marginal is the product of its attributes' estimates. Rules compared:

* ``rule 8`` — equation (8) of :mod:`~dpopt.estimate.marginal_space.graphical.smooth` alone (the
  default before session 10);
* ``default`` — the estimator's default prior (rules (8) and (9)); checked equal to the product of
  the columns its ``info["prior_weights"]`` names;
* ``one-way`` — every attribute's one-way factor;
* ``oracle`` — per attribute, the fit nearer the true one-way in L1 (reads the data: a bound, not
  a rule).

Each row: case, network, seed, mean L1/n over the workload per rule, and the number of one-way
factors. The summary pairs every rule with ``rule 8`` per seed (networks averaged within a seed:
a seed is one noise stream shared by the networks, so seeds, not rows, are the independent
draws) and gives the mean difference and its standard error over seeds. Seeded (a benchmark,
not a release).

Run (the session-10 validation, marginal-space.md)::

    DPOPT_SHARED_DATA=../shared/data OPENBLAS_NUM_THREADS=1 nice -n 10 python \\
        examples/benchmarks/bench_fallback_prior.py --adult --seeds 7 1 2 0 3 4 5 6
    OPENBLAS_NUM_THREADS=1 nice -n 10 python examples/benchmarks/bench_fallback_prior.py \\
        --d 100 --k 2 --net 3 4 5 --seeds 1 2 3 4 5 6 7 8
    OPENBLAS_NUM_THREADS=1 nice -n 10 python examples/benchmarks/bench_fallback_prior.py \\
        --d 45 --k 3 --groups 1,7,3,1,7,4,1,2,6,1,7,3,1,1 --net 3 4 5 --seeds 1 2 3 4 5 6 7 8
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import load_adult_pgm, network_workload  # noqa: E402

from dpopt.estimate.marginal_space import estimate_marginals  # noqa: E402
from dpopt.estimate.marginal_space.estimator import marginal_sets  # noqa: E402
from dpopt.estimate.marginal_space.graphical import smooth  # noqa: E402
from dpopt.estimate.marginal_space.layout import measured_and_workload_axes  # noqa: E402
from dpopt.privacy.budget import Budget  # noqa: E402
from dpopt.privacy.randomness import make_random  # noqa: E402
from dpopt.strategy.wide_selection import plan_wide_selection, run_wide_selection  # noqa: E402

RULES = ("rule 8", "default", "one-way", "oracle")


def product_errors(one_ways, sets, truths, n) -> np.ndarray:
    """L1/n of each workload marginal estimated as the product of its attributes' one-ways."""
    total = float(np.mean([q.sum() for q in one_ways]))
    out = []
    for s, truth in zip(sets, truths):
        est = np.ones(())
        for a in s:
            est = np.multiply.outer(est, one_ways[a] / one_ways[a].sum())
        out.append(np.abs(total * est.ravel() - truth).sum() / n)
    return np.array(out)


def rule_8(measurements, domain, total, lam, steps) -> list[bool]:
    """Equation (8) alone: the one-way where some cell of ``m_a`` is below ``λ s_a² (2^{1/K} − 1)``."""
    axes, _ = measured_and_workload_axes(domain, marginal_sets(measurements), None, "bench_fallback_prior")
    values = [np.asarray(m.values, dtype=np.float64) for m in measurements]
    variances = [float(m.variance) for m in measurements]
    sizes = list(domain.sizes)
    out = []
    for a, n in enumerate(sizes):
        mean, weight = smooth._one_way_average(a, n, axes, values, variances, sizes)
        if weight == 0 or n == 1:
            out.append(False)
            continue
        m, _ = smooth._project_one_way(mean, weight, total, all(len(s) <= 1 for s in axes))
        out.append(smooth._unresolved(m, weight, lam, steps))
    return out


def score(measurements, domain, sets, truths, n, true_one_ways) -> dict:
    """Every rule's mean L1/n on one draw (module notes)."""
    ones = [(a,) for a in domain.attrs]
    fits, info = {}, {}
    for prior in ("uniform", "one-way", "per-attribute"):
        est = estimate_marginals(measurements, ones, objective="smooth", smooth={"prior": prior})
        if not est.success:
            raise RuntimeError(f"the smooth fit with prior {prior!r} did not certify: {est.message}")
        got = est.marginals(ones)
        fits[prior] = [np.asarray(got[o], dtype=np.float64).ravel() for o in ones]
        info[prior] = est.info
    pick = {
        "rule 8": rule_8(measurements, domain, info["uniform"]["prior_total"], info["uniform"]["lambda"],
                         info["uniform"]["steps"]),
        "default": [w == 1.0 for w in info["per-attribute"]["prior_weights"]],
        "one-way": [len(q) > 1 for q in fits["one-way"]],
        "oracle": [np.abs(o - t).sum() < np.abs(u - t).sum()
                   for o, u, t in zip(fits["one-way"], fits["uniform"], true_one_ways)],
    }
    index = {a: i for i, a in enumerate(domain.attrs)}
    positions = [tuple(index[a] for a in s) for s in sets]
    errors = {}
    for rule, choice in pick.items():
        one_ways = [o if c else u for o, u, c in zip(fits["one-way"], fits["uniform"], choice)]
        errors[rule] = product_errors(one_ways, positions, truths, n)
    # the default's own fit is the product its prior weights name (the claim the scoring rests on)
    default = product_errors(fits["per-attribute"], positions, truths, n)
    if not np.allclose(default, errors["default"], rtol=1e-6, atol=1e-9):
        raise RuntimeError("the default fit is not the product of the columns its prior weights name")
    return {rule: (float(e.mean()), int(sum(pick[rule]))) for rule, e in errors.items()}


def cases(args):
    """(label, data, workload) per network (one for adult)."""
    if args.adult:
        data = load_adult_pgm()
        yield "adult", data, list(itertools.combinations(data.domain.attrs, 3))
        return
    for net in args.net:
        _, data, sets, _, _, _ = network_workload(args.d, args.k, net, 3)
        if args.groups:
            from bench_wide_smooth import merged

            data, sets, _, _ = merged(data, [int(g) for g in args.groups.split(",")], args.k, 60)
        yield net, data, sets


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--adult", action="store_true", help="adult_pgm, every triple (needs DPOPT_SHARED_DATA)")
    parser.add_argument("--d", type=int, help="generated network: attributes")
    parser.add_argument("--k", type=int, help="generated network: workload set size")
    parser.add_argument("--groups", default="", help="merge consecutive binary attributes (bench_wide_smooth.py)")
    parser.add_argument("--net", type=int, nargs="+", default=[3, 4, 5], help="network seeds")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2], help="measurement seeds")
    parser.add_argument("--eps", type=float, default=0.1, help="pure ε (the fallback fires at small ε)")
    args = parser.parse_args(argv)
    if not args.adult and (args.d is None or args.k is None):
        parser.error("give --adult, or --d and --k")
    budget = Budget.pure(Fraction(args.eps).limit_denominator(10**6))
    per_seed = {}
    for label, data, sets in cases(args):
        truths = [data.marginal(list(s)).astype(np.float64).ravel() for s in sets]
        true_one_ways = [data.marginal([a]).astype(np.float64).ravel() for a in data.domain.attrs]
        n = float(data.total)
        plan = plan_wide_selection(data.domain, sets, budget, budget.noise(None))
        for seed in args.seeds:
            chosen = run_wide_selection(plan, data, budget.accountant(), make_random(seed))
            row = {"case": label, "seed": seed, "mode": chosen.mode}
            if chosen.mode == "one-way":
                scored = score(chosen.measurements, data.domain, sets, truths, n, true_one_ways)
                row.update({rule: round(err, 5) for rule, (err, _) in scored.items()})
                row["one-way factors"] = {rule: k for rule, (_, k) in scored.items()}
                per_seed.setdefault(seed, []).append({rule: err for rule, (err, _) in scored.items()})
            print(json.dumps(row), flush=True)
    if not per_seed:
        print("the fallback did not fire: no rule applies")
        return
    seeds = sorted(per_seed)
    print(f"\nmean L1/n, and the difference from rule 8 (per seed, networks averaged; s.e. over {len(seeds)} seeds)")
    for rule in RULES:
        errs = [np.mean([r[rule] for r in per_seed[s]]) for s in seeds]
        diffs = np.array([np.mean([r[rule] - r["rule 8"] for r in per_seed[s]]) for s in seeds])
        se = diffs.std(ddof=1) / math.sqrt(len(diffs)) if len(diffs) > 1 else float("nan")
        print(f"  {rule:8s} {np.mean(errs):.5f}   {diffs.mean():+.5f} (s.e. {se:.5f}; lower on {int((diffs < 0).sum())} "
              f"of {len(diffs)} seeds)")


if __name__ == "__main__":
    main()
