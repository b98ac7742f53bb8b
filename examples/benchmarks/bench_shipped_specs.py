"""Wall and CPU time of every shipped spec in ``models/``, run as shipped (issue #24 item 5).

Each spec runs in a fresh process exactly as ``tests/test_shipped_specs.py`` runs it (the data
file its header names, ``--seed 0``, integer output and every other setting as shipped), killed
after ``--cap`` seconds. The figures are what the test's per-spec budgets are set from::

    OPENBLAS_NUM_THREADS=1 python examples/benchmarks/bench_shipped_specs.py            # every spec
    python examples/benchmarks/bench_shipped_specs.py --only czech --cap 60             # names containing "czech"

Prints one line per spec: wall seconds, CPU seconds (user + system of the process and its
workers), the machine's load average when it started, and how it ended.
Wall time on a shared machine depends on its load; CPU time much less so.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import SHARED

REPO = Path(__file__).resolve().parents[2]
_DATA_IN_HEADER = re.compile(r"--data\s+\.\./shared/data/(\S+)")


def data_args(spec: Path) -> list[str] | None:
    """``["--data", FILE]`` as the spec's header names it, [] for example data, None when absent."""
    from dpopt.spec import load_spec

    s = load_spec(spec)
    if s.data.source == "example" or s.data.path is not None:
        return []
    named = _DATA_IN_HEADER.findall(spec.read_text(encoding="utf-8"))
    if not named or not (SHARED / named[0]).is_file():
        return None
    return ["--data", str(SHARED / named[0])]


def time_spec(spec: Path, cap: float) -> str:
    data = data_args(spec)
    if data is None:
        return "skipped: its data file is absent"
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        args = [sys.executable, "-m", "dpopt.cli", "run", str(spec), "--out", str(Path(tmp) / "out"),
                "--seed", "0", "--quiet", *data]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.Popen(args, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
        try:
            _, err = proc.communicate(timeout=cap)
            ended = "ok" if proc.returncode == 0 else f"exit {proc.returncode}: {err.strip().splitlines()[-1:]}"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            ended = f"KILLED after {cap:g} s"
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return f"{wall:7.1f} s wall {cpu:7.1f} s CPU  load {load:4.1f}  {ended}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run the specs whose name contains this")
    parser.add_argument("--cap", type=float, default=600, help="kill a run after this many seconds (default 600)")
    args = parser.parse_args()
    for spec in sorted((REPO / "models").glob("*.toml")):
        if args.only in spec.stem:
            print(f"{spec.stem:24} {time_spec(spec, args.cap)}", flush=True)


if __name__ == "__main__":
    main()
