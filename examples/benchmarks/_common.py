"""Shared helpers of the benchmark scripts: locating ../shared/data, timing, peak memory."""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pandas as pd

from dpopt.model.data import Dataset
from dpopt.model.domain import Domain

#: ../shared/data beside the repository; DPOPT_SHARED_DATA overrides it (e.g. from a git worktree).
SHARED = Path(os.environ.get("DPOPT_SHARED_DATA", Path(__file__).resolve().parents[3] / "shared" / "data"))


def shared_file(name: str) -> Path:
    path = SHARED / name
    if not path.is_file():
        sys.exit(f"benchmark data {path} is absent: place ../shared/data beside the repository")
    return path


def load_binary(name: str) -> Dataset:
    """One of the binary benchmark tables (mildew, czech, rochdale, nltcs) as a Dataset."""
    frame = pd.read_csv(shared_file(f"{name}.csv"))
    domain = Domain(tuple(frame.columns), (2,) * frame.shape[1])
    return Dataset.from_frame(frame, domain)


def load_adult_pgm() -> Dataset:
    domain = Domain.from_dict(json.loads(shared_file("adult_pgm_domain.json").read_text()))
    return Dataset.from_csv(shared_file("adult_pgm.csv"), domain)


def peak_memory_mb() -> float:
    """Peak resident memory of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@contextmanager
def timed(label: str, rows: list):
    start = time.perf_counter()
    yield
    rows.append((label, time.perf_counter() - start))


def print_table(rows: list, title: str) -> None:
    print(f"\n{title}")
    width = max(len(r[0]) for r in rows)
    for label, seconds in rows:
        print(f"  {label:<{width}}  {seconds:8.3f} s")


def network_workload(d: int, k: int, net_seed: int, window: int = 3, n: int = 50_000):
    """Binary data from ``random_sparse_network(d, seed=net_seed, window=window)`` (``n`` records,
    sample seed ``net_seed + 100``), its ``k``-way marginal sets and their true counts:
    ``(net, data, sets, combos, truths, n)``, the workload of bench_wide_rule.py and
    bench_wide_smooth.py."""
    from dpopt.datasets.bayes_net import random_sparse_network

    net = random_sparse_network(d, seed=net_seed, window=window)
    data = net.sample(n, net_seed + 100)
    names = data.domain.attrs
    combos, _ = net.marginals(k)
    sets = [tuple(names[a] for a in c) for c in combos]
    counts = data.binary_marginal_counts(k)
    truths = {s: counts[i].astype(float) for i, s in enumerate(sets)}
    return net, data, sets, combos, truths, float(data.total)
