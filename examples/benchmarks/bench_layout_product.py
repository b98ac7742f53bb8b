"""One product of the marginal-space layout (an ``expand`` and an ``adjoint``) on adult's triples (issue 27).

    OPENBLAS_NUM_THREADS=1 python examples/benchmarks/bench_layout_product.py          # the 9-attribute stand-in
    OPENBLAS_NUM_THREADS=1 python examples/benchmarks/bench_layout_product.py --all    # 14 attributes, 364 triples
    OPENBLAS_NUM_THREADS=1 python examples/benchmarks/bench_layout_product.py --threads 1 2

Prints the wall and CPU seconds of each map (least and median of 12 calls) on each number of
threads (``DPOPT_THREADS``; default: what dpopt would use here) and, with ``--paths``, how much of
one product each per-axis path takes on one thread (dense product or cumulative sums; first,
middle or last axis). Every solver of the local-polytope projection spends most of its time in
these two maps.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import shared_file  # noqa: E402
from bench_alm_overhead import STAND_IN, capture_problem  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--all", action="store_true", help="every attribute of adult_pgm (364 triples)")
    parser.add_argument("--paths", action="store_true", help="split one product by per-axis path")
    parser.add_argument("--threads", type=int, nargs="+", help="numbers of threads to time (DPOPT_THREADS)")
    args = parser.parse_args()
    from dpopt.workers import THREADS_VARIABLE, worker_threads

    attrs = list(json.loads(shared_file("adult_pgm_domain.json").read_text())) if args.all else list(STAND_IN)
    problem = capture_problem(tuple(attrs), 1.0, "zcdp", 7)
    fam = problem.cliques
    print(f"{len(attrs)} attributes: {fam.size:,} clique cells, {problem.index.size:,} residuals")
    residuals = np.random.default_rng(0).standard_normal(problem.index.size)
    cells, back = np.empty(fam.size), np.empty(problem.index.size)
    for threads in args.threads or [worker_threads()]:
        os.environ[THREADS_VARIABLE] = str(threads)
        for label, call in (("expand", lambda: fam.expand(residuals, out=cells)),
                            ("adjoint", lambda: fam.adjoint(cells, out=back))):
            walls, cpus = [], []
            for _ in range(12):
                wall, cpu = time.perf_counter(), time.process_time()
                call()
                walls.append(time.perf_counter() - wall)
                cpus.append(time.process_time() - cpu)
            print(f"{threads} thread(s), {label}: wall least {min(walls):.4f} s, median {np.median(walls):.4f}; "
                  f"CPU least {min(cpus):.4f} s, median {np.median(cpus):.4f}")
    if args.paths:
        os.environ[THREADS_VARIABLE] = "1"  # the CPU clock is the process's: one thread to split it
        split_by_path(fam, residuals, cells, back)


def split_by_path(fam, residuals, cells, back) -> None:
    """Time every per-axis transform of one product, by path and axis position."""
    from dpopt.estimate.marginal_space import layout

    spent: dict = {}

    def timed(transform, kind):
        def run(*args):
            fibres = layout._fibres(args[0], args[1])
            path = "dense" if layout._dense_axis(fibres) else "cumulative sums"
            where = "last" if fibres.shape[2] == 1 else ("first" if args[1] == 1 else "middle")
            start = time.process_time()
            transform(*args)
            entry = spent.setdefault((kind, path, where), [0.0, 0])
            entry[0] += time.process_time() - start
            entry[1] += args[0].size
        return run

    synthesize, analyse = layout._synthesize_into, layout._analyse_into
    layout._synthesize_into, layout._analyse_into = timed(synthesize, "synthesis"), timed(analyse, "analysis")
    try:
        fam.expand(residuals, out=cells)
        fam.adjoint(cells, out=back)
    finally:
        layout._synthesize_into, layout._analyse_into = synthesize, analyse
    for (kind, path, where), (seconds, entries) in sorted(spent.items(), key=lambda item: -item[1][0]):
        print(f"  {kind}, {path}, {where} axis: {seconds:.3f} CPU-s over {entries / 1e6:.1f} M entries "
              f"({seconds / entries * 1e9:.1f} ns an entry)")


if __name__ == "__main__":
    main()
