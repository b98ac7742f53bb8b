"""DualQuery benchmarks (issue 16): KDD99 at the paper's scale, nltcs and Adult against MWEM, scaling.

Gaboardi, Gallego Arias, Hsu, Roth, Wu, ICML 2014 (arXiv:1402.1526), Section 5. Every figure is
printed; ``--plot`` writes PNG curves next to ``--out``. The privacy noise comes from a seeded
source (a benchmark, not a release); the workloads are public and seeded too. Errors are on
record fractions (``q(D)/n`` against ``q(S)/|S|``) over the workload's conjunctions (a negation
has the same error as its conjunction).

Sub-commands:

``kdd99``
    ``../shared/data/kdd99_dq.csv.gz`` (494,021 records, 42 attributes, 419 values): random
    3-way conjunctions (uniform attribute triples and values) plus negations. Sweeps the
    number of queries (``--queries``) at each ε (``--epsilons``), δ = ``--delta``; prints
    T, s, the max and mean error, total time, and the per-round integer program's time
    (median, max, time-outs). The paper's Figure 2 is error vs ε at 500,000 queries, its
    Figure 3 error and time vs the number of queries at (1, 10^-3).
``compare``
    nltcs (16 binary attributes) or Adult (``adult_pgm.csv``, the attributes given by
    ``--adult-attributes``; the default is the 8 with at most 16 values, so that dense MWEM
    fits in memory): every cell of every 3-way marginal, at ``--epsilons``. DualQuery
    (δ = ``--delta``) against dense MWEM (:func:`dpopt.algorithms.mwem.mwem`, pure ε) and,
    on binary data, factored MWEM (:func:`dpopt.algorithms.mwem_factored.factored_mwem`).
    DualQuery's (ε, δ) is a weaker guarantee than MWEM's pure ε at the same ε: the table
    says so.
``scaling``
    Time per round vs the number of KDD99 attributes (``--attributes``, the first k) and vs
    ``s`` (``--samples``), at a fixed number of rounds.

Runs (timings on a shared 2-core machine; set OPENBLAS_NUM_THREADS=1):
    python examples/benchmarks/bench_dualquery.py kdd99 --queries 500000 --epsilons 1
    python examples/benchmarks/bench_dualquery.py kdd99 --queries 10000 100000 500000 --epsilons 0.25 0.5 1 2 4 --plot
    python examples/benchmarks/bench_dualquery.py compare --dataset nltcs --epsilons 0.1 0.5 1
    python examples/benchmarks/bench_dualquery.py compare --dataset adult --epsilons 0.1 0.5 1
    python examples/benchmarks/bench_dualquery.py scaling --attributes 10 20 42 --samples 500 2000 8000
Add ``--data-dir /work/shared/data`` when ../shared/data is not beside the repository.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd

import _common
from dpopt.algorithms.dualquery import dualquery
from dpopt.model.data import Dataset
from dpopt.model.domain import Domain
from dpopt.model.queries import Conjunctions
from dpopt.privacy.randomness import make_random

#: Declared levels of the KDD99 attributes (kdd99_discretize.py's schema: 419 values in all).
KDD99_SIZES = {
    "duration": 20, "protocol": 3, "service": 65, "flag": 11, "src_bytes": 20, "dst_bytes": 20, "land": 2,
    "wrong_fragment": 4, "urgent": 4, "hot": 10, "num_failed_logins": 6, "logged_in": 2, "num_compromised": 10,
    "root_shell": 2, "su_attempted": 3, "num_root": 5, "num_file_creations": 5, "num_shells": 3,
    "num_access_files": 5, "num_outbound_cmds": 2, "is_host_login": 2, "is_guest_login": 2, "count": 10,
    "srv_count": 10, "serror_rate": 10, "srv_serror_rate": 10, "rerror_rate": 10, "srv_rerror_rate": 10,
    "same_srv_rate": 10, "diff_srv_rate": 10, "srv_diff_host_rate": 10, "dst_host_count": 10,
    "dst_host_srv_count": 10, "dst_host_same_srv_rate": 10, "dst_host_diff_srv_rate": 10,
    "dst_host_same_src_port_rate": 10, "dst_host_srv_diff_host_rate": 10, "dst_host_serror_rate": 10,
    "dst_host_srv_serror_rate": 10, "dst_host_rerror_rate": 10, "dst_host_srv_rerror_rate": 10, "attack": 23,
}
ADULT_SMALL = ("workclass", "education-num", "marital-status", "occupation", "relationship", "race", "sex",
               "income>50K")


def data_file(args, name: str) -> Path:
    path = Path(args.data_dir) / name if args.data_dir else _common.shared_file(name)
    if not path.is_file():
        sys.exit(f"benchmark data {path} is absent")
    return path


def load_kdd99(args, attributes: int | None = None) -> Dataset:
    frame = pd.read_csv(data_file(args, "kdd99_dq.csv.gz"))
    names = list(KDD99_SIZES)[: attributes or len(KDD99_SIZES)]
    domain = Domain(tuple(names), tuple(KDD99_SIZES[a] for a in names))
    return Dataset(frame[names].to_numpy(np.int64), domain)


def errors(workload: Conjunctions, truth: np.ndarray, records: np.ndarray) -> tuple[float, float]:
    """Max and mean |q(D)/n - q(S)/|S|| over the workload's (positive) rows."""
    positive = ~workload.negated
    synthetic = workload.count_records(records)[positive] / len(records)
    err = np.abs(synthetic - truth[positive])
    return float(err.max()), float(err.mean())


def run_dq(data, workload, epsilon, args, seed: int) -> dict:
    truth_start = time.perf_counter()
    truth = workload.count_records(data.codes, data.weights) / data.total
    truth_time = time.perf_counter() - truth_start
    start, cpu = time.perf_counter(), time.process_time()
    release = dualquery(data, epsilon, args.delta, workload=workload, eta=args.eta, samples=args.samples,
                        rounds=args.rounds, solver=args.solver, time_limit=args.time_limit,
                        work_limit=args.work_limit, table_cells=1, rng=make_random(seed))
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    log = release.info["rounds_log"]
    if args.save_logs:
        Path(args.save_logs).mkdir(parents=True, exist_ok=True)
        name = (f"rounds_d{len(data.domain)}_m{int((~workload.negated).sum())}_eps{float(epsilon):g}"
                f"_T{release.info['rounds']}_s{release.info['samples']}_seed{seed}.csv")
        log.to_csv(Path(args.save_logs) / name, index=False)
    max_err, mean_err = errors(workload, truth, release.info["record_codes"])
    return {"epsilon": float(epsilon), "delta": args.delta, "queries": int((~workload.negated).sum()),
            "T": release.info["rounds"], "s": release.info["samples"], "eta": args.eta,
            "eps_guarantee": float(Fraction(release.info["epsilon_of_the_guarantee"])),
            "max_error": max_err, "mean_error": mean_err, "seconds": seconds, "cpu_seconds": cpu,
            "answers_s": release.info["timings"]["answers"], "sampling_s": release.info["timings"]["sampling"],
            "ip_total_s": release.info["timings"]["best_response"], "ip_median_s": float(log["time"].median()),
            "ip_max_s": float(log["time"].max()), "timeouts": int((log["status"] == "TIME_LIMIT").sum()),
            "work_limited": int((log["status"] == "ITERATION_LIMIT").sum()),
            "fallbacks": int(log["fallback"].sum()), "gap_max": float(log["gap"].max()),
            "eval_truth_s": truth_time}


def show(rows: list[dict], columns: list[str], title: str) -> pd.DataFrame:
    frame = pd.DataFrame(rows)
    with pd.option_context("display.width", 200, "display.max_columns", 40):
        print(f"\n{title}\n{frame[columns].to_string(index=False, float_format=lambda v: f'{v:.4g}')}")
    return frame


def cmd_kdd99(args) -> None:
    data = load_kdd99(args)
    print(f"KDD99: {data.total:,} records, {len(data.domain)} attributes, {sum(data.domain.sizes)} values")
    rows = []
    for m in args.queries:
        workload = Conjunctions.random(data.domain, 3, m, seed=args.workload_seed).with_negations()
        for eps in args.epsilons:
            for run in range(args.runs):
                row = run_dq(data, workload, Fraction(str(eps)), args, seed=args.seed + run)
                row["run"] = run
                rows.append(row)
                print(json.dumps(row), flush=True)
    frame = show(rows, ["queries", "epsilon", "T", "s", "eps_guarantee", "max_error", "mean_error", "seconds",
                        "cpu_seconds", "answers_s", "ip_median_s", "ip_max_s", "work_limited", "timeouts", "fallbacks"],
                 f"KDD99, random 3-way conjunctions + negations, delta = {args.delta}, eta = {args.eta}")
    if args.plot:
        plot_kdd99(frame, args)


def plot_kdd99(frame: pd.DataFrame, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(args.out)
    mean = frame.groupby(["queries", "epsilon"]).mean(numeric_only=True).reset_index()
    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    for m, part in mean.groupby("queries"):
        ax[0].plot(part["epsilon"], part["max_error"], "o-", label=f"{m:,} queries, max")
        ax[0].plot(part["epsilon"], part["mean_error"], "s--", label=f"{m:,} queries, mean")
    ax[0].set(xlabel="epsilon (delta = 1e-3)", ylabel="error (fraction of records)", title="KDD99: error vs epsilon")
    ax[0].legend(fontsize=7)
    at1 = mean[mean["epsilon"] == 1.0]
    if len(at1):
        ax[1].plot(at1["queries"], at1["max_error"], "o-", label="max error")
        ax[1].plot(at1["queries"], at1["mean_error"], "s--", label="mean error")
        twin = ax[1].twinx()
        twin.plot(at1["queries"], at1["seconds"], "k^:", label="seconds")
        twin.set_ylabel("seconds")
        ax[1].set(xscale="log", xlabel="queries", ylabel="error", title="KDD99 at (1, 1e-3)")
        ax[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "bench_dualquery_kdd99.png", dpi=120)
    print(f"wrote {out / 'bench_dualquery_kdd99.png'}")


def load_compare(args) -> Dataset:
    if args.dataset == "nltcs":
        frame = pd.read_csv(data_file(args, "nltcs.csv"))
        return Dataset(frame.to_numpy(np.int64), Domain(tuple(frame.columns), (2,) * frame.shape[1]))
    sizes = json.loads(data_file(args, "adult_pgm_domain.json").read_text())
    attrs = tuple(args.adult_attributes)
    frame = pd.read_csv(data_file(args, "adult_pgm.csv"), usecols=list(attrs))
    return Dataset(frame[list(attrs)].to_numpy(np.int64), Domain(attrs, tuple(sizes[a] for a in attrs)))


def cmd_compare(args) -> None:
    from dpopt.algorithms.mwem import mwem
    from dpopt.algorithms.mwem_factored import factored_mwem
    from dpopt.model.queries import all_marginals

    data = load_compare(args)
    n = data.total
    workload = Conjunctions.marginal_cells(data.domain, 3).with_negations()
    truth = workload.count_records(data.codes) / n
    positive = ~workload.negated
    print(f"{args.dataset}: {n:,} records, {len(data.domain)} attributes, {data.domain.size:,} cells; "
          f"{int(positive.sum()):,} 3-way marginal cells")
    marginals = all_marginals(data.domain, 3)
    binary = all(s == 2 for s in data.domain.sizes)
    rows = []
    for eps in args.epsilons:
        e = Fraction(str(eps))
        row = run_dq(data, workload, e, args, seed=args.seed)
        rows.append({"method": f"DualQuery (eps, {args.delta})", "epsilon": eps, "max_error": row["max_error"],
                     "mean_error": row["mean_error"], "seconds": row["seconds"], "detail": f"T={row['T']} s={row['s']}"})
        print(json.dumps(row), flush=True)
        start = time.perf_counter()
        res = mwem(data, marginals, e, rounds=args.mwem_rounds, select="block", repeat_passes=args.mwem_passes,
                   rng=make_random(args.seed))
        seconds = time.perf_counter() - start
        est = workload.matvec(res.x)[positive] / n
        err = np.abs(est - truth[positive])
        rows.append({"method": "MWEM dense (pure eps)", "epsilon": eps, "max_error": float(err.max()),
                     "mean_error": float(err.mean()), "seconds": seconds,
                     "detail": f"T={args.mwem_rounds} block, {args.mwem_passes} passes"})
        if binary:
            start = time.perf_counter()
            fres = factored_mwem(data, 3, e, rounds=args.mwem_rounds, select="block",
                                 repeat_passes=args.mwem_passes, rng=make_random(args.seed))
            seconds = time.perf_counter() - start
            est = workload.matvec(np.asarray(fres.table.to_dense(), dtype=np.float64))[positive] / n
            err = np.abs(est - truth[positive])
            rows.append({"method": "MWEM factored (pure eps)", "epsilon": eps, "max_error": float(err.max()),
                         "mean_error": float(err.mean()), "seconds": seconds,
                         "detail": f"T={args.mwem_rounds} block, {args.mwem_passes} passes"})
        print(json.dumps(rows[-1]), flush=True)
    show(rows, ["method", "epsilon", "max_error", "mean_error", "seconds", "detail"],
         f"{args.dataset}: all 3-way marginals (errors on record fractions)")


def cmd_scaling(args) -> None:
    rows = []
    for k in args.attributes:
        data = load_kdd99(args, k)
        workload = Conjunctions.random(data.domain, 3, args.scaling_queries, seed=args.workload_seed).with_negations()
        for s in args.samples_sweep:
            args.samples, args.rounds = s, args.scaling_rounds
            row = run_dq(data, workload, Fraction(1000), args, seed=args.seed)  # a budget large enough for (T, s)
            row.update(attributes=k, per_round_s=row["seconds"] / row["T"])
            rows.append(row)
            print(json.dumps(row), flush=True)
    show(rows, ["attributes", "s", "T", "per_round_s", "ip_median_s", "ip_max_s", "timeouts", "sampling_s"],
         f"KDD99 scaling: {args.scaling_queries:,} random 3-way conjunctions, {args.scaling_rounds} rounds "
         "(time only; the budget is not the point here)")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["kdd99", "compare", "scaling"])
    parser.add_argument("--data-dir", default=None, help="directory of the shared benchmark data")
    parser.add_argument("--queries", type=int, nargs="+", default=[500_000])
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0])
    parser.add_argument("--delta", type=float, default=1e-3)
    parser.add_argument("--eta", type=str, default="1.2")
    parser.add_argument("--samples", type=int, default=1750)
    parser.add_argument("--rounds", type=int, default=None, help="T (default: solved from the budget)")
    parser.add_argument("--solver", default="highs", choices=["highs", "pulp"])
    parser.add_argument("--time-limit", type=float, default=5.0, help="CPU seconds per round's integer program")
    parser.add_argument("--work-limit", type=int, default=10,
                        help="HiGHS work per round's integer program (MIP interrupt callbacks; load-independent)")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0, help="seed of the (non-private) benchmark noise")
    parser.add_argument("--workload-seed", type=int, default=0)
    parser.add_argument("--dataset", choices=["nltcs", "adult"], default="nltcs")
    parser.add_argument("--adult-attributes", nargs="+", default=list(ADULT_SMALL))
    parser.add_argument("--mwem-rounds", type=int, default=30)
    parser.add_argument("--mwem-passes", type=int, default=10)
    parser.add_argument("--attributes", type=int, nargs="+", default=[10, 20, 42])
    parser.add_argument("--samples-sweep", type=int, nargs="+", default=[500, 2000, 8000])
    parser.add_argument("--scaling-rounds", type=int, default=20)
    parser.add_argument("--scaling-queries", type=int, default=100_000)
    parser.add_argument("--plot", action="store_true")
    parser.add_argument("--save-logs", default=None, help="directory for each run's per-round log (CSV)")
    parser.add_argument("--out", default=".")
    args = parser.parse_args(argv)
    {"kdd99": cmd_kdd99, "compare": cmd_compare, "scaling": cmd_scaling}[args.command](args)


if __name__ == "__main__":
    main()
