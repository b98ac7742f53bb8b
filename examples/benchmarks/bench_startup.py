"""How long the command line makes you wait before it answers (issue #28 item 2).

Run:  python examples/benchmarks/bench_startup.py [--repeat 20] [--specs quickstart,czech,...]

Each figure is a fresh ``dpopt`` process (the installed script beside this interpreter, else
``python -m dpopt.cli``), timed from its start:

``--help`` / ``--version``
    until the process exits (target 0.3 s); the median and the fastest of ``--repeat`` runs,
    with the child's CPU seconds (user + system), which load on a shared machine inflates less.
``check SPEC``
    until its first line of output (target 1 s) and until it exits, for every built-in spec
    (none needs its data: the real-data specs are checked without it).
``run models/quickstart.toml --out DIR``
    the whole process (issue #30: target 2 s wall on an idle 2-core machine), with its plots and
    without them (``plots = false``), ``--run-repeat`` times each, alternated: median and fastest
    wall seconds and the median CPU seconds. Python's bytecode caches matter here (compiling
    dpopt's sources costs 0.3-0.5 s a run): the script says whether ``PYTHONDONTWRITEBYTECODE``
    is set. The CPU seconds include the child process that draws the figures beside the release
    (:mod:`dpopt.release.plot_worker`, about 0.6 CPU-s): on a loaded machine they say what the
    run costs, not how long one waits for it; on an idle one the wall time says that.

Timings depend on the machine's load: set OPENBLAS_NUM_THREADS=1 and say how busy it was.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def dpopt_command() -> list[str]:
    script = Path(sys.executable).with_name("dpopt")
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-m", "dpopt.cli"]


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_exit(args: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of one process, start to exit."""
    cpu, start = children_cpu(), time.perf_counter()
    subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, cwd=REPO)
    return time.perf_counter() - start, children_cpu() - cpu


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) a running process has used so far (Linux; NaN elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def time_first_line(args: list[str]) -> tuple[float, float, float, str]:
    """Wall and CPU seconds to the first line of output, wall seconds to exit, and that line."""
    start = time.perf_counter()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    first = proc.stdout.readline()
    first_at, first_cpu = time.perf_counter() - start, process_cpu(proc.pid)
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed: {err.strip()}")
    return first_at, first_cpu, time.perf_counter() - start, first.strip()


def time_quickstart(cmd: list[str], repeat: int) -> list[tuple[str, list[float], list[float]]]:
    """``dpopt run models/quickstart.toml --out DIR`` with and without plots, alternated."""
    spec = (REPO / "models" / "quickstart.toml").read_text()
    with tempfile.TemporaryDirectory(prefix="bench_startup_") as tmp:
        no_plots = Path(tmp) / "quickstart_no_plots.toml"
        no_plots.write_text(spec.replace("plots = true", "plots = false"))
        variants = {"with plots": REPO / "models" / "quickstart.toml", "plots = false": no_plots}
        times: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in variants}
        time_exit(cmd + ["run", str(variants["with plots"]), "--out", str(Path(tmp) / "warm")])  # file cache
        for i in range(repeat):
            for label, path in variants.items():
                wall, cpu = time_exit(cmd + ["run", str(path), "--out", str(Path(tmp) / f"{label}-{i}")])
                times[label][0].append(wall)
                times[label][1].append(cpu)
    return [(label, walls, cpus) for label, (walls, cpus) in times.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--specs", help="comma-separated built-in spec names (default: all)")
    parser.add_argument("--run-repeat", type=int, default=5, help="runs of the quickstart release per variant")
    args = parser.parse_args()
    cmd = dpopt_command()
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    print(f"command: {' '.join(cmd)}; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print(f"{'':<28}{'median s':>10}{'fastest s':>11}{'CPU s (median)':>16}")
    for flag in ("--help", "--version"):
        time_exit(cmd + [flag])  # warm the file cache
        runs = [time_exit(cmd + [flag]) for _ in range(args.repeat)]
        walls, cpus = [w for w, _ in runs], [c for _, c in runs]
        print(f"dpopt {flag:<22}{statistics.median(walls):>10.3f}{min(walls):>11.3f}{statistics.median(cpus):>16.3f}")
    names = args.specs.split(",") if args.specs else sorted(p.stem for p in (REPO / "models").glob("*.toml"))
    print(f"\n{'dpopt check':<28}{'first line s':>13}{'(CPU s)':>9}{'exit s':>9}  first line")
    for name in names:
        first, cpu, total, line = time_first_line(cmd + ["check", str(REPO / "models" / f"{name}.toml")])
        print(f"{name:<28}{first:>13.2f}{cpu:>9.2f}{total:>9.2f}  {line[:50]}")
    print(f"\n{'dpopt run quickstart':<28}{'median s':>10}{'fastest s':>11}{'CPU s (median)':>16}"
          f"   (PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', 'unset')})")
    for label, walls, cpus in time_quickstart(cmd, args.run_repeat):
        print(f"{label:<28}{statistics.median(walls):>10.2f}{min(walls):>11.2f}{statistics.median(cpus):>16.2f}")
    if shutil.which("hyperfine") is None:
        print("\n(hyperfine is not installed: these are plain subprocess timings)")


if __name__ == "__main__":
    main()
