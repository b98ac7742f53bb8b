"""Kill latency: SIGTERM at random instants of a long integer release; the process must exit within 2 s.

    python examples/benchmarks/bench_kill_latency.py                 # 20 instants, nltcs 2-way integer release
    python examples/benchmarks/bench_kill_latency.py --instants 5 --spec models/rochdale.toml --data ../shared/data/rochdale.csv

The default release is nltcs (16 binary attributes, 65,536 cells): every 2-way marginal with the
discrete Gaussian mechanism, a smooth fit and integer output — a release that spends seconds in
the fit, the support walk, the local search and HiGHS solves, so the instants fall in every
phase. For each instant (uniform over the first 80 % of the release's measured duration) the script starts
``dpopt run``, sends SIGTERM, and measures how long the process takes to exit; it then checks
that nothing is left behind: no output directory, no ``.NAME.tmp-*`` temporary, no child
process. Issue 24's target: every exit within 2 s. Timings depend on the machine's load.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import shared_file

NLTCS_SPEC = """
name = "nltcs-2way-integer"
[domain.attributes]
{attributes}
[data]
source = "file"
[privacy]
accounting = "zcdp"
epsilon = 1.0
delta = 1e-6
[[measure]]
label = "2-way"
query = "all_marginals"
k = 2
mechanism = "gaussian"
share = 1
[constraints]
nonnegative = true
integer = true
[reconstruct]
objective = "smooth"
[output]
formats = ["csv"]
"""


def children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instants", type=int, default=20)
    parser.add_argument("--spec", type=Path, default=None)
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument("--seed", type=int, default=0, help="seed of the random instants (not private: timing only)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dpopt-kill-"))
    if args.spec is None:
        data = shared_file("nltcs.csv")
        header = data.read_text().splitlines()[0].split(",")
        spec = work / "nltcs.toml"
        spec.write_text(NLTCS_SPEC.format(attributes="\n".join(f"{a} = 2" for a in header)))
    else:
        spec, data = args.spec, args.data
    dpopt = [sys.executable, "-m", "dpopt.cli"]  # the dpopt of this interpreter
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    start = time.perf_counter()
    full = subprocess.run(dpopt + ["run", str(spec), "--data", str(data), "--out", str(work / "full")], env=env,
                          capture_output=True, text=True)
    duration = time.perf_counter() - start
    print(f"whole release: {duration:.1f} s, exit code {full.returncode}")
    rng = random.Random(args.seed)
    latencies, leftovers = [], []
    for k in range(args.instants):
        out = work / f"run{k}"
        at = rng.uniform(0.2, max(0.8 * duration, 1.0))  # inside the release (its length varies with load)
        proc = subprocess.Popen(dpopt + ["run", str(spec), "--data", str(data), "--out", str(out)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(at)
        kids = children(proc.pid)
        sent = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        latency = time.perf_counter() - sent
        temps = sorted(p.name for p in work.glob(f".run{k}.tmp-*"))
        alive = [c for c in kids if Path(f"/proc/{c}").exists()]
        finished = out.exists() and code == 0
        if temps or alive or (out.exists() and not finished):
            leftovers.append((k, temps, alive))
        if not finished:
            latencies.append(latency)
        print(f"  instant {k + 1:2d}: SIGTERM at {at:5.1f} s -> exit {code} after {latency:.3f} s"
              + (" (release had finished)" if finished else "") + (f"  LEFT: {temps} {alive}" if temps or alive else ""))
    worst = max(latencies)
    print(f"\nexit latency over {len(latencies)} interrupted releases (of {args.instants} instants): median {sorted(latencies)[len(latencies) // 2]:.3f} s, "
          f"max {worst:.3f} s; target <= 2 s: {'MET' if worst <= 2.0 else 'NOT MET'}; "
          f"left behind: {'nothing' if not leftovers else leftovers}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
