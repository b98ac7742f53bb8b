"""The projection's ADMM path (dpopt.estimate.marginal_space.polytope.admm) on adult slices (issue 27).

    OPENBLAS_NUM_THREADS=1 nice -n 10 python examples/benchmarks/bench_admm_module.py --eps 1 --products 6000

Prints every certified check (step, products, gap, violation, F, g, CPU-s; with ``--estimate`` also
the wall-clock seconds, which threads make fewer: ``DPOPT_THREADS``) and the peak memory.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_alm_overhead import add_problem_arguments, adult_data, capture_problem, measured_triples
from bench_wide import errors


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _figure(value) -> str:
    """A certificate's number as the release prints it, or n/a (a table solved densely has none)."""
    return "n/a" if value is None else f"{value:.4g}"


def estimate_end_to_end(args) -> None:
    """``estimate_marginals`` on every triple of ``args.attrs``, as a release would call it."""
    from dpopt.estimate.marginal_space import estimate_marginals
    from dpopt.estimate.marginal_space.polytope import projection
    from dpopt.estimate.progress import SOLVER_PROGRESS

    if args.newton_cells is not None:  # where the path of projected-Newton rounds, then ADMM, starts
        projection.NEWTON_CELLS = args.newton_cells
    data = adult_data(tuple(args.attrs))  # read once: measured here, and the truth for the errors below
    measurements, sets = measured_triples(tuple(args.attrs), args.eps, args.accounting, args.seed, data=data)
    start, wall = cpu(), time.perf_counter()
    # every certified point, as the release's progress bar gets it (not the work lines between them)
    SOLVER_PROGRESS.set(lambda line: " after " in line and print(
        f"{line}, {cpu() - start:.1f} CPU-s, {time.perf_counter() - wall:.0f} s", flush=True))
    est = estimate_marginals(measurements, sets, objective="l2", max_iter=args.products)
    cert = est.info["certificate"]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"estimate_marginals: {est.status.name}, stopped: {est.info.get('stopped')}, polytope "
          f"{est.info.get('polytope')}, gap {_figure(cert.get('gap'))}, violation {_figure(cert.get('violation'))}, "
          f"{cpu() - start:.1f} CPU-s, {time.perf_counter() - wall:.0f} s, peak RSS {peak:,.0f} MB; {est.message}",
          flush=True)
    # the error of what a release would publish, against the noisy answers it came from (mean L1 / n
    # per triple, bench_wide's measure); the solver's incumbent is labelled when it was not certified
    truths = {tuple(s): data.marginal(tuple(s)).astype(float).ravel() for s in sets}
    n = float(data.total)
    noisy = {tuple(s): m.values for s, m in zip(sets, measurements)}
    fitted = {s: np.asarray(v, float).ravel() for s, v in est.marginals(list(truths)).items()}
    label = "estimate" if est.success else "incumbent (not certified: not released)"
    print(f"mean L1/n over {len(sets)} triples: {label} {errors(fitted, truths, n):.4f}, "
          f"noisy answers {errors(noisy, truths, n):.4f}", flush=True)


def main() -> None:
    from dpopt.estimate.marginal_space.polytope.admm import CHECK_EVERY, RHO_L, admm

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_problem_arguments(parser)
    parser.add_argument("--products", type=int, default=4000)
    parser.add_argument("--rho-l", type=float, default=RHO_L)
    parser.add_argument("--adapt", action="store_true", help="OSQP's penalty update")
    parser.add_argument("--check-every", type=int, default=CHECK_EVERY)
    parser.add_argument("--stop-gap", type=float, default=1e-7,
                        help="stop at this certified gap (the release's tolerance is 1e-6)")
    parser.add_argument("--memory", type=int, default=None,
                        help="Anderson memory (default: the module's rule for the cells; 0: plain ADMM)")
    parser.add_argument("--estimate", action="store_true",
                        help="run estimate_marginals end to end (its own path choice) instead of ADMM alone")
    parser.add_argument("--newton-cells", type=int, default=None,
                        help="with --estimate: projection.NEWTON_CELLS for the run (0: rounds, then ADMM, at any size)")
    parser.add_argument("--polish", type=int, default=0, help="rounds of the dual's face polish after ADMM")
    parser.add_argument("--polish-steps", type=int, default=150)
    args = parser.parse_args()
    if args.estimate:
        estimate_end_to_end(args)
        return
    problem = capture_problem(tuple(args.attrs), args.eps, args.accounting, args.seed)
    print(f"{len(args.attrs)} attributes: {problem.cliques.size:,} clique cells, {problem.index.size:,} residuals",
          flush=True)
    start = cpu()

    def log(step, products, point):
        print(f"step {step}: {products} products, gap {point[3]:.4g}, violation {point[4]:.2g}, F {point[5]:.10g}, "
              f"g {point[6]:.10g}, {cpu() - start:.1f} CPU-s", flush=True)

    point, products = admm(problem, max_products=args.products, stop_gap=args.stop_gap, feasibility=1e-6,
                           rho_l=args.rho_l, check_every=args.check_every, adapt=args.adapt, memory=args.memory,
                           log=log)
    if args.polish:
        from dpopt.estimate.marginal_space.polytope.projection import certify_with, polish
        from dpopt.estimate.marginal_space.polytope.records import record_repair

        kappa = point[2]
        fam = problem.cliques
        for round_ in range(args.polish):
            polished, steps = polish(problem, kappa, rounds=1, max_iter=args.polish_steps)
            kappa = polished[2]
            r = problem.residuals(kappa)
            mu = fam.expand(r)
            lifted = record_repair(problem, r, mu)
            own = certify_with(problem, kappa, r, mu, *lifted)
            paired = certify_with(problem, kappa, r, mu, point[0], point[1])
            print(f"  polish round {round_ + 1}: {steps} products; g {own[6]:.10g}; own records point gap "
                  f"{own[3]:.4g} (F {own[5]:.10g}); ADMM's point against it: gap {paired[3]:.4g}; most negative "
                  f"{float(mu.min()):.3g}; {cpu() - start:.1f} CPU-s", flush=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"ADMM: {products} products, gap {point[3]:.4g}, violation {point[4]:.2g}, {cpu() - start:.1f} CPU-s, "
          f"peak RSS {peak:,.0f} MB; certified (1e-6): {point[3] <= 1e-6 and point[4] <= 1e-6}")


if __name__ == "__main__":
    main()
