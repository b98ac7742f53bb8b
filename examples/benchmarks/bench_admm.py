"""ADMM on the local-polytope projection, the prototype of polytope/admm.py (issue 27 research).

Prints, at every check, the certified gap of the multipliers' own point, of the step's point
repaired by the mix towards the interior point ("gap x"), and by adding records (polytope/records.py),
with the parts of the records' gap. (A face finish from ADMM's point, LSQR onto its own face
``{z = 0}``, was tried here and dropped: on the stand-in it pushed about a million cells off the
face below zero, most negative -1.8.) Figures: docs/pages/algorithms/marginal-space.md section 2.

Problem (4) of :mod:`dpopt.estimate.marginal_space.polytope.projection` split as
``min F(r) s.t. E r - z = 0, z >= 0`` (Boyd, Parikh, Chu, Peleato, Eckstein 2011, section 5.2;
over-relaxation section 3.4.3; adaptive penalty as in OSQP, Stellato et al. 2020, section 5.2).
With one penalty per clique, ``E^T diag(rho) E`` is diagonal (the residual parts are orthogonal),
so the x-update is a division and each iteration is one expand and one adjoint.

    OPENBLAS_NUM_THREADS=1 nice -n 10 python examples/benchmarks/bench_admm.py --eps 1 --iters 2000
"""

from __future__ import annotations

import argparse
import resource
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_alm_overhead import add_problem_arguments, capture_problem  # noqa: E402


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def admm(problem, *, iters: int, alpha: float, rho_scale: float, adapt_every: int, check_every: int,
         log=print):
    from dpopt.estimate.marginal_space.polytope.projection import _better, certify_at, certify_with, objective
    from dpopt.estimate.marginal_space.polytope.records import record_repair

    fam = problem.cliques
    free = problem.free_flat
    w = problem.w_flat
    target = problem.target
    zeros = problem.zero_cells
    # one penalty (rho L = rho_scale), held per set so that adjoint and diagonal take it as weights
    order = np.argsort(fam.offsets)
    set_of_cell = np.repeat(order, fam.cells[order])
    rho_set = np.full(len(fam.sets), rho_scale / problem.lipschitz)
    rho = rho_set[set_of_cell]
    z = np.maximum(fam.expand(target), 0.0)
    if zeros is not None:
        z[zeros] = 0.0
    u = np.zeros(fam.size)
    best = None
    start = cpu()
    r = target.copy()
    for k in range(1, iters + 1):
        rhs = w * target + fam.adjoint(z - u, weights=rho_set)
        denom = w + problem.index.per_set(fam.diagonal(weights=rho_set))
        r = np.where(free, rhs / np.where(free, denom, 1.0), target)
        er = fam.expand(r)
        xt = alpha * er + (1 - alpha) * z
        z_old = z
        z = np.maximum(xt + u, 0.0)
        if zeros is not None:
            z[zeros] = 0.0
        u = u + xt - z
        if k % check_every == 0 or k == iters:
            kappa = -rho * u
            if zeros is None:
                kappa = np.maximum(kappa, 0.0)
            else:
                kappa = np.where(zeros, kappa, np.maximum(kappa, 0.0))
            rk = problem.residuals(kappa)
            mk = fam.expand(rk)
            p1 = certify_at(problem, kappa, rk, mk)
            p2 = certify_with(problem, kappa, rk, mk, r, er)
            cands = [p1, p2]
            repaired = record_repair(problem, r, er)
            if repaired is not None:
                p3 = certify_with(problem, kappa, rk, mk, *repaired)
                drift = float(np.abs(fam.expand(repaired[0]) - repaired[1]).max())
                dx = (repaired[0] - rk)[free]
                quad = 0.5 * float(np.sum(w[free] * dx * dx))
                lin = float(kappa @ repaired[1])
                log(f"    F(x) {objective(problem, r):.10g}; F(x') - g = <kappa, m'> {lin:.4g} "
                    f"+ 1/2|x' - r(kappa)|^2 {quad:.4g}; <kappa, m_x> {float(kappa @ er):.4g}; "
                    f"<kappa, lift> {float(kappa @ (repaired[1] - er)):.4g}")
                cands.append(p3)
                log(f"    records repair: {int(np.count_nonzero(er < 0)):,} negative cells lifted, gap {p3[3]:.4g}, "
                    f"violation {p3[4]:.2g}, F {p3[5]:.10g}, |E x' - m'| {drift:.2g}")
            for p in cands:
                if best is None or _better(p, best, 1e-6):
                    best = p
            prim = float(np.linalg.norm(er - z))
            dual = float(np.linalg.norm(fam.adjoint(rho * (z - z_old))))
            log(f"it {k}: gap r(kappa) {p1[3]:.3g} (viol {p1[4]:.2g}), gap x {p2[3]:.3g}; best {best[3]:.3g}; "
                f"prim {prim:.3g} dual {dual:.3g}; rho L {rho_set.max() * problem.lipschitz:.3g}; "
                f"face {int(np.count_nonzero(z == 0)):,}; most negative E r {float(er.min()):.3g}; "
                f"F {p2[5]:.10g} g {p1[6]:.10g}; {cpu() - start:.1f} CPU-s", flush=True)
            if best[3] <= 1e-7 and best[4] <= 1e-6:
                break
            if adapt_every and k % adapt_every == 0:
                scale_p = prim / max(float(np.linalg.norm(er)), float(np.linalg.norm(z)), 1e-300)
                scale_d = dual / max(float(np.linalg.norm(fam.adjoint(rho * u))), 1e-300)
                factor = float(np.sqrt(scale_p / max(scale_d, 1e-300)))
                if factor > 5 or factor < 0.2:
                    rho_set = rho_set * factor
                    rho = rho * factor
                    u = u / factor
    return best, k


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_problem_arguments(parser)
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--alpha", type=float, default=1.6)
    parser.add_argument("--rho-l", type=float, default=20.0)
    parser.add_argument("--adapt-every", type=int, default=100)
    parser.add_argument("--check-every", type=int, default=50)
    args = parser.parse_args()
    problem = capture_problem(tuple(args.attrs), args.eps, args.accounting, args.seed)
    print(f"{len(args.attrs)} attributes: {problem.cliques.size:,} clique cells, {problem.index.size:,} residuals, "
          f"L {problem.lipschitz:.3g}", flush=True)
    best, k = admm(problem, iters=args.iters, alpha=args.alpha, rho_scale=args.rho_l, adapt_every=args.adapt_every,
                   check_every=args.check_every)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"ADMM: {k} iterations, best gap {best[3]:.4g}, violation {best[4]:.3g}; peak RSS {peak:,.0f} MB")


if __name__ == "__main__":
    main()
