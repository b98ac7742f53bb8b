"""Every 2-D range query of a 75 x 50 grid (issue 28, item 5): the matrix mechanism's plan and
run at scale, its measured error against the plan's expected error, and MWEM on the same workload.

Data: ``../shared/data/adult.csv`` (raw UCI Adult, all 48,842 records): ``age`` code = age - 17
(17..91, 75 codes; the data hold 17..90) and ``hours`` code = hours-per-week // 2 (50 codes; the
data hold 1..99). A record outside the grid stops the run (there are none). Workload: every box
``[a1, a2] x [h1, h2]``, 2,850 x 1,275 = 3,633,750 counting queries, written in the spec as
``workload = "all_ranges"``, ``attrs = ["age", "hours"]`` (the Kronecker product of the two
attributes' range workloads). Pure epsilon-DP, discrete Laplace noise, no constraints (the
released table is ``A⁺ y``, whose every answer has an exact standard error).

Parts (each in a fresh process, so that its peak resident memory is its own):

* ``plan``: ``dpopt.release.plan`` with ``strategy = "best"`` (identity, the workload, hierarchical,
  Haar, Fourier, optimised): seconds, the chosen strategy, its expected total squared error, the
  SVD bound, the plan's memory estimate. Targets: <= 30 s, peak <= 2 GB.
* ``run``: ``dpopt.release.run`` end to end (measure, least squares, 3.6 million answers with their
  labels and standard errors), in memory and writing Parquet or CSV. Targets: <= 30 s, <= 2 GB.
* ``errors``: ``--runs`` independent releases (seeded discrete Laplace: a benchmark, NOT private);
  each run's total squared error over the 3.6 million answers against the plan's expected error.
  The sampling error is exact: with ``z`` the strategy's noise (independent entries, variance
  ``v``, fourth moment ``μ4``) the error is ``zᵀ M z``, ``M = (W A⁺)ᵀ (W A⁺)``, and
  ``Var = 2 v² ‖M‖_F² + (μ4 - 3 v²) sum_i M_ii²``; for a Kronecker ``W`` and ``A`` ``M = ⊗ M_f``,
  so both sums are products over the two attributes. Also: the share of the 36 million
  (answer, run) errors within 1.96 standard errors.
* ``mwem``: MWEM (Hardt, Ligett, McSherry 2012) on the same workload through a spec
  (``[mwem] workload = "all_ranges"``), ``--rounds`` rounds, same epsilon: seconds, peak memory and
  its mean squared error per query beside the matrix mechanism's. Target: <= 60 s. Needs MWEM's
  scoring of Kronecker products of intervals as boxes (stream t30); without it the part is
  skipped, saying so.

Timings are wall and CPU seconds of the part's process (set OPENBLAS_NUM_THREADS=1; the load
average is printed beside them).

Run:  OPENBLAS_NUM_THREADS=1 python examples/benchmarks/bench_ranges_2d.py                 (all parts)
      OPENBLAS_NUM_THREADS=1 python examples/benchmarks/bench_ranges_2d.py plan run --runs 10
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

PARTS = ("plan", "run", "errors", "mwem")
AGE_FIRST, AGE_SIZE, HOURS_WIDTH, HOURS_SIZE = 17, 75, 2, 50


def spec(epsilon: str, fmt: str | None = "parquet", algorithm: str = "matrix_mechanism", rounds: int = 10) -> dict:
    out = {"name": "ranges_2d", "algorithm": algorithm,
           "domain": {"attributes": {"age": AGE_SIZE, "hours": HOURS_SIZE}}, "data": {"source": "file"},
           "privacy": {"accounting": "pure", "epsilon": epsilon},
           "output": {"formats": [fmt] if fmt else [], "summary": ["md"] if fmt else [], "plots": False}}
    workload = {"workload": "all_ranges", "attrs": ["age", "hours"]}
    if algorithm == "mwem":
        out["mwem"] = {**workload, "rounds": rounds}
        out["output"]["synthetic"] = False
    else:
        out["matrix_mechanism"] = {**workload, "strategy": "best"}
    return out


def adult_grid():
    """All Adult records on the 75 x 50 grid, as a DataFrame of codes."""
    import numpy as np
    import pandas as pd

    from _common import shared_file

    frame = pd.read_csv(shared_file("adult.csv"), usecols=["age", "hours-per-week"])
    age = frame["age"].to_numpy() - AGE_FIRST
    hours = frame["hours-per-week"].to_numpy() // HOURS_WIDTH
    for name, code, size in (("age", age, AGE_SIZE), ("hours-per-week", hours, HOURS_SIZE)):
        outside = int(np.sum((code < 0) | (code >= size)))
        if outside:
            sys.exit(f"{outside} records of {name} fall outside the grid")
    return pd.DataFrame({"age": age, "hours": hours})


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---- the parts (each in its own process) ------------------------------------------------------------
def part_plan(args) -> dict:
    from dpopt.release import plan

    data = adult_grid()
    wall, c = time.perf_counter(), cpu()
    p = plan(spec(args.epsilon), data=data)
    wall, c = time.perf_counter() - wall, cpu() - c
    d = p.algorithm_plan.details
    return {"part": "plan", "wall": wall, "cpu": c, "peak_mb": peak_mb(), "strategy": d.chosen,
            "strategy_rows": d.strategy.num_rows, "queries": d.workload.num_rows,
            "expected_error": d.expected_error, "bound": d.bound,
            "candidates": {c.name: (c.expected_error, c.seconds) for c in d.candidates},
            "memory_estimate_mb": p.resources.total / 2**20, "variance_method": d.variance.method}


def part_run(args, fmt: str | None) -> dict:
    from dpopt.release import run

    data = adult_grid()
    with tempfile.TemporaryDirectory() as tmp:
        wall, c = time.perf_counter(), cpu()
        release = run(spec(args.epsilon, fmt), data=data, out=Path(tmp) / "out" if fmt else None, seed=1)
        wall, c = time.perf_counter() - wall, cpu() - c
        size = sum(f.stat().st_size for f in Path(tmp).rglob("*") if f.is_file())
    answers = release.answers["workload"]
    return {"part": f"run ({fmt or 'in memory'})", "wall": wall, "cpu": c, "peak_mb": peak_mb(),
            "answers": len(answers), "has_stderr": "stderr" in answers, "bytes_written": size}


def part_errors(args) -> dict:
    import numpy as np

    from dpopt.model.data import Dataset
    from dpopt.privacy.randomness import make_random
    from dpopt.release import plan

    p = plan(spec(args.epsilon), data=adult_grid())
    ap = p.algorithm_plan
    d, law = ap.details, ap.steps[0].law
    data = Dataset.from_frame(adult_grid(), p.domain)
    W = d.workload
    truth = W.matvec(data.histogram().astype(np.float64))
    totals, inside, seconds = [], 0, []
    for r in range(args.runs):
        start = time.perf_counter()
        release = p.algorithm.run(ap, data, ap.budget.accountant(), make_random(7000 + r))
        seconds.append(time.perf_counter() - start)
        answers = release.answers["workload"]
        err = answers["count"].to_numpy() - truth
        totals.append(float(err @ err))
        inside += int(np.sum(np.abs(err) <= 1.96 * answers["stderr"].to_numpy()))
    sd, check = exact_sd(W, d.strategy, law)
    mean = float(np.mean(totals))
    return {"part": "errors", "runs": args.runs, "expected": d.expected_error, "mean": mean, "totals": totals,
            "sd_one_run": sd, "trace_check": check, "z": (mean - d.expected_error) / (sd / math.sqrt(args.runs)),
            "empirical_sd": float(np.std(totals, ddof=1)), "coverage_1.96": inside / (args.runs * W.num_rows),
            "seconds_per_run": float(np.median(seconds)), "peak_mb": peak_mb()}


def exact_sd(W, A, law) -> tuple[float, float]:
    """SD of one run's total squared error ``zᵀ M z`` (module notes), and ``v trace(M)`` (the
    expected error again, as a check of ``M``)."""
    import numpy as np

    from dpopt.model.queries import Kronecker

    if not isinstance(A, Kronecker):
        return float("nan"), float("nan")
    v, mu4 = noise_moments(law)
    frob, diag, trace = 1.0, 1.0, 1.0
    for wf, af in zip(W.factors, A.factors):
        X = wf.matrix.toarray() @ np.linalg.pinv(af.matrix.toarray())
        M = X.T @ X
        frob *= float(np.sum(M * M))
        diag *= float(np.sum(np.diag(M) ** 2))
        trace *= float(np.trace(M))
    return math.sqrt(2 * v * v * frob + (mu4 - 3 * v * v) * diag), v * trace


def noise_moments(law) -> tuple[float, float]:
    """Variance and fourth moment of the exact discrete law on one answer (the variance is checked
    against the law's own). Discrete Laplace with ``P(k) ∝ q^|k|``, ``q = exp(-1/t)``:
    ``E k² = 2q / (1-q)²`` and ``E k⁴ = 2q (1 + 11q + 11q² + q³) / ((1+q)(1-q)⁴)`` in grid units.
    Discrete Gaussian: by summing its mass function on small parameters, else ``3 v²`` (its
    excess kurtosis vanishes as sigma grows)."""
    import numpy as np

    t, grid = float(law.parameter), float(law.grid)
    if law.family == "discrete_laplace":
        q, one_minus_q = math.exp(-1.0 / t), -math.expm1(-1.0 / t)
        v = 2 * q / one_minus_q**2
        mu4 = 2 * q * (1 + 11 * q + 11 * q * q + q**3) / ((1 + q) * one_minus_q**4)
    elif t < 1e6:
        k = np.arange(-int(40 * math.sqrt(t)) - 40, int(40 * math.sqrt(t)) + 41, dtype=np.float64)
        mass = np.exp(-k * k / (2 * t))
        mass /= mass.sum()
        v, mu4 = float(mass @ k**2), float(mass @ k**4)
    else:
        v, mu4 = t, 3 * t * t
    v, mu4 = v * grid**2, mu4 * grid**4
    if not math.isclose(v, law.variance, rel_tol=1e-6):
        sys.exit(f"noise variance {v} differs from the law's {law.variance}")
    return v, mu4


def part_mwem(args) -> dict:
    import numpy as np

    import importlib

    from dpopt.model.data import Dataset
    from dpopt.release import plan, run

    mwem_module = importlib.import_module("dpopt.algorithms.mwem")  # the package exports a function of that name
    if not hasattr(mwem_module, "as_boxes"):
        return {"part": "mwem", "skipped": "this branch's mwem does not score Kronecker products of intervals as "
                                           "boxes (stream t30); it would form the 3.6 million candidates' matrix"}
    data = adult_grid()
    wall, c = time.perf_counter(), cpu()
    release = run(spec(args.epsilon, None, "mwem", args.rounds), data=data, seed=3)
    wall, c = time.perf_counter() - wall, cpu() - c
    p = plan(spec(args.epsilon, None, "mwem", args.rounds), data=data)
    W = p.algorithm_plan.details[0]
    boxes = mwem_module.as_boxes(W)
    truth = boxes.answer(Dataset.from_frame(data, p.domain))
    err = boxes.matvec(np.asarray(release.counts, dtype=np.float64)) - truth
    return {"part": "mwem", "wall": wall, "cpu": c, "peak_mb": peak_mb(), "rounds": args.rounds,
            "mse_per_query": float(err @ err) / err.size}


# ---- the driver ----------------------------------------------------------------------------------
def child(args) -> None:
    warnings.simplefilter("ignore")
    name = args.child
    result = (part_plan(args) if name == "plan" else part_errors(args) if name == "errors" else
              part_mwem(args) if name == "mwem" else part_run(args, None if name == "run:memory" else
                                                            name.split(":")[1]))
    print("RESULT " + json.dumps(result))


def spawn(name: str, args) -> dict:
    cmd = [sys.executable, __file__, "--child", name, "--epsilon", args.epsilon, "--runs", str(args.runs),
           "--rounds", str(args.rounds)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).parent)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode or line is None:
        sys.exit(f"part {name} failed:\n{proc.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("parts", nargs="*", help=f"any of {', '.join(PARTS)} (default: all)")
    parser.add_argument("--epsilon", default="1")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    print(f"every box of the {AGE_SIZE} x {HOURS_SIZE} Adult age x hours grid (3,633,750 queries), "
          f"epsilon = {args.epsilon}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores, "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}")
    parts = args.parts or list(PARTS)
    if set(parts) - set(PARTS):
        parser.error(f"unknown part(s) {sorted(set(parts) - set(PARTS))}; choose from {list(PARTS)}")
    if "plan" in parts:
        r = spawn("plan", args)
        print(f"\nplan (strategy = best): {r['wall']:.2f} s wall, {r['cpu']:.2f} s CPU, peak {r['peak_mb']:.0f} MB "
              f"(the plan's own memory estimate of the release: {r['memory_estimate_mb']:.0f} MiB)")
        for name, (error, seconds) in r["candidates"].items():
            mark = "*" if name == r["strategy"] else " "
            if not math.isfinite(error):
                print(f"  {mark}{name:<13} does not apply")
                continue
            print(f"  {mark}{name:<13} expected total squared error {error:12.5g}  "
                  f"RMSE/query {math.sqrt(error / r['queries']):8.3f}  "
                  f"({seconds:.2f} s)")
        print(f"  SVD lower bound {r['bound']:.5g} (RMSE/query {math.sqrt(r['bound'] / r['queries']):.3f}); "
              f"standard errors {r['variance_method']}")
    if "run" in parts:
        print("\nrun (dpopt.release.run: measure, least squares, answers with labels and standard errors):")
        for name in ("run:memory", "run:parquet", "run:csv"):
            r = spawn(name, args)
            print(f"  {r['part']:<16} {r['wall']:6.2f} s wall, {r['cpu']:6.2f} s CPU, peak {r['peak_mb']:6.0f} MB, "
                  f"{r['answers']:,} answers{' with stderr' if r['has_stderr'] else ''}, "
                  f"{r['bytes_written'] / 2**20:.0f} MiB written")
    if "errors" in parts:
        r = spawn("errors", args)
        print(f"\nmeasured against expected error ({r['runs']} runs, seeded noise: NOT private):")
        print(f"  expected total squared error {r['expected']:.6g} (v trace(M) = {r['trace_check']:.6g})")
        print(f"  measured: mean {r['mean']:.6g} over {r['runs']} runs; one run's exact SD {r['sd_one_run']:.4g} "
              f"(empirical {r['empirical_sd']:.4g}); mean - expected = {r['z']:+.2f} standard errors of the mean")
        print("  each run: " + ", ".join(f"{t:.4g}" for t in r["totals"]))
        print(f"  errors within 1.96 standard errors: {100 * r['coverage_1.96']:.2f}% of "
              f"{r['runs']} x 3,633,750; {r['seconds_per_run']:.2f} s per run (median), peak {r['peak_mb']:.0f} MB")
    if "mwem" in parts:
        r = spawn("mwem", args)
        if "skipped" in r:
            print(f"\nmwem: skipped: {r['skipped']}")
        else:
            print(f"\nmwem ({r['rounds']} rounds, spec workload = \"all_ranges\"): {r['wall']:.2f} s wall, "
                  f"{r['cpu']:.2f} s CPU, peak {r['peak_mb']:.0f} MB; mean squared error per query "
                  f"{r['mse_per_query']:.5g} (RMSE {math.sqrt(r['mse_per_query']):.3f})")


if __name__ == "__main__":
    main()
