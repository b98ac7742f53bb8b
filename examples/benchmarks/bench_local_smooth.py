"""Evidence on the local smooth estimate (issue 27, session 9): least squares plus clique-wise entropy.

The estimate (local_smooth.py beside this script, module notes: problem (L1), Newton-CG in the
residuals, certified by ``W``-strong convexity) is a prototype; these cases are the evidence
that it is not wired into :func:`dpopt.estimate.marginal_space.estimate_marginals`.

Cases (``--case``):

* ``all`` — binary data from ``random_sparse_network(27, seed=NET, window=3)`` (n = 50,000),
  every triple measured as ``auto``'s wide plan measures in its "all" mode (one-way marginals,
  the probe, every triple: ``run_wide_selection(..., mode="all")``), zCDP ``rho = eps^2/2``; on
  the same measurements least squares (``objective="l2"``) and the local smooth estimate under
  ``--configs`` (JSON: keyword arguments of ``estimate_local_smooth``; ``"scale"`` multiplies the
  default ``c``). Mean L1/n over the 2,925 triples; with ``--orders`` also over every one-way
  marginal and pair, read off the estimates.
* ``chain`` — a decomposable family (attributes i, i+1, i+2 measured with equal shares,
  bench_wide.measure_sets), where the junction-tree smooth estimate runs (``exact_cells=0``):
  least squares, junction-tree smooth and local smooth, and the mean L1/n between local and
  junction-tree smooth. ``--data bn`` (networks 3, 4) or ``adult``.
* ``brute`` — a tiny cyclic case (three pairs over 3 x 3 x 2 values, Gaussian noise s.d. 3,
  one step): the prototype's point against scipy's trust-constr on the same objective written
  from a dense ``E`` and the measurements directly (``½ Σ_S ||y_S − μ_S||²/σ² + λ Σ_C KL``),
  and the certificate recomputed there (``--counting``: either objective).
* ``adult`` — adult_pgm, every triple of ``--attrs`` (default all 14: 364 triples, 20.9 M
  cells) measured with equal shares (zCDP, measurement seed 7), the local smooth estimate with
  ``--time-limit`` and its Newton log; error, CPU seconds, peak memory.

Run::

    OPENBLAS_NUM_THREADS=1 nice -n 10 python examples/benchmarks/bench_local_smooth.py --case all \\
        --net 3 4 --seeds 1 2 --eps 0.1 1 --orders \\
        --configs '[{}, {"steps": 1, "scale": 0.3}, {"scale": 0.1}]'
    OPENBLAS_NUM_THREADS=1 nice -n 10 python examples/benchmarks/bench_local_smooth.py --case chain --data bn
    DPOPT_SHARED_DATA=/work/shared/data OPENBLAS_NUM_THREADS=1 nice -n 10 \\
        python examples/benchmarks/bench_local_smooth.py --case adult --eps 1 --time-limit 3500 --attrs age \\
        education-num marital-status occupation race capital-loss hours-per-week 'income>50K' sex
    # session 10: the block preconditioner and a lambda path (certifies proximal step 1 at eps 0.1, not all 3)
    ... --case adult --eps 0.1 --counting conditional --preconditioner block --lam-path 1000 0.1 \
        --time-limit 2400 --attrs (as above)
    ... --case all --k 2 --accounting pure --eps 1 --configs '[{}, {"counting": "conditional"}]'
    # session 12: K = 1 (its own lambda, c = 1) and the primal-dual Newton step (certifies proximal
    # steps 1 and 2 at eps 0.1, not step 3; eps 1 step 1 not certified)
    ... --case adult --eps 0.1 --steps 1 --counting conditional --preconditioner block --lam-path 1000 0.1 \
        --path-adapt --time-limit 2400 --attrs (as above)
    ... --case adult --eps 0.1 --steps 3 --counting conditional --preconditioner block --lam-path 1000 0.1 \
        --newton primal-dual-all --log-floor 5 --time-limit 3000 --attrs (as above)
"""

from __future__ import annotations

import argparse
import json
import time
from fractions import Fraction
from itertools import combinations

import numpy as np
from _common import load_adult_pgm, network_workload, peak_memory_mb
from local_smooth import estimate_local_smooth

from dpopt.estimate.engines.smooth import default_smoothing
from dpopt.estimate.marginal_space import estimate_marginals


def l1(est, sets, truths, n) -> float:
    fit = est.marginals(sets)
    return float(np.mean([np.abs(np.asarray(fit[s], float) - truths[s]).sum() / n for s in sets]))


def local(ms, sets, config, **extra):
    options = dict(config)
    scale = options.pop("scale", None)
    if scale is not None:
        options["smoothing"] = scale * default_smoothing(options.get("steps", 3))
    return estimate_local_smooth(ms, sets, **options, **extra)


def case_all(args) -> None:
    from dpopt.privacy.budget import Budget
    from dpopt.privacy.randomness import make_random
    from dpopt.strategy.wide_selection import plan_wide_selection, run_wide_selection

    configs = json.loads(args.configs)
    for net in args.net:
        _, data, sets, _, truths, n = network_workload(27, args.k, net, 3)
        lower = {k: list(combinations(data.domain.attrs, k)) for k in (1, 2)} if args.orders else {}
        exact = {s: data.marginal(s).astype(float).ravel() for k in lower for s in lower[k]}
        for eps in args.eps:
            e = Fraction(eps).limit_denominator(10**6)
            budget = Budget.pure(e) if args.accounting == "pure" else Budget.zcdp(e * e / 2)
            for seed in args.seeds:
                plan = plan_wide_selection(data.domain, sets, budget, budget.noise(None))
                ms = run_wide_selection(plan, data, budget.accountant(), make_random(seed), mode="all").measurements
                runs = [("l2", lambda: estimate_marginals(ms, sets, objective="l2"))] + \
                    [(json.dumps(c), lambda c=c: local(ms, sets, c)) for c in configs]
                for name, run in runs:
                    cpu = time.process_time()
                    est = run()
                    seconds = time.process_time() - cpu
                    orders = "".join(f"  {k}-way {l1(est, lower[k], exact, n):.4f}" for k in lower)
                    gap = est.info["certificate"].get("gap")
                    print(f"net {net} eps {eps:>4} seed {seed}  {name:<28} {est.status.name:<15} {args.k}-sets "
                          f"{l1(est, sets, truths, n):.4f}{orders}  gap {gap if gap is None else f'{gap:.1e}'}"
                          f"  {seconds:.1f} CPU-s", flush=True)


def case_chain(args) -> None:
    from bench_wide import measure_sets

    if args.data == "bn":
        cases = [(f"network {net}", network_workload(27, 3, net, 3)[1]) for net in args.net]
    else:
        cases = [("adult", load_adult_pgm())]
    for name, data in cases:
        attrs = data.domain.attrs
        chain = [tuple(attrs[i:i + 3]) for i in range(len(attrs) - 2)]
        truths = {s: data.marginal(s).astype(float).ravel() for s in chain}
        n = float(data.total)
        for eps in args.eps:
            for seed in args.seeds:
                ms, _ = measure_sets(data, chain, "zcdp", eps, seed)
                out = {}
                for label, run in (("l2", lambda: estimate_marginals(ms, chain, objective="l2", exact_cells=0)),
                                   ("smooth", lambda: estimate_marginals(ms, chain, objective="smooth",
                                                                         exact_cells=0)),
                                   ("local", lambda: estimate_local_smooth(ms, chain))):
                    cpu = time.process_time()
                    est = run()
                    out[label] = (est, time.process_time() - cpu)
                smooth, loc = out["smooth"][0].marginals(chain), out["local"][0].marginals(chain)
                apart = np.mean([np.abs(loc[s] - smooth[s]).sum() / n for s in chain])
                print(f"{name} eps {eps} seed {seed}  " + "  ".join(
                    f"{label} {l1(est, chain, truths, n):.4f} ({est.status.name}, {sec:.1f} CPU-s)"
                    for label, (est, sec) in out.items()) + f"  local vs smooth {apart:.4f}", flush=True)


def case_adult(args) -> None:
    from bench_wide import measure_sets

    data = load_adult_pgm()
    attrs = [a for a in data.domain.attrs if not args.attrs or a in args.attrs]
    sets = list(combinations(attrs, 3))
    truths = {s: data.marginal(s).astype(float).ravel() for s in sets}
    n = float(data.total)
    for eps in args.eps:
        ms, _ = measure_sets(data, sets, "zcdp", eps, 7)
        cpu = time.process_time()
        est = estimate_local_smooth(ms, sets, steps=args.steps, time_limit=args.time_limit, max_newton=200,
                                    shrink_limit=args.shrink_limit, max_cg=args.max_cg, start_mix=args.start_mix,
                                    counting=args.counting, preconditioner=args.preconditioner,
                                    lam_path=args.lam_path, path_tol=args.path_tol, path_adapt=args.path_adapt,
                                    newton=args.newton, log_floor=args.log_floor, log=lambda m: print(f"  {time.process_time() - cpu:7.0f} CPU-s  {m}", flush=True))
        seconds = time.process_time() - cpu
        print(f"adult {len(attrs)} attributes, {len(sets)} triples, {est.info['clique_cells']:,} cells, zCDP eps "
              f"{eps}: {est.status.name}, error {l1(est, sets, truths, n):.4f}, {seconds:.0f} CPU-s, peak "
              f"{peak_memory_mb():,.0f} MB; {est.message}", flush=True)


def case_brute(args) -> None:
    from scipy.optimize import minimize

    from dpopt.estimate.marginal_space.layout import SetFamily
    from dpopt.model.domain import Domain
    from dpopt.model.measurement import Measurement
    from dpopt.model.queries.marginal import Marginal

    rng = np.random.default_rng(0)
    domain = Domain(("a", "b", "c"), (3, 3, 2))
    x = rng.poisson(5, size=domain.size).astype(float)
    x[:4] = 0
    ms = []
    for s in [("a", "b"), ("b", "c"), ("a", "c")]:
        q = Marginal(domain, s)
        ms.append(Measurement(q, q.matvec(x) + rng.normal(0, 3, q.num_rows), "gaussian", 3.0, 9.0, label=",".join(s)))
    est = estimate_local_smooth(ms, steps=1, prior="uniform", counting=args.counting,
                                preconditioner=args.preconditioner, lam_path=args.lam_path, newton=args.newton)
    index, family = est.index, est.family
    dense = np.stack([family.expand(v) for v in np.eye(index.size)], 1)
    measured = SetFamily(index, [tuple(sorted(domain.axes(m.query.attrs))) for m in ms])
    rows = np.stack([measured.expand(v) for v in np.eye(index.size)], 1)
    y = measured.pack([m.values for m in ms])
    lam, total = est.info["lambda"], est.info["held_total"]
    prior = total / family.per_set(family.cells.astype(np.float64))
    empty = index.set_offsets[index.position_of(())]
    free = np.arange(index.size) != empty
    # "conditional": each pair clique spreads one unit over its two attributes, -1/2 each (weight
    # -1 per attribute here, as each is in two of the three pairs); the one-way marginals are
    # summed from the dense pair rows, not read through the prototype's families
    one_way = SetFamily(index, [(0,), (1,), (2,)])
    singles = np.stack([one_way.expand(v) for v in np.eye(index.size)], 1)
    single_weight = np.full(singles.shape[0], -1.0 if args.counting == "conditional" else 0.0)
    single_prior = total / one_way.per_set(one_way.cells.astype(np.float64))

    def full(z):
        r = np.empty(index.size)
        r[free], r[empty] = z, total
        return r

    def objective(z):
        r = full(z)
        mu = dense @ r
        if mu.min() <= 0:
            return np.inf, np.zeros_like(z)
        res = rows @ r - y
        nu = singles @ r
        value = 0.5 * np.sum(res**2) / 9.0 + lam * np.sum(mu * np.log(mu / prior) - mu + prior) \
            + lam * np.sum(single_weight * (nu * np.log(nu / single_prior) - nu + single_prior))
        return value, (rows.T @ res / 9.0 + lam * dense.T @ np.log(mu / prior)
                       + lam * singles.T @ (single_weight * np.log(nu / single_prior)))[free]

    def hessian(z):
        mu, nu = dense @ full(z), singles @ full(z)
        return (rows.T @ rows / 9.0 + lam * dense.T @ (dense / mu[:, None])
                + lam * singles.T @ (single_weight[:, None] * singles / nu[:, None]))[np.ix_(free, free)]

    z0 = np.linalg.lstsq(dense[:, free], prior - dense[:, empty] * total, rcond=None)[0]
    ref = minimize(lambda z: objective(z)[0], z0, jac=lambda z: objective(z)[1], hess=hessian, method="trust-constr",
                   options={"gtol": 1e-12, "xtol": 1e-14, "maxiter": 5000})
    value, gradient = objective(est.residuals[free])
    weight = index.per_set(est.residual_weights)[free]
    apart = np.abs(dense @ full(ref.x) - est.clique_marginals).max()
    print(f"{est.status.name}: {est.message}\n  largest |mu - mu_ref| {apart:.2e}"
          f" (cells up to {est.clique_marginals.max():.1f}); f {value:.10g} vs reference {objective(ref.x)[0]:.10g}; "
          f"certificate recomputed: ½ g'W⁻¹g / (1 + f) = {0.5 * np.sum(gradient**2 / weight) / (1 + value):.1e}; "
          f"smallest cell {est.clique_marginals.min():.3g}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", required=True, choices=["all", "chain", "adult", "brute"])
    parser.add_argument("--net", type=int, nargs="+", default=[3, 4])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--eps", type=float, nargs="+", default=[0.1, 1.0])
    parser.add_argument("--configs", default="[{}]")
    parser.add_argument("--orders", action="store_true")
    parser.add_argument("--k", type=int, default=3, help="all: the order of the measured sets (2: every pair)")
    parser.add_argument("--accounting", default="zcdp", choices=["zcdp", "pure"],
                        help="all: pure eps, or zCDP rho = eps^2 / 2")
    parser.add_argument("--counting", default="cliques", choices=["cliques", "conditional"],
                        help="brute and adult: the counting numbers (local_smooth.py, Weights)")
    parser.add_argument("--data", default="bn", choices=["bn", "adult"])
    parser.add_argument("--attrs", nargs="*", default=None)
    parser.add_argument("--steps", type=int, default=3,
                        help="adult: proximal steps K (lambda = c / sigma_bar with smooth's c = 1 / (2^(1/K) - 1))")
    parser.add_argument("--time-limit", type=float, default=3500.0)
    parser.add_argument("--shrink-limit", type=float, default=0.99,
                        help="adult: a Newton step stops at this fraction of the distance to a zero cell")
    parser.add_argument("--start-mix", type=float, default=0.0,
                        help="adult: start from this mixture of the uniform table with the prior")
    parser.add_argument("--max-cg", type=int, default=200, help="adult: CG steps per Newton step")
    parser.add_argument("--preconditioner", default="jacobi", choices=["jacobi", "block"],
                        help="brute and adult: CG's preconditioner (local_smooth.py, CliqueBlockPreconditioner)")
    parser.add_argument("--lam-path", type=float, nargs=2, default=None, metavar=("START", "SHRINK"),
                        help="brute and adult: a lambda homotopy from lambda*START, times SHRINK per stage")
    parser.add_argument("--path-tol", type=float, default=1e-3, help="adult: relative gap of the path's stages")
    parser.add_argument("--path-adapt", action="store_true",
                        help="adult: shorten the next lambda stage after a slow one (local_smooth.solve_local_smooth)")
    parser.add_argument("--newton", default="primal", choices=["primal", "primal-dual", "primal-dual-all"],
                        help="brute and adult: Newton on r, or with the clique cells as variables (local_smooth._newton_pd)")
    parser.add_argument("--log-floor", type=float, default=30.0,
                        help="adult: primal-dual, the largest fall of a cell's log per Newton step")
    args = parser.parse_args()
    {"all": case_all, "chain": case_chain, "adult": case_adult, "brute": case_brute}[args.case](args)


if __name__ == "__main__":
    main()
