"""User and system CPU per product of the marginal-space augmented Lagrangian path (issue 27).

On adult_pgm's 364 triples (20.9 M clique cells, zCDP eps 1) the path spent 515 of 1,138 CPU-s in
the kernel (20 M minor page faults): every step made fresh whole vectors (about 160 MB each),
which glibc serves from fresh ``mmap`` pages above its 32 MB threshold. The solver and the
family's ``expand``/``adjoint`` now work in vectors made once; this script measures what is left
on a stand-in small enough to run in seconds and prints a digest of every certified outer point,
so two commits can be compared bit for bit.

Stand-in (default): adult_pgm restricted to age, education-num, marital-status, occupation, race,
capital-loss, hours-per-week, income>50K and sex, all 84 triples measured under zCDP (2.34 M
clique cells), the projection problem captured from the estimator and solved by the augmented
Lagrangian alone from ``kappa = 0`` for a fixed number of products.

Its vectors (19 MB) are below glibc's dynamic ``mmap`` threshold, so a fresh temporary is often
recycled heap memory; to see adult's regime (every temporary a fresh mapping) fix the threshold
below the vector size::

    MALLOC_MMAP_THRESHOLD_=8388608 OPENBLAS_NUM_THREADS=1 nice -n 10 \\
        python examples/benchmarks/bench_alm_overhead.py --products 40

``--diagnose`` also prints where each outer point's certified gap comes from
(:func:`~dpopt.estimate.marginal_space.polytope.projection.gap_parts`: complementarity at ``r(kappa)``
against the repair's cost, the repair step and the most negative cell; one more adjoint per outer
step, outside the timing's meaning), and ``--polish N`` then runs N rounds of the dual's
active-face conjugate gradients (:func:`~dpopt.estimate.marginal_space.polytope.projection.polish`) from
the best point, the face finish tried for issue 27. ``--save DIR`` keeps every outer point's
multipliers and ``--start FILE`` starts from one (with ``--rho-l`` and ``--finish-gap``), so a
finish can be tried from a late point without re-running the path to it: the 6-attribute slice's
figures in the face finish's and the augmented Lagrangian's notes came from
``--attrs age education-num marital-status occupation race capital-loss --products 4000
[--save DIR | --start DIR/kappa_977.npy --rho-l 640]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import sys
from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import shared_file  # noqa: E402
from bench_wide import measure_sets  # noqa: E402

from dpopt.model.data import Dataset  # noqa: E402
from dpopt.model.domain import Domain  # noqa: E402

STAND_IN = ("age", "education-num", "marital-status", "occupation", "race", "capital-loss", "hours-per-week",
            "income>50K", "sex")


class _Captured(Exception):
    pass


def adult_data(attrs) -> Dataset:
    """adult_pgm's columns ``attrs`` as a :class:`~dpopt.model.data.Dataset`."""
    sizes = json.loads(shared_file("adult_pgm_domain.json").read_text())
    frame = pd.read_csv(shared_file("adult_pgm.csv"), usecols=list(attrs))[list(attrs)]
    return Dataset.from_frame(frame, Domain(tuple(attrs), tuple(int(sizes[a]) for a in attrs)))


def measured_triples(attrs, eps: float, accounting: str, seed: int, data: Dataset | None = None):
    """``(measurements, sets)``: every triple of ``attrs`` of adult_pgm (``data``, read when not
    given), measured (benchmark noise)."""
    sets = list(combinations(attrs, 3))
    measurements, _ = measure_sets(adult_data(attrs) if data is None else data, sets, accounting, eps, seed)
    return measurements, sets


def capture_problem(attrs, eps: float, accounting: str, seed: int):
    """The estimator's projection problem on ``attrs``' triples (the solve itself is not run)."""
    from dpopt.estimate.marginal_space import estimator

    measurements, sets = measured_triples(attrs, eps, accounting, seed)
    captured = {}

    def stop(problem, **kw):
        captured["problem"] = problem
        raise _Captured

    real = estimator.project
    estimator.project = stop
    try:
        estimator.estimate_marginals(measurements, sets, exact_cells=0)
    except _Captured:
        pass
    finally:
        estimator.project = real
    return captured["problem"]


def usage() -> np.ndarray:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return np.array([r.ru_utime, r.ru_stime, r.ru_minflt])


def add_problem_arguments(parser: argparse.ArgumentParser) -> None:
    """The problem's options (attributes, eps, accounting, seed), shared with the ADMM benchmarks."""
    parser.add_argument("--attrs", nargs="+", default=list(STAND_IN))
    parser.add_argument("--eps", type=float, default=1.0)
    parser.add_argument("--accounting", choices=["zcdp", "pure"], default="zcdp")
    parser.add_argument("--seed", type=int, default=7)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_problem_arguments(parser)
    parser.add_argument("--products", type=int, default=40, help="products of the solve (an expand and an adjoint)")
    parser.add_argument("--diagnose", action="store_true", help="print the parts of every outer point's gap")
    parser.add_argument("--polish", type=int, default=0, help="rounds of the active-face polish after the solve")
    parser.add_argument("--finish-gap", type=float, default=None,
                        help="the gap from which the face finish runs (default: the module's FINISH_GAP; 0: never)")
    parser.add_argument("--rho-l", type=float, default=None, help="rho L of the first outer step (default: the module's)")
    parser.add_argument("--save", type=Path, default=None, help="save every outer point's multipliers in this folder")
    parser.add_argument("--start", type=Path, default=None, help="start from multipliers saved by --save (.npy)")
    args = parser.parse_args()

    from dpopt.estimate.marginal_space.polytope import augmented_lagrangian as alm_module
    from dpopt.estimate.marginal_space.polytope.augmented_lagrangian import augmented_lagrangian
    from dpopt.estimate.marginal_space.polytope.projection import _better, certify_at, gap_parts, polish

    problem = capture_problem(tuple(args.attrs), args.eps, args.accounting, args.seed)
    fam = problem.cliques
    print(f"{len(args.attrs)} attributes: {fam.size:,} clique cells, {problem.index.size:,} residuals")

    gen = np.random.default_rng(0)
    x, v = gen.normal(size=problem.index.size), gen.normal(size=fam.size)
    out = np.empty(fam.size)
    fam.expand(x, out=out), fam.adjoint(v)  # the work arrays, made once
    for name, call in (("expand (out given)", lambda: fam.expand(x, out=out)), ("adjoint", lambda: fam.adjoint(v))):
        start = usage()
        for _ in range(5):
            call()
        user, system, faults = (usage() - start) / 5
        print(f"{name:>20}: {user:.3f} user-s, {system:.3f} sys-s, {faults:,.0f} minor faults per call")

    digest = hashlib.sha256()

    def record(outer, products, rho_l, point, mu):
        for a in point[:3]:
            digest.update(np.ascontiguousarray(a).tobytes())
        digest.update(np.asarray(point[3:], dtype=np.float64).tobytes())
        print(f"  outer {outer}: {products:.1f} products, rho L {rho_l:.3g}, gap {point[3]:.4g}, "
              f"violation {point[4]:.3g}, F {point[5]:.10g}, g {point[6]:.10g}", flush=True)
        if args.save is not None:
            args.save.mkdir(parents=True, exist_ok=True)
            np.save(args.save / f"kappa_{int(products)}.npy", point[2])
        if args.diagnose:
            diagnose(point[2])

    def diagnose(kappa):
        r = problem.residuals(kappa)
        parts = gap_parts(problem, kappa, r, fam.expand(r))
        print(f"    F(r(kappa)) {parts['objective']:.7g}, g {parts['dual']:.7g}, <kappa, mu> "
              f"{parts['complementarity']:.4g}, repair step {parts['repair_step']:.3g} costing "
              f"{parts['repair_cost']:.4g} ({parts['repair_cost'] / parts['objective']:.3g} of F); most negative "
              f"cell -{parts['worst']:.3g}, {parts['negative']:,} negative cells, {parts['active']:,} positive "
              "multipliers", flush=True)

    if args.finish_gap is not None:
        alm_module.FINISH_GAP = args.finish_gap
    if args.rho_l is not None:
        alm_module.START_RHO_L = args.rho_l
    kappa0 = np.zeros(fam.size) if args.start is None else np.load(args.start)
    start = usage()
    point, products = augmented_lagrangian(problem, kappa0, certify_at, _better,
                                           max_products=args.products, stop_gap=1e-7, feasibility=1e-6, log=record)
    user, system, faults = usage() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"augmented Lagrangian: {products} products, {user:.2f} user-s, {system:.2f} sys-s, {faults:,.0f} minor "
          f"faults ({user / products:.3f} user-s, {system / products:.4f} sys-s, {faults / products:,.0f} faults "
          f"per product); gap {point[3]:.4g}; peak RSS {peak:,.0f} MB (process)")
    print(f"digest of the certified outer points: {digest.hexdigest()[:16]}")
    kappa = point[2]
    for round_ in range(args.polish):
        polished, steps = polish(problem, kappa, rounds=1, max_iter=150, stop_gap=1e-7, feasibility=1e-6)
        kappa = polished[2]
        print(f"  polish round {round_ + 1}: {steps} products, gap {polished[3]:.4g}", flush=True)
        if args.diagnose:
            diagnose(kappa)


if __name__ == "__main__":
    main()
