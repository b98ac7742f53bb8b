"""Matrix mechanism benchmark (issue 15): strategies, the SVD bound, scale.

1. ranges: random range workloads over Adult capital-loss (4,357 values) and age x hours
   (91 x 25), Q in {250, 1000, 2000, 8000}: seconds for the SVD bound and for the optimised
   strategy (HDMM's p-Identity / Kronecker templates), and each strategy's expected RMSE per
   query at epsilon = 0.1 (pure DP, discrete Laplace) next to the bound. No data is read: the
   numbers are the plan's. Targets: optimisation <= 10 s, bound <= 5 s.
2. scale: all 2-way and all 3-way marginals over the 14 attributes of Adult (adult_pgm domain,
   about 6.4e17 cells, never built): seconds for the bound and the optimised marginal strategy,
   and the expected errors of identity / workload / optimised / hierarchical (Kronecker) under
   Laplace (epsilon = 1) and Gaussian (rho = 1/2) noise.
3. nltcs: all 560 3-way marginals over nltcs (2^16 cells), end to end through the registered
   algorithm: plan, measure (epsilon = 1), then A⁺y or non-negative least squares, for the best
   strategy, the optimised marginal strategy and the identity; the realised total squared
   error over ``--runs`` seeds next to the expected error and the SVD bound.
4. simulation: the expected-error formula against the mean of ``--runs`` independent
   measurements of the optimised capital-loss strategy (2,000 ranges, epsilon = 0.1) with the
   exact discrete Laplace sampler (target: within 5%).

Seeded sources (a benchmark, not a release). Timings: set OPENBLAS_NUM_THREADS=1 and report the
machine's load beside them.

Run:  OPENBLAS_NUM_THREADS=1 python examples/benchmarks/bench_matrix_mechanism.py ranges scale nltcs simulation
"""

from __future__ import annotations

import argparse
import json
import os
import time
from fractions import Fraction
from itertools import combinations

import numpy as np

from _common import load_binary, peak_memory_mb, shared_file
from dpopt.algorithms.matrix_mechanism import MatrixMechanism, WorkloadSpec
from dpopt.model.constraints import ConstraintSet, NonNegativity
from dpopt.model.domain import Domain
from dpopt.model.queries import HaarWavelet, Hierarchical, Identity, Kronecker, Marginal, Stack, random_ranges
from dpopt.privacy.accountant import PrivacyCost
from dpopt.privacy.budget import Budget
from dpopt.privacy.mechanisms import calibrate
from dpopt.privacy.randomness import make_random
from dpopt.privacy.samplers import discrete_laplace
from dpopt.strategy import gram_of, trace_term
from dpopt.strategy.bound import svd_bound
from dpopt.strategy.inference import least_squares
from dpopt.strategy.optimize import optimize_kronecker, optimize_marginals, optimize_pidentity

COUNTS = (250, 1000, 2000, 8000)
DOMAINS = {"capital-loss": Domain(("capital-loss",), (4357,)), "age-hours": Domain(("age", "hours"), (91, 25))}


def machine_load() -> str:
    return f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"


def _per_attr(dom, make):
    return make(dom, dom.attrs[0]) if len(dom) == 1 else Kronecker([make(dom.project([a]), a) for a in dom.attrs], dom)


def ranges(args) -> None:
    eps = Fraction(1, 10)
    cost = PrivacyCost.pure(eps)
    print(f"\nranges: random ranges, epsilon = {eps} (Laplace); expected RMSE per query; {machine_load()}")
    for name, dom in DOMAINS.items():
        named = {"identity": Identity(dom),
                 "hierarchical": _per_attr(dom, lambda d, a: Hierarchical(d, a, 2)),
                 "wavelet": _per_attr(dom, HaarWavelet)}
        grams = {k: gram_of(q) for k, q in named.items()}   # each strategy inverted once
        laws = {k: calibrate(q, cost) for k, q in named.items()}
        print(f"\n  {name} ({dom.size} cells)")
        print(f"  {'Q':>6} {'bound s':>8} {'optim s':>8} {'SVD bound':>10} {'optimised':>10} "
              + "".join(f"{k:>13}" for k in named) + "   template")
        for count in COUNTS:
            W = random_ranges(dom, dom.attrs, count, np.random.default_rng(count))
            G = gram_of(W)
            t0 = time.perf_counter()
            unit = svd_bound(G)
            t_bound = time.perf_counter() - t0
            t0 = time.perf_counter()
            if len(dom) == 1:
                fit = optimize_pidentity(G, norm="l1")
            else:
                fit = min([optimize_kronecker(G, "l1"), optimize_pidentity(G, norm="l1")], key=lambda f: f.loss)
            t_opt = time.perf_counter() - t0
            variance = calibrate(fit.query, cost).variance
            rmse = {k: np.sqrt(laws[k].variance * trace_term(G, grams[k]) / count) for k in named}
            print(f"  {count:>6} {t_bound:>8.2f} {t_opt:>8.2f} {np.sqrt(2 / float(eps) ** 2 * unit / count):>10.4g} "
                  f"{np.sqrt(variance * trace_term(G, fit.query) / count):>10.4g} "
                  + "".join(f"{rmse[k]:>13.4g}" for k in named) + f"   {fit.template} ({fit.iterations} it.)",
                  flush=True)


def scale(args) -> None:
    dom = Domain.from_dict(json.loads(shared_file("adult_pgm_domain.json").read_text()))
    print(f"\nscale: Adult, {len(dom)} attributes, {float(dom.size):.3g} cells (never built); {machine_load()}")
    for ks in ((2,), (3,), (2, 3)):
        sets = [s for k in ks for s in combinations(dom.attrs, k)]
        t0 = time.perf_counter()
        W = Stack([Marginal(dom, s) for s in sets])
        G = gram_of(W)
        unit = svd_bound(G)
        t_bound = time.perf_counter() - t0
        print(f"\n  all {'/'.join(map(str, ks))}-way marginals: {len(sets)} marginals, {W.num_rows} queries; "
              f"bound in {t_bound:.2f} s")
        for label, budget, norm in (("Laplace eps = 1", Budget.pure(1), "l1"),
                                    ("Gaussian rho = 1/2", Budget.zcdp(Fraction(1, 2)), "l2")):
            cost = budget.total
            t0 = time.perf_counter()
            fit = optimize_marginals(G, norm)
            t_opt = time.perf_counter() - t0
            t0 = time.perf_counter()
            hier = Kronecker([Hierarchical(dom.project([a]), a, 2) for a in dom.attrs], dom)
            rows = {"identity": Identity(dom), "workload": W, "hierarchical (Kronecker)": hier,
                    "optimised marginals": fit.query}
            law_unit = calibrate(Identity(dom), cost)
            constant = 2 * law_unit.scale**2 if norm == "l1" else law_unit.scale**2
            print(f"    {label}: optimisation {t_opt:.2f} s ({fit.iterations} it.); "
                  f"SVD bound {constant * unit:.4g} total, {np.sqrt(constant * unit / W.num_rows):.4g} RMSE/query")
            for k, q in rows.items():
                law = calibrate(q, cost)
                tr = float(G.rank()) if k == "workload" else trace_term(G, q)
                err = law.variance * tr
                print(f"      {k:<26} expected {err:>12.5g} total  {np.sqrt(err / W.num_rows):>9.4g} RMSE/query"
                      f"  x{err / (constant * unit):>8.3g} the bound")
            print(f"      (expected errors of the four strategies in {time.perf_counter() - t0:.2f} s)")


def nltcs(args) -> None:
    data = load_binary("nltcs")
    dom = data.domain
    budget = Budget.pure(1)
    print(f"\nnltcs: {len(dom)} binary attributes, {data.total} records, all 3-way marginals, epsilon = 1; "
          f"{machine_load()}")
    spec = WorkloadSpec("all_marginals", k=(3,))
    free, nonneg = ConstraintSet(dom), ConstraintSet(dom).add(NonNegativity())
    for strategy, label, constraints in (("best", "best strategy, A⁺y", free),
                                         ("optimized", "optimised marginals, A⁺y", free),
                                         ("optimized", "optimised marginals, non-negative least squares", nonneg),
                                         ("identity", "identity, non-negative least squares", nonneg)):
        alg = MatrixMechanism(workload=spec, strategy=strategy,
                              candidates=("identity", "workload", "fourier", "optimized"))
        t0 = time.perf_counter()
        plan = alg.plan(dom, constraints, budget)
        t_plan = time.perf_counter() - t0
        W = plan.details.workload
        truth = W.answer(data)
        errs, secs = [], []
        for seed in range(args.runs):
            t0 = time.perf_counter()
            rel = alg.run(plan, data, budget.accountant(), make_random(seed))
            secs.append(time.perf_counter() - t0)
            if not rel.success:
                print(f"    seed {seed}: {rel.status.name}: {rel.message}")
                continue
            errs.append(float(((W.matvec(np.asarray(rel.counts, dtype=float)) - truth) ** 2).sum()))
        d = plan.details
        print(f"\n  {label}: plan {t_plan:.2f} s (strategy {d.chosen}, {d.strategy.num_rows} rows); "
              f"run {np.mean(secs):.2f} s per seed; solver {rel.reconstruction.solver}")
        if strategy == "best":
            print("\n".join("    " + line for line in plan.lines[1:-1]))
        errs = np.array(errs)
        print(f"    realised total squared error over {errs.size} seeds: {errs.mean():.5g} ± "
              f"{errs.std(ddof=1) / np.sqrt(errs.size):.2g}; expected for A⁺y {d.expected_error:.5g}; "
              f"SVD bound {d.bound:.5g} (x{errs.mean() / d.bound:.3g}); RMSE per query "
              f"{np.sqrt(errs.mean() / W.num_rows):.4g}")


def simulation(args) -> None:
    dom = DOMAINS["capital-loss"]
    W = random_ranges(dom, dom.attrs, 2000, np.random.default_rng(2000))
    G = gram_of(W)
    fit = optimize_pidentity(G, norm="l1")
    law = calibrate(fit.query, PrivacyCost.pure(Fraction(1, 10)))
    expected = law.variance * trace_term(G, fit.query)
    rng = make_random(1)
    errors = []
    t0 = time.perf_counter()
    for _ in range(args.runs):
        z = discrete_laplace(law.parameter, fit.query.num_rows, rng) * float(law.grid)
        x = least_squares(fit.query, z).x        # the estimate's error is A⁺z (linear in the noise)
        errors.append(float((W.matvec(x) ** 2).sum()))
    errors = np.array(errors)
    se = errors.std(ddof=1) / np.sqrt(errors.size)
    print(f"\nsimulation: capital-loss, 2,000 ranges, optimised p-Identity, epsilon = 1/10, {errors.size} draws "
          f"({time.perf_counter() - t0:.1f} s)")
    print(f"  expected total squared error {expected:.6g}; simulated {errors.mean():.6g} ± {se:.3g}; "
          f"ratio {errors.mean() / expected:.4f} (z = {(errors.mean() - expected) / se:+.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("parts", nargs="+", choices=("ranges", "scale", "nltcs", "simulation"))
    parser.add_argument("--runs", type=int, default=20, help="seeds for nltcs / draws for simulation (default 20)")
    args = parser.parse_args()
    start = time.perf_counter()
    for part in args.parts:
        {"ranges": ranges, "scale": scale, "nltcs": nltcs, "simulation": simulation}[part](args)
    print(f"\ntotal {time.perf_counter() - start:.1f} s, peak memory {peak_memory_mb():.0f} MB")


if __name__ == "__main__":
    main()
