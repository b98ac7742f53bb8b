"""Do the report's accuracy figures tell the truth? The plan's expected error and the fit's error
bars against the actual error over repeated releases of the quickstart (example data).

For each seed the quickstart is released with ``evaluate`` (NOT private: it reads the truth);
per measured table the script records the noise standard deviation, the plan's expected error,
the fit's error bar (all three from ``report["accuracy"]``, no truth used) and the actual root
mean squared error of the noisy answers, of the fractional fit and of the released integer
table against the truth. It prints the means over seeds and the ratio actual / error bar
(about 1 when the error bars are calibrated).

    OPENBLAS_NUM_THREADS=1 python examples/benchmarks/bench_report_accuracy.py [--seeds 10] [--rows 10000]
"""

from __future__ import annotations

import argparse
import tomllib
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

import dpopt

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--rows", type=int, default=10_000)
    args = ap.parse_args()
    spec = tomllib.loads((ROOT / "models" / "quickstart.toml").read_text())
    spec["data"]["rows"] = args.rows
    records = []
    for seed in range(args.seeds):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = dpopt.run(spec, seed=seed, evaluate=True)
        acc = r.report["accuracy"]
        planned = {row["table"]: row for row in acc["expected_before_data"]}
        bars = {row["table"]: row for row in acc["error_bars"]}
        x_int = np.asarray(r.counts, dtype=np.float64)
        x_frac = np.asarray(r.reconstruction.x, dtype=np.float64)
        for m in r.measurements:
            truth = r.evaluation_truth[m.label]
            rms = lambda v: float(np.sqrt(np.mean((v - truth) ** 2)))  # noqa: E731
            records.append({"seed": seed, "table": m.label, "noise_sd": planned[m.label]["noise_rmse"],
                            "expected_plan": planned[m.label]["expected_rmse"], "error_bar": bars[m.label]["rmse"],
                            "actual_noisy": rms(m.values), "actual_fit": rms(m.query.matvec(x_frac)),
                            "actual_released": rms(m.query.matvec(x_int))})
        print(f"seed {seed} done", flush=True)
    frame = pd.DataFrame(records)
    means = frame.groupby("table", sort=False).mean(numeric_only=True).drop(columns="seed")
    means["fit / error bar"] = means["actual_fit"] / means["error_bar"]
    means["released / noisy"] = means["actual_released"] / means["actual_noisy"]
    pd.set_option("display.width", 200)
    print(f"\nquickstart, {args.rows:,} persons, {args.seeds} seeds: RMS error per answer (counts), means over seeds")
    print(means.round(3).to_string())


if __name__ == "__main__":
    main()
