"""Plan-time memory estimates against measured peaks (dpopt.release.resources).

Each configuration runs a whole release in a fresh process and reports the peak resident
memory it added (``ru_maxrss`` after the run minus before it) beside the plan's estimate, so
the envelope in :mod:`dpopt.release.resources` can be checked against the engines as they are::

    OPENBLAS_NUM_THREADS=1 python examples/benchmarks/bench_memory.py            # every configuration
    python examples/benchmarks/bench_memory.py --only 10^6                        # those whose name matches

An estimate below the measured peak is printed with ``LOW``: the model needs revisiting.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
import warnings

CONFIGS = {
    # name: (values per attribute, attributes, measurements, objective, backend, invariant on the total)
    "quickstart": None,
    "10^5 cells, 2-way marginal, l2": (10, 5, "marginal", "l2", None, False),
    "10^6 cells, 2-way marginal, l2 (cvxpy)": (10, 6, "marginal", "l2", None, False),
    "10^6 cells, 2-way marginal, l2 (scipy)": (10, 6, "marginal", "l2", "scipy", False),
    "10^6 cells, identity, l2": (10, 6, "identity", "l2", None, False),
    "10^6 cells, 2-way marginal, entropy": (10, 6, "marginal", "entropy", None, False),
    "4x10^6 cells, 2-way marginal, l2": (4, 11, "marginal", "l2", None, False),
    "4x10^6 cells, 2-way marginal, l2, total invariant": (4, 11, "marginal", "l2", None, True),
    "4x10^6 cells, 2-way marginal, l1": (4, 11, "marginal", "l1", None, False),
    # The identity alone is estimated as matrix-free (a diagonal Gram is a vector); an engine
    # without that path fails here with a one-line out-of-memory error.
    "10^7 cells, identity, l2": (10, 7, "identity", "l2", None, False),
}


def spec_and_data(config):
    import numpy as np
    import pandas as pd

    if config is None:
        return "quickstart", None
    size, k, measure, objective, backend, invariant = config
    attrs = {f"a{i}": size for i in range(k)}
    frame = pd.DataFrame(np.random.default_rng(0).integers(0, size, (20_000, k)), columns=list(attrs))  # test input
    query = {"query": "identity"} if measure == "identity" else {"query": "marginal", "attrs": ["a0", "a1"]}
    spec = {"name": "memory", "domain": {"attributes": attrs}, "privacy": {"accounting": "pure", "epsilon": 1},
            "measure": [{**query, "mechanism": "laplace", "share": 1}],
            "reconstruct": {"objective": objective, **({"backend": backend} if backend else {})},
            "constraints": {"nonnegative": True}, "output": {"synthetic": False}}
    if invariant:
        spec["constraints"]["invariants"] = [{"name": "total", "query": "total", "from_data": True}]
    return spec, frame


def one(name: str) -> dict:
    warnings.simplefilter("ignore")
    from dpopt.release import plan, run

    spec, frame = spec_and_data(CONFIGS[name])
    estimate = plan(spec, data=frame).resources.total
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start = time.perf_counter()
    release = run(spec, data=frame, seed=1)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"name": name, "cells": release.plan.domain.size, "estimate": estimate, "measured": peak - before,
            "seconds": time.perf_counter() - start, "status": release.status.name}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run the configurations whose name contains this")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one)))
        return
    from dpopt.release.resources import format_bytes

    print(f"{'configuration':52} {'cells':>10} {'estimate':>10} {'measured':>10} {'ratio':>6} {'time':>7}")
    for name in CONFIGS:
        if args.only not in name:
            continue
        out = subprocess.run([sys.executable, __file__, "--one", name], capture_output=True, text=True)
        lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
        if out.returncode or not lines:
            print(f"{name:52} failed: {out.stderr.strip().splitlines()[-1:]}")
            continue
        r = json.loads(lines[-1])
        ratio = r["estimate"] / max(r["measured"], 1)
        flag = "  LOW" if ratio < 1 else ""
        print(f"{name:52} {r['cells']:>10,} {format_bytes(r['estimate']):>10} {format_bytes(r['measured']):>10} "
              f"{ratio:>6.2f} {r['seconds']:>6.1f}s{flag}")


if __name__ == "__main__":
    main()
