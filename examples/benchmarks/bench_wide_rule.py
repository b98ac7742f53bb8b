"""Validation of wide selection's budget rule (issue 27) on networks other than bench_wide.py's.

``auto``'s wide plan (:mod:`dpopt.strategy.wide_selection`) under a grid of settings — the
second one-way measurement (``top``: a share of the budget, or the rule), the number of rounds
(``T``: a multiple of ``d``; giving it turns off the doubled rounds of pairs, module notes *Rounds
for pairs*), the exponential mechanism's share of a round (``sel``) and AIM's
annealing (``anneal``) — on binary data from ``random_sparse_network(d, seed=NET, window=W)``
(records seed ``NET + 100``, n = 50,000), over several measurement seeds. bench_wide.py's
figures use network seed 1 and measurement seed 7: the rule was validated here on other seeds.

Error: mean over the workload of ``||estimate - data marginal||_1 / n``. Seeded (a benchmark,
not a release). ``--objective`` is the estimate's (default ``auto``, the release's rule: smooth on a
small junction tree); the figures in :mod:`dpopt.strategy.wide_selection`'s notes were taken with
least squares, before that rule existed: ``--objective l2`` reproduces them.

``--groups`` merges consecutive binary attributes into attributes of ``2^g`` values (as
bench_wide_smooth.py: every k-set is the workload, ``--eval`` drawn sets scored); ``--verbose``
prints per seed the budget split, the probe, ``steer`` (the one-way model's expected noise over the
probe's deviation), the top-up and the chosen sets with their cells and exact deviation from
independence; a config ``{"fixed": "chain" | "one-way" | "chain+1"}`` measures that fixed plan with
equal shares instead, and ``{"mode": "select"}`` forces selection (the default before the one-way
fallback, module notes step 3). ``{"fraction": 1}`` decides between "all" and selection by AIM's
criterion alone (``E_all <= D^``), the rule before the fit each mode gets was taken into account
(``wide_selection.ALL_L2_NOISE_FRACTION``: 1/2 when "all" would be fitted by least squares);
``--decisions`` prints each seed's decision (``D^``, ``E_all``, the fraction, the mode) and fits nothing.

Run (one case per line; ``configs`` is a JSON list of settings, ``{}`` for the defaults)::

    OPENBLAS_NUM_THREADS=1 nice -n 10 python examples/benchmarks/bench_wide_rule.py --d 100 --k 2 --net 4 \\
        --seeds 1 2 3 4 5 --configs '[{}, {"top": 0}, {"top": "1/5"}]'
    OPENBLAS_NUM_THREADS=1 nice -n 10 python examples/benchmarks/bench_wide_rule.py --d 27 --k 3 --net 3 \\
        --seeds 1 2 --configs '[{"top": 0, "T": 0.5}, {"top": 0, "T": 2.0}, {"anneal": true}]'
    OPENBLAS_NUM_THREADS=1 nice -n 10 python examples/benchmarks/bench_wide_rule.py --d 27 --k 3 --net 3 \\
        --seeds 1 2 --accounting zcdp --eps 0.1 --configs '[{}, {"fraction": 1}]'   # the all-or-select rule
    OPENBLAS_NUM_THREADS=1 nice -n 10 python examples/benchmarks/bench_wide_rule.py --d 45 --k 3 \
        --groups 1,7,3,1,7,4,1,2,6,1,7,3,1,1 --net 3 --seeds 1 2 --eps 0.1 --verbose \
        --configs '[{}, {"mode": "select"}, {"fixed": "chain"}, {"fixed": "one-way"}]'
"""

from __future__ import annotations

import argparse
import json
import time
from fractions import Fraction

import numpy as np


def main() -> None:
    from _common import network_workload
    from dpopt.estimate.marginal_space import estimate_marginals
    from dpopt.privacy.budget import Budget
    from dpopt.privacy.randomness import make_random
    from dpopt.strategy.wide_selection import measures_all, plan_wide_selection, run_wide_selection

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--d", type=int, default=100)
    parser.add_argument("--k", type=int, default=2, choices=[2, 3])
    parser.add_argument("--net", type=int, default=4, help="network seed (bench_wide.py uses 1)")
    parser.add_argument("--window", type=int, default=3)
    parser.add_argument("--accounting", default="pure", choices=["pure", "zcdp"])
    parser.add_argument("--eps", type=float, default=1.0, help="pure epsilon, or rho = eps^2 / 2 under zCDP")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--configs", default="[{}]")
    parser.add_argument("--objective", default="auto", choices=["auto", "l2", "smooth"],
                        help="the estimate's objective (l2 reproduces the rule's session-4 figures)")
    parser.add_argument("--groups", default="", help="merge consecutive binary attributes into 2^g values "
                        "(bench_wide_smooth.py's --groups; every k-set is the workload, --eval of them scored)")
    parser.add_argument("--eval", type=int, default=60, help="with --groups: workload sets scored")
    parser.add_argument("--decisions", action="store_true", help="per seed: the probe's D^, E_all, the share "
                        "of D^ that E_all may reach and the mode chosen; no fit")
    parser.add_argument("--dump", default="", help="append each run's per-marginal errors to this file (JSON "
                        "lines), for paired comparisons of two code versions on the same draws")
    parser.add_argument("--verbose", action="store_true", help="per seed: the budget split, the probe, phi, "
                        "the chosen sets (cells) and their exact deviation from independence")
    args = parser.parse_args()
    net, data, workload, combos, truths, n = network_workload(args.d, args.k, args.net, args.window)
    sets = workload
    if args.groups:
        from bench_wide_smooth import merged

        data, workload, sets, truths = merged(data, [int(g) for g in args.groups.split(",")], args.k, args.eval)
    eps = Fraction(args.eps).limit_denominator(10**6)
    budget = Budget.pure(eps) if args.accounting == "pure" else Budget.zcdp(eps * eps / 2)
    one = {a: data.marginal([a]).astype(float).ravel() / n for a in data.domain.attrs}

    def independence(s):
        p = np.ones(1)
        for a in s:
            p = np.multiply.outer(p, one[a]).ravel()
        return p * n

    independent = [np.abs(independence(s) - truths[s]).sum() / n for s in sets]
    print(f"d = {len(data.domain)} ({'binary' if not args.groups else 'sizes ' + str(data.domain.sizes)}), "
          f"all {args.k}-way ({len(workload)}, {len(sets)} scored), network seed {args.net}, window {args.window}, "
          f"{args.accounting} eps = {args.eps}: independence (exact one-way) {np.mean(independent):.4f}", flush=True)
    for cfg in json.loads(args.configs):
        if "fixed" in cfg:  # a fixed plan, no selection: equal shares (bench_wide.measure_sets)
            fixed_plan(cfg, data, workload, sets, truths, n, args, budget)
            continue
        options = {}
        if "top" in cfg:
            options["top_up"] = Fraction(cfg["top"])
        if "T" in cfg:
            options["rounds"] = max(1, int(round(float(cfg["T"]) * args.d)))
        if "sel" in cfg:
            options["select_share"] = Fraction(cfg["sel"])
        if "anneal" in cfg:
            options["anneal"] = bool(cfg["anneal"])
        if "fraction" in cfg:
            options["all_fraction"] = Fraction(cfg["fraction"])
        errs, rounds, cpu = [], [], time.process_time()
        for seed in args.seeds:
            plan = plan_wide_selection(data.domain, workload, budget, budget.noise(None), **options)
            if args.decisions:  # the decision only: the draws up to it are those of any mode
                probe = run_wide_selection(plan, data, budget.accountant(), make_random(seed), mode="all")
                allowed = plan.all_fit is None or plan.all_fit.fits
                mode = "all" if allowed and measures_all(plan.expected_noise_all, probe.deviation, plan.all_fraction) \
                    else "not all"
                print(f"  {json.dumps(cfg):<40} seed {seed}: D^/n {probe.deviation / n:.5f}  E_all/n "
                      f"{plan.expected_noise_all / n:.5f}  ratio {plan.expected_noise_all / probe.deviation:.3f}  "
                      f"fraction {plan.all_fraction} (fit of all: {plan.all_fit.objective})  -> {mode}", flush=True)
                continue
            chosen = run_wide_selection(plan, data, budget.accountant(), make_random(seed), mode=cfg.get("mode", "auto"))
            fit = estimate_marginals(chosen.measurements, sets, objective=args.objective).marginals(sets)
            per_set = [float(np.abs(np.asarray(fit[s], float) - truths[s]).sum() / n) for s in sets]
            errs.append(float(np.mean(per_set)))
            rounds.append(len(chosen.chosen))
            if args.dump:
                with open(args.dump, "a") as f:
                    f.write(json.dumps({"net": args.net, "accounting": args.accounting, "eps": args.eps, "seed": seed,
                                        "config": cfg, "mode": chosen.mode, "errors": {"auto": per_set}}) + "\n")
            if args.verbose:
                describe(plan, chosen, data, n, independence, errs[-1])
        if args.decisions:
            continue
        print(f"  {json.dumps(cfg):<40} {chosen.mode:<6} rounds {np.mean(rounds):5.1f}  error {np.mean(errs):.4f} "
              f"({' '.join(f'{e:.4f}' for e in errs)})  {time.process_time() - cpu:.1f} CPU-s", flush=True)


def describe(plan, chosen, data, n, independence, error) -> None:
    """The run's evidence (--verbose): shares, probe, phi, top-up; each chosen set with its cells
    and its exact deviation from independence (L1/n), against the largest such deviation among the
    candidates of at most the median chosen size (what an oracle ranking would have picked from)."""
    whole = float(plan.one_way.epsilon + plan.probe.epsilon + plan.rest.epsilon) if plan.accounting != "zcdp" \
        else float(plan.one_way.rho + plan.probe.rho + plan.rest.rho)
    amount = (lambda c: float(c.rho if plan.accounting == "zcdp" else c.epsilon) / whole)  # noqa: E731
    dev = {c: float(np.abs(data.marginal(list(c)).astype(float).ravel() - independence(c)).sum() / n)
           for c in plan.candidates}
    cells = {c: data.domain.project(list(c)).size for c in plan.candidates}
    ranked = sorted(dev.values(), reverse=True)
    picked = [dev[tuple(c)] for c in chosen.chosen]
    steer = chosen.steer if chosen.steer is None else round(chosen.steer, 3)
    print(f"    mode {chosen.mode} (steer {steer}): one-way {amount(plan.one_way):.3f}, "
          f"probe {amount(plan.probe):.3f}, "
          f"top-up "
          f"{float(chosen.top_up):.3f} (phi {chosen.phi if chosen.phi is None else round(chosen.phi, 3)}), rounds "
          f"{len(chosen.chosen)}; probe D^/n {chosen.deviation / n:.3f}, E_all/n {chosen.expected_noise_all / n:.3g}; "
          f"error {error:.4f}", flush=True)
    if picked:
        print(f"    chosen: mean exact deviation {np.mean(picked):.3f} (top-{len(picked)} of all candidates "
              f"{np.mean(ranked[:len(picked)]):.3f}, mean candidate {np.mean(ranked):.3f}); cells median "
              f"{int(np.median([cells[tuple(c)] for c in chosen.chosen]))} "
              f"(candidates {int(np.median(list(cells.values())))})"
              f"; sets " + " ".join(f"{'.'.join(c)}[{cells[tuple(c)]}:{dev[tuple(c)]:.2f}]" for c in chosen.chosen),
              flush=True)


def fixed_plan(cfg, data, workload, sets, truths, n, args, budget) -> None:
    """A fixed plan measured with equal shares of the whole budget (no selection): ``"one-way"`` (the
    one-way marginals only), ``"chain"`` (sets i..i+k-1, and nothing else, as bench_wide.py's
    adult-chain), ``"chain+1"`` (the chain and the one-way marginals)."""
    from bench_wide import measure_sets
    from dpopt.estimate.marginal_space import estimate_marginals

    attrs, k = data.domain.attrs, args.k
    chain = [tuple(attrs[i:i + k]) for i in range(len(attrs) - k + 1)]
    ones = [(a,) for a in attrs]
    measured = {"one-way": ones, "chain": chain, "chain+1": chain + ones}[cfg["fixed"]]
    errs, cpu = [], time.process_time()
    for seed in args.seeds:
        ms, _ = measure_sets(data, measured, args.accounting, args.eps, seed)
        fit = estimate_marginals(ms, sets, objective=args.objective).marginals(sets)
        errs.append(float(np.mean([np.abs(np.asarray(fit[s], float) - truths[s]).sum() / n for s in sets])))
    print(f"  {json.dumps(cfg):<40} fixed  sets   {len(measured):5d}  error {np.mean(errs):.4f} "
          f"({' '.join(f'{e:.4f}' for e in errs)})  {time.process_time() - cpu:.1f} CPU-s", flush=True)


if __name__ == "__main__":
    main()
